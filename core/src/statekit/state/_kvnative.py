"""Incremental native snapshots for any ordered engine: one content-addressed file per key group.

Many engines rewrite their files in place (LMDB's pages, SQLite's file, an
LSM tree that compacts into one file): no file of theirs can be uploaded once
and referenced by later checkpoints, as RocksDB's SST files are. This format
needs nothing of the engine's files. At the checkpoint point the buffer is
written and the engine freezes a view (:meth:`OrderedKVBackendBase.kv_freeze`);
``write``, later and maybe on another thread, turns each key group of the view
into one immutable file (every state's entries of that key group, in key
order), named by the SHA-256 of its bytes (:func:`~statekit.snapshots._digest.sha256_of`,
the digest every checkpoint file has). A key group whose file has the digest
of a file the last confirmed checkpoint held is *referenced*, not uploaded:
after a change to 1 % of the keys, about 1 % of the key groups are uploaded.

A restore downloads only the files of the key groups the instance owns
(whatever the parallelism that wrote them: a key group is a whole file), checks
each against its recorded digest (:meth:`NativeFile.read <statekit.snapshots._native.NativeFile.read>`)
and bulk-loads its entries in key order through ``kv_load``. The files it
restored wait, by digest, for the runner's claim of the restored checkpoint
(:class:`~statekit.state._uploads.UploadTracker`).

A file is::

    b"statekit-kg\\x01"                                       magic and version
    per state, by name: varint(len(name)) name varint(n)     UTF-8 name, n entries
        n x ( varint(len(key)) key varint(len(value)) value )  composite keys, key order

Small files go inside ``_metadata`` when the storage inlines streams below its
threshold (20 KB by default): they are still written only when they changed,
but a referenced inline file is copied into every checkpoint's metadata, so
only files above the threshold save bytes (docs/writing-a-backend.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .._errors import CorruptSnapshotError, SnapshotError, StateAccessError
from ..serialization._keygroups import KeyGroupRange
from ..snapshots._digest import sha256_of
from ..snapshots._native import NativeFile, NativeSnapshotOutput, NativeStateHandle
from ..snapshots._snapshot import ProgressCallback
from ._keyed_snapshots import cancelled_error
from ._kvlayout import decode_varint, encode_varint
from ._kvviews import TrackedView
from ._registered import RegisteredState
from ._state import StateKind
from ._uploads import UploadTracker

if TYPE_CHECKING:
    from ._kvlayout import KeyLayout

__all__ = ["KEY_GROUP_FILE_MAGIC", "KVFrozenView", "KeyGroupNativeSnapshots", "KeyGroupSnapshot"]

_S = TypeVar("_S")

#: The first bytes of every key-group file (the format's version is the last).
KEY_GROUP_FILE_MAGIC = b"statekit-kg\x01"


class KVFrozenView(Protocol):
    """The engine's state at one snapshot point, unchanged by later writes (see ``kv_freeze``)."""

    def items(self, name: str, lower: bytes, upper: bytes | None) -> Iterable[tuple[bytes, bytes]]:
        """State ``name``'s entries with keys in ``[lower, upper)`` (upper None: to the end), in key order.

        Nothing (no error) for a state the view has no column of. Called from
        one thread at a time, maybe not the task's.
        """

    def release(self) -> None:
        """The snapshot is written or given up: let the engine reclaim the view (idempotent)."""


def _encode(out: bytearray, items: Iterable[tuple[bytes, bytes]]) -> int:
    n = 0
    body = bytearray()
    for k, v in items:
        body += encode_varint(len(k))
        body += k
        body += encode_varint(len(v))
        body += v
        n += 1
    if n:
        out += encode_varint(n)
        out += body
    return n


def decode_key_group_file(data: bytes, where: str, prefix: bytes) -> dict[str, list[tuple[bytes, bytes]]]:
    """Each state's entries of one key-group file (every key checked to start with ``prefix``).

    Raises:
        CorruptSnapshotError: Naming ``where``, if the bytes are not such a file.
    """
    if not data.startswith(KEY_GROUP_FILE_MAGIC):
        raise CorruptSnapshotError(f"{where}: not a key-group file of statekit (magic {data[:12]!r})")
    view = memoryview(data)
    pos = len(KEY_GROUP_FILE_MAGIC)
    out: dict[str, list[tuple[bytes, bytes]]] = {}
    try:
        while pos < len(data):
            size, pos = decode_varint(view, pos)
            name = bytes(view[pos : pos + size]).decode()
            pos += size
            count, pos = decode_varint(view, pos)
            items: list[tuple[bytes, bytes]] = []
            for _ in range(count):
                size, pos = decode_varint(view, pos)
                k = bytes(view[pos : pos + size])
                pos += size
                size, pos = decode_varint(view, pos)
                v = bytes(view[pos : pos + size])
                pos += size
                if pos > len(data):
                    raise ValueError(f"an entry of state {name!r} is cut short")
                if not k.startswith(prefix):
                    raise ValueError(f"an entry of state {name!r} belongs to another key group")
                items.append((k, v))
            out[name] = items
        if pos != len(data):
            raise ValueError("it ends inside an entry")
    except (ValueError, IndexError, UnicodeDecodeError) as e:
        raise CorruptSnapshotError(f"{where}: malformed key-group file: {e}") from None
    return out


class KeyGroupSnapshot:
    """A frozen view at checkpoint ``checkpoint_id``; :meth:`write` uploads the key groups that changed."""

    def __init__(
        self,
        backend: KeyGroupNativeSnapshots,
        checkpoint_id: int,
        view: KVFrozenView,
        states: list[dict[str, Any]],
        meta: dict[str, Any],
        kinds: dict[str, StateKind],
    ) -> None:
        self._backend = backend
        self.checkpoint_id = checkpoint_id
        self._view: KVFrozenView | None = view
        self._states = states
        self._meta = meta
        self._kinds = kinds
        #: Set by the backend's close() while pending: ``write`` raises SnapshotCancelledError.
        self.cancelled = False

    def write(
        self, out: NativeSnapshotOutput, *, progress: ProgressCallback | None = None
    ) -> NativeStateHandle:
        """Write each key group's file, or reference the confirmed file of the same digest.

        Raises:
            SnapshotCancelledError: If the backend closed first (close() cancels pending snapshots).
        """
        if self.cancelled:
            raise cancelled_error(f"native snapshot {self.checkpoint_id} of {self._backend.key_group_range}")
        view = self._view
        if view is None:
            raise StateAccessError("this native snapshot was already written or released")
        try:
            b = self._backend
            own: KeyGroupRange = b.key_group_range
            tracker = b.native_uploads
            files: list[NativeFile] = []
            groups: dict[str, str] = {}
            entries = 0
            for i, kg in enumerate(own):
                data, n = self._key_group(view, b.layout, kg)
                entries += n
                if data is not None:
                    digest = sha256_of(data)
                    f = tracker.reusable(digest)
                    if f is None:
                        f = out.upload(f"kg-{kg}-{digest}", data, shared=True)
                        if f.sha256 != digest:  # the bytes changed between hashing and uploading
                            raise SnapshotError(
                                f"key group {kg} of checkpoint {out.checkpoint_id}: the upload's SHA-256 "
                                f"{f.sha256} is not the file's {digest}; the snapshot is not written"
                            )
                    files.append(f)
                    groups[str(kg)] = f.name
                if progress is not None:
                    progress(i + 1, len(own))
            tracker.uploaded(out.checkpoint_id, {str(f.sha256): f for f in files})
            return b.native_handle(
                self.checkpoint_id,
                files,
                states=self._states,
                meta={**self._meta, "key_groups": groups},
                entries=entries,
            )
        finally:
            self.release()

    def _key_group(self, view: KVFrozenView, layout: KeyLayout, kg: int) -> tuple[bytes | None, int]:
        """The file of key group ``kg`` (None: no entries), and its (key, namespace) entries."""
        lower, upper = layout.group_range(kg, kg)
        data = bytearray(KEY_GROUP_FILE_MAGIC)
        entries = 0
        for name in sorted(self._kinds):
            items = list(view.items(name, lower, upper))
            if not items:
                continue
            raw = name.encode()
            data += encode_varint(len(raw))
            data += raw
            _encode(data, items)
            entries += _count(items, layout, self._kinds[name])
        if len(data) == len(KEY_GROUP_FILE_MAGIC):
            return None, 0
        return bytes(data), entries

    def release(self) -> None:
        """Let the engine reclaim the frozen view (idempotent; ``write`` releases too)."""
        view, self._view = self._view, None
        if view is not None:
            view.release()


def _count(items: list[tuple[bytes, bytes]], layout: KeyLayout, kind: StateKind) -> int:
    """(key, namespace) entries among composite keys in key order: a list's elements or a map's are one."""
    if kind is StateKind.VALUE:
        return len(items)
    n, last = 0, None
    for k, _ in items:
        entry = layout.split(k)[1:3]
        if entry != last:
            n, last = n + 1, entry
    return n


class KeyGroupNativeSnapshots:
    """Incremental native snapshots of an ordered engine, one content-addressed file per key group.

    Put it before :class:`~statekit.ordered_kv.OrderedKVBackendBase` among the
    bases and set ``native_format`` (a name of your backend's, e.g.
    ``"mydb-kg-1"``); the engine implements ``kv_freeze`` (a frozen view) and
    ``kv_load`` (bulk loads), which the ordered base needs anyway::

        class MyKeyedBackend(KeyGroupNativeSnapshots, OrderedKVBackendBase):
            backend_name = "mydb"
            native_format = "mydb-kg-1"

    It implements :class:`~statekit.backend_api.SupportsNativeSnapshot`:
    ``native_snapshot`` (the view, frozen now), ``restore_native`` (every check
    first, then the owned key groups' files, checked by digest and bulk-loaded)
    and, from the keyed base, ``notify_checkpoint_complete`` and
    ``notify_checkpoint_aborted``. See the module docstring for the format.
    """

    native_format: str
    #: The format of the key-group files this class writes and restores (default: ``native_format``;
    #: set it when ``native_format`` may name another format of yours, as lmdb's option does).
    key_group_format: str | None = None
    key_group_range: KeyGroupRange
    layout: KeyLayout
    native_uploads: UploadTracker

    if TYPE_CHECKING:

        def check_native_snapshot(self) -> None: ...
        def kv_write_buffered(self) -> None: ...
        def kv_frozen(self) -> TrackedView: ...
        def kv_column(self, name: str, create: bool = True) -> Any: ...
        def kv_load(self, name: str, items: list[tuple[bytes, bytes]]) -> None: ...
        def kv_native_meta(self) -> dict[str, Any]: ...
        def track_snapshot(self, snapshot: _S) -> _S: ...
        def kv_plan_native_restore(self, handles: Sequence[NativeStateHandle], native_format: str) -> Any: ...
        def kv_finish_native_restore(self, plan: Any) -> None: ...
        def registered_state(self, name: str) -> RegisteredState | None: ...
        def stored_state_metas(self) -> list[dict[str, Any]]: ...
        @property
        def stored_state_names(self) -> list[str]: ...
        def native_handle(
            self,
            checkpoint_id: int,
            files: Sequence[Any],
            *,
            states: list[dict[str, Any]],
            meta: dict[str, Any],
            entries: int = 0,
        ) -> NativeStateHandle: ...

    def native_snapshot(self, checkpoint_id: int) -> KeyGroupSnapshot:
        """Write the buffer and freeze the engine now (``kv_freeze``); ``write`` uploads what changed."""
        self.check_native_snapshot()
        self.kv_write_buffered()
        view = self.kv_frozen()
        regs = (self.registered_state(n) for n in self.stored_state_names)
        kinds = {r.name: r.storage_kind for r in regs if r is not None}
        return self.track_snapshot(
            KeyGroupSnapshot(
                self, checkpoint_id, view, self.stored_state_metas(), self.kv_native_meta(), kinds
            )
        )

    def restore_native(self, handles: Sequence[NativeStateHandle]) -> None:
        """Restore key-group snapshots of any parallelism: the owned key groups' files, checked, loaded."""
        plan = self.kv_plan_native_restore(handles, self.key_group_format or self.native_format)
        self.kv_restore_key_groups(plan)

    def kv_restore_key_groups(self, plan: Any) -> None:
        """Load the owned key groups of ``plan`` (a ``KVNativeRestore``), finish, keep the files to claim.

        Every file is downloaded and checked (size, SHA-256, layout) before the
        first entry is loaded.
        """
        own = self.key_group_range
        loads: list[dict[str, list[tuple[bytes, bytes]]]] = []
        kept: dict[str, NativeFile] = {}
        for part in sorted(plan.parts, key=lambda h: h.key_group_range.start):
            groups = part.meta.get("key_groups")
            if not isinstance(groups, dict):
                raise CorruptSnapshotError(
                    f"native {part.backend} snapshot of {part.key_group_range} (checkpoint "
                    f"{part.checkpoint_id}) has no key-group files listed (meta 'key_groups')"
                )
            for kg in part.key_group_range.intersection(own):
                name = groups.get(str(kg))
                if name is None:
                    continue  # no entries in this key group
                f = part.file(str(name))
                where = f"native file {f.name} of checkpoint {part.checkpoint_id}"
                loads.append(decode_key_group_file(f.read(), where, self.layout.group_prefix(kg)))
                if f.sha256 is not None:
                    kept[f.sha256] = f
        unknown = sorted({name for by_state in loads for name in by_state} - set(plan.metas))
        if unknown:
            raise CorruptSnapshotError(
                f"key-group files hold entries of states {unknown}, which their snapshots do not list"
            )
        for by_state in loads:  # key groups in ascending order: each state's keys arrive sorted
            for name, items in by_state.items():
                self.kv_column(name)
                self.kv_load(name, items)
        self.kv_finish_native_restore(plan)
        claimed = {h.checkpoint_id for h in plan.parts}
        self.native_uploads.restored(claimed.pop() if len(claimed) == 1 else None, kept)
