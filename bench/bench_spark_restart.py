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
   Also reported, *from definition*: the same end, timed from before the
   query is defined (its reader, ``keyed(...).process(...)`` or
   ``groupBy(...).count()``, and the writer). Spark analyses a query of its own
   as it is defined, before ``start()``; statekit does its part (the routing's
   analysis, its writer) inside ``start()``. This measure charges both the same.

``--rescale P`` (statekit methods only: Spark's own store cannot change its
number of partitions) then restarts twice more, each time after one more small
file: at parallelism ``P`` (a rescale 2 → P of the checkpoint the restart above
wrote) and back at 2 (P → 2). The table then gives each restart with the
rescales' ratio to the restart at the same parallelism, and the tasks' restore
(``task_restore``, summed over the subtasks) of each.

Every method's first batch is checked: the counts the sink sees for the new
file's keys (new ones, and known ones the restored state must hold) are the
counts of every file so far. Each restart runs ``--repeats``
times (the first file's state is rebuilt each time); the medians are reported,
with statekit's per-phase seconds of the first batch (``BatchInfo.phases``).

Run: ``python bench/bench_spark_restart.py [--keys 1000000,4000000] [--methods heap,rocksdb,native]
[--rescale 3]``.
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
        # After the build (batch 0): the known keys too, whose counts the restore must carry.
        wanted = "url LIKE 'probe%'" + (" OR url LIKE 'k%'" if batch_id > 0 else "")
        for row in batch_df.where(wanted).collect():
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


def child(method: str, work: str, parallelism: int = 2) -> None:
    """One application: run the query over whatever input is new, print its seconds and first batch."""
    from statekit_urlcount import local_spark_session

    spark = local_spark_session(
        "statekit-bench-restart",
        conf={
            "spark.statekit.parallelism": str(parallelism),
            "spark.driver.memory": "6g",
            "spark.sql.shuffle.partitions": "2",
        },
    )
    seen: dict[str, int] = {}
    infos: list[Any] = []
    defined = time.perf_counter()
    writer = _query(spark, method, work, seen, infos)
    t0 = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    end = time.perf_counter()
    if query.exception() is not None:
        raise SystemExit(f"{method}: the query failed: {query.exception()}")
    phases = {k: round(v, 3) for k, v in infos[0].phases.items()} if infos else {}
    print(json.dumps({"seconds": end - t0, "from_definition": end - defined, "seen": seen, "phases": phases}),
          flush=True)  # fmt: skip
    spark.stop()


def _run_child(method: str, work: str, parallelism: int = 2) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", method, "--workdir", work, "--parallelism", str(parallelism)],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{method}: the application failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def add_file(work: str, index: int, new: int) -> list[str]:
    """Input file ``index``: ``new`` known keys (counted once more) and ``new`` probes twice; the probes."""
    probes = [f"probe{index}-{i}" for i in range(new)]
    path = os.path.join(work, "input", f"part-{index}.csv")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write("".join(f"k{i}\n" for i in range(new)))
        f.write("".join(f"{p}\n{p}\n" for p in probes))
    os.replace(path + ".tmp", path)
    return probes


def restart(method: str, work: str, index: int, new: int, parallelism: int) -> dict[str, Any]:
    """Add input file ``index``, restart the query at ``parallelism``, check the counts of its keys.

    A probe is new (counted twice in the file); a known key was counted once by
    the build and once by each file since: the restored state must hold it.
    """
    probes = add_file(work, index, new)
    got = _run_child(method, work, parallelism)
    expected = {**dict.fromkeys(probes, 2), **{f"k{i}": index + 1 for i in range(new)}}
    if got["seen"] != expected:
        seen = got["seen"]
        wrong = sorted(k for k in expected.keys() | seen.keys() if seen.get(k) != expected.get(k))
        raise SystemExit(
            f"{method} at p={parallelism}: the restarted query's counts are wrong for {len(wrong)} keys, "
            f"e.g. {[(k, seen.get(k), expected.get(k)) for k in wrong[:5]]} (key, counted, expected)"
        )
    return got


def measure(method: str, keys: int, new: int, root: str, rescale: int | None = None) -> dict[str, Any]:
    """Build ``keys`` keys of state with ``method``, add a small file, time the restart to the first batch."""
    work = os.path.join(root, f"{method}-{keys}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "input"))
    write_keys(os.path.join(work, "input", "part-0.csv"), 0, keys)
    t0 = time.perf_counter()
    built = _run_child(method, work)
    build = time.perf_counter() - t0
    restarted = restart(method, work, 1, new, 2)
    got = {"restart": restarted["seconds"], "from_definition": restarted["from_definition"], "build": build,
           "first_build_batch": built["seconds"], "phases": restarted["phases"]}  # fmt: skip
    if rescale is not None and method != "native":
        up = restart(method, work, 2, new, rescale)
        down = restart(method, work, 3, new, 2)
        got.update(up=up["seconds"], up_phases=up["phases"], down=down["seconds"], down_phases=down["phases"])
    shutil.rmtree(work, ignore_errors=True)
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", default="1000000,4000000", help="comma-separated key counts")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    ap.add_argument("--new", type=int, default=1000, help="keys of the file the restart processes")
    ap.add_argument("--repeats", type=int, default=1, help="restarts per method and size (medians)")
    ap.add_argument("--workdir", help="where inputs and checkpoints go (default: a temporary directory)")
    ap.add_argument("--rescale", type=int, help="also restart at this parallelism, then back at 2 (statekit)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--parallelism", type=int, default=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.workdir, args.parallelism)
        return 0
    root = args.workdir or tempfile.mkdtemp(prefix="statekit-bench-restart-")
    methods = args.methods.split(",")
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for keys in (int(k) for k in args.keys.split(",")):
        for r in range(args.repeats):
            for method in methods if r % 2 == 0 else methods[::-1]:
                print(f"{method}, {keys:,} keys, round {r + 1}: building and restarting ...", flush=True)
                got = measure(method, keys, args.new, root, args.rescale)
                results.setdefault((method, keys), []).append(got)
                print(f"  restart to the first batch {got['restart']:.2f} s, from definition "
                      f"{got['from_definition']:.2f} s (build {got['build']:.0f} s) {got['phases']}",
                      flush=True)  # fmt: skip
                if "up" in got:
                    print(
                        f"  rescale 2 -> {args.rescale} {got['up']:.2f} s {got['up_phases']}\n"
                        f"  rescale {args.rescale} -> 2 {got['down']:.2f} s {got['down_phases']}",
                        flush=True,
                    )
    tables = (("restart", "restart to first batch (s)"), ("from_definition", "from definition (s)"))
    for column, title in tables:
        print()
        print("| keys | " + " | ".join(f"{m}: {title}" for m in methods) + " |")
        print("|---|" + "---|" * len(methods))
        for keys in sorted({k for _, k in results}):
            cells = []
            for m in methods:
                runs = sorted(x[column] for x in results.get((m, keys), []))
                cells.append(f"{runs[len(runs) // 2]:.2f}" if runs else "-")
            print(f"| {keys:,} | " + " | ".join(cells) + " |")
    if args.rescale is not None:
        print_rescales(results, methods, args.rescale)
    if not args.workdir:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def print_rescales(results: dict[tuple[str, int], list[dict[str, Any]]], methods: list[str], to: int) -> None:
    """Per method and size: the restart at 2, the rescales, their ratios to it, the tasks' restore seconds."""
    print()
    if "native" in methods:
        print("native has no rescale row: Spark's own state store cannot change its number of partitions")
    print(f"| method | keys | restart at 2 (s) | 2 -> {to} (s) | ratio | {to} -> 2 (s) | ratio "
          f"| task_restore at 2 / 2 -> {to} / {to} -> 2 (s) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for (m, keys), runs in sorted(results.items(), key=lambda kv: (methods.index(kv[0][0]), kv[0][1])):
        for x in runs:
            if "up" not in x:
                continue
            restores = " / ".join(f"{p.get('task_restore', 0.0):.2f}" for p in (x["phases"], x["up_phases"],
                                                                              x["down_phases"]))  # fmt: skip
            print(f"| {m} | {keys:,} | {x['restart']:.2f} | {x['up']:.2f} | {x['up'] / x['restart']:.2f}x "
                  f"| {x['down']:.2f} | {x['down'] / x['restart']:.2f}x | {restores} |")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
