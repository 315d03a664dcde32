"""The ``jobmanager`` checkpoint storage: completed checkpoints in the coordinator's memory.

Like Flink's JobManager checkpoint storage: every stream stays in memory and
becomes an inline handle whose description embeds its bytes, so it travels from
a Spark executor to the driver inside a task result; the driver keeps each
completed checkpoint's metadata in a dict of the storage object, which plays
the JobManager: a restarted job in that process reuses the object. Checkpoints
are lost with it. Savepoints are written as files, like the filesystem storage's.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from typing import Any

from statekit.backend_api import CheckpointWriter
from statekit.errors import CheckpointError, CheckpointNotFoundError, ConfigurationError
from statekit.snapshot_codec import StreamStateHandle

from ._files import Files
from ._handles import InlineStreamHandle
from ._jobfiles import check_job_file_name
from ._options import parse_storage_options
from ._paths import check_job_id, check_name, normalize_dir
from ._plugin import DEFAULT_INLINE_THRESHOLD, DEFAULT_MAX_STATE_SIZE
from ._streams import MemoryOutputStream
from ._writer import begin_savepoint

__all__ = ["JobManagerCheckpointStorage"]

_SCHEME = "jobmanager://"
_LOCATION = re.compile(r"jobmanager://([^/]+)/chk-(0|[1-9][0-9]*)/?")


def _parse(location: str) -> tuple[str, int] | None:
    """``(job id, checkpoint id)`` of a jobmanager location; None for any other URL."""
    if not location.startswith(_SCHEME):
        return None
    match = _LOCATION.fullmatch(location)
    if match is None:
        raise CheckpointNotFoundError(
            f"{location} is no checkpoint location: expected {_SCHEME}<job id>/chk-<n>"
        )
    return match[1], int(match[2])


class _MemoryWriter:
    """Collects streams as inline handles; ``complete`` keeps the metadata in the storage."""

    def __init__(self, storage: JobManagerCheckpointStorage, job_id: str, checkpoint_id: int) -> None:
        self._storage = storage
        self._job_id = job_id
        self._checkpoint_id = checkpoint_id

    @property
    def location(self) -> str:
        """``jobmanager://<job id>/chk-<n>``."""
        return f"{_SCHEME}{self._job_id}/chk-{self._checkpoint_id}"

    def _complete(self) -> bool:
        with self._storage._lock:
            return self._checkpoint_id in self._storage._completed.get(self._job_id, {})

    def create_stream(self, name: str, *, shared: bool = False) -> MemoryOutputStream:
        """An in-memory stream; its handle is always inline (``shared`` changes nothing).

        Raises:
            CheckpointError: If the checkpoint is already complete.
        """
        if self._complete():
            raise CheckpointError(f"{self.location} is a completed checkpoint: it is never written again")
        return MemoryOutputStream(check_name(name))

    def complete(self, metadata: bytes) -> str:
        """Keeps ``metadata`` in the storage object; returns :attr:`location`.

        Raises:
            CheckpointError: If the checkpoint is already complete.
        """
        with self._storage._lock:
            done = self._storage._completed.setdefault(self._job_id, {})
            if self._checkpoint_id in done:
                raise CheckpointError(f"{self.location} is already complete; its metadata is never replaced")
            done[self._checkpoint_id] = bytes(metadata)
        return self.location

    def abort(self) -> None:
        """Nothing to delete: streams were only in memory.

        Raises:
            CheckpointError: If the checkpoint is complete (as every storage's writer).
        """
        if self._complete():
            raise CheckpointError(f"{self.location} is complete; abort() deletes only unfinished ones")


class JobManagerCheckpointStorage:
    """Completed checkpoints in the memory of the process that coordinates the job.

    The object plays Flink's JobManager: it holds the metadata of the checkpoints
    completed through it, so a job restarted in the same process restores by
    reusing it. For tests and small state: checkpoints are lost with the object
    (and are not pickled with it), and each state's snapshot may be at most
    :attr:`max_state_size` bytes (the coordinator enforces it).

    Example::

        storage = JobManagerCheckpointStorage(savepoints_dir="/data/savepoints")
        writer = storage.begin_checkpoint("job-1", 1)
        out = writer.create_stream("keyed-op-0.bin")
        out.write(data)
        description = out.close_and_get_handle().to_json()   # embeds the bytes
        writer.complete(metadata)                              # "jobmanager://job-1/chk-1"

    Attributes:
        max_state_size: The largest snapshot of one state, in bytes.
        savepoints_dir: The default parent of new savepoints, or None.
    """

    name = "jobmanager"

    def __init__(
        self,
        *,
        max_state_size: int = DEFAULT_MAX_STATE_SIZE,
        savepoints_dir: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        local_permissions: str = "private",
    ) -> None:
        """Creates the storage (savepoints on local disks: 0700/0600 unless ``local_permissions="umask"``).

        Raises:
            ConfigurationError: If ``max_state_size`` is not positive.
        """
        if max_state_size <= 0:
            raise ConfigurationError(f"max-state-size must be positive, not {max_state_size}")
        self.max_state_size: int | None = max_state_size
        self.savepoints_dir = None if savepoints_dir is None else normalize_dir(savepoints_dir)
        self._files = Files(
            storage_options or {},
            (self.savepoints_dir,),
            DEFAULT_INLINE_THRESHOLD,
            local_permissions=local_permissions,
        )
        self._completed: dict[str, dict[int, bytes]] = {}  # job id -> checkpoint id -> metadata
        self._runs: dict[str, dict[str, tuple[int, dict[str, Any]]]] = {}  # job id -> run id -> record
        self._job_files: dict[str, dict[str, bytes]] = {}  # job id -> name -> bytes
        self._lock = threading.Lock()

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> JobManagerCheckpointStorage:
        """The registry's factory: builds the storage from its parsed options."""
        return cls(
            max_state_size=options.get("max-state-size", DEFAULT_MAX_STATE_SIZE),
            savepoints_dir=options.get("savepoints-dir"),
            storage_options=parse_storage_options(
                options.get("storage-options"), cls.name, options.get("secret-storage-options")
            ),
            local_permissions=options.get("local-permissions", "private"),
        )

    def __repr__(self) -> str:
        """Names the size limit."""
        return f"JobManagerCheckpointStorage(max_state_size={self.max_state_size})"

    def __getstate__(self) -> dict[str, Any]:
        """Pickles the configuration only: checkpoints stay with the coordinating process."""
        return {**self.__dict__, "_completed": {}, "_runs": {}, "_job_files": {}, "_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restores the configuration, with no checkpoints."""
        self.__dict__.update(state, _lock=threading.Lock())

    def begin_checkpoint(self, job_id: str, checkpoint_id: int) -> CheckpointWriter:
        """A writer whose streams stay in memory."""
        if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int) or checkpoint_id < 0:
            raise CheckpointError(f"invalid checkpoint id {checkpoint_id!r}: expected an integer >= 0")
        return _MemoryWriter(self, check_job_id(job_id), checkpoint_id)

    def begin_savepoint(self, job_id: str, target_dir: str | None = None) -> CheckpointWriter:
        """A writer for a savepoint as files, in ``target_dir`` or the savepoints dir.

        Raises:
            ConfigurationError: If neither ``target_dir`` nor a savepoints dir is set.
        """
        if target_dir is None and self.savepoints_dir is None:
            raise ConfigurationError(
                "the jobmanager storage writes savepoints as files and needs a directory for them: "
                "set statekit.savepoints.dir or pass a target directory"
            )
        parent = target_dir if target_dir is not None else self.savepoints_dir
        return begin_savepoint(self._files, job_id, parent)

    def list_checkpoints(self, job_id: str) -> list[str]:
        """Locations of the completed checkpoints of ``job_id`` held here, oldest first."""
        with self._lock:
            ids = sorted(self._completed.get(job_id, ()))
        return [f"{_SCHEME}{job_id}/chk-{i}" for i in ids]

    def latest_checkpoint(self, job_id: str) -> str | None:
        """The location of the newest completed checkpoint of ``job_id``, if any."""
        done = self.list_checkpoints(job_id)
        return done[-1] if done else None

    def read_metadata(self, location: str) -> bytes:
        """The metadata of a checkpoint in memory, or of a savepoint (any other URL).

        Raises:
            CheckpointNotFoundError: If there is no such checkpoint or savepoint.
        """
        parsed = _parse(location)
        if parsed is None:
            return self._files.read_metadata(location)
        with self._lock:
            metadata = self._completed.get(parsed[0], {}).get(parsed[1])
        if metadata is None:
            raise CheckpointNotFoundError(
                f"no completed checkpoint at {location}: the jobmanager storage keeps checkpoints only in "
                "the memory of the storage object (in the coordinating process) that completed them"
            )
        return metadata

    def resolve_handle(self, location: str, description: Mapping[str, Any]) -> StreamStateHandle:
        """The inline handle ``description`` embeds (or a savepoint's file handle)."""
        if _parse(location) is None:
            return self._files.resolve_handle(location, description)
        if description.get("type") != "inline":
            raise CheckpointError(
                f"{location} holds only inline state handles, not {description.get('type')!r} ones"
            )
        return InlineStreamHandle.from_json(description)

    def discard_checkpoint(self, location: str) -> None:
        """Forgets a checkpoint kept in memory.

        Raises:
            CheckpointError: If ``location`` is not one of this storage's checkpoints (a savepoint).
        """
        parsed = _parse(location)
        if parsed is None:
            raise CheckpointError(
                f"refusing to discard {location}: not a jobmanager checkpoint; "
                "savepoints are never deleted by a storage, delete them yourself"
            )
        with self._lock:
            self._completed.get(parsed[0], {}).pop(parsed[1], None)

    def discard_shared(self, location: str, description: Mapping[str, Any]) -> None:
        """Nothing to delete: shared state is inline too.

        Raises:
            CheckpointError: If ``location`` is not one of this storage's checkpoints.
        """
        if _parse(location) is None:
            raise CheckpointError(f"refusing to delete a file of {location}: not a jobmanager checkpoint")

    def forget_job(self, job_id: str) -> None:
        """Forgets every checkpoint (and run) of ``job_id`` held here."""
        with self._lock:
            self._completed.pop(job_id, None)
            self._runs.pop(job_id, None)
            self._job_files.pop(job_id, None)

    # --- fencing (statekit.backend_api.SupportsRunFencing): runs sharing this object ----------------------

    def register_run(self, job_id: str, run_id: str, description: Mapping[str, Any]) -> int:
        """Records run ``run_id`` with an epoch above every run of ``job_id`` recorded here."""
        with self._lock:
            runs = self._runs.setdefault(job_id, {})
            epoch = max((e for e, _ in runs.values()), default=0) + 1
            runs[run_id] = (epoch, dict(description))
        return epoch

    def newest_run(self, job_id: str) -> tuple[int, str, dict[str, Any]] | None:
        """The newest run of ``job_id`` registered with this object, if any."""
        with self._lock:
            runs = self._runs.get(job_id, {})
            if not runs:
                return None
            run_id = max(runs, key=lambda r: (runs[r][0], r))
            epoch, description = runs[run_id]
            return epoch, run_id, dict(description)

    def end_run(self, job_id: str, run_id: str) -> None:
        """Marks run ``run_id`` ended."""
        with self._lock:
            record = self._runs.get(job_id, {}).get(run_id)
            if record is not None:
                record[1]["ended_ms"] = time.time_ns() // 1_000_000

    # --- a job's small files (statekit.backend_api.SupportsJobFiles): in this object's memory -------------

    def write_job_file(self, job_id: str, name: str, data: bytes) -> None:
        """Keeps ``data`` as file ``name`` of ``job_id`` (in memory, with the checkpoints)."""
        check_job_file_name(name)
        with self._lock:
            self._job_files.setdefault(check_job_id(job_id), {})[name] = bytes(data)

    def create_job_file(self, job_id: str, name: str, data: bytes) -> bool:
        """Keeps ``data`` as file ``name`` of ``job_id`` unless there is one; whether it was kept."""
        check_job_file_name(name)
        with self._lock:
            files = self._job_files.setdefault(check_job_id(job_id), {})
            if name in files:
                return False
            files[name] = bytes(data)
            return True

    def read_job_file(self, job_id: str, name: str) -> bytes | None:
        """File ``name`` of ``job_id`` kept here, or None."""
        check_job_file_name(name)
        with self._lock:
            return self._job_files.get(job_id, {}).get(name)

    def delete_job_file(self, job_id: str, name: str) -> None:
        """Forgets file ``name`` of ``job_id``."""
        check_job_file_name(name)
        with self._lock:
            self._job_files.get(job_id, {}).pop(name, None)
