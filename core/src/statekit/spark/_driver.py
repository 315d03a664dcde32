"""The driver side: one statekit checkpoint per Spark micro-batch, completed after the sink.

For micro-batch ``b`` of query ``q`` the driver reads the latest completed
checkpoint ``C`` of the job; its properties record the query and batch that
made it. Then:

- ``C`` is from ``q`` and ``b <= C.batch``: the batch was done (the driver died
  after completing the checkpoint, before Spark committed the batch). Skip it:
  its outputs were written before ``C`` was completed.
- ``C`` is from ``q`` and ``b == C.batch + 1``: process ``b`` from ``C``.
- anything else is an error, unless ``restore`` says where a new query starts.

Processing: every task restores (or reuses) its subtasks at exactly ``C``,
processes its rows, writes a snapshot into checkpoint ``n`` and reports it;
the driver writes the outputs to the sink, then completes ``n`` (writing its
metadata last and atomically). Whatever fails before that leaves ``C`` the
latest checkpoint, and the batch is processed again from ``C``.

Event time: the watermark a batch runs with is the one ``C`` recorded; the
tasks report the largest event time they saw, and checkpoint ``n`` records the
new watermark (that maximum minus the delay, never lower than before), which
the next batch runs with, as Spark's default watermark policy. Processing time
is the batch's timestamp, fixed when the driver plans it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .._contracts import CheckpointStorage
from .._errors import CheckpointError, ConfigurationError, CorruptCheckpointError
from ..checkpoints._fencing import RunFence, takeover_note
from ..checkpoints._metadata import SubtaskState
from ..checkpoints._restore import CompletedCheckpoint, load_checkpoint
from ..checkpoints._retention import apply_retention, highest_checkpoint_id
from ..checkpoints._verify import verify_loaded
from ..checkpoints._writing import complete_checkpoint
from ..plugins._config import Configuration
from ..plugins._registry import PluginRegistry, default_registry
from ..runtime._function import KeyedBatchFunction, KeyedProcessFunction
from ..runtime._runner import _end_of_time_message, checkpoint_storage_from_config, state_backend_from_config
from ..serialization._keygroups import compute_default_max_parallelism, validate_parallelism
from ..serialization._serializers import TypeSerializer
from ..sources._deadletters import DeadLetterDir
from ..timers import MAX_WATERMARK, MIN_WATERMARK, WATERMARK_PROPERTY, EventTime
from ._handoff import batch_status
from ._jvm import JvmLocality, LocalityUnavailable
from ._plan import (
    HANDLE_COLUMN,
    LATE_COLUMN,
    LATE_PREFIX,
    InlineMetadata,
    StoredMetadata,
    TaskPlan,
    internal_schema,
)
from ._routing import Router, routing_values
from ._sparkconf import application, default_parallelism, is_connect, local_dir, spark_configuration
from ._task import make_task

__all__ = [
    "ATTEMPTS_PROPERTY",
    "BATCH_PROPERTY",
    "QUERY_PROPERTY",
    "STATIC_QUERY",
    "TOKEN_PROPERTY",
    "BatchInfo",
    "ConnectBatches",
    "Coordinator",
    "JobSpec",
    "check_columns",
    "check_key_type",
    "driver_storage",
    "resolve_dead_letters",
]

#: Checkpoint metadata properties written by the Spark runner.
QUERY_PROPERTY = "spark_query_id"
BATCH_PROPERTY = "spark_batch_id"
TOKEN_PROPERTY = "spark_state_token"
ATTEMPTS_PROPERTY = "spark_subtask_attempts"
#: The query id recorded by :meth:`ProcessedStream.run` (static DataFrames).
STATIC_QUERY = "static"

Sink = Callable[[DataFrame, int], None]

_DRIVER_STORAGES: dict[str, CheckpointStorage] = {}
#: Checkpoint metadata up to this size is shipped inside the tasks, larger as a broadcast.
_INLINE_METADATA = 256 * 1024
_DRIVER_LOCK = threading.Lock()


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
        bad_records: Rows without a key (null, or refused by the key serializer)
            skipped into dead letters (``statekit.bad-records.policy=dead-letter``);
            not in ``records``.
        timers_fired: Timers that fired in the batch.
        watermark: The event-time watermark the next batch runs with.
        phases: Where the batch's time went, in seconds. On the driver (wall
            time): ``prepare`` (the checkpoint to start from, the plan),
            ``tasks`` (the Spark job that scans, routes and processes every
            row and writes the snapshots), ``sink``, ``checkpoint`` (completing
            it), ``retention``. Summed over the tasks: ``task_input`` (waiting
            for input rows: shuffle read and Arrow transfer), ``task_restore``
            (restoring the subtasks that did not reuse open state), ``task_convert``
            (Arrow to Python), ``task_records`` (the record loop: state access,
            the function, output rows), ``task_output`` (output Arrow batches),
            ``task_timers``, ``task_snapshot``, ``task_task`` (the whole task).
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
    timers_fired: int = 0
    watermark: int = MIN_WATERMARK
    phases: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class JobSpec:
    """Everything :class:`ProcessedStream` knows about the job (driver side)."""

    df: DataFrame
    key_column: str
    key_serializer: TypeSerializer
    function_factory: Callable[[], KeyedProcessFunction]
    output_schema: T.StructType
    job_id: str
    operator_id: str
    config: Configuration | None
    allow_non_restored_state: bool
    on_batch: Callable[[BatchInfo], None] | None
    sink: Sink | None
    event_time: EventTime | None = None
    late_sink: Sink | None = None


class ConnectBatches:
    """The ``foreachBatch`` function of a query started from a Spark Connect client.

    Spark Connect pickles it to the server, which calls it in a Python
    process of the query's own, with each micro-batch bound to a session of
    the query (a Connect session too). So the driver side of statekit runs
    there: the :class:`Coordinator` is made at the first micro-batch of each
    query run and lives as long as that process, as it lives as long as
    ``start()``'s closure on a classic driver.

    A Connect session cannot tell which query runs a batch (classic tasks read
    it from a local property), so the query's id is read where Spark keeps it:
    the ``metadata`` file of the query's checkpoint location, written when the
    query first started and kept across restarts, read through Spark itself
    (any file system the checkpoint location is on).
    """

    def __init__(self, spec: JobSpec, *, restore: str | None, checkpoint_location: str) -> None:
        """``spec`` without its DataFrame (a Connect DataFrame belongs to the client's session)."""
        # The server puts each batch's DataFrame in; a Connect DataFrame cannot be pickled.
        self._spec = dataclasses.replace(spec, df=None)  # type: ignore[arg-type]
        self._restore = restore
        self._checkpoint_location = checkpoint_location
        self._coordinator: Coordinator | None = None
        self._query_id: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Pickled once, by the client, before any batch: no coordinator to carry.
        return {**self.__dict__, "_coordinator": None, "_query_id": None}

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        """Process one micro-batch (on the Connect server's Python process)."""
        if self._coordinator is None or self._query_id is None:
            session = batch_df.sparkSession
            query_id = query_id_at(session, self._checkpoint_location)
            spec = dataclasses.replace(self._spec, df=batch_df)
            self._coordinator = Coordinator(spec, session, restore=self._restore)
            self._query_id = query_id
        self._coordinator.process_batch(batch_df, batch_id, self._query_id)


def query_id_at(session: SparkSession, checkpoint_location: str) -> str:
    """The id of the streaming query whose checkpoint location this is, as Spark recorded it.

    Raises:
        CheckpointError: If the location holds no query metadata.
    """
    path = checkpoint_location.rstrip("/") + "/metadata"
    try:
        rows = session.read.text(path).collect()
        found = json.loads(rows[0][0])["id"] if rows else None
    except Exception as e:  # Spark's own errors (a missing file, ...), and bad JSON
        raise CheckpointError(
            f"cannot read the streaming query's id from {path} (Spark writes it when a query "
            f"starts): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from e
    if not isinstance(found, str) or not found:
        raise CheckpointError(f"{path} names no streaming query id")
    return found


def _storage_key(conf: Configuration) -> str:
    name = conf.storage_name
    return json.dumps(
        [
            name,
            conf.plugin_options("storage", name),
            conf.get("statekit.checkpoints.dir"),
            conf.get("statekit.savepoints.dir"),
        ],
        sort_keys=True,
        default=str,
    )


def driver_storage(conf: Configuration, registry: PluginRegistry | None = None) -> CheckpointStorage:
    """The driver's checkpoint storage for ``conf``: one object per storage configuration and process.

    The ``jobmanager`` storage keeps completed checkpoints in this object, so a
    query restarted in the same driver process finds them, as a Flink job finds
    its checkpoints in the JobManager.
    """
    key = _storage_key(conf)
    with _DRIVER_LOCK:
        storage = _DRIVER_STORAGES.get(key)
        if storage is None:
            storage = _DRIVER_STORAGES[key] = checkpoint_storage_from_config(conf, registry)
        return storage


def _parallelism_of(cp: CompletedCheckpoint, operator_id: str) -> int | None:
    subtasks = cp.metadata.operators.get(operator_id)
    return len(subtasks) if subtasks else None


class Coordinator:
    """Runs the micro-batches of one query run (one ``start`` or ``run``) on the driver."""

    def __init__(self, spec: JobSpec, session: SparkSession, *, restore: str | None) -> None:
        """Reads and validates the configuration, picks parallelism and max parallelism.

        Raises:
            ConfigurationError, UnknownPluginError, PluginError: On a bad configuration.
            CheckpointError: If the checkpoint to start from cannot be restored here.
        """
        self.spec = spec
        self.session = session
        self.registry = default_registry()
        conf = spark_configuration(session, spec.config)
        conf.validate(self.registry)
        conf = resolve_dead_letters(conf, connect=is_connect(session))
        state_backend_from_config(conf, self.registry)  # fail on the driver, not in every task
        # Made once here too: a factory that makes no function fails now, not in every task.
        function = spec.function_factory()
        if not isinstance(function, KeyedProcessFunction):
            raise TypeError(
                f"the function factory made a {type(function).__name__}, not a KeyedProcessFunction "
                "or KeyedBatchFunction"
            )
        self.vectorized = isinstance(function, KeyedBatchFunction)
        self.config = conf
        self.storage = driver_storage(conf, self.registry)
        self.restore = restore
        self.retained = int(conf.get("statekit.checkpoints.retained") or 1)
        self.run_id = uuid.uuid4().hex
        self.connect = is_connect(session)
        # Claimed at the first batch this query processes (see _claim): a query refused before
        # (its state is not its own) must not fence off the run that owns the job.
        self.fence = RunFence(self.storage, spec.job_id, application(session))
        # Ids only go up: a new checkpoint is numbered above every completed one, damaged ones too.
        self._floor = highest_checkpoint_id(self.storage, spec.job_id)
        self._checked: set[str] = set()  # checkpoints whose files were checked before tasks read them
        latest = self.latest()
        base = latest if restore in (None, "latest") else _load(self.storage, restore)
        p = conf.get("statekit.parallelism")
        if p is None and base is not None:
            p = _parallelism_of(base, spec.operator_id)
        self.parallelism = int(p or default_parallelism(session))
        maxp = conf.get("statekit.max-parallelism")
        if maxp is None and base is not None:
            maxp = base.metadata.max_parallelism  # as Flink: unset, it comes from the restored state
        self.max_parallelism = int(maxp or compute_default_max_parallelism(self.parallelism))
        validate_parallelism(self.parallelism, self.max_parallelism)
        if base is not None:
            self._validate(base)
        self.router = Router(
            session,
            spec.df.schema,
            key_column=spec.key_column,
            serializer=spec.key_serializer,
            parallelism=self.parallelism,
            max_parallelism=self.max_parallelism,
            route_values=routing_values(session, self.parallelism),
        )
        self.timezone = session.conf.get("spark.sql.session.timeZone")
        self.local_dir = local_dir(session)
        self._claimed: dict[str, bool] = {}
        self.locality, self.locality_status = _locality(session, str(conf.get("statekit.spark.locality")))
        self.handoff_enabled = bool(conf.get("statekit.spark.worker-handoff"))

    def _claim(self) -> None:
        """Become the newest run of the job (once): an older driver still running it is fenced off now.

        Only once this query is sure to process a batch (its state is its own,
        or it was told where to start from). The ids of its checkpoints then go
        above every one completed so far, the fenced run's included.
        """
        if self.fence.epoch is None:
            self.fence.claim()
            self._floor = max(self._floor, highest_checkpoint_id(self.storage, self.spec.job_id))

    def _claims(self, source: CompletedCheckpoint | None, latest: CompletedCheckpoint | None) -> bool:
        """Whether ``source`` is a completed checkpoint of this job in this storage (not a savepoint).

        Then a restored native instance may reference its files (the completion
        contract's claim); a savepoint or another job's checkpoint is never claimed.
        """
        if source is None or source.metadata.kind != "checkpoint":
            return False
        if source.metadata.job_id != self.spec.job_id:
            return False
        if latest is not None and source.location == latest.location:
            return True
        if source.location not in self._claimed:
            own = self.storage.list_checkpoints(self.spec.job_id)
            self._claimed[source.location] = source.location in own
        return self._claimed[source.location]

    def _validate(self, cp: CompletedCheckpoint) -> None:
        cp.validate(
            max_parallelism=self.max_parallelism,
            operators={self.spec.operator_id: self.parallelism},
            allow_non_restored_state=self.spec.allow_non_restored_state,
        )

    def latest(self) -> CompletedCheckpoint | None:
        """The job's latest completed checkpoint, if any.

        A damaged one fails the query (Spark's offset log must match the checkpoint a
        query continues from: an older one is not exactly once), with the ways out.
        A query told to restore a given location ignores a damaged newest checkpoint
        and numbers its own above it.

        Raises:
            CorruptCheckpointError: If the latest checkpoint's metadata is damaged.
        """
        location = self.storage.latest_checkpoint(self.spec.job_id)
        if location is None:
            return None
        try:
            return _load(self.storage, location)
        except CorruptCheckpointError:
            if self.restore not in (None, "latest"):
                return None
            raise

    def _check_files(self, source: CompletedCheckpoint) -> None:
        """Once per checkpoint: every file ``source`` names is there with its size, before tasks read it."""
        if source.location in self._checked:
            return
        problems = verify_loaded(source, deep=False)
        if problems:
            damage = "; ".join(f"{p.file}: {p.problem}" for p in problems)
            raise CorruptCheckpointError(source.location, damage + _SPARK_WAYS_OUT)
        self._checked.add(source.location)

    # --- deciding what a batch is ------------------------------------------------------

    def _source(
        self, latest: CompletedCheckpoint | None, batch_id: int, query: str
    ) -> tuple[bool, CompletedCheckpoint | None]:
        """``(skip, checkpoint to start from)`` for batch ``batch_id`` of ``query``."""
        job = self.spec.job_id
        props = latest.metadata.properties if latest is not None else {}
        if query == STATIC_QUERY:
            # A static run: skip a batch id already done; otherwise start where ``restore`` says.
            if (
                latest is not None
                and props.get(QUERY_PROPERTY) == query
                and batch_id <= props[BATCH_PROPERTY]
            ):
                return True, latest
            if self.restore is None:
                return False, None
            return False, latest if self.restore == "latest" else _load(self.storage, self.restore)
        if latest is not None and props.get(QUERY_PROPERTY) == query:
            last = int(props[BATCH_PROPERTY])
            if batch_id <= last:
                return True, latest
            if batch_id != last + 1:
                raise CheckpointError(
                    f"statekit job {job!r}: its latest checkpoint {latest.location} holds the state after "
                    f"micro-batch {last} of this query, but Spark runs micro-batch {batch_id}: the "
                    f"checkpoints of batches {last + 1}..{batch_id - 1} are missing (deleted, or kept by a "
                    "jobmanager storage in the memory of a driver that is gone). Restart the query from a "
                    "Spark checkpoint location that matches the statekit checkpoints"
                )
            return False, latest
        if self.restore is None:
            if latest is not None:
                note = takeover_note(self.storage, job, latest.metadata.timestamp_ms)
                raise CheckpointError(
                    f"statekit job {job!r} already has state: {latest.location}, made by "
                    f"{_origin(props)}, not by this query ({query}). A new query (a new Spark checkpoint "
                    "location) must say where its state comes from: pass restore='latest' to start(), "
                    f"or use another job_id. {note}".rstrip()
                )
            if batch_id > 0:
                raise CheckpointError(
                    f"Spark has completed micro-batches 0..{batch_id - 1} of query {query}, but statekit job "
                    f"{job!r} has no checkpoint: its state is lost (the jobmanager storage keeps checkpoints "
                    "only in the memory of the driver that completed them; use "
                    "statekit.checkpoints.dir for state that outlives the driver). Pass restore='latest' "
                    "to go on from empty state"
                )
            return False, None
        if self.restore == "latest":
            return False, latest
        return False, _load(self.storage, self.restore)

    # --- one batch ------------------------------------------------------------------

    def process_batch(
        self, df: DataFrame, batch_id: int, query: str, *, end_of_input: bool = False
    ) -> BatchInfo:
        """Process one micro-batch exactly once, or skip it if it was done; see the module doc."""
        spec = self.spec
        clock = time.perf_counter
        started = clock()
        phases: dict[str, float] = {}
        batch_timestamp = time.time_ns() // 1_000_000
        self.fence.check()  # before anything is written or aborted: the files may be a newer run's
        latest = self.latest()
        skip, source = self._source(latest, batch_id, query)
        if not skip and self.fence.epoch is None:
            self._claim()
            # Read again: a run this claim fenced off may have completed one more checkpoint meanwhile.
            latest = self.latest()
            skip, source = self._source(latest, batch_id, query)
        if skip:
            assert latest is not None
            info = BatchInfo(
                batch_id,
                latest.checkpoint_id,
                latest.location,
                True,
                None,
                self.parallelism,
                watermark=_watermark_of(latest),
            )
            self._notify(info)
            return info
        if source is not None:
            self._validate(source)
            self._check_files(source)
        n = max(latest.checkpoint_id if latest else 0, source.checkpoint_id if source else 0, self._floor) + 1
        self._floor = n
        # Files of an attempt at checkpoint n that never completed (a driver that died mid-batch).
        with contextlib.suppress(CheckpointError):
            self.storage.begin_checkpoint(spec.job_id, n).abort()
        token = uuid.uuid4().hex
        watermark = _watermark_of(source)
        late_schema = df.schema if spec.event_time is not None and spec.late_sink is not None else None
        data = self.storage.read_metadata(source.location) if source else b""
        metadata = self._ship_metadata(data, source)
        plan = TaskPlan(
            job_id=spec.job_id,
            operator_id=spec.operator_id,
            run_id=self.run_id,
            checkpoint_id=n,
            token=token,
            restore_location=source.location if source else None,
            restore_token=source.metadata.properties.get(TOKEN_PROPERTY) if source else None,
            restore_attempts=_attempts(source),
            parallelism=self.parallelism,
            max_parallelism=self.max_parallelism,
            config=self.config,
            function_factory=spec.function_factory,
            key_column=spec.key_column,
            key_serializer=spec.key_serializer,
            input_columns=tuple(df.columns),
            output_schema=spec.output_schema,
            timezone=self.timezone,
            spark_local_dir=self.local_dir,
            event_time=spec.event_time,
            watermark=watermark,
            batch_timestamp_ms=batch_timestamp,
            end_of_input=end_of_input,
            late_schema=late_schema,
            vectorized=self.vectorized,
            restore_claimed=self._claims(source, latest),
            batch_id=batch_id,
            query_id=query,
        )
        routed = self.router.route(df)
        if self.locality is not None:
            routed = self.locality.prefer(routed, self.parallelism)
        processed = routed.mapInArrow(
            make_task(plan, metadata), internal_schema(spec.output_schema, late_schema)
        )
        if query != STATIC_QUERY:
            _as_stateful_query(df.sparkSession)
            processed = _persist_uncompressed(processed, df.sparkSession)
        else:
            processed = processed.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            # One pass computes (and caches) every partition; the sink then reads the cache.
            t = clock()
            phases["prepare"] = t - started
            try:
                rows = processed.where(F.col(HANDLE_COLUMN).isNotNull()).select(HANDLE_COLUMN).collect()
            except Exception as e:
                damage = _task_damage(e, source)
                if damage is None:
                    raise
                raise damage from e
            phases["tasks"] = clock() - t
            locations = self.locality.ran() if self.locality is not None else {}
            reports = self._reports([r[0] for r in rows])
            t = clock()
            outputs = processed.where(F.col(HANDLE_COLUMN).isNull())
            if late_schema is not None:
                assert spec.late_sink is not None
                late = outputs.where(F.col(LATE_COLUMN).isNotNull()).select(
                    *(F.col(LATE_PREFIX + c).alias(c) for c in late_schema.names)
                )
                spec.late_sink(late, batch_id)
                outputs = outputs.where(F.col(LATE_COLUMN).isNull())
            if spec.sink is not None:
                spec.sink(outputs.select(*spec.output_schema.names), batch_id)
            phases["sink"] = clock() - t
            t = clock()
            new_watermark = self._next_watermark(watermark, reports, source.location if source else None)
            properties: dict[str, Any] = {
                QUERY_PROPERTY: query,
                BATCH_PROPERTY: batch_id,
                TOKEN_PROPERTY: token,
                ATTEMPTS_PROPERTY: {str(r["subtask"]): r["attempt"] for r in reports},
            }
            if new_watermark != MIN_WATERMARK:
                properties[WATERMARK_PROPERTY] = new_watermark
            self.fence.check()  # last, right before _metadata: what makes the checkpoint exist
            location = complete_checkpoint(
                self.storage.begin_checkpoint(spec.job_id, n),
                job_id=spec.job_id,
                checkpoint_id=n,
                max_parallelism=self.max_parallelism,
                subtasks=[SubtaskState.from_json(r["state"]) for r in reports],
                properties=properties,
            )
            phases["checkpoint"] = clock() - t
        finally:
            processed.unpersist()
            if not isinstance(metadata, (InlineMetadata, StoredMetadata)):
                with contextlib.suppress(Exception):
                    metadata.destroy()
        self.registry.hook.statekit_checkpoint_completed(
            job_id=spec.job_id, checkpoint_id=n, location=location
        )
        t = clock()
        apply_retention(self.storage, spec.job_id, self.retained)
        phases["retention"] = clock() - t
        for r in reports:
            for name, secs in (r.get("phases") or {}).items():
                phases[f"task_{name}"] = phases.get(f"task_{name}", 0.0) + float(secs)
        reused = sum(1 for r in reports if r["reused"])
        how = [r.get("how") for r in reports]
        info = BatchInfo(
            batch_id,
            n,
            location,
            False,
            source.location if source else None,
            self.parallelism,
            records=sum(int(r["records"]) for r in reports),
            outputs=sum(int(r["outputs"]) for r in reports),
            reused_subtasks=reused,
            restored_subtasks=len(reports) - reused,
            restored_locally=how.count("local"),
            restored_remotely=how.count("remote"),
            bytes_downloaded=sum(int(r.get("downloaded", 0)) for r in reports),
            local_recovery=_local_recovery_status(reports),
            local_copies_rejected=sum(int(r.get("copies_rejected", 0)) for r in reports),
            local_copy_rejections=tuple(str(m) for r in reports for m in r.get("copy_rejections") or ()),
            handed_off=sum(1 for r in reports if r.get("handed_from") is not None),
            handoff=batch_status(self.handoff_enabled, [r.get("handoff") for r in reports]),
            executor_pids=tuple(sorted({int(r["pid"]) for r in reports})),
            subtask_locations=dict(sorted(locations.items())),
            locality=self.locality_status,
            late_records=sum(int(r.get("late", 0)) for r in reports),
            bad_records=sum(int(r.get("bad", 0)) for r in reports),
            timers_fired=sum(int(r.get("fired", 0)) for r in reports),
            watermark=new_watermark,
            phases=phases,
        )
        et = spec.event_time
        if info.late_records and spec.late_sink is None and et is not None and et.late != "process":
            warnings.warn(
                f"statekit job {spec.job_id!r}, micro-batch {batch_id}: {info.late_records} late rows "
                "(event time at or below the watermark) were counted and not processed; add "
                "foreach_late_batch() to receive them, or EventTime(late='process')",
                RuntimeWarning,
                stacklevel=2,
            )
        self._notify(info)
        return info

    def _ship_metadata(self, data: bytes, source: CompletedCheckpoint | None) -> Any:
        """How the tasks get the restore checkpoint's metadata: inside the task, a broadcast, or the storage.

        Small metadata travels inside the task; a broadcast costs the driver a
        few ms per batch. A Connect session has no broadcast: the tasks read
        larger metadata from the checkpoint storage themselves (they reach it:
        they write there), except from the ``jobmanager`` storage, which lives
        in the coordinating process only and so always travels inside.
        """
        if len(data) <= _INLINE_METADATA:
            return InlineMetadata(data)
        if not self.connect:
            return self.session.sparkContext.broadcast(data)
        if source is None or self.config.storage_name == "jobmanager":
            return InlineMetadata(data)
        return StoredMetadata(source.location, hashlib.sha256(data).hexdigest())

    def _next_watermark(self, current: int, reports: list[dict[str, Any]], source: str | None) -> int:
        """The watermark the next batch runs with: the largest event time seen minus the delay.

        Also after an end of input: its tasks fired every timer as at the end
        of time, but the end of time lasts for that firing only (as on the
        LocalRunner), so a later batch over more rows goes on from the
        watermark the rows made. A ``current`` watermark at the end of time
        comes from a checkpoint (``source``) an older statekit wrote at an end
        of input; its rows are all late, which is said here.
        """
        if current == MAX_WATERMARK:
            late = sum(int(r.get("late", 0)) for r in reports)
            if late:
                warnings.warn(
                    _end_of_time_message(f"statekit job {self.spec.job_id!r}", source, f"all {late} rows"),
                    RuntimeWarning,
                    stacklevel=3,
                )
            return current
        et = self.spec.event_time
        if et is None:
            return current
        seen = [int(r["max_event_time"]) for r in reports if r.get("max_event_time") is not None]
        return et.watermark(current, max(seen) if seen else None)

    def _reports(self, descriptions: list[str]) -> list[dict[str, Any]]:
        reports = sorted((json.loads(d) for d in descriptions), key=lambda r: int(r["subtask"]))
        seen = [int(r["subtask"]) for r in reports]
        if seen != list(range(self.parallelism)):
            raise CheckpointError(
                f"expected one snapshot from each of subtasks 0..{self.parallelism - 1}, got subtasks "
                f"{seen}; the micro-batch was not routed as planned and is not committed"
            )
        return reports

    def _notify(self, info: BatchInfo) -> None:
        if self.spec.on_batch is not None:
            self.spec.on_batch(info)


def _locality(session: SparkSession, mode: str) -> tuple[JvmLocality | None, str]:
    """The query's task locality (None when off) and what ``BatchInfo.locality`` says of it.

    Raises:
        ConfigurationError: If ``mode`` is ``on`` and locality cannot be had.
    """
    if mode == "off":
        return None, "off: statekit.spark.locality=off"
    if is_connect(session):
        if mode == "on":
            raise ConfigurationError(
                "statekit.spark.locality=on: a Spark Connect client cannot give tasks a preferred "
                "executor (no JVM gateway); use a classic SparkSession, or set it to auto or off"
            )
        return None, "off: Spark Connect has no JVM gateway to give tasks a preferred executor"
    try:
        return JvmLocality(session), "on"
    except LocalityUnavailable as e:
        if mode == "on":
            raise
        reason = str(e)
        # Python's default warning filter shows it once per process, not once per query run.
        warnings.warn(
            f"{reason}. Running without task locality: subtasks restore their state whenever Spark "
            "moves their task (BatchInfo.locality and restored_subtasks show it)",
            RuntimeWarning,
            stacklevel=3,
        )
        return None, f"off: {reason}"


def _as_stateful_query(session: SparkSession) -> None:
    """Adaptive query execution off in a streaming query's session, as Spark does for stateful queries.

    Spark runs the batches of its own stateful queries (``foreachBatch``
    included) without AQE; statekit's queries are stateful too. With AQE every
    stage of the routed plan (scan and routing, the cached tasks) and of the
    sink runs as a Spark job of its own, which costs a local Spark tens of
    milliseconds each per micro-batch, and the plan has nothing for AQE to
    adapt (its partitions are the subtasks). The session is the query's own (a
    clone made when the query started), so nothing outside the query changes.
    A static ``run()`` shares the user's session and leaves it alone.
    """
    key = "spark.sql.adaptive.enabled"
    if session.conf.get(key, "true") != "false":
        session.conf.set(key, "false")


def _persist_uncompressed(processed: DataFrame, session: SparkSession) -> DataFrame:
    """``processed`` cached without compressing its columns, in a streaming query's own session.

    The cache lives for one micro-batch (the sink reads it, then it is
    dropped): compressing it costs CPU the batch waits for and saves memory
    for a moment. The cache takes the setting when it is made, so it is set
    for the ``persist`` alone and restored (a sink's own caches are compressed
    as configured).
    """
    key = "spark.sql.inMemoryColumnarStorage.compressed"
    before = session.conf.get(key, None)
    session.conf.set(key, "false")
    try:
        return processed.persist(StorageLevel.MEMORY_AND_DISK)
    finally:
        if before is None:
            session.conf.unset(key)
        else:
            session.conf.set(key, before)


_SPARK_WAYS_OUT = (
    ". A Spark query never falls back to an older checkpoint: Spark's offset log must match the "
    "checkpoint it continues from. Ways out: restore a savepoint, or an older checkpoint "
    "(`statekit checkpoints list` shows them with their status), into a new query (a new "
    "checkpoint_location, start(restore='<location>')); see docs/operations.md#restore-rules"
)


def _load(storage: CheckpointStorage, location: str) -> CompletedCheckpoint:
    """:func:`load_checkpoint`, a damaged checkpoint's error carrying Spark's ways out."""
    try:
        return load_checkpoint(storage, location)
    except CorruptCheckpointError as e:
        raise CorruptCheckpointError(e.location, e.problem + _SPARK_WAYS_OUT) from e


def _task_damage(e: Exception, source: CompletedCheckpoint | None) -> CorruptCheckpointError | None:
    """The damage a task found restoring ``source`` (its error travels as text through Py4J), if any."""
    if source is None:
        return None
    marker = f"CorruptCheckpointError: checkpoint {source.location}: "
    text = str(e)
    start = text.find(marker)
    if start < 0:
        return None
    problem = text[start + len(marker) :].splitlines()[0].strip()
    return CorruptCheckpointError(source.location, problem + _SPARK_WAYS_OUT)


def _local_recovery_status(reports: list[dict[str, Any]]) -> str:
    """``BatchInfo.local_recovery``: on, off, or off with every distinct reason the tasks gave."""
    statuses = [str(r.get("local_recovery", "off")) for r in reports]
    reasons = sorted({s.removeprefix("off: ") for s in statuses if s.startswith("off: ")})
    if reasons:
        return "off: " + "; ".join(reasons)
    return "on" if statuses and all(s == "on" for s in statuses) else "off"


def _attempts(source: CompletedCheckpoint | None) -> dict[int, str]:
    """Which task attempt wrote each subtask's snapshot in ``source`` (none if not made here)."""
    if source is None:
        return {}
    attempts = source.metadata.properties.get(ATTEMPTS_PROPERTY) or {}
    return {int(i): str(a) for i, a in attempts.items()}


def _watermark_of(cp: CompletedCheckpoint | None) -> int:
    if cp is None:
        return MIN_WATERMARK
    return int(cp.metadata.properties.get(WATERMARK_PROPERTY, MIN_WATERMARK))


def _origin(props: dict[str, Any]) -> str:
    query = props.get(QUERY_PROPERTY)
    if query is None:
        return "another runner"
    if query == STATIC_QUERY:
        return f"a static run (batch {props.get(BATCH_PROPERTY)})"
    return f"Spark query {query} (micro-batch {props.get(BATCH_PROPERTY)})"


def resolve_dead_letters(conf: Configuration, *, connect: bool, check: bool = True) -> Configuration:
    """``conf`` with its local paths absolute, as the driver sees them, and the dead-letter directory checked.

    Executors write the dead letters and the checkpoint files; a relative path
    would land in each executor's working directory, so it is taken from the
    driver's working directory when the query starts. From a Spark Connect
    client the driver is the server, whose working directory the client does
    not know: a relative dead-letter path is refused there (a relative
    checkpoints directory stays the server's, as before). With ``check``, the
    dead-letter directory is made (mode 0700) or checked private here, before
    any task runs.

    Raises:
        ConfigurationError: If ``dead-letter`` has no path, or the path is relative under Spark Connect.
        UnsafeLocalPathError: If the directory is a symlink, someone else's, or group- or other-writable.
    """
    if not connect:
        local = {}
        for key in ("statekit.checkpoints.dir", "statekit.savepoints.dir"):
            value = conf.get(key)
            if value and "://" not in str(value) and not os.path.isabs(str(value)):
                local[key] = os.path.abspath(str(value))
        if local:
            conf = conf.with_options(local)
    if conf.get("statekit.bad-records.policy") != "dead-letter":
        return conf
    path = conf.get("statekit.bad-records.dead-letter-path")
    if path is None:
        raise ConfigurationError(
            "statekit.bad-records.policy=dead-letter needs somewhere to put them on Spark: set "
            "spark.statekit.bad-records.dead-letter-path to a directory every executor reaches"
        )
    text = str(path)
    if not os.path.isabs(text) and "://" not in text:
        if connect:
            raise ConfigurationError(
                f"spark.statekit.bad-records.dead-letter-path {text!r} is relative: from a Spark Connect "
                "client it would be taken from the server's working directory, which this client does not "
                "know. Give an absolute path the server's executors reach"
            )
        text = os.path.abspath(text)
    if check:
        DeadLetterDir(text)  # a URL, a file, a symlink or someone else's directory fail here
    return conf.with_options({"statekit.bad-records.dead-letter-path": text})


def check_columns(df: DataFrame, key_column: str) -> None:
    """Raise a clear error if the key column is missing or a reserved column name is taken."""
    from ._routing import RESERVED_COLUMNS

    if key_column not in df.columns:
        raise ConfigurationError(f"key column {key_column!r} is not a column of the DataFrame: {df.columns}")
    taken = [c for c in df.columns if c in RESERVED_COLUMNS or c.startswith("__statekit_")]
    if taken:
        raise ConfigurationError(f"column names {taken} are reserved by statekit.spark; rename them")


def check_key_type(serializer: TypeSerializer, data_type: T.DataType, key_column: str) -> None:
    """Refuse, before anything runs, a ``str`` or ``int`` key type over a column of another type."""
    from ..serialization._serializers import IntSerializer, StrSerializer
    from ._routing import supports_sql_routing

    if type(serializer) in (StrSerializer, IntSerializer) and not supports_sql_routing(serializer, data_type):
        kind = "str" if type(serializer) is StrSerializer else "int"
        raise ConfigurationError(
            f"key column {key_column!r} is {data_type.simpleString()}, not a {kind} column: pass the "
            "key_type that matches its values (str for string columns, int for integer columns, "
            "bytes for binary ones)"
        )
