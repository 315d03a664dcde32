"""A Spark Connect query's server-side process records its run's end as Spark ends it.

Each case runs in a process of its own (a signal ends it), with a stand-in
driver: the Spark side is in ``tests/connect``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

_PROCESS = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from statekit.spark._connect import ConnectBatches

    out, case = sys.argv[1], sys.argv[2]

    class Spec:
        job_id = "job"

    class Driver:  # MicroBatchDriver.query_ended holds a lock while it records the end
        def __init__(self):
            self.lock = threading.Lock()

        def query_ended(self):
            with self.lock:
                if case == "twice":
                    os.kill(os.getpid(), signal.SIGTERM)  # Spark's second SIGTERM, meanwhile
                    time.sleep(0.2)  # Python runs handlers between bytecodes: here
                with open(out, "a") as f:
                    f.write("ended\\n")

    batches = ConnectBatches.__new__(ConnectBatches)
    batches._reset_idle_watch()
    batches._spec = Spec()
    batches._driver = Driver()
    batches._end_with_process()
    if case == "in-batch":
        batches._in_batch = True
    if case != "returns":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)  # not reached: SIGTERM ends the process
        with open(out, "a") as f:
            f.write("survived\\n")
    """
)


def _run(tmp_path: Path, case: str) -> tuple[int, list[str]]:
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", _PROCESS, str(out), case], capture_output=True, timeout=120)
    return done.returncode, out.read_text().splitlines() if out.exists() else []


def test_sigterm_between_batches_records_the_end_once_then_ends_the_process(tmp_path: Path) -> None:
    assert _run(tmp_path, "once") == (-signal.SIGTERM, ["ended"])


def test_a_second_sigterm_while_the_end_is_recorded_neither_stops_nor_repeats_it(tmp_path: Path) -> None:
    # Seen on Spark 4.3.0: two SIGTERMs milliseconds apart. Handled inside the first, the second
    # ended the process before the end was written.
    assert _run(tmp_path, "twice") == (-signal.SIGTERM, ["ended"])


def test_sigterm_in_the_middle_of_a_batch_records_no_end(tmp_path: Path) -> None:
    code, lines = _run(tmp_path, "in-batch")
    assert (code, lines) == (-signal.SIGTERM, [])


def test_a_process_that_returns_records_the_end(tmp_path: Path) -> None:
    # Spark closed the connection: the worker's loop returns and the interpreter exits.
    assert _run(tmp_path, "returns") == (0, ["ended"])
