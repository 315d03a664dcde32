"""The windowed URL-count job: requests per URL per minute of event time, on the LocalRunner and on Spark.

The event time is each line's ``@timestamp`` (:func:`~statekit_urlcount.parse_timestamp`),
epoch milliseconds computed in the parse step, so both runners apply one rule.
The watermark trails the largest event time seen by ``delay`` (the allowed
out-of-orderness); a window is emitted once, when the watermark passes its end;
a line at or below the watermark is *late*: counted and written to a side
output, never added to a window. On Spark the pipeline is one streaming query::

    readStream.text(logs)                                    one row per line
      .mapInArrow(parse_timed_batches)                       url | time_ms | reason | line
      keyed(key="url").process(RequestsPerUrlPerWindow,
                               event_time=EventTime("time_ms", delay))
      .foreach_batch(sink)                                   output/windows, output/dead-letter
      .foreach_late_batch(sink.late)                         output/late

The LocalRunner moves the watermark after every record; Spark moves it at
micro-batch boundaries (batch ``b`` runs with the watermark of batches before
it), so the two find different lines late: see docs/urlcount.md.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statekit import EventTime, LocalRunner, TimeDomain
from statekit.state_processor import SavepointReader

from ._function import WINDOWED_OUTPUT_SCHEMA, RequestsPerUrlPerWindow
from ._job import BatchStats, JobSettings, RunReport, checkpoint_storage, run_stream
from ._parse import MALFORMED_KEY, AccessRecord, parse_line

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame, SparkSession

    from statekit.spark import BatchInfo, ProcessedStream

__all__ = [
    "WINDOWED_PARSED_SCHEMA",
    "PendingWindows",
    "WindowedSettings",
    "build_windowed_stream",
    "format_time_ms",
    "parse_timed_batches",
    "parse_timed_line",
    "pending_windows",
    "read_output",
    "read_timed_lines",
    "run_windowed_job",
    "windowed_local_runner",
]

#: The schema :func:`parse_timed_batches` produces from Spark's text source.
WINDOWED_PARSED_SCHEMA = "url string, time_ms long, reason string, line string"


@dataclass(frozen=True)
class WindowedSettings(JobSettings):
    """:class:`~statekit_urlcount.JobSettings` of the windowed job: also the window and the delay.

    Attributes:
        window: The tumbling window's size (``"1 minute"``, a ``timedelta`` or ms).
        delay: The allowed out-of-orderness: the watermark is the largest
            ``@timestamp`` seen minus this.
    """

    job_id: str = "urlcount-windowed"
    window: str | int | dt.timedelta = "1 minute"
    delay: str | int | dt.timedelta = "10 seconds"

    @property
    def event_time(self) -> EventTime:
        """The job's event time: the parsed ``time_ms`` column, trailed by ``delay``."""
        return EventTime("time_ms", self.delay)

    @property
    def windows_dir(self) -> str:
        """Per micro-batch, the windows the watermark passed (JSON lines)."""
        return os.path.join(self._output, "windows")

    @property
    def late_dir(self) -> str:
        """Per micro-batch, the late lines (JSON lines)."""
        return os.path.join(self._output, "late")

    @property
    def _output(self) -> str:
        return self.output_dir or os.path.join(self.state_dir, "output")


def parse_timed_line(line: str) -> dict[str, Any]:
    """One log line as the windowed job's record: ``url``, ``time_ms``, ``reason``, ``line``.

    A request is ``{"url": url, "time_ms": ms, "reason": None, "line": None}``;
    a malformed line (including a missing or bad ``@timestamp``) is
    ``{"url": MALFORMED_KEY, "time_ms": None, "reason": reason, "line": line}``.
    """
    parsed = parse_line(line, require_timestamp=True)
    if isinstance(parsed, AccessRecord):
        return {"url": parsed.url, "time_ms": parsed.time_ms, "reason": None, "line": None}
    return {"url": MALFORMED_KEY, "time_ms": None, "reason": parsed.reason, "line": parsed.line}


def read_timed_lines(paths: Iterable[str | os.PathLike[str]]) -> Iterator[dict[str, Any]]:
    """The records of every line of ``paths``, in order (the LocalRunner's input)."""
    for path in paths:
        with open(path, encoding="utf-8", newline="\n") as f:
            for line in f:
                yield parse_timed_line(line[:-1] if line.endswith("\n") else line)


def parse_timed_batches(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: Spark text rows (``value``) to :data:`WINDOWED_PARSED_SCHEMA` rows."""
    import pyarrow as pa

    names = ["url", "time_ms", "reason", "line"]
    types = [pa.string(), pa.int64(), pa.string(), pa.string()]
    for batch in batches:
        columns: list[list[Any]] = [[], [], [], []]
        for value in batch.column(0).to_pylist():
            record = parse_timed_line(value or "")
            for column, name in zip(columns, names):
                column.append(record[name])
        yield pa.RecordBatch.from_arrays([pa.array(c, t) for c, t in zip(columns, types)], names=names)


def windowed_local_runner(
    settings: WindowedSettings,
    *,
    sink: Callable[[Any], None] | None = None,
    late_sink: Callable[[dict[str, Any]], None] | None = None,
    config: dict[str, object] | None = None,
) -> LocalRunner:
    """The windowed job on the embedded :class:`~statekit.LocalRunner`, over :func:`read_timed_lines`.

    ``config`` is statekit's (e.g. ``{"statekit.checkpoint.storage": "jobmanager"}``);
    outputs (:data:`~statekit_urlcount.WINDOWED_OUTPUT_SCHEMA` tuples) go to
    ``sink``, late lines' records to ``late_sink``. At the end of the input
    every open window is emitted, as at the end of time, and the watermark
    stays the lines' (``statekit.timers.end-of-input=fire``, the default): a
    later run over newer logs goes on from it, and emits a window that was
    open at the end again, with its newer lines. For logs that grow, ``config``
    ``{"statekit.timers.end-of-input": "keep"}`` leaves the open windows for
    that later run instead. Example::

        windows, late = [], []
        runner = windowed_local_runner(
            WindowedSettings("logs", "state"), sink=windows.append, late_sink=late.append
        )
        result = runner.run(read_timed_lines(paths))   # result.late_records == len(late)
    """
    return LocalRunner(
        functools.partial(RequestsPerUrlPerWindow, settings.window),
        key_selector=lambda record: record["url"],
        config={"statekit.parallelism": settings.parallelism, **(config or {})},
        job_id=settings.job_id,
        sink=sink,
        event_time=settings.event_time,
        late_sink=late_sink,
    )


def format_time_ms(ms: int | None) -> str:
    """Epoch ms as ``2019-04-18T00:01:00Z`` (``-`` for None and the watermark's ends)."""
    if ms is None or not -(2**62) < ms < 2**62:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class PendingWindows:
    """The windows the job's latest checkpoint holds open: counted in statekit's state, not emitted.

    Attributes:
        watermark: The watermark that checkpoint holds, which the next batch
            runs with (None before any event time).
        ends: Each open window's end (epoch ms, exclusive), one per URL and window.
    """

    watermark: int | None = None
    ends: tuple[int, ...] = ()

    @property
    def due(self) -> int:
        """Open windows that end at or before the watermark.

        On Spark a batch fires the timers of the watermark it *ran* with, and
        the watermark it reports (and checkpoints) is the next batch's: the
        windows between the two are due, and the next batch emits them after
        its rows. Spark runs no batch without new input, so that takes newer
        logs.
        """
        if self.watermark is None:
            return 0
        return sum(1 for end in self.ends if end - 1 <= self.watermark)


def pending_windows(settings: WindowedSettings) -> PendingWindows:
    """The open windows and the watermark of the job's latest statekit checkpoint (none: empty).

    Read as data: each open window of a URL is a pending event-time timer at
    the window's last millisecond (the job registers no other timer).
    """
    storage = checkpoint_storage(settings)
    location = storage.latest_checkpoint(settings.job_id)
    if location is None:
        return PendingWindows()
    with SavepointReader.open(location, storage=storage) as reader:
        ends = tuple(
            last + 1
            for batch in reader.timers("process", TimeDomain.EVENT_TIME)
            for last in batch.column("timestamp").to_pylist()
        )
        return PendingWindows(reader.watermark, ends)


class _WindowedSink:
    """The ``foreach_batch`` and ``foreach_late_batch`` callbacks and ``on_batch`` listener of a run.

    Every output folder is per batch id and overwritten by a retry, so the
    output is exactly once per batch.
    """

    def __init__(self, settings: WindowedSettings, on_batch: Callable[[BatchStats], None]) -> None:
        self.settings = settings
        self.on_batch = on_batch
        self.batches: list[BatchStats] = []
        self._pending: dict[int, tuple[int, int]] = {}
        self._last = time.perf_counter()

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        """Writes one batch's windows and dead letters (the batch is cached: nothing runs twice)."""
        from pyspark.sql import functions as F

        name = f"batch={batch_id:06d}"
        windows = batch_df.where(F.col("url").isNotNull()).select(
            "url", "window_start", "window_end", "requests"
        )
        windows.write.mode("overwrite").json(os.path.join(self.settings.windows_dir, name))
        dead = batch_df.where(F.col("url").isNull()).select(
            F.lit(batch_id).alias("batch"), "reason", "line", F.col("requests").alias("malformed_so_far")
        )
        dead.write.mode("overwrite").json(os.path.join(self.settings.dead_letter_dir, name))
        row = batch_df.agg(F.count("url").alias("windows"), F.count("reason").alias("malformed")).first()
        if row is not None:
            self._pending[batch_id] = (int(row["windows"]), int(row["malformed"]))

    def late(self, late_df: DataFrame, batch_id: int) -> None:
        """Writes one batch's late lines: their URL and event time."""
        from pyspark.sql import functions as F

        late_df.select(F.lit(batch_id).alias("batch"), "url", "time_ms").write.mode("overwrite").json(
            os.path.join(self.settings.late_dir, f"batch={batch_id:06d}")
        )

    def checkpointed(self, info: BatchInfo) -> None:
        """statekit's report that the batch's checkpoint is complete."""
        now = time.perf_counter()
        windows, malformed = self._pending.pop(info.batch_id, (0, 0))
        records = info.records + info.late_records  # late lines never reach the function
        stats = BatchStats(
            batch_id=info.batch_id,
            records=records,
            requests=records - malformed,
            malformed=malformed,
            urls_touched=0,
            seconds=now - self._last,
            checkpoint_id=info.checkpoint_id,
            checkpoint_location=info.location,
            restored_from=info.restored_from if info.restored_subtasks else None,
            started_from=info.restored_from,
            skipped=info.skipped,
            late=info.late_records,
            windows=windows,
            watermark=info.watermark,
        )
        self._last = now
        self.batches.append(stats)
        self.on_batch(stats)


def build_windowed_stream(
    spark: SparkSession, settings: WindowedSettings, sink: _WindowedSink
) -> ProcessedStream:
    """Defines the windowed streaming job (not started): text files -> parse -> windows -> sinks."""
    from statekit.spark import keyed

    lines = spark.readStream.option("maxFilesPerTrigger", settings.files_per_trigger).text(settings.logs_dir)
    parsed = lines.mapInArrow(parse_timed_batches, WINDOWED_PARSED_SCHEMA)
    stream = keyed(parsed, key="url", key_type=str).process(
        functools.partial(RequestsPerUrlPerWindow, settings.window),
        output_schema=WINDOWED_OUTPUT_SCHEMA,
        job_id=settings.job_id,
        on_batch=sink.checkpointed,
        event_time=settings.event_time,
    )
    return stream.foreach_batch(sink).foreach_late_batch(sink.late)


def run_windowed_job(
    spark: SparkSession,
    settings: WindowedSettings,
    *,
    on_batch: Callable[[BatchStats], None] = lambda stats: None,
    on_poll: Callable[[Any], None] = lambda query: None,
    poll_seconds: int = 1,
) -> RunReport:
    """Runs the windowed job over every log file not yet read, then stops (``availableNow``).

    As :func:`~statekit_urlcount.run_job`, and resumes the same way. Windows
    the watermark has not passed when the run stops stay in statekit's state
    (with their timers) and are emitted by a later run, once newer logs move
    the watermark past them. The report's ``state.malformed`` is the malformed
    total; ``late``, ``windows`` and ``watermark`` say what the run emitted.

    Raises:
        RuntimeError: If the query fails (malformed or late lines never make it fail).
    """
    return run_stream(
        spark,
        settings,
        _WindowedSink,
        build_windowed_stream,
        on_batch=on_batch,
        on_poll=on_poll,
        poll_seconds=poll_seconds,
    )


def read_output(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every JSON line under ``directory`` (e.g. ``settings.windows_dir``), batch by batch."""
    rows: list[dict[str, Any]] = []
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for name in sorted(names):
            if name.endswith(".json"):
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    rows.extend(json.loads(line) for line in f if line.strip())
    return rows
