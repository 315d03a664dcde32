"""A running job's side of savepoint requests, for both runners: take one, write the savepoint, answer.

After a checkpoint completed (a Spark query's micro-batch, a LocalRunner
``run()``'s periodic or final checkpoint), the runner asks
:meth:`SavepointRequests.after_checkpoint` whether a request is pending (one
small read of the job's files; see :mod:`._savepoint_requests`). If so, that
checkpoint becomes a canonical, relocatable savepoint, as ``statekit
savepoint convert`` writes one (every file's digest checked, native
snapshots written canonically), the job's checkpoint history records it, and
the answer goes back to the requester. What stopping means is the runner's:
the answer says whether the request asked to stop, and the runner ends its
query or run after that checkpoint.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any

from .._contracts import CheckpointStorage
from .._errors import CheckpointError, ConfigurationError
from ._convert import convert_to_savepoint
from ._coordinator import CheckpointCoordinator
from ._restore import load_checkpoint
from ._savepoint_requests import COMPLETED, FAILED, SavepointRequest, SavepointResponse, respond, take_request

__all__ = ["SavepointRequests"]


class SavepointRequests:
    """The savepoint requests of one run of a job, honoured after its checkpoints.

    Args:
        coordinator: The run's coordinator (its storage, job and history).
        savepoints_dir: ``statekit.savepoints.dir``: where a request without a target writes.
    """

    def __init__(self, coordinator: CheckpointCoordinator, savepoints_dir: str | None) -> None:
        self.coordinator = coordinator
        self.savepoints_dir = savepoints_dir

    @property
    def storage(self) -> CheckpointStorage:
        return self.coordinator.storage

    def after_checkpoint(
        self,
        location: str,
        checkpoint_id: int,
        properties: dict[str, Any] | None = None,
        *,
        batch_id: int | None = None,
    ) -> SavepointResponse | None:
        """Honour a pending request with the completed checkpoint ``checkpoint_id`` at ``location``.

        Returns the answer given (None if no request was pending); a
        completed answer with ``stopped`` set asks the runner to stop now.
        Never raises: a request that cannot be read now is warned of and read
        again after the next checkpoint; a savepoint that fails is answered
        with the reason, and the job goes on.
        """
        job = self.coordinator.job_id
        try:
            request = take_request(self.storage, job)
        except CheckpointError as e:
            warnings.warn(
                f"statekit job {job!r}: cannot read savepoint requests ({e}); trying again after the next "
                "checkpoint",
                RuntimeWarning,
                stacklevel=3,
            )
            return None
        if request is None:
            return None
        response = self._savepoint(request, location, checkpoint_id, properties or {}, batch_id)
        try:
            respond(self.storage, job, response)
        except CheckpointError as e:
            # The requester cannot learn of the savepoint, and will report that none was written:
            # a stop it asked for does not happen either (the savepoint stays, named here).
            response = dataclasses.replace(response, stopped=False)
            warnings.warn(
                f"statekit job {job!r}: the answer to savepoint request {request.request_id[:12]} could not "
                f"be written ({e}); it was: {response.status} {response.location or response.failure}",
                RuntimeWarning,
                stacklevel=3,
            )
        return response

    def _savepoint(
        self,
        request: SavepointRequest,
        location: str,
        checkpoint_id: int,
        properties: dict[str, Any],
        batch_id: int | None,
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
        except Exception as e:  # noqa: BLE001 - answered: the requester reports it, the job goes on
            history.record(
                checkpoint_id=checkpoint_id, kind="savepoint", trigger_ms=trigger_ms, location=target or "-",
                subtasks=[], error=e, properties=properties,
            )  # fmt: skip
            return SavepointResponse(
                request.request_id, FAILED, failure=f"{type(e).__name__}: {e}", checkpoint_id=checkpoint_id,
                batch_id=batch_id,
            )  # fmt: skip
        operators = load_checkpoint(self.storage, saved).metadata.operators
        history.record(
            checkpoint_id=checkpoint_id, kind="savepoint", trigger_ms=trigger_ms, location=saved,
            subtasks=[st for sts in operators.values() for st in sts], properties=properties,
        )  # fmt: skip
        return SavepointResponse(
            request.request_id, COMPLETED, location=saved, checkpoint_id=checkpoint_id, batch_id=batch_id,
            stopped=request.stop,
        )  # fmt: skip
