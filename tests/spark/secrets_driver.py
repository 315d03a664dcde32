"""A Spark driver with its UI on, for test_spark_secrets.py: what the UI shows, what statekit warned.

Run as ``python secrets_driver.py SECRET CONTROL``: SECRET goes where statekit advises
(``secret-storage-options``), CONTROL where it should not (``storage-options``, which Spark
shows). Prints one JSON object.
"""

from __future__ import annotations

import json
import sys
import urllib.request
import warnings

from pyspark.sql import SparkSession

from statekit import default_registry
from statekit.spark._sparkconf import spark_configuration

secret, control = sys.argv[1], sys.argv[2]
base = "spark.statekit.checkpoint.storage.filesystem"
session = (
    SparkSession.builder.master("local[1]")
    .appName("statekit-secrets")
    .config("spark.ui.enabled", "true")
    .config("spark.ui.port", "0")
    .config("spark.ui.showConsoleProgress", "false")
    .config("spark.driver.host", "127.0.0.1")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .config("spark.statekit.checkpoints.dir", "s3://bucket/ckpt")
    .config(
        f"{base}.storage-options",
        json.dumps({"client_kwargs": {"endpoint_url": "http://h:9"}, "account_key": control}),
    )
    .config(f"{base}.secret-storage-options", json.dumps({"key": "AKIAID", "secret": secret}))
    .getOrCreate()
)
try:
    session.sparkContext.setLogLevel("ERROR")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        conf = spark_configuration(session)
        conf.validate(default_registry())  # secret-storage-options is a declared option
    sc = session.sparkContext
    url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/environment"
    with urllib.request.urlopen(url, timeout=60) as response:
        environment = response.read().decode()
    print(json.dumps({"environment": environment, "warnings": [str(w.message) for w in caught]}))
finally:
    session.stop()
