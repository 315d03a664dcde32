"""A Spark standalone cluster on 127.0.0.1 for the tests: a master and workers as real processes."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sparkutil import driver_env


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
