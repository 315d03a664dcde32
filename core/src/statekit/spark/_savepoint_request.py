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
its checkpoint location processes that batch.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

from .._contracts import CheckpointStorage
from .._errors import CheckpointError, ConfigurationError
from ..checkpoints._convert import convert_to_savepoint
from ..checkpoints._coordinator import CheckpointCoordinator
from ..checkpoints._restore import load_checkpoint
from ..checkpoints._savepoint_requests import (
    COMPLETED,
    FAILED,
    SavepointRequest,
    SavepointResponse,
    respond,
    take_request,
)

__all__ = ["SavepointRequests"]


class SavepointRequests:
    """Savepoint requests of one query run, honoured after its micro-batches.

    Args:
        coordinator: The run's coordinator (its storage, job and history).
        savepoints_dir: ``statekit.savepoints.dir``: where a request without a target writes.
        stop_query: Stops the query with this id (called from a thread of its own).
    """

    def __init__(
        self,
        coordinator: CheckpointCoordinator,
        savepoints_dir: str | None,
        stop_query: Any,
    ) -> None:
        self.coordinator = coordinator
        self.savepoints_dir = savepoints_dir
        self._stop_query = stop_query
        self.stopped_after: int | None = None  # the batch after which the query stops

    @property
    def storage(self) -> CheckpointStorage:
        return self.coordinator.storage

    def check_not_stopping(self, batch_id: int) -> None:
        """Refuse a batch that starts after a stop-with-savepoint: nothing is processed after it.

        Raises:
            CheckpointError: If the query is being stopped.
        """
        if self.stopped_after is not None:
            raise CheckpointError(
                f"statekit job {self.coordinator.job_id!r} was stopped with a savepoint after micro-batch "
                f"{self.stopped_after}; micro-batch {batch_id} started before the stop took effect and is "
                "neither processed nor committed (restarting the query from its checkpoint location "
                "processes it)"
            )

    def after_batch(self, location: str, checkpoint_id: int, batch_id: int, query_id: str) -> None:
        """Honour a pending request with checkpoint ``checkpoint_id`` (at ``location``) of ``batch_id``.

        Never raises: a request that cannot be read now is warned of and read
        again after the next batch; a savepoint that fails is answered with the reason.
        """
        job = self.coordinator.job_id
        try:
            request = take_request(self.storage, job)
        except CheckpointError as e:
            warnings.warn(
                f"statekit job {job!r}: cannot read savepoint requests ({e}); trying again after the next "
                "micro-batch",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        if request is None:
            return
        response = self._savepoint(request, location, checkpoint_id, batch_id)
        if request.stop:
            self.stopped_after = batch_id
            response = SavepointResponse(**{**response.__dict__, "stopped": True})
            threading.Thread(
                target=self._stop_query, args=(query_id,), name=f"statekit-stop-{job}", daemon=True
            ).start()
        try:
            respond(self.storage, job, response)
        except CheckpointError as e:
            warnings.warn(
                f"statekit job {job!r}: the answer to savepoint request {request.request_id[:12]} could not "
                f"be written ({e}); it was: {response.status} {response.location or response.failure}",
                RuntimeWarning,
                stacklevel=3,
            )

    def _savepoint(
        self, request: SavepointRequest, location: str, checkpoint_id: int, batch_id: int
    ) -> SavepointResponse:
        """A savepoint of the checkpoint at ``location``; the answer (failed with the reason on an error)."""
        target = request.target or self.savepoints_dir
        history = self.coordinator.history
        trigger_ms = time.time_ns() // 1_000_000
        try:
            if target is None:
                raise ConfigurationError(
                    "a savepoint needs a directory: pass --target (target_dir=), or set "
                    "statekit.savepoints.dir"
                )
            saved = convert_to_savepoint(self.storage, location, target)
        except Exception as e:  # noqa: BLE001 - answered: the requester reports it, the query goes on
            history.record(
                checkpoint_id=checkpoint_id,
                kind="savepoint",
                trigger_ms=trigger_ms,
                location=target or "-",
                subtasks=[],
                error=e,
                properties={"spark_batch_id": batch_id},
            )
            return SavepointResponse(
                request.request_id,
                FAILED,
                failure=f"{type(e).__name__}: {e}",
                checkpoint_id=checkpoint_id,
                batch_id=batch_id,
            )
        operators = load_checkpoint(self.storage, saved).metadata.operators
        subtasks = [st for sts in operators.values() for st in sts]
        history.record(
            checkpoint_id=checkpoint_id,
            kind="savepoint",
            trigger_ms=trigger_ms,
            location=saved,
            subtasks=subtasks,
            properties={"spark_batch_id": batch_id},
        )
        return SavepointResponse(
            request.request_id, COMPLETED, location=saved, checkpoint_id=checkpoint_id, batch_id=batch_id
        )
