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


def test_a_query_that_ends_before_its_warm_up_waits_for_it(
    session: Any, tmp_path: Any, job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``availableNow`` query with nothing to read ends first; its end waits for the warm-up's job.

    Both cores are held by a job whose tasks wait for a file, so the warm-up's
    tasks wait too. Without the wait, the application's stop that follows kills
    the warm-up's workers mid-task (Spark logs "Python worker exited
    unexpectedly (crashed)").
    """
    from sparkutil import OUTPUT, stream_of, wait_until

    from jobs import CountUrls
    from statekit.spark import _warmup, keyed
    from statekit.spark._query import StartedQuery

    monkeypatch.setattr(_warmup, "_warmed", set())
    sc = session.sparkContext
    release, started = tmp_path / "release", tmp_path / "started"
    started.mkdir()

    def hold(i: int) -> int:
        import os
        import time

        open(os.path.join(str(started), str(i)), "w").close()
        while not os.path.exists(str(release)):
            time.sleep(0.05)
        return i

    slots = sc.defaultParallelism
    holder = threading.Thread(target=lambda: sc.parallelize(range(slots), slots).map(hold).collect())
    holder.start()
    try:
        wait_until(lambda: len(os.listdir(started)) == slots, "the holding job's tasks to start")
        session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "statekit"))
        (tmp_path / "in").mkdir()
        query = (
            keyed(stream_of(session, tmp_path / "in"), "url")
            .process(CountUrls, OUTPUT, job_id=job_id)
            .write_files(str(tmp_path / "out"))
            .start(checkpoint_location=str(tmp_path / "cp"), trigger={"availableNow": True})
        )
        assert isinstance(query, StartedQuery)
        warm_up = query._on_end.__self__.warm_up  # type: ignore[attr-defined]  # the query's driver's
        returned = threading.Event()
        waiter = threading.Thread(target=lambda: (query.awaitTermination(), returned.set()))
        waiter.start()
        wait_until(lambda: not query.isActive, "the query over an empty folder to end")
        # The query has ended; its warm-up cannot have (its tasks wait for the cores).
        assert not returned.wait(1.0), "awaitTermination returned while the warm-up's job was waiting"
        assert warm_up.is_alive()
    finally:
        release.touch()
        holder.join(timeout=600)
    assert returned.wait(600), "awaitTermination did not return once the warm-up could run"
    waiter.join(timeout=60)
    assert not warm_up.is_alive()
    assert list(sc.statusTracker().getActiveJobsIds()) == []  # nothing left for a stop to kill
