"""A Spark driver for the tests that need their own process: a driver to kill, a standalone cluster.

Counts URLs of the JSON files in ``--input`` with statekit, one file per
micro-batch (availableNow), writing outputs to ``--out/batch_id=<b>/``. Prints
one JSON line per completed batch and a summary line at the end, into ``--report``.

``--kill-in-sink B`` SIGKILLs the driver's process group right after the sink
wrote batch ``B``, before its checkpoint completes: the worst moment to die.
``--wait-in-sink B --wait-for FILE`` instead waits there until ``FILE`` exists
(another driver takes over the job meanwhile). A query that fails reports
``{"error": ...}`` and the driver exits with status 3.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", default="local[2,4]")
    parser.add_argument("--input", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--spark-checkpoint", required=True)
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--parallelism", type=int, nargs="+", default=[2])
    parser.add_argument("--checkpoints-dir", help="filesystem storage here; default: jobmanager")
    parser.add_argument("--kill-in-sink", type=int, default=None)
    parser.add_argument("--wait-in-sink", type=int, default=None)
    parser.add_argument("--wait-for", help="the file --wait-in-sink waits for")
    parser.add_argument("--restore", help="restore= of start(): where a new query's state comes from")
    parser.add_argument("--retained", type=int, default=1, help="statekit.checkpoints.retained")
    parser.add_argument("--stall-once", help="marker directory of sparkjobs.StallOnceCountUrls")
    parser.add_argument("--backend", default="heap")
    parser.add_argument("--windowed", action="store_true", help="count per URL and minute of @timestamp")
    parser.add_argument("--report", required=True, help="JSON lines: one per batch, then a summary")
    parser.add_argument(
        "--log-source", action="store_true", help="read the --input files through statekit.spark.read_logs"
    )
    parser.add_argument("--max-lines", type=int, default=None, help="read_logs' lines per micro-batch")
    parser.add_argument("--dead-letters", help="read_logs' dead-letter directory (policy dead-letter)")
    args = parser.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from cluster import cluster_app_builder

    builder = cluster_app_builder(args.master, "statekit-test-driver")
    builder = builder.config("spark.statekit.backend", args.backend)
    builder = builder.config("spark.statekit.checkpoints.retained", str(args.retained))
    if args.checkpoints_dir:
        builder = builder.config("spark.statekit.checkpoints.dir", args.checkpoints_dir)
    else:
        builder = builder.config("spark.statekit.checkpoint.storage", "jobmanager")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    from sparkutil import OUTPUT, SCHEMA, stream_of

    from jobs import CountUrls, make_records, model_state, state_of_runner
    from statekit import LocalRunner
    from statekit.spark import BatchInfo, keyed

    report_file = open(args.report, "a")  # noqa: SIM115 - open for the life of the process

    def emit(obj: object) -> None:
        report_file.write(json.dumps(obj) + "\n")
        report_file.flush()

    def sink(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        df.write.mode("overwrite").parquet(f"{args.out}/batch_id={batch_id}")
        if batch_id == args.kill_in_sink:
            emit({"killing_in_sink": batch_id})
            os.killpg(os.getpgid(0), signal.SIGKILL)
        if batch_id == args.wait_in_sink:
            emit({"waiting_in_sink": batch_id})
            while not os.path.exists(args.wait_for):
                time.sleep(0.1)

    def report(info: BatchInfo) -> None:
        emit({"batch": dataclasses.asdict(info)})

    batches = []
    for p in args.parallelism:  # several: the same query restarted in this driver, rescaled
        spark.conf.set("spark.statekit.parallelism", str(p))
        if args.windowed:
            from pyspark.sql import functions as F
            from sparkjobs import flaky_windowed_count

            from statekit import EventTime

            timed = stream_of(spark, Path(args.input)).withColumn(
                "ts", F.to_timestamp(F.col("`@timestamp`"), "dd/MMM/yyyy:HH:mm:ss")
            )
            processed = (
                keyed(timed, "url")
                .process(
                    flaky_windowed_count(""),
                    "url string, start long, end long, n long",
                    job_id=args.job_id,
                    on_batch=lambda i: (batches.append(i), report(i)),
                    event_time=EventTime("ts", 0),
                )
                .foreach_batch(sink)
            )
            query = processed.start(checkpoint_location=args.spark_checkpoint, trigger={"availableNow": True})
            query.awaitTermination()
            # The last batch fired the windows of the watermark it ran with: the one before it.
            ran = [b.watermark for b in batches if not b.skipped]
            emit({"summary": {"fired_up_to": ran[-2] if len(ran) > 1 else None}})
            spark.stop()
            return
        function: Any = CountUrls
        if args.stall_once:
            from sparkjobs import StallOnceCountUrls

            function = functools.partial(StallOnceCountUrls, args.stall_once)
        if args.log_source:
            from pyspark.sql import types as T

            from statekit.spark import read_logs

            lines = read_logs(
                spark, args.input, parse=json.loads, schema=T._parse_datatype_string(SCHEMA),
                max_lines_per_trigger=args.max_lines,
                config={"statekit.bad-records.policy": "dead-letter",
                        "statekit.bad-records.dead-letter-path": args.dead_letters},
            )  # fmt: skip
        else:
            lines = stream_of(spark, Path(args.input))
        processed = (
            keyed(lines, "url")
            .process(function, OUTPUT, job_id=args.job_id, on_batch=lambda i: (batches.append(i), report(i)))
            .foreach_batch(sink)
        )
        query = processed.start(
            checkpoint_location=args.spark_checkpoint, trigger={"availableNow": True}, restore=args.restore
        )
        try:
            query.awaitTermination()
        except Exception as e:  # noqa: BLE001 - reported to the test
            emit({"error": str(e)})
            spark.stop()
            sys.exit(3)
        if len(args.parallelism) > 1 and p == args.parallelism[0]:
            # Feed the next run: more files, as a live source would.
            from sparkutil import write_inputs

            write_inputs(Path(args.input), make_records(600, seed=11), 2, start=100)

    storage = processed.checkpoint_storage()
    runner = LocalRunner(CountUrls, key_selector=lambda r: r["url"], storage=storage, job_id=args.job_id,
                         config={"statekit.parallelism": 2, "statekit.backend": args.backend})  # fmt: skip
    runner.restore("latest")
    records = []
    given = Path(args.input)
    inputs = given.parent.glob("access.log*") if args.log_source else given.glob("part-*.json")
    for path in sorted(inputs):
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:  # the log source's malformed lines: dead letters, not records
                continue
    summary = {
        "state_ok": state_of_runner(runner) == model_state(records),
        "records": len(records),
        "driver_pid": os.getpid(),
        "executor_pids": sorted({pid for b in batches for pid in b.executor_pids}),
        "reused": sum(b.reused_subtasks for b in batches),
        "parallelisms": [b.parallelism for b in batches],
    }
    emit({"summary": summary})
    spark.stop()


if __name__ == "__main__":
    main()
