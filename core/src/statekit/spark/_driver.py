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
import hashlib
import json
import time
import uuid
import warnings
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .._contracts import CheckpointStorage
from .._errors import CheckpointError, ConfigurationError, CorruptCheckpointError
from ..checkpoints._fencing import RunFence, takeover_note
from ..checkpoints._metadata import SubtaskState
from ..checkpoints._restore import CompletedCheckpoint, load_checkpoint
from ..checkpoints._retention import apply_retention, highest_checkpoint_id
from ..checkpoints._verify import verify_loaded
from ..checkpoints._writing import complete_checkpoint
from ..plugins._registry import default_registry
from ..runtime._configured import state_backend_from_config
from ..runtime._function import KeyedBatchFunction, KeyedProcessFunction
from ..runtime._time import end_of_time_message
from ..serialization._keygroups import compute_default_max_parallelism, validate_parallelism
from ..timers import MAX_WATERMARK, MIN_WATERMARK, WATERMARK_PROPERTY
from ._batchinfo import BatchInfo, local_recovery_status
from ._handoff import batch_status
from ._jobspec import JobSpec, driver_storage, resolve_dead_letters
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
    "MicroBatchDriver",
]

#: Checkpoint metadata properties written by the Spark runner.
QUERY_PROPERTY = "spark_query_id"
BATCH_PROPERTY = "spark_batch_id"
TOKEN_PROPERTY = "spark_state_token"
ATTEMPTS_PROPERTY = "spark_subtask_attempts"
#: The query id recorded by :meth:`ProcessedStream.run` (static DataFrames).
STATIC_QUERY = "static"

#: Checkpoint metadata up to this size is shipped inside the tasks, larger as a broadcast.
_INLINE_METADATA = 256 * 1024


def _parallelism_of(cp: CompletedCheckpoint, operator_id: str) -> int | None:
    subtasks = cp.metadata.operators.get(operator_id)
    return len(subtasks) if subtasks else None


class MicroBatchDriver:
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
            local_recovery=local_recovery_status(reports),
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
                    end_of_time_message(f"statekit job {self.spec.job_id!r}", source, f"all {late} rows"),
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
