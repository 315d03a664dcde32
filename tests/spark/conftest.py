"""The one Spark session the Spark tests share, and their helpers.

The session is ``local[2,4]``: two cores, like ``local[2]``, and up to four
attempts per task (Spark's local mode ignores ``spark.task.maxFailures``; the
second number of ``local[N,F]`` is the same setting). Everything binds to
127.0.0.1. Python workers run this interpreter.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
for p in (str(HERE), str(TESTS)):
    if p not in sys.path:
        sys.path.insert(0, p)

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError:  # without statekit[spark] installed, these tests are not collected
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The shared SparkSession (session-scoped): local[2,4], UI off, small shuffles."""
    for key in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        os.environ[key] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("statekit-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.task.maxFailures", "4")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")  # many short jobs
        # PySpark imported from its package, not compiled from pyspark.zip (docs/spark.md#python-daemon)
        .config("spark.python.daemon.module", "statekit_spark_daemon")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    # No addPyFile for the test jobs (tests/jobs.py, sparkjobs.py): statekit.spark ships
    # functions of modules the executors cannot import by value.
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()


@pytest.fixture
def session(spark: Any) -> Any:
    """A session of the shared SparkContext with its own runtime configuration (spark.conf.set)."""
    return spark.newSession()


@pytest.fixture
def job_id() -> str:
    """A job id no other test uses."""
    return f"job-{uuid.uuid4().hex[:10]}"
