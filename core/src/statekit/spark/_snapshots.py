"""The end of a task: every subtask's snapshot into the batch's checkpoint, and its report.

Each subtask writes its snapshot through the checkpoint storage under stream
names unique to the task attempt (tasks never complete a checkpoint: the
driver does, once the sink has the batch's outputs), keeps local copies of
what it wrote (task-local recovery), and goes back into the worker's cache
marked with the attempt. Its :class:`~._report.TaskReport` says where its
snapshot is, how the task came by its state, what it did and where its time went.
"""

from __future__ import annotations

import contextlib
import os
import time

from .._contracts import CheckpointOutputStream, CheckpointWriter
from .._errors import CheckpointError
from ..checkpoints._local_recovery import LocalRecoveryWriter
from ..checkpoints._metadata import SubtaskState
from ..checkpoints._timing import TimedWriter
from ..checkpoints._writing import write_subtask_state
from . import _cache
from ._acquire import local_copies
from ._report import SubtaskOrigin, TaskReport
from ._run import TaskRun

__all__ = ["task_reports", "write_snapshots"]


class _AttemptWriter:
    """Names every stream after the task attempt, so that retried or speculative attempts never clash.

    Tasks only create streams; the driver completes the checkpoint.
    """

    def __init__(self, inner: CheckpointWriter, suffix: str) -> None:
        self._inner = inner
        self._suffix = suffix

    @property
    def location(self) -> str:
        """The checkpoint's location."""
        return self._inner.location

    def create_stream(self, name: str, *, shared: bool = False) -> CheckpointOutputStream:
        """A stream named ``<name>.<attempt>``."""
        return self._inner.create_stream(f"{name}.{self._suffix}", shared=shared)

    def complete(self, metadata: bytes) -> str:
        """Tasks never complete a checkpoint."""
        raise CheckpointError("a Spark task cannot complete a checkpoint; the driver does")

    def abort(self) -> None:
        """Nothing to do: the driver cleans up unfinished checkpoints."""


def write_snapshots(run: TaskRun) -> tuple[list[tuple[int, SubtaskState]], str]:
    """Every subtask's snapshot into the batch's checkpoint: their entries, and ``BatchInfo.local_recovery``.

    The subtasks go back into the process cache, marked with this attempt.
    """
    plan, phases, clock = run.plan, run.phases, time.perf_counter
    t_snapshot = clock()
    storage = _cache.storage_for(plan.config)
    copies, local_recovery = local_copies(plan)
    native = plan.checkpoint_id if plan.config.get("statekit.checkpoint.format") != "canonical" else None
    states = []
    upload = 0.0
    for index, open_st in sorted(run.active.items()):
        st = open_st.subtask
        inner: CheckpointWriter = storage.begin_checkpoint(plan.job_id, plan.checkpoint_id)
        local = None if copies is None else LocalRecoveryWriter(inner, copies)
        writer = TimedWriter(_AttemptWriter(inner if local is None else local, run.attempt))
        try:
            state = write_subtask_state(
                writer,
                plan.operator_id,
                index,
                st.keyed,
                st.operator,
                max_state_size=storage.max_state_size,
                native_checkpoint_id=native,
                raw=st.snapshot_raw(),
            )
        except BaseException:
            if local is not None:
                local.discard_staged()
            raise
        upload += writer.upload_seconds
        states.append((index, state))
        if copies is not None and local is not None:
            with contextlib.suppress(OSError):  # local copies only ever save a download
                # Named by the digests the metadata records: what a restore asks for.
                copies.remember(index, local.keep(state.to_json()))
    if copies is not None:
        with contextlib.suppress(OSError):
            copies.collect()
    phases["upload"] = upload  # see checkpoints/_timing: the snapshots' bytes into the storage
    phases["snapshot"] = max(0.0, clock() - t_snapshot - upload)
    phases["task"] = clock() - run.started
    for open_st in run.active.values():
        open_st.token, open_st.attempt = plan.token, run.attempt
    _cache.put_back(plan, run.active.items())
    return states, local_recovery


def task_reports(
    run: TaskRun,
    states: list[tuple[int, SubtaskState]],
    *,
    attempt_number: int,
    bad: int,
    local_recovery: str,
    handoff: str,
    outputs_digest: str = "",
) -> list[TaskReport]:
    """The report of every subtask the task served; the task's ``bad`` rows go with its first."""
    reports = []
    for index, state in states:
        counts, acquired = run.counts[index], run.acquired[index]
        origin = acquired.origin
        if origin is SubtaskOrigin.REUSED and run.handed_from is not None:
            origin = SubtaskOrigin.HANDED_OFF
        reports.append(
            TaskReport(
                subtask=index,
                state=state,
                attempt=run.attempt,
                attempt_number=attempt_number,
                origin=origin,
                pid=os.getpid(),
                handed_from=run.handed_from,
                records=counts.records,
                outputs=counts.outputs,
                late=counts.late,
                bad=bad,
                fired=counts.fired,
                max_event_time=counts.max_event_time,
                downloaded=acquired.downloaded,
                copies_rejected=acquired.rejected,
                copy_rejections=acquired.reasons,
                local_recovery=local_recovery,
                handoff=handoff,
                phases=run.phases,
                undeclared_states=acquired.undeclared,
                outputs_digest=outputs_digest,
            )
        )
        bad = 0
    return reports
