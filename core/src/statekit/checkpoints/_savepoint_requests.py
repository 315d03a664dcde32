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
``--stop`` never stops a query later. One request at a time: the request
file is created exclusively (a hard link on local disks, a conditional put
on S3), so of two requesters the second is refused, naming the pending
request, never silently replacing it. A request is checked field by field
before anything is done (its size, every field's type, a deadline that is a
finite time at most :data:`MAX_WAIT_MS` ahead); one that is not a request
statekit writes is answered ``failed`` with the reason, and nothing else.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

from .._contracts import CheckpointStorage, SupportsJobFiles
from .._errors import CheckpointError

__all__ = [
    "BUSY",
    "COMPLETED",
    "EXPIRED",
    "FAILED",
    "MAX_REQUEST_BYTES",
    "MAX_WAIT_MS",
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
#: Answered when a savepoint of the job is being written already (one at a time per job).
BUSY = "busy"
#: The largest request a runner reads (statekit writes about 300 bytes).
MAX_REQUEST_BYTES = 4096
#: The longest a request may wait for its answer: a week (``--timeout`` of at most that).
MAX_WAIT_MS = 7 * 24 * 3600 * 1000
_REQUEST_ID = re.compile(r"[0-9a-f]{32}")
_MAX_TEXT = 1024  # characters of a target or requested_by
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
        """Parse :meth:`to_bytes` output, every field checked.

        Raises:
            ValueError: Saying what is wrong, if it is not a request statekit writes:
                over :data:`MAX_REQUEST_BYTES`, not a JSON object, a field missing or
                of another type (``"stop": "false"`` is no bool), a deadline that is
                not a finite time after the request or more than :data:`MAX_WAIT_MS` after it.
        """
        if len(data) > MAX_REQUEST_BYTES:
            raise ValueError(f"the request is {len(data):,} bytes, over the limit of {MAX_REQUEST_BYTES:,}")
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"the request is not JSON ({type(e).__name__}: {str(e)[:200]})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"the request is a JSON {type(obj).__name__}, not an object")
        unknown = sorted(set(obj) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"the request has fields no statekit writes: {unknown[:5]}")
        request_id = _field(obj, "request_id", str)
        if not _REQUEST_ID.fullmatch(request_id):
            raise ValueError("request_id is not 32 lowercase hex digits")
        target = obj.get("target")
        if target is not None:
            target = _field(obj, "target", str)
            if not target or len(target) > _MAX_TEXT or any(ord(c) < 32 for c in target):
                raise ValueError(f"target is empty, over {_MAX_TEXT} characters, or holds control characters")
        requested_by = _field(obj, "requested_by", str) if "requested_by" in obj else "?"
        if len(requested_by) > _MAX_TEXT:
            raise ValueError(f"requested_by is over {_MAX_TEXT} characters")
        requested_ms = _field(obj, "requested_ms", int)
        deadline_ms = _field(obj, "deadline_ms", int)
        if requested_ms < 0 or not requested_ms < deadline_ms <= requested_ms + MAX_WAIT_MS:
            raise ValueError(
                f"deadline_ms {deadline_ms} is not after requested_ms {requested_ms} by at most "
                f"{MAX_WAIT_MS // 3_600_000} hours"
            )
        return cls(request_id, target, _field(obj, "stop", bool), requested_ms, deadline_ms, requested_by)


def _field(obj: dict[str, Any], name: str, kind: type[Any]) -> Any:
    """``obj[name]`` if it is a ``kind`` (a bool is no int, a float no int), else a ValueError."""
    if name not in obj:
        raise ValueError(f"the request has no {name}")
    value = obj[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        shown = "infinite" if isinstance(value, float) and not math.isfinite(value) else repr(value)[:60]
        raise ValueError(f"{name} is {type(value).__name__} {shown}, expected {kind.__name__}")
    return value


def request_id_of(data: bytes) -> str:
    """The well-formed id a damaged request names (its answer names it), else ``unknown``."""
    if len(data) <= MAX_REQUEST_BYTES:
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            return "unknown"
        rid = obj.get("request_id") if isinstance(obj, dict) else None
        if isinstance(rid, str) and _REQUEST_ID.fullmatch(rid):
            return rid
    return "unknown"


@dataclass(frozen=True)
class SavepointResponse:
    """The answer to a :class:`SavepointRequest`.

    Attributes:
        request_id: The request answered.
        status: ``completed``, ``failed``, ``expired`` (found after its deadline: nothing done) or
            ``busy`` (a savepoint of the job was being written: nothing done, ask again).
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


@runtime_checkable
class _CreatesJobFiles(Protocol):
    """A storage that creates a job file only if there is none (both of statekit's do)."""

    def create_job_file(self, job_id: str, name: str, data: bytes) -> bool: ...


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


def _create(files: SupportsJobFiles, job_id: str, data: bytes) -> bool:
    """Create the request file exclusively; whether it was created (False: another request is there)."""
    if isinstance(files, _CreatesJobFiles):
        return files.create_job_file(job_id, REQUEST_FILE, data)
    # A third-party storage without exclusive creation: a check right before the write.
    if files.read_job_file(job_id, REQUEST_FILE) is not None:
        return False
    files.write_job_file(job_id, REQUEST_FILE, data)
    return True


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

    Returns the answer (``completed`` with the location, or ``failed``,
    ``busy`` with the reason); the caller reports a failure.

    Raises:
        CheckpointError: If another request is pending (created exclusively: of two
            requesters at once one is refused), ``timeout`` is not a positive number of
            seconds up to a week, or no answer came within ``timeout`` seconds (the request
            is withdrawn then: no query of the job ran a micro-batch meanwhile, because
            none runs or it has no new input), or the store fails.
    """
    if not (
        isinstance(timeout, (int, float)) and math.isfinite(timeout) and 0 < timeout * 1000 <= MAX_WAIT_MS
    ):
        raise CheckpointError(
            f"a savepoint request waits more than 0 s and at most a week, not {timeout!r} s"
        )
    files = job_files(storage)
    now = _now_ms()
    request = SavepointRequest(
        request_id=uuid.uuid4().hex,
        target=target,
        stop=stop,
        requested_ms=now,
        deadline_ms=now + max(1, int(timeout * 1000)),
        requested_by=f"pid {os.getpid()} on host {socket.gethostname()}"[:_MAX_TEXT],
    )
    SavepointRequest.from_bytes(request.to_bytes())  # what a runner would refuse is refused here
    if not _create(files, job_id, request.to_bytes()):
        pending = files.read_job_file(job_id, REQUEST_FILE)
        if pending is not None:
            _refuse_pending(job_id, pending)  # raises if it still waits for its answer
            # Past its deadline or not a request: its requester is gone. Deleted only if unchanged
            # (another requester may have replaced it meanwhile); then created exclusively again.
            if files.read_job_file(job_id, REQUEST_FILE) == pending:
                files.delete_job_file(job_id, REQUEST_FILE)
        if not _create(files, job_id, request.to_bytes()):
            _refuse_pending(job_id, files.read_job_file(job_id, REQUEST_FILE) or b"")
            raise CheckpointError(
                f"another savepoint request of job {job_id!r} was made at the same moment; one at a time"
            )
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


def _refuse_pending(job_id: str, pending: bytes) -> None:
    """Raise naming the pending request ``pending``, unless it is past its deadline or damaged."""
    try:
        other = SavepointRequest.from_bytes(pending)
    except ValueError:
        return
    if other.deadline_ms > _now_ms():
        raise CheckpointError(
            f"a savepoint request of job {job_id!r} is pending: {other.request_id[:12]} by "
            f"{other.requested_by}, waiting until "
            f"{time.strftime('%H:%M:%S', time.gmtime(other.deadline_ms / 1000))} UTC. "
            "Wait for it (one request at a time), or delete the job file "
            f"{REQUEST_FILE} (<job>/files/ on the filesystem storage) if its requester is gone"
        )


def _withdraw(files: SupportsJobFiles, job_id: str, request: SavepointRequest) -> None:
    """Delete ``request`` if it is still pending (a runner that finds it later answers ``expired``)."""
    data = files.read_job_file(job_id, REQUEST_FILE)
    if data is not None and data == request.to_bytes():
        files.delete_job_file(job_id, REQUEST_FILE)


def take_request(storage: CheckpointStorage, job_id: str) -> SavepointRequest | None:
    """The pending request of ``job_id``, deleted so that it is honoured once; None if none is pending.

    A request past its deadline is answered ``expired`` here (once) and None
    returned; it is left for the requester that replaces it to delete. One
    that is not a request statekit writes (see :meth:`SavepointRequest.from_bytes`)
    is deleted and answered ``failed`` with the reason.

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
    try:
        request = SavepointRequest.from_bytes(data)
    except ValueError as e:
        storage.delete_job_file(job_id, REQUEST_FILE)
        respond(
            storage, job_id,
            SavepointResponse(request_id_of(data), FAILED, failure=f"refused: {e}; nothing was done"),
        )  # fmt: skip
        return None
    if request.deadline_ms <= _now_ms():
        # Not deleted here: a new requester replaces an expired request (delete, then create), and a
        # delete of ours landing after that would delete the new one unanswered. Answered once.
        answered = storage.read_job_file(job_id, RESPONSE_FILE)
        if answered is None or request_id_of(answered) != request.request_id:
            respond(storage, job_id, SavepointResponse(request.request_id, EXPIRED))
        return None
    storage.delete_job_file(job_id, REQUEST_FILE)
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
