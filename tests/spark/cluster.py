"""A Spark standalone cluster on 127.0.0.1 for the tests: a master and workers as real processes."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkutil import driver_env

from jvmarchive import executor_options

#: The JVM options of the tests' short-lived drivers and executors: start fast rather than run fast.
FAST_START_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 90) -> None:
    """Wait until ``text`` appears in the log ``path`` of ``proc``; fail if ``proc`` ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in {path}:\n{path.read_text(errors='replace')[-3000:]}")


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    log: Path
    work_dir: Path


@dataclass
class Cluster:
    """A running master and its workers (one core, 1 GiB each)."""

    master_url: str
    workers: list[Worker] = field(default_factory=list)


@contextmanager
def standalone_cluster(directory: Path, workers: int = 2) -> Iterator[Cluster]:
    """Start a master and ``workers`` workers, logging into ``directory``; stop them all at the end."""
    import pyspark

    spark_home = Path(pyspark.__file__).resolve().parent
    spark_class = str(spark_home / "bin" / "spark-class")
    env = {**driver_env(), "SPARK_HOME": str(spark_home), "SPARK_NO_DAEMONIZE": "1"}
    port = free_port()
    started: list[subprocess.Popen[bytes]] = []

    def launch(name: str, cmd: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        log = directory / f"{name}.log"
        proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
        started.append(proc)
        return proc, log

    directory.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(f"spark://127.0.0.1:{port}")
    try:
        master, master_log = launch("master", [
            spark_class, "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port()),
        ])  # fmt: skip
        wait_for(master_log, "I have been elected leader", master)
        for i in range(workers):
            work_dir = directory / f"work{i}"
            proc, log = launch(f"worker{i}", [
                spark_class, "org.apache.spark.deploy.worker.Worker", cluster.master_url,
                "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                "--webui-port", str(free_port()), "--work-dir", str(work_dir),
            ])  # fmt: skip
            cluster.workers.append(Worker(proc, log, work_dir))
        for w in cluster.workers:
            wait_for(w.log, "Successfully registered with master", w.proc)
        yield cluster
    finally:
        for proc in reversed(started):
            proc.terminate()
        for proc in reversed(started):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def cluster_app_builder(master: str, app: str) -> Any:
    """A ``SparkSession`` builder of an application on a standalone cluster the tests started.

    The driver listens on 127.0.0.1 only (its UI off unless the caller turns it on), the
    executors are small (512m, one core each, two cores in all, two shuffle partitions), both
    run this Python and start fast. Callers add their own settings to it.
    """
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.driver.extraJavaOptions", FAST_START_JVM)
        .config("spark.executor.extraJavaOptions", f"{FAST_START_JVM} {executor_options()}".strip())
    )
