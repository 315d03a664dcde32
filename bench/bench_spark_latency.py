"""Micro-batch latency on Spark: statekit against ``applyInPandasWithState`` on the same small batches.

The issue's target: a small batch (``--records-per-batch``, default 1,000 log
lines) from trigger to completed checkpoint, median over ``--batches`` (default
20) batches, statekit at most 1.5x Spark's ``applyInPandasWithState``.

Set-up, outside every timing: ``--batches`` files of ``--records-per-batch``
lines each (Zipf-like URLs over ``--urls``, no malformed lines) and a smaller
warm-up set are generated; one SparkSession ``local[2]`` is started
(``spark.statekit.parallelism=2``, ``spark.sql.shuffle.partitions=2``).

Each method is a streaming query over the same files with ``maxFilesPerTrigger=1``
(one file, one micro-batch) and the ``availableNow`` trigger, writing through
the same ``foreachBatch`` sink as ``bench_spark_urlcount.py`` (one Spark
action per batch that adds up the output). Before it, an untimed warm-up query
of the same method runs over the warm-up files:

- statekit: ``keyed(df, "url").process(CountPerUrl)`` through :mod:`statekit.spark`
  (heap backend, filesystem checkpoints), a count per record;
- ``applyInPandasWithState`` (HDFS state store), a count per record;
- with ``--with-tws``, ``transformWithStateInPandas`` + ``ValueState`` (RocksDB);
- the floor (``--no-floor`` drops it): the same stream into the same kind of
  ``foreachBatch`` sink with no state at all (one count per batch), i.e. what
  Spark itself costs per micro-batch of this size.

What is measured: a ``StreamingQueryListener`` receives every batch's progress
event; its ``durationMs["triggerExecution"]`` is the whole batch, from the
trigger to Spark's commit log write, so it covers Spark's offset listing and
offset log write (``latestOffset``, ``walCommit``), planning (``queryPlanning``,
``getBatch``), the batch itself (``addBatch``) and the commit (``commitOffsets``).
statekit completes its own checkpoint inside ``addBatch`` (inside
``foreachBatch``, after the sink), and Spark's state store commits inside
``addBatch`` too (in the tasks), so ``triggerExecution`` is "from trigger to
completed checkpoint" for both. Listener events arrive asynchronously: after a
query ends, the script waits (with a timeout) until all its progress events
have arrived. Every run is checked before it is reported: each batch read
``--records-per-batch`` rows, the sink saw one output row per record, and the
counts add up to the generator's per-URL counts (a checksum, as in
``bench_spark_urlcount.py``).

The breakdown names the fixed per-batch costs: the medians of Spark's
``durationMs`` parts per method, the Spark jobs each batch runs, and, inside
statekit's ``addBatch``, its :attr:`~statekit.spark.BatchInfo.phases` (driver:
prepare, tasks, sink, checkpoint, retention; task phases averaged over the
tasks) next to ``applyInPandasWithState``'s state store metrics.

Run: ``python bench/bench_spark_latency.py [--batches 20] [--records-per-batch 1000] [--with-tws]``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench_spark_urlcount import (
    HDFS,
    ROCKSDB,
    CountingSink,
    Outcome,
    _check,
    _run_query,
    _stream,
    run_apply_in_pandas_with_state,
    run_statekit,
    run_transform_with_state_in_pandas,
)
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)

from statekit_urlcount import generate_logs, local_spark_session

LABELS = {
    "statekit": "statekit CountPerUrl (statekit.spark, heap backend)",
    "apply": "applyInPandasWithState (HDFS state store)",
    "tws": "transformWithStateInPandas + ValueState (RocksDB state store)",
    "floor": "floor: same stream, foreachBatch count, no state",
}
SHORT = {
    "statekit": "statekit",
    "apply": "applyInPandasWithState",
    "tws": "transformWithState",
    "floor": "floor",
}
#: Spark's durationMs parts of a micro-batch, in the order they happen.
SPARK_PARTS = ("latestOffset", "getBatch", "queryPlanning", "walCommit", "addBatch", "commitOffsets")
DRIVER_PHASES = ("prepare", "tasks", "sink", "checkpoint", "retention")
TASK_PHASES = ("input", "convert", "records", "output", "timers", "snapshot", "task")


# --- progress events ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """One micro-batch's progress event, copied out of the listener's event."""

    query_id: str
    run_id: str
    batch_id: int
    rows: int
    duration_ms: dict[str, int]
    #: Summed over the batch's state operators (each summed over its tasks by Spark).
    state_ms: dict[str, int] = field(default_factory=dict)


class ProgressCollector(StreamingQueryListener):
    """Keeps every query's progress events; :meth:`take` waits for a finished query's last ones."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._events: dict[str, list[Progress]] = {}
        self._taken: set[str] = set()

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        pass

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        p = event.progress
        ops = p.stateOperators
        state = {
            "commitTimeMs": sum(int(o.commitTimeMs) for o in ops),
            "allUpdatesTimeMs": sum(int(o.allUpdatesTimeMs) for o in ops),
        }
        rec = Progress(
            query_id=str(p.id),
            run_id=str(p.runId),
            batch_id=int(p.batchId),
            rows=int(p.numInputRows or 0),
            duration_ms={k: int(v) for k, v in p.durationMs.items()},
            state_ms=state if ops else {},
        )
        with self._cond:
            self._events.setdefault(rec.query_id, []).append(rec)
            self._cond.notify_all()

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        pass

    def take(self, batches: int, timeout: float = 120.0) -> list[Progress]:
        """The data batches of the one query that ran since the last ``take``, once all ``batches`` are in.

        Queries run one after the other here, so the query is the one whose id
        has not been taken yet. Empty (no-data) progress events are left out.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                new = [q for q in self._events if q not in self._taken]
                if len(new) > 1:
                    raise RuntimeError(f"progress events of {len(new)} queries, expected one: {new}")
                if new:
                    data = {p.batch_id: p for p in self._events[new[0]] if p.rows > 0}
                    if len(data) >= batches:
                        self._taken.add(new[0])
                        return [data[b] for b in sorted(data)]
                left = deadline - time.monotonic()
                if left <= 0:
                    got = len(data) if new else 0
                    raise RuntimeError(f"only {got} of {batches} progress events arrived in {timeout:.0f} s")
                self._cond.wait(left)


# --- the floor: Spark's own per-batch cost ------------------------------------------------------


class RowCountingSink(CountingSink):
    """The floor's sink: one Spark action per batch (a count), no state, nothing else."""

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        self.batches += 1
        self.rows += batch_df.count()


def run_floor(spark: Any, logs: str, work: str) -> Outcome:
    """The same file stream and trigger into a ``foreachBatch`` sink that counts its rows: no state."""
    sink = RowCountingSink()
    return _run_query(
        lambda: (
            _stream(spark, logs, 1)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", os.path.join(work, "floor-checkpoint"))
            .trigger(availableNow=True)
            .start()
        ),
        sink,
    )


# --- one method ----------------------------------------------------------------------------------


@dataclass
class Result:
    """One method's timed query: its batches' progress events, statekit's BatchInfos, Spark jobs."""

    name: str
    progress: list[Progress]
    infos: list[Any] = field(default_factory=list)
    #: The Spark jobs the query ran (its job group is the query's run id), in order.
    jobs: list[int] = field(default_factory=list)
    #: The last batch's jobs: for each, the tasks of each of its stages that ran.
    last_batch_jobs: list[list[int]] = field(default_factory=list)

    def part(self, name: str) -> list[float]:
        """``durationMs[name]`` per batch (0 where Spark did not report it)."""
        return [float(p.duration_ms.get(name, 0)) for p in self.progress]

    def total(self) -> list[float]:
        return self.part("triggerExecution")


def run_method(
    spark: Any,
    name: str,
    logs: str,
    work: str,
    tag: str,
    infos: list[Any] | None,
) -> Outcome:
    """Runs one query of ``name`` over ``logs`` in a fresh directory under ``work``."""
    d = os.path.join(work, f"{name}-{tag}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB if name == "tws" else HDFS)
    if name == "statekit":
        return run_statekit(spark, logs, d, 1, infos)
    if name == "apply":
        return run_apply_in_pandas_with_state(spark, logs, d, 1, True)
    if name == "tws":
        return run_transform_with_state_in_pandas(spark, logs, d, 1, True)
    return run_floor(spark, logs, d)


def check(
    name: str, outcome: Outcome, progress: list[Progress], truth: dict[str, int], per_batch: int
) -> None:
    """Exits with a message unless every batch read ``per_batch`` rows and the output is exact."""
    n = len(progress)
    sizes = sorted({p.rows for p in progress})
    if sizes != [per_batch]:
        raise SystemExit(f"{name}: batches read {sizes} rows, expected {per_batch} each")
    if outcome.batches != n:
        raise SystemExit(f"{name}: the sink saw {outcome.batches} batches, Spark reported {n}")
    if name == "floor":
        if outcome.rows != n * per_batch:
            raise SystemExit(f"{name}: counted {outcome.rows} rows, expected {n * per_batch}")
        return
    _check(name, outcome, truth, n * per_batch)


def last_batch_jobs(tracker: Any, jobs: list[int], batches: int) -> list[list[int]]:
    """The last batch's jobs (when every batch ran as many), each as the task counts of its stages that ran.

    Stages a job skips (their output was already there: a shuffle written by an
    earlier job, or a cached relation) are left out.
    """
    if not jobs or len(jobs) % batches:
        return []
    out = []
    for job in jobs[-(len(jobs) // batches) :]:
        info = tracker.getJobInfo(job)
        stages = [tracker.getStageInfo(s) for s in sorted(info.stageIds)] if info is not None else []
        out.append([s.numTasks for s in stages if s is not None and s.numCompletedTasks > 0])
    return out


# --- statistics and tables ---------------------------------------------------------------------


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def p90(xs: Sequence[float]) -> float:
    """The nearest-rank 90th percentile."""
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[max(0, math.ceil(0.9 * len(s)) - 1)]


def _ms(x: float) -> str:
    return "" if math.isnan(x) else f"{x:.0f}" if abs(x) >= 10 else f"{x:.1f}"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> None:
    """A markdown table; ``align`` has an ``l`` or ``r`` per column (default: first left, others right)."""
    align = align or "l" + "r" * (len(head) - 1)
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if a == "l" else "---:" for a in align) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def print_summary(results: dict[str, Result], per_batch: int) -> None:
    base = results.get("apply")
    head = ["method", "batches", "median ms", "p90 ms", "min ms", "max ms", "records/s at median",
            "Spark jobs / batch", "median / applyInPandasWithState"]  # fmt: skip
    rows = []
    for name, r in results.items():
        t = r.total()
        ratio = f"{median(t) / median(base.total()):.2f}x" if base is not None else ""
        rows.append([
            LABELS[name], str(len(t)), _ms(median(t)), _ms(p90(t)), _ms(min(t)), _ms(max(t)),
            f"{per_batch / (median(t) / 1000):,.0f}", f"{len(r.jobs) / max(len(t), 1):.1f}", ratio,
        ])  # fmt: skip
    _table(head, rows)
    print()
    print("Spark jobs of the last batch, each as [tasks of each stage that ran]:")
    for name, r in results.items():
        shape = " ".join(str(j) for j in r.last_batch_jobs) if r.last_batch_jobs else "(varies per batch)"
        print(f"  {SHORT[name]}: {shape}")


def print_spark_parts(results: dict[str, Result]) -> None:
    """Medians of Spark's durationMs parts, per method; 'other' is what the parts leave of the total."""
    extra = sorted(
        {k for r in results.values() for p in r.progress for k in p.duration_ms} - set(SPARK_PARTS)
    )
    extra = [k for k in extra if k != "triggerExecution"]
    parts = [*SPARK_PARTS, *extra]
    head = ["durationMs part (median ms)", *(SHORT[n] for n in results)]
    rows = []
    for part in [*parts, "other", "triggerExecution"]:
        cells = [part]
        for r in results.values():
            xs: list[float] = r.part(part)
            if part == "other":
                xs = [
                    float(
                        p.duration_ms.get("triggerExecution", 0) - sum(p.duration_ms.get(k, 0) for k in parts)
                    )
                    for p in r.progress
                ]
            cells.append(_ms(median(xs)))
        rows.append(cells)
    outside = [_ms(median([t - a for t, a in zip(r.total(), r.part("addBatch"))])) for r in results.values()]
    rows.append(["outside addBatch (triggerExecution - addBatch)", *outside])
    _table(head, rows)


def print_statekit_breakdown(results: dict[str, Result]) -> None:
    """Inside addBatch: statekit's phases per batch (medians), next to applyInPandasWithState's."""
    sk = results.get("statekit")
    if sk is None or not sk.infos:
        return
    infos = sk.infos
    if len(infos) != len(sk.progress):
        print(f"(statekit reported {len(infos)} BatchInfos for {len(sk.progress)} batches)")
    par = max(infos[0].parallelism, 1)

    def ph(name: str) -> list[float]:
        return [1000.0 * i.phases.get(name, 0.0) for i in infos]

    add = sk.part("addBatch")[-len(infos) :]
    driver_sum = [sum(1000.0 * i.phases.get(p, 0.0) for p in DRIVER_PHASES) for i in infos]
    rows: list[list[str]] = []

    def row(label: str, xs: Sequence[float], note: str = "") -> None:
        rows.append([label, _ms(median(xs)), _ms(p90(xs)), note])

    row("addBatch (Spark)", add, "the foreachBatch call: everything below")
    for p in DRIVER_PHASES:
        note = {
            "prepare": "latest checkpoint, fence, plan, routing DataFrame, broadcast",
            "tasks": "Spark job(s): scan, route, Python tasks, snapshots; on classic Spark the sink's",
            "sink": "the sink's action on the cached output, when it did not run the tasks (Connect)",
            "checkpoint": "completing the statekit checkpoint (metadata)",
            "retention": "deleting old checkpoints",
        }[p]
        row(f"  driver {p}", ph(p), note)
    row(
        "  addBatch outside statekit's phases",
        [a - s for a, s in zip(add, driver_sum)],
        "Py4J callback into Python, BatchInfo, hooks",
    )
    avg_task = [x / par for x in ph("task_task")]
    row(
        "  tasks wall - task time (avg)",
        [t - a for t, a in zip(ph("tasks"), avg_task)],
        "scheduling, scan, shuffle, Python worker hand-off",
    )
    for p in TASK_PHASES:
        row(f"    task {p} (avg over {par} tasks)", [x / par for x in ph(f"task_{p}")])
    ap = results.get("apply")
    if ap is not None and ap.progress:
        row("applyInPandasWithState addBatch (Spark)", ap.part("addBatch"), "one job: scan, shuffle, state")
        for key, note in (
            ("allUpdatesTimeMs", "state updates incl. the Python UDF, summed over tasks"),
            ("commitTimeMs", "state store commit (delta files), summed over tasks"),
        ):
            row(f"  {key}", [float(p.state_ms.get(key, 0)) for p in ap.progress], note)
    _table(["phase", "median ms", "p90 ms", "what"], rows, align="lrrl")


# --- the run -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=20, help="timed micro-batches per method (default 20)")
    ap.add_argument("--records-per-batch", type=int, default=1000, help="log lines per batch (default 1000)")
    ap.add_argument("--urls", type=int, default=1000, help="URL space (default 1000)")
    ap.add_argument("--warmup-batches", type=int, default=3, help="batches of each untimed warm-up query")
    ap.add_argument("--with-tws", action="store_true", help="also time transformWithStateInPandas")
    ap.add_argument("--no-floor", action="store_true", help="skip the stateless floor query")
    ap.add_argument("--workdir", help="where logs and checkpoints go (default: a temporary directory)")
    args = ap.parse_args(argv)
    per_batch, n = args.records_per_batch, args.batches
    methods = [
        "statekit",
        "apply",
        *(["tws"] if args.with_tws else []),
        *([] if args.no_floor else ["floor"]),
    ]

    work = args.workdir or tempfile.mkdtemp(prefix="statekit-latency-")
    logs, warm_logs = os.path.join(work, "logs"), os.path.join(work, "warmup-logs")
    for d in (logs, warm_logs):
        shutil.rmtree(d, ignore_errors=True)
    print(f"generating {n} files of {per_batch:,} records under {logs} ...", flush=True)
    gen = generate_logs(
        logs, records=n * per_batch, files=n, n_urls=args.urls, malformed_fraction=0.0, seed=7
    )
    truth = dict(gen.counts)
    warm = generate_logs(
        warm_logs,
        records=args.warmup_batches * per_batch,
        files=args.warmup_batches,
        n_urls=args.urls,
        malformed_fraction=0.0,
        seed=8,
    )
    spark = local_spark_session(
        "statekit-latency",
        conf={"spark.statekit.parallelism": "2", "spark.sql.shuffle.partitions": "2"},
    )
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    collector = ProgressCollector()
    spark.streams.addListener(collector)
    tracker = spark.sparkContext.statusTracker()
    print(
        f"Spark {spark.version}, {spark.sparkContext.master}; {n} batches of {per_batch:,} records "
        f"(maxFilesPerTrigger 1, availableNow), {args.urls} URLs; statekit parallelism 2, "
        "shuffle partitions 2",
        flush=True,
    )

    results: dict[str, Result] = {}
    try:
        for name in methods:
            print(f"warm-up: {LABELS[name]} ({args.warmup_batches} batches) ...", flush=True)
            outcome = run_method(spark, name, warm_logs, work, "warmup", None)
            check(name, outcome, collector.take(args.warmup_batches), dict(warm.counts), per_batch)
            print(f"timing: {LABELS[name]} ({n} batches) ...", flush=True)
            infos: list[Any] = []
            outcome = run_method(spark, name, logs, work, "timed", infos)
            progress = collector.take(n)
            check(name, outcome, progress, truth, per_batch)
            infos = [i for i in infos if not i.skipped]
            if name == "statekit":
                bad = [i.batch_id for i in infos if i.records != per_batch or i.outputs != per_batch]
                if len(infos) != n or bad:
                    raise SystemExit(f"statekit: {len(infos)} BatchInfos, wrong records/outputs in {bad}")
            jobs = sorted(tracker.getJobIdsForGroup(progress[0].run_id))
            results[name] = r = Result(name, progress, infos, jobs, last_batch_jobs(tracker, jobs, n))
            t = r.total()
            print(
                f"  triggerExecution median {median(t):.0f} ms, p90 {p90(t):.0f} ms; per batch: "
                + " ".join(f"{x:.0f}" for x in t),
                flush=True,
            )
    finally:
        spark.streams.removeListener(collector)
        spark.stop()

    print()
    print(
        f"Micro-batch latency, from trigger to completed checkpoint (Spark's durationMs.triggerExecution): "
        f"{n} batches of {per_batch:,} records each, {args.urls} URLs, one SparkSession local[2], "
        "after an untimed warm-up query per method. All outputs checked."
    )
    print()
    print_summary(results, per_batch)
    if "statekit" in results and "apply" in results:
        ratio = median(results["statekit"].total()) / median(results["apply"].total())
        verdict = "meets" if ratio <= 1.5 else "misses"
        print()
        print(f"statekit / applyInPandasWithState, median: {ratio:.3f}x ({verdict} the target of <= 1.5x)")
    print()
    print("Where a batch's time goes, per Spark (durationMs parts, median over the batches, ms):")
    print()
    print_spark_parts(results)
    print()
    print("Inside addBatch (median and p90 over the batches, ms); task phases are per task, averaged:")
    print()
    print_statekit_breakdown(results)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
