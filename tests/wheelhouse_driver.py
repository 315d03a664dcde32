"""Runs in a virtualenv made from the wheelhouse (tests/test_wheelhouse.py): a job on a standalone cluster.

Starts a master and two one-core workers on 127.0.0.1 (tests/spark/cluster.py)
with whatever Java ``JAVA_HOME`` names, runs the URL count as a streaming
query over three files (three micro-batches) with the rocksdb backend and
checkpoints in ``<work>/checkpoints``, and prints one JSON line: where
statekit and its helper were loaded from, whether a ``javac`` was on ``PATH``,
each batch's ``BatchInfo`` (locality, where each subtask ran, how many reused
their open state), and whether the state is exact.

    python tests/wheelhouse_driver.py <work directory>
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "spark"), str(HERE)]


def main() -> None:
    work = Path(sys.argv[1])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    import pyspark
    from cluster import cluster_app_builder, standalone_cluster
    from sparkutil import OUTPUT, restored_state, run_to_end, stream_of, write_inputs

    import statekit
    from jobs import CountUrls, make_records, model_state
    from statekit.spark import _jvm, keyed

    records = make_records(1800)
    report: dict[str, object] = {
        "python": sys.executable,
        "statekit": statekit.__file__,
        "pyspark": pyspark.__version__,
        "javac_on_path": shutil.which("javac"),
        "java_home": os.environ.get("JAVA_HOME"),
    }
    with standalone_cluster(work / "cluster", workers=2) as cluster:
        session = (
            cluster_app_builder(cluster.master_url, "statekit-wheelhouse")
            .config("spark.statekit.backend", "rocksdb")
            .config("spark.statekit.parallelism", "2")
            .config("spark.statekit.checkpoints.dir", str(work / "checkpoints"))
            .getOrCreate()
        )
        try:
            report["jvm_java_home"] = session.sparkContext._jvm.java.lang.System.getProperty("java.home")
            report["helper"] = _jvm.helper_jar(session.version).jar
            write_inputs(work / "input", records, 3)
            infos: list[Any] = []
            processed = keyed(stream_of(session, work / "input"), "url").process(
                CountUrls, OUTPUT, job_id="wheelhouse", on_batch=infos.append
            )
            run_to_end(processed, work / "spark-checkpoint")
            batches = []
            for info in infos:
                batches.append(
                    {
                        "batch_id": info.batch_id,
                        "locality": info.locality,
                        "subtask_locations": {str(k): v for k, v in info.subtask_locations.items()},
                        "reused_subtasks": info.reused_subtasks,
                        "restored_subtasks": info.restored_subtasks,
                        "executor_pids": list(info.executor_pids),
                    }
                )
            report["batches"] = batches
            state = restored_state(processed.checkpoint_storage(), "wheelhouse")
            report["state_exact"] = state == model_state(records)
        finally:
            session.stop()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
