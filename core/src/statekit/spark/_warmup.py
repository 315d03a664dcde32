"""Python workers started, and what a task imports imported, while a query starts.

The first micro-batch of a fresh application waits, on its tasks' critical
path, for Spark to start its Python daemon and workers and for each worker to
import what a statekit task needs: statekit, pyarrow (and pandas, which pyarrow
loads on its first conversion of Python values), the backend's and the
storage's modules. Measured on ``local[2]``: about 1.8 s from the job's
submission to a worker's first line of Python, then 0.45-0.6 s of imports.
Spark's own stateful operators run in the JVM and pay none of it.

Spark keeps its Python workers between tasks (``spark.python.worker.reuse``,
the default), across the sessions of one application (a streaming query runs in
a clone of its session), and stops idle ones after a minute. So when a query
starts, a small job (one task per core of the application,
``spark.default.parallelism``) starts the workers and does the imports on a
thread of its own while the driver reads the checkpoint and Spark plans the
first batch. Once per application: later queries find the workers warm, or
cold workers warm themselves as before.

The warm-up touches no state and no output: a warm-up that fails (a plugin
missing on an executor, the application stopping) changes nothing but the
first batch's speed. Its error goes to the ``statekit.spark`` logger at
WARNING, naming the job; the first batch's tasks meet the same cause with
their own error.

A query that ends before its warm-up does (an ``availableNow`` query with
nothing to read ends in well under a second) waits for it when it ends: the
query ``start()`` returns does so in ``awaitTermination`` and ``stop`` (see
:mod:`._query`), and a static ``run()`` before it returns. Otherwise the application's stop, which
usually follows, kills workers in the middle of the warm-up's task, and Spark
logs each as an executor's ERROR ("Python worker exited unexpectedly
(crashed)"): true of the warm-up, but read as a crash of the job.

Off with ``statekit.spark.warm-up=false``; never from a Spark Connect client
(its driver has no SparkContext; the server's workers start with the first
batch).
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections.abc import Iterator
from typing import Any

from pyspark.sql import SparkSession

from ..plugins._config import Configuration
from ._sparkconf import app_setting, is_connect

__all__ = ["SETTLE_SECONDS", "settle", "start_warm_up", "warm_up"]

_log = logging.getLogger("statekit.spark")

#: A line of a Python traceback that names what was raised: ``package.Error: message``.
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt): ")

#: The applications whose workers a warm-up was started for (their ids).
_warmed: set[str] = set()
_lock = threading.Lock()

#: How long a query's end waits for its warm-up: a warm-up takes seconds; one that is stuck (an
#: executor lost) is not waited for longer, and its job ends with the application.
SETTLE_SECONDS = 120.0


def start_warm_up(session: SparkSession, config: Configuration, job_id: str) -> threading.Thread | None:
    """Start warming the application's Python workers for job ``job_id``, once per application.

    Returns the warm-up's thread, or None where there is none to start: off by
    configuration, a Spark Connect session, workers not reused
    (``spark.python.worker.reuse=false``), or an application already warmed.
    """
    if is_connect(session) or not config.get("statekit.spark.warm-up"):
        return None
    sc = session.sparkContext
    if (app_setting(sc, "spark.python.worker.reuse") or "true").strip().lower() == "false":
        return None  # every task starts a worker of its own: nothing to start ahead
    app = str(sc.applicationId)
    with _lock:
        if app in _warmed:
            return None
        _warmed.add(app)
    backend, storage = config.backend_name, config.storage_name
    thread = threading.Thread(
        target=_run,
        args=(session, job_id, backend, storage),
        name=f"statekit-warm-up-{job_id}",
        daemon=True,
    )
    thread.start()
    return thread


def warm_up(session: SparkSession, job_id: str, backend: str, storage: str) -> list[int]:
    """The warm-up job: one task per core of the application; the process ids of the workers it warmed.

    Raises:
        Exception: What the job raised (a worker's import error, a stopped application).
    """
    sc = session.sparkContext
    slots = max(1, int(sc.defaultParallelism))
    warm = functools.partial(_warm, backend=backend, storage=storage)
    before = sc.getLocalProperty("spark.job.description")
    sc.setLocalProperty("spark.job.description", f"statekit {job_id}: start Python workers")
    try:
        return [int(r[0]) for r in session.range(0, slots, 1, slots).mapInArrow(warm, "pid long").collect()]
    finally:
        sc.setLocalProperty("spark.job.description", before)  # type: ignore[arg-type]


def _run(session: SparkSession, job_id: str, backend: str, storage: str) -> None:
    """:func:`warm_up` on its own thread: an error is logged, never raised (nothing depends on it)."""
    try:
        warm_up(session, job_id, backend, storage)
    except Exception as e:  # noqa: BLE001 - said, not raised: the first batch starts the workers itself
        if session.sparkContext._jsc is None:  # the application stopped meanwhile: nothing to say
            return
        _log.warning(
            "statekit job %r: starting the Python workers ahead of the first micro-batch failed (%s); "
            "the batch starts them itself, and meets the same cause if it lies in a worker",
            job_id,
            _cause(e),
        )


def settle(thread: threading.Thread | None, job_id: str, timeout: float = SETTLE_SECONDS) -> None:
    """Wait for the warm-up ``thread`` (None: none was started) to end, at most ``timeout`` seconds.

    Called where a query or a static run ends, so that stopping the application
    next does not kill the workers in the middle of the warm-up's task. A
    warm-up still running after ``timeout`` is said at WARNING and left.
    """
    if thread is None or not thread.is_alive():
        return
    thread.join(timeout)
    if thread.is_alive():
        _log.warning(
            "statekit job %r: the query ended, and its job starting the Python workers has run for more "
            "than %.0f s since; not waiting longer. Stopping the application ends that job (Spark then "
            "reports its workers as crashed); it touches no state and no output",
            job_id,
            timeout,
        )


def _cause(e: Exception) -> str:
    """The error a worker raised, from the text Spark wraps it in (its last ``Name: message`` line)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    raised = [line for line in lines if _RAISED.match(line)]
    return raised[-1] if raised else lines[0] if lines else type(e).__name__


def _warm(batches: Iterator[Any], *, backend: str, storage: str) -> Iterator[Any]:
    """In a Python worker: import what a task of the job imports, as it imports it."""
    import os

    import pyarrow as pa  # type: ignore[import-untyped]

    from ..plugins._registry import default_registry
    from . import _task  # noqa: F401  (what a task's unpickling imports)

    registry = default_registry()
    registry.backend_spec(backend).load_factory()  # the backend's module and its engine
    registry.storage_spec(storage).load_factory()
    pa.array([0])  # pyarrow's first conversion of Python values (it loads pandas where installed)
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"pid": [os.getpid()]})
