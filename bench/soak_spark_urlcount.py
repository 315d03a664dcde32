"""Soak: the URL count on Spark for many micro-batches; does anything grow with the batch count?

Not a benchmark and not in CI (issue #15, case 7). One file per micro-batch
(``--batches``, default 200, of ``--records-per-batch`` lines each, Zipf-like
URLs out of ``--urls``) is generated first; then one ``local[2]`` session runs
statekit's ``CountPerUrl`` over them with an ``availableNow`` trigger,
``statekit.checkpoints.retained=3`` and filesystem checkpoints. After every
micro-batch (statekit's ``on_batch`` on the driver) it samples:

- RSS and open file descriptors of the Python driver, of the driver's JVM (in
  local mode the executors live there) and of every Python worker that ran a
  subtask (the executor side: its subtask cache lives there);
- the size and the number of entries of the job's checkpoint directory;
- the batch's wall time.

At the end it checks every URL's count against the generator's, prints the
samples' first and last tenth side by side and a least-squares slope per 100
batches for each series (``--csv`` writes every sample). What must hold: the
checkpoint directory stays bounded (3 retained checkpoints), the Python
workers' RSS and fds do not grow with the batch count once the set of URLs is
complete, and the batch time has no upward trend.

Run: ``python bench/soak_spark_urlcount.py [--batches 200] [--backend heap|rocksdb|lmdb]``.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SCHEMA = "`@timestamp` string, remote_addr string, request string, url string"
OUTPUT_SCHEMA = "url string, count long"


@dataclass
class Sample:
    """What one micro-batch left behind."""

    batch: int
    seconds: float
    driver_rss_mb: float
    driver_fds: int
    jvm_rss_mb: float
    jvm_fds: int
    workers: int
    worker_rss_mb: float  # the sum over the Python workers that ran subtasks in this batch
    worker_fds: int
    checkpoint_mb: float
    checkpoint_files: int
    reused: int
    restored: int


def _status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, PermissionError):
        return 0


def _tree_size(path: Path) -> tuple[int, int]:
    size = files = 0
    for root, _, names in os.walk(path):
        for name in names:
            files += 1
            try:
                size += os.path.getsize(os.path.join(root, name))
            except FileNotFoundError:
                pass  # deleted by retention meanwhile
    return size, files


def _slope_per_100(values: list[float]) -> float:
    """Least-squares slope of ``values`` against their index, per 100 batches."""
    n = len(values)
    if n < 2:
        return 0.0
    xs = range(n)
    mx, my = (n - 1) / 2, statistics.fmean(values)
    sxx = sum((x - mx) ** 2 for x in xs)
    return 100 * sum((x - mx) * (y - my) for x, y in zip(xs, values)) / sxx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--records-per-batch", type=int, default=5000)
    parser.add_argument("--urls", type=int, default=2000)
    parser.add_argument("--backend", default="heap")
    parser.add_argument("--retained", type=int, default=3)
    parser.add_argument("--csv", help="write every sample here")
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the session, e.g. spark.driver.memory=1g (bounds the JVM's heap)",
    )
    parser.add_argument("--work", help="work directory (default: a temporary one, removed)")
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from statekit.spark import BatchInfo, keyed
    from statekit_urlcount import CountPerUrl, generate_logs, local_spark_session

    work = Path(args.work or tempfile.mkdtemp(prefix="statekit-soak-"))
    logs, checkpoints = work / "logs", work / "statekit"
    print(f"generating {args.batches} files of {args.records_per_batch} lines into {logs} ...", flush=True)
    truth = generate_logs(
        logs,
        records=args.batches * args.records_per_batch,
        files=args.batches,
        n_urls=args.urls,
        malformed_fraction=0.0,
        late_fraction=0.0,
    ).counts

    spark = local_spark_session("statekit-soak", conf=dict(kv.split("=", 1) for kv in args.spark_conf))
    for key, value in {
        "spark.statekit.backend": args.backend,
        "spark.statekit.checkpoints.dir": str(checkpoints),
        "spark.statekit.checkpoints.retained": str(args.retained),
        "spark.statekit.parallelism": "2",
    }.items():
        spark.conf.set(key, value)
    gateway = spark.sparkContext._gateway  # type: ignore[attr-defined]
    jvm_pid = gateway.proc.pid if getattr(gateway, "proc", None) is not None else 0

    samples: list[Sample] = []
    last = [time.perf_counter()]
    job_dir = checkpoints / "soak"

    def on_batch(info: BatchInfo) -> None:
        now = time.perf_counter()
        size, files = _tree_size(job_dir)
        workers = list(info.executor_pids)
        sample = Sample(
            batch=info.batch_id,
            seconds=now - last[0],
            driver_rss_mb=_status_kb(os.getpid(), "VmRSS") / 1024,
            driver_fds=_fds(os.getpid()),
            jvm_rss_mb=_status_kb(jvm_pid, "VmRSS") / 1024,
            jvm_fds=_fds(jvm_pid),
            workers=len(workers),
            worker_rss_mb=sum(_status_kb(p, "VmRSS") for p in workers) / 1024,
            worker_fds=sum(_fds(p) for p in workers),
            checkpoint_mb=size / 2**20,
            checkpoint_files=files,
            reused=info.reused_subtasks,
            restored=info.restored_subtasks,
        )
        samples.append(sample)
        last[0] = now
        if info.batch_id % 10 == 0:
            print(
                f"batch {info.batch_id:4d}: {sample.seconds:5.2f}s  driver {sample.driver_rss_mb:6.1f} MB "
                f"jvm {sample.jvm_rss_mb:7.1f} MB  workers {sample.worker_rss_mb:6.1f} MB / "
                f"{sample.worker_fds} fds  checkpoints {sample.checkpoint_mb:6.2f} MB in {files} files",
                flush=True,
            )

    rows = [0]

    def sink(df: Any, batch_id: int) -> None:
        rows[0] += df.count()

    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(logs)).select("url")
    query = (
        keyed(stream, "url")
        .process(CountPerUrl, OUTPUT_SCHEMA, job_id="soak", on_batch=on_batch)
        .foreach_batch(sink)
        .start(checkpoint_location=str(work / "spark-checkpoint"), trigger={"availableNow": True})
    )
    t0 = time.perf_counter()
    query.awaitTermination()
    total = time.perf_counter() - t0

    from statekit import LocalRunner, ValueStateDescriptor
    from statekit_storage import FileSystemCheckpointStorage

    storage = FileSystemCheckpointStorage(str(checkpoints))
    runner = LocalRunner(
        CountPerUrl,
        key_selector=lambda r: r["url"],
        storage=storage,
        job_id="soak",
        config={"statekit.parallelism": 2, "statekit.backend": args.backend},
    )
    runner.restore("latest")
    counts: dict[str, int] = {}
    for ctx in runner.subtasks:
        kb = ctx.keyed_backend
        state = kb.get_state(ValueStateDescriptor("count", int, default=0))
        for key in list(kb.keys("count")):
            kb.set_current_key(key)
            counts[key] = state.value()
    runner.close()
    exact = counts == dict(truth) and rows[0] == sum(truth.values())
    spark.stop()

    if args.csv:
        with open(args.csv, "w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=list(asdict(samples[0])))
            writer.writeheader()
            writer.writerows(asdict(s) for s in samples)
    tenth = max(1, len(samples) // 10)
    print(
        f"\n{len(samples)} micro-batches in {total:.0f}s, backend {args.backend}, retained {args.retained}, "
        f"Spark settings {args.spark_conf or 'default'}; "
        f"counts exact: {exact} ({len(counts)} URLs, {rows[0]} output rows)"
    )
    print(f"{'series':<18}{'first tenth':>14}{'last tenth':>14}{'max':>12}{'slope/100 batches':>20}")
    steady = samples[1:]  # batch 0 starts the Python workers and the JIT
    for name in ("seconds", "driver_rss_mb", "driver_fds", "jvm_rss_mb", "jvm_fds", "worker_rss_mb",
                 "worker_fds", "checkpoint_mb", "checkpoint_files"):  # fmt: skip
        values = [float(getattr(s, name)) for s in steady]
        first, end = statistics.fmean(values[:tenth]), statistics.fmean(values[-tenth:])
        print(f"{name:<18}{first:>14.2f}{end:>14.2f}{max(values):>12.2f}{_slope_per_100(values):>20.3f}")
    print(f"subtasks reused {sum(s.reused for s in samples)}, restored {sum(s.restored for s in samples)}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    if not exact:
        sys.exit("the counts are not exact")


if __name__ == "__main__":
    main()
