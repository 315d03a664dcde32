"""A class-data archive of Spark's JVM for the tests: the Spark JVMs they start map their classes from it.

A Spark driver's JVM loads and verifies thousands of classes from Spark's jars
before its first job. On this project's 2-core machines a fresh ``local[2]``
session took 5.9-6.2 s and its first small job 3.7-3.8 s; with the classes
mapped from an archive (the JDK's application class-data sharing: a dynamic
archive written at a JVM's exit by ``-XX:ArchiveClassesAtExit``, read by
``-XX:SharedArchiveFile``), 2.7-3.3 s and 1.5-1.9 s. The suite starts dozens
of such JVMs: the shared sessions, every driver a test kills, the standalone
cluster, the CLI's and the docs' runs. tests/spark/test_spark_processes.py
alone: 157 s without the archive, 110 s with it.

:func:`ensure` writes the archive once per environment (``<venv>/spark-cds/``,
named by the PySpark version and the ``java`` it was made with), on a thread
while the first tests run, by running a small Spark application that touches
what the tests use (JSON and Parquet, a shuffle, Arrow to Python, a streaming
query). :func:`use` hands it to every JVM that ``spark-submit`` starts, through
``SPARK_SUBMIT_OPTS`` (the drivers, the Spark Connect servers), and to the
standalone cluster's daemons, through ``SPARK_DAEMON_JAVA_OPTS``; the cluster's
executors get it in their Java options (tests/spark/cluster.py). Two test
runs started together in one environment make it once: the making holds a
lock beside the archives (``.making.lock``), and a run that finds it held runs
without the archive rather than delete the other's half-written file.

The archive changes how fast a JVM starts, never what it runs. A JVM whose JDK
or class path differs from the archive's (a test that puts a jar on the
driver's class path), or that starts before the file is there, maps nothing
and loads its classes as before, without a word on stdout or stderr (tried by
hand for both). ``STATEKIT_TEST_JVM_ARCHIVE=off`` runs the suite without it.
pytest's header names the archive; where it was made during the run, the
summary's last lines say how that went.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

__all__ = ["Making", "ensure", "executor_options", "use"]

#: The lock file beside the archives that one making holds at a time.
_LOCK_NAME = ".making.lock"

#: The application whose classes go into the archive: what the tests' Spark JVMs load.
_DUMP = textwrap.dedent(
    """
    import os, sys, tempfile
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]").appName("statekit-tests-class-archive")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2").getOrCreate()
    )
    work = tempfile.mkdtemp(prefix="statekit-class-archive-")
    df = spark.range(0, 2000, 1, 2).selectExpr("concat('/u', cast(id % 17 as string)) as url", "id")
    df.write.json(os.path.join(work, "json"))
    back = spark.read.json(os.path.join(work, "json"))
    back.groupBy("url").count().write.parquet(os.path.join(work, "parquet"))
    back.repartition(2, "url").mapInArrow(lambda batches: batches, back.schema).count()
    stream = spark.readStream.schema(back.schema).json(os.path.join(work, "json"))
    query = (
        stream.groupBy("url").count().writeStream.outputMode("update")
        .foreachBatch(lambda batch, batch_id: batch.count())
        .option("checkpointLocation", os.path.join(work, "checkpoint"))
        .trigger(availableNow=True).start()
    )
    query.awaitTermination()
    spark.stop()
    """
)


def _java() -> Path | None:
    """The ``java`` PySpark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def _archive_path() -> Path | None:
    """Where this environment's archive lives; None without PySpark or a ``java``."""
    try:
        import pyspark
    except ImportError:
        return None
    java = _java()
    if java is None:
        return None
    stamp = java.stat().st_mtime_ns
    return Path(sys.prefix) / "spark-cds" / f"spark-{pyspark.__version__}-{stamp}.jsa"


class Making:
    """The archive being written on a thread of its own; :meth:`wait` says how it went."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.said = f"{path} (being made; Spark JVMs started before it is ready start without it)"
        self._thread = threading.Thread(target=self._make, name="spark-class-archive", daemon=True)
        self._thread.start()

    def _make(self) -> None:
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        # One making at a time per environment (two test runs started together): the other's
        # JVMs start without the archive, and its .tmp is not taken for a dead making's.
        with open(path.parent / _LOCK_NAME, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.said = f"not made here: another test run is making it in {path.parent}"
                return
            self._make_locked()

    def _make_locked(self) -> None:
        path = self.path
        if path.exists():  # made by a run that held the lock before this one
            self.said = str(path)
            return
        # Another PySpark's or JDK's archive is never mapped again; a making that died left its .tmp.
        for stale in [*path.parent.glob("spark-*.jsa"), *path.parent.glob("spark-*.tmp")]:
            stale.unlink(missing_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        os.close(fd)
        os.unlink(tmp)  # the JVM writes it at its exit
        env = dict(os.environ, SPARK_SUBMIT_OPTS=f"-XX:ArchiveClassesAtExit={tmp}")
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        started = time.monotonic()
        try:
            done = subprocess.run(
                [sys.executable, "-c", _DUMP], env=env, capture_output=True, text=True, timeout=600
            )
        except subprocess.TimeoutExpired:
            Path(tmp).unlink(missing_ok=True)
            self.said = "not made: the application that writes it ran for more than 600 s"
            return
        if done.returncode != 0 or not Path(tmp).exists():
            Path(tmp).unlink(missing_ok=True)
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
            self.said = f"not made: the application that writes it exited with {done.returncode}: {tail}"
            return
        os.replace(tmp, path)  # whole or not at all: a JVM never maps a half-written archive
        self.said = f"{path} (made in {time.monotonic() - started:.0f} s, while the first tests ran)"

    def wait(self, timeout: float) -> str:
        """How the making went, after waiting for it at most ``timeout`` seconds."""
        self._thread.join(timeout)
        return self.said if not self._thread.is_alive() else f"{self.path}: still being made"


def ensure() -> tuple[Path | None, str, Making | None]:
    """This environment's archive, the line that says what it is, and its making if it is being made.

    An archive that exists is used at once. Otherwise it is made on a thread
    (about 35 s on a quiet 2-core machine, most of it the JVM writing the
    archive at its exit) while the tests start: its path is handed out at once,
    and a JVM started before the file is there runs without it. Returns
    (None, why, None) where there is no archive to use: turned off, no PySpark
    or no ``java``.
    """
    if os.environ.get("STATEKIT_TEST_JVM_ARCHIVE", "").strip().lower() in {"off", "0", "false", "no"}:
        return None, "off (STATEKIT_TEST_JVM_ARCHIVE)", None
    path = _archive_path()
    if path is None:
        return None, "not made: no PySpark or no java", None
    if path.exists():
        return path, str(path), None
    making = Making(path)
    return path, making.said, making


def _flag(path: Path | str) -> str:
    return f"-XX:SharedArchiveFile={path}"


def use(path: Path) -> None:
    """Hand the archive ``path`` to the JVMs this process and its children start (see the module)."""
    flag = _flag(path)
    for name in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
        current = os.environ.get(name, "")
        if flag not in current:
            os.environ[name] = f"{current} {flag}".strip()
    os.environ["STATEKIT_TEST_JVM_ARCHIVE_FILE"] = str(path)


def executor_options() -> str:
    """The archive flag for executors' Java options (a standalone cluster's), or "" without one."""
    path = os.environ.get("STATEKIT_TEST_JVM_ARCHIVE_FILE")
    return _flag(path) if path else ""
