"""A Spark Connect client for the tests: a process of its own, as a user's script or notebook is.

``stream``: counts URLs of the JSON files in ``--input`` with statekit, one
file per micro-batch, writing outputs to ``--out/batch_id=<b>/``. With
``--trigger available-now`` it stops once everything is read; with
``--trigger continuous`` it runs until killed (or ``--stop-file`` exists). ``--hold-in-sink B``
makes the sink (which runs on the server) create ``<marker-dir>/in-sink-B``
after writing batch ``B`` and then wait there, before the batch's checkpoint
completes: the moment the test kills the server. A batch replayed after that
does not wait again.

``static``: ``run()`` over the JSON files as static DataFrames (twice, the
second with a batch id already done), ``write_savepoint`` of the state read
back through the ``statekit-state`` data source, and a run from that savepoint.

Both print JSON lines into ``--report``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Not on PYTHONPATH: statekit.spark ships these modules' functions to the server by value.
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "spark")]


def _emit(report: str, obj: object) -> None:
    with open(report, "a") as f:
        f.write(json.dumps(obj) + "\n")


def stream(args: argparse.Namespace, spark: Any) -> None:
    from sparkutil import OUTPUT, stream_of

    from jobs import CountUrls
    from statekit.spark import keyed

    out, hold, markers = args.out, args.hold_in_sink, args.marker_dir

    def sink(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        # Runs in the Connect server's Python process of this query.
        df.write.mode("overwrite").parquet(f"{out}/batch_id={batch_id}")
        if batch_id == hold:
            marker = Path(markers) / f"in-sink-{batch_id}"
            if not marker.exists():
                marker.write_text(str(os.getpid()))
                time.sleep(600)

    spark.conf.set("spark.statekit.checkpoints.dir", args.checkpoints_dir)
    spark.conf.set("spark.statekit.parallelism", str(args.parallelism))
    lines = stream_of(spark, Path(args.input))
    processed = keyed(lines, "url").process(CountUrls, OUTPUT, job_id=args.job_id)
    processed = processed.foreach_batch(sink) if hold is not None else processed.write_files(out)
    trigger = {"availableNow": True} if args.trigger == "available-now" else "1 second"
    query = processed.start(checkpoint_location=args.spark_checkpoint, trigger=trigger, restore=args.restore)
    _emit(args.report, {"started": str(query.id)})
    if args.stop_file is None:
        query.awaitTermination()
    else:
        while not Path(args.stop_file).exists() and not query.awaitTermination(0.5):
            pass
        query.stop()
    _emit(args.report, {"done": True})


def static(args: argparse.Namespace, spark: Any) -> None:
    from sparkutil import OUTPUT, SCHEMA

    from jobs import COUNT, CountUrls
    from statekit.spark import keyed, register_state_source, write_savepoint

    spark.conf.set("spark.statekit.checkpoints.dir", args.checkpoints_dir)
    spark.conf.set("spark.statekit.parallelism", str(args.parallelism))
    files = sorted(Path(args.input).glob("part-*.json"))
    half = len(files) // 2
    reader = spark.read.schema(SCHEMA)
    infos = []
    for batch_id, part in enumerate((files[:half], files[half:])):
        df = reader.json([str(f) for f in part])
        info = keyed(df, "url").process(CountUrls, OUTPUT, job_id=args.job_id).run(batch_id=batch_id)
        infos.append(dataclasses.asdict(info))
    again = keyed(reader.json([str(f) for f in files[:half]]), "url").process(
        CountUrls, OUTPUT, job_id=args.job_id
    )
    infos.append(dataclasses.asdict(again.run(batch_id=1)))  # done before: skipped, nothing counted twice

    register_state_source(spark)
    counts = (
        spark.read.format("statekit-state")
        .option("checkpointsDir", args.checkpoints_dir)
        .option("jobId", args.job_id)
        .option("state", COUNT.name)
        .load()
    )
    read = {r["key"]: r["value"] for r in counts.select("key", "value").collect()}
    savepoint = write_savepoint(
        args.savepoints_dir, {COUNT: counts.select("key", "value")}, parallelism=3, job_id="bootstrapped"
    )
    # A job started from the savepoint: one more pass over the first half adds to every count.
    more = keyed(reader.json([str(f) for f in files[:half]]), "url").process(
        CountUrls, OUTPUT, job_id=f"{args.job_id}-from-savepoint"
    )
    from_savepoint = more.run(restore=savepoint)
    after = (
        spark.read.format("statekit-state")
        .option("checkpointsDir", args.checkpoints_dir)
        .option("jobId", f"{args.job_id}-from-savepoint")
        .option("state", COUNT.name)
        .load()
    )
    try:
        from sparkutil import stream_of

        keyed(stream_of(spark, Path(args.input)), "url").process(
            CountUrls, OUTPUT, job_id="in-memory", config={"statekit.checkpoint.storage": "jobmanager"}
        ).write_files(str(Path(args.savepoints_dir) / "never")).start(
            checkpoint_location=str(Path(args.savepoints_dir) / "never-started")
        )
        refused = "started"
    except Exception as e:  # noqa: BLE001 - the test checks which error and what it says
        refused = f"{type(e).__name__}: {e}"
    _emit(
        args.report,
        {
            "jobmanager_refused": refused,
            "runs": infos,
            "read": read,
            "savepoint": savepoint,
            "from_savepoint": dataclasses.asdict(from_savepoint),
            "after": {r["key"]: r["value"] for r in after.select("key", "value").collect()},
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["stream", "static"])
    parser.add_argument("--remote", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--out")
    parser.add_argument("--spark-checkpoint")
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--checkpoints-dir", required=True)
    parser.add_argument("--savepoints-dir")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--trigger", choices=["available-now", "continuous"], default="available-now")
    parser.add_argument("--hold-in-sink", type=int, default=None)
    parser.add_argument("--marker-dir")
    parser.add_argument("--stop-file", help="with --trigger continuous: stop the query once it exists")
    parser.add_argument("--report", required=True)
    parser.add_argument("--restore", help="restore= of start()")
    parser.add_argument("--conf", action="append", default=[], help="KEY=VALUE for spark.conf.set")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(args.remote).getOrCreate()
    for setting in args.conf:
        key, _, value = setting.partition("=")
        spark.conf.set(key, value)
    try:
        (stream if args.mode == "stream" else static)(args, spark)
    except Exception as e:  # noqa: BLE001 - reported to the test
        _emit(args.report, {"error": f"{type(e).__name__}: {e}"})
        raise


if __name__ == "__main__":
    main()
