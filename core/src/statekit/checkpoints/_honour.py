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

Handling a request can never hurt the job: nothing raises into the run
(a request that cannot be read is warned of and read again after the next
checkpoint; everything else is answered with the reason). A target is
accepted only under ``statekit.savepoints.dir`` or on the checkpoint
storage's own filesystem, and never inside a job's directory of the
checkpoints (``chk-<n>``, ``shared/``, ``files/``: retention and cleanup delete
there, after the requester was told ``completed``). One savepoint of a job
is written at a time in a process: a request taken while another is being
written (a Spark query's idle watcher and its micro-batch at once) is
answered ``busy``.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import re
import threading
import time
import warnings
from typing import Any

from .._contracts import CheckpointStorage
from .._errors import CheckpointError, ConfigurationError
from ._convert import convert_to_savepoint
from ._coordinator import CheckpointCoordinator
from ._restore import load_checkpoint
from ._savepoint_requests import (
    BUSY,
    COMPLETED,
    FAILED,
    SavepointRequest,
    SavepointResponse,
    respond,
    take_request,
)

__all__ = ["SavepointRequests", "check_target"]

_URL = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*)://([^/]*)(.*)")
_CHECKPOINT_TREE = re.compile(r"chk-[0-9]+|shared|files|taskowned|\..*")
# Jobs whose savepoint is being written in this process: one at a time per job.
_WRITING: dict[tuple[str, str], str] = {}
_WRITING_LOCK = threading.Lock()


def _split(location: str) -> tuple[str, str, str]:
    """``(protocol, authority, normalized path)`` of a local path or URL.

    Raises:
        ValueError: If its path climbs with ``..`` (never a savepoint target).
    """
    m = _URL.fullmatch(location)
    protocol, authority, path = (m[1].lower(), m[2], m[3]) if m else ("file", "", location)
    if protocol in ("file", "local"):
        protocol, authority = "file", ""
        # Symlinks resolved: a link into a job's checkpoint tree is inside it.
        path = os.path.realpath(os.path.expanduser(path) if m is None else (path or "/"))
    if ".." in path.split("/"):
        raise ValueError(f"{location} climbs with '..'")
    return protocol, authority, posixpath.normpath("/" + path.lstrip("/"))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_target(storage: CheckpointStorage, job_id: str, target: str, savepoints_dir: str | None) -> None:
    """Refuse a savepoint target a requester may not name; see the module doc.

    Raises:
        CheckpointError: Saying why and where a savepoint may go.
    """
    checkpoints = getattr(storage, "checkpoints_dir", None)
    allowed = [d for d in (savepoints_dir, getattr(storage, "savepoints_dir", None)) if d]
    where = " or ".join([f"under statekit.savepoints.dir ({d})" for d in allowed[:1]] + (
        [f"on the filesystem of the checkpoints ({checkpoints})"] if checkpoints else []
    ))  # fmt: skip
    try:
        protocol, authority, path = _split(target)
        roots = [_split(d) for d in allowed]
        home = _split(checkpoints) if isinstance(checkpoints, str) else None
    except ValueError as e:
        raise CheckpointError(f"savepoint target refused: {e}") from None
    inside = any((protocol, authority) == r[:2] and _under(path, r[2]) for r in roots)
    if not inside and (home is None or (protocol, authority) != home[:2]):
        raise CheckpointError(
            f"savepoint target {target} refused: a requested savepoint goes "
            f"{where or 'under statekit.savepoints.dir (unset here)'}"
        )
    if home is not None and (protocol, authority) == home[:2] and _under(path, home[2]):
        parts = [p for p in path[len(home[2]) :].split("/") if p]
        jobs = set(_jobs(storage)) | {job_id}
        if not parts or parts[0] in jobs or any(_CHECKPOINT_TREE.fullmatch(p) for p in parts[1:]):
            raise CheckpointError(
                f"savepoint target {target} refused: it lies in the checkpoints directory {checkpoints}"
                + (f", inside the directory of job {parts[0]!r}" if parts else "")
                + ", where retention and cleanup delete files; name a directory of its own, e.g. "
                "statekit.savepoints.dir"
            )


def _jobs(storage: CheckpointStorage) -> list[str]:
    list_jobs = getattr(storage, "list_jobs", None)
    try:
        return list(list_jobs()) if callable(list_jobs) else []
    except CheckpointError:
        return []


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
            return self._after_checkpoint(location, checkpoint_id, properties, batch_id)
        except Exception as e:  # noqa: BLE001 - a savepoint request never fails the job
            warnings.warn(
                f"statekit job {job!r}: a savepoint request could not be handled ({type(e).__name__}: {e}); "
                "the job goes on",
                RuntimeWarning,
                stacklevel=3,
            )
            return None

    def _after_checkpoint(
        self, location: str, checkpoint_id: int, properties: dict[str, Any] | None, batch_id: int | None
    ) -> SavepointResponse | None:
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
        key = (str(getattr(self.storage, "checkpoints_dir", id(self.storage))), job)
        with _WRITING_LOCK:
            writing = _WRITING.get(key)
            if writing is None:
                _WRITING[key] = request.request_id
        if writing is not None:
            response = SavepointResponse(
                request.request_id, BUSY, checkpoint_id=checkpoint_id, batch_id=batch_id,
                failure=f"a savepoint of job {job!r} is being written (request {writing[:12]}); ask again "
                "once it is answered",
            )  # fmt: skip
        else:
            try:
                response = self._savepoint(request, location, checkpoint_id, properties or {}, batch_id)
            finally:
                with _WRITING_LOCK:
                    _WRITING.pop(key, None)
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
            check_target(self.storage, self.coordinator.job_id, target, self.savepoints_dir)
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
