"""A Spark restart to the first micro-batch: statekit (heap, rocksdb) against Spark's RocksDB state store.

For each method and key count ``N`` (``--keys``, default 1M and 4M):

1. *build* (untimed): a fresh application runs a streaming query over one input
   file of ``N`` distinct keys, so its state holds ``N`` keys after batch 0;
   statekit's ``CountPerUrl`` on ``heap`` or ``rocksdb`` (filesystem checkpoints),
   or Spark's own ``groupBy("url").count()`` on the RocksDB state store provider
   (update mode). The application ends.
2. *restart* (timed): one small file (``--new`` keys, half of them known) is added
   to the input, and a fresh application (a new process: nothing of the first one
   is open) starts the same query from the same checkpoint location; the time
   from ``start()`` until the first batch has committed (``availableNow``: the
   only batch) is the restart. The SparkSession's own start is not in it.

Every method's first batch is checked: the counts the sink sees for the new
file's keys are the counts of both files together. Each restart runs ``--repeats``
times (the first file's state is rebuilt each time); the medians are reported,
with statekit's per-phase seconds of the first batch (``BatchInfo.phases``).

Run: ``python bench/bench_spark_restart.py [--keys 1000000,4000000] [--methods heap,rocksdb,native]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

METHODS = ("heap", "rocksdb", "native")
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def write_keys(path: str, first: int, count: int) -> None:
    """A CSV file of the keys ``k<first>`` .. ``k<first + count - 1>``, one a line (renamed into place)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        step = 100_000
        for start in range(first, first + count, step):
            f.write("".join(f"k{i}\n" for i in range(start, min(start + step, first + count))))
    os.replace(tmp, path)


def _query(spark: Any, method: str, work: str, seen: dict[str, int], infos: list[Any]) -> Any:
    """The query (not started): its stream writer, for ``method``."""
    stream = (
        spark.readStream.schema("url string").option("maxFilesPerTrigger", 1).csv(os.path.join(work, "input"))
    )

    def sink(batch_df: Any, batch_id: int) -> None:
        for row in batch_df.where("url LIKE 'probe%'").collect():
            seen[row["url"]] = max(seen.get(row["url"], 0), int(row["count"]))

    location = os.path.join(work, "spark-checkpoint")
    if method == "native":
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        out = stream.groupBy("url").count()
        return (
            out.writeStream.foreachBatch(sink)
            .outputMode("update")
            .option("checkpointLocation", location)
            .trigger(availableNow=True)
        )
    from statekit.spark import keyed
    from statekit_urlcount import CountPerUrl

    spark.conf.set("spark.statekit.backend", method)
    spark.conf.set("spark.statekit.checkpoint.storage", "filesystem")
    spark.conf.set("spark.statekit.checkpoints.dir", os.path.join(work, "statekit-checkpoints"))
    processed = keyed(stream, key="url", key_type=str).process(
        CountPerUrl, output_schema="url string, count long", job_id="bench-restart", on_batch=infos.append
    )

    class Writer:
        def start(self) -> Any:
            trigger = {"availableNow": True}
            return processed.foreach_batch(sink).start(checkpoint_location=location, trigger=trigger)

    return Writer()


def child(method: str, work: str) -> None:
    """One application: run the query over whatever input is new, print its seconds and first batch."""
    from statekit_urlcount import local_spark_session

    spark = local_spark_session(
        "statekit-bench-restart",
        conf={
            "spark.statekit.parallelism": "2",
            "spark.driver.memory": "6g",
            "spark.sql.shuffle.partitions": "2",
        },
    )
    seen: dict[str, int] = {}
    infos: list[Any] = []
    writer = _query(spark, method, work, seen, infos)
    t0 = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    seconds = time.perf_counter() - t0
    if query.exception() is not None:
        raise SystemExit(f"{method}: the query failed: {query.exception()}")
    phases = {k: round(v, 3) for k, v in infos[0].phases.items()} if infos else {}
    print(json.dumps({"seconds": seconds, "seen": seen, "phases": phases}), flush=True)
    spark.stop()


def _run_child(method: str, work: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", method, "--workdir", work],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{method}: the application failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def measure(method: str, keys: int, new: int, root: str) -> dict[str, Any]:
    """Build ``keys`` keys of state with ``method``, add a small file, time the restart to the first batch."""
    work = os.path.join(root, f"{method}-{keys}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "input"))
    write_keys(os.path.join(work, "input", "part-0.csv"), 0, keys)
    probes = [f"probe{i}" for i in range(new)]
    t0 = time.perf_counter()
    built = _run_child(method, work)
    build = time.perf_counter() - t0
    # The new file: known keys (counted twice now) and the probes; the probes are checked.
    with open(os.path.join(work, "input", "part-1.csv.tmp"), "w", encoding="utf-8") as f:
        f.write("".join(f"k{i}\n" for i in range(new)))
        f.write("".join(f"{p}\n{p}\n" for p in probes))
    os.replace(os.path.join(work, "input", "part-1.csv.tmp"), os.path.join(work, "input", "part-1.csv"))
    restarted = _run_child(method, work)
    if restarted["seen"] != dict.fromkeys(probes, 2):
        raise SystemExit(f"{method} {keys}: the restarted query's counts are wrong: {restarted['seen']}")
    shutil.rmtree(work, ignore_errors=True)
    return {"restart": restarted["seconds"], "build": build, "first_build_batch": built["seconds"],
            "phases": restarted["phases"]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", default="1000000,4000000", help="comma-separated key counts")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    ap.add_argument("--new", type=int, default=1000, help="keys of the file the restart processes")
    ap.add_argument("--repeats", type=int, default=1, help="restarts per method and size (medians)")
    ap.add_argument("--workdir", help="where inputs and checkpoints go (default: a temporary directory)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.workdir)
        return 0
    root = args.workdir or tempfile.mkdtemp(prefix="statekit-bench-restart-")
    methods = args.methods.split(",")
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for keys in (int(k) for k in args.keys.split(",")):
        for r in range(args.repeats):
            for method in methods if r % 2 == 0 else methods[::-1]:
                print(f"{method}, {keys:,} keys, round {r + 1}: building and restarting ...", flush=True)
                got = measure(method, keys, args.new, root)
                results.setdefault((method, keys), []).append(got)
                print(f"  restart to the first batch {got['restart']:.2f} s (build {got['build']:.0f} s) "
                      f"{got['phases']}", flush=True)  # fmt: skip
    print()
    print("| keys | " + " | ".join(f"{m}: restart to first batch (s)" for m in methods) + " |")
    print("|---|" + "---|" * len(methods))
    for keys in sorted({k for _, k in results}):
        cells = []
        for m in methods:
            runs = sorted(x["restart"] for x in results.get((m, keys), []))
            cells.append(f"{runs[len(runs) // 2]:.2f}" if runs else "-")
        print(f"| {keys:,} | " + " | ".join(cells) + " |")
    if not args.workdir:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
