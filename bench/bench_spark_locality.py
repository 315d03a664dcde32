"""State locality on Spark: does a subtask's task run where its state is open, as the state grows?

The growing-state URL count of issue #23: ``--batches`` micro-batches (one
JSON file each, ``maxFilesPerTrigger=1``) of ``--keys`` new URLs each, so the
state grows by ``--keys`` keys a batch (8 x 50,000 to 400,000 by default)
while every batch has the same rows. Runs on a standalone cluster of
``--workers`` one-core workers on 127.0.0.1 (master and workers as processes,
as the tests start them) or on ``--master local[2]``, for each backend
(``--backends heap,rocksdb``) and setting (``--configs after,before``: task
locality, task-local recovery and the hand-off between an executor's Python
workers all on, or all off as statekit was before them), parallelism
``--parallelism`` (default: the number of cores), filesystem checkpoints.

A warm-up run on a small log comes first, outside every figure. Per batch it
prints how each subtask came by its state (reused open state, and of those
the ones handed to the sibling Python worker holding it; restored from the
executor's local copies; restored from the checkpoint storage), the restore
seconds summed over the tasks, the bytes the restores downloaded, and the
Spark job's wall time; then the share of subtask-batches
after the first that reused open state, and the last batch's task time over
the second's. Every run's final counts are checked against the generator.

The baseline, measured in the same run on the same cluster and files:
Spark's ``applyInPandasWithState`` counting per URL (``--baseline off`` skips
it), per batch from the query's progress reports.

Run: ``python bench/bench_spark_locality.py [--workers 3 | --master local[2]]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "spark"))  # the tests' standalone cluster
sys.path.insert(0, str(HERE.parent / "tests"))

SCHEMA = "url string"
OUTPUT_SCHEMA = "url string, count long"


def write_batches(directory: Path, batches: int, keys: int) -> dict[str, int]:
    """``batches`` files of ``keys`` new URLs each, one file per micro-batch; the expected counts."""
    directory.mkdir(parents=True)
    base = time.time_ns() // 1_000_000_000 * 1_000_000_000
    for b in range(batches):
        path = directory / f"part-{b:04d}.json"
        with path.open("w") as f:
            for i in range(keys):
                f.write(json.dumps({"url": f"/b{b}/page/{i}"}) + "\n")
        # The file source takes files in modification-time order: one second apart, in order.
        os.utime(path, ns=(base + b * 1_000_000_000, base + b * 1_000_000_000))
    return {f"/b{b}/page/{i}": 1 for b in range(batches) for i in range(keys)}


def session(master: str, parallelism: int, local_dirs: str) -> Any:
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName("statekit-locality-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(parallelism))
        .config("spark.default.parallelism", str(parallelism))
        .config("spark.executor.memory", "1g")
        .config("spark.local.dir", local_dirs)
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )


class FinalCounts:
    """A foreachBatch sink keeping the last count per URL."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def __call__(self, df: Any, batch_id: int) -> None:
        for row in df.groupBy("url").agg({"count": "max"}).collect():
            self.counts[row[0]] = max(self.counts.get(row[0], 0), int(row[1]))


def run_statekit(
    spark: Any,
    logs: Path,
    work: Path,
    backend: str,
    settings: dict[str, str],
    parallelism: int,
    job_suffix: str = "",
) -> list[Any]:
    from statekit.spark import keyed
    from statekit_urlcount import CountPerUrl

    conf = {
        "spark.statekit.backend": backend,
        "spark.statekit.checkpoint.storage": "filesystem",
        "spark.statekit.checkpoints.dir": str(work / "checkpoints"),
        "spark.statekit.parallelism": str(parallelism),
        "spark.statekit.spark.locality": settings["locality"],
        "spark.statekit.local-recovery": "true" if settings["recovery"] == "on" else "false",
        "spark.statekit.spark.worker-handoff": "true" if settings["handoff"] == "on" else "false",
    }
    for k, v in conf.items():
        spark.conf.set(k, v)
    infos: list[Any] = []
    job_id = "locality-" + "-".join([backend, *settings.values()]) + job_suffix
    sink = FinalCounts()
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(logs))
    query = (
        keyed(stream, key="url", key_type=str)
        .process(CountPerUrl, output_schema=OUTPUT_SCHEMA, job_id=job_id,
                 on_batch=infos.append)
        .foreach_batch(sink)
        .start(checkpoint_location=str(work / "spark"), trigger={"availableNow": True})
    )  # fmt: skip
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    infos.sort(key=lambda i: i.batch_id)
    _check_counts(sink.counts, logs)
    for k in conf:
        spark.conf.unset(k)
    return infos


def run_apply_in_pandas(spark: Any, logs: Path, work: Path) -> list[float]:
    """Seconds per micro-batch of ``applyInPandasWithState`` counting per URL (its trigger execution)."""
    import pandas as pd
    from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

    def count(key: tuple[str], pdfs: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
        (n,) = state.get if state.exists else (0,)
        for pdf in pdfs:
            n += len(pdf)
        state.update((n,))
        yield pd.DataFrame({"url": [key[0]], "count": [n]})

    sink = FinalCounts()
    out = (
        spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(logs))
        .groupBy("url")
        .applyInPandasWithState(count, OUTPUT_SCHEMA, "count long", "append", GroupStateTimeout.NoTimeout)
    )  # fmt: skip
    query = (
        out.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(work / "apply"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"applyInPandasWithState failed: {query.exception()}")
    _check_counts(sink.counts, logs)
    seconds = [p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress if p["numInputRows"]]
    return seconds


def _check_counts(counts: dict[str, int], logs: Path) -> None:
    expected = sum(1 for f in logs.glob("part-*.json") for _ in f.open())
    if len(counts) != expected or any(v != 1 for v in counts.values()):
        wrong = sum(1 for v in counts.values() if v != 1)
        raise AssertionError(f"counts are wrong: {len(counts)} URLs of {expected}, {wrong} with a count != 1")


def report(name: str, infos: list[Any]) -> dict[str, float]:
    print(f"\n{name}: locality {infos[0].locality}")
    print(f"{'batch':>5} {'reused':>6} {'handed':>6} {'local':>5} {'remote':>6} {'empty':>5} "
          f"{'restore s':>9} {'downloaded MB':>13} {'tasks s':>8} {'batch s':>8}")  # fmt: skip
    for i in infos:
        empty = i.restored_subtasks - i.restored_locally - i.restored_remotely
        restore = i.phases.get("task_restore", 0.0)
        total = sum(v for k, v in i.phases.items() if not k.startswith("task_"))
        print(f"{i.batch_id:>5} {i.reused_subtasks:>6} {i.handed_off:>6} {i.restored_locally:>5} "
              f"{i.restored_remotely:>6} "
              f"{empty:>5} {restore:>9.2f} {i.bytes_downloaded / 1e6:>13.1f} {i.phases['tasks']:>8.2f} "
              f"{total:>8.2f}")  # fmt: skip
    later = infos[1:]
    subtask_batches = sum(i.parallelism for i in later)
    reused = sum(i.reused_subtasks for i in later)
    restore = sum(i.phases.get("task_restore", 0.0) for i in later)
    task = sum(i.phases.get("task_task", 0.0) for i in later)
    ratio = infos[-1].phases["tasks"] / infos[1].phases["tasks"] if len(infos) > 2 else float("nan")
    print(f"reused open state: {reused} of {subtask_batches} subtask-batches after the first "
          f"({100 * reused / max(subtask_batches, 1):.0f} %); restore time / task time "
          f"{100 * restore / max(task, 1e-9):.0f} %; last batch's tasks / second's {ratio:.2f}x")  # fmt: skip
    return {"reuse": reused / max(subtask_batches, 1), "ratio": ratio}


def _config(name: str) -> dict[str, str]:
    """Locality, local recovery and worker hand-off of a ``--configs`` entry."""
    settings = {"locality": "on", "recovery": "on", "handoff": "on"}
    if name == "after":
        return settings
    if name == "before":
        return dict.fromkeys(settings, "off")
    for part in name.split("/"):
        key, value = part.split("=", 1)
        if key not in settings or value not in ("on", "off"):
            raise SystemExit(f"--configs: {part!r}: use locality, recovery or handoff =on|off")
        settings[key] = value
    return settings


def master_and_cores(stack: ExitStack, args: argparse.Namespace, root: Path) -> tuple[str, int]:
    """``args.master`` (``local[N]``: N cores), or a standalone cluster of ``args.workers`` one-core
    workers started under ``root`` and stopped when ``stack`` closes."""
    if args.master:
        return args.master, int(args.master.strip("local[]*") or 2)
    from cluster import standalone_cluster

    cluster = stack.enter_context(standalone_cluster(root / "cluster", workers=args.workers))
    return cluster.master_url, args.workers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=3, help="standalone workers (ignored with --master)")
    ap.add_argument("--master", default=None, help="e.g. local[2]; default: a standalone cluster")
    ap.add_argument("--parallelism", type=int, default=None)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--keys", type=int, default=50_000)
    ap.add_argument("--backends", default="heap,rocksdb")
    ap.add_argument(
        "--configs",
        default="after,before",
        help="after (locality, local recovery and worker hand-off on), before (all off: statekit "
        "before issue #23), or e.g. locality=on/recovery=off/handoff=off (unnamed: on), comma-separated",
    )
    ap.add_argument("--baseline", choices=("on", "off"), default="on")
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    root = Path(tempfile.mkdtemp(prefix="statekit-locality-"))
    try:
        with ExitStack() as stack:
            master, cores = master_and_cores(stack, args, root)
            p = args.parallelism or cores
            logs = root / "logs"
            write_batches(logs, args.batches, args.keys)
            spark = session(master, p, str(root / "spark-local"))
            print(f"{master}, parallelism {p}, {args.batches} batches x {args.keys} new keys "
                  f"(state grows to {args.batches * args.keys})")  # fmt: skip
            # Warm-up, outside every figure: the JVM's JIT, the Python workers' imports, the helper.
            write_batches(root / "warm-logs", 2, 1000)
            for backend in args.backends.split(","):
                run_statekit(
                    spark, root / "warm-logs", root / f"warm-{backend}", backend, _config("after"), p
                )
            for backend in args.backends.split(","):
                for config in args.configs.split(","):
                    settings = _config(config)
                    work = root / "-".join([backend, *settings.values()])
                    infos = run_statekit(spark, logs, work, backend, settings, p)
                    described = ", ".join(f"{k} {v}" for k, v in settings.items())
                    report(f"statekit {backend} {config}: {described}", infos)
                    shutil.rmtree(work, ignore_errors=True)
            if args.baseline == "on":
                seconds = run_apply_in_pandas(spark, logs, root / "apply")
                print("\napplyInPandasWithState seconds per batch: " + " ".join(f"{s:.2f}" for s in seconds))
            spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
