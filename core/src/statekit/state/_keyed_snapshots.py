"""Canonical snapshots and restores of keyed backends, and the migrations a restore runs.

:class:`KeyedSnapshots` is the part of every keyed backend that takes a
snapshot (:class:`KeyedSnapshot`, written later, unaffected by later writes)
and restores one, checking everything before anything is restored.
"""

from __future__ import annotations

import contextlib
import io
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from .._errors import (
    CorruptSnapshotError,
    IncompatibleSerializerError,
    MaxParallelismMismatchError,
    SnapshotCancelledError,
    SnapshotError,
    StateAccessError,
    StateMigrationError,
)
from ..serialization._evolution import describe_schema, same_layout
from ..serialization._keygroups import KeyGroupRange
from ..serialization._serializers import SerializerConfig, TypeSerializer
from ..snapshots._snapshot import (
    BytesStreamHandle,
    KeyedStateHandle,
    ProgressCallback,
    Section,
    SnapshotHeader,
    SnapshotWriteResult,
    decode_namespaces,
    describe_stream,
    encode_namespaces,
    iter_blocks,
    read_header,
    read_index,
    write_canonical,
)
from ._migration import (
    MigrationProgress,
    StateMigrationPlan,
    lineage_of,
    same_schema,
    schema_of,
)
from ._registered import RegisteredState, StateEntries
from ._state import (
    VOID_NAMESPACE,
)
from ._timerstate import TIMER_STATE_NAMES
from ._ttl import Clock, purge_expired

__all__ = ["REMOVED", "KeyedSnapshot", "KeyedSnapshots", "cancelled_error"]

_Snapshot = TypeVar("_Snapshot")


def cancelled_error(what: str) -> SnapshotCancelledError:
    """The error of writing ``what`` (a snapshot) after its backend closed and cancelled it."""
    return SnapshotCancelledError(
        f"{what} was still pending when its backend closed, and close() cancelled it (what it held, a "
        "frozen view or a local copy, went with the backend): write snapshots before closing their "
        "backend, or take a new one from a live backend"
    )


#: The values of decoded removal sections (:attr:`Section.removal`, heap's deltas): ``_load_entries``
#: given this very list removes the keys instead of storing values. Never mutated.
REMOVED: list[Any] = []


def _merged(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """One state's entries of two snapshots being restored: the same schema, or StateMigrationError.

    Their histories may differ (subtasks that migrated it at different
    restores): the longer one is kept.
    """
    if not same_schema(a, b):
        raise StateMigrationError(
            f"state {a['name']!r} was written with different schemas by the subtasks being restored: "
            f"{describe_schema(a.get('serializer') or {})} and {describe_schema(b.get('serializer') or {})} "
            f"({schema_of(a)} and {schema_of(b)}). This happens when only some subtasks declared it after a "
            "change; restore at the parallelism the checkpoint was taken with, declaring the state in every "
            "subtask (in open()), and take a checkpoint before rescaling"
        )
    return b if len(lineage_of(b)) > len(lineage_of(a)) else a


class KeyedSnapshots:
    """A keyed backend's canonical snapshots and restores, and the migrations a restore runs.

    The part of :class:`~statekit.state._keyed.KeyedBackendBase` that writes its
    state into a snapshot and reads it back: the checks every restore makes
    before it touches anything (max parallelism, key serializer, declared
    states, checksums), decoding and migrating restored sections, and the
    checks of native snapshots and restores. The base sets the attributes
    below and implements the hooks named under ``TYPE_CHECKING``.
    """

    backend_name: ClassVar[str]
    key_serializer: TypeSerializer
    key_group_range: KeyGroupRange
    max_parallelism: int
    clock: Clock
    _closed: bool
    _states: dict[str, RegisteredState]
    _handles: dict[str, Any]
    _pending: dict[str, tuple[dict[str, Any], list[tuple[int, Section]]]]
    _restored: dict[str, RegisteredState]
    _broken: dict[str, str]
    _restore_origin: dict[str, Any] | None
    _migration_progress: MigrationProgress | None
    _pending_snapshots: weakref.WeakSet[Any]

    if TYPE_CHECKING:

        def num_entries(self, state_name: str | None = None) -> int:
            """Entries of one state, or of all (the base's)."""

        @property
        def undeclared_pending_states(self) -> list[str]:
            """Canonically restored states whose entries core still holds (the base's)."""

        def _snapshot_entries(self) -> Callable[[str, int], StateEntries]:
            """The backend's hook: a reader of each state's entries per key group."""

        def _release_snapshot(self, reader: Callable[[str, int], StateEntries]) -> None:
            """The backend's hook: a snapshot's reader is done."""

        def _load_entries(
            self, reg: RegisteredState, kg: int, keys: list[Any], nss: list[Any], values: list[Any]
        ) -> None:
            """The backend's hook: store restored entries of one key group."""

        def _load_sections(
            self, reg: RegisteredState, sections: Sequence[tuple[int, Section]]
        ) -> Callable[[], None] | None:
            """The backend's hook: what keeps checked sections to decode when needed, or None."""

    # --- migrations on restore --------------------------------------------------------

    def _decode(
        self, reg: RegisteredState, s: Section, plan: StateMigrationPlan | None = None
    ) -> StateEntries:
        keys = self.key_serializer.decode_column(s.keys, s.count)
        nss = decode_namespaces(s.namespaces, s.count, reg.namespace_serializer, VOID_NAMESPACE, reg.name)
        if s.removal:  # a delta's removals: keys and namespaces only, nothing to migrate
            return keys, nss, REMOVED
        if plan is None or not plan.changes_data:
            return keys, nss, reg.serializer.decode_column(s.values, s.count)
        old = plan.entry_decoder.decode_column(s.values, s.count)
        convert = plan.entry(self.clock())
        k2: list[Any] = []
        n2: list[Any] = []
        v2: list[Any] = []
        i = 0
        try:
            for i, v in enumerate(old):
                new = convert(v)
                if new is not None:
                    k2.append(keys[i])
                    n2.append(nss[i])
                    v2.append(new)
        except Exception as e:
            ns = "" if nss[i] is VOID_NAMESPACE else f", namespace {nss[i]!r}"
            raise plan.failure(f"key {keys[i]!r}{ns}", e, "nothing was restored into this state") from e
        return k2, n2, v2

    def _decode_all(
        self, reg: RegisteredState, sections: Sequence[tuple[int, Section]], plan: StateMigrationPlan | None
    ) -> list[tuple[int, StateEntries]]:
        """Every section decoded (and migrated by ``plan``) before any is loaded; progress reported."""
        if plan is None or not plan.changes_data:
            return [(kg, self._decode(reg, s)) for kg, s in sections]
        total = sum(s.count for _, s in sections)
        done = 0
        out = []
        self._report_migration(reg.name, 0, total)
        for kg, s in sections:
            out.append((kg, self._decode(reg, s, plan)))
            done += s.count
            self._report_migration(reg.name, done, total)
        return out

    def on_migration_progress(self, callback: MigrationProgress | None) -> None:
        """Call ``callback(state, done, total)`` while a restore migrates a state's entries (None: stop).

        Entries are counted per (key, namespace) in canonical snapshots, per
        stored unit (value, list element, map entry) in an engine's own files.
        """
        self._migration_progress = callback

    def _report_migration(self, state: str, done: int, total: int | None) -> None:
        cb = self._migration_progress
        if cb is not None:
            cb(state, done, total)

    def set_restore_origin(self, kind: str, checkpoint_id: int) -> None:
        """Name the checkpoint (or savepoint) the next restore reads, for the schema history of migrations."""
        self._restore_origin = {"kind": str(kind), "checkpoint_id": int(checkpoint_id)}

    def _run_restored_migration(
        self, restored: RegisteredState, reg: RegisteredState, plan: StateMigrationPlan
    ) -> None:
        """Rewrite a natively restored state's entries in place; failing half-way, the state is refused."""
        try:
            self._migrate_restored(restored, reg, plan)
        except Exception as e:
            for held in (self._restored, self._states, self._handles):
                held.pop(reg.name, None)
            self._broken[reg.name] = (
                f"state {reg.name!r} ({plan.describe()}) failed to migrate in this backend and is partly "
                f"rewritten: {e}. This backend cannot use or checkpoint it: close it and restore again "
                "(the checkpoint is unchanged) once the declared type or Migration is fixed"
            )
            if isinstance(e, StateMigrationError):
                raise
            raise StateMigrationError(self._broken[reg.name]) from e

    def _migrate_restored(
        self, restored: RegisteredState, reg: RegisteredState, plan: StateMigrationPlan
    ) -> None:
        """Rewrite every stored entry of ``restored`` (natively restored, old schema) into ``reg``'s schema.

        Only backends that keep restored states in their engine (a native
        format, or :meth:`load_undeclared_states`) need it;
        :class:`~statekit.state._kvstate.OrderedKVBackendBase` implements it.
        ``plan.entry(now)`` converts a whole stored entry, ``plan.unit(now)``
        one unit; report progress with ``self._report_migration``.
        """
        raise StateMigrationError(
            f"state {reg.name!r} ({plan.describe()}) was restored natively by the {type(self).__name__} "
            "backend, which cannot migrate stored entries in place (it has no _migrate_restored); "
            "restore from a canonical snapshot (a savepoint), where every backend migrates on restore"
        )

    # --- snapshots and restores -------------------------------------------------------

    def snapshot(self) -> KeyedSnapshot:
        """Take a snapshot of all keyed state at this point.

        The returned snapshot is written later (:meth:`KeyedSnapshot.write`),
        and is unaffected by writes made in between.
        """
        if self._closed:
            raise StateAccessError("the backend is closed")
        self._refuse_broken()
        regs = [*self._states.values(), *self._restored.values()]
        metas = [r.meta() for r in regs] + [m for m, _ in self._pending.values()]
        names = {m["name"] for m in metas}
        header = SnapshotHeader(
            self.max_parallelism,
            self.key_group_range,
            self.key_serializer.config(),
            metas,
            backend=self.backend_name,
            extra={"timers": {d.value: n for d, n in TIMER_STATE_NAMES.items() if n in names}},
        )
        pending: dict[int, list[tuple[int, Section]]] = {}
        for i, (meta, secs) in enumerate(self._pending.values(), start=len(regs)):
            if any(s.removal for _, s in secs):
                raise SnapshotError(
                    f"state {meta['name']!r} was restored from a heap delta chain and its serializers cannot "
                    "be rebuilt from their configs, so its entries cannot be merged before it is declared; "
                    "declare it (get_state) before the next checkpoint or savepoint"
                )
            for kg, s in secs:
                pending.setdefault(kg, []).append((i, s))
        reader = self._snapshot_entries()
        return self.track_snapshot(KeyedSnapshot(self, header, regs, reader, pending, self.clock()))

    def track_snapshot(self, snapshot: _Snapshot) -> _Snapshot:
        """Keep ``snapshot`` (taken now, canonical or native) until it is written or released.

        :meth:`close` cancels every snapshot still pending, before the engine
        closes: it sets the snapshot's ``cancelled`` to True and calls its
        ``release()``. Its ``write`` must then raise
        :class:`~statekit.errors.SnapshotCancelledError` (:func:`cancelled_error`).
        The canonical snapshots of the base and the key-group native ones are
        tracked already; a native snapshot of your own returns
        ``self.track_snapshot(MySnapshot(...))`` from ``native_snapshot``.
        """
        self._pending_snapshots.add(snapshot)
        return snapshot

    def _cancel_pending_snapshots(self) -> None:
        """Cancel the snapshots still pending (close() calls this before the engine closes)."""
        pending = list(self._pending_snapshots)
        self._pending_snapshots.clear()
        for snap in pending:
            with contextlib.suppress(AttributeError):  # __slots__ without it: released all the same
                snap.cancelled = True
            snap.release()

    def _refuse_broken(self) -> None:
        if self._broken:
            raise SnapshotError(" ".join(self._broken.values()))

    def restore(self, handles: Sequence[KeyedStateHandle]) -> None:
        """Restore from snapshots, keeping the key groups this backend owns.

        Every check (max parallelism, key serializer, declared states' types and
        every checksum) passes before anything is restored; on error nothing is.
        Declared states whose schema changed are migrated as they are decoded
        (all of them before any is loaded). Must be called on a backend without state.
        """
        if self.num_entries():
            raise StateAccessError("restore into a backend that already holds state")
        staged: dict[str, tuple[dict[str, Any], list[tuple[int, Section]]]] = {}
        for h in handles:
            part = h.intersect(self.key_group_range)
            if part is None:
                continue
            header, _ = read_header(h.stream)
            # The index is small; checking it means a flipped byte anywhere in the
            # file is caught by some subtask's restore, not only in the blocks read.
            index = read_index(h.stream)
            # Both ways: a block the metadata leaves out would be silently not restored.
            mine = {kg: o for kg, o in index.items() if kg in h.key_group_range}
            if mine != {kg: tuple(o) for kg, o in h.offsets.items()}:
                raise CorruptSnapshotError(
                    f"{describe_stream(h.stream)}: the block index disagrees with the checkpoint metadata"
                )
            for meta in self._check_snapshot(header.max_parallelism, header.key_serializer, header.states):
                prev = staged.get(meta["name"])
                staged[meta["name"]] = (_merged(prev[0], meta), prev[1]) if prev else (meta, [])
            for kg, sections in iter_blocks(part, header):
                for s in sections:
                    staged[s.state][1].append((kg, s))
        self._restore_staged(staged)

    def _restore_staged(self, staged: dict[str, tuple[dict[str, Any], list[tuple[int, Section]]]]) -> bool:
        """Load checked sections, in order (a delta's after what it changes); True if a state migrated.

        Declared states are decoded (and migrated) whole before any is loaded;
        the others wait with core until declared.
        """
        decoded = {}
        lazy = {}
        migrated = False
        for name, (meta, secs) in staged.items():
            reg = self._states.get(name)
            if reg is not None:
                plan = reg.plan_from(meta, self._restore_origin)
                migrated = migrated or (plan is not None and plan.changes_data)
                reg = reg.restored_as(meta, plan)
                load = None
                if plan is None or not plan.changes_data:
                    load = self._load_sections(reg, secs)  # the backend may keep them as bytes
                if load is None:
                    decoded[name] = (reg, self._decode_all(reg, secs, plan))
                else:
                    lazy[name] = (reg, load)
        for name, (reg, load) in lazy.items():
            self._states[name] = reg
            load()
        for name, (reg, entries) in decoded.items():
            self._states[name] = reg
            for kg, (keys, nss, vals) in entries:
                self._load_entries(reg, kg, keys, nss, vals)
        for name, item in staged.items():
            if name not in self._states:
                self._pending[name] = item
        return migrated

    def _check_snapshot(
        self, max_parallelism: int, key_serializer: SerializerConfig, states: Sequence[dict[str, Any]]
    ) -> Sequence[dict[str, Any]]:
        """Every restore's checks: max parallelism, key serializer, declared states; returns ``states``."""
        if max_parallelism != self.max_parallelism:
            raise MaxParallelismMismatchError(
                f"the snapshot was taken with max parallelism {max_parallelism}, this "
                f"job has {self.max_parallelism}; max parallelism cannot change across a "
                f"restore: set statekit.max-parallelism={max_parallelism}"
            )
        if not same_layout(key_serializer, self.key_serializer.config()):
            names = [str(m.get("name")) for m in states if not str(m.get("name")).startswith("__statekit_")]
            raise IncompatibleSerializerError(
                f"the keys of states {names} were written as {describe_schema(key_serializer)} and are "
                f"declared as {describe_schema(self.key_serializer.config())}; keys never change type (a key "
                "decides its key group, and two old keys could become one): declare the original key type, "
                "or rewrite the savepoint's state with statekit.state_processor"
            )
        for meta in states:
            reg = self._states.get(meta["name"])
            if reg is not None:
                reg.check_restorable(meta)
        return states

    def check_native_restore(self, handles: Sequence[Any], native_format: str) -> dict[str, dict[str, Any]]:
        """Every check a native restore must make before it touches anything; returns each state's entry.

        For backends with a native format (:class:`statekit.backend_api.SupportsNativeSnapshot`):
        call it first in ``restore_native`` with the
        :class:`~statekit.snapshot_codec.NativeStateHandle` objects, then load the
        files, then :meth:`adopt_native_states` with what it returned.

        Raises:
            CorruptSnapshotError: If a handle is of another format.
            StateMigrationError: On another max parallelism, key serializer or state declaration.
            StateAccessError: If this backend already holds state.
        """
        if self.num_entries():
            raise StateAccessError("restore into a backend that already holds state")
        metas: dict[str, dict[str, Any]] = {}
        for h in handles:
            if h.format != native_format:
                raise CorruptSnapshotError(
                    f"a snapshot in format {h.format!r} (backend {h.backend!r}) cannot be restored natively "
                    f"by {type(self).__name__}, whose format is {native_format!r}; restore it with its own "
                    "backend, or take a savepoint (canonical) to change backends"
                )
            for meta in self._check_snapshot(h.max_parallelism, h.key_serializer, h.states):
                prev = metas.get(meta["name"])
                metas[meta["name"]] = meta if prev is None else _merged(prev, meta)
        if self._restore_origin is None and handles:
            self._restore_origin = {"kind": "checkpoint", "checkpoint_id": int(handles[0].checkpoint_id)}
        return metas

    def check_native_snapshot(self) -> None:
        """What a native snapshot must check first: every state it would write can be restored.

        States restored canonically whose serializers cannot be rebuilt from
        their configs are held as bytes until declared; a native format cannot
        carry them.

        Raises:
            StateAccessError: If the backend is closed.
            SnapshotError: If such states are not declared yet.
        """
        if self._closed:
            raise StateAccessError("the backend is closed")
        self._refuse_broken()
        pending = self.undeclared_pending_states
        if pending:
            raise SnapshotError(
                f"states {pending} were restored with serializers that cannot be rebuilt from their "
                "configs and are not declared; declare them (get_state) before a native checkpoint, "
                "or set statekit.checkpoint.format=canonical"
            )

    def adopt_native_states(self, metas: dict[str, dict[str, Any]]) -> None:
        """Record natively restored states: the others wait for get_state; declared ones are migrated now.

        Call it once the engine holds the restored entries: a declared state
        whose schema changed is rewritten in place (``_migrate_restored``).
        """
        for name, meta in metas.items():
            reg = self._states.get(name)
            if reg is None:
                self._restored[name] = RegisteredState.from_meta(meta)
                continue
            plan = reg.plan_from(meta, self._restore_origin)
            if plan is not None and plan.changes_data:
                self._run_restored_migration(RegisteredState.from_meta(meta), reg, plan)
            self._states[name] = reg.restored_as(meta, plan)


class KeyedSnapshot:
    """A keyed snapshot taken but not yet written; see :meth:`KeyedSnapshots.snapshot`."""

    def __init__(
        self,
        backend: KeyedSnapshots,
        header: SnapshotHeader,
        regs: list[RegisteredState],
        reader: Callable[[str, int], StateEntries],
        pending: dict[int, list[tuple[int, Section]]],
        now: int,
    ) -> None:
        self._backend = backend
        self.header = header
        self._regs = regs
        self._reader: Callable[[str, int], StateEntries] | None = reader
        self._pending = pending
        self._now = now
        #: Set by the backend's close() while pending: ``write`` raises SnapshotCancelledError.
        self.cancelled = False

    def _blocks(self, kg: int) -> Iterable[tuple[int, int, bytes, bytes, bytes]]:
        reader = self._reader
        assert reader is not None
        ks = self._backend.key_serializer
        for i, reg in enumerate(self._regs):
            got = reader(reg.name, kg)
            if isinstance(got, Section):  # restored bytes the backend never decoded: copied through
                if got.count:
                    yield i, got.count, got.keys, got.namespaces, got.values
                continue
            keys, nss, vals = got
            if reg.ttl is not None and reg.ttl.cleanup_full_snapshot and keys:
                keys, nss, vals = _drop_expired(reg, keys, nss, vals, self._now)
            if keys:
                yield (
                    i,
                    len(keys),
                    ks.encode_column(keys),
                    encode_namespaces(nss, reg.namespace_serializer, VOID_NAMESPACE, reg.name),
                    reg.serializer.encode_column(vals),
                )
        for i, s in self._pending.get(kg, ()):
            yield i, s.count, s.keys, s.namespaces, s.values

    def write(self, out: Any, *, progress: ProgressCallback | None = None) -> SnapshotWriteResult:
        """Write the snapshot to the binary stream ``out`` (anything with ``write``) and release it.

        Raises:
            SnapshotCancelledError: If its backend closed before (close() cancels pending snapshots).
        """
        if self.cancelled:
            h = self.header
            raise cancelled_error(f"the canonical snapshot of {h.backend or 'a'} {h.key_group_range}")
        if self._reader is None:
            raise StateAccessError("this snapshot was already written or released")
        try:
            return write_canonical(out, self.header, self._blocks, progress=progress)
        finally:
            self.release()

    def to_handle(self, *, name: str = "<memory>") -> KeyedStateHandle:
        """Write the snapshot into memory and return its handle."""
        buf = io.BytesIO()
        r = self.write(buf)
        return KeyedStateHandle(
            BytesStreamHandle(buf.getvalue(), name),
            self.header.key_group_range,
            r.offsets,
            r.header_length,
            backend=self.header.backend,
            size=r.size,
            entries=r.entries,
        )

    def release(self) -> None:
        """Give up the snapshot without writing it (stops copy-on-write)."""
        reader, self._reader = self._reader, None
        if reader is not None:
            self._backend._pending_snapshots.discard(self)
            self._backend._release_snapshot(reader)


def _drop_expired(
    reg: RegisteredState, keys: list[Any], nss: list[Any], vals: list[Any], now: int
) -> StateEntries:
    assert reg.ttl is not None
    ttl = reg.ttl.ttl_ms
    k2, n2, v2 = [], [], []
    for k, n, v in zip(keys, nss, vals):
        live = purge_expired(reg.storage_kind, v, now, ttl)
        if live is not None:
            k2.append(k)
            n2.append(n)
            v2.append(live)
    return k2, n2, v2
