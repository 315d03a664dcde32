"""The driver side of a query started from a Spark Connect client: it runs on the Connect server."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import os
import signal
import threading
import time
import warnings
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter

from .._errors import CheckpointError
from ..checkpoints._coordinator import CheckpointCoordinator, CheckpointPolicy, newest_checkpoint
from ..plugins._config import Configuration
from ..plugins._registry import default_registry
from ._driver import QUERY_PROPERTY, SPARK_WAYS_OUT, MicroBatchDriver
from ._jobspec import JobSpec, driver_storage
from ._savepoint_request import WATCH_INTERVAL, SparkSavepointRequests
from ._sparkconf import application, is_connect, spark_configuration

__all__ = ["RUN_START_WAIT", "ConnectBatches", "query_id_at", "start_on_server"]

#: Seconds the watcher made before the first batch waits to see its query run started (then gives up).
RUN_START_WAIT = 120.0

#: How the server says that the process it started for a query's ``foreachBatch`` came too late.
_LATE_PROCESS = ("failed to connect back", "Timed out while waiting for the Python worker")

_LOG = logging.getLogger("statekit.spark")


def start_on_server(writer: DataStreamWriter, attempts: int) -> StreamingQuery:
    """``writer.start()`` from a Connect client; again if the query's server-side process came too late.

    To start a query with ``foreachBatch``, the Connect server starts a Python
    process for it and gives it ten seconds (fixed in Spark) to connect back:
    it imports PySpark first, which takes longer on a busy server. Spark then
    fails the start before any query exists (nothing ran: no state, checkpoint
    or output was touched; a location seeded for ``restore=`` holds the source
    position it starts from, as before), so starting it again is exact. After
    ``attempts`` such failures (``statekit.spark.connect.start-attempts``),
    Spark's error is raised, with a note that says what happened and what to do.
    """
    for attempt in range(1, attempts + 1):
        try:
            return writer.start()
        except Exception as e:
            if not any(late in str(e) for late in _LATE_PROCESS):
                raise
            if attempt == attempts:
                asked = "once" if attempts == 1 else f"{attempts} times"
                e.add_note(
                    f"statekit asked the Spark Connect server {asked} to start the query; "
                    f"{'each time ' if attempts > 1 else ''}the Python process the server starts for the "
                    "query's foreachBatch did not "
                    "connect back within the ten seconds Spark gives it (fixed in Spark): the server's "
                    "machine is too busy to import PySpark in that time, or the server's Python "
                    "(PYSPARK_PYTHON) fails to start (the server's log shows its error). No query started "
                    "and no state was "
                    "touched (for restore=, the checkpoint location holds only the source position start() "
                    "wrote, which the same start uses again): start it again once the server is less busy, "
                    "give the server more CPU, or let statekit ask more times "
                    "(spark.statekit.spark.connect.start-attempts)"
                )
                raise
            _LOG.warning(
                "statekit: the Spark Connect server's Python process for the query's foreachBatch did not "
                "connect back within Spark's ten seconds (attempt %d of %d; a busy server): no query "
                "started, so statekit starts it again",
                attempt, attempts,
            )  # fmt: skip
    raise AssertionError("unreachable")  # pragma: no cover


class ConnectBatches:
    """The ``foreachBatch`` function of a query started from a Spark Connect client.

    Spark Connect pickles it to the server, which calls it in a Python
    process of the query's own, with each micro-batch bound to a session of
    the query (a Connect session too). So the driver side of statekit runs
    there: the :class:`~statekit.spark._driver.MicroBatchDriver` is made at
    the first micro-batch of each query run and lives as long as that process,
    as it lives as long as ``start()``'s closure on a classic driver.

    A Connect session cannot tell which query runs a batch (classic tasks read
    it from a local property), so the query's id is read where Spark keeps it:
    the ``metadata`` file of the query's checkpoint location, written when the
    query first started and kept across restarts, read through Spark itself
    (any file system the checkpoint location is on).

    Savepoint requests of an idle query are answered at once, as on a classic
    driver, by a watcher thread (:meth:`SparkSavepointRequests.watch`) in this
    server-side process (it lives as long as the query run, and ends with it);
    each batch waits for a savepoint the watcher is writing. Spark starts the
    process, and unpickles this object in it, when the query starts, before
    any batch: so a query restarted with no new input (Spark runs no batch) is
    answered too. Until the first batch, the watcher is one of its own
    (:meth:`_watch_before_first_batch`): it needs neither a batch's DataFrame
    nor its session (what a :class:`MicroBatchDriver` is made from), only the
    job's storage and configuration, read from the client's session on which
    Spark unpickles this object (the one Spark clones each batch's session
    from, when the query starts), and the query's id. The first batch ends it
    (waiting for a savepoint it is writing, refusing the batch after its
    stop-with-savepoint) and starts the driver's.
    """

    def __init__(
        self,
        spec: JobSpec,
        *,
        restore: str | None,
        checkpoint_location: str,
        input_begins_after_savepoint: bool = False,
        client_session_id: str | None = None,
    ) -> None:
        """``spec`` without its DataFrame (a Connect DataFrame belongs to the client's session).

        ``client_session_id``: the id of the Connect session that starts the
        query (the one that holds it: a stop-with-savepoint stops it there).
        """
        # The server puts each batch's DataFrame in; a Connect DataFrame cannot be pickled.
        self._spec = dataclasses.replace(spec, df=None)  # type: ignore[arg-type]
        self._restore = restore
        self._checkpoint_location = checkpoint_location
        self._input_begins_after_savepoint = input_begins_after_savepoint
        self._client_session_id = client_session_id
        self._driver: MicroBatchDriver | None = None
        self._query_id: str | None = None
        self._reset_idle_watch()

    def _reset_idle_watch(self) -> None:
        self._idle_lock = threading.Lock()
        self._idle: SparkSavepointRequests | None = None  # the watcher's before the first batch
        self._idle_ended = False  # set by the first batch: no watcher of its own starts after it
        self._in_batch = False  # __call__ runs (on this process's main thread)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled once, by the client, before any batch: no driver, no watcher to carry.
        state = {**self.__dict__, "_driver": None, "_query_id": None}
        for name in ("_idle_lock", "_idle", "_idle_ended", "_in_batch"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_idle_watch()
        self._watch_before_first_batch()

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        """Process one micro-batch (on the Connect server's Python process)."""
        self._in_batch = True
        try:
            self._batch(batch_df, batch_id)
        finally:
            self._in_batch = False

    def _batch(self, batch_df: DataFrame, batch_id: int) -> None:
        with contextlib.ExitStack() as stack:
            idle = self._end_idle_watch()
            if idle is not None:  # waits for the savepoint it writes; refuses the batch after its stop
                stack.enter_context(idle.batch(batch_id))
            if self._driver is None or self._query_id is None:
                session = batch_df.sparkSession
                query_id = query_id_at(session, self._checkpoint_location)
                spec = dataclasses.replace(self._spec, df=batch_df)
                self._driver = MicroBatchDriver(
                    spec, session, restore=self._restore, checkpoint_location=self._checkpoint_location,
                    input_begins_after_savepoint=self._input_begins_after_savepoint,
                )  # fmt: skip
                self._query_id = query_id
                self._driver.savepoints.stop_query = self._stop
                # Requests of the query while it is idle, answered at once (a daemon thread of this process).
                self._driver.savepoints.watch(_ServerSideQuery(query_id))
                self._end_with_process()
            stack.enter_context(self._driver.savepoints.batch(batch_id))  # no idle savepoint meanwhile
            self._driver.process_batch(batch_df, batch_id, self._query_id)

    def _end_with_process(self) -> None:
        """Record the run's end when Spark ends this process, as a classic driver does when its query ends.

        Spark ends the query's ``foreachBatch`` process when the query
        terminates (stopped, failed, or done with its available input): with
        SIGTERM, or by closing its connection, after which the process returns.
        Either way the run's end is recorded (:meth:`MicroBatchDriver.query_ended`:
        after an idle savepoint being written) unless a micro-batch was running:
        its checkpoint may be half written, so, as for a killed classic driver,
        no end is recorded and the next run skips the id it may have been writing.
        Then SIGTERM does what it did before (ends the process). Installed once,
        from the first batch, on the process's main thread (where Spark calls it).
        """
        atexit.register(self._process_ends)
        if threading.current_thread() is not threading.main_thread():
            return  # a signal handler can only be set there: the process's return records it
        before = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum: int, frame: Any) -> None:
            # Spark may send a second SIGTERM at once: ignored while the end is recorded (a nested
            # handler would wait for the first's lock in the same thread, and the end never be written).
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            try:
                self._process_ends()
            finally:
                signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)
            if callable(before):
                before(signum, frame)
            elif before != signal.SIG_IGN:
                os.kill(os.getpid(), signal.SIGTERM)  # the default: the process ends, as before

        signal.signal(signal.SIGTERM, on_sigterm)

    def _process_ends(self) -> None:
        """Spark ends this process: record the run's end unless a micro-batch is running.

        Once however often it is called: ``query_ended`` records it once, and
        the SIGTERM handler ignores a second SIGTERM while it runs.
        """
        driver = self._driver
        if driver is None:
            return
        if self._in_batch:
            _LOG.warning(
                "statekit job %r: Spark ended the query's foreachBatch process in the middle of a "
                "micro-batch; the run records no end, so the next run of the job skips the checkpoint id "
                "it may have been writing",
                self._spec.job_id,
            )
            return
        try:
            driver.query_ended()
        except Exception:  # noqa: BLE001 - best effort, as RunFence.end: the next run then skips an id
            _LOG.warning(
                "statekit job %r: the run's end could not be recorded", self._spec.job_id, exc_info=True
            )

    def _end_idle_watch(self) -> SparkSavepointRequests | None:
        """Ends the watcher that answers before the first batch (its requests object, if it started one).

        After this it answers nothing (``end_watch``), and none starts: the
        driver's watcher takes over. Its requests object stays, so that every
        batch waits for a savepoint it is still writing and is refused after
        a stop-with-savepoint it answered.
        """
        with self._idle_lock:
            self._idle_ended = True
            idle = self._idle
        if idle is not None:
            idle.end_watch()
        return idle

    def _watch_before_first_batch(self) -> None:
        """In the foreachBatch process Spark starts for the query: answer requests before its first batch.

        Runs while Spark unpickles this object there, with the client's
        session (the root one: the query's) active, before Spark starts the
        query: it reads what must be read now, statekit's configuration (the
        session's as the query's clone of it will be; the client waits for
        ``start()`` meanwhile) and which runs of queries the session has
        already (so that the watcher answers only for a run started after
        this process: if the query fails to start, as when another run of it
        is active and Spark refuses a second one, this process answers
        nothing; Spark then ends it). The rest goes on a thread of its own.
        Anything that fails here starts no watcher: the first batch reports
        it, as before, and answers requests from then on.
        """
        try:
            root = _root_session(self._client_session_id)
            if root is None:  # not the foreachBatch process of a Connect server (unpickled elsewhere)
                return
            conf = spark_configuration(root, self._spec.config)
            known = {q.runId for q in root.streams.active}
        except Exception:  # noqa: BLE001 - the first batch reports it
            return
        threading.Thread(
            target=self._idle_watch, args=(root, conf, known),
            name=f"statekit-savepoints-start-{self._spec.job_id}", daemon=True,
        ).start()  # fmt: skip

    def _idle_watch(self, root: SparkSession, conf: Configuration, known: set[str]) -> None:
        """Starts the watcher of the query run before its first batch, if the job has anything to convert.

        Nothing to convert (a query's first run: Spark has not written its
        checkpoint location's ``metadata`` yet, or the job's newest checkpoint
        is not this query's: it restores one at its first batch) starts none,
        silently, as a configuration error does (the first batch reports it).
        """
        job = self._spec.job_id
        try:
            registry = default_registry()
            conf.validate(registry)
            storage = driver_storage(conf, registry)
            query_id = query_id_at(root, self._checkpoint_location)
            newest = newest_checkpoint(storage, job, SPARK_WAYS_OUT)
        except Exception:  # noqa: BLE001 - a new location, a bad configuration: the first batch says
            return
        if newest is None or newest.metadata.properties.get(QUERY_PROPERTY) != query_id:
            return
        try:
            if not self._run_started(root, query_id, known):
                return
            coordinator = CheckpointCoordinator(
                storage,
                job,
                max_parallelism=newest.metadata.max_parallelism,  # it writes no checkpoint: converts one
                retained=int(conf.get("statekit.checkpoints.retained")),
                native=conf.get("statekit.checkpoint.format") != "canonical",
                history_entries=int(conf.get("statekit.checkpoints.history.max-entries")),
                policy=CheckpointPolicy(application(root), SPARK_WAYS_OUT),
                registry=registry,
            )
            requests = SparkSavepointRequests(coordinator, conf.get("statekit.savepoints.dir"), self._stop)
        except Exception as e:  # noqa: BLE001 - said once; the first batch's watcher answers
            warnings.warn(
                f"statekit job {job!r}: the savepoint watcher of the restarted query {query_id} could not "
                f"start before its first micro-batch ({type(e).__name__}: {e}); a savepoint request is "
                "answered after that batch",
                RuntimeWarning,
                stacklevel=1,
            )
            return
        with self._idle_lock:
            if self._idle_ended:  # the first batch came: its driver's watcher answers
                return
            self._idle = requests
            requests.watch(_ServerSideQuery(query_id))

    def _run_started(self, root: SparkSession, query_id: str, known: set[str]) -> bool:
        """Whether the client's session runs query ``query_id`` in a run started after this process.

        Waits up to :data:`RUN_START_WAIT` seconds (Spark starts the query
        right after this process acknowledged its function); False if the
        first batch came meanwhile.
        """
        deadline = time.monotonic() + RUN_START_WAIT
        while True:
            with self._idle_lock:
                if self._idle_ended:
                    return False
            query = root.streams.get(query_id)
            if query is not None and query.runId not in known:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(WATCH_INTERVAL / 4)

    def _stop(self, query_id: str) -> None:
        """Stop-with-savepoint: stop the query through the client's session, which holds it.

        The sessions of this process are clones made for the batches, and
        Spark keeps a query in the session that started it. Runs on a thread
        of its own; Spark ends this process with the query.
        """
        url = os.environ.get("SPARK_CONNECT_LOCAL_URL")  # how this process reaches its server
        query = None
        if url is not None and self._client_session_id is not None:
            session = SparkSession.builder.remote(f"{url};session_id={self._client_session_id}").create()
            query = session.streams.get(query_id)
        if query is None and self._driver is not None:  # a server that lists it in the batches' sessions
            query = self._driver.session.streams.get(query_id)
        if query is None:
            warnings.warn(
                f"statekit job {self._spec.job_id!r}: the savepoint was written, but streaming query "
                f"{query_id} could not be found to stop it (its client's session "
                f"{self._client_session_id} is gone?); stop it with StreamingQuery.stop()",
                RuntimeWarning,
                stacklevel=1,
            )
            return
        query.stop()


def _root_session(client_session_id: str | None) -> SparkSession | None:
    """The client's Connect session, active in a Connect server's foreachBatch process while it unpickles.

    None elsewhere (no ``SPARK_CONNECT_LOCAL_URL``, no active Connect session,
    or one of another id).
    """
    if client_session_id is None or "SPARK_CONNECT_LOCAL_URL" not in os.environ:
        return None
    session = SparkSession.getActiveSession()
    if session is None or not is_connect(session):
        return None
    return session if getattr(session, "session_id", None) == client_session_id else None


class _ServerSideQuery:
    """The running query, as the savepoint watcher of the server-side process sees it.

    Active as long as this process lives: Spark runs it for one query run and
    stops it when the query terminates, taking the watcher with it. (The
    process's Connect sessions are clones made for the batches, which do not
    list the query: Spark keeps it in the client's session.)
    """

    isActive = True  # StreamingQuery's name

    def __init__(self, query_id: str) -> None:
        self.id = query_id


def query_id_at(session: SparkSession, checkpoint_location: str) -> str:
    """The id of the streaming query whose checkpoint location this is, as Spark recorded it.

    Raises:
        CheckpointError: If the location holds no query metadata.
    """
    path = checkpoint_location.rstrip("/") + "/metadata"
    try:
        rows = session.read.text(path).collect()
        found = json.loads(rows[0][0])["id"] if rows else None
    except Exception as e:  # Spark's own errors (a missing file, ...), and bad JSON
        raise CheckpointError(
            f"cannot read the streaming query's id from {path} (Spark writes it when a query "
            f"starts): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from e
    if not isinstance(found, str) or not found:
        raise CheckpointError(f"{path} names no streaming query id")
    return found
