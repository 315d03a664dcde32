"""The Python workers warmed when a query starts (statekit.spark._warmup).

A fresh interpreter shows what a warm-up imports; the shared session shows the
job, its once-per-application rule, the switch, and a failure said, not raised.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from typing import Any

import pytest


def test_a_warmed_worker_holds_what_a_task_imports() -> None:
    """In a fresh interpreter, the warm-up imports the task's modules, the plugins' and pandas via pyarrow."""
    code = (
        "import json, sys\n"
        "from statekit.spark._warmup import _warm\n"
        "before = set(sys.modules)\n"
        "out = list(_warm(iter(()), backend='heap', storage='filesystem'))\n"
        "mods = ('statekit.spark._task', 'statekit_heap', 'statekit_storage', 'pyarrow', 'pandas')\n"
        "print(json.dumps({'before': [m for m in mods if m in before], 'after': [m for m in mods if m in "
        "sys.modules], 'rows': out[0].num_rows}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["before"] == ["pyarrow"], got  # statekit.spark loads pyarrow; none of the rest
    assert got["after"] == ["statekit.spark._task", "statekit_heap", "statekit_storage", "pyarrow", "pandas"]
    assert got["rows"] == 1


def _config(**options: object) -> Any:
    from statekit.plugins._config import Configuration

    return Configuration.from_mapping({"statekit.backend": "heap", **options})


def test_once_per_application_and_off_by_configuration(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first query of an application starts the job; later ones, and warm-up=false, do not."""
    from statekit.spark import _warmup

    monkeypatch.setattr(_warmup, "_warmed", set())
    assert _warmup.start_warm_up(spark, _config(**{"statekit.spark.warm-up": False}), "off") is None
    thread = _warmup.start_warm_up(spark, _config(), "first")
    assert isinstance(thread, threading.Thread)
    thread.join(timeout=600)
    assert not thread.is_alive()
    assert _warmup.start_warm_up(spark, _config(), "second") is None  # the same application
    assert _warmup._warmed == {spark.sparkContext.applicationId}


def test_the_job_runs_in_the_application_s_python_workers(spark: Any) -> None:
    """One task per core, in Python workers, not the driver; the caller's job description is kept."""
    from statekit.spark._warmup import warm_up

    sc = spark.sparkContext
    sc.setLocalProperty("spark.job.description", "the caller's")
    try:
        pids = warm_up(spark, "described", "heap", "filesystem")
        assert sc.getLocalProperty("spark.job.description") == "the caller's"
    finally:
        sc.setLocalProperty("spark.job.description", None)
    assert len(pids) == sc.defaultParallelism
    assert os.getpid() not in pids


def test_a_failed_warm_up_is_logged_with_its_job_and_cause(
    spark: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A backend a worker cannot load fails the warm-up: logged at WARNING, naming the job and the backend."""
    from statekit.spark import _warmup

    monkeypatch.setattr(_warmup, "_warmed", set())
    with caplog.at_level(logging.WARNING, logger="statekit.spark"):
        _warmup._run(spark, "broken", "no-such-backend", "filesystem")
    [record] = [r for r in caplog.records if r.name == "statekit.spark"]
    text = record.getMessage()
    assert "statekit job 'broken'" in text and "no-such-backend" in text, text


def test_workers_import_pyspark_from_its_package_under_statekit_s_daemon(spark: Any) -> None:
    """Under ``statekit_spark_daemon`` (the shared session's) workers import the package's PySpark."""
    import pyspark

    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == "statekit_spark_daemon"

    def where(batches: Any) -> Any:
        import sys

        import pyarrow as pa
        import pyspark as worker_pyspark

        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict(
            {"file": [worker_pyspark.__file__], "daemon": ["statekit_spark_daemon" in sys.modules]}
        )

    rows = spark.range(0, 2, 1, 2).mapInArrow(where, "file string, daemon boolean").collect()
    assert {r["file"] for r in rows} == {pyspark.__file__}
    assert all(r["daemon"] for r in rows)  # forked from statekit's daemon, which imported it first


def test_a_worker_under_statekit_s_daemon_collects_the_young_generations_after_a_task(spark: Any) -> None:
    """PySpark's daemon module, in a worker it forked, calls statekit's collection, not ``gc``'s full one."""

    def collector(batches: Any) -> Any:
        import gc
        import sys

        import pyarrow as pa

        for _ in batches:
            pass
        daemon = sys.modules.get("pyspark.daemon")
        used = getattr(daemon, "gc", None)
        yield pa.RecordBatch.from_pydict(
            {
                "collector": [type(used).__name__],
                "full": [used is gc],
                "gc_names": [used.isenabled is gc.isenabled],
            }
        )

    rows = (
        spark.range(0, 2, 1, 2)
        .mapInArrow(collector, "collector string, full boolean, gc_names boolean")
        .collect()
    )
    assert {r["collector"] for r in rows} == {"_YoungCollections"}
    assert not any(r["full"] for r in rows)
    assert all(r["gc_names"] for r in rows)  # the rest of the gc module is gc's own
