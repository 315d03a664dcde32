"""The completion bookkeeping of native snapshots: which uploads a backend instance may reference.

The completion contract (``snapshots._native.COMPLETION_CONTRACT``) in one
object. :class:`UploadTracker` keeps each checkpoint's shared files by
checkpoint id until the runner confirms it (``notify_checkpoint_complete``)
or gives it up (``notify_checkpoint_aborted``), and one set of referenceable
files: those of the **last confirmed** checkpoint's handle. Not the union of
every confirmed upload: retention deletes a shared file once no retained
checkpoint references it, and the newest completed checkpoint is always
retained, so exactly its files are sure to exist when a later snapshot
references them. A file a confirmed checkpoint held that a later confirmed
one did not (a key group that changed, then changed back) may be gone.

:class:`~statekit.state._keyed.KeyedBackendBase` keeps one per instance
(``native_uploads``) and implements ``notify_checkpoint_complete`` and
``notify_checkpoint_aborted`` with it; a native format records each written
handle's shared files with :meth:`UploadTracker.uploaded`, looks up what it may
reference with :meth:`UploadTracker.reusable`, and, after a restore, hands the
files the instance still holds to :meth:`UploadTracker.restored` (the claim).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from ..snapshots._native import NativeFile

__all__ = ["UploadTracker"]


class UploadTracker:
    """Shared files by checkpoint until confirmed or aborted; the last confirmed one's may be referenced.

    Files are kept by a key of the backend's choosing: the name it finds a file
    under again (an SST file's name), or the SHA-256 of its bytes (a
    content-addressed file). Thread-safe: snapshots are written on other threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._confirmed: dict[str, NativeFile] = {}
        self._confirmed_id = -1  # the checkpoint whose files _confirmed are (-1: none yet)
        self._pending: dict[int, dict[str, NativeFile]] = {}

    def reusable(self, key: str) -> NativeFile | None:
        """The file under ``key`` of the last confirmed checkpoint, if it may be referenced."""
        with self._lock:
            return self._confirmed.get(key)

    @property
    def referenceable(self) -> dict[str, NativeFile]:
        """Every file a snapshot may reference now, by key (a copy)."""
        with self._lock:
            return dict(self._confirmed)

    def uploaded(self, checkpoint_id: int, files: Mapping[str, NativeFile]) -> None:
        """Checkpoint ``checkpoint_id``'s handle holds the shared ``files``, uploaded or referenced.

        Pass all of them: when the checkpoint is confirmed they become the set a
        later snapshot may reference, and a file left out is uploaded again.
        """
        with self._lock:
            self._pending.setdefault(checkpoint_id, {}).update((k, f) for k, f in files.items() if f.shared)

    def complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: its files become the referenceable set.

        An older pending checkpoint can no longer become the newest confirmed one:
        it is forgotten, and one confirmed after a newer one (a snapshot written
        late) leaves the newer one's set. A confirmation of a checkpoint this
        instance wrote nothing for (its snapshot held no shared file, or it is
        not this instance's) leaves the referenceable set as it is.
        """
        with self._lock:
            done = self._pending.pop(checkpoint_id, None)
            if done is not None and checkpoint_id > self._confirmed_id:
                self._confirmed = done
                self._confirmed_id = checkpoint_id
            for cid in [c for c in self._pending if c < checkpoint_id]:
                del self._pending[cid]

    def abort(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` never completes: its files are never referenced for it."""
        with self._lock:
            self._pending.pop(checkpoint_id, None)

    def restored(
        self, checkpoint_id: int | None = None, files: Mapping[str, NativeFile] | None = None
    ) -> None:
        """The instance was restored: nothing may be referenced; ``files`` wait for the claim.

        ``files`` are the restored checkpoint's shared files the instance still
        holds, byte for byte. They become referenceable only if the runner
        confirms ``checkpoint_id`` next (``notify_checkpoint_complete``): a
        completed checkpoint of the same job, in the storage the backend
        checkpoints into (Flink's claim). Otherwise the next checkpoint to
        complete drops them and uploads every file (Flink's NO_CLAIM).
        """
        with self._lock:
            self._confirmed = {}
            self._confirmed_id = -1
            self._pending.clear()
            if checkpoint_id is not None and files:
                self._pending[checkpoint_id] = {k: f for k, f in files.items() if f.shared}
