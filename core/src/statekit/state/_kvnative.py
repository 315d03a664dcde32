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
of a file the last confirmed checkpoint held is *referenced*, not uploaded.

That alone does not follow the change: 1 % of the keys, drawn at random, touch
nearly every key group. So, once the first checkpoint is confirmed, a
checkpoint writes a **delta** instead (:mod:`._kvdelta`): one file of the keys
the buffer's writes touched since the last confirmed checkpoint, as they are
in the view, or their removal; it references every key group's file and the
earlier deltas of the chain. Key groups whose deltas outgrow their file, and
now and then every key group, are written whole again (``max-deltas``,
``max-delta-ratio``, the heap's options), so a restore replays a bounded
number of deltas. Changes are recorded only once native snapshots are taken.

A restore downloads only the files of the key groups the instance owns
and every delta of their chains (whatever the parallelism that wrote them: a
key group is its whole file and its blocks of the deltas), checks each against
its recorded digest (:meth:`NativeFile.read <statekit.snapshots._native.NativeFile.read>`)
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

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .._errors import CorruptSnapshotError, SnapshotError, StateAccessError
from ..serialization._keygroups import KeyGroupRange
from ..snapshots._digest import sha256_of
from ..snapshots._native import NativeFile, NativeSnapshotOutput, NativeStateHandle
from ..snapshots._snapshot import ProgressCallback
from ._keyed_snapshots import cancelled_error
from ._kvcount import ENTRY_COUNTS, EntryCounts
from ._kvdelta import Ops, apply_ops, decode_delta_file, encode_delta_block, encode_delta_file
from ._kvlayout import decode_varint, encode_varint
from ._kvviews import TrackedView, lookup
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

    # Optional: ``lookup(name, keys)``, the value of each key (None: absent), for deltas' point reads;
    # without it a delta reads each key as a range of one.

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


@dataclass
class _Chain:
    """A written key-group handle's chain (see :mod:`._kvdelta`): what a later delta references."""

    checkpoint_id: int
    groups: dict[str, str]
    deltas: list[dict[str, Any]]
    since: dict[str, int]
    kg_bytes: dict[str, int]
    files: dict[str, NativeFile]  # every file of the handle, by name
    states: list[dict[str, Any]]

    def tracked(self) -> dict[str, NativeFile]:
        """The files by the key the upload tracker keeps them under (digest; ``delta:`` and name)."""
        deltas = {str(link["file"]) for link in self.deltas}
        out = {f"delta:{n}": f for n, f in self.files.items() if n in deltas}
        out.update((f.sha256, f) for n, f in self.files.items() if n not in deltas and f.sha256 is not None)
        return out


@dataclass
class _DeltaPlan:
    """What a snapshot taken now may write as a delta: the changes since ``since``, and the entries."""

    since: int
    epochs: list[dict[str, set[bytes]]]
    entries: int


class _DeltaState:
    """One instance's delta bookkeeping: recorded changes by checkpoint, chains written and confirmed."""

    def __init__(self, max_deltas: int, ratio: float) -> None:
        self.lock = threading.Lock()
        self.max_deltas = max_deltas
        self.ratio = ratio
        # Changes recorded by the checkpoint whose snapshot closed them, oldest first.
        self.epochs: list[tuple[int, dict[str, set[bytes]]]] = []
        self.pending: dict[int, _Chain] = {}
        self.confirmed: _Chain | None = None


class KeyGroupSnapshot:
    """A frozen view at checkpoint ``checkpoint_id``; :meth:`write` uploads the key groups that changed.

    With a delta plan it uploads one delta file of the changed keys (and the
    whole files of key groups due for one) and references the confirmed chain.
    """

    def __init__(
        self,
        backend: KeyGroupNativeSnapshots,
        checkpoint_id: int,
        view: KVFrozenView,
        states: list[dict[str, Any]],
        meta: dict[str, Any],
        kinds: dict[str, StateKind],
        delta: _DeltaPlan | None = None,
    ) -> None:
        self._backend = backend
        self.checkpoint_id = checkpoint_id
        self._view: KVFrozenView | None = view
        self._states = states
        self._meta = meta
        self._kinds = kinds
        self._delta = delta
        #: Set by the backend's close() while pending: ``write`` raises SnapshotCancelledError.
        self.cancelled = False

    @property
    def is_delta(self) -> bool:
        """True if ``write`` may write a delta (it writes whole files if the chain is gone by then)."""
        return self._delta is not None

    def write(
        self, out: NativeSnapshotOutput, *, progress: ProgressCallback | None = None
    ) -> NativeStateHandle:
        """Write a delta against the confirmed chain, or each key group's file (reusing same digests).

        Raises:
            SnapshotCancelledError: If the backend closed first (close() cancels pending snapshots).
        """
        if self.cancelled:
            raise cancelled_error(f"native snapshot {self.checkpoint_id} of {self._backend.key_group_range}")
        view = self._view
        if view is None:
            raise StateAccessError("this native snapshot was already written or released")
        try:
            chain = self._backend.kgd_chain_for(self._delta, self.checkpoint_id)
            if chain is not None and self._delta is not None:
                return self._write_delta(view, out, chain, self._delta, progress)
            return self._write_whole(view, out, progress)
        finally:
            self.release()

    def _upload_group(self, out: NativeSnapshotOutput, kg: int, data: bytes) -> NativeFile:
        """Key group ``kg``'s whole file: the confirmed one of the same digest, else uploaded."""
        digest = sha256_of(data)
        f = self._backend.native_uploads.reusable(digest)
        if f is None:
            f = out.upload(f"kg-{kg}-{digest}", data, shared=True)
            if f.sha256 != digest:  # the bytes changed between hashing and uploading
                raise SnapshotError(
                    f"key group {kg} of checkpoint {out.checkpoint_id}: the upload's SHA-256 "
                    f"{f.sha256} is not the file's {digest}; the snapshot is not written"
                )
        return f

    def _write_whole(
        self, view: KVFrozenView, out: NativeSnapshotOutput, progress: ProgressCallback | None
    ) -> NativeStateHandle:
        b = self._backend
        own: KeyGroupRange = b.key_group_range
        files: list[NativeFile] = []
        groups: dict[str, str] = {}
        entries = 0
        for i, kg in enumerate(own):
            data, n = self._key_group(view, b.layout, kg)
            entries += n
            if data is not None:
                f = self._upload_group(out, kg, data)
                files.append(f)
                groups[str(kg)] = f.name
            if progress is not None:
                progress(i + 1, len(own))
        chain = _Chain(out.checkpoint_id, groups, [], {}, {}, {f.name: f for f in files}, self._states)
        return self._finish(out, chain, entries)

    def _write_delta(
        self,
        view: KVFrozenView,
        out: NativeSnapshotOutput,
        chain: _Chain,
        plan: _DeltaPlan,
        progress: ProgressCallback | None,
    ) -> NativeStateHandle:
        b = self._backend
        layout = b.layout
        own: KeyGroupRange = b.key_group_range
        cid = out.checkpoint_id
        ratio = b.kgd_state().ratio
        union: dict[str, set[bytes]] = {}
        for epoch in plan.epochs:
            for name, keys in epoch.items():
                if name in self._kinds:  # a state without entries in the view has none in any file
                    union.setdefault(name, set()).update(keys)
        changed: dict[int, dict[str, list[bytes]]] = {}
        for name, keys in union.items():
            for k in sorted(keys):
                changed.setdefault(layout.key_group_of(k), {}).setdefault(name, []).append(k)
        outside = sorted(kg for kg in changed if kg not in own)
        if outside:
            raise SnapshotError(
                f"checkpoint {cid}: the instance of key groups {own} recorded changes in key groups "
                f"{outside[:5]}; the snapshot is not written"
            )
        groups, since, kg_bytes = dict(chain.groups), dict(chain.since), dict(chain.kg_bytes)
        files = dict(chain.files)
        blocks: dict[int, bytes] = {}
        for i, kg in enumerate(sorted(changed)):
            by_state: dict[str, Ops] = {}
            for name, touched in changed[kg].items():
                # Each key's value at the checkpoint, or None: removed.
                by_state[name] = list(zip(touched, lookup(view, name, touched)))
            block = encode_delta_block(by_state)
            key = str(kg)
            base = files.get(groups.get(key, ""))
            if kg_bytes.get(key, 0) + len(block) > ratio * (base.size if base is not None else 0):
                # The key group's deltas would outgrow its file: its whole file instead.
                data, _ = self._key_group(view, layout, kg)
                groups.pop(key, None)
                kg_bytes.pop(key, None)
                since[key] = cid
                if data is not None:
                    f = self._upload_group(out, kg, data)
                    files[f.name] = f
                    groups[key] = f.name
            else:
                blocks[kg] = block
                kg_bytes[key] = kg_bytes.get(key, 0) + len(block)
            if progress is not None:
                progress(i + 1, len(changed))
        deltas = [dict(link) for link in chain.deltas]
        if blocks:
            f = out.upload(f"kg-delta-{cid}", encode_delta_file(blocks), shared=True)
            files[f.name] = f
            link = {"file": f.name, "checkpoint_id": cid, "since": chain.checkpoint_id, "size": f.size}
            deltas.append(link)
        keep = set(groups.values()) | {str(link["file"]) for link in deltas}
        held = {n: f for n, f in files.items() if n in keep}
        new = _Chain(cid, groups, deltas, since, kg_bytes, held, self._states)
        if progress is not None and not changed:
            progress(1, 1)
        return self._finish(out, new, plan.entries)

    def _finish(self, out: NativeSnapshotOutput, chain: _Chain, entries: int) -> NativeStateHandle:
        b = self._backend
        b.native_uploads.uploaded(out.checkpoint_id, chain.tracked())
        b.kgd_written(chain)
        meta: dict[str, Any] = {**self._meta, "key_groups": chain.groups, "deltas": chain.deltas}
        if chain.since:
            meta["kg_since"] = chain.since
        if chain.kg_bytes:
            meta["kg_delta_bytes"] = chain.kg_bytes
        return b.native_handle(
            self.checkpoint_id, list(chain.files.values()), states=self._states, meta=meta, entries=entries
        )

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
    ``"mydb-kg-2"``; a format written before deltas, ``"mydb-kg-1"``, goes in
    ``key_group_older_formats``) and declare ``KEY_GROUP_NATIVE_OPTIONS``; the
    engine implements ``kv_freeze`` (a frozen view) and ``kv_load`` (bulk
    loads), which the ordered base needs anyway::

        class MyKeyedBackend(KeyGroupNativeSnapshots, OrderedKVBackendBase):
            backend_name = "mydb"
            native_format = "mydb-kg-2"

    It implements :class:`~statekit.backend_api.SupportsNativeSnapshot`:
    ``native_snapshot`` (the view, frozen now), ``restore_native`` (every check
    first, then the owned key groups' files and deltas, checked by digest and
    bulk-loaded), ``notify_checkpoint_complete`` and ``notify_checkpoint_aborted``
    (the keyed base's, and the chain's bookkeeping). See the module docstring.
    """

    native_format: str
    #: The format of the key-group files this class writes and restores (default: ``native_format``;
    #: set it when ``native_format`` may name another format of yours, as lmdb's option does).
    key_group_format: str | None = None
    #: Earlier versions of ``key_group_format`` this class restores (``"mydb-kg-1"``: no deltas).
    key_group_older_formats: tuple[str, ...] = ()
    key_group_range: KeyGroupRange
    layout: KeyLayout
    native_uploads: UploadTracker
    kv_options: dict[str, Any]
    kv_changes: dict[str, set[bytes]] | None
    kv_counts: EntryCounts

    if TYPE_CHECKING:

        @staticmethod
        def kv_snapshot_range(handle: NativeStateHandle) -> KeyGroupRange: ...

        def check_native_snapshot(self) -> None: ...
        def kv_write_buffered(self) -> None: ...
        def kv_frozen(self) -> TrackedView: ...
        def kv_column(self, name: str, create: bool = True) -> Any: ...
        def kv_load(self, name: str, items: list[tuple[bytes, bytes]]) -> None: ...
        def kv_native_meta(self) -> dict[str, Any]: ...
        def kv_estimated_entries(self) -> int | None: ...
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
        states = self.stored_state_metas()
        meta = self.kv_native_meta()
        plan = self._kgd_plan(checkpoint_id, states, meta)
        return self.track_snapshot(KeyGroupSnapshot(self, checkpoint_id, view, states, meta, kinds, plan))

    # --- deltas (see ._kvdelta) --------------------------------------------------------------------

    @property
    def checkpoint_bytes_follow_change(self) -> bool:
        """True: a native checkpoint writes about what changed since the last one, plus a constant.

        What the kit's property holds a backend to when it declares it (``max-deltas`` is not off).
        """
        return self.kgd_state().max_deltas > 0

    def kgd_state(self) -> _DeltaState:
        """This instance's delta bookkeeping (made on first use, from ``max-deltas``, ``max-delta-ratio``)."""
        st: _DeltaState | None = self.__dict__.get("_kgd_state")
        if st is None:
            opts = self.kv_options
            off = opts.get("max-deltas", 10)
            st = _DeltaState(0 if off is None else max(0, int(off)), float(opts.get("max-delta-ratio", 0.5)))
            self.__dict__["_kgd_state"] = st
        return st

    def _kgd_plan(
        self, checkpoint_id: int, states: list[dict[str, Any]], meta: dict[str, Any]
    ) -> _DeltaPlan | None:
        """Close the changes recorded since the last snapshot; a delta plan if the chain allows one."""
        st = self.kgd_state()
        if st.max_deltas <= 0:
            return None
        if self.kv_changes is None:
            self.kv_changes = {}  # recording starts: this snapshot writes whole files
        with st.lock:
            confirmed = st.confirmed
            if confirmed is None and not st.pending:
                st.epochs.clear()  # no chain confirmed or waiting to be: no delta needs older changes
            st.epochs.append((checkpoint_id, self.kv_changes))
            self.kv_changes = {}
            if confirmed is None:
                return None
            epochs = [e for c, e in st.epochs if c > confirmed.checkpoint_id]
        counts = meta.get(ENTRY_COUNTS)
        if self._kgd_due_whole(confirmed, states):
            return None
        if isinstance(counts, dict):
            entries = sum(int(n) for by_kg in counts.values() for n in by_kg.values())
        else:
            # No counts: unknown (an older snapshot restored: the whole files count them), or
            # counting off (statekit.metrics.exact-entries=false): the engine's estimate, which
            # the snapshot's meta labels (no entry_counts), rather than whole files each time.
            estimate = None if self.kv_counts.enabled else self.kv_estimated_entries()
            if estimate is None:
                return None
            entries = estimate
        return _DeltaPlan(confirmed.checkpoint_id, epochs, entries)

    def _kgd_due_whole(self, chain: _Chain, states: list[dict[str, Any]]) -> bool:
        """True if the next checkpoint writes every key group's file: a long chain, or a schema changed."""
        st = self.kgd_state()
        if len(chain.deltas) >= st.max_deltas:
            return True
        base = sum(chain.files[n].size for n in chain.groups.values() if n in chain.files)
        if sum(int(link["size"]) for link in chain.deltas) > st.ratio * base:
            return True
        now = {str(m.get("name")): m for m in states}
        # A state declared with another schema since: the chain holds its old bytes.
        return any(now.get(str(m.get("name"))) != m for m in chain.states)

    def kgd_chain_for(self, plan: _DeltaPlan | None, checkpoint_id: int) -> _Chain | None:
        """The confirmed chain a delta of ``plan`` (snapshot ``checkpoint_id``) is written against, if any.

        None (whole files) unless every file of the chain may be referenced and
        the chain lies between the plan's start and the snapshot: a chain
        confirmed after the snapshot was taken (a later checkpoint written
        first) holds writes made after it, which the snapshot must not show.
        """
        if plan is None:
            return None
        st = self.kgd_state()
        with st.lock:
            chain = st.confirmed
        if chain is None or not plan.since <= chain.checkpoint_id < checkpoint_id:
            return None
        referenceable = {id(f) for f in self.native_uploads.referenceable.values()}
        if any(id(f) not in referenceable for f in chain.files.values()):
            return None  # a file of the chain may be gone (not the last confirmed one's): whole files
        return chain

    def kgd_written(self, chain: _Chain) -> None:
        """A handle with ``chain`` was written: confirmed, later deltas are written against it."""
        st = self.kgd_state()
        if st.max_deltas > 0:
            with st.lock:
                st.pending[chain.checkpoint_id] = chain

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: later deltas are written against its chain."""
        super().notify_checkpoint_complete(checkpoint_id)  # type: ignore[misc]
        st = self.kgd_state()
        with st.lock:
            done = st.pending.pop(checkpoint_id, None)
            for cid in [c for c in st.pending if c < checkpoint_id]:
                del st.pending[cid]
            newer = st.confirmed is not None and st.confirmed.checkpoint_id > checkpoint_id
            # An older checkpoint completing late never replaces a newer one.
            if done is not None and not newer:
                st.confirmed = done
                st.epochs = [(c, e) for c, e in st.epochs if c > checkpoint_id]

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` never completes: its changes go into the next delta."""
        super().notify_checkpoint_aborted(checkpoint_id)  # type: ignore[misc]
        st = self.kgd_state()
        with st.lock:
            st.pending.pop(checkpoint_id, None)

    # --- restores ----------------------------------------------------------------------------------

    def restore_native(self, handles: Sequence[NativeStateHandle]) -> None:
        """Restore key-group snapshots of any parallelism: the owned key groups' files, checked, loaded."""
        fmt = self.key_group_format or self.native_format
        formats = {h.format for h in handles}
        if len(formats) == 1 and formats <= set(self.key_group_older_formats):
            fmt = formats.pop()  # an older version of this format: read the same way (no deltas)
        plan = self.kv_plan_native_restore(handles, fmt)
        self.kv_restore_key_groups(plan)

    def kv_restore_key_groups(self, plan: Any) -> None:
        """Load the owned key groups of ``plan`` (a ``KVNativeRestore``), finish, keep the files to claim.

        Each key group is its whole file with the deltas after it applied in
        order. Every file is downloaded and checked (size, SHA-256, layout)
        before the first entry is loaded.
        """
        own = self.key_group_range
        loads: list[dict[str, list[tuple[bytes, bytes]]]] = []
        kept: dict[str, NativeFile] = {}
        chains: list[_Chain] = []
        for part in sorted(plan.parts, key=lambda h: h.key_group_range.start):
            where = (
                f"native {part.backend} snapshot of {part.key_group_range} (checkpoint {part.checkpoint_id})"
            )
            groups = part.meta.get("key_groups")
            if not isinstance(groups, dict):
                raise CorruptSnapshotError(f"{where} has no key-group files listed (meta 'key_groups')")
            deltas, since = _chain_meta(part, where)
            owned = list(part.key_group_range.intersection(own))
            applied: list[tuple[int, dict[int, dict[str, Ops]]]] = []
            for link in deltas:
                f = part.file(str(link["file"]))
                blocks = decode_delta_file(
                    f.read(),
                    f"native file {f.name} of checkpoint {part.checkpoint_id}",
                    owned,
                    self.layout.group_prefix,
                )
                applied.append((int(link["checkpoint_id"]), blocks))
                kept[f"delta:{f.name}"] = f
            for kg in owned:
                name = groups.get(str(kg))
                by_state: dict[str, list[tuple[bytes, bytes]]] = {}
                if name is not None:
                    f = part.file(str(name))
                    at = f"native file {f.name} of checkpoint {part.checkpoint_id}"
                    by_state = decode_key_group_file(f.read(), at, self.layout.group_prefix(kg))
                    if f.sha256 is not None:
                        kept[f.sha256] = f
                after = since.get(str(kg), -1)
                changes = [blocks[kg] for cid, blocks in applied if cid > after and kg in blocks]
                if changes:
                    names = set(by_state) | {n for ch in changes for n in ch}
                    merged = {
                        n: apply_ops(by_state.get(n, []), [ch[n] for ch in changes if n in ch]) for n in names
                    }
                    by_state = {n: items for n, items in merged.items() if items}
                loads.append(by_state)
            if "deltas" in part.meta and self.kv_snapshot_range(part) == own == part.key_group_range:
                files = {f.name: f for f in part.files}
                chains.append(
                    _Chain(
                        part.checkpoint_id,
                        {str(k): str(v) for k, v in groups.items()},
                        deltas,
                        {str(k): int(v) for k, v in since.items()},
                        {str(k): int(v) for k, v in (part.meta.get("kg_delta_bytes") or {}).items()},
                        files,
                        [dict(s) for s in part.states],
                    )
                )
        unknown = sorted({name for by_state in loads for name in by_state} - set(plan.metas))
        if unknown:
            raise CorruptSnapshotError(
                f"key-group files hold entries of states {unknown}, which their snapshots do not list"
            )
        for by_state in loads:  # key groups in ascending order: each state's keys arrive sorted
            for name, items in by_state.items():
                self.kv_column(name)
                self.kv_load(name, items)
        st = self.kgd_state()
        with st.lock:
            st.epochs, st.pending, st.confirmed = [], {}, None
        if st.max_deltas > 0:
            self.kv_changes = {}  # what the restore's TTL purge deletes goes into the next delta
        self.kv_finish_native_restore(plan)
        claimed = {h.checkpoint_id for h in plan.parts}
        self.native_uploads.restored(claimed.pop() if len(claimed) == 1 else None, kept)
        if len(chains) == 1 and len(plan.parts) == 1:
            self.kgd_written(chains[0])  # claimed with the files: the next checkpoint may be a delta


def _chain_meta(part: NativeStateHandle, where: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """A handle's deltas (checked: files it holds, checkpoints in order) and its key groups' ``since``."""
    deltas = part.meta.get("deltas") or []
    since = part.meta.get("kg_since") or {}
    bad = f"{where}: its deltas (meta 'deltas', 'kg_since') are malformed"
    listed = isinstance(deltas, list) and all(isinstance(d, dict) for d in deltas)
    if not listed or not isinstance(since, dict):
        raise CorruptSnapshotError(bad)
    try:
        ids = [int(d["checkpoint_id"]) for d in deltas]
        for d in deltas:
            str(d["file"])
        out_since = {str(k): int(v) for k, v in since.items()}
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptSnapshotError(f"{bad}: {e}") from None
    if ids != sorted(set(ids)) or (ids and ids[-1] > part.checkpoint_id):
        raise CorruptSnapshotError(f"{where}: its deltas' checkpoints {ids} are out of order")
    return [dict(d) for d in deltas], out_since
