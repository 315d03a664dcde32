"""The checkpoint history of a job: every attempt, beyond retention, bounded (Flink's checkpoint statistics).

Retention keeps the newest completed checkpoints (one by default); an operator
also wants the ones before, and the failed ones with their reason. As Flink's
``CheckpointStatsTracker`` keeps the last ``web.checkpoints.history``
attempts for its Checkpoints tab, the :class:`CheckpointHistory` of a
coordinator records each attempt of the job, for both runners: its status
(``completed``, ``failed`` with the reason, ``subsumed`` once retention
deleted it, ``discarded`` when it was deleted otherwise), trigger time,
duration, bytes (all of them; written by this attempt; uploaded vs
referenced for native incremental snapshots), backend and parallelism.

It is a file of the job next to its checkpoints
(:class:`~statekit.backend_api.SupportsJobFiles`: ``<job>/files/checkpoint-history.json``
on the ``filesystem`` storage), the newest ``statekit.checkpoints.history.max-entries``
attempts, rewritten whole after each attempt: magic, JSON, CRC-32, replaced
atomically by the storage, so a crash mid-write leaves the previous history.
Only the run that owns the job writes it (a fenced run records nothing).

A history that cannot be written never fails a checkpoint: the checkpoint
is what recovery needs, the history only tells about it. The failure is a
``RuntimeWarning`` naming the job and the cause; the attempts stay in memory
and the next write (after the next attempt) holds them all. A history file
found damaged when a run starts (bad JSON, a number like ``1e999``, a value
of the wrong kind, a checksum mismatch) is set aside as
``checkpoint-history.damaged.json``, warned of once and replaced by a new one;
:func:`read_checkpoint_history` refuses it with a :class:`DamagedHistoryError`
naming the file.
"""

from __future__ import annotations

import json
import math
import struct
import time
import warnings
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .._contracts import CheckpointStorage, SupportsJobFiles
from .._errors import CheckpointError
from ._metadata import SubtaskState
from ._timing import CheckpointTiming

__all__ = [
    "COMPLETED",
    "DAMAGED_HISTORY_FILE",
    "DISCARDED",
    "FAILED",
    "HISTORY_FILE",
    "SUBSUMED",
    "AttemptSizes",
    "CheckpointAttempt",
    "CheckpointHistory",
    "DamagedHistoryError",
    "history_file",
    "read_checkpoint_history",
]

#: The job file (:class:`~statekit.backend_api.SupportsJobFiles`) that holds the history.
HISTORY_FILE = "checkpoint-history.json"
#: Where a damaged history is set aside (the last one found) before a new one is written.
DAMAGED_HISTORY_FILE = "checkpoint-history.damaged.json"
#: Completed, and still retained (as far as the history knows).
COMPLETED = "completed"
#: Never completed: ``failure`` says why.
FAILED = "failed"
#: Completed, then deleted by retention because newer checkpoints completed.
SUBSUMED = "subsumed"
#: Completed, then found deleted by something else than this job's retention (by hand, another run).
DISCARDED = "discarded"

_MAGIC = b"STKHIST1"
_U32 = struct.Struct("<I")
_VERSION = 1
_MAX_FAILURE = 2000  # characters of a failure's reason kept: the first lines say what and where


@dataclass(frozen=True)
class AttemptSizes:
    """What a checkpoint's subtasks wrote, in bytes.

    Attributes:
        full: Every byte the checkpoint consists of (keyed and operator state).
        written: The bytes this attempt wrote (for native snapshots: uploaded).
        uploaded: Native (incremental) keyed snapshots: what they uploaded; None without any.
        referenced: Native keyed snapshots: what they reference of earlier checkpoints; None without any.
        parallelism: The most subtasks an operator has (0 when unknown).
        backend: The keyed backends that wrote it, comma-separated.
    """

    full: int = 0
    written: int = 0
    uploaded: int | None = None
    referenced: int | None = None
    parallelism: int = 0
    backend: str = ""

    @classmethod
    def of(cls, subtasks: Iterable[SubtaskState]) -> AttemptSizes:
        """The sizes the subtasks' metadata entries record (those known when an attempt failed, too)."""
        full = written = 0
        uploaded: int | None = None
        per_operator: dict[str, int] = {}
        backends: set[str] = set()
        for st in subtasks:
            per_operator[st.operator_id] = per_operator.get(st.operator_id, 0) + 1
            keyed, operator = st.keyed or {}, st.operator or {}
            size = int(keyed.get("size", 0))
            full += size + int(operator.get("size", 0))
            written += int(operator.get("size", 0))
            if keyed.get("backend"):
                backends.add(str(keyed["backend"]))
            if "uploaded" in keyed:  # a native snapshot: the rest it references
                uploaded = (uploaded or 0) + int(keyed["uploaded"])
                written += int(keyed["uploaded"])
            else:
                written += size
        referenced = None
        if uploaded is not None:
            referenced = full - written
        return cls(
            full,
            written,
            uploaded,
            referenced,
            max(per_operator.values(), default=0),
            ",".join(sorted(backends)),
        )


@dataclass(frozen=True)
class CheckpointAttempt:
    """One checkpoint or savepoint attempt of a job, as the history records it.

    Attributes:
        checkpoint_id: The checkpoint's id (a savepoint: the id of the checkpoint it was taken at).
        kind: ``checkpoint`` or ``savepoint``.
        status: ``completed``, ``failed``, ``subsumed`` or ``discarded``.
        trigger_ms: When it began (epoch milliseconds).
        duration_ms: From its trigger to its completion or failure. On Spark a
            checkpoint is triggered when its micro-batch starts, so this is the
            whole batch up to ``_metadata`` (tasks, sink, metadata); on the
            LocalRunner, the checkpoint's own time. See :mod:`._timing`.
        snapshot_ms: The subtasks' snapshots without the upload (on Spark the
            slowest task's); None where not measured (a failed attempt, an older history).
        upload_ms: The same task's time writing the snapshots into the checkpoint storage.
        metadata_ms: Writing ``_metadata``, on the driver.
        location: Where it is (was) written.
        sizes: Its bytes (for a failed attempt, what its subtasks reported before it failed).
        failure: Why it failed (the error's type and message), else None.
        runner: The run that took it (``LocalRunner``, a Spark application).
        batch_id: The Spark micro-batch it was taken after, if any.
        dropped_fields: What the restore its run started from dropped of the stored values (state
            to changes, e.g. a removed field), on the first checkpoint after that restore.
        restore_origin: The checkpoint or savepoint an explicit restore took, whose
            history this one descends from (its location when it was restored), if any.
    """

    checkpoint_id: int
    kind: str
    status: str
    trigger_ms: int
    duration_ms: int
    location: str
    sizes: AttemptSizes = field(default_factory=AttemptSizes)
    failure: str | None = None
    runner: str = ""
    batch_id: int | None = None
    dropped_fields: dict[str, list[str]] = field(default_factory=dict)
    restore_origin: str | None = None
    snapshot_ms: int | None = None
    upload_ms: int | None = None
    metadata_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The attempt as a flat JSON object (what ``statekit checkpoints history --json`` prints)."""
        out = asdict(self)
        sizes = out.pop("sizes")
        out.update(
            full_bytes=sizes["full"],
            written_bytes=sizes["written"],
            uploaded_bytes=sizes["uploaded"],
            referenced_bytes=sizes["referenced"],
            parallelism=sizes["parallelism"],
            backend=sizes["backend"],
        )
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> CheckpointAttempt:
        """Parse :meth:`to_json` output.

        Raises:
            ValueError, KeyError, TypeError: If it is malformed.
        """

        def opt_int(name: str) -> int | None:
            v = obj.get(name)
            return None if v is None else _count(name, v)

        def text(name: str, v: Any) -> str:
            if not isinstance(v, str):
                raise ValueError(f"{name} is {v!r}, not a string")
            return v

        return cls(
            checkpoint_id=_count("checkpoint_id", obj["checkpoint_id"]),
            kind=text("kind", obj["kind"]),
            status=text("status", obj["status"]),
            trigger_ms=_count("trigger_ms", obj["trigger_ms"]),
            duration_ms=_count("duration_ms", obj["duration_ms"]),
            location=text("location", obj["location"]),
            sizes=AttemptSizes(
                full=_count("full_bytes", obj.get("full_bytes", 0)),
                written=_count("written_bytes", obj.get("written_bytes", 0)),
                uploaded=opt_int("uploaded_bytes"),
                referenced=opt_int("referenced_bytes"),
                parallelism=_count("parallelism", obj.get("parallelism", 0)),
                backend=text("backend", obj.get("backend", "")),
            ),
            failure=None if obj.get("failure") is None else text("failure", obj["failure"]),
            runner=text("runner", obj.get("runner", "")),
            batch_id=opt_int("batch_id"),
            dropped_fields={
                str(k): [str(c) for c in v]
                for k, v in dict(obj.get("dropped_fields") or {}).items()
                if isinstance(v, list)
            },
            restore_origin=None if obj.get("restore_origin") is None else str(obj["restore_origin"]),
            snapshot_ms=opt_int("snapshot_ms"),
            upload_ms=opt_int("upload_ms"),
            metadata_ms=opt_int("metadata_ms"),
        )


def _count(name: str, v: Any) -> int:
    """``v`` if it is an integer ≥ 0 of at most 63 bits, else ValueError (``1e999``, ``true``, ``"7"``)."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 63:
        raise ValueError(f"{name} is {str(v)[:40]}, not a count")
    return v


def encode_history(attempts: Sequence[CheckpointAttempt]) -> bytes:
    """The history file's bytes: magic, JSON, CRC-32 of the JSON."""
    body = json.dumps(
        {"version": _VERSION, "attempts": [a.to_json() for a in attempts]},
        separators=(",", ":"),
        sort_keys=True,
    ).encode()
    return _MAGIC + body + _U32.pack(zlib.crc32(body))


def decode_history(data: bytes) -> list[CheckpointAttempt]:
    """Parse :func:`encode_history` output, oldest attempt first.

    Raises:
        ValueError: Saying what is wrong, if the bytes are not a history statekit wrote.
    """
    if len(data) < len(_MAGIC) + 4 or not data.startswith(_MAGIC):
        raise ValueError("not a statekit checkpoint history")
    body = data[len(_MAGIC) : -4]
    if zlib.crc32(body) != _U32.unpack(data[-4:])[0]:
        raise ValueError("checksum mismatch: the file is damaged")
    try:
        obj = json.loads(body, parse_constant=_no_constant, parse_float=_finite)
        version = obj.get("version") if isinstance(obj, dict) else None
        if version != _VERSION:
            raise ValueError(
                f"version {version!r} is not one this statekit reads (a newer statekit wrote it?)"
            )
        if not isinstance(obj["attempts"], list) or not all(isinstance(a, dict) for a in obj["attempts"]):
            raise ValueError("attempts is not a list of objects")
        return [CheckpointAttempt.from_json(a) for a in obj["attempts"]]
    except ValueError as e:  # bad JSON, bad UTF-8, a value of the wrong kind
        raise ValueError(f"malformed ({str(e)[:200]})") from None
    except (KeyError, TypeError, AttributeError, ArithmeticError, RecursionError, MemoryError) as e:
        raise ValueError(f"malformed ({type(e).__name__}: {str(e)[:200]})") from None


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a history holds")


def _job_files(storage: CheckpointStorage) -> SupportsJobFiles | None:
    return storage if isinstance(storage, SupportsJobFiles) else None


def history_file(storage: CheckpointStorage, job_id: str) -> str:
    """Where the history of ``job_id`` is, for messages: its URL on a storage with job directories."""
    job_dir = getattr(storage, "job_dir", None)
    if callable(job_dir):
        try:
            return f"{job_dir(job_id)}/files/{HISTORY_FILE}"
        except Exception:  # noqa: BLE001 - a job id the storage refuses: name the file as below
            pass
    name = getattr(storage, "name", "checkpoint")
    return f"{HISTORY_FILE} among the job files of job {job_id!r} in the {name} storage"


def read_checkpoint_history(storage: CheckpointStorage, job_id: str) -> list[CheckpointAttempt]:
    """The recorded checkpoint attempts of ``job_id``, oldest first (empty if none was recorded).

    Raises:
        CheckpointError: If the storage keeps no job files (so no history), the
            store fails, or the history is damaged (naming the file and the way out).
    """
    files = _job_files(storage)
    if files is None:
        raise CheckpointError(
            f"the {getattr(storage, 'name', type(storage).__name__)} checkpoint storage keeps no job files, "
            "so no checkpoint history (it does not implement statekit.backend_api.SupportsJobFiles)"
        )
    data = files.read_job_file(job_id, HISTORY_FILE)
    if data is None:
        return []
    try:
        return decode_history(data)
    except ValueError as e:
        raise DamagedHistoryError(
            f"the checkpoint history of job {job_id!r}, {history_file(storage, job_id)}, is damaged: {e}. "
            "The job's next checkpoint sets it aside (as "
            f"{DAMAGED_HISTORY_FILE}) and starts a new one; or delete it. Its checkpoints are not affected",
            data=data,
        ) from None


class DamagedHistoryError(CheckpointError):
    """The history file is not one statekit wrote whole: its bytes are kept in :attr:`data`."""

    def __init__(self, message: str, *, data: bytes = b"") -> None:
        super().__init__(message)
        self.data = data

    def __reduce__(self) -> Any:
        return (_damaged, (str(self), self.data))


def _damaged(message: str, data: bytes) -> DamagedHistoryError:
    return DamagedHistoryError(message, data=data)


class CheckpointHistory:
    """The history a coordinator records, for one run of a job.

    Args:
        storage: The job's checkpoint storage (no history if it keeps no job files).
        job_id: The job.
        max_entries: Attempts kept, newest last; 0 records none.
        runner: Names the run in each attempt.
    """

    def __init__(self, storage: CheckpointStorage, job_id: str, max_entries: int, runner: str) -> None:
        self.storage = storage
        self.job_id = job_id
        self.max_entries = max_entries
        self.runner = runner
        self._attempts: list[CheckpointAttempt] | None = None  # read at the first record
        self._unwritten = False  # an attempt recorded with write=False, not written yet

    @property
    def enabled(self) -> bool:
        """Whether attempts are recorded (a positive bound and a storage that keeps job files)."""
        return self.max_entries > 0 and _job_files(self.storage) is not None

    def attempts(self) -> list[CheckpointAttempt]:
        """The attempts this run knows of (read from the storage at its first record), oldest first."""
        return list(self._attempts or [])

    def record(
        self,
        *,
        checkpoint_id: int,
        kind: str,
        trigger_ms: int,
        location: str,
        subtasks: Iterable[SubtaskState],
        error: BaseException | None = None,
        properties: Mapping[str, Any] | None = None,
        write: bool = True,
        timing: CheckpointTiming | None = None,
    ) -> None:
        """Record one attempt (completed, or failed with ``error``) and write the history.

        ``timing``: a completed checkpoint's phases; its duration is the attempt's.

        With ``write=False`` the history is written by the next :meth:`subsumed`
        or :meth:`flush` instead: a completed checkpoint's retention follows at
        once, and one write then holds both (one file write per checkpoint, not two).

        Never raises: see the module doc.
        """
        if not self.enabled:
            return
        try:
            self._record(
                checkpoint_id, kind, trigger_ms, location, subtasks, error, properties, write, timing
            )
        except Exception as e:  # noqa: BLE001 - the history never fails a checkpoint (module doc)
            self._warn(f"checkpoint {checkpoint_id} could not be recorded in its checkpoint history ({e!r})")

    def _record(
        self,
        checkpoint_id: int,
        kind: str,
        trigger_ms: int,
        location: str,
        subtasks: Iterable[SubtaskState],
        error: BaseException | None,
        properties: Mapping[str, Any] | None,
        write: bool,
        timing: CheckpointTiming | None,
    ) -> None:
        batch = (properties or {}).get("spark_batch_id")
        dropped = (properties or {}).get("restore_dropped_fields")  # runtime._migration_log.DROPPED_PROPERTY
        origin = (properties or {}).get("restore_origin")
        where = origin.get("location") if isinstance(origin, dict) else None  # the restore taken
        origin_location = None if where is None else str(where)
        ms = timing.to_ms() if timing is not None else {}
        failure = None
        if error is not None:
            failure = f"{type(error).__name__}: {error}"[:_MAX_FAILURE]
        attempt = CheckpointAttempt(
            checkpoint_id=checkpoint_id,
            kind=kind,
            status=COMPLETED if error is None else FAILED,
            trigger_ms=trigger_ms,
            duration_ms=ms.get("duration_ms", max(0, time.time_ns() // 1_000_000 - trigger_ms)),
            location=location,
            sizes=AttemptSizes.of(subtasks),
            failure=failure,
            runner=self.runner,
            batch_id=batch if isinstance(batch, int) and not isinstance(batch, bool) else None,
            dropped_fields=dict(dropped) if isinstance(dropped, dict) else {},
            restore_origin=origin_location,
            snapshot_ms=ms.get("snapshot_ms"),
            upload_ms=ms.get("upload_ms"),
            metadata_ms=ms.get("metadata_ms"),
        )
        attempts = self._load()
        attempts.append(attempt)
        del attempts[: max(0, len(attempts) - self.max_entries)]
        if write:
            self._write()
        else:
            self._unwritten = True

    def subsumed(self, locations: Iterable[str]) -> None:
        """Retention deleted the completed checkpoints at ``locations``: mark them ``subsumed``.

        Writes the history if that changed it or an attempt is not written yet.
        Never raises: see the module doc.
        """
        gone = set(locations)
        if not self.enabled or self._attempts is None:
            return
        changed = False
        for i, a in enumerate(self._attempts):
            if a.status == COMPLETED and a.kind == "checkpoint" and a.location in gone:
                self._attempts[i] = replace(a, status=SUBSUMED)
                changed = True
        if changed or self._unwritten:
            self._write()

    def flush(self) -> None:
        """Write the history if an attempt recorded with ``write=False`` is not written yet. Never raises."""
        if self._unwritten and self.enabled and self._attempts is not None:
            self._write()

    def _load(self) -> list[CheckpointAttempt]:
        """The attempts recorded before this run, read once; a damaged or unreadable history is warned of."""
        if self._attempts is not None:
            return self._attempts
        try:
            attempts = read_checkpoint_history(self.storage, self.job_id)
        except DamagedHistoryError as e:
            attempts = []
            self._set_aside(e)
            self._unwritten = True  # rewritten whole with this run's first attempt (or at flush)
        except CheckpointError as e:
            self._warn(f"{e}; a new checkpoint history starts now")
            attempts = []
        try:
            retained = set(self.storage.list_checkpoints(self.job_id))
        except Exception:  # noqa: BLE001 - the store is down: mark nothing now
            retained = None  # the store is down: mark nothing (the next run checks again)
        if retained is not None:
            # Completed checkpoints gone without this job's retention marking them (deleted by hand,
            # or by a run that kept no history): discarded.
            attempts = [
                replace(a, status=DISCARDED)
                if a.status == COMPLETED and a.kind == "checkpoint" and a.location not in retained
                else a
                for a in attempts
            ]
        self._attempts = attempts
        return attempts

    def _set_aside(self, damaged: DamagedHistoryError) -> None:
        """Keep the damaged file's bytes as :data:`DAMAGED_HISTORY_FILE` (for a look), warned of once."""
        files = _job_files(self.storage)
        assert files is not None
        try:
            files.write_job_file(self.job_id, DAMAGED_HISTORY_FILE, damaged.data)
            where = f"its bytes are kept as {DAMAGED_HISTORY_FILE} beside it"
        except Exception as e:  # noqa: BLE001 - the history never fails a checkpoint (module doc)
            where = f"its bytes could not be set aside ({e})"
        message = str(damaged).partition(" The job's next checkpoint")[0]
        self._warn(f"{message} It is replaced by a new checkpoint history now; {where}")

    def _write(self) -> None:
        files = _job_files(self.storage)
        assert files is not None and self._attempts is not None
        self._unwritten = False  # a failed write is warned of; the next one holds every attempt
        try:
            files.write_job_file(self.job_id, HISTORY_FILE, encode_history(self._attempts))
        except Exception as e:  # noqa: BLE001 - the history never fails a checkpoint (module doc)
            self._warn(
                f"its checkpoint history could not be written ({e}); the checkpoints are not affected, "
                "and the next checkpoint writes the history again with every attempt since"
            )

    def _warn(self, problem: str) -> None:
        warnings.warn(f"statekit job {self.job_id!r}: {problem}", RuntimeWarning, stacklevel=5)
