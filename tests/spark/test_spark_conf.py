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


def _entry_by_entry(jconf: Any) -> dict[str, str]:
    from statekit.spark._sparkconf import _ours

    return {str(e._1()): str(e._2()) for e in jconf.getAll() if _ours(str(e._1()))}


def test_statekits_keys_of_the_sparkconf_read_back_exactly_whatever_the_values_hold(spark: Any) -> None:
    """Keys come from Spark's (redacted) debug string; values, line breaks and ``=`` in keys are exact."""
    from statekit.spark._sparkconf import _app_settings

    cases: list[dict[str, str]] = [
        {},
        {"spark.statekit.backend": "rocksdb", "spark.statekit.storage.filesystem.secret": "s3cr=t"},
        {"spark.statekti.backend": "heap"},  # a near miss is read, for validation to refuse it
        {"spark.statekit.parallelism": "2", "spark.other": "a\nspark.statekit.injected=1"},
        {"spark.statekit.backend=lmdb": "x", "spark.statekit.backend": "heap"},
        {"spark.statekit.checkpoints.dir": "/tmp/a=b\nc"},
    ]
    for case in cases:
        jconf = spark.sparkContext._jsc.getConf()  # a copy of the application's: set here, seen nowhere else
        for k, v in case.items():
            jconf.set(k, v)
        counted = _Counted(jconf)
        assert _app_settings(counted) == _entry_by_entry(jconf), case
        # Entry by entry (a second getAll) only where a line break or a key's "=" would misplace a key.
        unclear = any("\n" in v for v in case.values()) or any("=" in k for k in case)
        assert counted.calls.count("getAll") == (2 if unclear else 1), case


class _Counted:
    """A Py4J object whose method lookups are recorded."""

    def __init__(self, target: Any) -> None:
        self.target, self.calls = target, []

    def __getattr__(self, name: str) -> Any:
        self.calls.append(name)
        return getattr(self.target, name)


def test_statekits_keys_of_the_session_read_back_exactly(spark: Any) -> None:
    from statekit.spark._sparkconf import _ours, _runtime_settings

    cases = [
        {"spark.statekit.metrics.exact-entries": "false", "statekit.backend": "heap"},
        {"spark.statekit.a\nspark.statekit.b": "1", "spark.statekit.b": "2"},  # a key with a line break
    ]
    for case in cases:
        for k, v in case.items():
            spark.conf.set(k, v)
        try:
            expected = {k: v for k, v in spark.conf.getAll.items() if _ours(k)}
            assert _runtime_settings(spark) == expected
            assert set(case) <= set(expected)
        finally:
            for k in case:
                spark.conf.unset(k)
