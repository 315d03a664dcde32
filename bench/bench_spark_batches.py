"""Micro-batches on Spark over a large heap state: what a due base costs the batch that is due for it.

On Spark every micro-batch is a checkpoint. The heap's checkpoints are deltas,
and about every eleventh (``max-deltas`` 10) is due for a base of the whole
state. Per mode, one application (``local[2]``, parallelism 2, filesystem
checkpoints) runs ``CountPerUrl`` over an input of ``N`` distinct keys (batch 0
builds the state), then ``--batches`` files of 1 % of the keys each, drawn at
random, one file a batch (``maxFilesPerTrigger`` 1, ``availableNow``; or, with
``--trigger S``, a processing-time trigger of ``S`` seconds, so batches have idle
time between them as a job that keeps up with its input has):

- **sync** (``spark.statekit.backend.heap.base-in-background=false``): the
  batch that is due writes the base in its tasks;
- **background** (the default): the due batch writes a delta and the base is
  encoded on a thread of the Python worker that holds the subtask; the first
  batch after it finished uploads it.

Reported per mode, over batches 1..K (Spark's ``triggerExecution`` of each, from
``query.recentProgress``): the slowest batch, the median, the 95th percentile
and the sum; the largest ``task_snapshot`` of a batch (statekit's seconds of
snapshots, summed over the subtasks); and every batch's seconds. The counts of
2,000 keys are checked against a model.

Run: ``python bench/bench_spark_batches.py [--keys 4000000] [--batches 24]``; run it twice.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any

CHECKED = 2000


def write_inputs(work: str, n: int, batches: int) -> dict[str, int]:
    """``part-0``: keys ``k0..k<n-1>``; then ``batches`` files of 1 % of them. The model of ``k0..``."""
    inp = os.path.join(work, "input")
    os.makedirs(inp)
    with open(os.path.join(inp, "part-000.csv"), "w", encoding="utf-8") as f:
        for start in range(0, n, 100_000):
            f.write("".join(f"k{i}\n" for i in range(start, min(start + 100_000, n))))
    model = dict.fromkeys((f"k{i}" for i in range(CHECKED)), 1)
    rng = random.Random(3)
    for b in range(1, batches + 1):
        sample = rng.sample(range(n), n // 100)
        with open(os.path.join(inp, f"part-{b:03d}.csv"), "w", encoding="utf-8") as f:
            f.write("".join(f"k{i}\n" for i in sample))
        for i in sample:
            if i < CHECKED:
                model[f"k{i}"] += 1
    return model


def child(work: str, background: bool, trigger: float) -> None:
    """One application: the query over every input file; its batches' seconds, as JSON."""
    from statekit.spark import keyed
    from statekit_urlcount import CountPerUrl, local_spark_session

    spark = local_spark_session(
        "statekit-bench-batches",
        conf={
            "spark.statekit.parallelism": "2",
            "spark.driver.memory": "6g",
            "spark.sql.shuffle.partitions": "2",
        },
    )
    spark.conf.set("spark.statekit.backend", "heap")
    spark.conf.set("spark.statekit.backend.heap.base-in-background", str(background).lower())
    spark.conf.set("spark.statekit.checkpoint.storage", "filesystem")
    spark.conf.set("spark.statekit.checkpoints.dir", os.path.join(work, "statekit-checkpoints"))
    seen: dict[str, int] = {}

    def sink(batch_df: Any, batch_id: int) -> None:
        for row in batch_df.where(f"length(url) <= {len(str(CHECKED)) + 1}").collect():
            url = row["url"]
            if int(url[1:]) < CHECKED:
                seen[url] = max(seen.get(url, 0), int(row["count"]))

    infos: list[Any] = []
    stream = (
        spark.readStream.schema("url string").option("maxFilesPerTrigger", 1).csv(os.path.join(work, "input"))
    )
    processed = keyed(stream, key="url", key_type=str).process(
        CountPerUrl, output_schema="url string, count long", job_id="bench-batches", on_batch=infos.append
    )
    every = {"processingTime": f"{trigger:g} seconds"} if trigger else {"availableNow": True}
    query = processed.foreach_batch(sink).start(
        checkpoint_location=os.path.join(work, "spark-checkpoint"), trigger=every
    )
    if trigger:
        query.processAllAvailable()
        query.stop()
    else:
        query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"the query failed: {query.exception()}")
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    seconds = {int(p["batchId"]): p["durationMs"]["triggerExecution"] / 1000 for p in progress}
    snapshots = {int(i.batch_id): i.phases.get("task_snapshot", 0.0) for i in infos}
    print(json.dumps({"seconds": seconds, "snapshot": snapshots, "seen": seen}), flush=True)
    spark.stop()


def run(n: int, batches: int, background: bool, trigger: float, root: str) -> dict[str, Any]:
    work = os.path.join(root, f"{n}-{background}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    model = write_inputs(work, n, batches)
    done = subprocess.run(
        [sys.executable, __file__, "--child", work, "--trigger", str(trigger)]
        + (["--background"] if background else []),
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the application failed:\n{done.stderr[-3000:]}")
    got = json.loads(lines[-1])
    if got["seen"] != model:
        wrong = {k: (got["seen"].get(k), v) for k, v in model.items() if got["seen"].get(k) != v}
        raise SystemExit(f"counts differ from the model (got, want): {dict(list(wrong.items())[:10])}")
    shutil.rmtree(work, ignore_errors=True)
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--keys", default="4000000")
    ap.add_argument("--batches", type=int, default=24)
    ap.add_argument(
        "--trigger", type=float, default=0.0, help="a processing-time trigger of this many seconds"
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--background", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.background, args.trigger)
        return 0
    root = tempfile.mkdtemp(prefix="statekit-bench-batches-")
    try:
        print(
            "| keys | mode | slowest batch s | median s | p95 s | batches s (sum) | "
            "largest task_snapshot s | "
            "load before / after |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for n in (int(x) for x in args.keys.split(",")):
            for background in (False, True):
                before = " ".join(f"{x:.2f}" for x in os.getloadavg())
                got = run(n, args.batches, background, args.trigger, root)
                secs = sorted(v for k, v in got["seconds"].items() if int(k) >= 1)
                snaps = [v for k, v in got["snapshot"].items() if int(k) >= 1]
                after = " ".join(f"{x:.2f}" for x in os.getloadavg())
                print(
                    f"| {n / 1e6:g}M | {'background' if background else 'sync'} | {secs[-1]:.2f} | "
                    f"{statistics.median(secs):.2f} | {secs[int(0.95 * (len(secs) - 1))]:.2f} | "
                    f"{sum(secs):.1f} | {max(snaps):.2f} | {before} / {after} |",
                    flush=True,
                )
                per = {int(k): round(v, 2) for k, v in got["seconds"].items()}
                print(f"    batches (s): {dict(sorted(per.items()))}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
