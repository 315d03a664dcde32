"""A Spark driver with its UI on, for the Statekit tab's browser test.

Counts URLs of the JSON files in ``--input`` with statekit (one file per
micro-batch, availableNow), then writes ``--report`` (the UI's URL and every
``BatchInfo``, as JSON) and keeps the application, so its UI, up until the
file ``--done`` appears (or ten minutes pass).
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
sys.path[:0] = [str(HERE), str(HERE.parent)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", required=True)
    parser.add_argument("--spark-checkpoint", required=True)
    parser.add_argument("--checkpoints-dir", required=True)
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--report", required=True)
    parser.add_argument("--done", required=True)
    args = parser.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("statekit-ui-test")
        .config("spark.ui.enabled", "true")
        .config("spark.ui.port", "0")  # any free port, on SPARK_LOCAL_IP (127.0.0.1)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .config("spark.statekit.parallelism", "2")
        .config("spark.statekit.checkpoints.dir", args.checkpoints_dir)
        .config("spark.statekit.checkpoints.retained", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    from sparkutil import OUTPUT, stream_of

    from jobs import CountUrls
    from statekit.spark import BatchInfo, keyed

    batches: list[BatchInfo] = []
    processed = (
        keyed(stream_of(spark, Path(args.input)), "url")
        .process(CountUrls, OUTPUT, job_id=args.job_id, on_batch=batches.append)
        .foreach_batch(lambda df, _: df.count())
    )
    query = processed.start(checkpoint_location=args.spark_checkpoint, trigger={"availableNow": True})
    query.awaitTermination()
    ui = spark.sparkContext.uiWebUrl
    assert ui is not None

    def plain(info: BatchInfo) -> dict[str, Any]:
        out = dataclasses.asdict(info)
        out["subtask_locations"] = {str(k): v for k, v in info.subtask_locations.items()}
        return out

    report = {"ui": ui, "batches": [plain(b) for b in batches]}
    Path(args.report).write_text(json.dumps(report))
    deadline = time.monotonic() + 600
    while not Path(args.done).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    spark.stop()


if __name__ == "__main__":
    main()
