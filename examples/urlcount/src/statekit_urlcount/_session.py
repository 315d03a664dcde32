"""A local SparkSession bound to the loopback interface, for the job, its tests and the benchmark."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["active_spark_session", "local_spark_session"]


def active_spark_session() -> SparkSession | None:
    """The SparkSession that runs in this process already, if any (a notebook's, a test suite's)."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def local_spark_session(
    app_name: str = "statekit-urlcount",
    *,
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
    log_level: str = "ERROR",
) -> SparkSession:
    """Starts (or returns the running) SparkSession on this machine only.

    The driver binds to 127.0.0.1, the web UI is off, and Python workers run
    this interpreter (``PYSPARK_PYTHON``), so the packages installed here are
    the ones tasks see; their daemon is ``statekit_spark_daemon``. ``conf``
    adds or overrides Spark settings.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Two cores: Spark's default of 200 shuffle partitions is mostly scheduling overhead here.
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.schemaInference", "false")
        # Python workers import PySpark from its installed package, not compiled afresh from
        # pyspark.zip: a fresh application's first Python task starts sooner (docs/spark.md).
        .config("spark.python.daemon.module", "statekit_spark_daemon")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark
