"""Savepoint requests to a running job, and their answers, through the job's files.

Flink takes ``flink savepoint <job>`` and ``flink stop --savepointPath`` to
its JobManager; a statekit job has no server to call, but its runner reads
the job's checkpoint storage at every checkpoint. So a request is a small
job file (:class:`~statekit.backend_api.SupportsJobFiles`:
``<job>/files/savepoint-request.json`` on the ``filesystem`` storage) that
``statekit savepoint trigger`` or the Spark API writes; the running query
reads it after its next micro-batch's checkpoint, deletes it (so it is
honoured once), writes a canonical savepoint of that checkpoint, and answers
in ``savepoint-response.json`` (the location, or why it failed), which the
requester waits for. With ``stop`` the query ends after that batch.

A request carries its deadline: a runner that finds it after the requester
gave up answers ``expired`` and does nothing else, so a forgotten
``--stop`` never stops a query later. One request at a time: a new one
while another is pending (and not past its deadline) is refused, naming it.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .._contracts import CheckpointStorage, SupportsJobFiles
from .._errors import CheckpointError

__all__ = [
    "COMPLETED",
    "EXPIRED",
    "FAILED",
    "REQUEST_FILE",
    "RESPONSE_FILE",
    "SavepointRequest",
    "SavepointResponse",
    "describe",
    "job_files",
    "request_savepoint",
    "respond",
    "take_request",
]

#: The job file holding the pending request, if any.
REQUEST_FILE = "savepoint-request.json"
#: The job file holding the answer to the latest request.
RESPONSE_FILE = "savepoint-response.json"
COMPLETED = "completed"
FAILED = "failed"
EXPIRED = "expired"
_POLL = 0.25  # seconds between two reads of the answer: a micro-batch takes longer than that


@dataclass(frozen=True)
class SavepointRequest:
    """A request for a savepoint of a running job.

    Attributes:
        request_id: Random; the answer names it.
        target: The directory to write the savepoint in; None: ``statekit.savepoints.dir``.
        stop: End the query after the batch the savepoint is taken at.
        requested_ms: When it was made (epoch milliseconds).
        deadline_ms: When the requester stops waiting; found later, it is answered ``expired``.
        requested_by: Who asked (host and pid), for messages.
    """

    request_id: str
    target: str | None
    stop: bool
    requested_ms: int
    deadline_ms: int
    requested_by: str

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> SavepointRequest:
        """Parse :meth:`to_bytes` output.

        Raises:
            ValueError: If it is not a request statekit wrote.
        """
        try:
            obj = json.loads(data)
            target = obj.get("target")
            return cls(
                request_id=str(obj["request_id"]),
                target=None if target is None else str(target),
                stop=bool(obj["stop"]),
                requested_ms=int(obj["requested_ms"]),
                deadline_ms=int(obj["deadline_ms"]),
                requested_by=str(obj.get("requested_by", "?")),
            )
        except (KeyError, TypeError, AttributeError, RecursionError) as e:
            raise ValueError(f"malformed savepoint request ({type(e).__name__}: {e})") from None


@dataclass(frozen=True)
class SavepointResponse:
    """The answer to a :class:`SavepointRequest`.

    Attributes:
        request_id: The request answered.
        status: ``completed``, ``failed`` or ``expired`` (found after its deadline: nothing done).
        location: The savepoint's location, when completed.
        failure: Why it failed.
        checkpoint_id: The checkpoint the savepoint was taken at.
        batch_id: The Spark micro-batch after which it was taken.
        stopped: Whether the query is being stopped after that batch.
        answered_ms: When it was answered.
    """

    request_id: str
    status: str
    location: str | None = None
    failure: str | None = None
    checkpoint_id: int | None = None
    batch_id: int | None = None
    stopped: bool = False
    answered_ms: int = 0

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> SavepointResponse:
        """Parse :meth:`to_bytes` output.

        Raises:
            ValueError: If it is not an answer statekit wrote.
        """
        try:
            obj = json.loads(data)
            return cls(**{k: obj.get(k) for k in cls.__dataclass_fields__ if k in obj})
        except (TypeError, AttributeError, RecursionError) as e:
            raise ValueError(f"malformed savepoint response ({type(e).__name__}: {e})") from None


def job_files(storage: CheckpointStorage) -> SupportsJobFiles:
    """``storage`` as a keeper of job files.

    Raises:
        CheckpointError: If it keeps none (then no request can reach a running job through it).
    """
    if not isinstance(storage, SupportsJobFiles):
        raise CheckpointError(
            f"the {getattr(storage, 'name', type(storage).__name__)} checkpoint storage keeps no job files, "
            "so a running job cannot be asked for a savepoint through it"
        )
    return storage


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def request_savepoint(
    storage: CheckpointStorage,
    job_id: str,
    target: str | None,
    *,
    stop: bool,
    timeout: float,
    sleep: Callable[[float], None] = time.sleep,
) -> SavepointResponse:
    """Ask the running job ``job_id`` for a savepoint after its next checkpoint, and wait for the answer.

    Returns the answer (``completed`` with the location, or ``failed`` with
    the reason); the caller reports a failure.

    Raises:
        CheckpointError: If another request is pending, or no answer came
            within ``timeout`` seconds (the request is withdrawn then: no query
            of the job ran a micro-batch meanwhile, because none runs or it has
            no new input), or the store fails.
    """
    files = job_files(storage)
    pending = files.read_job_file(job_id, REQUEST_FILE)
    if pending is not None:
        try:
            other = SavepointRequest.from_bytes(pending)
        except ValueError:
            other = None  # a damaged request: replaced (a runner would refuse it anyway)
        if other is not None and other.deadline_ms > _now_ms():
            raise CheckpointError(
                f"a savepoint request of job {job_id!r} is pending: {other.request_id[:12]} by "
                f"{other.requested_by}, waiting until "
                f"{time.strftime('%H:%M:%S', time.gmtime(other.deadline_ms / 1000))} UTC. "
                "Wait for it (one request at a time), or delete the job file "
                f"{REQUEST_FILE} (<job>/files/ on the filesystem storage) if its requester is gone"
            )
    now = _now_ms()
    request = SavepointRequest(
        request_id=uuid.uuid4().hex,
        target=target,
        stop=stop,
        requested_ms=now,
        deadline_ms=now + int(timeout * 1000),
        requested_by=f"pid {os.getpid()} on host {socket.gethostname()}",
    )
    files.write_job_file(job_id, REQUEST_FILE, request.to_bytes())
    while True:
        data = files.read_job_file(job_id, RESPONSE_FILE)
        if data is not None:
            try:
                response = SavepointResponse.from_bytes(data)
            except ValueError:
                response = None  # another request's damaged answer: not ours
            if response is not None and response.request_id == request.request_id:
                return response
        if _now_ms() >= request.deadline_ms:
            break
        sleep(_POLL)
    _withdraw(files, job_id, request)
    raise CheckpointError(
        f"no running query of job {job_id!r} answered the savepoint request within {timeout:g} s: none "
        "took a checkpoint meanwhile (a Spark query answers after its next micro-batch's checkpoint, a "
        "LocalRunner's run() after its next checkpoint). Is a query of the job running, with this "
        "checkpoints directory, and getting input? The request is withdrawn; no savepoint was written"
    )


def _withdraw(files: SupportsJobFiles, job_id: str, request: SavepointRequest) -> None:
    """Delete ``request`` if it is still pending (a runner that finds it later answers ``expired``)."""
    data = files.read_job_file(job_id, REQUEST_FILE)
    if data is not None and data == request.to_bytes():
        files.delete_job_file(job_id, REQUEST_FILE)


def take_request(storage: CheckpointStorage, job_id: str) -> SavepointRequest | None:
    """The pending request of ``job_id``, deleted so that it is honoured once; None if none is pending.

    A request past its deadline is answered ``expired`` here and None
    returned; a damaged one is deleted and answered ``failed``.

    Raises:
        CheckpointError: If the store fails (the request stays for the next batch).
    """
    if not isinstance(storage, SupportsJobFiles):
        return None
    data = storage.read_job_file(job_id, REQUEST_FILE)
    if data is None:
        return None
    # Read again right before the delete (only when a request is pending): one replaced
    # meanwhile (a new request after an expired one) is left for the next checkpoint.
    if storage.read_job_file(job_id, REQUEST_FILE) != data:
        return None
    storage.delete_job_file(job_id, REQUEST_FILE)
    try:
        request = SavepointRequest.from_bytes(data)
    except ValueError as e:
        respond(storage, job_id, SavepointResponse("unknown", FAILED, failure=str(e)))
        return None
    if request.deadline_ms <= _now_ms():
        respond(storage, job_id, SavepointResponse(request.request_id, EXPIRED))
        return None
    return request


def respond(storage: CheckpointStorage, job_id: str, response: SavepointResponse) -> None:
    """Write the answer (replacing the previous one).

    Raises:
        CheckpointError: If the store fails.
    """
    answered = SavepointResponse(**{**asdict(response), "answered_ms": _now_ms()})
    job_files(storage).write_job_file(job_id, RESPONSE_FILE, answered.to_bytes())


def describe(response: SavepointResponse) -> dict[str, Any]:
    """The answer as JSON (what ``statekit savepoint trigger --json`` prints)."""
    return asdict(response)
