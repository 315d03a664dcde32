"""Requests per URL per 1-minute tumbling event-time window on Spark: statekit against Spark, in one run.

One access log (``--records``, default 1M rows of ``url``, ``ts``) is
generated once, outside every timing, from a fixed seed: URLs drawn Zipf-like
(s=1.1) out of ``--urls``, event times spread evenly over ``--minutes`` with
up to ``--jitter`` of disorder, always less than the watermark delay, so no
row is ever late for any job (late-data rules differ in detail between the
engines; this keeps the comparison to the counting). The log is written as
``--files`` Parquet files with increasing modification times, so every job
reads the same files in the same micro-batches (``maxFilesPerTrigger``,
``availableNow`` trigger). One SparkSession ``local[2]`` is started once,
outside every timing, and each job is warmed up on a small log first. Jobs:

- statekit: ``WindowedAggregate(TumblingEventTimeWindows("1 minute"), Count())``
  with ``event_time=EventTime("ts", delay)`` through ``statekit.spark.keyed``,
  heap backend (``--backend`` for rocksdb or lmdb), filesystem checkpoints,
  ``spark.statekit.parallelism=2``;
- Spark's event-time windowed aggregation:
  ``withWatermark("ts", delay).groupBy(F.window("ts", "1 minute"), "url").count()``
  in append mode (Spark's default HDFS-backed state store);
- ``transformWithStateInPandas`` in ``EventTime`` mode (RocksDB state store):
  a ``MapState`` of window start to count per URL, an event-time timer at
  each window's last millisecond, ``handleExpiredTimer`` emits and clears the
  window.

End of input. All three emit a window once the watermark has passed its end,
and the watermark a micro-batch runs with comes from the event times of the
batches before it (Spark's rule; statekit's too). So the windows of the last
minutes would never be emitted by a bounded stream. To close them the same way
for every job, two one-row files follow the log, both with url ``__end__`` and
an event time a day after the log's last: the first moves the watermark past
every window of the log, the micro-batch of the second runs with that
watermark and emits them. The ``__end__`` rows are left out of the check.

Every job writes to a ``foreachBatch`` sink that fetches its rows as Arrow;
after the run, its ``(url, window start) -> count`` must equal the
generator's, window for window, or the benchmark stops. Timing runs from
``start()`` to the end of ``awaitTermination()``; records/s counts the log's
rows. ``shuffle.partitions=2`` for Spark's operators (two cores).

Run: ``python bench/bench_spark_windowed.py [--records N] [--backend heap|rocksdb|lmdb]``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from statekit_urlcount import local_spark_session

WINDOW_MS = 60_000
INPUT_SCHEMA = "url string, ts timestamp"
END_URL = "__end__"
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z, a window boundary
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


# --- the input -------------------------------------------------------------------------------


@dataclass
class Log:
    """A generated log: its directory and the true count per ``(url, window start)``."""

    path: str
    records: int
    truth: dict[tuple[str, int], int]


def generate(
    path: str, *, records: int, urls: int, minutes: int, jitter_ms: int, files: int, seed: int
) -> Log:
    """Writes ``files`` Parquet files (then the two ``__end__`` files) and returns the true counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    names = np.array([f"/api/v1/resource/{i}" for i in range(urls)], dtype=object)
    rng.shuffle(names)
    weights = 1.0 / np.arange(1, urls + 1) ** 1.1
    url_idx = rng.choice(urls, size=records, p=weights / weights.sum())
    # Even spread over the span, each row up to jitter_ms later: rows of a later file are never
    # below (largest event time so far - jitter), so with jitter < delay none is ever late.
    base = START_MS + (np.arange(records, dtype=np.int64) * (minutes * WINDOW_MS)) // max(records, 1)
    ts = base + rng.integers(0, jitter_ms + 1, size=records, dtype=np.int64)

    os.makedirs(path)
    bounds = np.linspace(0, records, files + 1).astype(np.int64)
    mtime = time.time() - 3600
    written = 0

    def write(url: np.ndarray, t: np.ndarray) -> None:
        nonlocal written
        f = os.path.join(path, f"part-{written:05d}.parquet")
        table = pa.table({"url": pa.array(url, pa.string()), "ts": pa.array(t, pa.timestamp("ms", tz="UTC"))})
        pq.write_table(table, f)
        os.utime(f, (mtime + written, mtime + written))  # the file source reads oldest first
        written += 1

    for lo, hi in itertools.pairwise(bounds.tolist()):
        write(names[url_idx[lo:hi]], ts[lo:hi])
    end = int(ts.max()) + 86_400_000
    write(np.array([END_URL], dtype=object), np.array([end]))
    write(np.array([END_URL], dtype=object), np.array([end + WINDOW_MS]))

    starts = ts - ts % WINDOW_MS
    keys, counts = np.unique(np.stack([url_idx, starts]), axis=1, return_counts=True)
    truth = {(str(names[u]), int(s)): int(c) for (u, s), c in zip(keys.T, counts)}
    return Log(path, records, truth)


# --- the sink ---------------------------------------------------------------------------------


class WindowSink:
    """``foreachBatch`` sink: fetches ``url, start (epoch ms), count`` of each batch as Arrow."""

    def __init__(self) -> None:
        self.tables: list[Any] = []
        self.batches = 0

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        self.batches += 1
        self.tables.append(batch_df.select("url", "start", "count").toArrow())

    def windows(self) -> dict[tuple[str, int], int]:
        """Every emitted ``(url, start) -> count`` but the ``__end__`` rows; a window twice is an error."""
        out: dict[tuple[str, int], int] = {}
        for t in self.tables:
            for url, start, count in zip(*(t.column(c).to_pylist() for c in ("url", "start", "count"))):
                if url == END_URL:
                    continue
                if (url, start) in out:
                    raise SystemExit(f"window ({url}, {start}) emitted twice")
                out[(url, int(start))] = int(count)
        return out


@dataclass
class Outcome:
    seconds: float
    batches: int
    windows: dict[tuple[str, int], int]


def _stream(spark: Any, log: str) -> Any:
    return spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1).parquet(log)


def _run(start: Callable[[], Any], sink: WindowSink) -> Outcome:
    t0 = time.perf_counter()
    query = start()
    query.awaitTermination()
    seconds = time.perf_counter() - t0
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    return Outcome(seconds, sink.batches, sink.windows())


def _start_writer(df: Any, sink: WindowSink, checkpoint: str, mode: str) -> Callable[[], Any]:
    return lambda: (
        df.writeStream.outputMode(mode)
        .foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )


# --- the jobs ---------------------------------------------------------------------------------


def windowed_count() -> Any:
    """The statekit job's function (one per subtask)."""
    from statekit.windows import Count, TumblingEventTimeWindows, WindowedAggregate

    return WindowedAggregate(TumblingEventTimeWindows("1 minute"), Count())


def run_statekit(spark: Any, log: str, work: str, delay: str, backend: str, ts_long: bool) -> Outcome:
    """statekit's WindowedAggregate through statekit.spark, filesystem checkpoints.

    With ``ts_long`` the event time reaches statekit as epoch ms (``unix_millis(ts)``) instead of
    the ``timestamp`` column, which spares the conversion of every row's timestamp to a datetime.
    """
    from pyspark.sql import functions as F

    from statekit import EventTime
    from statekit.spark import keyed

    spark.conf.set("spark.statekit.backend", backend)
    spark.conf.set("spark.statekit.checkpoint.storage", "filesystem")
    spark.conf.set("spark.statekit.checkpoints.dir", os.path.join(work, "statekit-checkpoints"))
    sink = WindowSink()
    df = _stream(spark, log)
    if ts_long:
        df = df.select("url", F.unix_millis("ts").alias("ts"))
    stream = (
        keyed(df, "url")
        .process(
            windowed_count,
            "url string, start long, end long, count long",
            job_id="bench-windowed",
            event_time=EventTime("ts", delay),
        )
        .foreach_batch(sink)
    )
    return _run(
        lambda: stream.start(
            checkpoint_location=os.path.join(work, "spark-checkpoint"), trigger={"availableNow": True}
        ),
        sink,
    )


def run_spark_window(spark: Any, log: str, work: str, delay: str) -> Outcome:
    """Spark's ``withWatermark + groupBy(window, url).count()``, append mode."""
    from pyspark.sql import functions as F

    sink = WindowSink()
    counts = (
        _stream(spark, log)
        .withWatermark("ts", delay)
        .groupBy(F.window("ts", "1 minute"), "url")
        .count()
        .select("url", F.unix_millis("window.start").alias("start"), "count")
    )
    return _run(_start_writer(counts, sink, os.path.join(work, "spark-checkpoint"), "append"), sink)


def has_transform_with_state_in_pandas() -> bool:
    from pyspark.sql.group import GroupedData

    return hasattr(GroupedData, "transformWithStateInPandas")


def run_transform_with_state(spark: Any, log: str, work: str, delay: str) -> Outcome:
    """``transformWithStateInPandas``, event-time timers at window ends, RocksDB state store."""
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

    class WindowCount(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.handle = handle
            self.windows = handle.getMapState("windows", "start long", "count long")

        def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Any:
            ts = pd.concat(list(rows))["ts"]
            ms = ts.values.astype("datetime64[ms]").astype("int64")
            starts, counts = np.unique(ms - ms % WINDOW_MS, return_counts=True)
            for start, n in zip(starts.tolist(), counts.tolist()):
                old = self.windows.getValue((start,))
                if old is None:
                    self.handle.registerTimer(start + WINDOW_MS - 1)
                    self.windows.updateValue((start,), (n,))
                else:
                    self.windows.updateValue((start,), (old[0] + n,))
            return iter(())

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Any:
            start = expiredTimerInfo.getExpiryTimeInMs() + 1 - WINDOW_MS
            value = self.windows.getValue((start,))
            if value is None:
                return
            self.windows.removeKey((start,))
            yield pd.DataFrame({"url": [key[0]], "start": [start], "count": [value[0]]})

        def close(self) -> None:
            pass

    sink = WindowSink()
    out = (
        _stream(spark, log)
        .withWatermark("ts", delay)
        .groupBy("url")
        .transformWithStateInPandas(
            WindowCount(), "url string, start long, count long", "Append", "EventTime"
        )
    )
    return _run(_start_writer(out, sink, os.path.join(work, "spark-checkpoint"), "append"), sink)


# --- the run ----------------------------------------------------------------------------------


LABELS = {
    "statekit": "statekit WindowedAggregate (statekit.spark, {backend} backend{ts})",
    "window": "Spark withWatermark + groupBy(window, url).count(), append (HDFS state store)",
    "tws": "transformWithStateInPandas, EventTime timers (RocksDB state store)",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000, help="log rows (default 1M)")
    ap.add_argument("--urls", type=int, default=1000, help="URL space (default 1000)")
    ap.add_argument("--minutes", type=int, default=100, help="event-time span of the log (default 100)")
    ap.add_argument("--files", type=int, default=10, help="files = micro-batches of the log (default 10)")
    ap.add_argument("--delay", default="10 seconds", help="watermark delay of every job")
    ap.add_argument("--jitter-ms", type=int, default=5000, help="event-time disorder, below the delay")
    ap.add_argument("--backend", default="heap", choices=("heap", "rocksdb", "lmdb"), help="statekit's")
    ap.add_argument("--statekit-parallelism", type=int, default=2)
    ap.add_argument(
        "--statekit-ts",
        choices=("timestamp", "long"),
        default="timestamp",
        help="the event-time column statekit gets: the timestamp (default) or unix_millis(ts) as a long",
    )
    ap.add_argument("--only", action="append", choices=tuple(LABELS))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up runs")
    ap.add_argument("--workdir", help="where logs and checkpoints go (default: a temporary directory)")
    args = ap.parse_args(argv)
    from statekit.timers import parse_duration_ms

    if args.jitter_ms >= parse_duration_ms(args.delay):
        ap.error("--jitter-ms must be below the delay, or rows would be late")

    work = args.workdir or tempfile.mkdtemp(prefix="statekit-bench-windowed-")
    logs, warm = os.path.join(work, "log"), os.path.join(work, "warmup-log")
    for d in (logs, warm):
        shutil.rmtree(d, ignore_errors=True)
    print(f"generating {args.records:,} rows in {args.files} files under {logs} ...", flush=True)
    gen = dict(urls=args.urls, jitter_ms=args.jitter_ms)
    log = generate(logs, records=args.records, minutes=args.minutes, files=args.files, seed=args.seed, **gen)
    warm_log = generate(warm, records=20_000, minutes=10, files=2, seed=args.seed + 1, **gen)

    spark = local_spark_session(
        "statekit-bench-windowed",
        conf={"spark.statekit.parallelism": str(args.statekit_parallelism), "spark.driver.memory": "4g"},
    )
    only = list(dict.fromkeys(args.only or LABELS))
    if "tws" in only and not has_transform_with_state_in_pandas():
        print(f"PySpark {spark.version} has no transformWithStateInPandas: that job is left out", flush=True)
        only.remove("tws")
    ts_note = ", ts as epoch-ms long" if args.statekit_ts == "long" else ""
    labels = {n: LABELS[n].format(backend=args.backend, ts=ts_note) for n in only}
    print(
        f"Spark {spark.version}, {spark.sparkContext.master}; {args.files} files + 2 end-of-input files, "
        f"one file per micro-batch; delay {args.delay}; statekit parallelism {args.statekit_parallelism}",
        flush=True,
    )

    def run(name: str, log_dir: str, tag: str) -> Outcome:
        d = os.path.join(work, f"{name}-{tag}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        spark.conf.set("spark.sql.shuffle.partitions", "2")
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB if name == "tws" else HDFS)
        if name == "statekit":
            return run_statekit(spark, log_dir, d, args.delay, args.backend, args.statekit_ts == "long")
        if name == "window":
            return run_spark_window(spark, log_dir, d, args.delay)
        return run_transform_with_state(spark, log_dir, d, args.delay)

    def check(name: str, outcome: Outcome, truth: dict[tuple[str, int], int]) -> None:
        if outcome.windows != truth:
            missing = len(set(truth) - set(outcome.windows))
            extra = len(set(outcome.windows) - set(truth))
            wrong = sum(1 for k, v in outcome.windows.items() if k in truth and truth[k] != v)
            raise SystemExit(
                f"{name}: windows differ from the generator's: {missing} missing, {extra} extra, "
                f"{wrong} with another count (of {len(truth)})"
            )

    if not args.no_warmup:
        for name in only:
            print(f"warm-up: {labels[name]} ...", flush=True)
            check(name, run(name, warm_log.path, "warmup"), warm_log.truth)
    results: dict[str, Outcome] = {}
    for name in only:
        print(f"timing: {labels[name]} ...", flush=True)
        outcome = run(name, log.path, "timed")
        check(name, outcome, log.truth)
        results[name] = outcome
        print(
            f"  {outcome.seconds:8.2f} s  {log.records / outcome.seconds:>10,.0f} records/s  "
            f"({outcome.batches} batches, {len(outcome.windows):,} windows, counts exact)",
            flush=True,
        )
    spark.stop()

    print()
    print(
        f"{log.records:,} records, {args.urls:,} URLs, {args.minutes} one-minute windows, "
        f"{len(log.truth):,} (url, window) results; one SparkSession local[2], start-up excluded; "
        "every job emitted exactly the generator's counts"
    )
    print(f"  {'job':<82}{'seconds':>9}{'records/s':>12}")
    for name, o in results.items():
        print(f"  {labels[name]:<82}{o.seconds:>9.2f}{log.records / o.seconds:>12,.0f}")
    if "statekit" in results:
        sk = results["statekit"].seconds
        for name, o in results.items():
            if name != "statekit":
                print(f"  statekit / {name}: {o.seconds / sk:.2f}x")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
