"""The driver side: one statekit checkpoint per Spark micro-batch, completed after the sink.

For micro-batch ``b`` of query ``q`` the driver reads the latest completed
checkpoint ``C`` of the job; its properties record the query and batch that
made it. Then:

- ``C`` is from ``q`` and ``b <= C.batch``: the batch was done (the driver died
  after completing the checkpoint, before Spark committed the batch). Skip it:
  its outputs were written before ``C`` was completed.
- ``C`` is from ``q`` and ``b == C.batch + 1``: process ``b`` from ``C``.
- anything else is an error, unless ``restore`` says where a new query starts.

An explicit ``restore=<location>`` is never ignored: :func:`._upgrade.decide`
tells which batches it holds (skipped), where it starts (processed from it),
and when this query's own history is that restore's (going on from the
latest checkpoint); anything else is refused. Every checkpoint records the
query's checkpoint location (so that a savepoint of it can carry the source
position) and the explicit restore its history descends from.

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
import functools
import hashlib
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pyspark import StorageLevel
from pyspark.accumulators import Accumulator
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .._errors import CheckpointError, ConfigurationError, CorruptCheckpointError
from ..checkpoints._coordinator import (
    CheckpointCoordinator,
    CheckpointPolicy,
    PendingCheckpoint,
    start_point,
)
from ..checkpoints._fencing import RunFence, takeover_note
from ..checkpoints._metadata import metadata_at, naming_damage
from ..checkpoints._restore import CompletedCheckpoint
from ..checkpoints._restore_rules import RestoreRules
from ..checkpoints._source_position import (
    LOCATION_PROPERTY,
    ORIGIN_PROPERTY,
    SparkLocation,
    SparkPosition,
    position_of,
)
from ..plugins._config import Configuration
from ..plugins._registry import PluginRegistry, default_registry
from ..runtime._configured import state_backend_from_config
from ..runtime._declared import DeclaredStates, declared_states
from ..runtime._function import (
    KeyedBatchFunction,
    KeyedColumnsFunction,
    KeyedProcessFunction,
    declares_raw_restore,
)
from ..runtime._migration_log import DROPPED_PROPERTY, warn_of_dropped, warn_of_undeclared
from ..runtime._sources import SOURCE_OPERATOR
from ..runtime._time import end_of_time_message
from ..serialization._keygroups import compute_default_max_parallelism, validate_parallelism
from ..sources._locating import InputLostWarning
from ..timers import MAX_WATERMARK, MIN_WATERMARK, WATERMARK_PROPERTY
from ._batchinfo import BatchInfo, batch_info
from ._input_lost import input_lost
from ._jobspec import JobSpec, driver_storage, resolve_dead_letters
from ._jvm import JvmLocality, LocalityUnavailable
from ._letter_tally import count_source_letters
from ._metrics import QueryMetrics
from ._plan import (
    HANDLE_COLUMN,
    LATE_COLUMN,
    LATE_PREFIX,
    PLAN_PROPERTY,
    InlineMetadata,
    StoredMetadata,
    TaskPlan,
    batch_property,
    internal_schema,
)
from ._recent import record_batch
from ._report import TaskReport
from ._report_channel import Reports, ReportsParam
from ._routing import Router, jvm_seq, quote, routing_values
from ._savepoint_request import SparkSavepointRequests
from ._sparkconf import application, default_parallelism, is_connect, local_dir, spark_configuration
from ._task import make_task
from ._upgrade import (
    Decision,
    absolute_location,
    check_latest_taken_over,
    decide,
    no_position_error,
    restore_origin,
)
from ._warmup import settle, start_warm_up

__all__ = [
    "ATTEMPTS_PROPERTY",
    "BATCH_PROPERTY",
    "QUERY_PROPERTY",
    "SPARK_WAYS_OUT",
    "STATIC_QUERY",
    "TOKEN_PROPERTY",
    "MicroBatchDriver",
    "aqe_off_for_the_query",
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
#: How long an ended query's run waits for a micro-batch or idle savepoint in progress before it
#: records its end (it then records none).
QUIESCE_SECONDS = 60.0


def _parallelism_of(cp: CompletedCheckpoint, operator_id: str) -> int | None:
    subtasks = cp.metadata.operators.get(operator_id)
    return len(subtasks) if subtasks else None


@dataclass
class _Batch:
    """One micro-batch being processed: what it starts from, its checkpoint, where its time goes."""

    df: DataFrame
    batch_id: int
    query: str
    end_of_input: bool
    latest: CompletedCheckpoint | None
    source: CompletedCheckpoint | None
    pending: PendingCheckpoint
    started: float
    timestamp_ms: int = field(default_factory=lambda: time.time_ns() // 1_000_000)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    task_runs: int = 1  # how often the busiest subtask's task ran (BatchInfo.task_runs)
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def watermark(self) -> int:
        """The watermark the batch runs with: the one its source checkpoint recorded."""
        return _watermark_of(self.source)


class MicroBatchDriver:
    """Runs the micro-batches of one query run (one ``start`` or ``run``) on the driver.

    What a batch is (skipped, continued, started) is decided here, from the
    job's newest checkpoint and the batch protocol of the module doc; the
    checkpoint itself (ids, fencing, completion, retention, which checkpoint
    to start from and its files' check) is the
    :class:`~statekit.checkpoints._coordinator.CheckpointCoordinator`'s, as
    on the LocalRunner, with Spark's policy: no fallback past a damaged
    checkpoint, no failed checkpoint tolerated (a batch is committed with its
    checkpoint or not at all), the tasks write the subtasks' files.

    Why it is over 400 lines: one micro-batch's life is read top to bottom here,
    each step (decide, plan, run the tasks, sink, complete) a method of a few
    lines with its reasons in its docstring (about 335 lines of code; the
    checkpoint itself, the plan, the metrics, savepoint requests and ``BatchInfo``
    are modules of their own).
    """

    def __init__(
        self,
        spec: JobSpec,
        session: SparkSession,
        *,
        restore: str | None,
        checkpoint_location: str | None = None,
        input_begins_after_savepoint: bool = False,
    ) -> None:
        """Reads and validates the configuration, picks parallelism and max parallelism.

        ``checkpoint_location`` is the query's (None for a static ``run()``);
        ``input_begins_after_savepoint``: the user's statement that the query's
        input begins after ``restore`` (see :mod:`._upgrade`).

        Raises:
            ConfigurationError, UnknownPluginError, PluginError: On a bad configuration.
            CheckpointError: If the checkpoint to start from cannot be restored here.
        """
        self.spec = spec
        self.session = session
        self.registry = default_registry()
        self.config = conf = _configuration(spec, session, self.registry)
        # The workers start while the rest of this runs; the query's end waits for it (settle).
        self.warm_up = start_warm_up(session, conf, spec.job_id)
        function = _made_function(spec)
        self.vectorized = isinstance(function, KeyedBatchFunction)
        self.columns = isinstance(function, KeyedColumnsFunction)
        self.storage = driver_storage(conf, self.registry)
        self.restore = restore
        self.spark_location = absolute_location(checkpoint_location) if checkpoint_location else None
        self.input_begins_after_savepoint = input_begins_after_savepoint
        self._position: SparkPosition | str | None = None  # the restore's source position, read once
        self._origin: dict[str, Any] | None = None  # the explicit restore this run's history descends from
        self.run_id = uuid.uuid4().hex
        self.connect = is_connect(session)
        # Where the tasks' reports come by accumulator, so a batch is one job (none on Connect).
        self._report_channel: Accumulator[Reports] | None = (
            None if self.connect else session.sparkContext.accumulator([], ReportsParam())
        )
        # The checkpoint this run completed last (its location, then its metadata once read): the
        # job's newest while this run holds the fence, so no batch lists the storage to find it.
        self._completed: str | None = None
        self._completed_read: tuple[CompletedCheckpoint, bytes] | None = None
        # What the run starts from, chosen as the LocalRunner chooses (one path, never falling back):
        # its parallelism and max parallelism come from it; every batch then decides afresh (_decide).
        start = start_point(
            self.storage, spec.job_id, restore or "latest", fallback=False, ways_out=SPARK_WAYS_OUT
        )
        base = start.checkpoint
        self.restored: CompletedCheckpoint | None = base if start.explicit else None  # loaded once
        p = conf.get("statekit.parallelism")
        if p is None and base is not None:
            p = _parallelism_of(base, spec.operator_id)
        self.parallelism = int(p or default_parallelism(session))
        maxp = conf.get("statekit.max-parallelism")
        if maxp is None and base is not None:
            maxp = base.metadata.max_parallelism  # as Flink: unset, it comes from the restored state
        self.max_parallelism = int(maxp or compute_default_max_parallelism(self.parallelism))
        validate_parallelism(self.parallelism, self.max_parallelism)
        self.declared = DeclaredStates(  # issue 42: incompatible states fail at start, on the driver
            spec.operator_id, declared_states(function, job_id=spec.job_id, parallelism=self.parallelism,
                                              max_parallelism=self.max_parallelism)
        )  # fmt: skip
        self.rules = RestoreRules(
            spec.operator_id,
            self.parallelism,
            type(function).__name__,
            declares_raw_restore(function),
            spec.allow_non_restored_state,
            self.declared,
        )
        # The run is claimed at the first batch this query processes: a query refused before (its
        # state is not its own) must not fence off the run that owns the job.
        self.coordinator = CheckpointCoordinator(
            self.storage,
            spec.job_id,
            max_parallelism=self.max_parallelism,
            retained=int(conf.get("statekit.checkpoints.retained")),
            native=conf.get("statekit.checkpoint.format") != "canonical",
            history_entries=int(conf.get("statekit.checkpoints.history.max-entries")),
            policy=CheckpointPolicy(application(session), SPARK_WAYS_OUT),
            registry=self.registry,
        )
        if base is not None:
            self._validate(base)
            # Its files, at start as the LocalRunner's restore finds them (once: start_point found
            # those of the latest checkpoint already).
            self.coordinator.check(base, found=start.files_found)
        self.metrics = QueryMetrics(session, conf, spec.job_id, spec.operator_id)
        self.in_plan = False  # the routing and the tasks are in the streaming query's plan (streamed)
        self._output_columns: tuple[Any, Any] | None = None  # JVM columns of _outputs, made once
        self.input_columns = tuple(spec.df.columns)
        self.late_schema = self._late_schema(spec.df)
        self.timezone = session.conf.get("spark.sql.session.timeZone")
        self.local_dir = local_dir(session)
        self.locality, self.locality_status = _locality(session, str(conf.get("statekit.spark.locality")))
        self.handoff_enabled = bool(conf.get("statekit.spark.worker-handoff"))
        self.savepoints = SparkSavepointRequests(
            self.coordinator, conf.get("statekit.savepoints.dir"), self._stop
        )
        self._query_plan = self._make_query_plan()
        self._end_lock = threading.Lock()
        self._ended = False  # query_ended ran

    def _router(self, *, markers: bool) -> Router:
        """The routing of this run's input: with marker rows for per-batch routing, without in the plan.

        In the plan the tasks add the subtask and marker columns from their partition id.
        """
        spec = self.spec
        return Router(
            self.session, spec.df.schema, key_column=spec.key_column, serializer=spec.key_serializer,
            parallelism=self.parallelism, max_parallelism=self.max_parallelism,
            route_values=routing_values(self.parallelism), markers=markers, partition_columns=markers,
        )  # fmt: skip

    @functools.cached_property
    def router(self) -> Router:
        """The per-batch routing (made on the first batch that needs it: not in the query's plan)."""
        return self._router(markers=True)

    def streamed(self, df: DataFrame) -> DataFrame:
        """The streaming DataFrame a query writes: its micro-batches routed and processed in its own plan.

        Spark analyses a query's plan once, at its start, and each micro-batch
        then only replaces its sources' data; routing and running the tasks as
        DataFrame operations of each batch instead cost the driver an analysis
        per operation and batch (tens of ms, a fifth of a small batch's time).
        So on a classic session whose tasks need no preferred executor (a local
        master, or ``statekit.spark.locality=off``) the routing and the tasks
        are in the query's plan, with no marker rows: partition ``i`` of the
        routed plan is subtask ``i``, which its task serves even when no row
        came, and each batch's part of the task plan travels in a Spark local
        property (:data:`~._plan.PLAN_PROPERTY`) of the batch's jobs. The
        driver still checks that each subtask reported exactly once. Otherwise
        (Spark Connect, a cluster with locality) ``df`` is returned as it is
        and each batch is routed by :meth:`_run_tasks`.
        """
        single = self.locality is None or self.locality.single_executor
        if self.connect or not single:
            return df
        router = self._router(markers=False)
        self.in_plan = True
        self._query_plan = dataclasses.replace(self._query_plan, partition_subtask=True)
        function = make_task(self._query_plan, None, self._report_channel)
        schema = internal_schema(self.spec.output_schema, self.late_schema)
        return router.route(df).mapInArrow(function, schema)

    @property
    def fence(self) -> RunFence:
        """This query run's fence."""
        return self.coordinator.fence

    def _validate(self, cp: CompletedCheckpoint) -> None:
        """The coordinator's checks of ``cp`` (before any task restores it), and a LocalRunner's position."""
        rules = self.rules
        if SOURCE_OPERATOR in cp.metadata.operators and cp is self.restored and self.spark_location:
            # A LocalRunner's savepoint: its source's position is of no use to a Spark source. (A
            # static run's input is the DataFrame it is given: allow_non_restored_state drops it.)
            if not self.input_begins_after_savepoint:
                raise no_position_error(self.spec.job_id, cp, str(self.position()))
            # The user said the input begins after it: dropped.
            rules = dataclasses.replace(rules, other_operators={SOURCE_OPERATOR: 1})
        self.coordinator.validate(cp, rules)

    def query_ended(self) -> None:
        """The streaming query has ended: wait for the warm-up, then record the run's end (once).

        Best effort, as :meth:`RunFence.end`: a run whose micro-batch or idle
        savepoint is still in progress after a minute, or whose store fails,
        records no end (a later run then assumes it may still be writing). See
        :mod:`._query`.
        """
        with self._end_lock:  # a second caller returns once the first is done (its warm-up too)
            if self._ended:
                return
            settle(self.warm_up, self.spec.job_id)
            if self.savepoints.quiesce(timeout=QUIESCE_SECONDS):
                self.coordinator.end()
            self._ended = True

    def latest(self) -> CompletedCheckpoint | None:
        """The job's latest completed checkpoint, if any.

        A damaged one fails the query (Spark's offset log must match the checkpoint a
        query continues from: an older one is not exactly once), with the ways out.
        A query told to restore a given location ignores a damaged newest checkpoint
        and numbers its own above it.

        Raises:
            CorruptCheckpointError: If the latest checkpoint's metadata is damaged.
        """
        if self._completed is not None and self.fence.epoch is not None:
            return self._newest(self._own_newest)
        return self._newest(self.coordinator.newest)

    def _own_newest(self) -> CompletedCheckpoint:
        """The checkpoint this run completed last, which is the job's newest: read once, not listed.

        This run holds the job's fence (checked at the start of every batch, before
        this): a newer run must claim the fence before it completes a checkpoint,
        and an older run it displaced numbers its checkpoints below this run's
        (see ``CheckpointCoordinator.claim``). So no other checkpoint can be newer;
        its files are still checked before a batch starts from it (``check``).
        """
        location = self._completed
        assert location is not None
        if self._completed_read is None or self._completed_read[0].location != location:
            with naming_damage(location):
                data = self.storage.read_metadata(location)
            try:
                cp = CompletedCheckpoint(self.storage, location, metadata_at(location, data))
            except CorruptCheckpointError as e:
                raise CorruptCheckpointError(e.location, e.problem + SPARK_WAYS_OUT) from e
            self._completed_read = (cp, data)
        return self._completed_read[0]

    def _metadata_of(self, source: CompletedCheckpoint | None) -> bytes:
        """``source``'s ``_metadata`` bytes for the tasks (read once if this run completed it)."""
        if source is None:
            return b""
        read = self._completed_read
        if read is not None and read[0].location == source.location:
            return read[1]
        return self.storage.read_metadata(source.location)

    def _newest(self, newest: Callable[[], CompletedCheckpoint | None]) -> CompletedCheckpoint | None:
        try:
            return newest()
        except CorruptCheckpointError:
            if self.restore not in (None, "latest"):
                return None
            raise

    # --- deciding what a batch is ------------------------------------------------------

    def _decide(
        self, batch_id: int, query: str
    ) -> tuple[CompletedCheckpoint | None, bool, CompletedCheckpoint | None]:
        """``(latest, skip, source)``: the newest checkpoint, whether the batch is done, where it starts.

        A batch to process claims the job first (once): an older driver still
        running it is fenced off now, and the ids of this run's checkpoints go
        above every one completed so far, the fenced run's included.
        """
        latest = self.latest()
        skip, source = self._source(latest, batch_id, query)
        if not skip and self.fence.epoch is None:
            self.coordinator.claim()
            # Read again: a run this claim fenced off may have completed one more checkpoint meanwhile.
            latest = self.latest()
            skip, source = self._source(latest, batch_id, query)
        return latest, skip, source

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
            return False, latest if self.restore == "latest" else self.restored
        if self.restored is not None:
            decision = self._restore_decision(latest, batch_id, query)
            if decision == "skip":
                return True, self.restored
            if decision == "restore":
                self._origin = restore_origin(self.restored)
                return False, self.restored
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
            if self.restored is not None:
                self._origin = restore_origin(self.restored)
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
        if latest is not None and self.spark_location is not None:
            # restore="latest" takes another query's checkpoint only right after its source position.
            check_latest_taken_over(
                latest, self.storage, job_id=job, location=self.spark_location, query=query, batch=batch_id,
                connect=self.connect,
            )  # fmt: skip
        return False, latest  # restore="latest"

    def position(self) -> SparkPosition | str:
        """The explicit restore's Spark source position, or why it has none (read once)."""
        assert self.restored is not None
        if self._position is None:
            cp = self.restored
            self._position = position_of(self.storage, cp.location, cp.metadata.properties)
        return self._position

    def _restore_decision(self, latest: CompletedCheckpoint | None, batch_id: int, query: str) -> Decision:
        assert self.restored is not None
        return decide(
            self.restored, latest, job_id=self.spec.job_id, query=query, batch=batch_id,
            location=SparkLocation(self.spark_location) if self.spark_location else None,
            position=self.position(),
            input_begins_after=self.input_begins_after_savepoint,
        )  # fmt: skip

    # --- one batch ------------------------------------------------------------------

    def process_batch(
        self, df: DataFrame, batch_id: int, query: str, *, end_of_input: bool = False
    ) -> BatchInfo:
        """Process one micro-batch exactly once, or skip it if it was done; see the module doc."""
        started = time.perf_counter()
        self.savepoints.check_not_stopping(batch_id)  # stopped with a savepoint: nothing after it
        self.fence.check()  # before anything is written or aborted: the files may be a newer run's
        latest, skip, source = self._decide(batch_id, query)
        if skip:
            done = source if source is not None else latest
            assert done is not None
            skipped = BatchInfo(
                batch_id, done.checkpoint_id, done.location, True, None, self.parallelism,
                watermark=_watermark_of(done), restore_origin=_origin_location(done, self._origin),
                task_runs=0,
            )  # fmt: skip
            self.metrics.report(skipped, self.coordinator.history.attempts())
            self._notify(skipped, query)
            return skipped
        if source is not None:
            self._validate(source)
            self.coordinator.check(source)
        batch = _Batch(df, batch_id, query, end_of_input, latest, source, self.coordinator.begin(), started)
        reports: list[TaskReport] = []
        try:
            reports, locations = self._run_tasks(batch)
            location, watermark = self._complete(batch, reports)
        except BaseException as e:
            # Whether or not this batch's checkpoint completed before the failure, the next batch
            # finds the newest one in the storage (a completed one means the batch is done).
            self._completed = self._completed_read = None
            if self.coordinator.last_completed != batch.pending.checkpoint_id:
                self.coordinator.abort(batch.pending, [r.state for r in reports], e)
            self.metrics.failed(batch_id, e, self.coordinator.history.attempts())  # the UI's last failure
            raise
        t = time.perf_counter()
        self.coordinator.retain()
        batch.phases["retention"] = time.perf_counter() - t
        info = batch_info(
            batch.batch_id, batch.pending.checkpoint_id, location, source, self.parallelism, reports,
            locations=locations, locality=self.locality_status, handoff_enabled=self.handoff_enabled,
            watermark=watermark, phases=batch.phases, dropped_fields=self.declared.dropped(source),
            source_bad_records=count_source_letters(query, batch_id) if query != STATIC_QUERY else 0,
            timing=self.coordinator.last_timing,
        )  # fmt: skip
        info = dataclasses.replace(
            info, restore_origin=_origin_location(source, self._origin), task_runs=batch.task_runs
        )
        lost = input_lost(self.spark_location, batch_id) if query != STATIC_QUERY else ()
        if lost:
            info = dataclasses.replace(info, input_lost=lost)
            for message in lost:
                warnings.warn(
                    f"statekit job {self.spec.job_id!r}, micro-batch {batch_id}: input lost: {message}",
                    InputLostWarning,
                    stacklevel=2,
                )
        self._warn_of_late_rows(info)
        warn_of_dropped(f"job {self.spec.job_id!r} batch {batch_id}", info.restored_from, info.dropped_fields)
        warn_of_undeclared(
            f"job {self.spec.job_id!r} batch {batch_id}", info.restored_from, info.undeclared_states
        )
        self.metrics.report(info, self.coordinator.history.attempts())
        self._notify(info, query)
        if query != STATIC_QUERY:  # a running query's savepoint requests (statekit savepoint trigger)
            self.savepoints.after_batch(location, batch.pending.checkpoint_id, batch_id, query)
        return info

    def _stop(self, query_id: str) -> None:
        """Stop query ``query_id`` (stop-with-savepoint, from a thread of its own: see _savepoint_request)."""
        query = self.session.streams.get(query_id)
        if query is not None:
            query.stop()
        self.query_ended()  # stopped (or gone already)

    def _plan(self, batch: _Batch) -> TaskPlan:
        """What every task of ``batch`` is told: the query run's plan with the batch's fields."""
        source = batch.source
        return dataclasses.replace(
            self._query_plan,
            checkpoint_id=batch.pending.checkpoint_id,
            token=batch.token,
            restore_location=source.location if source else None,
            restore_token=source.metadata.properties.get(TOKEN_PROPERTY) if source else None,
            restore_attempts=_attempts(source),
            watermark=batch.watermark,
            batch_timestamp_ms=batch.timestamp_ms,
            end_of_input=batch.end_of_input,
            restore_claimed=self.coordinator.claims(source, batch.latest),
            batch_id=batch.batch_id,
            query_id=batch.query,
        )

    def _make_query_plan(self) -> TaskPlan:
        """What every task of this query run is told; the per-batch fields at their defaults."""
        spec = self.spec
        return TaskPlan(
            job_id=spec.job_id,
            operator_id=spec.operator_id,
            run_id=self.run_id,
            checkpoint_id=0,
            token="",
            restore_location=None,
            restore_token=None,
            restore_attempts={},
            parallelism=self.parallelism,
            max_parallelism=self.max_parallelism,
            config=self.config,
            function_factory=spec.function_factory,
            key_column=spec.key_column,
            key_serializer=spec.key_serializer,
            input_columns=self.input_columns,
            output_schema=spec.output_schema,
            timezone=self.timezone,
            spark_local_dir=self.local_dir,
            event_time=spec.event_time,
            late_schema=self.late_schema,
            vectorized=self.vectorized,
            columns=self.columns,
        )

    def _late_schema(self, df: DataFrame) -> T.StructType | None:
        """The input schema, when late rows go to a late-records sink."""
        spec = self.spec
        return df.schema if spec.event_time is not None and spec.late_sink is not None else None

    def _run_tasks(self, batch: _Batch) -> tuple[list[TaskReport], dict[int, str]]:
        """Run the batch's tasks and its sinks; the tasks' reports and where each subtask ran.

        On classic Spark with a sink, the sink's own first job runs the tasks,
        and the reports come by accumulator (:mod:`._report_channel`): one
        Spark job per batch, as for a stateless query. Otherwise (Spark Connect,
        no sink, or not one report per subtask by accumulator) a job reads the
        handle column. The outputs are cached only where statekit reads them
        twice (:meth:`_cache_outputs`); a subtask whose task ran more than once
        must have emitted the same rows each time (:meth:`_agreeing`). Either
        way the sink runs before the checkpoint completes, as the module doc says.
        """
        clock, spec, df = time.perf_counter, self.spec, batch.df
        source = batch.source
        data = self._metadata_of(source)
        metadata = self._ship_metadata(data, source)
        plan = self._plan(batch)
        channel = self._report_channel
        if spec.sink is None and plan.late_schema is None:
            channel = None  # nothing would run the tasks before the handle column is read
        sc = None if self.connect else df.sparkSession.sparkContext  # Connect has none: never in_plan
        if self.in_plan:  # df is the tasks' output already (streamed); the job carries the batch's plan
            assert sc is not None
            processed = df
            sc.setLocalProperty(PLAN_PROPERTY, batch_property(plan, metadata))
            if self._report_channel is not None:
                self._report_channel.value = []  # also without a sink: the tasks send to it every batch
            if self.locality is not None:
                self.locality.prefer(df, self.parallelism)  # a single executor: where every subtask ran
        else:
            routed = self.router.route(df)
            if self.locality is not None:
                routed = self.locality.prefer(routed, self.parallelism)
            processed = routed.mapInArrow(
                make_task(plan, metadata, channel), internal_schema(spec.output_schema, plan.late_schema)
            )
        if batch.query != STATIC_QUERY:
            _as_stateful_query(df.sparkSession)
            if self._cache_outputs(channel, plan.late_schema):
                processed = _persist_uncompressed(processed, df.sparkSession)
        else:
            processed = processed.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            t = clock()
            batch.phases["prepare"] = t - batch.started
            reports: list[TaskReport] | None = None
            runs: dict[int, list[TaskReport]] = {}
            if channel is not None:
                channel.value = []
                with self.metrics.describe(batch.batch_id, "tasks and sink"), _task_errors(source):
                    self._sink(processed, batch.batch_id, plan.late_schema)
                runs = self._runs(channel.value, plan.token)
                reports = self._channelled(runs, batch.batch_id)
                batch.task_runs = max((len(r) for r in runs.values()), default=1)
            if reports is None:
                with self.metrics.describe(batch.batch_id, "tasks"), _task_errors(source):
                    rows = processed.where(F.col(HANDLE_COLUMN).isNotNull()).select(HANDLE_COLUMN).collect()
                reports = self._reports([r[0] for r in rows])
                for r in reports:  # the sink's runs of a subtask, if any, must agree with this one
                    self._agreeing(r.subtask, [*runs.get(r.subtask, ()), r], batch.batch_id)
                batch.task_runs = max(len(runs.get(r.subtask, ())) + 1 for r in reports)
            batch.phases["tasks"] = clock() - t
            locations = self.locality.ran() if self.locality is not None else {}
            if channel is None:
                t = clock()
                with self.metrics.describe(batch.batch_id, "sink"):
                    self._sink(processed, batch.batch_id, plan.late_schema)
                batch.phases["sink"] = clock() - t
        finally:
            processed.unpersist()
            if sc is not None and self.in_plan:
                sc.setLocalProperty(PLAN_PROPERTY, None)  # type: ignore[arg-type]  # None unsets it
            if not isinstance(metadata, (InlineMetadata, StoredMetadata)):
                with contextlib.suppress(Exception):
                    metadata.destroy()
        return reports, locations

    def _sink(self, processed: DataFrame, batch_id: int, late_schema: T.StructType | None) -> None:
        """The batch's late rows to the late-records sink, its outputs to the sink."""
        spec = self.spec
        if late_schema is None and spec.sink is not None:
            spec.sink(self._outputs(processed), batch_id)
            return
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

    def _outputs(self, processed: DataFrame) -> DataFrame:
        """``processed``'s output rows in the user's columns (no handle rows).

        On a classic session two JVM calls on columns made once per query run:
        writing ``where(col(...).isNull()).select(...)`` afresh cost some 40
        Py4J round trips per batch (each step of a JVM name is one).
        """
        names = self.spec.output_schema.names
        if not hasattr(processed, "_jdf"):
            return processed.where(F.col(HANDLE_COLUMN).isNull()).select(*names)
        if self._output_columns is None:
            sc = self.session.sparkContext
            functions: Any = sc._jvm.org.apache.spark.sql.functions  # type: ignore[union-attr]
            self._output_columns = (
                functions.col(HANDLE_COLUMN).isNull(),
                jvm_seq(sc, [functions.col(quote(n)) for n in names]),
            )
        handle_is_null, columns = self._output_columns
        return DataFrame(processed._jdf.where(handle_is_null).select(columns), processed.sparkSession)

    def _complete(self, batch: _Batch, reports: list[TaskReport]) -> tuple[str, int]:
        """Complete the batch's checkpoint from the tasks' reports; its location and the new watermark."""
        t = time.perf_counter()
        source = batch.source
        watermark = self._next_watermark(batch.watermark, reports, source.location if source else None)
        properties: dict[str, Any] = {
            QUERY_PROPERTY: batch.query,
            BATCH_PROPERTY: batch.batch_id,
            TOKEN_PROPERTY: batch.token,
            ATTEMPTS_PROPERTY: {str(r.subtask): r.attempt for r in reports},
        }
        if watermark != MIN_WATERMARK:
            properties[WATERMARK_PROPERTY] = watermark
        if self.declared.dropped(source):  # what the restore dropped: into the checkpoint history
            properties[DROPPED_PROPERTY] = self.declared.dropped(source)
        if self.spark_location is not None and batch.query != STATIC_QUERY:
            properties[LOCATION_PROPERTY] = self.spark_location
        origin = self._origin or (source.metadata.properties.get(ORIGIN_PROPERTY) if source else None)
        if origin is not None:
            properties[ORIGIN_PROPERTY] = origin  # carried forward: the history descends from it
        slowest = max((r.phases for r in reports), key=lambda p: p.get("snapshot", 0) + p.get("upload", 0))
        location = self.coordinator.complete(
            batch.pending, [r.state for r in reports], properties,
            snapshot=slowest.get("snapshot", 0.0), upload=slowest.get("upload", 0.0),
        )  # fmt: skip
        self._completed = location
        batch.phases["checkpoint"] = time.perf_counter() - t
        return location, watermark

    def _warn_of_late_rows(self, info: BatchInfo) -> None:
        spec = self.spec
        et = spec.event_time
        if info.late_records and spec.late_sink is None and et is not None and et.late != "process":
            warnings.warn(
                f"statekit job {spec.job_id!r}, micro-batch {info.batch_id}: {info.late_records} late rows "
                "(event time at or below the watermark) were counted and not processed; add "
                "foreach_late_batch() to receive them, or EventTime(late='process')",
                RuntimeWarning,
                stacklevel=3,
            )

    def _ship_metadata(self, data: bytes, source: CompletedCheckpoint | None) -> Any:
        """How the tasks get the restore checkpoint's metadata: inside the task, a broadcast, or the storage.

        Small metadata travels inside the task; a broadcast costs the driver a
        few ms per batch. Tasks in the query's own plan (:meth:`streamed`) take
        no broadcast made after the query started: they read larger metadata
        from the storage too. A Connect session has no broadcast: the tasks read
        larger metadata from the checkpoint storage themselves (they reach it:
        they write there), except from the ``jobmanager`` storage, which lives
        in the coordinating process only and so always travels inside.
        """
        if len(data) <= _INLINE_METADATA:
            return InlineMetadata(data)
        if not self.connect and not self.in_plan:  # a query's own plan takes no broadcast made later
            return self.session.sparkContext.broadcast(data)
        if source is None or self.config.storage_name == "jobmanager":
            return InlineMetadata(data)
        return StoredMetadata(source.location, hashlib.sha256(data).hexdigest())

    def _next_watermark(self, current: int, reports: list[TaskReport], source: str | None) -> int:
        """The watermark the next batch runs with: the largest event time seen minus the delay.

        Also after an end of input: its tasks fired every timer as at the end
        of time, but the end of time lasts for that firing only (as on the
        LocalRunner), so a later batch over more rows goes on from the
        watermark the rows made. A ``current`` watermark at the end of time
        comes from a checkpoint (``source``) an older statekit wrote at an end
        of input; its rows are all late, which is said here.
        """
        if current == MAX_WATERMARK:
            late = sum(r.late for r in reports)
            if late:
                warnings.warn(
                    end_of_time_message(f"statekit job {self.spec.job_id!r}", source, f"all {late} rows"),
                    RuntimeWarning,
                    stacklevel=4,
                )
            return current
        et = self.spec.event_time
        if et is None:
            return current
        seen = [r.max_event_time for r in reports if r.max_event_time is not None]
        return et.watermark(current, max(seen) if seen else None)

    def _cache_outputs(self, channel: Any, late_schema: T.StructType | None) -> bool:
        """Whether a streaming batch's outputs are cached: always, or where statekit reads them twice.

        Twice: a late-records sink besides the sink, or the sink and then the
        handle column (no report channel: Spark Connect). Otherwise the sink's
        actions are the only readers, and a sink that runs several recomputes
        the batch as Spark's ``foreachBatch`` does (:meth:`_agreeing` checks it).
        """
        if self.config.get("statekit.spark.cache-output") == "always" or late_schema is not None:
            return True
        return channel is None and self.spec.sink is not None

    @staticmethod
    def _runs(sent: Reports, token: str) -> dict[int, list[TaskReport]]:
        """The reports the accumulator brought for this batch, per subtask, in arrival order."""
        runs: dict[int, list[TaskReport]] = {}
        for t, d in sent:
            if t == token:
                r = TaskReport.from_json(d)
                runs.setdefault(r.subtask, []).append(r)
        return runs

    def _channelled(self, runs: dict[int, list[TaskReport]], batch_id: int) -> list[TaskReport] | None:
        """One report per subtask from the accumulator's, if every subtask ran; None if one did not.

        A subtask whose task ran more than once in the batch (a sink's second
        action on outputs that are not cached, a partition Spark computed again)
        is taken from its last run, once every run agrees (:meth:`_agreeing`).
        """
        for index, reports in runs.items():
            self._agreeing(index, reports, batch_id)
        if sorted(runs) != list(range(self.parallelism)):
            return None
        return [runs[i][-1] for i in range(self.parallelism)]

    def _agreeing(self, index: int, reports: list[TaskReport], batch_id: int) -> None:
        """Check that every run of subtask ``index``'s task in this batch emitted the same rows.

        Raises:
            CheckpointError: If two runs emitted different rows: the sink may
                have written the outputs of either, and the checkpoint stands for
                one; the batch is not committed.
        """
        digests = {r.outputs_digest for r in reports}
        if len(digests) < 2:
            return
        if self.config.get("statekit.spark.cache-output") == "always":
            why = "Spark computed a partition of the cached outputs again"
            way = "make the function's outputs depend on its records and state alone"
        else:
            why = (
                "the sink ran more than one action on the batch's outputs, which "
                "spark.statekit.spark.cache-output=auto does not cache"
            )
            way = (
                "cache the batch's DataFrame in the sink before its actions (df.persist(), and "
                "df.unpersist() at its end), or set spark.statekit.spark.cache-output=always"
            )
        raise CheckpointError(
            f"statekit job {self.spec.job_id!r}, micro-batch {batch_id}: the task of subtask {index} ran "
            f"{len(reports)} times in this batch ({why}) and the runs emitted different rows: the "
            "function's outputs are not determined by its records and its state alone (processing "
            "time, randomness, reads from outside). Nothing of this batch is committed; the sink may "
            f"have written the outputs of any of the runs. Way out: {way}; then start the query "
            "again: it runs this batch again"
        )

    def _reports(self, descriptions: list[str]) -> list[TaskReport]:
        """The tasks' reports, one per subtask, by subtask; else the batch is not committed."""
        reports = sorted((TaskReport.from_json(d) for d in descriptions), key=lambda r: r.subtask)
        seen = [r.subtask for r in reports]
        if seen != list(range(self.parallelism)):
            raise CheckpointError(
                f"expected one snapshot from each of subtasks 0..{self.parallelism - 1}, got subtasks "
                f"{seen}; the micro-batch was not routed as planned and is not committed"
            )
        return reports

    def _notify(self, info: BatchInfo, query: str) -> None:
        if query != STATIC_QUERY:
            record_batch(query, info)  # for a StreamingQueryListener: batch_info_for
        if self.spec.on_batch is not None:
            self.spec.on_batch(info)


def _configuration(spec: JobSpec, session: SparkSession, registry: PluginRegistry) -> Configuration:
    """The query's configuration, validated, with its local paths resolved, its backend known to load.

    Raises:
        ConfigurationError, UnknownPluginError, PluginError: On a bad configuration.
    """
    conf = spark_configuration(session, spec.config)
    conf.validate(registry)
    conf = resolve_dead_letters(conf, connect=is_connect(session))
    state_backend_from_config(conf, registry)  # fail on the driver, not in every task
    return conf


def _made_function(spec: JobSpec) -> KeyedProcessFunction:
    """The job's function, made once here so that a bad factory fails now (what kind it is, which hooks)."""
    function = spec.function_factory()
    if not isinstance(function, KeyedProcessFunction):
        raise TypeError(
            f"the function factory made a {type(function).__name__}, not a KeyedProcessFunction "
            "or KeyedBatchFunction"
        )
    return function


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


@contextlib.contextmanager
def _session_setting(session: SparkSession, key: str, value: str) -> Iterator[None]:
    """Inside: ``session``'s setting ``key`` is ``value``; after, what it was (unset if it was unset)."""
    before = session.conf.get(key, None)
    session.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            session.conf.unset(key)
        else:
            session.conf.set(key, before)


def aqe_off_for_the_query(session: SparkSession) -> contextlib.AbstractContextManager[None]:
    """Inside: a streaming query started from ``session`` runs its micro-batches without AQE.

    A query clones its session when it starts, so the setting is set on
    ``session`` for the ``start()`` alone and then restored (``session`` is the
    user's). With AQE, Spark's own planning of the first micro-batch of a plan
    with the routing's shuffle (``toRdd``, before ``foreachBatch`` is called)
    ran the shuffle's map stage as a job of its own, outside the batch's jobs
    and their local properties (read_logs' dead letters lost their job id).
    """
    return _session_setting(session, "spark.sql.adaptive.enabled", "false")


def _persist_uncompressed(processed: DataFrame, session: SparkSession) -> DataFrame:
    """``processed`` cached without compressing its columns, in a streaming query's own session.

    The cache lives for one micro-batch (the sink reads it, then it is
    dropped): compressing it costs CPU the batch waits for and saves memory
    for a moment. The cache takes the setting when it is made, so it is set
    for the ``persist`` alone and restored (a sink's own caches are compressed
    as configured).
    """
    with _session_setting(session, "spark.sql.inMemoryColumnarStorage.compressed", "false"):
        return processed.persist(StorageLevel.MEMORY_AND_DISK)


SPARK_WAYS_OUT = (
    ". A Spark query never falls back to an older checkpoint: Spark's offset log must match the "
    "checkpoint it continues from. Ways out: restore a savepoint, or an older checkpoint "
    "(`statekit checkpoints list` shows them with their status), into a new query (a new "
    "checkpoint_location, start(restore='<location>')); see docs/operations.md#restore-rules"
)


@contextlib.contextmanager
def _task_errors(source: CompletedCheckpoint | None) -> Iterator[None]:
    """A task's error about damage to ``source`` raised as that damage; any other error as it is."""
    try:
        yield
    except Exception as e:
        damage = _task_damage(e, source)
        if damage is None:
            raise
        raise damage from e


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
    return CorruptCheckpointError(source.location, problem + SPARK_WAYS_OUT)


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


def _origin_location(cp: CompletedCheckpoint | None, origin: dict[str, Any] | None) -> str | None:
    """The location of the explicit restore a batch's history descends from, if any."""
    found = origin or (cp.metadata.properties.get(ORIGIN_PROPERTY) if cp is not None else None)
    return str(found["location"]) if isinstance(found, dict) and "location" in found else None


def _origin(props: dict[str, Any]) -> str:
    query = props.get(QUERY_PROPERTY)
    if query is None:
        return "another runner"
    if query == STATIC_QUERY:
        return f"a static run (batch {props.get(BATCH_PROPERTY)})"
    return f"Spark query {query} (micro-batch {props.get(BATCH_PROPERTY)})"
