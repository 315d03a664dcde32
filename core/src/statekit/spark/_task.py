"""The executor side: one Spark task serves the subtasks whose rows it receives.

A task runs its steps in order, each in a module named for it: it hands its
rows to the sibling Python worker that holds its subtask open, if one does
(:mod:`._task_handoff`); otherwise it acquires each subtask on its first row,
reused from this worker's cache (:mod:`._cache`) or restored
(:mod:`._acquire`), runs the per-record, vectorized or columns loop and fires the
batch's timers (:mod:`._loops`), writes every subtask's snapshot
(:mod:`._snapshots`) and reports each to the driver (:mod:`._report`) in the
handle column of its output (:mod:`._output`, schema in :mod:`._plan`). A task that does not finish
closes every subtask it touched: a retried task restores.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from typing import Any

from ..state._materialize import tasks_running
from . import _handoff
from ._acquire import RestoreSource
from ._cache import reset_cache
from ._loops import fire_timers, process_columns, process_groups, process_records
from ._output import OutputDigest
from ._plan import PLAN_PROPERTY, TaskPlan, batch_plan
from ._report_channel import send_handles
from ._routing import with_partition_columns
from ._run import TaskRun
from ._snapshots import task_reports, write_snapshots
from ._task_handoff import announce, hand_off

__all__ = ["make_task", "reset_cache"]

_LOCAL_ATTEMPTS = itertools.count()  # attempt ids outside Spark (tests)
_LOG = logging.getLogger("statekit.spark")


def make_task(plan: TaskPlan, metadata: Any, reports: Any = None) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function that processes one partition of a routed micro-batch.

    It yields the output records, then one row per served subtask whose handle
    column describes the subtask's snapshot (written into checkpoint
    ``plan.checkpoint_id`` under stream names unique to this task attempt).
    ``reports``: an accumulator the handle rows also go to (:mod:`._report_channel`).
    """
    return _PartitionTask(plan, metadata, reports)


class _PartitionTask:
    """A module-level class, so that tasks unpickle it by reference and share this worker's cache."""

    def __init__(self, plan: TaskPlan, metadata: Any, reports: Any = None) -> None:
        self.plan = plan
        self.metadata = metadata
        self.reports = reports

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        tc = TaskContext.get()
        plan, metadata, partition = self.plan, self.metadata, None
        if plan.partition_subtask:  # in the query's plan: the batch's part comes with the job
            plan, metadata = batch_plan(plan, tc.getLocalProperty(PLAN_PROPERTY) if tc is not None else None)
            partition = tc.partitionId() if tc is not None else None
            if partition is not None:  # the rows' subtask is the partition (see Router)
                batches = with_partition_columns(batches, partition)
        if self.reports is None:
            yield from _batches(plan, metadata, partition, batches, tc)
            return
        channel, token = self.reports, plan.token
        for b in _batches(plan, metadata, partition, batches, tc):
            send_handles(channel, token, b)
            yield b


def _batches(plan: TaskPlan, metadata: Any, partition: int | None, batches: Iterator[Any],
             tc: Any) -> Iterator[Any]:  # fmt: skip
    """The partition's output: handed to the sibling worker holding its subtask open, or run here."""
    attempt_id = tc.taskAttemptId() if tc is not None else f"local{next(_LOCAL_ATTEMPTS)}"
    attempt_number = tc.attemptNumber() if tc is not None else 0
    if plan.restore_attempts and plan.config.get("statekit.spark.worker-handoff"):
        it = iter(batches)
        first = next(it, None)
        handed = None if first is None else hand_off(plan, metadata, first, it, attempt_id, attempt_number)
        if handed is not None:
            yield from handed
            return
        batches = it if first is None else itertools.chain((first,), it)
    yield from _run_partition(plan, metadata, batches, attempt_id, attempt_number, partition=partition)


def _run_partition(
    plan: TaskPlan,
    metadata: Any,
    batches: Iterator[Any],
    attempt_id: Any,
    attempt_number: int,
    handed_from: int | None = None,
    *,
    partition: int | None = None,
) -> Iterator[Any]:
    """Process one partition in this process: its output batches, then its snapshots' handle rows.

    ``partition``: the subtask the partition is (routing in the query's plan), served even without rows.
    """
    with tasks_running():  # bases encoded in the background wait meanwhile: the task has the interpreter
        yield from _run_here(plan, metadata, batches, attempt_id, attempt_number, handed_from, partition)


def _run_here(
    plan: TaskPlan,
    metadata: Any,
    batches: Iterator[Any],
    attempt_id: Any,
    attempt_number: int,
    handed_from: int | None,
    partition: int | None,
) -> Iterator[Any]:
    run = TaskRun(plan, RestoreSource(plan, metadata), f"{plan.token[:12]}-{attempt_id}")
    run.handed_from = handed_from
    digest = OutputDigest()
    done = False
    try:
        if plan.columns:
            outputs = process_columns(run, batches)
        elif plan.vectorized:
            outputs = process_groups(run, batches)
        else:
            outputs = process_records(run, batches)
        for b in outputs:
            digest.add(b)
            yield b
        if partition is not None:
            run.subtask(partition)  # its snapshot even when no row came: no marker row stands for it
        for b in fire_timers(run):
            digest.add(b)
            yield b
        bad = run.bad_keys.commit()
        states, local_recovery = write_snapshots(run)
        handoff = announce(plan, sorted(run.active), run.attempt, _serve_handoff)
        reports = task_reports(
            run,
            states,
            attempt_number=attempt_number,
            bad=bad,
            local_recovery=local_recovery,
            handoff=handoff,
            outputs_digest=digest.hexdigest(),
        )
        handles = run.out.handles([r.to_json() for r in reports])
        done = True
        yield handles
    except _handoff.InputStopped as e:
        # A sibling's task that handed its rows here stopped sending them: its task fails there.
        held = sorted(run.active)
        _LOG.warning(
            "statekit: %s. %s",
            e,
            f"Dropped subtask {held[0]}, which the next task restores from the checkpoint"
            if held
            else "The subtask it asked for stays open here",
        )
        raise
    finally:
        if not done:
            for st in run.active.values():
                st.close()


def _serve_handoff(header: dict[str, Any], batches: Iterator[Any]) -> Iterator[Any]:
    """A sibling's task, run here where its subtask's state is open."""
    return _run_partition(
        header["plan"],
        header["metadata"],
        batches,
        header["attempt_id"],
        int(header["attempt_number"]),
        handed_from=int(header["from"]),
    )
