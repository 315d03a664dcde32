"""A classic application's SparkConf read one key at a time (statekit.spark._sparkconf.app_setting)."""

from __future__ import annotations

from typing import Any


def test_a_setting_is_read_as_the_application_set_it_and_a_missing_one_is_the_default(spark: Any) -> None:
    from statekit.spark._sparkconf import app_setting

    sc = spark.sparkContext
    copy = dict(sc.getConf().getAll())  # what PySpark's own (whole) copy says
    for key in ("spark.master", "spark.app.name", "spark.driver.host"):
        assert app_setting(sc, key) == copy[key]
    assert app_setting(sc, "spark.statekit.no-such-key") is None
    assert app_setting(sc, "spark.statekit.no-such-key", "fallback") == "fallback"
    spark.conf.set("spark.statekit.session-only", "x")  # a session's runtime setting is not the application's
    try:
        assert app_setting(sc, "spark.statekit.session-only") is None
    finally:
        spark.conf.unset("spark.statekit.session-only")
