"""A Spark Connect server started from the installed PySpark on 127.0.0.1, for the tests.

The server is ``org.apache.spark.sql.connect.service.SparkConnectServer``
started with PySpark's own ``bin/spark-submit`` (its jar ships with PySpark),
``local[2,4]`` like the classic tests' session, on a free port of the loopback
interface. A test that kills it (the driver lost mid-query) restarts it on
the same port, so the tests after it find it running. Its Python workers
(tasks, and the server-side process that runs each query's ``foreachBatch``)
run this interpreter, through a small shell script: a test may make the next
``foreachBatch`` process late (:meth:`ConnectServer.delay_next_foreach_batch_process`),
as a busy server makes it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["START_ATTEMPTS", "ConnectServer"]

#: Seconds a server gets to start (a cold JVM on two shared cores takes about ten).
START_TIMEOUT = 180

#: Times statekit's ``start()`` asks this server to start a query whose ``foreachBatch`` process was
#: late (``statekit.spark.connect.start-attempts``, 3 by default): the suite shares two cores with
#: everything else a CI machine runs (at a load of ten), so the server is "a server that is often busy".
START_ATTEMPTS = 8

#: The server's Python: this interpreter, unless a test left delays for the next ``foreachBatch``
#: processes (Spark starts one as ``<python> -m <module>``): each takes one file and sleeps its seconds.
#: Spark gives that process ten seconds (fixed) to import PySpark and connect back (about one second of
#: CPU): run as root (CI), it runs at a higher priority than the suite's other processes, so they do not
#: take those seconds from it; elsewhere at the usual one.
_PYTHON = """#!/bin/sh
case "$*" in
  *foreach_batch_worker*)
    for f in "{late}"/*; do
      if mv "$f" "{late}-taken.$$" 2>/dev/null; then
        sleep "$(cat "{late}-taken.$$")"; rm -f "{late}-taken.$$"; break
      fi
    done
    if [ "$(id -u)" = 0 ]; then exec nice -n -10 "{python}" "$@"; fi;;
esac
exec "{python}" "$@"
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class ConnectServer:
    """A Spark Connect server process (in a process group of its own, so a kill takes all of it)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        """The ``sc://`` URL clients connect to."""
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / f"server-{self.starts}.log"

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        import pyspark

        home = Path(pyspark.__file__).resolve().parent
        self.workdir.mkdir(parents=True, exist_ok=True)
        python = self.workdir / "python"
        python.write_text(_PYTHON.format(late=self.workdir / "late-foreach-batch", python=sys.executable))
        python.chmod(0o755)
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "PYSPARK_PYTHON": str(python),
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.streaming.stopTimeout": "30s",
            "spark.statekit.spark.connect.start-attempts": str(START_ATTEMPTS),
            # Many short jobs on a JVM that lives a minute: start fast rather than run fast.
            "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        }
        args = [str(home / "bin" / "spark-submit"), "--master", "local[2,4]"]
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        args += ["--name", "statekit-connect-tests"]
        args += ["--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
        self.starts += 1
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                args,
                cwd=self.workdir,  # spark-warehouse and the like land here
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not _accepts(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-3000:]
                self.kill()
                raise RuntimeError(f"the Spark Connect server did not start; {self.log}:\n{tail}")
            time.sleep(0.3)

    def delay_next_foreach_batch_process(self, seconds: float, times: int = 1) -> None:
        """Make the next ``times`` server-side ``foreachBatch`` processes start ``seconds`` late."""
        late = self.workdir / "late-foreach-batch"
        late.mkdir(exist_ok=True)
        for i in range(times):
            (self.workdir / "late.tmp").write_text(str(seconds))
            (self.workdir / "late.tmp").rename(late / str(i))

    def kill(self) -> None:
        """SIGKILL the server, its executors' Python workers and its ``foreachBatch`` processes."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=60)
        self.proc = None
        # The port is free again once the kernel has closed the listening socket.
        deadline = time.monotonic() + 30
        while _accepts(self.port) and time.monotonic() < deadline:
            time.sleep(0.2)

    def restart(self) -> None:
        """A killed server started again on the same port."""
        self.kill()
        self.start()
