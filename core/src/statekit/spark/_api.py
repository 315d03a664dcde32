"""The user-facing Spark API: ``keyed(df, key).process(...)``, sinks, ``start`` and ``run``."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import types as T
from pyspark.sql.streaming.query import StreamingQuery

from .._contracts import CheckpointStorage
from .._errors import CheckpointError, ConfigurationError, CorruptCheckpointError
from ..checkpoints._coordinator import newest_checkpoint, start_point
from ..checkpoints._savepoint_requests import COMPLETED, request_savepoint
from ..checkpoints._source_position import position_of
from ..plugins._config import Configuration
from ..plugins._registry import default_registry
from ..runtime._function import KeyedProcessFunction
from ..serialization._serializers import serializer_for
from ..timers._eventtime import EventTime
from ._batchinfo import BatchInfo
from ._connect import ConnectBatches, start_on_server
from ._driver import (
    BATCH_PROPERTY,
    QUERY_PROPERTY,
    SPARK_WAYS_OUT,
    STATIC_QUERY,
    MicroBatchDriver,
    aqe_off_for_the_query,
)
from ._jobspec import JobSpec, Sink, check_columns, check_key_type, driver_storage, resolve_dead_letters
from ._query import StartedQuery
from ._shipping import ship_by_value
from ._sparkconf import is_connect, spark_configuration
from ._upgrade import (
    absolute_location,
    checkpoint_location_of,
    prepare_latest,
    prepare_location,
    streaming_sources,
)
from ._warmup import settle

__all__ = ["KeyedDataFrame", "ProcessedStream", "keyed"]


def keyed(df: DataFrame, key: str, *, key_type: Any = str) -> KeyedDataFrame:
    """Key a DataFrame (streaming or static) by one of its columns, as ``df.groupBy(key)`` would.

    Args:
        df: The input; each row reaches the function as a ``dict`` of its columns.
        key: The key column. A row whose key is null (or that ``key_type``'s
            serializer refuses) is a bad record: ``statekit.bad-records.policy``
            fails the query naming it, or skips it into dead letters with the
            micro-batch, the file Spark read it from and the row's values.
        key_type: The key's Python type (``str``, ``int``, ``bytes``, a tuple or
            dataclass type…) or a :class:`~statekit.serializers.TypeSerializer`; it fixes the
            key's canonical bytes, hence its key group. ``str`` and ``int`` keys
            are routed by Spark SQL alone; others by a Python pass.

    Example::

        from statekit.spark import keyed

        query = (
            keyed(spark.readStream.json("logs/"), "url")
            .process(CountPerUrl, "url string, count long", job_id="url-count")
            .write_files("s3a://bucket/url-counts")
            .start(checkpoint_location="s3a://bucket/spark-checkpoints/url-count")
        )
    """
    return KeyedDataFrame(df, key, key_type=key_type)


class KeyedDataFrame:
    """A DataFrame keyed by a column: what :func:`keyed` returns."""

    def __init__(self, df: DataFrame, key: str, *, key_type: Any = str) -> None:
        """See :func:`keyed`."""
        check_columns(df, key)
        self.df = df
        self.key = key
        self.key_serializer = serializer_for(key_type)
        check_key_type(self.key_serializer, df.schema[key].dataType, key)

    def process(
        self,
        function: Callable[[], KeyedProcessFunction],
        output_schema: T.StructType | str,
        *,
        job_id: str,
        operator_id: str = "process",
        config: Mapping[str, object] | Configuration | None = None,
        allow_non_restored_state: bool = False,
        on_batch: Callable[[BatchInfo], None] | None = None,
        event_time: EventTime | None = None,
    ) -> ProcessedStream:
        """Run ``function`` over the keyed rows, with keyed and operator state.

        Args:
            function: Makes one :class:`~statekit.KeyedProcessFunction` per subtask
                (a class, or any callable without arguments); it is pickled to the
                executors.
            output_schema: The schema of the records ``process`` yields, as a
                ``StructType`` or a DDL string (``"url string, count long"``).
                Records are tuples, lists or Rows in that order, or dicts by name.
            job_id: Names the job's state: its checkpoints live under this id.
            operator_id: Names this operator's state inside the job's checkpoints.
            config: ``statekit.*`` keys that override Spark's ``spark.statekit.*``.
            allow_non_restored_state: Start even if the checkpoint holds state of
                operators this job does not have (that state is dropped).
            on_batch: Called on the driver with a :class:`BatchInfo` after every batch.
            event_time: The event-time column (a ``timestamp`` or epoch-ms ``long``)
                and the watermark's delay, as ``withWatermark``: e.g.
                ``EventTime("ts", "1 minute")``. The watermark moves at batch
                boundaries; see docs/spark.md.
        """
        schema = (
            output_schema if isinstance(output_schema, T.StructType) else T.StructType.fromDDL(output_schema)
        )
        if not isinstance(schema, T.StructType):
            raise ConfigurationError(f"output schema {output_schema!r} is not a struct type")
        reserved = [name for name in schema.names if name.startswith("__statekit_")]
        if reserved:
            raise ConfigurationError(f"output column names {reserved} are reserved by statekit.spark")
        spec = JobSpec(
            df=self.df,
            key_column=self.key,
            key_serializer=self.key_serializer,
            function_factory=function,
            output_schema=schema,
            job_id=job_id,
            operator_id=operator_id,
            config=None if config is None else (
                config if isinstance(config, Configuration) else Configuration.from_mapping(config)
            ),
            allow_non_restored_state=allow_non_restored_state,
            on_batch=on_batch,
            sink=None,
            event_time=event_time,
        )  # fmt: skip
        if event_time is not None:
            if not isinstance(event_time.field, str) or event_time.field not in self.df.columns:
                raise ConfigurationError(
                    f"event-time column {event_time.field!r} is not a column of the DataFrame: "
                    f"{self.df.columns}"
                )
            typ = self.df.schema[event_time.field].dataType
            if not isinstance(typ, (T.TimestampType, T.TimestampNTZType, T.LongType, T.IntegerType)):
                raise ConfigurationError(
                    f"event-time column {event_time.field!r} is {typ.simpleString()}: use a timestamp "
                    "column (e.g. F.to_timestamp) or epoch milliseconds as a long"
                )
        return ProcessedStream(spec)


class ProcessedStream:
    """The output of :meth:`KeyedDataFrame.process`: choose a sink, then ``start`` or ``run``.

    **Sink contract.** A batch's outputs are handed to the sink *before* its
    checkpoint completes, and a batch is processed again (from the previous
    checkpoint, with the same input and batch id) if anything fails before the
    checkpoint completes. So the sink must be idempotent per batch id: writing
    batch ``b`` twice must leave what writing it once leaves. :meth:`write_files`
    is; a :meth:`foreach_batch` callback must be.
    """

    def __init__(self, spec: JobSpec) -> None:
        """Made by :meth:`KeyedDataFrame.process`."""
        self._spec = spec
        self._query: StreamingQuery | None = None  # the query start() started, if any

    @property
    def output_schema(self) -> T.StructType:
        """The schema of the output records."""
        return self._spec.output_schema

    @property
    def job_id(self) -> str:
        """The job whose state this stream keeps."""
        return self._spec.job_id

    def write_files(
        self,
        path: str,
        format: str = "parquet",  # noqa: A002 - named as in DataFrameWriter.format
        *,
        options: Mapping[str, str] | None = None,
    ) -> ProcessedStream:
        """Write each batch's outputs to ``<path>/batch_id=<b>/``, replacing what a previous attempt wrote.

        Readers see one partition column, ``batch_id``. A batch directory is
        complete once it holds Spark's ``_SUCCESS`` file.
        """
        opts = dict(options or {})
        base = path.rstrip("/")

        def sink(df: DataFrame, batch_id: int) -> None:
            df.write.mode("overwrite").format(format).options(**opts).save(f"{base}/batch_id={batch_id}")

        return self._with_sink(sink)

    def foreach_batch(self, callback: Callable[[DataFrame, int], None]) -> ProcessedStream:
        """Hand each batch's outputs to ``callback(df, batch_id)`` on the driver, as ``foreachBatch``.

        ``df`` is cached: several actions on it compute nothing again. The
        callback may be called more than once for one batch id and must then
        leave the same result (e.g. overwrite, or MERGE on a key plus batch id).
        """
        return self._with_sink(callback)

    def foreach_late_batch(self, callback: Callable[[DataFrame, int], None]) -> ProcessedStream:
        """Hand each batch's late rows to ``callback(df, batch_id)``: the side output of late data.

        Late rows (event time at or below the watermark the batch ran with) have
        the input's columns. Without this, they are counted (``BatchInfo.late_records``)
        and a warning names the count. Like the sink, the callback must be
        idempotent per batch id.
        """
        if self._spec.event_time is None:
            raise ConfigurationError("late rows need event time: pass event_time= to process()")
        self._spec = dataclasses.replace(self._spec, late_sink=callback)
        return self

    def _with_sink(self, sink: Sink) -> ProcessedStream:
        self._spec = dataclasses.replace(self._spec, sink=sink)
        return self

    def configuration(self) -> Configuration:
        """statekit's configuration for this stream: Spark's ``spark.statekit.*`` keys and ``config``."""
        return spark_configuration(self._spec.df.sparkSession, self._spec.config)

    def checkpoint_storage(self) -> CheckpointStorage:
        """The driver's checkpoint storage (for ``jobmanager``, the one holding its checkpoints)."""
        return driver_storage(self.configuration(), default_registry())

    def start(
        self,
        checkpoint_location: str | None = None,
        trigger: str | Mapping[str, Any] | None = None,
        query_name: str | None = None,
        *,
        restore: str | None = None,
        input_begins_after_savepoint: bool = False,
    ) -> StreamingQuery:
        """Start the streaming query; it runs until stopped, like ``writeStream.start()``.

        Args:
            checkpoint_location: Spark's checkpoint location (source offsets and
                batch ids). Restarting with the same location continues the query;
                statekit then restores the state of its last completed checkpoint.
                None: Spark's ``spark.sql.streaming.checkpointLocation``.
            trigger: A processing-time interval (``"10 seconds"``) or the keyword
                arguments of ``DataStreamWriter.trigger`` (``{"availableNow": True}``).
            query_name: The query's name.
            restore: Where a query's state comes from when its checkpoint
                location is new while the job already has state (or has lost it):
                ``"latest"``: the job's latest checkpoint (or empty state), its
                sources from their configured start. A location: that savepoint
                (or checkpoint) *and its source position*: on a new checkpoint
                location Spark starts at the micro-batch after the savepoint's,
                each source right after what the savepoint had read (see
                docs/spark.md, "Savepoints of a running query"). On a location
                that has history, it is taken only where that history is the
                restore's (the savepoint's own query and batch, or a restart of
                a query that restored it); otherwise the start is refused.
            input_begins_after_savepoint: The user's statement that the query's
                input begins after ``restore`` (new files in a new folder, a topic
                read from the right offsets): a savepoint that carries no Spark
                source position (a LocalRunner's, an older statekit's) is then
                restored, and the query's sources start from their configured
                start. Without it, such a restore is refused before any batch.

        From a Spark Connect client, the query's micro-batches are coordinated
        on the server (Connect runs ``foreachBatch`` functions there, in a
        Python process of the query's own): the sink, ``foreach_late_batch``
        and ``on_batch`` callbacks run there too, so they must pickle (no
        locks, no open files) and their side effects happen on the server.
        See docs/spark.md, "Spark Connect".

        Raises:
            TypeError: If the DataFrame is not streaming.
            ConfigurationError: On a bad configuration, before the query starts.
            CheckpointError: If ``restore`` cannot be taken (no source position,
                a location whose history is not the restore's), before the query starts.
        """
        spec = self._spec
        if not spec.df.isStreaming:
            raise TypeError("start() needs a streaming DataFrame; use run() for a static one")
        if is_connect(spec.df.sparkSession):
            return self._start_connect(
                checkpoint_location, trigger, query_name, restore, input_begins_after_savepoint
            )
        ship_by_value(spec.function_factory)
        checkpoint_location = checkpoint_location_of(spec.df.sparkSession, checkpoint_location, query_name)
        driver = MicroBatchDriver(
            spec, spec.df.sparkSession, restore=restore, checkpoint_location=checkpoint_location,
            input_begins_after_savepoint=input_begins_after_savepoint,
        )  # fmt: skip
        if driver.restored is not None:
            prepare_location(
                checkpoint_location, driver.restored, driver.latest(), job_id=spec.job_id,
                position=driver.position(), input_begins_after=input_begins_after_savepoint,
                sources=streaming_sources(spec.df),
            )  # fmt: skip
        elif restore == "latest":
            prepare_latest(
                checkpoint_location, driver.latest(), driver.storage, job_id=spec.job_id,
                sources=streaming_sources(spec.df),
            )  # fmt: skip
        started = threading.Event()
        query_ids: list[str] = []

        def on_micro_batch(batch_df: DataFrame, batch_id: int) -> None:
            # The query's id survives restarts from its checkpoint location; start() returns it
            # right after the query thread starts, so the first batch waits a moment for it.
            started.wait(timeout=120)
            query_id = query_ids[0] if query_ids else None
            if query_id is None:
                query_id = batch_df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
            if query_id is None:
                raise CheckpointError("cannot tell which streaming query runs this micro-batch")
            with driver.savepoints.batch(batch_id):  # an idle query's savepoint is not written meanwhile
                driver.process_batch(batch_df, batch_id, query_id)

        streamed = driver.streamed(spec.df)  # routing and tasks in its plan, where they can be
        writer = self._writer(streamed, on_micro_batch, checkpoint_location, trigger, query_name)
        with aqe_off_for_the_query(spec.df.sparkSession):  # the query's clone of the session keeps it
            query: StreamingQuery = writer.start()
        query = StartedQuery(query, driver.query_ended)  # its end: the warm-up's, the run's
        query_ids.append(str(query.id))
        started.set()
        # Savepoint requests of an idle query, answered at once; the end of a query nobody waits on.
        driver.savepoints.watch(query, on_end=driver.query_ended)
        self._query = query
        return query

    def _writer(
        self,
        df: DataFrame,
        on_micro_batch: Callable[[DataFrame, int], None],
        checkpoint_location: str | None,
        trigger: str | Mapping[str, Any] | None,
        query_name: str | None,
    ) -> Any:
        writer = df.writeStream.foreachBatch(on_micro_batch)
        if checkpoint_location is not None:
            writer = writer.option("checkpointLocation", checkpoint_location)
        if isinstance(trigger, str):
            writer = writer.trigger(processingTime=trigger)
        elif trigger is not None:
            writer = writer.trigger(**trigger)
        if query_name is not None:
            writer = writer.queryName(query_name)
        return writer

    def _start_connect(
        self,
        checkpoint_location: str | None,
        trigger: str | Mapping[str, Any] | None,
        query_name: str | None,
        restore: str | None,
        input_begins_after_savepoint: bool,
    ) -> StreamingQuery:
        """:meth:`start` from a Spark Connect client: the batches are coordinated on the server."""
        spec = self._spec
        session = spec.df.sparkSession
        if checkpoint_location is None:
            base = session.conf.get("spark.sql.streaming.checkpointLocation", None)
            if not base or query_name is None:
                raise ConfigurationError(
                    "from a Spark Connect client, start() needs checkpoint_location (or query_name with "
                    "spark.sql.streaming.checkpointLocation set): the server reads the query's id from it"
                )
            checkpoint_location = f"{base.rstrip('/')}/{query_name}"  # where Spark puts a named query
        # Checked here, so that a bad configuration fails start() and not the query on the server.
        # The backend itself is made on the server only: its engine need not be installed here.
        conf = spark_configuration(session, spec.config)
        conf.validate(default_registry())
        # A relative dead-letter path is refused here; the server checks the directory itself.
        conf = resolve_dead_letters(conf, connect=True, check=False)
        if conf.storage_name == "jobmanager":
            raise ConfigurationError(
                "a streaming query started from a Spark Connect client cannot keep its checkpoints in the "
                "jobmanager storage: Connect coordinates the query in a server-side Python process that "
                "ends with the query, and its checkpoints with it. Set spark.statekit.checkpoints.dir "
                "(the filesystem storage: a path or fsspec URL the Connect server and its executors reach)"
            )
        # Connect pickles the function and the callbacks to the server, which may not import the
        # modules that define them (a script, a notebook, a test suite): those travel by value.
        for part in (spec.function_factory, spec.sink, spec.late_sink, spec.on_batch):
            if part is not None:
                ship_by_value(part)
        if restore not in (None, "latest"):
            # Written from here, before the query starts: the location must be reachable from the client,
            # and name the same place on both sides.
            if absolute_location(checkpoint_location) != checkpoint_location:
                raise ConfigurationError(
                    f"start(restore=...) from a Spark Connect client writes the savepoint's source position "
                    f"into the checkpoint location before the query starts: {checkpoint_location!r} is "
                    "relative, which the client and the server resolve differently; give an absolute path "
                    "or a URL"
                )
            storage = driver_storage(conf, default_registry())
            # Chosen as the server's driver will choose it (start_point), here only to seed the location.
            start = start_point(storage, spec.job_id, restore, fallback=False, ways_out=SPARK_WAYS_OUT)
            restored = start.checkpoint
            assert restored is not None  # an explicit location loads or raises
            try:
                latest = newest_checkpoint(storage, spec.job_id)
            except CorruptCheckpointError:
                latest = None  # as the driver: an explicit restore passes a damaged newest checkpoint
            prepare_location(
                checkpoint_location, restored, latest,
                job_id=spec.job_id, input_begins_after=input_begins_after_savepoint,
                position=position_of(storage, restored.location, restored.metadata.properties),
            )  # fmt: skip
        elif restore == "latest":
            storage = driver_storage(conf, default_registry())
            try:
                latest = newest_checkpoint(storage, spec.job_id)
            except CorruptCheckpointError:
                latest = None  # the query's first batch reports it, as without a restore
            if latest is not None and absolute_location(checkpoint_location) == checkpoint_location:
                prepare_latest(checkpoint_location, latest, storage, job_id=spec.job_id)
        batches = ConnectBatches(
            dataclasses.replace(spec, config=conf), restore=restore, checkpoint_location=checkpoint_location,
            input_begins_after_savepoint=input_begins_after_savepoint,
            client_session_id=getattr(session, "session_id", None),
        )  # fmt: skip
        writer = self._writer(self._spec.df, batches, checkpoint_location, trigger, query_name)
        query = start_on_server(writer, conf.get("statekit.spark.connect.start-attempts"))
        self._query = query
        return query

    def savepoint(self, target_dir: str | None = None, *, timeout: float = 600.0) -> str:
        """Take a savepoint of the job's running query; returns its location.

        The query goes on. The savepoint is the state after a micro-batch (its
        checkpoint, written as a canonical, self-contained and relocatable
        savepoint, as ``statekit savepoint convert`` writes one): a new query
        started with ``restore=<location>`` (at any parallelism, with any
        backend) continues from it exactly. The request reaches the query
        through the job's checkpoint storage, as ``statekit savepoint trigger``'s
        does, so the query may run in this process or elsewhere. A query in a
        micro-batch answers after that batch; an idle one (no new input, no
        batch running) answers at once, within a few seconds, with the newest
        checkpoint it completed, converted (nothing was processed since).

        Args:
            target_dir: Where to write it; None: ``statekit.savepoints.dir``.
            timeout: Seconds to wait for the answer.

        Raises:
            CheckpointError: If no query of the job answered within ``timeout``
                (none runs, or it has completed no checkpoint of the job yet and
                gets no input), or the savepoint failed (with the reason; the
                query goes on). At once, requesting nothing, if the query this
                stream started has stopped (an ``availableNow`` trigger stops
                when its input is read): the message names its newest
                checkpoint and the command that converts it to a savepoint.
        """
        return self._savepoint(target_dir, stop=False, timeout=timeout)

    def stop_with_savepoint(self, target_dir: str | None = None, *, timeout: float = 600.0) -> str:
        """Take a savepoint of the running query, then stop the query; its location.

        As :meth:`savepoint` (after the batch under way, or at once when the
        query is idle), and the query ends there: nothing is processed after
        the savepoint (Flink's ``stop --savepointPath``). If this
        stream started the query, the call returns once it has stopped. If the
        savepoint fails, nothing stops (as in Flink): the failure is raised at
        once and the query goes on.

        Raises:
            CheckpointError: As :meth:`savepoint`.
        """
        return self._savepoint(target_dir, stop=True, timeout=timeout)

    def _savepoint(self, target_dir: str | None, *, stop: bool, timeout: float) -> str:
        query = self._query
        if query is not None and not query.isActive:
            # Nothing would answer in this process: fail now, not after ``timeout`` seconds.
            latest = self.checkpoint_storage().latest_checkpoint(self.job_id)
            out = "DIR" if target_dir is None else target_dir
            way = (
                f"its newest checkpoint is {latest}: `statekit savepoint convert {latest} --target {out}` "
                "writes it as a savepoint that a new query restores from (with the source position "
                "while the query's checkpoint location is kept)"
                if latest is not None
                else "it completed no checkpoint of the job"
            )
            raise CheckpointError(
                f"the query this stream started for job {self.job_id!r} has stopped (an availableNow or once "
                f"trigger stops when its input is read), so it takes no savepoint; nothing was requested: "
                f"{way}. To ask a query of the job that runs elsewhere, use `statekit savepoint trigger`"
            )
        response = request_savepoint(
            self.checkpoint_storage(), self.job_id, target_dir, stop=stop, timeout=timeout
        )
        if stop and response.stopped and self._query is not None:
            with contextlib.suppress(Exception):  # a batch refused after the stop ends the query with it
                self._query.awaitTermination(max(1, int(timeout)))
        if response.status != COMPLETED or response.location is None:
            raise CheckpointError(
                f"the savepoint of job {self.job_id!r} after micro-batch {response.batch_id} "
                f"{response.status}: {response.failure or 'the request came after its deadline'}"
            )
        return response.location

    def run(
        self,
        *,
        batch_id: int | None = None,
        restore: str | None = "latest",
        end_of_input: bool | None = None,
    ) -> BatchInfo:
        """Process a static DataFrame as one batch: the next checkpoint of the job.

        Each ``run`` continues from the job's latest checkpoint, so a job can be
        fed batch after batch (``restore=None`` starts from empty state; a
        location, from that checkpoint or savepoint).

        Args:
            batch_id: Makes a re-run idempotent: a ``run`` whose ``batch_id`` is
                not above the last batch id a ``run`` completed does nothing (it
                returns ``skipped=True``). Batch ids must grow; gaps are fine.
                None: one more than the last.
            restore: Where the state comes from; see above.
            end_of_input: After this batch's rows, fire every pending
                event-time timer as at the end of time (Flink's end of a
                bounded input). The checkpoint keeps the watermark the rows
                made, so a later ``run`` over more rows goes on from it (a
                window that fired is emitted again with its later rows). None:
                the ``statekit.timers.end-of-input`` option (``fire`` or
                ``keep``) for jobs with event time, False for the others; a job
                fed batch after batch wants ``keep``, or False until its last
                batch (see docs/state.md, "The end of the input").

        Raises:
            TypeError: If the DataFrame is streaming.
        """
        spec = self._spec
        if spec.df.isStreaming:
            raise TypeError("run() needs a static DataFrame; use start() for a streaming one")
        if batch_id is not None and batch_id < 0:
            raise ValueError(f"batch_id must be >= 0, not {batch_id}")
        ship_by_value(spec.function_factory)
        driver = MicroBatchDriver(spec, spec.df.sparkSession, restore=restore)
        if batch_id is None:
            latest = driver.latest()
            props = latest.metadata.properties if latest is not None else {}
            batch_id = int(props[BATCH_PROPERTY]) + 1 if props.get(QUERY_PROPERTY) == STATIC_QUERY else 0
        if end_of_input is None:
            end_of_input = (
                spec.event_time is not None and driver.config.get("statekit.timers.end-of-input") != "keep"
            )
        try:
            return driver.process_batch(spec.df, batch_id, STATIC_QUERY, end_of_input=end_of_input)
        finally:
            driver.fence.end()  # a static run ends here; a streaming one runs until killed
            settle(driver.warm_up, spec.job_id)  # the application's stop, next, would kill its workers
