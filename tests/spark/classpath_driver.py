"""A Spark driver with another jar of statekit's class names on spark.jars, for test_spark_locality.py.

Run as ``python classpath_driver.py JAR``: starts a local Spark with ``spark.jars=JAR``,
asks for the locality helper twice (as a query does; the second time past the
``spark.jars`` check, to see the driver's code-source check on its own), and prints one
JSON object: the two errors, and where the class the driver's class path gives comes from.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession

from statekit.spark import _jvm

jar = sys.argv[1]
session = (
    SparkSession.builder.master("local[1]")
    .appName("statekit-classpath")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.host", "127.0.0.1")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .config("spark.jars", jar)
    .getOrCreate()
)
out: dict[str, str | None] = {}
try:
    session.sparkContext.setLogLevel("ERROR")
    for step in ("spark.jars", "code source"):
        try:
            _jvm.JvmLocality(session)
            out[step] = None
        except _jvm.LocalityUnavailable as e:
            out[step] = str(e)
        _jvm._check_no_other_jar = lambda sc, jar: None  # type: ignore[assignment]
    jvm = session.sparkContext._jvm
    parent = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
    cls = jvm.java.lang.Class.forName("io.statekit.spark.Locality", False, parent)
    out["parent gives"] = str(cls.getProtectionDomain().getCodeSource().getLocation())
    print(json.dumps(out))
finally:
    session.stop()
