"""statekit's URL count on Spark against Spark's own stateful operators, in one run.

One access log (``--records``, default 1M lines, Zipf-like URLs, no malformed
lines) is generated once, outside every timing; one SparkSession ``local[2]``
is started once, outside every timing, and warmed up on a small log. Then, on
the same directory:

- statekit: ``keyed(df, key="url").process(CountPerUrl)`` through
  :mod:`statekit.spark`, heap backend, filesystem checkpoints;
- statekit vectorized: the same with ``CountPerUrlVectorized`` (a
  ``KeyedBatchFunction``: one call per URL and micro-batch);
- statekit columns: the same with ``CountPerUrlColumns`` (a
  ``KeyedColumnsFunction``: one call per Arrow batch of a subtask's rows, the counts
  in one ``update_batch``);
- the streaming floor: the same stream, micro-batches and sink without any
  state (each row becomes ``(url, 1)``), what every streaming query pays here;
- ``applyInPandasWithState`` with a counting function (Spark's default HDFS
  state store provider);
- ``transformWithStateInPandas`` with a ``ValueState``, RocksDB state store
  provider;
- the ceiling: Spark's stateless batch ``read.json(dir).groupBy("url").count()``.

``--rounds N --entry-counts`` measures what exact ``state_entries`` cost: the
per-record statekit job on the rocksdb backend with
``spark.statekit.metrics.exact-entries`` true (exact) and false (estimate),
beside the floors, in one session, the order reversed every other round and
the pair run A B B A within each round (each runs first and second once); it
prints the ratio of the two medians and each round's ratio.

The three stateful jobs are streaming queries over the same file source with
``maxFilesPerTrigger`` (same files, same micro-batches) and the
``availableNow`` trigger, writing through the same ``foreachBatch`` sink. Each
emits what the URL-count job emits: for every request, its URL's count so
far (``--baseline-output per-key`` lets the Spark baselines emit only the last
count per URL and micro-batch, which is less work for them). Every run is
checked against the generator's per-URL counts before its rate is reported.

Parallelism is the same everywhere: two cores, ``spark.sql.shuffle.partitions=2``
for Spark's operators, ``spark.statekit.parallelism=2`` for statekit
(``--shuffle-partitions 2,200`` also runs Spark's jobs with Spark's default).
``--repeats N`` keeps the best of N runs of each (a shared machine is noisy).
``--cpu`` prints each streaming run's CPU seconds by process group: the JVM
(with its JIT compiler threads apart: in a fresh JVM they take 1-4 s of a
run's CPU for several rounds, whichever job runs first after the warm-up
paying most), the Python workers and the driver's Python. CPU moves far less
than wall time with the machine's load, and says which side of a gap is whose.

Run: ``python bench/bench_spark_urlcount.py [--records N]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from statekit_urlcount import generate_logs, local_spark_session

SCHEMA = "`@timestamp` string, remote_addr string, request string, url string"
OUTPUT_SCHEMA = "url string, count long"


@dataclass
class Outcome:
    """What one timed run produced: its seconds, rows emitted and what they add up to.

    ``counts`` is the final count per URL (when the sink keeps it); ``checksum``
    is ``(sum of counts, sum of squared counts, highest count)`` over every row
    emitted, which for a count-per-request output is fixed by the final counts.
    """

    seconds: float
    counts: dict[str, int] = field(default_factory=dict)
    rows: int = 0
    batches: int = 0
    checksum: tuple[int, int, int] | None = None
    cpu: dict[str, float] | None = None  # --cpu: CPU seconds of the run per process group


# --- CPU per process group (--cpu) -------------------------------------------------------------

#: Set by --cpu: each timed run also measures the CPU time of this process's descendants.
MEASURE_CPU = False

#: HotSpot's names for its JIT compiler threads (C1, C2), as Linux shows them (15 characters).
_JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")


def _stat(path: str) -> tuple[str, list[str]] | None:
    """A ``/proc/.../stat`` file's command name and its fields after it; None if it is gone."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    close = text.rindex(")")
    return text[text.index("(") + 1 : close], text[close + 2 :].split()


def cpu_now() -> dict[str, float]:
    """CPU seconds so far of the driver's Python, its JVM (the JIT's threads apart) and its Python workers.

    Read from Linux's ``/proc`` for every descendant of this process: the JVM
    is the ``java`` one; every other is Spark's Python daemon or one of its
    workers, whose CPU counts with that of the children it has reaped.
    """
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    stats: dict[int, tuple[str, list[str]]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(f"/proc/{name}/stat")) is not None:
            stats[int(name)] = st
            parent[int(name)] = int(st[1][1])
    mine, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        kids = [p for p, pp in parent.items() if pp == pid and p not in mine]
        mine.update(kids)
        todo.extend(kids)
    out = {"driver Python": sum(os.times()[:2]), "JVM": 0.0, "JIT": 0.0, "Python workers": 0.0}
    for pid in mine:
        comm, f = stats[pid]
        if comm == "java":
            out["JVM"] += (int(f[11]) + int(f[12])) / tick
            for tid in os.listdir(f"/proc/{pid}/task"):
                st = _stat(f"/proc/{pid}/task/{tid}/stat")
                if st is not None and st[0] in _JIT_THREADS:
                    out["JIT"] += (int(st[1][11]) + int(st[1][12])) / tick
        else:
            out["Python workers"] += sum(int(x) for x in f[11:15]) / tick
    return out


def _cpu_text(cpu: dict[str, float]) -> str:
    return (
        f"CPU s: JVM {cpu['JVM']:.2f} (its JIT compilers {cpu['JIT']:.2f}), Python workers "
        f"{cpu['Python workers']:.2f}, driver Python {cpu['driver Python']:.2f}"
    )


def expected_checksum(truth: dict[str, int]) -> tuple[int, int, int]:
    """The checksum of a count-per-request output: URL ``u`` emits 1, 2, ..., ``truth[u]``."""
    return (
        sum(n * (n + 1) // 2 for n in truth.values()),
        sum(n * (n + 1) * (2 * n + 1) // 6 for n in truth.values()),
        max(truth.values(), default=0),
    )


def _partial_max(batches: Iterator[Any]) -> Iterator[Any]:
    """Per URL, the highest count and the number of rows in one partition (vectorized, no shuffle)."""
    import pyarrow as pa

    tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
    if not tables:
        return
    agg = pa.concat_tables(tables).group_by("url").aggregate([("count", "max"), ("count", "count")])
    yield from agg.rename_columns(["url", "c", "n"]).to_batches()


class CountingSink:
    """The ``foreachBatch`` sink every method writes to: one Spark action per batch, no shuffle.

    For count-per-request output it adds up rows, counts, squared counts and
    the highest count in the JVM (a global aggregate; enough to check every
    URL's final count, see :func:`expected_checksum`). With ``per_url`` (the
    baselines' ``per-key`` output) it keeps each URL's highest count instead,
    from partial aggregates per partition merged here.
    """

    def __init__(self, per_url: bool = False) -> None:
        self.per_url = per_url
        self.counts: dict[str, int] = {}
        self.rows = 0
        self.batches = 0
        self.sums = [0, 0, 0]

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        self.batches += 1
        if self.per_url:
            for url, c, n in batch_df.mapInArrow(_partial_max, "url string, c long, n long").collect():
                self.rows += n
                if c > self.counts.get(url, 0):
                    self.counts[url] = c
            return
        count = F.col("count").cast("decimal(38,0)")
        r = batch_df.agg(
            F.count(F.lit(1)).alias("n"), F.sum(count).alias("s"), F.sum(count * count).alias("q"),
            F.max("count").alias("m"),
        ).first()  # fmt: skip
        if r is not None and r["n"]:
            self.rows += int(r["n"])
            self.sums[0] += int(r["s"])
            self.sums[1] += int(r["q"])
            self.sums[2] = max(self.sums[2], int(r["m"]))

    def outcome(self, seconds: float) -> Outcome:
        """What the sink saw, with the run's duration."""
        checksum = None if self.per_url else (self.sums[0], self.sums[1], self.sums[2])
        return Outcome(seconds, self.counts, self.rows, self.batches, checksum)


# --- the stateful jobs ---------------------------------------------------------------------


def _stream(spark: Any, logs: str, files_per_trigger: int) -> Any:
    return (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", files_per_trigger)
        .json(logs)
        .select("url")
    )


def _run_query(writer_start: Callable[[], Any], sink: CountingSink) -> Outcome:
    before = cpu_now() if MEASURE_CPU else None
    t0 = time.perf_counter()
    query = writer_start()
    query.awaitTermination()
    seconds = time.perf_counter() - t0
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    outcome = sink.outcome(seconds)
    if before is not None:
        after = cpu_now()
        outcome.cpu = {k: after[k] - before[k] for k in after}
    return outcome


def run_statekit(
    spark: Any,
    logs: str,
    work: str,
    files_per_trigger: int,
    infos: list[Any] | None = None,
    form: str = "statekit",
    backend: str = "heap",
    exact_entries: bool = True,
) -> Outcome:
    """statekit's CountPerUrl (``form`` vectorized: CountPerUrlVectorized, columns: CountPerUrlColumns).

    On statekit.spark, filesystem checkpoints.

    ``backend`` (heap) and ``exact_entries`` (``spark.statekit.metrics.exact-entries``) are the job's.
    """
    from statekit.spark import keyed
    from statekit_urlcount import CountPerUrl, CountPerUrlColumns, CountPerUrlVectorized

    spark.conf.set("spark.statekit.backend", backend)
    spark.conf.set("spark.statekit.metrics.exact-entries", str(exact_entries).lower())
    spark.conf.set("spark.statekit.checkpoint.storage", "filesystem")
    spark.conf.set("spark.statekit.checkpoints.dir", os.path.join(work, "statekit-checkpoints"))
    sink = CountingSink()
    stream = keyed(_stream(spark, logs, files_per_trigger), key="url", key_type=str).process(
        {"vectorized": CountPerUrlVectorized, "columns": CountPerUrlColumns}.get(form, CountPerUrl),
        output_schema=OUTPUT_SCHEMA,
        job_id="bench-urlcount",
        on_batch=None if infos is None else infos.append,
    )
    return _run_query(
        lambda: stream.foreach_batch(sink).start(
            checkpoint_location=os.path.join(work, "spark-checkpoint"), trigger={"availableNow": True}
        ),
        sink,
    )


def run_apply_in_pandas_with_state(
    spark: Any, logs: str, work: str, files_per_trigger: int, per_record: bool
) -> Outcome:
    """``applyInPandasWithState``: the count is the group state, a one-field tuple."""
    import numpy as np
    import pandas as pd
    from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

    def count(key: tuple[str], pdfs: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
        (n,) = state.get if state.exists else (0,)
        for pdf in pdfs:
            m = len(pdf)
            if per_record:
                yield pd.DataFrame({"url": key[0], "count": np.arange(n + 1, n + m + 1, dtype="int64")})
            n += m
        state.update((n,))
        if not per_record:
            yield pd.DataFrame({"url": [key[0]], "count": [n]})

    sink = CountingSink(per_url=not per_record)
    out = (
        _stream(spark, logs, files_per_trigger)
        .groupBy("url")
        .applyInPandasWithState(count, OUTPUT_SCHEMA, "count long", "append", GroupStateTimeout.NoTimeout)
    )
    return _run_query(
        lambda: (
            out.writeStream.foreachBatch(sink)
            .option("checkpointLocation", os.path.join(work, "apply-checkpoint"))
            .trigger(availableNow=True)
            .start()
        ),
        sink,
    )


def run_transform_with_state_in_pandas(
    spark: Any, logs: str, work: str, files_per_trigger: int, per_record: bool
) -> Outcome:
    """``transformWithStateInPandas`` with a ``ValueState`` on the RocksDB state store provider."""
    import numpy as np
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

    class Count(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.count = handle.getValueState("count", "value long")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[pd.DataFrame]:
            n = self.count.get()[0] if self.count.exists() else 0
            for pdf in rows:
                m = len(pdf)
                if per_record:
                    yield pd.DataFrame({"url": key[0], "count": np.arange(n + 1, n + m + 1, dtype="int64")})
                n += m
            self.count.update((n,))
            if not per_record:
                yield pd.DataFrame({"url": [key[0]], "count": [n]})

        def close(self) -> None:
            pass

    sink = CountingSink(per_url=not per_record)
    out = (
        _stream(spark, logs, files_per_trigger)
        .groupBy("url")
        .transformWithStateInPandas(Count(), OUTPUT_SCHEMA, "Update", "None")
    )
    return _run_query(
        lambda: (
            out.writeStream.foreachBatch(sink)
            .option("checkpointLocation", os.path.join(work, "tws-checkpoint"))
            .trigger(availableNow=True)
            .start()
        ),
        sink,
    )


def run_streaming_floor(spark: Any, logs: str, work: str, files_per_trigger: int) -> Outcome:
    """The same stream, micro-batches and sink, without state: what any streaming job here pays at least.

    Each row becomes ``(url, 1)``; the sink runs its one aggregation over them.
    Only the number of rows is checked (the counts are not counts per request).
    """
    from pyspark.sql import functions as F

    sink = CountingSink()
    out = _stream(spark, logs, files_per_trigger).select("url", F.lit(1).cast("long").alias("count"))
    outcome = _run_query(
        lambda: (
            out.writeStream.foreachBatch(sink)
            .option("checkpointLocation", os.path.join(work, "floor-checkpoint"))
            .trigger(availableNow=True)
            .start()
        ),
        sink,
    )
    outcome.checksum = None
    return outcome


def _ones(batches: Iterator[Any]) -> Iterator[Any]:
    """Each row's URL with a count of 1: a Python operator that does nothing per key."""
    import numpy as np
    import pyarrow as pa

    for b in batches:
        yield pa.RecordBatch.from_arrays(
            [b.column(0), pa.array(np.ones(b.num_rows, dtype="int64"))], names=["url", "count"]
        )


def run_python_floor(spark: Any, logs: str, work: str, files_per_trigger: int, keyed: bool) -> Outcome:
    """The same stream through a Python ``mapInArrow`` emitting ``(url, 1)`` per row, same sink.

    ``keyed`` (the *keyfloor*): the rows are first shuffled by URL into as many
    partitions as statekit has subtasks, as any keyed operator must; without it
    (the *Python floor*) they stay in the scan's partitions. Only the number of
    rows is checked (the counts are not counts per request).
    """
    sink = CountingSink()
    stream = _stream(spark, logs, files_per_trigger)
    if keyed:
        stream = stream.repartition(int(spark.conf.get("spark.sql.shuffle.partitions")), "url")
    out = stream.mapInArrow(_ones, OUTPUT_SCHEMA)
    outcome = _run_query(
        lambda: (
            out.writeStream.foreachBatch(sink)
            .option("checkpointLocation", os.path.join(work, "pyfloor-checkpoint"))
            .trigger(availableNow=True)
            .start()
        ),
        sink,
    )
    outcome.checksum = None
    return outcome


def run_native(spark: Any, logs: str, work: str, files_per_trigger: int) -> Outcome:
    """Spark's own stateful aggregate in the JVM: ``groupBy("url").count()``, update mode, RocksDB store.

    It emits each URL's count once per micro-batch that touches it (not per
    request): its checksum is checked against :func:`expected_update_checksum`.
    """
    sink = CountingSink()
    out = _stream(spark, logs, files_per_trigger).groupBy("url").count()
    return _run_query(
        lambda: (
            out.writeStream.foreachBatch(sink)
            .outputMode("update")
            .option("checkpointLocation", os.path.join(work, "native-checkpoint"))
            .trigger(availableNow=True)
            .start()
        ),
        sink,
    )


def expected_update_checksum(logs: str, files_per_trigger: int) -> tuple[int, tuple[int, int, int]]:
    """Rows and checksum of an update-mode count: each URL's running count once per batch touching it.

    Read from the log files in the order the file source takes them (by
    modification time, then name), ``files_per_trigger`` files a batch.
    """
    import json

    names = sorted(os.listdir(logs), key=lambda n: (os.path.getmtime(os.path.join(logs, n)), n))
    counts: dict[str, int] = {}
    rows, s, q, m = 0, 0, 0, 0
    for i in range(0, len(names), files_per_trigger):
        touched: set[str] = set()
        for name in names[i : i + files_per_trigger]:
            with open(os.path.join(logs, name), encoding="utf-8") as f:
                for line in f:
                    url = json.loads(line)["url"]
                    counts[url] = counts.get(url, 0) + 1
                    touched.add(url)
        for url in touched:
            c = counts[url]
            rows, s, q, m = rows + 1, s + c, q + c * c, max(m, c)
    return rows, (s, q, m)


def run_stateless(spark: Any, logs: str) -> Outcome:
    """Spark's stateless batch count over the same files: the ceiling."""
    t0 = time.perf_counter()
    rows = spark.read.schema(SCHEMA).json(logs).groupBy("url").count().collect()
    seconds = time.perf_counter() - t0
    counts = {r["url"]: r["count"] for r in rows}
    return Outcome(seconds, counts, len(rows), 1)


# --- the breakdown (--profile) ---------------------------------------------------------------

DRIVER_PHASES = ("prepare", "tasks", "sink", "checkpoint", "retention")


def spark_side(spark: Any, logs: str, parallelism: int) -> list[tuple[float, float]]:
    """Per input file: Spark's scan and parse alone, then with statekit's routing and shuffle (noop sink)."""
    from statekit.serializers import serializer_for
    from statekit.spark._routing import Router, routing_values

    values = routing_values(parallelism)
    router: Any = None
    out = []
    for name in sorted(os.listdir(logs)):
        df = spark.read.schema(SCHEMA).json(os.path.join(logs, name)).select("url")
        t0 = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        scan = time.perf_counter() - t0
        if router is None:  # made once, as a query run makes it
            router = Router(
                spark, df.schema, key_column="url", serializer=serializer_for(str), parallelism=parallelism,
                max_parallelism=128, route_values=values,
            )  # fmt: skip
        routed = router.route(df)
        t0 = time.perf_counter()
        routed.write.format("noop").mode("overwrite").save()
        out.append((scan, time.perf_counter() - t0))
    return out


def print_breakdown(infos: list[Any], spark_times: list[tuple[float, float]], parallelism: int) -> None:
    """Per micro-batch: where statekit's wall time went (driver phases; task phases per task, averaged)."""
    from statekit.spark._plan import TASK_PHASES

    print()
    print("breakdown per micro-batch (seconds). Driver wall time, then what the Python tasks spent, averaged")
    print(f"over the {parallelism} tasks of the batch (they run in parallel, one per core). 'scan+parse' and")
    print("'+route+shuffle' are the same file read by Spark alone into a noop sink (measured separately).")
    head = ["batch", "records", "total", *DRIVER_PHASES, *(f"task {p}" for p in TASK_PHASES),
            "scan+parse", "+route+shuffle"]  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    sums = [0.0] * (len(head) - 2)
    for i, info in enumerate(infos):
        ph = info.phases
        total = sum(ph.get(p, 0.0) for p in DRIVER_PHASES)
        cells = [total, *(ph.get(p, 0.0) for p in DRIVER_PHASES)]
        cells += [ph.get(f"task_{p}", 0.0) / parallelism for p in TASK_PHASES]
        cells += list(spark_times[i]) if i < len(spark_times) else [0.0, 0.0]
        sums = [a + b for a, b in zip(sums, cells)]
        print(f"| {info.batch_id} | {info.records:,} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    n = max(len(infos), 1)
    print("| mean | | " + " | ".join(f"{c / n:.3f}" for c in sums) + " |")


# --- the run -------------------------------------------------------------------------------


def _check(name: str, outcome: Outcome, truth: dict[str, int], rows: int | None) -> None:
    """Exits with a message unless ``outcome`` holds exactly the counts of ``truth`` (the floor: its rows)."""
    if name in ("floor", "keyfloor", "pyfloor"):
        pass
    elif outcome.checksum is not None:
        if outcome.checksum != expected_checksum(truth):
            raise SystemExit(
                f"{name}: wrong counts: checksum {outcome.checksum}, expected {expected_checksum(truth)}"
            )
    elif outcome.counts != truth:
        wrong = sorted(u for u in set(truth) | set(outcome.counts) if outcome.counts.get(u) != truth.get(u))
        raise SystemExit(f"{name}: wrong counts for {len(wrong)} URLs, e.g. {wrong[:3]}")
    if rows is not None and outcome.rows != rows:
        raise SystemExit(f"{name}: emitted {outcome.rows} rows, expected {rows}")


ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
LABELS = {
    "statekit": "statekit CountPerUrl (statekit.spark, heap backend)",
    "vectorized": "statekit CountPerUrlVectorized (KeyedBatchFunction, heap backend)",
    "columns": "statekit CountPerUrlColumns (KeyedColumnsFunction, heap backend)",
    "floor": "Spark streaming without state: same micro-batches and sink (floor)",
    "apply": "applyInPandasWithState (HDFS state store)",
    "tws": "transformWithStateInPandas + ValueState (RocksDB state store)",
    "stateless": "stateless read.json().groupBy('url').count() (ceiling)",
    "keyfloor": "keyfloor: shuffled by URL into a Python mapInArrow emitting (url, 1)",
    "pyfloor": "Python floor: a Python mapInArrow emitting (url, 1), no shuffle",
    "native": "Spark native groupBy('url').count(), update mode (RocksDB state store)",
    "exact": "statekit CountPerUrl, rocksdb backend, exact entry counts (metrics.exact-entries=true)",
    "estimate": "statekit CountPerUrl, rocksdb backend, counts off (metrics.exact-entries=false)",
}
#: The pair ``--entry-counts`` compares: what exact ``state_entries`` cost the per-record job.
ENTRY_COUNT_JOBS = ("exact", "estimate")
STATEKIT_JOBS = ("statekit", "vectorized", "columns", *ENTRY_COUNT_JOBS)
#: What ``--rounds`` compares statekit with, each in every round.
FLOORS = ("keyfloor", "pyfloor", "native")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000, help="log lines (default 1M)")
    ap.add_argument("--files", type=int, default=10, help="files the log is split into (default 10)")
    ap.add_argument("--files-per-trigger", type=int, default=1, help="maxFilesPerTrigger of the streams")
    ap.add_argument(
        "--urls",
        type=int,
        default=100_000,
        help="URL space (default 100k, the setting that reproduces the reference baselines of "
        "14k and 8k records/s; with few URLs Spark's per-key costs shrink: try --urls 1000)",
    )
    ap.add_argument(
        "--shuffle-partitions",
        default="2",
        help="comma-separated spark.sql.shuffle.partitions to run the Spark jobs with (default 2: as "
        "many as statekit's subtasks and the cores; 2,200 adds Spark's default, which is far slower here)",
    )
    ap.add_argument("--statekit-parallelism", type=int, default=2, help="spark.statekit.parallelism")
    ap.add_argument(
        "--baseline-output",
        choices=("per-record", "per-key"),
        default="per-record",
        help="what the Spark baselines emit: a count per request (as statekit) or per URL and batch",
    )
    ap.add_argument("--only", action="append", choices=tuple(LABELS))
    ap.add_argument("--repeats", type=int, default=1, help="time each job N times, keep the best")
    ap.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="alternating rounds (every job once a round, the order reversed every other round); the "
        "medians and the ratios to keyfloor and native per round are reported. Default jobs with it: "
        "keyfloor, pyfloor, native, statekit, vectorized, columns",
    )
    ap.add_argument(
        "--entry-counts",
        action="store_true",
        help="with --rounds: the statekit per-record job on rocksdb with exact entry counts on (exact) and "
        "off (estimate), beside the floors, the order alternating round by round and the pair run A B B A "
        "within each round (a round's rate: records over the mean of its two runs' seconds); prints the "
        "ratio of their medians and the per-round ratios (what statekit.metrics.exact-entries costs)",
    )
    ap.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up runs")
    ap.add_argument(
        "--cpu",
        action="store_true",
        help="print each streaming run's CPU seconds: the JVM (and its JIT compiler threads), the Python "
        "workers and the driver's Python (Linux: read from /proc)",
    )
    ap.add_argument("--workdir", help="where logs and checkpoints go (default: a temporary directory)")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="after the runs, print where statekit's time went per micro-batch (see BatchInfo.phases)",
    )
    args = ap.parse_args(argv)
    global MEASURE_CPU
    MEASURE_CPU = args.cpu
    if args.entry_counts and not args.rounds:
        ap.error("--entry-counts needs --rounds (alternating rounds)")
    default: tuple[str, ...] = (
        (*FLOORS, *ENTRY_COUNT_JOBS)
        if args.entry_counts
        else ("keyfloor", "pyfloor", "native", "statekit", "vectorized", "columns")
        if args.rounds
        else tuple(n for n in LABELS if n not in ENTRY_COUNT_JOBS)
    )
    only = set(args.only or default)
    per_record = args.baseline_output == "per-record"
    partitions = [int(p) for p in args.shuffle_partitions.split(",")]

    work = args.workdir or tempfile.mkdtemp(prefix="statekit-bench-")
    logs, warm_logs = os.path.join(work, "logs"), os.path.join(work, "warmup-logs")
    for d in (logs, warm_logs):
        shutil.rmtree(d, ignore_errors=True)
    print(f"generating {args.records:,} records in {args.files} files under {logs} ...", flush=True)
    gen = generate_logs(
        logs, records=args.records, files=args.files, n_urls=args.urls, malformed_fraction=0.0, seed=7
    )
    truth = dict(gen.counts)
    generate_logs(warm_logs, records=20_000, files=2, n_urls=args.urls, malformed_fraction=0.0, seed=8)

    spark = local_spark_session(
        "statekit-bench",
        conf={"spark.statekit.parallelism": str(args.statekit_parallelism), "spark.driver.memory": "4g"},
    )
    print(
        f"Spark {spark.version}, {spark.sparkContext.master}; {args.files} files, maxFilesPerTrigger "
        f"{args.files_per_trigger}; statekit parallelism {args.statekit_parallelism}; baselines emit "
        f"{args.baseline_output}",
        flush=True,
    )

    def run(name: str, logs_dir: str, tag: str, shuffle: int) -> Outcome:
        d = os.path.join(work, f"{name}-{shuffle}-{tag}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        spark.conf.set("spark.sql.shuffle.partitions", str(shuffle))
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB if name == "tws" else HDFS)
        fpt = args.files_per_trigger
        if name in STATEKIT_JOBS:
            record = infos.setdefault(name, []) if tag != "warmup" else None
            if name in ENTRY_COUNT_JOBS:
                return run_statekit(spark, logs_dir, d, fpt, record, "statekit", "rocksdb", name == "exact")
            return run_statekit(spark, logs_dir, d, fpt, record, name)
        if name == "floor":
            return run_streaming_floor(spark, logs_dir, d, fpt)
        if name in ("keyfloor", "pyfloor"):
            return run_python_floor(spark, logs_dir, d, fpt, keyed=name == "keyfloor")
        if name == "native":
            spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
            return run_native(spark, logs_dir, d, fpt)
        if name == "apply":
            return run_apply_in_pandas_with_state(spark, logs_dir, d, fpt, per_record)
        if name == "tws":
            return run_transform_with_state_in_pandas(spark, logs_dir, d, fpt, per_record)
        return run_stateless(spark, logs_dir)

    # statekit routes by key group to spark.statekit.parallelism partitions: the shuffle setting
    # does not apply to it, so it runs once.
    plan = [(n, p) for p in partitions for n in ("stateless", "apply", "tws") if n in only]
    plan += [(n, partitions[0]) for n in ("floor", *FLOORS, *STATEKIT_JOBS) if n in only]
    if not args.no_warmup:
        for name in dict.fromkeys(n for n, _ in plan):
            print(f"warm-up: {LABELS[name]} ...", flush=True)
            run(name, warm_logs, "warmup", partitions[0])
    rates: dict[tuple[str, int], float] = {}
    infos: dict[str, list[Any]] = {}
    native_expected = expected_update_checksum(logs, args.files_per_trigger) if "native" in only else None

    def timed(name: str, shuffle: int, tag: str) -> float:
        rows = (
            len(truth)
            if name == "stateless"
            else args.records
            if name in (*STATEKIT_JOBS, "floor", "keyfloor", "pyfloor") or per_record
            else None
        )
        outcome = run(name, logs, tag, shuffle)
        if name == "native":
            assert native_expected is not None
            if (outcome.rows, outcome.checksum) != native_expected:
                raise SystemExit(f"native: rows and checksum {(outcome.rows, outcome.checksum)}, "
                                 f"expected {native_expected}")  # fmt: skip
        else:
            _check(name, outcome, truth, rows)
        if name in ENTRY_COUNT_JOBS:
            _check_entries(name, infos[name][-1], len(truth))
        rate = args.records / outcome.seconds
        print(
            f"  {name:<10} {outcome.seconds:8.2f} s  {rate:>12,.0f} records/s  "
            f"({outcome.batches} batches, {outcome.rows:,} rows out, counts exact)",
            flush=True,
        )
        if outcome.cpu is not None:
            print(f"             {_cpu_text(outcome.cpu)}", flush=True)
        return rate

    rounds: list[dict[str, float]] = []
    if args.rounds:
        for r in range(args.rounds):
            order = plan if r % 2 == 0 else plan[::-1]
            print(f"round {r + 1} of {args.rounds}: {', '.join(n for n, _ in order)}", flush=True)
            rd: dict[str, float] = {}
            for name, shuffle in order:
                if name in rd:
                    continue
                if args.entry_counts and name in ENTRY_COUNT_JOBS:
                    # A B B A within the round: each of the pair runs first and second once, so
                    # what the order gives the second run (a warmer worker) cancels in the round.
                    other = next(n for n in ENTRY_COUNT_JOBS if n != name)
                    secs: dict[str, list[float]] = {name: [], other: []}
                    for n in (name, other, other, name):
                        secs[n].append(args.records / timed(n, shuffle, f"round{r}"))
                    rd.update({n: args.records / (sum(t) / len(t)) for n, t in secs.items()})
                else:
                    rd[name] = timed(name, shuffle, f"round{r}")
            rounds.append(rd)
        for name, shuffle in plan:
            rates[(name, shuffle)] = _median([rd[name] for rd in rounds])
    else:
        for name, shuffle in plan:
            print(f"timing: {LABELS[name]}, shuffle partitions {shuffle} ...", flush=True)
            for i in range(args.repeats):
                rate = timed(name, shuffle, f"run{i}")
                rates[(name, shuffle)] = max(rate, rates.get((name, shuffle), 0.0))
    if args.profile and infos:
        per_file = spark_side(spark, logs, args.statekit_parallelism) if args.files_per_trigger == 1 else []
        for name, runs in infos.items():
            print(f"\n{LABELS[name]}:")
            last = runs[-args.files // args.files_per_trigger :]
            print_breakdown(last, per_file, args.statekit_parallelism)
    spark.stop()

    print()
    best_of = f", best of {args.repeats}" if args.repeats > 1 else ""
    print(
        f"{args.records:,} records, {len(truth)} URLs, one SparkSession local[2], start-up excluded{best_of}:"
    )
    for (name, shuffle), rate in rates.items():
        where = f" [shuffle partitions {shuffle}]" if name in ("apply", "tws", "stateless") else ""
        print(f"  {LABELS[name] + where:<88} {rate:>10,.0f} records/s")
    for mine in ("statekit", "vectorized", "columns"):
        if (mine, partitions[0]) not in rates:
            continue
        sk = rates[(mine, partitions[0])]
        for shuffle in partitions:
            base = {n: rates[(n, shuffle)] for n in ("apply", "tws") if (n, shuffle) in rates}
            if base:
                best = max(base, key=base.__getitem__)
                print(
                    f"  {mine} / faster stateful baseline at shuffle partitions {shuffle} ({best}): "
                    f"{sk / base[best]:.1f}x"
                )
            if ("stateless", shuffle) in rates:
                print(f"  {mine} / stateless ceiling: {sk / rates[('stateless', shuffle)]:.2f}x")
        if ("floor", partitions[0]) in rates:
            print(f"  {mine} / streaming floor: {sk / rates[('floor', partitions[0])]:.2f}x")
    if ("floor", partitions[0]) in rates and ("stateless", partitions[0]) in rates:
        floor = rates[("floor", partitions[0])] / rates[("stateless", partitions[0])]
        print(f"  streaming floor / stateless ceiling: {floor:.2f}x")
    if rounds:
        print_rounds(rounds, infos, args.files // args.files_per_trigger)
    if rounds and args.entry_counts:
        print_entry_counts(rounds)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _check_entries(name: str, last: Any, urls: int) -> None:
    """The run's last micro-batch reports its state as the job asked: exact (every URL), or an estimate."""
    stats = last.checkpoint_stats
    if stats is None:
        raise SystemExit(f"{name}: the last micro-batch reports no checkpoint stats")
    if name == "exact" and (not stats.state_entries_exact or stats.state_entries != urls):
        raise SystemExit(
            f"exact: state_entries {stats.state_entries} (exact={stats.state_entries_exact}), expected "
            f"{urls} exactly"
        )
    if name == "estimate" and stats.state_entries_exact:
        raise SystemExit(f"estimate: state_entries {stats.state_entries} labelled exact with counting off")


def print_entry_counts(rounds: list[dict[str, float]]) -> None:
    """What exact entry counts cost: the ratio of the medians (off / on rates) and the per-round ratios."""
    on = _median([rd["exact"] for rd in rounds])
    off = _median([rd["estimate"] for rd in rounds])
    ratios = [rd["estimate"] / rd["exact"] for rd in rounds]
    per_round = ", ".join(f"{r:.3f}" for r in ratios)
    print(
        f"exact entry counts (rocksdb, per-record job): {on:,.0f} records/s on, {off:,.0f} off; "
        f"cost (off/on medians - 1) {(off / on - 1) * 100:+.2f} %; off/on per round: {per_round} "
        f"(median {(_median(ratios) - 1) * 100:+.2f} %)"
    )


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def print_rounds(rounds: list[dict[str, float]], infos: dict[str, list[Any]], batches: int) -> None:
    """The medians of the rounds, the ratios of statekit to the floors per round, the driver's ms per batch.

    A ratio is taken within each round (its jobs ran minutes apart, under much the
    same load) and the median of the rounds' ratios is reported. The driver's
    milliseconds per micro-batch are the means of ``BatchInfo.phases`` over the
    timed runs, the first batch of each run (which starts the query) left out.
    """
    names = list(rounds[0])
    print()
    print(f"medians of {len(rounds)} alternating rounds (records/s):")
    print("| " + " | ".join(names) + " |")
    print("|" + "---|" * len(names))
    print("| " + " | ".join(f"{_median([rd[n] for rd in rounds]):,.0f}" for n in names) + " |")
    for mine in STATEKIT_JOBS:
        for base in FLOORS:
            if mine in names and base in names:
                per_round = [rd[mine] / rd[base] for rd in rounds]
                shown = ", ".join(f"{x:.2f}" for x in per_round)
                print(f"  {mine} / {base}: median {_median(per_round):.2f}x (rounds: {shown})")
    for mine, runs in infos.items():
        steady = [info for i, info in enumerate(runs) if i % batches != 0]
        if not steady:
            continue
        means = {p: 1000 * sum(i.phases.get(p, 0.0) for i in steady) / len(steady) for p in DRIVER_PHASES}
        fixed = sum(v for p, v in means.items() if p != "tasks")
        cells = ", ".join(f"{p} {v:.0f}" for p, v in means.items())
        fused = all("sink" not in i.phases for i in steady)  # the sink's job ran the tasks
        print(f"  {mine} driver ms per batch (batches 1..{batches - 1} of each run): {cells}; "
              f"fixed (all but tasks) {fixed:.0f}"
              + ("; one job per batch: tasks include the sink's work" if fused else ""))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
