"""The LocalRunner's side of savepoint requests: honoured after a checkpoint of ``run``, stop-with-savepoint.

``statekit savepoint trigger DIR --job J [--stop]`` (or
:func:`statekit.checkpoints._savepoint_requests.request_savepoint`) leaves a
request in the job's files; a Spark query reads it after each micro-batch
(``spark/_savepoint_request.py``), a :class:`~statekit.LocalRunner` after
each checkpoint its :meth:`~statekit.LocalRunner.run` takes. The runner then
takes a canonical savepoint of the state that checkpoint holds (nothing was
processed since), answers with its location or the reason it failed, and,
for ``--stop``, ends the run there: :class:`StopWithSavepoint` leaves the
read loop before the next record, and ``RunResult.stopped_with_savepoint``
names the savepoint. The source's position stays at that checkpoint, so a
run restored from the savepoint (or from ``"latest"``) goes on with the
next record.

What it may import: ``checkpoints``, ``_errors``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from .._contracts import CheckpointStorage
from .._errors import CheckpointError
from ..checkpoints._savepoint_requests import (
    COMPLETED,
    FAILED,
    SavepointResponse,
    respond,
    take_request,
)

__all__ = ["SavepointRequestsOfRun", "StopWithSavepoint"]


class StopWithSavepoint(Exception):
    """Raised out of a periodic checkpoint to end ``run`` after a stop-with-savepoint.

    Attributes:
        location: The savepoint taken.
    """

    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.location = location


class SavepointRequestsOfRun:
    """The savepoint requests a LocalRunner's run honours, one look after each of its checkpoints.

    Args:
        storage: The job's checkpoint storage (its job files hold the requests).
        job_id: The job.
        savepoint: Takes a savepoint into a directory (None: the storage's
            ``statekit.savepoints.dir``); returns its location.
    """

    def __init__(
        self, storage: CheckpointStorage, job_id: str, savepoint: Callable[[str | None], str]
    ) -> None:
        self.storage = storage
        self.job_id = job_id
        self._savepoint = savepoint
        self.stop_at: str | None = None  # the savepoint a stop-with-savepoint was taken at

    def after_checkpoint(self, checkpoint_id: int) -> None:
        """Honour a pending request now that checkpoint ``checkpoint_id`` completed.

        Never raises for the request's sake: one that cannot be read is read
        again after the next checkpoint (with a warning); a savepoint that
        fails is answered with the reason and the run goes on. A stop request
        that succeeded sets :attr:`stop_at`; the runner ends the run.
        """
        job = self.job_id
        try:
            request = take_request(self.storage, job)
        except CheckpointError as e:
            warnings.warn(
                f"statekit job {job!r}: cannot read savepoint requests ({e}); trying again after the "
                "next checkpoint",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        if request is None:
            return
        try:
            location = self._savepoint(request.target)
        except Exception as e:  # noqa: BLE001 - answered: the requester reports it, the run goes on
            response = SavepointResponse(
                request.request_id, FAILED, failure=f"{type(e).__name__}: {e}", checkpoint_id=checkpoint_id
            )
        else:
            response = SavepointResponse(
                request.request_id, COMPLETED, location=location, checkpoint_id=checkpoint_id,
                stopped=request.stop,
            )  # fmt: skip
            if request.stop:
                self.stop_at = location
        try:
            respond(self.storage, job, response)
        except CheckpointError as e:
            warnings.warn(
                f"statekit job {job!r}: the answer to savepoint request {request.request_id[:12]} could "
                f"not be written ({e}); it was: {response.status} {response.location or response.failure}",
                RuntimeWarning,
                stacklevel=3,
            )
