"""What a native checkpoint uploads, and what it references instead.

A native snapshot is a RocksDB checkpoint of the live instance (of each, when
a rescale left the subtask several: their files named with the instance's
prefix, ``0-000012.sst``): every column family flushed, then hard links to its
immutable SST files plus copies of MANIFEST, CURRENT, OPTIONS (and rocksdict's
config), taken on the task thread in milliseconds. ``write`` uploads it later,
possibly on another thread:

- an SST file that a checkpoint this instance was told completed already
  uploaded is *referenced* (its :class:`~statekit.snapshot_codec.NativeFile` is
  put in the new handle); any other SST file is uploaded into the storage's
  shared area;
- the other files are small and change every time: uploaded as files of this
  checkpoint only.

:class:`UploadTracker` keeps the bookkeeping, as Flink's
``RocksIncrementalSnapshotStrategy`` and Spark's ``RocksDBFileManager`` do:
uploads per pending checkpoint, and the confirmed ones that may be referenced.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from statekit.errors import SnapshotCancelledError, StateAccessError
from statekit.snapshot_codec import NativeFile, NativeSnapshotOutput, NativeStateHandle, ProgressCallback

from ._layout import ROCKSDB_INSTANCES_FORMAT

__all__ = ["RocksDBNativeSnapshot", "SnapshotSource", "UploadTracker"]


class UploadTracker:
    """Which SST files a checkpoint uploaded, and which uploads may be referenced.

    ``pending[n]`` holds the uploads of checkpoint ``n`` until the runner says
    it completed (they become *confirmed*) or aborted (they are forgotten). Only
    confirmed uploads are ever referenced; a checkpoint whose completion never
    arrives is subsumed when a later one completes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.confirmed: dict[str, NativeFile] = {}
        self.pending: dict[int, dict[str, NativeFile]] = {}

    def reusable(self, name: str) -> NativeFile | None:
        """The confirmed upload of SST file ``name``, if any."""
        with self._lock:
            return self.confirmed.get(name)

    def uploaded(self, checkpoint_id: int, files: dict[str, NativeFile]) -> None:
        """Checkpoint ``checkpoint_id`` uploaded ``files`` (SST name -> file)."""
        with self._lock:
            self.pending.setdefault(checkpoint_id, {}).update(files)

    def complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: its uploads may be referenced; older pending ones go."""
        with self._lock:
            done = self.pending.pop(checkpoint_id, {})
            self.confirmed.update(done)
            for cid in [c for c in self.pending if c < checkpoint_id]:
                del self.pending[cid]

    def abort(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` never completes: forget its uploads."""
        with self._lock:
            self.pending.pop(checkpoint_id, None)

    def restored(self, checkpoint_id: int | None = None, files: dict[str, NativeFile] | None = None) -> None:
        """The instance was restored: nothing is confirmed; its restored SST ``files`` wait for a claim.

        The restored files become pending under the restored checkpoint's id, so
        they are referenced only if the runner confirms that checkpoint
        (``notify_checkpoint_complete(checkpoint_id)`` right after the restore:
        a completed checkpoint of the same job, in the storage this instance
        checkpoints into). Without that confirmation, Flink's NO_CLAIM mode:
        the next checkpoint completes a newer id, which drops them, and it
        uploads every file (a savepoint may live elsewhere and be deleted by
        its owner once the job runs again).
        """
        with self._lock:
            self.confirmed = {}
            self.pending.clear()
            if checkpoint_id is not None and files:
                self.pending[checkpoint_id] = dict(files)

    def keep_only(self, live: set[str]) -> None:
        """Forget confirmed uploads of files the instance no longer has (compacted away for good)."""
        with self._lock:
            self.confirmed = {n: f for n, f in self.confirmed.items() if n in live}


class SnapshotSource(Protocol):
    """What a native snapshot needs of the instance it is taken of.

    :class:`~statekit_rocksdb.RocksDBKeyedStateBackend` is one; naming only
    these keeps this step below the backend, which creates its snapshots here.
    """

    @property
    def uploads(self) -> UploadTracker:
        """The instance's upload bookkeeping."""
        ...

    def checkpoint_locally(self, kind: str) -> tuple[str, list[tuple[str, str]]]:
        """Flush and hard-link a checkpoint of each instance: the directory; each's prefix and directory."""
        ...

    def stored_state_metas(self) -> list[dict[str, Any]]:
        """The snapshot entries of every stored state."""
        ...

    def native_meta(self) -> dict[str, Any]:
        """What a native snapshot taken now records besides its files."""
        ...

    def estimate_entries(self) -> int:
        """RocksDB's estimate of the number of entries."""
        ...

    def native_handle(
        self,
        checkpoint_id: int,
        files: Sequence[Any],
        *,
        states: list[dict[str, Any]],
        meta: dict[str, Any],
        entries: int = 0,
    ) -> NativeStateHandle:
        """A handle of this instance's native snapshot."""
        ...


class RocksDBNativeSnapshot:
    """A RocksDB checkpoint of one instance, hard-linked locally, uploaded by :meth:`write`."""

    def __init__(
        self,
        backend: SnapshotSource,
        checkpoint_id: int,
        directory: str,
        parts: list[tuple[str, str]],
        states: list[dict[str, Any]],
        meta: dict[str, Any],
        entries: int,
    ) -> None:
        self._backend = backend
        self.checkpoint_id = checkpoint_id
        self.directory: str | None = directory
        self._parts = parts
        self._states = states
        self._meta = meta
        #: Set by the backend's close() while pending: ``write`` raises SnapshotCancelledError.
        self.cancelled = False
        self._entries = entries

    @classmethod
    def take(cls, backend: SnapshotSource, checkpoint_id: int) -> RocksDBNativeSnapshot:
        """Flush buffered writes and memtables, then create the checkpoint (hard links) locally."""
        directory, parts = backend.checkpoint_locally(f"chk-{checkpoint_id}")
        files = {prefix + name for prefix, sub in parts for name in os.listdir(sub)}
        backend.uploads.keep_only({f for f in files if f.endswith(".sst")})
        return cls(
            backend,
            checkpoint_id,
            directory,
            parts,
            backend.stored_state_metas(),
            backend.native_meta(),
            backend.estimate_entries(),
        )

    def write(
        self, out: NativeSnapshotOutput, *, progress: ProgressCallback | None = None
    ) -> NativeStateHandle:
        """Upload new SST files and this checkpoint's small files; reference confirmed uploads."""
        if self.directory is None:
            if self.cancelled:
                raise SnapshotCancelledError(
                    f"native snapshot {self.checkpoint_id} was still pending when its backend closed, and "
                    "close() cancelled it: write snapshots before closing their backend"
                )
            raise StateAccessError("this native snapshot was already written or released")
        try:
            b = self._backend
            names = [
                (prefix + n, os.path.join(sub, n))
                for prefix, sub in self._parts
                for n in sorted(os.listdir(sub))
            ]
            files: list[NativeFile] = []
            new: dict[str, NativeFile] = {}
            for i, (name, path) in enumerate(names):
                if name.endswith(".sst"):
                    f = b.uploads.reusable(name)
                    if f is None:
                        f = new[name] = out.upload(name, path, shared=True)
                else:
                    f = out.upload(name, path, shared=False)
                files.append(f)
                if progress is not None:
                    progress(i + 1, len(names))
            b.uploads.uploaded(self.checkpoint_id, new)
            handle = b.native_handle(
                self.checkpoint_id,
                tuple(files),
                states=self._states,
                meta=self._meta,
                entries=self._entries,
            )
            if len(self._parts) > 1:  # the format of the instances taken, whatever the backend holds now
                handle = dataclasses.replace(handle, format=ROCKSDB_INSTANCES_FORMAT)
            return handle
        finally:
            self.release()

    def release(self) -> None:
        """Delete the local checkpoint (idempotent)."""
        directory, self.directory = self.directory, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
