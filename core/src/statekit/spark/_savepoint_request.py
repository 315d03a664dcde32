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
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .._errors import CheckpointError
from ..checkpoints._coordinator import CheckpointCoordinator
from ..checkpoints._honour import SavepointRequests

__all__ = ["SparkSavepointRequests"]


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
        self._stop_query = stop_query
        self.stopped_after: int | None = None  # the batch after which the query stops

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
        response = self.requests.after_checkpoint(
            location, checkpoint_id, {"spark_batch_id": batch_id}, batch_id=batch_id
        )
        if response is not None and response.stopped:
            self.stopped_after = batch_id
            threading.Thread(
                target=self._stop_query,
                args=(query_id,),
                name=f"statekit-stop-{self.requests.coordinator.job_id}",
                daemon=True,
            ).start()
