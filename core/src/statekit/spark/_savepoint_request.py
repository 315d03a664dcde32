"""A running Spark query's side of savepoint requests: honoured after a micro-batch, stop-with-savepoint.

After each micro-batch's checkpoint completed, the driver asks
:meth:`SavepointRequests.after_batch` whether a request is pending (one small
read of the job's files; see :mod:`statekit.checkpoints._savepoint_requests`).
If so, that checkpoint becomes a canonical, relocatable savepoint, as
``statekit savepoint convert`` writes one (every file's digest checked,
native snapshots written canonically), the job's checkpoint history records
it, and the answer goes back to the requester.

Stop-with-savepoint: the query is stopped from another thread right after
the batch returns (a query cannot stop itself from inside its own batch: it
would wait for itself). From then on the driver processes no batch: one that
Spark still starts before the stop lands fails, unprocessed and uncommitted,
so nothing is processed after the savepoint, and a restart of the query from
its checkpoint location processes that batch. A stop request whose savepoint
failed stops nothing (as Flink's stop-with-savepoint fails and the job runs
on): the requester gets the reason.

An idle query (no new input, so no micro-batch) is answered at once, as
Flink answers: a watcher thread of the driver (:meth:`SparkSavepointRequests.watch`)
reads the request file every :data:`WATCH_INTERVAL` seconds while no batch
runs; with nothing processed since the job's newest completed checkpoint
(made by this query), the savepoint is that checkpoint, converted. A
micro-batch that starts meanwhile waits for that savepoint (:meth:`batch`),
so a stop-with-savepoint answered by the watcher processes nothing after it.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from .._contracts import SupportsJobFiles
from .._errors import CheckpointError
from ..checkpoints._coordinator import CheckpointCoordinator
from ..checkpoints._honour import SavepointRequests
from ..checkpoints._savepoint_requests import REQUEST_FILE

__all__ = ["WATCH_INTERVAL", "SparkSavepointRequests"]

#: Seconds between two reads of the request file by an idle query's watcher (one small read).
WATCH_INTERVAL = 1.0


class SparkSavepointRequests:
    """Savepoint requests of one query run, honoured after its micro-batches; stop-with-savepoint.

    Args:
        coordinator: The run's coordinator (its storage, job and history).
        savepoints_dir: ``statekit.savepoints.dir``: where a request without a target writes.
        stop_query: Stops the query with this id (called from a thread of its own).
    """

    def __init__(
        self,
        coordinator: CheckpointCoordinator,
        savepoints_dir: str | None,
        stop_query: Callable[[str], None],
    ) -> None:
        self.requests = SavepointRequests(coordinator, savepoints_dir)
        #: How the query is stopped (given its id, on a thread of its own); see __init__'s ``stop_query``.
        self.stop_query = stop_query
        self.stopped_after: int | None = None  # the batch after which the query stops
        self._cond = threading.Condition()
        self._in_batch = False  # a micro-batch runs (between batch()'s enter and exit)
        self._idle_savepoint = False  # the watcher writes a savepoint: a batch waits for it
        self._watching = threading.Event()  # set to end the watcher

    @contextlib.contextmanager
    def batch(self, batch_id: int) -> Iterator[None]:
        """Around one micro-batch: waits for an idle savepoint being written, refuses after a stop."""
        with self._cond:
            self._cond.wait_for(lambda: not self._idle_savepoint)
            self._in_batch = True
        try:
            self.check_not_stopping(batch_id)
            yield
        finally:
            with self._cond:
                self._in_batch = False

    def watch(
        self, query: Any, interval: float = WATCH_INTERVAL, on_end: Callable[[], None] | None = None
    ) -> threading.Thread | None:
        """Answer requests of the running streaming ``query`` while it is idle (a thread of its own).

        The thread ends with the query (or :meth:`end_watch`); when it finds
        the query no longer active, it calls ``on_end``. None if the storage
        keeps no job files (then no request can reach the query).
        """
        if not isinstance(self.requests.storage, SupportsJobFiles):
            return None
        thread = threading.Thread(
            target=self._watch,
            args=(query, str(query.id), interval, on_end),
            name=f"statekit-savepoints-{self.requests.coordinator.job_id}",
            daemon=True,
        )
        thread.start()
        return thread

    def end_watch(self) -> None:
        """Ends the watcher thread: from now on it answers nothing (:meth:`when_idle` returns False).

        A savepoint it is writing meanwhile is finished; :meth:`batch` waits for it.
        """
        self._watching.set()

    def quiesce(self, timeout: float) -> bool:
        """The query has ended: end the watcher, wait for a savepoint it writes; False if one still runs.

        Waits at most ``timeout`` seconds for a micro-batch or an idle savepoint
        in progress, and returns whether none is.
        """
        self.end_watch()
        with self._cond:
            return self._cond.wait_for(lambda: not self._in_batch and not self._idle_savepoint, timeout)

    def _watch(self, query: Any, query_id: str, interval: float, on_end: Callable[[], None] | None) -> None:
        failing = False
        while not self._watching.wait(interval) and self.stopped_after is None:
            try:
                active = query.isActive
            except Exception:  # noqa: BLE001 - the session is gone: so is the query (and its driver)
                return
            if not active:
                if on_end is not None:
                    on_end()
                return
            try:
                self.when_idle(query_id)
                failing = False
            except Exception as e:  # noqa: BLE001 - the watcher never ends the query; it warns and goes on
                if failing:
                    continue  # said once per outage, not every second
                failing = True
                warnings.warn(
                    f"statekit job {self.requests.coordinator.job_id!r}: the savepoint watcher failed "
                    f"({type(e).__name__}: {e}); requests are answered after the next micro-batch",
                    RuntimeWarning,
                    stacklevel=1,
                )

    def when_idle(self, query_id: str) -> bool:
        """Honour a pending request now if no batch runs and the newest checkpoint is this query's.

        Returns whether a request was answered. A request found while a batch
        runs, or before this query completed any checkpoint of the job (its
        state is then the one it restores at its first batch), waits for the
        next batch.
        """
        coordinator = self.requests.coordinator
        storage = self.requests.storage
        if (
            not isinstance(storage, SupportsJobFiles)
            or storage.read_job_file(coordinator.job_id, REQUEST_FILE) is None
        ):
            return False
        with self._cond:
            # Ended (end_watch): a watcher that another took over from answers nothing more.
            if self._in_batch or self.stopped_after is not None or self._watching.is_set():
                return False
            self._idle_savepoint = True
        try:
            newest = coordinator.newest()
            props = newest.metadata.properties if newest is not None else {}
            if newest is None or props.get("spark_query_id") != query_id:
                return False
            if coordinator.fence.epoch is not None:
                coordinator.fence.check()  # a run that took the job over answers, not this one
            batch_id = int(props.get("spark_batch_id", -1))
            self._honour(newest.location, newest.checkpoint_id, batch_id, query_id, idle=True)
            return True
        finally:
            with self._cond:
                self._idle_savepoint = False
                self._cond.notify_all()

    def check_not_stopping(self, batch_id: int) -> None:
        """Refuse a batch that starts after a stop-with-savepoint: nothing is processed after it.

        Raises:
            CheckpointError: If the query is being stopped.
        """
        if self.stopped_after is not None:
            raise CheckpointError(
                f"statekit job {self.requests.coordinator.job_id!r} was stopped with a savepoint after "
                f"micro-batch {self.stopped_after}; micro-batch {batch_id} started before the stop took "
                "effect and is neither processed nor committed (restarting the query from its checkpoint "
                "location processes it)"
            )

    def after_batch(self, location: str, checkpoint_id: int, batch_id: int, query_id: str) -> None:
        """Honour a pending request with checkpoint ``checkpoint_id`` (at ``location``) of ``batch_id``.

        Never raises (see :meth:`SavepointRequests.after_checkpoint`). A stop
        request whose savepoint was written stops the query after this batch.
        """
        self._honour(location, checkpoint_id, batch_id, query_id, idle=False)

    def _honour(self, location: str, checkpoint_id: int, batch_id: int, query_id: str, *, idle: bool) -> None:
        properties: dict[str, Any] = {"spark_batch_id": batch_id}
        if idle:
            properties["idle"] = True  # taken between micro-batches, of the newest checkpoint
        response = self.requests.after_checkpoint(location, checkpoint_id, properties, batch_id=batch_id)
        if response is not None and response.stopped:
            self.stopped_after = batch_id
            threading.Thread(
                target=self.stop_query,
                args=(query_id,),
                name=f"statekit-stop-{self.requests.coordinator.job_id}",
                daemon=True,
            ).start()
