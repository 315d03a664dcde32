"""The executor side: one Spark task serves the subtasks whose rows it receives.

A Python worker keeps the subtasks it served in a process-wide cache between
micro-batches. An entry is reused only when it holds *exactly* the state of the
checkpoint the driver says to start from. Entries are taken out of the cache
while a task works on them and put back only after the task processed every
row and wrote its snapshot, marked with the id of that task attempt (unique,
and random per batch run); the driver records in each checkpoint which attempt
wrote each subtask's snapshot, and a later task reuses an entry only if it was
made by that very attempt. A failed or killed task therefore leaves nothing
behind, a retried task restores from the checkpoint storage, and stale local
state is never used.

Timers fire at the end of each task, after its rows: event-time timers at or
below the batch's watermark (computed by the driver from earlier batches, as
Spark does), processing-time timers at or below the batch's timestamp. Rows at
or below the watermark are late: counted, and handed to the late-records sink
(or to the function, by policy)."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql import types as T

from .._contracts import (
    CheckpointOutputStream,
    CheckpointStorage,
    CheckpointWriter,
    KeyedStateBackend,
    OperatorStateBackend,
    StateBackend,
    SupportsNativeSnapshot,
)
from .._errors import CheckpointError, UnsafeLocalPathError
from .._localfs import private_dir
from ..checkpoints._local_recovery import (
    Downloads,
    LocalCopies,
    LocalRecoveryStorage,
    LocalRecoveryWriter,
    digests_of,
)
from ..checkpoints._metadata import metadata_at
from ..checkpoints._restore import CompletedCheckpoint
from ..checkpoints._writing import write_subtask_state
from ..plugins._config import Configuration
from ..plugins._registry import default_registry
from ..runtime._columnar import group_runs, is_columnar, output_columns
from ..runtime._function import (
    KeyedBatchFunction,
    KeyedProcessFunction,
    OnTimerContext,
    ProcessContext,
    RuntimeContext,
    fire_timer_results,
    timer_service_for,
)
from ..runtime._runner import checkpoint_storage_from_config, state_backend_from_config
from ..serialization._keygroups import key_group_range_for_operator
from ..serialization._serializers import TypeSerializer
from ..sources._badrecords import BadRecord, BadRecordPolicy
from ..sources._deadletters import DeadLetterDir, file_part
from ..state._operator import OperatorSnapshot
from ..state._ttl import system_clock
from ..timers import MAX_WATERMARK, MIN_WATERMARK, LatePolicy
from ..timers._eventtime import EventTime
from ..timers._service import TimeDomain, TimerService
from . import _handoff
from ._routing import MARKER_COLUMN, PLACE_COLUMN, SUBTASK_COLUMN

__all__ = [
    "HANDLE_COLUMN",
    "LATE_COLUMN",
    "LATE_PREFIX",
    "InlineMetadata",
    "StoredMetadata",
    "TaskPlan",
    "internal_schema",
    "make_task",
    "reset_cache",
]

#: The column of the internal output that carries each subtask's snapshot description.
HANDLE_COLUMN = "__statekit_handle"
#: True on the internal output's late rows (present only with a late-records sink).
LATE_COLUMN = "__statekit_late"
#: Late rows carry the input column ``c`` as ``LATE_PREFIX + c``.
LATE_PREFIX = "__statekit_late_"
_FLUSH_ROWS = 8192
_NO_SUBTASK = object()
#: What a task reports it spent its time on (seconds), see ``BatchInfo.phases``.
TASK_PHASES = ("input", "restore", "convert", "records", "output", "timers", "snapshot")
#: How a task came by a subtask's state: open in this process, from local copies, from the
#: checkpoint storage (maybe partly local), or none (no checkpoint to start from).
REUSED, RESTORED_LOCALLY, RESTORED_REMOTELY, STARTED_EMPTY = "reused", "local", "remote", "empty"


@dataclass(frozen=True)
class TaskPlan:
    """What the driver tells every task of one micro-batch (pickled into the task)."""

    job_id: str
    operator_id: str
    run_id: str
    checkpoint_id: int
    token: str
    restore_location: str | None
    restore_token: str | None
    restore_attempts: Mapping[int, str]
    parallelism: int
    max_parallelism: int
    config: Configuration
    function_factory: Callable[[], KeyedProcessFunction]
    key_column: str
    key_serializer: TypeSerializer
    input_columns: tuple[str, ...]
    output_schema: T.StructType
    timezone: str | None = None
    spark_local_dir: str | None = None
    event_time: EventTime | None = None
    watermark: int = MIN_WATERMARK
    batch_timestamp_ms: int = 0
    end_of_input: bool = False
    late_schema: T.StructType | None = None
    """The input schema, when late rows go to a late-records sink."""
    vectorized: bool = False
    """The function is a :class:`~statekit.KeyedBatchFunction`: one call per key and batch."""
    restore_claimed: bool = False
    """The restore checkpoint is a completed checkpoint of this job in this storage: a restored
    native instance may reference its files (``notify_checkpoint_complete`` after the restore)."""
    batch_id: int = 0
    """Spark's micro-batch (for ``run()``, the batch id it was given or chose): named in bad records."""
    query_id: str = ""
    """The streaming query (``static`` for ``run()``): with the batch, names the dead-letter file."""


def internal_schema(output_schema: T.StructType, late_schema: T.StructType | None = None) -> T.StructType:
    """The user's output columns (made nullable), late-row columns if any, then the handle column."""
    fields = [T.StructField(f.name, f.dataType, True, f.metadata) for f in output_schema.fields]
    if late_schema is not None:
        fields.append(T.StructField(LATE_COLUMN, T.BooleanType(), True))
        fields += [
            T.StructField(LATE_PREFIX + f.name, f.dataType, True, f.metadata) for f in late_schema.fields
        ]
    return T.StructType([*fields, T.StructField(HANDLE_COLUMN, T.StringType(), True)])


@dataclass(eq=False)
class _Subtask:
    run_id: str
    index: int
    keyed: KeyedStateBackend
    operator: OperatorStateBackend
    function: KeyedProcessFunction
    ctx: RuntimeContext
    pctx: ProcessContext
    timers: TimerService
    tctx: OnTimerContext
    clock: _BatchClock
    token: str | None = None  # the batch whose state this is
    attempt: str | None = None  # the task attempt that made it (and wrote its snapshot)
    local_dir: str | None = None
    opened: bool = False
    records: int = 0
    outputs: int = 0
    late: int = 0
    fired: int = 0
    max_event_time: int | None = None

    def fire(self, domain: TimeDomain, until: int, out: _Output) -> None:
        before = self.timers.fired
        self.outputs += sum(
            out.add_result(r) for r in fire_timer_results(self.function, self.tctx, domain, until)
        )
        self.fired += self.timers.fired - before

    def close(self) -> None:
        # Best effort: the subtask is being dropped, an error here must not hide the real one.
        if self.opened:
            with contextlib.suppress(Exception):
                self.function.close()
        with contextlib.suppress(Exception):
            self.keyed.close()
        with contextlib.suppress(Exception):
            self.operator.close()
        if self.local_dir is not None:
            shutil.rmtree(self.local_dir, ignore_errors=True)


_LOCK = threading.Lock()
_CACHE: dict[tuple[str, str, int], _Subtask] = {}
_STORAGES: dict[str, CheckpointStorage] = {}
_BACKENDS: dict[str, StateBackend] = {}
_LOCAL_ATTEMPTS = itertools.count()  # attempt ids outside Spark (tests)
#: Local-recovery directories found unsafe in this process, and why: never checked again, never
#: written or deleted in (see _local_copies).
_UNSAFE_LOCAL_RECOVERY: dict[str, str] = {}


def reset_cache() -> None:
    """Close and forget every cached subtask of this process (tests, and shutdown)."""
    with _LOCK:
        entries = list(_CACHE.values())
        _CACHE.clear()
    for entry in entries:
        entry.close()


def _config_key(config: Configuration) -> str:
    return json.dumps(config.as_dict(), sort_keys=True, default=str)


def _storage(config: Configuration) -> CheckpointStorage:
    key = _config_key(config)
    with _LOCK:
        storage = _STORAGES.get(key)
    if storage is None:
        storage = checkpoint_storage_from_config(config)
        with _LOCK:
            storage = _STORAGES.setdefault(key, storage)
    return storage


def _backend(config: Configuration) -> StateBackend:
    key = _config_key(config)
    with _LOCK:
        backend = _BACKENDS.get(key)
    if backend is None:
        backend = state_backend_from_config(config)
        with _LOCK:
            backend = _BACKENDS.setdefault(key, backend)
    return backend


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


@dataclass(frozen=True)
class InlineMetadata:
    """The restore checkpoint's metadata shipped inside the task, read as a broadcast's ``value``."""

    value: bytes


@dataclass(frozen=True)
class StoredMetadata:
    """The restore checkpoint's metadata left in the checkpoint storage, for the task to read.

    How a Spark Connect driver ships metadata too large to travel inside every
    task: it has no broadcast. ``sha256`` is of the bytes the driver read,
    so a task never restores from other metadata than the driver planned with.
    """

    location: str
    sha256: str

    def read(self, config: Configuration) -> bytes:
        """The metadata bytes, read through the storage ``config`` names.

        Raises:
            CheckpointError: If they differ from the bytes the driver read.
        """
        data = _storage(config).read_metadata(self.location)
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise CheckpointError(
                f"checkpoint {self.location}: its metadata changed after the driver planned this batch"
            )
        return data


@dataclass
class _RestoreSource:
    """The checkpoint a task's subtasks start from, read lazily from the driver's metadata."""

    plan: TaskPlan
    metadata: Any  # InlineMetadata, StoredMetadata or a Broadcast of the metadata bytes
    _checkpoint: CompletedCheckpoint | None = None
    _operator_states: list[OperatorSnapshot] | None = field(default=None)
    _digests: dict[str, str] | None = field(default=None)

    def checkpoint(self) -> CompletedCheckpoint | None:
        if self.plan.restore_location is None:
            return None
        if self._checkpoint is None:
            stored = self.metadata
            data = stored.read(self.plan.config) if isinstance(stored, StoredMetadata) else stored.value
            meta = metadata_at(self.plan.restore_location, data)
            self._checkpoint = CompletedCheckpoint(
                _storage(self.plan.config), self.plan.restore_location, meta
            )
        return self._checkpoint

    def reading_through(self, storage: Any) -> CompletedCheckpoint | None:
        """The restore checkpoint, its files read through ``storage`` (local copies, counted)."""
        cp = self.checkpoint()
        if cp is None:
            return None
        return CompletedCheckpoint(storage, cp.location, cp.metadata)

    def digests(self) -> dict[str, str]:
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


def _local_root(plan: TaskPlan) -> str:
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


def _local_copies(plan: TaskPlan) -> tuple[LocalCopies | None, str]:
    """This executor's local copies of the operator's checkpoint files, and ``BatchInfo.local_recovery``.

    None with ``"off"`` when configured off, or with ``"off: <why>"`` when the
    directory cannot be used: one that is not this user's own (another user's,
    writable by others, or a symlink statekit did not make, anywhere below the
    local directory) turns local recovery off for this process, which then
    writes and deletes nothing there; restores read the checkpoint storage.
    """
    if not plan.config.get("statekit.local-recovery"):
        return None, "off"
    base = _local_root(plan)
    root = os.path.join(base, "statekit", "local-recovery", plan.job_id, plan.operator_id)
    with _LOCK:
        unsafe = _UNSAFE_LOCAL_RECOVERY.get(root)
    if unsafe is not None:
        return None, f"off: {unsafe}"
    try:
        return LocalCopies(root, base=base), "on"
    except UnsafeLocalPathError as e:
        with _LOCK:
            _UNSAFE_LOCAL_RECOVERY[root] = str(e)
        return None, f"off: {e}"
    except (OSError, ValueError) as e:  # unwritable now (a full disk): off for this task only
        return None, f"off: cannot create the local-recovery directory {root}: {e}"


def _evict_stale(plan: TaskPlan) -> None:
    """Drop cached subtasks of this job that can never be reused: older runs, older states."""
    stale = []
    with _LOCK:
        for key, entry in list(_CACHE.items()):
            if key[:2] != (plan.job_id, plan.operator_id):
                continue
            if entry.run_id != plan.run_id or entry.token not in (plan.restore_token, plan.token):
                stale.append(_CACHE.pop(key))
    for entry in stale:
        entry.close()


@dataclass(frozen=True)
class _Acquired:
    """How a task came by a subtask's state, for its report to the driver."""

    how: str
    """:data:`REUSED`, :data:`RESTORED_LOCALLY`, :data:`RESTORED_REMOTELY` or :data:`STARTED_EMPTY`."""
    downloaded: int = 0
    """Bytes read from the checkpoint storage."""
    rejected: int = 0
    """Local copies that were there but not used (read from the storage instead)."""
    reasons: tuple[str, ...] = ()
    """Why, naming each file (at most ten)."""


def _acquire(plan: TaskPlan, index: int, source: _RestoreSource) -> tuple[_Subtask, _Acquired]:
    """The subtask ``index`` holding the state of the restore source, and how it came by it.

    How: :data:`REUSED` (open in this process), :data:`RESTORED_LOCALLY` (every
    file from this executor's local copies), :data:`RESTORED_REMOTELY` (some
    from the checkpoint storage, also in place of a rejected local copy) or
    :data:`STARTED_EMPTY`.
    """
    if not 0 <= index < plan.parallelism:
        raise CheckpointError(f"row routed to subtask {index}, outside 0..{plan.parallelism - 1}")
    _evict_stale(plan)
    with _LOCK:
        entry = _CACHE.pop((plan.job_id, plan.operator_id, index), None)
    if entry is not None:
        # The very state whose snapshot the checkpoint holds: same batch and same task attempt
        # (two attempts of one task may both succeed, over records in another order).
        wanted = plan.restore_attempts.get(index)
        if entry.run_id == plan.run_id and wanted is not None and entry.attempt == wanted:
            # Its last snapshot is in the checkpoint this batch starts from, so that checkpoint
            # completed: the executor learns it here, as Flink's notifyCheckpointComplete.
            cp = source.checkpoint()
            if cp is not None and isinstance(entry.keyed, SupportsNativeSnapshot):
                entry.keyed.notify_checkpoint_complete(cp.checkpoint_id)
            return entry, _Acquired(REUSED)
        entry.close()
    backend = _backend(plan.config)
    local_root = _local_root(plan)
    # Private to this user (0700, no symlink, no one else's): the backends' state lives below it.
    # Spark's own local directory is trusted as Spark made it; a configured one is checked too.
    configured = bool(plan.config.get("statekit.local-dir"))
    root = private_dir(
        os.path.join(local_root, "statekit"),
        base=os.path.dirname(os.path.abspath(local_root)) if configured else local_root,
        what="the executor's statekit directory",
        otherwise="Or set statekit.local-dir to a directory of your own.",
    )
    local_dir = tempfile.mkdtemp(prefix=f"{plan.job_id}-{plan.operator_id}-{index}-", dir=root)
    try:
        keyed = backend.create_keyed_backend(
            key_serializer=plan.key_serializer,
            key_group_range=key_group_range_for_operator(plan.max_parallelism, plan.parallelism, index),
            max_parallelism=plan.max_parallelism,
            clock=system_clock,
            key_cache_size=int(plan.config.get("statekit.key-cache-size")),
            local_dir=local_dir,
        )
    except BaseException:
        shutil.rmtree(local_dir, ignore_errors=True)
        raise
    operator = backend.create_operator_backend()
    ctx = RuntimeContext(
        keyed,
        operator,
        job_id=plan.job_id,
        subtask_index=index,
        parallelism=plan.parallelism,
        max_parallelism=plan.max_parallelism,
        clock=system_clock,
    )
    function = plan.function_factory()
    clock = _BatchClock()
    timers = timer_service_for(function, ctx, plan.key_serializer, clock)
    st = _Subtask(
        plan.run_id,
        index,
        keyed,
        operator,
        function,
        ctx,
        ProcessContext(ctx, timers),
        timers,
        OnTimerContext(ctx, timers),
        clock,
    )
    st.local_dir = local_dir
    how, downloads = STARTED_EMPTY, Downloads()
    try:
        copies, _ = _local_copies(plan)
        # A local copy is read only if its bytes have the digest this checkpoint records.
        reading = LocalRecoveryStorage(_storage(plan.config), copies, downloads, source.digests())
        cp = source.reading_through(reading)
        if cp is not None:
            cp.restore_subtask(
                plan.operator_id,
                index,
                plan.parallelism,
                keyed,
                operator,
                operator_states=source.operator_states(),
            )
            # Local: nothing read from the storage (local copies, or state inline in the metadata).
            how = RESTORED_REMOTELY if downloads.remote_files else RESTORED_LOCALLY
            if plan.restore_claimed and isinstance(keyed, SupportsNativeSnapshot):
                # A completed checkpoint of this job in this storage: the instance may keep
                # referencing the files it restored (the completion contract's claim).
                keyed.notify_checkpoint_complete(cp.checkpoint_id)
            if copies is not None and reading.used:
                with contextlib.suppress(OSError):  # local copies only ever save a download
                    copies.remember(index, reading.used)
        st.function.open(ctx)
        st.opened = True
        timers.restore_timers()
    except BaseException:
        st.close()
        raise
    default_registry().hook.statekit_restore_done(
        job_id=plan.job_id,
        checkpoint_id=None if cp is None else cp.checkpoint_id,
        subtask_index=index,
        parallelism=plan.parallelism,
    )
    return st, _Acquired(how, downloads.remote_bytes, downloads.rejected, tuple(downloads.reasons))


class _BatchClock:
    """Processing time on Spark: the micro-batch's timestamp, the same for every task and retry."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


class _Output:
    """Collects the user's output and turns it into Arrow batches of the internal schema.

    Records (tuples, dicts...) gather in ``rows``, which the per-record loop
    appends to directly; a batch function's columns gather per column. What was
    added keeps its order: switching between the two materializes what is pending.
    """

    def __init__(self, plan: TaskPlan) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.names = [f.name for f in plan.output_schema.fields]
        self.schema = to_arrow_schema(
            internal_schema(plan.output_schema, plan.late_schema), timezone=plan.timezone
        )
        self.late_columns = [] if plan.late_schema is None else list(plan.late_schema.names)
        self.rows: list[tuple[Any, ...]] = []
        self._width = len(self.names)
        self._known = frozenset(self.names)
        self._types = list(self.schema.types[: self._width])
        # Column mode: Python values per column, and Arrow chunks already made (in order).
        self._values: list[list[Any]] = [[] for _ in self.names]
        self._pending = 0  # rows in _values
        self._chunks: list[list[Any]] = [[] for _ in self.names]
        self._chunked = 0  # rows in _chunks

    @property
    def size(self) -> int:
        """Rows collected and not yet flushed."""
        return len(self.rows) + self._pending + self._chunked

    def add(self, record: Any) -> None:
        if type(record) is tuple and len(record) == self._width:  # the common case, first
            self._materialize_pending()
            self.rows.append(record)
        elif isinstance(record, dict):
            if not self._known.issuperset(record):
                unknown = sorted(set(record) - self._known)
                raise ValueError(f"output record has fields {unknown} that the output schema lacks")
            self._materialize_pending()
            self.rows.append(tuple(record.get(n) for n in self.names))
        elif isinstance(record, (tuple, list)):
            if len(record) != self._width:
                raise ValueError(
                    f"output record {record!r} has {len(record)} fields, the output schema {self._width}: "
                    f"{', '.join(self.names)}"
                )
            self._materialize_pending()
            self.rows.append(tuple(record))
        elif self._width == 1:
            self._materialize_pending()
            self.rows.append((record,))
        else:
            raise TypeError(
                f"output records must be tuples, lists, Rows or dicts of {', '.join(self.names)}; "
                f"got {type(record).__name__}"
            )

    def add_result(self, result: Any) -> int:
        """What a function returned: columns, or an iterable of records; the number of rows added."""
        if result is None:
            return 0
        if is_columnar(result):
            return self.add_columns(result)
        n = 0
        for record in result:
            self.add(record)
            n += 1
        return n

    def add_columns(self, result: Any) -> int:
        """A batch function's output (Arrow, pandas or a mapping of columns); its number of rows."""
        columns, n = output_columns(result, self.names)
        if n == 0:
            return 0
        if self.rows:
            self._materialize_rows()
        cols = list(columns.values())
        if all(c is None or isinstance(c, (list, tuple, range)) for c in cols):
            # Python values (the cheap case for a few rows per key): gathered, converted at flush.
            for values, col in zip(self._values, cols):
                values.extend(itertools.repeat(None, n) if col is None else col)
            self._pending += n
            return n
        # Arrow, numpy or pandas columns: converted now, after what is pending.
        self._materialize_pending()
        for i, col in enumerate(cols):
            self._chunks[i].append(pa.nulls(n, self._types[i]) if col is None else self._array(i, col))
        self._chunked += n
        return n

    def _array(self, i: int, values: Any) -> Any:
        typ = self._types[i]
        try:
            if isinstance(values, pa.ChunkedArray):
                values = values.combine_chunks()
            if isinstance(values, pa.Array):
                return values if values.type == typ else values.cast(typ)
            return pa.array(values, type=typ)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            raise TypeError(f"output column {self.names[i]!r} ({typ}): {exc}") from exc

    def _materialize_pending(self) -> None:
        """Columns gathered as Python values become Arrow chunks (before anything added after them)."""
        if self._pending:
            for i, values in enumerate(self._values):
                self._chunks[i].append(self._array(i, values))
            self._values = [[] for _ in self.names]
            self._chunked += self._pending
            self._pending = 0

    def _materialize_rows(self) -> None:
        rows = self.rows
        for i in range(self._width):
            self._chunks[i].append(self._array(i, [r[i] for r in rows]))
        self._chunked += len(rows)
        rows.clear()

    def flush(self) -> Any:
        if self._chunked or self._pending:
            self._materialize_pending()
            if self.rows:
                self._materialize_rows()
            arrays = [chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks) for chunks in self._chunks]
            n = self._chunked
            self._chunks = [[] for _ in self.names]
            self._chunked = 0
        else:
            rows = list(self.rows)
            self.rows.clear()  # the same list: the task appends to it directly
            # A list per column (not zip(*rows), which unpacks every row as an argument).
            arrays = [self._array(i, [r[i] for r in rows]) for i in range(self._width)]
            n = len(rows)
        for typ in self.schema.types[len(self.names) : -1]:
            arrays.append(pa.nulls(n, typ))
        arrays.append(pa.nulls(n, pa.string()))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def late(self, batch: Any, indices: list[int]) -> Any:
        """The late rows ``indices`` of input ``batch``, in the internal schema."""
        n = len(indices)
        taken = batch.select(self.late_columns).take(pa.array(indices, pa.int64()))
        width = len(self.names)
        types = self.schema.types
        arrays = [pa.nulls(n, types[i]) for i in range(width)]
        arrays.append(pa.array([True] * n, pa.bool_()))
        for i, col in enumerate(taken.columns):
            typ = types[width + 1 + i]
            arrays.append(col if col.type == typ else col.cast(typ))
        arrays.append(pa.nulls(n, pa.string()))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def handles(self, descriptions: Sequence[str]) -> Any:
        n = len(descriptions)
        arrays = [pa.nulls(n, typ) for typ in self.schema.types[:-1]]
        arrays.append(pa.array(list(descriptions), type=pa.string()))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def make_task(plan: TaskPlan, metadata: Any) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function that processes one partition of a routed micro-batch.

    It yields the output records, then one row per served subtask whose handle
    column describes the subtask's snapshot (written into checkpoint
    ``plan.checkpoint_id`` under stream names unique to this task attempt).
    """
    return _PartitionTask(plan, metadata)


class _PartitionTask:
    """A module-level class, so that tasks unpickle it by reference and share this module's cache."""

    def __init__(self, plan: TaskPlan, metadata: Any) -> None:
        self.plan = plan
        self.metadata = metadata

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        plan = self.plan
        tc = TaskContext.get()
        attempt_id = tc.taskAttemptId() if tc is not None else f"local{next(_LOCAL_ATTEMPTS)}"
        attempt_number = tc.attemptNumber() if tc is not None else 0
        if plan.restore_attempts and plan.config.get("statekit.spark.worker-handoff"):
            it = iter(batches)
            first = next(it, None)
            handed = (
                None
                if first is None
                else _hand_off(plan, self.metadata, first, it, attempt_id, attempt_number)
            )
            if handed is not None:
                yield from handed
                return
            batches = it if first is None else itertools.chain((first,), it)
        yield from _run_partition(plan, self.metadata, batches, attempt_id, attempt_number)


def _run_partition(
    plan: TaskPlan,
    metadata: Any,
    batches: Iterator[Any],
    attempt_id: Any,
    attempt_number: int,
    handed_from: int | None = None,
) -> Iterator[Any]:
    """Process one partition in this process: its output batches, then its snapshots' handle rows."""
    run = _TaskRun(plan, _RestoreSource(plan, metadata), f"{plan.token[:12]}-{attempt_id}")
    run.handed_from = handed_from
    done = False
    try:
        if plan.vectorized:
            yield from run.process_groups(batches)
        else:
            yield from run.process_records(batches)
        yield from run.fire_timers()
        handles = run.snapshot(attempt_number)
        done = True
        yield handles
    finally:
        if not done:
            for st in run.active.values():
                st.close()


def _job_key(plan: TaskPlan) -> str:
    return f"{plan.job_id}/{plan.operator_id}"


def _hand_off(
    plan: TaskPlan, metadata: Any, first: Any, rest: Iterator[Any], attempt_id: Any, attempt_number: int
) -> Iterator[Any] | None:
    """The partition handed to the sibling worker holding its subtask open; None to run it here.

    Only when the subtask's state, at exactly the attempt the checkpoint
    recorded, is open in another Python worker of this executor (see
    :mod:`._handoff`).
    """
    if not first.num_rows:
        return None
    index = first.column(SUBTASK_COLUMN)[0].as_py()
    wanted = plan.restore_attempts.get(index)
    if wanted is None:
        return None
    with _LOCK:
        mine = _CACHE.get((plan.job_id, plan.operator_id, index))
    if mine is not None and mine.attempt == wanted:
        return None  # open here
    root = _local_root(plan)
    owner = _handoff.owner_of(root, _job_key(plan), index)
    if owner is None or owner[0] == os.getpid() or owner[1] != wanted:
        return None
    if not isinstance(metadata, (InlineMetadata, StoredMetadata)):
        metadata = InlineMetadata(metadata.value)  # a broadcast's bytes: the sibling may not have loaded it
    header = {
        "plan": plan,
        "metadata": metadata,
        "subtask": index,
        "attempt_id": attempt_id,
        "attempt_number": attempt_number,
        "from": os.getpid(),
    }
    timeout = float(plan.config.get("statekit.spark.worker-handoff.timeout"))
    return _handoff.forward(root, owner[0], header, first, rest, timeout)


def _accepts_handoff(header: dict[str, Any]) -> bool:
    """Whether this process holds the subtask a handed-off task asks for, at the attempt it wants."""
    plan = header.get("plan")
    if not isinstance(plan, TaskPlan):
        return False
    index = header.get("subtask")
    if not isinstance(index, int):
        return False
    with _LOCK:
        entry = _CACHE.get((plan.job_id, plan.operator_id, index))
    wanted = plan.restore_attempts.get(index)
    return (
        entry is not None and entry.run_id == plan.run_id and wanted is not None and entry.attempt == wanted
    )


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


class _TaskRun:
    """One task attempt: the subtasks it serves, their outputs, and where its time went."""

    def __init__(self, plan: TaskPlan, source: _RestoreSource, attempt: str) -> None:
        self.plan = plan
        self.source = source
        self.attempt = attempt
        self.out = _Output(plan)
        self.active: dict[int, _Subtask] = {}
        self.how: dict[int, _Acquired] = {}  # subtask -> how it came by its state
        self.phases = dict.fromkeys(TASK_PHASES, 0.0)
        self.started = time.perf_counter()
        self.handed_from: int | None = None  # the sibling worker whose task this is, if handed off
        self.letters: list[BadRecord] = []  # this task's rows without a key, under the dead-letter policy
        self.rows_read = 0  # every row but the markers, for statekit.bad-records.max-ratio
        self._policy: BadRecordPolicy | None = None

    def subtask(self, index: Any) -> _Subtask:
        """The subtask ``index``, acquired (restored or reused) on its first row."""
        st = self.active.get(index)
        if st is not None:
            return st
        plan = self.plan
        if index is None:  # the loops hand such rows to reject_key, never here
            raise ValueError(f"null key in column {plan.key_column!r}: every record needs a key")
        t = time.perf_counter()
        st, acquired = _acquire(plan, index, self.source)
        self.phases["restore"] += time.perf_counter() - t
        st.clock.now = plan.batch_timestamp_ms
        st.timers.set_watermark(plan.watermark)
        self.active[index] = st
        self.how[index] = acquired
        return st

    def reject_key(self, record: Mapping[str, Any], place: str | None) -> None:
        """A row routed to no subtask (its key is null, or refused by the key serializer): a bad record.

        It goes to ``statekit.bad-records.policy`` with the micro-batch, the
        file Spark read it from (when it knows) and the row's values.

        Raises:
            BadRecordError: Under the ``fail`` policy, or past the task's ``max`` budget.
        """
        plan = self.plan
        key = record.get(plan.key_column)
        error: Exception = ValueError(f"null key in column {plan.key_column!r}: every record needs a key")
        if key is not None:
            try:
                plan.key_serializer.serialize(key)
                error = ValueError(f"key {key!r} of column {plan.key_column!r} has no key group")
            except Exception as e:  # noqa: BLE001 - what the serializer says is the record's error
                error = e
        if self._policy is None:
            conf = plan.config
            self._policy = BadRecordPolicy(
                policy=str(conf.get("statekit.bad-records.policy")),
                sink=self.letters.append,
                max_bad=conf.get("statekit.bad-records.max"),
                max_ratio=conf.get("statekit.bad-records.max-ratio"),
                job_id=plan.job_id,
            )
        file = place.removeprefix("file://") if place and place.startswith("file:///") else place
        bad = BadRecord(
            "key", f"{type(error).__name__}: {error}", file, raw=repr(dict(record)), batch=plan.batch_id
        )
        self._policy.handle(bad)

    def commit_letters(self) -> int:
        """Check the task's bad-record share, then write its dead letters; how many there were.

        One file per micro-batch (every row without a key group lands in one
        partition), named by query and batch: a retried task, or the batch run
        again after a failure, replaces it.
        """
        policy = self._policy
        if policy is None:
            return 0
        policy.check_ratio(self.rows_read)
        if self.letters:
            plan = self.plan
            path = plan.config.get("statekit.bad-records.dead-letter-path")
            assert path is not None  # the driver refuses dead-letter without a path
            name = (
                f"part-{file_part(plan.job_id)}-{file_part(plan.operator_id)}-{file_part(plan.query_id)}"
                f"-batch-{plan.batch_id:012d}.json"
            )
            extra = {"query_id": plan.query_id, "operator_id": plan.operator_id}
            DeadLetterDir(str(path)).publish(name, ({**policy.letter(b), **extra} for b in self.letters))
        return policy.count

    def late(self, st: _Subtask, ts: int, row: int, late_rows: list[int]) -> bool:
        """Whether row ``row`` (event time ``ts``) is late and left out; counts it, notes the event time.

        A late row (at or below the batch's watermark) goes to ``late_rows``
        when a late-records sink takes it, or to the function under the
        ``process`` policy (then this returns False).
        """
        if ts <= self.plan.watermark:
            st.late += 1
            et = self.plan.event_time
            if et is None or et.late is not LatePolicy.PROCESS:
                if self.out.late_columns:
                    late_rows.append(row)
                return True
        if st.max_event_time is None or ts > st.max_event_time:
            st.max_event_time = ts
        return False

    def process_records(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The per-record loop: ``process`` per row, in the order rows arrive."""
        plan, out, phases = self.plan, self.out, self.phases
        et = plan.event_time
        pending = out.rows
        append, width = pending.append, len(out.names)
        key_column = plan.key_column
        clock = time.perf_counter
        it = iter(batches)
        while True:
            t = clock()
            batch = next(it, None)
            phases["input"] += clock() - t
            if batch is None:
                return
            t = clock()
            subtasks = batch.column(SUBTASK_COLUMN).to_pylist()
            markers = batch.column(MARKER_COLUMN).to_pylist()
            records = batch.select(list(plan.input_columns)).to_pylist()
            times = _event_times(batch, et) if et is not None else None
            late_rows: list[int] = []
            places = batch.column(PLACE_COLUMN).to_pylist() if None in subtasks else None
            self.rows_read += len(subtasks)
            t_loop = clock()
            phases["convert"] += t_loop - t
            restoring = phases["restore"]  # a restore inside the loop is the restore's time
            cur: Any = _NO_SUBTASK
            for row, (index, marker, record) in enumerate(zip(subtasks, markers, records)):
                if index is None:
                    assert places is not None
                    self.reject_key(record, places[row])
                    continue
                if index != cur:
                    # Rows come grouped by subtask: bind its state and function once per run.
                    st = self.subtask(index)
                    cur = index
                    set_key, pctx, process = st.keyed.set_current_key, st.pctx, st.function.process
                if marker:
                    self.rows_read -= 1
                    continue
                ts = None
                if times is not None:
                    ts = times[row]
                    if ts is not None and self.late(st, ts, row, late_rows):
                        continue
                key = record[key_column]
                set_key(key)
                pctx.current_key = key
                pctx.timestamp = ts
                st.records += 1
                result = process(record, pctx)
                if result is not None:
                    for o in result:
                        if type(o) is tuple and len(o) == width:  # out.add's common case, inline
                            append(o)
                        else:
                            out.add(o)
                        st.outputs += 1
                    if len(pending) >= _FLUSH_ROWS:
                        t = clock()
                        flushed = out.flush()
                        phases["output"] += clock() - t
                        yield flushed
                        t_loop += clock() - t  # the flush and the consumer's turn are not the loop's
            phases["records"] += clock() - t_loop - (phases["restore"] - restoring)
            if late_rows:
                yield out.late(batch, late_rows)

    def process_groups(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The vectorized loop: every input row first, then ``process_batch`` once per subtask and key."""
        plan, out, phases = self.plan, self.out, self.phases
        clock = time.perf_counter
        t = clock()
        received = [b for b in batches if b.num_rows]
        phases["input"] += clock() - t
        if not received:
            return
        t = clock()
        batch = pa.Table.from_batches(received).combine_chunks().to_batches()[0]
        subtasks = batch.column(SUBTASK_COLUMN).to_pylist()
        markers = batch.column(MARKER_COLUMN).to_pylist()
        keys = batch.column(plan.key_column).to_pylist()
        self.rows_read += len(markers) - sum(markers)
        if None in subtasks:  # rows without a key group: bad records, never in a group
            bad = [row for row, index in enumerate(subtasks) if index is None]
            places = batch.column(PLACE_COLUMN).take(pa.array(bad, pa.int64())).to_pylist()
            rejected = batch.select(list(plan.input_columns)).take(pa.array(bad, pa.int64())).to_pylist()
            for record, place in zip(rejected, places):
                self.reject_key(record, place)
        served = {index for index in subtasks if index is not None}
        restoring = phases["restore"]
        for index in sorted(served):
            self.subtask(index)  # every subtask whose rows (or marker) came here runs and snapshots
        late_rows: list[int] = []
        et = plan.event_time
        if et is None:
            rows = [
                row
                for row, (index, marker) in enumerate(zip(subtasks, markers))
                if not marker and index is not None
            ]
        else:
            rows = []
            times = _event_times(batch, et)
            active = self.active
            for row, (index, marker) in enumerate(zip(subtasks, markers)):
                if marker or index is None:
                    continue
                ts = times[row]
                if ts is not None and self.late(active[index], ts, row, late_rows):
                    continue
                rows.append(row)
        serialize = plan.key_serializer.serialize
        if len(served) == 1:  # the usual case: one subtask per partition, group on the key alone
            (only,) = served
            order, key_runs = group_runs(keys, rows, fallback=serialize)
            runs = [((only, key), offset, length) for key, offset, length in key_runs]
        else:
            order, runs = group_runs(
                list(zip(subtasks, keys)), rows, fallback=lambda sk: (sk[0], serialize(sk[1]))
            )
        grouped = batch.select(list(plan.input_columns)).take(pa.array(order, pa.int64()))
        t_loop = clock()
        phases["convert"] += t_loop - t - (phases["restore"] - restoring)
        cur: Any = _NO_SUBTASK
        for (index, key), offset, length in runs:
            if index != cur:
                st = self.active[index]
                cur = index
                function = st.function
                assert isinstance(function, KeyedBatchFunction)  # plan.vectorized says so
                set_key, pctx, process_batch = st.keyed.set_current_key, st.pctx, function.process_batch
                pctx.timestamp = None
            set_key(key)
            pctx.current_key = key
            st.records += length
            result = process_batch(grouped.slice(offset, length), pctx)
            if result is not None:
                st.outputs += out.add_columns(result)
                if out.size >= _FLUSH_ROWS:
                    t = clock()
                    flushed = out.flush()
                    phases["output"] += clock() - t
                    yield flushed
                    t_loop += clock() - t
        phases["records"] += clock() - t_loop
        if late_rows:
            yield out.late(batch, late_rows)

    def fire_timers(self) -> Iterator[Any]:
        """The batch's time: timers due at its watermark and timestamp fire, in order per subtask."""
        plan, out, clock = self.plan, self.out, time.perf_counter
        t = clock()
        fire_until = MAX_WATERMARK if plan.end_of_input else plan.watermark
        for _, st in sorted(self.active.items()):
            st.timers.set_watermark(fire_until)
            st.fire(TimeDomain.EVENT_TIME, fire_until, out)
            if plan.end_of_input:
                # The end of time lasts for this firing only (the checkpoint keeps the rows'
                # watermark): a subtask this process keeps for the next batch must not keep it.
                st.timers.end_of_time_passed(plan.watermark)
            st.fire(TimeDomain.PROCESSING_TIME, plan.batch_timestamp_ms, out)
            if out.size >= _FLUSH_ROWS:
                yield out.flush()
        self.phases["timers"] += clock() - t
        if out.size:
            t = clock()
            flushed = out.flush()
            self.phases["output"] += clock() - t
            yield flushed

    def snapshot(self, attempt_number: int) -> Any:
        """Every subtask's snapshot into the batch's checkpoint; the handle rows that describe them.

        The subtasks go back into the process cache, marked with this attempt.
        """
        plan, phases, clock = self.plan, self.phases, time.perf_counter
        bad = self.commit_letters()
        t_snapshot = clock()
        storage = _storage(plan.config)
        copies, local_recovery = _local_copies(plan)
        states = []
        for index, st in sorted(self.active.items()):
            inner: CheckpointWriter = storage.begin_checkpoint(plan.job_id, plan.checkpoint_id)
            local = None if copies is None else LocalRecoveryWriter(inner, copies)
            writer = _AttemptWriter(inner if local is None else local, self.attempt)
            try:
                state = write_subtask_state(
                    writer,
                    plan.operator_id,
                    index,
                    st.keyed,
                    st.operator,
                    max_state_size=storage.max_state_size,
                    native_checkpoint_id=(
                        plan.checkpoint_id
                        if plan.config.get("statekit.checkpoint.format") != "canonical"
                        else None
                    ),
                )
            except BaseException:
                if local is not None:
                    local.discard_staged()
                raise
            states.append((index, state))
            if copies is not None and local is not None:
                with contextlib.suppress(OSError):  # local copies only ever save a download
                    # Named by the digests the metadata records: what a restore asks for.
                    copies.remember(index, local.keep(state.to_json()))
        if copies is not None:
            with contextlib.suppress(OSError):
                copies.collect()
        phases["snapshot"] = clock() - t_snapshot
        phases["task"] = clock() - self.started
        reports = []
        for index, state in states:
            st = self.active[index]
            reported_bad, bad = bad, 0  # the task's bad rows, reported with its first subtask
            reports.append(
                {
                    "subtask": index,
                    "state": state.to_json(),
                    "records": st.records,
                    "outputs": st.outputs,
                    "late": st.late,
                    "bad": reported_bad,
                    "fired": st.fired,
                    "max_event_time": st.max_event_time,
                    "reused": self.how[index].how == REUSED,
                    "how": self.how[index].how,
                    "downloaded": self.how[index].downloaded,
                    "copies_rejected": self.how[index].rejected,
                    "copy_rejections": list(self.how[index].reasons),
                    "local_recovery": local_recovery,
                    "pid": os.getpid(),
                    "handed_from": self.handed_from,
                    "attempt": self.attempt,
                    "attempt_number": attempt_number,
                    "phases": phases,
                }
            )
        with _LOCK:
            for index, st in self.active.items():
                st.token, st.attempt, st.records, st.outputs = plan.token, self.attempt, 0, 0
                st.late, st.fired, st.max_event_time = 0, 0, None
                _CACHE[(plan.job_id, plan.operator_id, index)] = st
        handoff = "off: statekit.spark.worker-handoff=false"
        if plan.config.get("statekit.spark.worker-handoff"):
            with contextlib.suppress(OSError):  # hand-off only ever saves a restore
                _handoff.announce(
                    _local_root(plan),
                    _job_key(plan),
                    sorted(self.active),
                    self.attempt,
                    _accepts_handoff,
                    _serve_handoff,
                )
            handoff = _handoff.status()  # "off: <why>" when this worker's directory was refused
        descriptions = [json.dumps({**r, "handoff": handoff}, separators=(",", ":")) for r in reports]
        return self.out.handles(descriptions)


def _event_times(batch: Any, et: EventTime) -> list[int | None]:
    """The event time of every row of ``batch`` in epoch ms (None where null)."""
    name = et.field
    if not isinstance(name, str):
        raise TypeError("on Spark, EventTime(field=...) names a column")
    col = batch.column(name)
    typ = col.type
    if pa.types.is_timestamp(typ):
        raw = col.cast(pa.int64()).to_pylist()
        unit = typ.unit
        if unit == "ms":
            return raw  # type: ignore[no-any-return]
        if unit == "s":
            return [None if v is None else v * 1000 for v in raw]
        div = 1000 if unit == "us" else 1_000_000
        return [None if v is None else v // div for v in raw]
    if pa.types.is_integer(typ):
        return col.to_pylist()  # type: ignore[no-any-return]
    raise TypeError(
        f"event-time column {name!r} is {typ}: use a timestamp column or epoch milliseconds as a long"
    )
