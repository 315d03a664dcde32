"""The example's local Spark session, for the tests of its Spark jobs."""

from __future__ import annotations

import pytest


@pytest.fixture
def local_spark():
    """``local_spark_session()``, stopped after the test unless it was running before.

    In a test process that already runs another suite's session (the Spark
    tests of ``tests/spark`` share one), ``local_spark_session`` returns that
    one: stopping it would stop it under the other tests' feet.
    """
    pytest.importorskip("pyspark")
    from pyspark import SparkContext

    from statekit_urlcount import local_spark_session

    running_before = SparkContext._active_spark_context is not None
    spark = local_spark_session()
    yield spark
    if not running_before:
        spark.stop()
