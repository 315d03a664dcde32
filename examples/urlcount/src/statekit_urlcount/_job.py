"""The URL-count job on Spark: text files in, counts and dead letters out, state in statekit.

The pipeline, one streaming query::

    read_logs(logs, parse=parse_request)        url | request | time_ms; a malformed line is a bad
                                                record, dead-lettered by statekit's policy into
                                                output/dead-letter/ (file, offset, line, raw, error)
      keyed(key="url").process(CountPerUrl)     statekit state, checkpointed per batch
      .foreach_batch(sink)                      output/counts/batch=N

:func:`statekit.spark.read_logs` follows the log files as they grow and
rotate (Spark's own file source reads a file once, when it appears, and would
miss the lines appended to a growing ``access.log``). Everything a run needs
lives under one state directory: Spark's checkpoint (the source's offsets),
statekit's checkpoints (the counts), and the output. A second run with the
same directory resumes where the first stopped.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from statekit import default_registry
from statekit.backend_api import CheckpointStorage
from statekit.checkpointing import load_checkpoint
from statekit.state_processor import SavepointReader

from ._function import COUNT_STATE, OUTPUT_SCHEMA, CountPerUrl, CountPerUrlVectorized
from ._parse import MALFORMED_KEY, AccessRecord, parse_line, parse_request

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame, SparkSession

    from statekit.spark import BatchInfo, ProcessedStream

__all__ = [
    "PARSED_SCHEMA",
    "BatchStats",
    "JobSettings",
    "RunReport",
    "Sink",
    "StateSummary",
    "build_stream",
    "checkpoint_info",
    "dead_letters",
    "parse_batches",
    "read_state",
    "run_job",
    "run_stream",
    "statekit_conf",
]


class _BatchSink(Protocol):
    batches: list[BatchStats]


S = TypeVar("S", bound="JobSettings")
K = TypeVar("K", bound=_BatchSink)

#: The schema :func:`parse_batches` produces from Spark's text source.
PARSED_SCHEMA = "url string, reason string, line string"

#: The records :func:`~statekit_urlcount.parse_request` makes of a line, as the job reads them.
REQUEST_SCHEMA = "url string, request string, time_ms long"


@dataclass(frozen=True)
class JobSettings:
    """Where a run reads and writes, and how statekit is configured.

    The defaults are the embedded ones: the heap backend and filesystem
    checkpoints in a local directory.

    Attributes:
        logs_dir: The directory of log files the stream reads (new files are picked up).
        state_dir: Holds Spark's checkpoint, statekit's checkpoints and, unless
            ``output_dir`` says otherwise, the output.
        output_dir: Where counts and dead letters go; default ``<state_dir>/output``.
        job_id: statekit's job id (its checkpoints' folder name).
        files_per_trigger: Log files per micro-batch of the windowed job (Spark's
            ``maxFilesPerTrigger``: it reads through Spark's text source); the count
            job reads through ``read_logs`` and ignores it, see ``lines_per_trigger``.
        parallelism: statekit subtasks (``spark.statekit.parallelism``).
        backend: ``spark.statekit.backend``.
        vectorized: Run :class:`CountPerUrlVectorized` (a key's lines of a
            micro-batch at once) instead of the per-record function; the
            outputs and state are the same.
        lines_per_trigger: Lines per micro-batch of the count job at most (None: all there are).
    """

    logs_dir: str
    state_dir: str
    output_dir: str | None = None
    job_id: str = "urlcount"
    files_per_trigger: int = 1
    parallelism: int = 2
    backend: str = "heap"
    vectorized: bool = False
    lines_per_trigger: int | None = None

    @property
    def spark_checkpoint(self) -> str:
        """Spark's checkpoint of the query: which files were read, which batch is next."""
        return os.path.join(self.state_dir, "spark-checkpoint")

    @property
    def statekit_checkpoints(self) -> str:
        """statekit's checkpoints directory (``spark.statekit.checkpoints.dir``)."""
        return os.path.join(self.state_dir, "statekit-checkpoints")

    @property
    def counts_dir(self) -> str:
        """Per micro-batch, the latest count of every URL the batch touched (JSON lines)."""
        return os.path.join(self.output_dir or os.path.join(self.state_dir, "output"), "counts")

    @property
    def dead_letter_dir(self) -> str:
        """Every malformed line, as statekit's dead letters (JSON lines: file, offset, line, raw, error)."""
        return os.path.join(self.output_dir or os.path.join(self.state_dir, "output"), "dead-letter")


def statekit_conf(settings: JobSettings) -> dict[str, str]:
    """The Spark configuration that gives statekit its backend, storage and parallelism."""
    return {
        "spark.statekit.backend": settings.backend,
        "spark.statekit.checkpoint.storage": "filesystem",
        "spark.statekit.checkpoints.dir": os.path.abspath(settings.statekit_checkpoints),
        "spark.statekit.parallelism": str(settings.parallelism),
    }


def parse_batches(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: Spark text rows (``value``) to :data:`PARSED_SCHEMA` rows.

    A request becomes ``(url, None, None)``; a malformed line becomes
    ``(MALFORMED_KEY, reason, line)``, so it is counted and dead-lettered by
    the keyed function rather than dropped. Never raises on bad input.
    """
    import pyarrow as pa

    for batch in batches:
        urls: list[str] = []
        reasons: list[str | None] = []
        lines: list[str | None] = []
        for value in batch.column(0).to_pylist():
            parsed = parse_line(value or "")
            if isinstance(parsed, AccessRecord):
                urls.append(parsed.url)
                reasons.append(None)
                lines.append(None)
            else:
                urls.append(MALFORMED_KEY)
                reasons.append(parsed.reason)
                lines.append(parsed.line)
        yield pa.RecordBatch.from_arrays(
            [pa.array(urls, pa.string()), pa.array(reasons, pa.string()), pa.array(lines, pa.string())],
            names=["url", "reason", "line"],
        )


@dataclass(frozen=True)
class BatchStats:
    """What one micro-batch did: its lines, as the sink saw them, and the checkpoint it completed.

    Attributes:
        batch_id: Spark's micro-batch id.
        records: Lines in the batch.
        requests: Valid requests among them.
        malformed: Malformed lines among them (all written to the dead-letter output).
        urls_touched: Distinct URLs in the batch.
        seconds: Wall time since the previous batch completed (or the run started).
        checkpoint_id: The statekit checkpoint holding the state after this batch.
        checkpoint_location: Where it is.
        restored_from: The checkpoint statekit's subtasks started this batch from,
            if they were restored from storage rather than kept in memory.
        started_from: The checkpoint this batch's state started from, restored or kept
            open by the executors (a restarted query reuses open state that is exactly it).
        skipped: The batch had been completed before a restart (nothing was redone).
        late: The windowed job's late lines (event time at or below the watermark the
            batch ran with), counted among ``requests`` and written to the late output.
        windows: The windowed job's windows emitted (the watermark passed their end).
        watermark: The windowed job's watermark for the next batch, in epoch ms.
        state_entries: statekit's state entries after the batch (None: skipped batch).
        state_entries_exact: False when the backend's native snapshot only estimates them.
        checkpoint_bytes: Bytes the batch's checkpoint wrote.
        checkpoint_seconds: How long the checkpoint took.
        input_lost: The log source's reports of lines it could not read (see
            docs/operations.md, "What is reported").
    """

    batch_id: int
    records: int
    requests: int
    malformed: int
    urls_touched: int
    seconds: float
    checkpoint_id: int | None = None
    checkpoint_location: str | None = None
    restored_from: str | None = None
    started_from: str | None = None
    skipped: bool = False
    late: int = 0
    windows: int = 0
    watermark: int | None = None
    state_entries: int | None = None
    state_entries_exact: bool = True
    checkpoint_bytes: int = 0
    checkpoint_seconds: float = 0.0
    input_lost: list[str] = field(default_factory=list)


@dataclass
class StateSummary:
    """The job's statekit state, read back from its latest checkpoint.

    Attributes:
        location: The checkpoint read (None when there is none yet).
        checkpoint_id: Its id.
        counts: Requests per URL so far.
        malformed: Malformed lines so far (the reserved key's count).
        entries: Keyed state entries, as the checkpoint's metadata records them.
        timestamp_ms: When the checkpoint was taken.
    """

    location: str | None = None
    checkpoint_id: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    malformed: int = 0
    entries: int = 0
    timestamp_ms: int = 0

    def top(self, n: int) -> list[tuple[str, int]]:
        """The ``n`` most requested URLs, most first (ties by URL)."""
        return sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


@dataclass
class RunReport:
    """What :func:`run_job` did."""

    batches: list[BatchStats] = field(default_factory=list)
    seconds: float = 0.0
    state: StateSummary = field(default_factory=StateSummary)

    @property
    def restored_from(self) -> str | None:
        """The statekit checkpoint this run's first batch started from (None: empty state)."""
        for b in self.batches:
            if not b.skipped:
                return b.started_from
        return None

    @property
    def resumed(self) -> bool:
        """Whether this run continued from the state of a previous one."""
        return self.restored_from is not None

    @property
    def records(self) -> int:
        """Lines read in this run."""
        return sum(b.records for b in self.batches)

    @property
    def malformed(self) -> int:
        """Malformed lines met in this run."""
        return sum(b.malformed for b in self.batches)

    @property
    def late(self) -> int:
        """Late lines met in this run (the windowed job)."""
        return sum(b.late for b in self.batches)

    @property
    def windows(self) -> int:
        """Windows emitted in this run (the windowed job)."""
        return sum(b.windows for b in self.batches)

    @property
    def watermark(self) -> int | None:
        """The watermark after the run's last batch (the windowed job), in epoch ms."""
        for b in reversed(self.batches):
            if b.watermark is not None:
                return b.watermark
        return None


def checkpoint_storage(settings: JobSettings) -> CheckpointStorage:
    """The filesystem checkpoint storage the job's statekit checkpoints are in."""
    storage: CheckpointStorage = default_registry().create_storage(
        "filesystem", {"checkpoints-dir": os.path.abspath(settings.statekit_checkpoints)}
    )
    return storage


def checkpoint_info(settings: JobSettings, storage: CheckpointStorage | None = None) -> StateSummary:
    """The latest checkpoint's location, id, time and entry count, without reading the state itself."""
    storage = storage or checkpoint_storage(settings)
    location = storage.latest_checkpoint(settings.job_id)
    if location is None:
        return StateSummary()
    meta = load_checkpoint(storage, location).metadata
    entries = sum(int((st.keyed or {}).get("entries", 0)) for sts in meta.operators.values() for st in sts)
    return StateSummary(location, meta.checkpoint_id, entries=entries, timestamp_ms=meta.timestamp_ms)


def read_state(settings: JobSettings) -> StateSummary:
    """Every URL's count and the malformed total, from the latest statekit checkpoint.

    Read as data with :class:`~statekit.state_processor.SavepointReader`: a
    canonical checkpoint without any backend, a native one (RocksDB's) through
    the backend that wrote it. This is exactly what the next run resumes from.
    """
    storage = checkpoint_storage(settings)
    summary = checkpoint_info(settings, storage)
    if summary.location is None:
        return summary
    counts: dict[str, int] = {}
    with SavepointReader.open(summary.location, storage=storage) as reader:
        for op in reader.operators():
            if any(s.name == COUNT_STATE.name for s in op.states):
                for batch in reader.read(op.id, COUNT_STATE.name):
                    counts.update(zip(batch.column("key").to_pylist(), batch.column("value").to_pylist()))
    summary.entries = len(counts)
    # Older runs counted malformed lines under a reserved key; they are dead letters now.
    summary.malformed = counts.pop(MALFORMED_KEY, 0) + len(dead_letters(settings.dead_letter_dir))
    summary.counts = counts
    return summary


def dead_letters(directory: str) -> list[str]:
    """The dead-letter lines under ``directory`` (files of statekit's log source), none if it is absent."""
    out: list[str] = []
    if os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            if name.endswith(".json") and not name.startswith("."):
                with open(os.path.join(directory, name), encoding="utf-8") as f:
                    out += f.read().splitlines()
    return out


class Sink:
    """The ``foreach_batch`` callback and ``on_batch`` listener of one run.

    The sink writes counts, idempotently per batch id (the log source has
    written the batch's dead letters by then, one file per range it read);
    statekit then completes the batch's checkpoint and reports it, and the
    batch's :class:`BatchStats` go to ``on_batch``.
    """

    def __init__(self, settings: JobSettings, on_batch: Callable[[BatchStats], None]) -> None:
        self.settings = settings
        self.on_batch = on_batch
        self.batches: list[BatchStats] = []
        self._pending: dict[int, tuple[int, int, int]] = {}
        self._last = time.perf_counter()
        self._letters = _letter_files(settings.dead_letter_dir)

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        """Writes one batch's outputs."""
        from pyspark.sql import functions as F

        # statekit.spark hands the sink a cached batch (its processing ran once, before the sink),
        # so the actions below read the cache and never process a record twice.
        # A retried batch id overwrites its own folders: the output is exactly once per batch.
        name = f"batch={batch_id:06d}"
        per_url = (
            batch_df.where(F.col("url").isNotNull())
            .groupBy("url")
            .agg(F.max("count").alias("count"), F.count(F.lit(1)).alias("requests"))
        )
        per_url.write.mode("overwrite").json(os.path.join(self.settings.counts_dir, name))
        # The batch's dead letters are the files the source wrote since the last batch
        # (a replayed batch rewrites its own, which this run has not seen).
        files = _letter_files(self.settings.dead_letter_dir)
        malformed = sum(_count_lines(p) for p in sorted(files - self._letters))
        self._letters = files
        row = batch_df.agg(F.count(F.lit(1)).alias("requests"), F.countDistinct("url").alias("urls")).first()
        if row is not None:
            requests = int(row["requests"])
            self._pending[batch_id] = (requests + malformed, requests, int(row["urls"]))

    def checkpointed(self, info: BatchInfo) -> None:
        """statekit's report that the batch's checkpoint is complete."""
        now = time.perf_counter()
        records, requests, urls = self._pending.pop(info.batch_id, (0, 0, 0))
        stats = BatchStats(
            batch_id=info.batch_id,
            records=records,
            requests=requests,
            malformed=records - requests,
            urls_touched=urls,
            seconds=now - self._last,
            checkpoint_id=info.checkpoint_id,
            checkpoint_location=info.location,
            restored_from=info.restored_from if info.restored_subtasks else None,
            started_from=info.restored_from,
            skipped=info.skipped,
            input_lost=list(info.input_lost),
            **_checkpoint_numbers(info),
        )
        self._last = now
        self.batches.append(stats)
        self.on_batch(stats)


def _checkpoint_numbers(info: BatchInfo) -> dict[str, Any]:
    """What :class:`BatchStats` keeps of the batch's checkpoint (nothing for a skipped batch)."""
    cs = info.checkpoint_stats
    if cs is None:
        return {}
    return {
        "state_entries": cs.state_entries,
        "state_entries_exact": cs.state_entries_exact,
        "checkpoint_bytes": cs.bytes_written,
        "checkpoint_seconds": info.checkpoint_seconds,
    }


def build_stream(spark: SparkSession, settings: JobSettings, sink: Sink) -> ProcessedStream:
    """Defines the streaming job (not started): log files -> parse -> statekit -> sink.

    Malformed lines are bad records of the log source, skipped into
    :attr:`JobSettings.dead_letter_dir` by ``statekit.bad-records.policy=dead-letter``.
    """
    from statekit.spark import keyed, read_logs

    requests = read_logs(
        spark,
        settings.logs_dir,
        parse=parse_request,
        schema=REQUEST_SCHEMA,
        max_lines_per_trigger=settings.lines_per_trigger,
        job_id=settings.job_id,
        key="url",  # parse_request refuses a line without one already; a null key would be one here
        config={
            "statekit.bad-records.policy": "dead-letter",
            "statekit.bad-records.dead-letter-path": os.path.abspath(settings.dead_letter_dir),
        },
    )
    stream = keyed(requests, key="url", key_type=str).process(
        CountPerUrlVectorized if settings.vectorized else CountPerUrl,
        output_schema=OUTPUT_SCHEMA,
        job_id=settings.job_id,
        on_batch=sink.checkpointed,
    )
    return stream.foreach_batch(sink)


def run_job(
    spark: SparkSession,
    settings: JobSettings,
    *,
    on_batch: Callable[[BatchStats], None] = lambda stats: None,
    on_poll: Callable[[Any], None] = lambda query: None,
    poll_seconds: int = 1,
) -> RunReport:
    """Runs the job over every log file not yet read, then stops (``availableNow``).

    ``on_batch`` is called after each micro-batch's output is written and its
    checkpoint completed; ``on_poll`` every ``poll_seconds`` with the running
    query (for a live display). A run whose state directory holds checkpoints
    resumes from them: Spark's file source skips the files it read, statekit
    restores the state of its last completed checkpoint.

    Raises:
        RuntimeError: If the query fails (malformed lines never make it fail).
    """
    return run_stream(
        spark,
        settings,
        Sink,
        build_stream,
        on_batch=on_batch,
        on_poll=on_poll,
        poll_seconds=poll_seconds,
    )


def run_stream(
    spark: SparkSession,
    settings: S,
    make_sink: Callable[[S, Callable[[BatchStats], None]], K],
    build: Callable[[SparkSession, S, K], ProcessedStream],
    *,
    on_batch: Callable[[BatchStats], None],
    on_poll: Callable[[Any], None],
    poll_seconds: int,
) -> RunReport:
    """Runs a job's query ``availableNow``: what :func:`run_job` and the windowed job share.

    Paths are made absolute first: Spark resolves a relative one against the
    working directory its JVM started in, which need not be this process's now.
    """
    settings = dataclasses.replace(
        settings,
        logs_dir=os.path.abspath(settings.logs_dir),
        state_dir=os.path.abspath(settings.state_dir),
        output_dir=None if settings.output_dir is None else os.path.abspath(settings.output_dir),
    )
    for key, value in statekit_conf(settings).items():
        spark.conf.set(key, value)
    os.makedirs(settings.state_dir, exist_ok=True)
    lock = threading.Lock()

    def guarded(stats: BatchStats) -> None:
        with lock:
            on_batch(stats)

    sink = make_sink(settings, guarded)
    t0 = time.perf_counter()
    query = build(spark, settings, sink).start(
        checkpoint_location=os.path.abspath(settings.spark_checkpoint), trigger={"availableNow": True}
    )
    try:
        while not query.awaitTermination(poll_seconds):
            with lock:
                on_poll(query)
    except Exception as exc:  # StreamingQueryException: say which job, keep Spark's message
        raise RuntimeError(f"the URL-count query ({settings.job_id}) failed: {exc}") from exc
    finally:
        if query.isActive:
            query.stop()
    return RunReport(sink.batches, time.perf_counter() - t0, read_state(settings))


def _letter_files(directory: str) -> set[str]:
    if not os.path.isdir(directory):
        return set()
    names = os.listdir(directory)
    return {os.path.join(directory, n) for n in names if n.endswith(".json") and not n.startswith(".")}


def _count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)
