"""A Spark driver with its UI and Spark's Prometheus servlet on, for the metrics tests.

Counts URLs of the JSON files in ``--input`` with statekit (one file per
micro-batch, availableNow), then, with the application still running,
scrapes ``/metrics/prometheus/`` and the REST API's jobs from the UI (bound
to 127.0.0.1) and writes one JSON object into ``--report``: the scrape, the
jobs' descriptions, each batch's checkpoint, the last progress and what a
``StreamingQueryListener`` received.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROMETHEUS_SERVLET = "org.apache.spark.metrics.sink.PrometheusServlet"
sys.path[:0] = [str(HERE), str(HERE.parent)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", required=True)
    parser.add_argument("--spark-checkpoint", required=True)
    parser.add_argument("--checkpoints-dir", required=True)
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--backend", default="heap")
    parser.add_argument("--report", required=True)
    args = parser.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQueryListener

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("statekit-metrics-test")
        .config("spark.ui.enabled", "true")
        .config("spark.ui.port", "0")  # any free port, on SPARK_LOCAL_IP (127.0.0.1)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.ui.prometheus.enabled", "true")
        .config("spark.metrics.conf.*.sink.prometheusServlet.class", PROMETHEUS_SERVLET)
        .config("spark.metrics.conf.*.sink.prometheusServlet.path", "/metrics/prometheus")
        .config("spark.metrics.namespace", "stk")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .config("spark.statekit.backend", args.backend)
        .config("spark.statekit.parallelism", "2")
        .config("spark.statekit.checkpoints.dir", args.checkpoints_dir)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    from sparkutil import OUTPUT, stream_of

    from jobs import CountUrls
    from statekit.spark import BatchInfo, keyed

    progress: list[dict[str, Any]] = []

    class Listener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            progress.append(json.loads(event.progress.json))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    spark.streams.addListener(Listener())
    batches: list[BatchInfo] = []
    processed = (
        keyed(stream_of(spark, Path(args.input)), "url")
        .process(CountUrls, OUTPUT, job_id=args.job_id, on_batch=batches.append)
        .foreach_batch(lambda df, _: df.count())
    )
    query = processed.start(checkpoint_location=args.spark_checkpoint, trigger={"availableNow": True})
    query.awaitTermination()
    spark.streams.awaitAnyTermination(1)  # let the listener bus deliver the last progress

    ui = spark.sparkContext.uiWebUrl
    assert ui is not None
    app = spark.sparkContext.applicationId

    def get(path: str) -> str:
        with urllib.request.urlopen(ui + path, timeout=30) as r:
            return str(r.read().decode())

    report = {
        "ui": ui,
        "prometheus": get("/metrics/prometheus/"),
        "jobs": json.loads(get(f"/api/v1/applications/{app}/jobs")),
        "batches": [{"batch_id": b.batch_id, "location": b.location, "records": b.records} for b in batches],
        "last_progress": json.loads(query.lastProgress.json),
        "listener_progress": progress,
    }
    Path(args.report).write_text(json.dumps(report))
    spark.stop()


if __name__ == "__main__":
    main()
