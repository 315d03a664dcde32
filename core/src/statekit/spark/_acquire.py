"""Acquiring a task's subtask: reused open in this worker, or restored (local copies first), or new.

A subtask is reused only when this worker holds it open at exactly the task
attempt the restore checkpoint recorded (see :mod:`._cache`). Otherwise it is
created in a fresh directory below the executor's statekit directory and
restored from the checkpoint the batch starts from: from this executor's local
copies of its files where their bytes have the digest the checkpoint records
(task-local recovery, ``statekit.local-recovery``), from the checkpoint
storage for the rest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import pickle
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._contracts import SupportsNativeSnapshot
from .._errors import CheckpointError, UnsafeLocalPathError
from .._localfs import private_dir
from ..checkpoints._local_recovery import Downloads, LocalCopies, LocalRecoveryStorage, digests_of
from ..checkpoints._metadata import metadata_at
from ..checkpoints._restore import CompletedCheckpoint
from ..plugins._registry import default_registry
from ..runtime._subtask import Subtask
from ..snapshots._digest import FileDigest
from ..state._operator import OperatorSnapshot
from ..state._ttl import system_clock
from . import _cache
from ._cache import BatchClock, OpenSubtask
from ._plan import StoredMetadata, TaskPlan
from ._report import SubtaskOrigin

__all__ = [
    "Acquired",
    "RestoreSource",
    "acquire",
    "fingerprint",
    "local_copies",
    "local_root",
    "reusable",
]


@dataclass
class RestoreSource:
    """The checkpoint a task's subtasks start from, read lazily from the driver's metadata."""

    plan: TaskPlan
    metadata: Any  # InlineMetadata, StoredMetadata or a Broadcast of the metadata bytes
    _checkpoint: CompletedCheckpoint | None = None
    _operator_states: list[OperatorSnapshot] | None = field(default=None)
    _digests: dict[str, FileDigest] | None = field(default=None)

    def checkpoint(self) -> CompletedCheckpoint | None:
        if self.plan.restore_location is None:
            return None
        if self._checkpoint is None:
            stored = self.metadata
            storage = _cache.storage_for(self.plan.config)
            data = stored.read(storage) if isinstance(stored, StoredMetadata) else stored.value
            meta = metadata_at(self.plan.restore_location, data)
            self._checkpoint = CompletedCheckpoint(storage, self.plan.restore_location, meta)
        return self._checkpoint

    def reading_through(self, storage: Any) -> CompletedCheckpoint | None:
        """The restore checkpoint, its files read through ``storage`` (local copies, counted)."""
        cp = self.checkpoint()
        if cp is None:
            return None
        return CompletedCheckpoint(storage, cp.location, cp.metadata)

    def digests(self) -> dict[str, FileDigest]:
        """The SHA-256 the restore checkpoint records for each file of the operator."""
        cp = self.checkpoint()
        if cp is None:
            return {}
        if self._digests is None:
            subtasks = cp.metadata.operators.get(self.plan.operator_id, [])
            self._digests = digests_of([st.to_json() for st in subtasks])
        return self._digests

    def operator_states(self) -> list[OperatorSnapshot]:
        cp = self.checkpoint()
        assert cp is not None
        if self._operator_states is None:
            self._operator_states = cp.operator_states(self.plan.operator_id, self.plan.parallelism)
        return self._operator_states


def local_root(plan: TaskPlan) -> str:
    """Where this executor's backends keep files: under Spark's local directories, never /tmp by accident.

    ``statekit.local-dir`` if set; else the first of ``SPARK_LOCAL_DIRS`` (set by
    Spark's workers for their executors); else the directory Spark serves this
    application's files from, which lies in ``spark.local.dir``; else the
    driver's ``spark.local.dir``.
    """
    configured = plan.config.get("statekit.local-dir")
    if configured:
        return str(configured)
    env = os.environ.get("SPARK_LOCAL_DIRS")
    if env:
        return env.split(",")[0]
    with contextlib.suppress(Exception):
        from pyspark import SparkFiles

        root = SparkFiles.getRootDirectory()
        if root:
            return os.path.dirname(root)
    return plan.spark_local_dir or tempfile.gettempdir()


def local_copies(plan: TaskPlan) -> tuple[LocalCopies | None, str]:
    """This executor's local copies of the operator's checkpoint files, and ``BatchInfo.local_recovery``.

    None with ``"off"`` when configured off, or with ``"off: <why>"`` when the
    directory cannot be used: one that is not this user's own (another user's,
    writable by others, or a symlink statekit did not make, anywhere below the
    local directory) turns local recovery off for this process, which then
    writes and deletes nothing there; restores read the checkpoint storage.
    """
    if not plan.config.get("statekit.local-recovery"):
        return None, "off"
    base = local_root(plan)
    root = os.path.join(base, "statekit", "local-recovery", plan.job_id, plan.operator_id)
    unsafe = _cache.unsafe_local_recovery(root)
    if unsafe is not None:
        return None, f"off: {unsafe}"
    try:
        return LocalCopies(root, base=base), "on"
    except UnsafeLocalPathError as e:
        _cache.unsafe_local_recovery(root, str(e))
        return None, f"off: {e}"
    except (OSError, ValueError) as e:  # unwritable now (a full disk): off for this task only
        return None, f"off: cannot create the local-recovery directory {root}: {e}"


@dataclass(frozen=True)
class Acquired:
    """A subtask a task acquired, and how it came by its state (for its report to the driver)."""

    subtask: OpenSubtask
    origin: SubtaskOrigin
    """Reused open here, restored from local copies or from the storage, or new (empty)."""
    downloaded: int = 0
    """Bytes read from the checkpoint storage."""
    rejected: int = 0
    """Local copies that were there but not used (read from the storage instead)."""
    reasons: tuple[str, ...] = ()
    """Why, naming each file (at most ten)."""
    undeclared: Mapping[str, list[str]] = field(default_factory=dict)
    """Restored states the function does not declare, by kind (``Subtask.undeclared_states``)."""


def acquire(plan: TaskPlan, index: int, source: RestoreSource) -> Acquired:
    """The subtask ``index`` holding the state of the restore source, and how it came by it.

    Reused if this worker holds it open at exactly the attempt the restore
    checkpoint recorded; else made anew and restored: from this executor's
    local copies where their bytes have the checkpoint's digests, from the
    checkpoint storage for the rest (also in place of a rejected local copy).
    """
    if not 0 <= index < plan.parallelism:
        raise CheckpointError(f"row routed to subtask {index}, outside 0..{plan.parallelism - 1}")
    _cache.evict_stale(plan)
    entry = _cache.take(plan, index)
    if entry is not None:
        # The very state whose snapshot the checkpoint holds: same batch and same task attempt
        # (two attempts of one task may both succeed, over records in another order).
        if reusable(entry, plan, index):
            # Its last snapshot is in the checkpoint this batch starts from, so that checkpoint
            # completed: the executor learns it here, as Flink's notifyCheckpointComplete.
            cp = source.checkpoint()
            keyed = entry.subtask.keyed
            if cp is not None and isinstance(keyed, SupportsNativeSnapshot):
                keyed.notify_checkpoint_complete(cp.checkpoint_id)
            return Acquired(entry, SubtaskOrigin.REUSED)
        entry.close()
    st = _create(plan, index)
    try:
        acquired = _restore(plan, index, source, st)
        st.subtask.open()
        acquired = dataclasses.replace(acquired, undeclared=st.subtask.undeclared_states())
    except BaseException:
        st.close()
        raise
    cp = source.checkpoint()
    st.subtask.restore_done(default_registry(), plan.job_id, None if cp is None else cp.checkpoint_id)
    return acquired


def _restore(plan: TaskPlan, index: int, source: RestoreSource, st: OpenSubtask) -> Acquired:
    """Restore the new subtask ``st`` from the source, local copies first; how it went."""
    downloads = Downloads()
    copies, _ = local_copies(plan)
    # A local copy is read only if its bytes have the digest this checkpoint records.
    reading = LocalRecoveryStorage(_cache.storage_for(plan.config), copies, downloads, source.digests())
    cp = source.reading_through(reading)
    if cp is None:
        return Acquired(st, SubtaskOrigin.NEW)
    st.subtask.restore(
        cp,
        plan.operator_id,
        plan.parallelism,
        operator_states=source.operator_states(),
        claimed=plan.restore_claimed,
    )
    if copies is not None and reading.used:
        with contextlib.suppress(OSError):  # local copies only ever save a download
            copies.remember(index, reading.used)
    # Local: nothing read from the storage (local copies, or state inline in the metadata).
    origin = SubtaskOrigin.RESTORED_REMOTELY if downloads.remote_files else SubtaskOrigin.RESTORED_LOCALLY
    return Acquired(st, origin, downloads.remote_bytes, downloads.rejected, tuple(downloads.reasons))


def _create(plan: TaskPlan, index: int) -> OpenSubtask:
    """A new subtask ``index`` with its function, in a fresh directory below the executor's statekit one."""
    root_dir = local_root(plan)
    # Private to this user (0700, no symlink, no one else's): the backends' state lives below it.
    # Spark's own local directory is trusted as Spark made it; a configured one is checked too.
    configured = bool(plan.config.get("statekit.local-dir"))
    root = private_dir(
        os.path.join(root_dir, "statekit"),
        base=os.path.dirname(os.path.abspath(root_dir)) if configured else root_dir,
        what="the executor's statekit directory",
        otherwise="Or set statekit.local-dir to a directory of your own.",
    )
    clock = BatchClock()
    subtask = Subtask.make(
        index,
        plan.parallelism,
        _cache.backend_for(plan.config),
        key_serializer=plan.key_serializer,
        max_parallelism=plan.max_parallelism,
        clock=system_clock,
        key_cache_size=int(plan.config.get("statekit.key-cache-size")),
        exact_entries=bool(plan.config.get("statekit.metrics.exact-entries")),
        local_dir=tempfile.mkdtemp(prefix=f"{plan.job_id}-{plan.operator_id}-{index}-", dir=root),
        operator_id=plan.operator_id,
        function=plan.function_factory,
        job_id=plan.job_id,
        timer_clock=clock,
    )
    return OpenSubtask(subtask, plan.run_id, clock, fingerprint=fingerprint(plan))


def reusable(entry: OpenSubtask, plan: TaskPlan, index: int) -> bool:
    """Whether open subtask ``entry`` holds exactly the state subtask ``index`` of ``plan`` restores.

    Made by the task attempt the restore checkpoint records for it (attempt ids
    are random and unique per batch run), and of this run, or of another run (a
    restarted query, as Spark's own store finds its instance loaded at the version
    it restores) made for the same configuration, parallelism and function.
    """
    wanted = plan.restore_attempts.get(index)
    if wanted is None or entry.attempt != wanted:
        return False
    if entry.run_id == plan.run_id:
        return True
    return entry.fingerprint is not None and entry.fingerprint == fingerprint(plan)


def fingerprint(plan: TaskPlan) -> str | None:
    """What a subtask's open state and function were made from; None if it cannot be told.

    The configuration, the parallelism, the key and the function as pickled: a
    restarted query whose any of these changed restores instead of reusing.
    """
    from pyspark import cloudpickle

    try:
        what = (
            plan.job_id,
            plan.operator_id,
            _cache._config_key(plan.config),
            plan.parallelism,
            plan.max_parallelism,
            plan.key_column,
            plan.key_serializer.config(),
            plan.input_columns,
            plan.output_schema.json(),
            plan.vectorized,
            plan.event_time,
            plan.function_factory,
        )
        return hashlib.sha256(cloudpickle.dumps(what)).hexdigest()  # type: ignore[no-untyped-call]
    except (pickle.PicklingError, TypeError, AttributeError, ValueError, RecursionError):
        # Anything unpicklable: never reused across runs.
        return None
