"""What the driver tells the user of each micro-batch: :class:`BatchInfo`, summed from the tasks' reports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..checkpoints._restore import CompletedCheckpoint
from ..checkpoints._timing import CheckpointTiming
from ..runtime._metrics import CheckpointStats, checkpoint_stats
from ..runtime._migration_log import merge_undeclared
from ..timers import MIN_WATERMARK
from ._handoff import batch_status
from ._report import SubtaskOrigin, TaskReport

__all__ = ["BatchInfo", "batch_info", "local_recovery_status"]


@dataclass(frozen=True)
class BatchInfo:
    """What happened to one micro-batch (or one :meth:`~statekit.spark.ProcessedStream.run`).

    Attributes:
        batch_id: Spark's batch id (for ``run``, the batch id it was given or chose).
        checkpoint_id: The checkpoint that holds the state after this batch.
        location: Where that checkpoint lives.
        skipped: True if the batch had been completed before (a replay after a
            driver failure); nothing was processed or written.
        restored_from: The checkpoint the subtasks started from, None for a fresh start.
        parallelism: The number of subtasks.
        records: Records processed.
        outputs: Output records written to the sink.
        reused_subtasks: Subtasks whose open state an executor kept from the previous batch.
        restored_subtasks: Subtasks that did not reuse open state: restored (locally or
            remotely) or started empty.
        restored_locally: Of those, subtasks restored reading nothing from the checkpoint
            storage: from the local copies their executor kept (task-local recovery,
            ``statekit.local-recovery``), or from state small enough to travel inside
            the checkpoint's metadata.
        restored_remotely: Of those, subtasks that read files from the checkpoint storage
            (only the files their executor had no local copy of).
        bytes_downloaded: Bytes the restores read from the checkpoint storage.
        local_recovery: ``"on"``, ``"off"`` (``statekit.local-recovery=false``), or
            ``"off: <why>"`` when a task found its executor's local-recovery
            directory unsafe (another user's, writable by others, or a symlink
            statekit did not make) or could not create it: local recovery is then
            off in that Python worker, which writes and deletes nothing there.
        local_copies_rejected: Local copies that were there but not used, each file
            read from the checkpoint storage instead: its bytes were not the ones the
            checkpoint records (another checkpoint's or subtask's file, or damaged),
            or it could not be read, or it was deleted or changed after it was
            checked. Those subtasks count as ``restored_remotely``.
        local_copy_rejections: Why, one line per rejected copy naming the checkpoint
            file (at most ten per subtask).
        handed_off: Of the reused subtasks, those whose task Spark gave to another Python
            worker of the executor than the one holding the state, and which handed its
            rows to that worker (``statekit.spark.worker-handoff``).
        handoff: ``"on"``, or ``"off: <why>"``: configured off, or a task's Python worker
            could not take part (its hand-off directory was refused: another user's, a
            symlink, writable by others; the reason names the path and the way out).
        executor_pids: The process ids of the Python workers that ran the subtasks.
        subtask_locations: Where each subtask's task ran (``executor_<host>_<id>``), as
            the tasks reported it; the next batch prefers the same executors. Empty
            when locality is off.
        locality: ``"on"``, or ``"off: <why>"`` (configured off, Spark Connect, or the
            JVM helper could not be loaded: the reason says how to fix it).
        late_records: Rows at or below the watermark the batch ran with.
        bad_records: Every dead letter written for the batch
            (``statekit.bad-records.policy=dead-letter``), none of them in
            ``records``: the rows without a key (null, or refused by the key
            serializer) the operator's tasks skipped, plus ``source_bad_records``.
        source_bad_records: Of those, the lines :func:`~statekit.spark.read_logs`'
            reading tasks skipped before any row reached the operator (lines
            that did not decode or parse, too long, without a key, lost input).
        timers_fired: Timers that fired in the batch.
        watermark: The event-time watermark the next batch runs with.
        phases: Where the batch's time went, in seconds. On the driver (wall
            time): ``prepare`` (the checkpoint to start from, the plan),
            ``tasks`` (the Spark job that scans, routes and processes every
            row and writes the snapshots; on classic Spark with a sink,
            the sink's job that runs them, and then there is no
            ``sink``), ``sink``, ``checkpoint`` (completing it),
            ``retention``. Summed over the tasks: ``task_input`` (waiting
            for input rows: shuffle read and Arrow transfer), ``task_restore``
            (restoring the subtasks that did not reuse open state), ``task_convert``
            (Arrow to Python), ``task_records`` (the record loop: state access,
            the function, output rows), ``task_output`` (output Arrow batches),
            ``task_timers``, ``task_snapshot``, ``task_task`` (the whole task).
        undeclared_states: Restored states the function does not declare, by kind
            (``keyed``, ``operator``), from the subtasks restored in this batch:
            kept and carried into every checkpoint; the driver names them in a
            WARNING of the ``statekit.state`` logger.
        dropped_fields: What the restore of this batch's subtasks dropped of the values the
            checkpoint held (state to changes: a dataclass field the code no longer has); the
            driver names them in a WARNING of the ``statekit.state`` logger, and the batch's
            checkpoint records them (the checkpoint history shows them).
        restore_origin: The checkpoint or savepoint an explicit ``restore=`` took, whose
            history this batch's state descends from (None: no explicit restore).
        checkpoint_seconds: What the checkpoint itself cost: ``snapshot + upload +
            metadata`` of ``checkpoint_timing``.
        checkpoint_timing: The checkpoint's phases (seconds): ``snapshot`` (the
            slowest task's snapshots, without the upload), ``upload`` (that
            task writing them into the checkpoint storage), ``metadata``
            (``_metadata``, on the driver) and ``duration`` (the whole batch,
            from its start to ``_metadata``): the numbers of the metrics
            (``checkpoint_*_seconds``) and of the checkpoint history
            (``*_ms``). None when skipped.
        input_lost: What ``read_logs`` planned for this batch but could not read
            exactly, one message each, with the file and byte range: a file moved
            away or compressed before it was read to its end, or truncated below
            its read offset and then appended to (its first bytes, named, read
            again); the driver also warns with each (``InputLostWarning``).
        checkpoint_stats: What the checkpoint holds (state entries and bytes, per state
            when known, bytes written and referenced), from its metadata; None when skipped.
        task_runs: How often the busiest subtask's task ran in the batch: 1, or more when
            the sink ran several actions on outputs that are not cached (each ran the
            tasks again) or Spark computed a partition again; 0 when skipped. The
            counts above are one run's.
    """

    batch_id: int
    checkpoint_id: int | None
    location: str | None
    skipped: bool
    restored_from: str | None
    parallelism: int
    records: int = 0
    outputs: int = 0
    reused_subtasks: int = 0
    restored_subtasks: int = 0
    restored_locally: int = 0
    restored_remotely: int = 0
    bytes_downloaded: int = 0
    local_recovery: str = "off"
    local_copies_rejected: int = 0
    local_copy_rejections: tuple[str, ...] = ()
    handed_off: int = 0
    handoff: str = "on"
    executor_pids: tuple[int, ...] = ()
    subtask_locations: Mapping[int, str] = field(default_factory=dict)
    locality: str = "off"
    late_records: int = 0
    bad_records: int = 0
    source_bad_records: int = 0
    timers_fired: int = 0
    watermark: int = MIN_WATERMARK
    phases: Mapping[str, float] = field(default_factory=dict)
    undeclared_states: Mapping[str, list[str]] = field(default_factory=dict)
    dropped_fields: Mapping[str, list[str]] = field(default_factory=dict)
    checkpoint_seconds: float = 0.0
    checkpoint_stats: CheckpointStats | None = None
    restore_origin: str | None = None
    checkpoint_timing: CheckpointTiming | None = None
    input_lost: tuple[str, ...] = ()
    task_runs: int = 1


def local_recovery_status(statuses: Sequence[str]) -> str:
    """``BatchInfo.local_recovery`` from the tasks' statuses: on, off, or off with every distinct reason."""
    reasons = sorted({s.removeprefix("off: ") for s in statuses if s.startswith("off: ")})
    if reasons:
        return "off: " + "; ".join(reasons)
    return "on" if statuses and all(s == "on" for s in statuses) else "off"


def batch_info(
    batch_id: int,
    checkpoint_id: int,
    location: str,
    source: CompletedCheckpoint | None,
    parallelism: int,
    reports: Sequence[TaskReport],
    *,
    locations: Mapping[int, str],
    locality: str,
    handoff_enabled: bool,
    watermark: int,
    phases: dict[str, float],
    dropped_fields: Mapping[str, list[str]] | None = None,
    source_bad_records: int = 0,
    timing: CheckpointTiming | None = None,
) -> BatchInfo:
    """What a processed micro-batch did, summed over its tasks' reports (``phases`` gets theirs added)."""
    for r in reports:
        for name, secs in r.phases.items():
            phases[f"task_{name}"] = phases.get(f"task_{name}", 0.0) + secs
    origins = [r.origin for r in reports]
    reused = sum(1 for o in origins if o.reused)
    return BatchInfo(
        batch_id,
        checkpoint_id,
        location,
        False,
        source.location if source else None,
        parallelism,
        records=sum(r.records for r in reports),
        outputs=sum(r.outputs for r in reports),
        reused_subtasks=reused,
        restored_subtasks=len(reports) - reused,
        restored_locally=origins.count(SubtaskOrigin.RESTORED_LOCALLY),
        restored_remotely=origins.count(SubtaskOrigin.RESTORED_REMOTELY),
        bytes_downloaded=sum(r.downloaded for r in reports),
        local_recovery=local_recovery_status([r.local_recovery for r in reports]),
        local_copies_rejected=sum(r.copies_rejected for r in reports),
        local_copy_rejections=tuple(m for r in reports for m in r.copy_rejections),
        handed_off=origins.count(SubtaskOrigin.HANDED_OFF),
        handoff=batch_status(handoff_enabled, [r.handoff for r in reports]),
        executor_pids=tuple(sorted({r.pid for r in reports})),
        subtask_locations=dict(sorted(locations.items())),
        locality=locality,
        late_records=sum(r.late for r in reports),
        bad_records=sum(r.bad for r in reports) + source_bad_records,
        source_bad_records=source_bad_records,
        timers_fired=sum(r.fired for r in reports),
        watermark=watermark,
        phases=phases,
        undeclared_states=merge_undeclared(r.undeclared_states for r in reports),
        dropped_fields=dict(dropped_fields or {}),
        checkpoint_seconds=timing.checkpoint if timing is not None else 0.0,
        checkpoint_stats=checkpoint_stats(checkpoint_id, [r.state for r in reports]),
        checkpoint_timing=timing,
    )
