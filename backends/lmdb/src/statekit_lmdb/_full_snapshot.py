"""What a native checkpoint uploads: a compact copy of the environment, as of the checkpoint point.

At the checkpoint point the write buffer is committed and a read transaction
is pinned (``_views``): nothing is copied on the task thread. ``write``,
later and maybe on another thread, copies the pinned view with
``env.copy(compact=True, txn=...)`` (only the pages the view sees, free pages
left out, renumbered: a valid LMDB data file of the live data) into the
instance directory and uploads that one file, ``data.mdb``, as a file of this
checkpoint only (``shared=False``). If the map grew in between, the view was
already frozen into that file, and ``write`` just uploads it.

A full snapshot references nothing: every checkpoint is self-contained, so
``notify_checkpoint_complete`` and ``notify_checkpoint_aborted`` have nothing
to track, and a checkpoint that fails leaves nothing a later one depends on.
(LMDB rewrites pages in place once no reader needs them, so unlike RocksDB's
SST files there is no immutable unit to upload once and reference.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from statekit.backend_api import RegisteredState
from statekit.errors import SnapshotCancelledError, StateAccessError
from statekit.ordered_kv import KeyLayout
from statekit.snapshot_codec import NativeSnapshotOutput, NativeStateHandle, ProgressCallback

from ._layout import DATA_FILE
from ._views import PinnedView

__all__ = ["LMDBNativeSnapshot", "SnapshotSource"]


class SnapshotSource(Protocol):
    """What a native snapshot needs of the environment it is taken of.

    :class:`~statekit_lmdb.LMDBKeyedStateBackend` is one; naming only these
    keeps this step below the backend, which creates its snapshots here.
    """

    @property
    def layout(self) -> KeyLayout:
        """The composite key layout."""
        ...

    def lmdb_pin(self, kind: str) -> PinnedView:
        """Commit every buffer and pin a read transaction."""
        ...

    def lmdb_unpin(self, view: PinnedView) -> None:
        """End ``view``'s transaction and delete its copy."""
        ...

    def registered_state(self, name: str) -> RegisteredState | None:
        """The state ``name`` as stored."""
        ...

    def stored_state_metas(self) -> list[dict[str, Any]]:
        """The snapshot entries of every stored state."""
        ...

    def native_meta(self) -> dict[str, Any]:
        """What a native snapshot taken now records besides its file."""
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
        """A handle of this environment's native snapshot."""
        ...


class LMDBNativeSnapshot:
    """A read transaction pinned at checkpoint ``checkpoint_id``; :meth:`write` uploads a copy of it."""

    def __init__(
        self,
        backend: SnapshotSource,
        checkpoint_id: int,
        view: PinnedView,
        states: list[dict[str, Any]],
        meta: dict[str, Any],
    ) -> None:
        self._backend = backend
        self.checkpoint_id = checkpoint_id
        self._view: PinnedView | None = view
        self._states = states
        self._meta = meta
        #: Set by the backend's close() while pending: ``write`` raises SnapshotCancelledError.
        self.cancelled = False
        # What each state's entries are (for counting them from the copy).
        regs = (backend.registered_state(s["name"]) for s in states)
        self._kinds = {r.name: r.storage_kind for r in regs if r is not None}

    @classmethod
    def take(cls, backend: SnapshotSource, checkpoint_id: int) -> LMDBNativeSnapshot:
        """Commit buffered writes and pin the state: O(1), nothing is copied yet."""
        view = backend.lmdb_pin(f"chk-{checkpoint_id}")
        return cls(backend, checkpoint_id, view, backend.stored_state_metas(), backend.native_meta())

    @property
    def view(self) -> PinnedView | None:
        """The pinned view (None once written or released)."""
        return self._view

    def write(
        self, out: NativeSnapshotOutput, *, progress: ProgressCallback | None = None
    ) -> NativeStateHandle:
        """Copy the pinned view into one compact data file and upload it (unshared)."""
        view = self._view
        if view is None:
            if self.cancelled:
                raise SnapshotCancelledError(
                    f"native snapshot {self.checkpoint_id} was still pending when its backend closed, and "
                    "close() cancelled it: write snapshots before closing their backend"
                )
            raise StateAccessError("this native snapshot was already written or released")
        try:
            b = self._backend
            path = view.materialize()
            entries = sum(view.count(name, b.layout, kind) for name, kind in self._kinds.items())
            f = out.upload(DATA_FILE, path, shared=False)
            if progress is not None:
                progress(1, 1)
            return b.native_handle(
                self.checkpoint_id,
                (f,),
                states=self._states,
                meta=self._meta,
                entries=entries,
            )
        finally:
            self.release()

    def release(self) -> None:
        """End the pinned read transaction and delete the local copy (idempotent)."""
        view, self._view = self._view, None
        if view is not None:
            self._backend.lmdb_unpin(view)
