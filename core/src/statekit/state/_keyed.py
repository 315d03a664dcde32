"""The shared machinery of keyed state backends.

:class:`KeyedBackendBase` does what every keyed backend needs, so that a
backend only stores entries: the current key (serialized and assigned to a key
group once per key switch, with a cache), state registration and
re-declaration checks, TTL, reducing and aggregating state (built on value
state), and canonical snapshots and restores. A backend supplies value, list
and map handles for a :class:`RegisteredState`, and per key group the entries
of each state for snapshots.
"""

from __future__ import annotations

import io
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, ClassVar

from .._errors import (
    CorruptSnapshotError,
    IncompatibleSerializerError,
    MaxParallelismMismatchError,
    SerializationError,
    SnapshotError,
    StateAccessError,
    StateMigrationError,
)
from ..serialization._evolution import describe_schema, layout_serializer, same_layout
from ..serialization._keygroups import KeyGroupRange, key_group_for_bytes
from ..serialization._serializers import SerializerConfig, TypeSerializer, serializer_from_config
from ..snapshots._native import NativeStateHandle
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
    LINEAGE,
    MigrationProgress,
    StateMigrationPlan,
    lineage_of,
    plan_state_migration,
    same_schema,
    schema_of,
)
from ._state import (
    VOID_NAMESPACE,
    AggregateFunction,
    AggregatingStateDescriptor,
    ListState,
    ReducingStateDescriptor,
    StateDescriptor,
    StateKind,
    StateTtlConfig,
    TtlUpdateType,
    TtlVisibility,
    ValueState,
)
from ._timerstate import TIMER_STATE_NAMES
from ._ttl import Clock, TtlListState, TtlMapState, TtlValueState, purge_expired, system_clock, ttl_serializer

__all__ = [
    "AggregatingStateImpl",
    "KeyedBackendBase",
    "KeyedSnapshot",
    "ReducingStateImpl",
    "RegisteredState",
    "StateEntries",
    "merge_list_namespaces",
]

_NO_KEY: Any = object()

StateEntries = tuple[list[Any], list[Any], list[Any]]
"""Keys, namespaces and stored values of one state in one key group."""

_STORAGE_KIND = {
    StateKind.VALUE: StateKind.VALUE,
    StateKind.REDUCING: StateKind.VALUE,
    StateKind.AGGREGATING: StateKind.VALUE,
    StateKind.LIST: StateKind.LIST,
    StateKind.MAP: StateKind.MAP,
}


@dataclass(frozen=True)
class RegisteredState:
    """A state as a backend stores it.

    ``storage_kind`` is value, list or map (reducing and aggregating state are
    stored as values); ``serializer`` is what one (key, namespace) entry
    stores, TTL timestamps included; ``default`` is None for TTL states, whose
    default is applied by the TTL layer. ``lineage`` is the state's schema
    history: the schemas its entries were migrated from, oldest first.
    """

    name: str
    kind: StateKind
    storage_kind: StateKind
    serializer: TypeSerializer
    namespace_serializer: TypeSerializer | None
    ttl: StateTtlConfig | None
    descriptor: StateDescriptor
    lineage: tuple[dict[str, Any], ...] = field(default=(), kw_only=True)

    @classmethod
    def of(cls, d: StateDescriptor, namespace_serializer: TypeSerializer | None) -> RegisteredState:
        """Registration of descriptor ``d``."""
        skind = _STORAGE_KIND[d.kind]
        ser = d.serializer if d.ttl is None else ttl_serializer(skind, d.serializer)
        return cls(d.name, d.kind, skind, ser, namespace_serializer, d.ttl, d)

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> RegisteredState:
        """A state known only from a snapshot's entry: restored natively and not declared yet.

        Its serializers are rebuilt from their configs where they describe
        themselves; a custom serializer becomes a placeholder that raises a
        clear error if its entries must be decoded before the state is declared.
        """
        name = str(meta["name"])
        kind = StateKind(meta["kind"])
        ttl_cfg = meta.get("ttl")
        ttl = None
        if ttl_cfg:
            ttl = StateTtlConfig(
                timedelta(milliseconds=int(ttl_cfg["ttl_ms"])),
                TtlUpdateType(ttl_cfg["update_type"]),
                TtlVisibility(ttl_cfg["visibility"]),
            )
        ns_cfg = meta.get("namespace_serializer")
        return _RestoredState(
            name,
            kind,
            _STORAGE_KIND[kind],
            _rebuild(meta["stored_serializer"], name),
            None if ns_cfg is None else _rebuild(ns_cfg, name),
            ttl,
            None,  # type: ignore[arg-type]
            dict(meta),
        )

    def default_value(self) -> Any:
        """The value a plain value handle returns when absent."""
        return self.descriptor.default_value() if self.ttl is None and self.kind is StateKind.VALUE else None

    def meta(self) -> dict[str, Any]:
        """The state's entry in snapshot headers (its schema history under ``lineage``, if it has one)."""
        m = self.descriptor.meta()
        m["stored_serializer"] = self.serializer.config()
        m["namespace_serializer"] = self.namespace_serializer.config() if self.namespace_serializer else None
        if self.lineage:
            m[LINEAGE] = [dict(x) for x in self.lineage]
        return m

    def with_lineage(self, lineage: tuple[dict[str, Any], ...]) -> RegisteredState:
        """The same state with schema history ``lineage``."""
        return self if lineage == self.lineage else replace(self, lineage=lineage)

    def plan_from(
        self, meta: dict[str, Any], origin: dict[str, Any] | None = None
    ) -> StateMigrationPlan | None:
        """How entries written under snapshot entry ``meta`` become this state's; None if they already are.

        Raises:
            StateMigrationError: If they cannot (:func:`~statekit.state._migration.plan_state_migration`).
        """
        return plan_state_migration(
            self.name, self.kind, self.descriptor, self.namespace_serializer, meta, origin
        )

    def check_restorable(self, meta: dict[str, Any]) -> None:
        """Raise :class:`StateMigrationError` unless ``meta``'s entries can be read or migrated."""
        self.plan_from(meta)

    def restored_as(self, meta: dict[str, Any], plan: StateMigrationPlan | None) -> RegisteredState:
        """This state after restoring entries of ``meta``: with its history, and ``plan``'s step if any."""
        return self.with_lineage(lineage_of(meta) if plan is None else plan.lineage)


@dataclass(frozen=True)
class _RestoredState(RegisteredState):
    """A natively restored state that the job has not declared (yet): its snapshot entry is its meta."""

    stored_meta: dict[str, Any]

    def default_value(self) -> Any:
        return None

    def meta(self) -> dict[str, Any]:
        return dict(self.stored_meta)


class _OpaqueSerializer(TypeSerializer):
    """Stands for a custom serializer of an undeclared restored state until the job declares it."""

    def __init__(self, cfg: SerializerConfig, state: str) -> None:
        self._cfg = cfg
        self._state = state

    def _refuse(self) -> SnapshotError:
        return SnapshotError(
            f"state {self._state!r} was restored from a native snapshot and uses a serializer "
            f"({self.describe()}) that cannot be rebuilt from its config; declare the state (get_state) "
            "before taking a canonical snapshot or savepoint"
        )

    def serialize(self, value: Any) -> bytes:
        raise self._refuse()

    def deserialize(self, data: bytes | memoryview) -> Any:
        raise self._refuse()

    def config(self) -> SerializerConfig:
        return self._cfg


def _rebuild(cfg: SerializerConfig, state: str) -> TypeSerializer:
    try:
        return serializer_from_config(cfg)
    except (SerializationError, ImportError, AttributeError, KeyError, TypeError, ValueError):
        pass
    try:
        # A dataclass that changed or is gone: its bytes still read (as tuples) and write back unchanged.
        return layout_serializer(cfg)
    except (SerializationError, KeyError, TypeError, ValueError):
        return _OpaqueSerializer(cfg, state)


def merge_list_namespaces(handle: Any, target: Any, sources: Sequence[Any]) -> None:
    """Merge list state namespaces through the handle's public methods."""
    prev = handle.current_namespace
    merged: list[Any] = []
    for ns in sources:
        handle.set_current_namespace(ns)
        items = handle.get()
        if items:
            merged.extend(items)
            handle.clear()
    handle.set_current_namespace(target)
    if merged:
        handle.add_all(merged)
    handle.set_current_namespace(prev)


class ReducingStateImpl:
    """Reducing state on top of a value handle (plain or TTL)."""

    __slots__ = ("_fn", "_v")

    def __init__(self, value: Any, fn: Callable[[Any, Any], Any]) -> None:
        self._v = value
        self._fn = fn

    def set_current_namespace(self, namespace: Any) -> None:
        self._v.set_current_namespace(namespace)

    def clear(self) -> None:
        self._v.clear()

    def get(self) -> Any:
        return self._v.value()

    def add(self, value: Any) -> None:
        if value is None:
            raise ValueError("ReducingState.add(None): cannot add None")
        cur = self._v.value()
        self._v.update(value if cur is None else self._fn(cur, value))

    def _combine(self, a: Any, b: Any) -> Any:
        return self._fn(a, b)

    def merge_namespaces(self, target: Any, sources: Sequence[Any]) -> None:
        if not sources:
            return
        v = self._v
        prev = v.current_namespace
        acc = None
        for ns in sources:
            v.set_current_namespace(ns)
            x = v.value()
            if x is not None:
                v.clear()
                acc = x if acc is None else self._combine(acc, x)
        if acc is not None:
            v.set_current_namespace(target)
            cur = v.value()
            v.update(acc if cur is None else self._combine(cur, acc))
        v.set_current_namespace(prev)

    @property
    def current_namespace(self) -> Any:
        return self._v.current_namespace


class AggregatingStateImpl(ReducingStateImpl):
    """Aggregating state on top of a value handle storing the accumulator."""

    __slots__ = ("_agg",)

    def __init__(self, value: Any, agg: AggregateFunction[Any, Any, Any]) -> None:
        super().__init__(value, agg.merge)
        self._agg = agg

    def get(self) -> Any:
        acc = self._v.value()
        return None if acc is None else self._agg.get_result(acc)

    def add(self, value: Any) -> None:
        if value is None:
            raise ValueError("AggregatingState.add(None): cannot add None")
        acc = self._v.value()
        if acc is None:
            acc = self._agg.create_accumulator()
        self._v.update(self._agg.add(value, acc))


class _TtlValueNs(TtlValueState):
    """TTL value state that also exposes the namespace (for merging)."""

    __slots__ = ()

    @property
    def current_namespace(self) -> Any:
        return self._raw.current_namespace


_HOOKS = frozenset(
    {
        "_create_value",
        "_create_list",
        "_create_map",
        "_snapshot_entries",
        "_release_snapshot",
        "_load_entries",
        "_state_keys",
        "_state_size",
        "_ttl_hook",
        "_migrate_restored",
    }
)
#: Attributes KeyedBackendBase keeps on ``self`` (docs/writing-a-backend.md lists them).
RESERVED_ATTRIBUTES = frozenset(
    {
        "_states",
        "_handles",
        "_pending",
        "_restored",
        "_key",
        "_kg",
        "_kg_cache",
        "_key_cache_size",
        "_bytes_key",
        "_key_bytes",
        "_closed",
        "_broken",
        "_restore_origin",
        "_migration_progress",
    }
)


class KeyedBackendBase(ABC):
    """Base class of keyed state backends; see the module docstring.

    Subclasses implement :meth:`_create_value`, :meth:`_create_list`,
    :meth:`_create_map`, :meth:`_snapshot_entries`, :meth:`_load_entries`,
    :meth:`_state_keys` and :meth:`_state_size`.
    """

    backend_name: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse, when a backend class is defined, names that would replace the base's internals."""
        super().__init_subclass__(**kwargs)
        clash = sorted(name for name in vars(cls) if name in _INTERNAL_NAMES)
        if clash:
            tag = (cls.backend_name or cls.__name__).lower().replace("-", "_")
            raise TypeError(
                f"{cls.__qualname__} defines {', '.join(clash)}, which KeyedBackendBase uses internally; "
                f"overriding {'it' if len(clash) == 1 else 'them'} breaks restores and snapshots. Rename "
                f"yours with a prefix of your backend's own (e.g. _{tag}{clash[0]}); the methods meant to "
                f"be implemented are {', '.join(sorted(_HOOKS))}"
            )

    def __init__(
        self,
        *,
        key_serializer: TypeSerializer,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        clock: Clock | None = None,
        key_cache_size: int = 131072,
    ) -> None:
        self.key_serializer = key_serializer
        self.key_group_range = key_group_range
        self.max_parallelism = max_parallelism
        self.clock: Clock = clock or system_clock
        self._key: Any = None
        self._kg: Any = None  # None until a key is set: indexing with it fails loudly
        self._kg_cache: dict[Any, int] = {}
        self._key_cache_size = max(1, key_cache_size)
        self._bytes_key: Any = _NO_KEY  # the key whose bytes _key_bytes holds
        self._key_bytes = b""
        self._states: dict[str, RegisteredState] = {}
        self._handles: dict[str, Any] = {}
        self._pending: dict[str, tuple[dict[str, Any], list[tuple[int, Section]]]] = {}
        self._restored: dict[str, RegisteredState] = {}
        self._broken: dict[str, str] = {}  # states a failed in-place migration left half rewritten
        self._restore_origin: dict[str, Any] | None = None
        self._migration_progress: MigrationProgress | None = None
        self._closed = False

    # --- the current key ----------------------------------------------------------

    def set_current_key(self, key: Any) -> None:
        """Make ``key`` the key every state handle reads and writes."""
        try:
            kg = self._kg_cache.get(key)
        except TypeError:
            raise StateAccessError(f"keys must be hashable; got {type(key).__name__}") from None
        if kg is None:
            kg = self._assign(key)
        self._key = key
        self._kg = kg

    def _assign(self, key: Any) -> int:
        if self._closed:
            raise StateAccessError("the backend is closed")
        raw = self.key_serializer.serialize(key)
        self._bytes_key, self._key_bytes = key, raw  # a key-value backend asks for them next
        kg = key_group_for_bytes(raw, self.max_parallelism)
        if kg not in self.key_group_range:
            raise StateAccessError(
                f"key {key!r} belongs to key group {kg}, which this backend "
                f"({self.key_group_range}) does not own; route records by key group"
            )
        if len(self._kg_cache) >= self._key_cache_size:
            self._kg_cache.clear()  # cheap, amortized; hot keys come back at once
        self._kg_cache[key] = kg
        return kg

    def get_current_key(self) -> Any:
        """The current key (None before the first :meth:`set_current_key`)."""
        return self._key

    @property
    def current_key_group(self) -> int:
        """The key group of the current key."""
        if self._kg is None:
            raise StateAccessError("no current key: call set_current_key first")
        return int(self._kg)

    @property
    def current_key_bytes(self) -> bytes:
        """The current key serialized by ``key_serializer``: what a key-value engine stores it under.

        Serialized once per key switch at most (a backend reading it on every
        access pays nothing more).

        Raises:
            StateAccessError: Without a current key.
        """
        key = self._key
        if self._kg is None:
            raise StateAccessError("no current key: call set_current_key first")
        if key is not self._bytes_key:
            self._key_bytes = self.key_serializer.serialize(key)
            self._bytes_key = key
        return self._key_bytes

    def _no_key(self) -> StateAccessError:
        return StateAccessError("no current key: call set_current_key before using keyed state")

    # --- states -------------------------------------------------------------------

    def get_state(
        self, descriptor: StateDescriptor, *, namespace_serializer: TypeSerializer | None = None
    ) -> Any:
        """The handle of ``descriptor``'s state, created on first use.

        Restored entries of the state are checked against the descriptor here,
        before the state is touched: a changed type is migrated (by the rules
        of schema evolution, or a ``Migration`` the descriptor declares, see
        :mod:`statekit.state._migration`), a change that cannot be raises
        StateMigrationError naming both schemas.
        """
        name = descriptor.name
        h = self._handles.get(name)
        if h is not None:
            reg = self._states[name]
            again = RegisteredState.of(descriptor, namespace_serializer or reg.namespace_serializer)
            if not same_schema(reg.meta(), again.meta()):
                raise StateMigrationError(
                    f"state {name!r} is already declared as {reg.descriptor!r}; "
                    f"it cannot be declared again as {descriptor!r}"
                )
            return h
        broken = self._broken.get(name)
        if broken is not None:
            raise StateMigrationError(broken)
        reg = RegisteredState.of(descriptor, namespace_serializer)
        restored = self._restored.get(name)
        pending = self._pending.get(name)
        plan = None
        meta = restored.meta() if restored is not None else pending[0] if pending is not None else None
        if meta is not None:
            plan = reg.plan_from(meta, self._restore_origin)  # refuses before anything changes
            reg = reg.restored_as(meta, plan)
        decoded = None
        if pending is not None:
            decoded = self._decode_all(reg, pending[1], plan)
        if restored is not None:
            if plan is not None and plan.changes_data:
                self._run_restored_migration(restored, reg, plan)
            del self._restored[name]
        self._states[name] = reg
        h = self._wrap(reg)
        if decoded is not None:
            for kg, entries in decoded:
                self._load_entries(reg, kg, *entries)
            del self._pending[name]
        self._handles[name] = h
        return h

    def _decode(
        self, reg: RegisteredState, s: Section, plan: StateMigrationPlan | None = None
    ) -> StateEntries:
        keys = self.key_serializer.decode_column(s.keys, s.count)
        nss = decode_namespaces(s.namespaces, s.count, reg.namespace_serializer, VOID_NAMESPACE, reg.name)
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

    # --- migrations on restore --------------------------------------------------------

    def on_migration_progress(self, callback: MigrationProgress | None) -> None:
        """Call ``callback(state, done, total)`` while a restore migrates a state's entries (None: stop).

        Entries are counted per (key, namespace) in canonical snapshots, per
        stored unit (value, list element, map entry) in an engine's own files.
        """
        self._migration_progress = callback

    def _report_migration(self, state: str, done: int, total: int) -> None:
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

    def _wrap(self, reg: RegisteredState) -> Any:
        ttl = reg.ttl
        if reg.storage_kind is StateKind.LIST:
            raw_list = self._create_list(reg)
            if ttl is None:
                return raw_list
            return TtlListState(raw_list, ttl, self.clock, self._ttl_hook(reg))
        if reg.storage_kind is StateKind.MAP:
            raw_map = self._create_map(reg)
            if ttl is None:
                return raw_map
            return TtlMapState(raw_map, ttl, self.clock, self._ttl_hook(reg))
        value: Any = self._create_value(reg)
        if ttl is not None:
            value = _TtlValueNs(value, ttl, self.clock, self._ttl_hook(reg), reg.descriptor.default_value)
        d = reg.descriptor
        if isinstance(d, ReducingStateDescriptor):
            return ReducingStateImpl(value, d.reduce_function)
        if isinstance(d, AggregatingStateDescriptor):
            return AggregatingStateImpl(value, d.aggregate_function)
        return value

    def _ttl_hook(self, reg: RegisteredState) -> Callable[[], None] | None:
        """Called on every access of a TTL state; backends may clean up incrementally."""
        return None

    @abstractmethod
    def _create_value(self, reg: RegisteredState) -> ValueState[Any]:
        """A value handle storing ``reg.serializer`` values (with ``reg.default_value()``)."""

    @abstractmethod
    def _create_list(self, reg: RegisteredState) -> ListState[Any]:
        """A list handle; its merge_namespaces may use :func:`merge_list_namespaces`."""

    @abstractmethod
    def _create_map(self, reg: RegisteredState) -> Any:
        """A map handle."""

    @abstractmethod
    def _snapshot_entries(self) -> Callable[[str, int], StateEntries]:
        """Freeze the state for a snapshot; return a reader of (state, key group) entries.

        Called synchronously at the snapshot point. The reader is called later,
        possibly while processing goes on, and must return the state as it was
        at the snapshot point (copy now, or copy on write). It is asked only
        about states registered at that point, once per owned key group; for a
        state without entries there (or without a table or column in the
        frozen view) it returns three empty lists, and never raises.
        """

    def _release_snapshot(self, reader: Callable[[str, int], StateEntries]) -> None:  # noqa: B027
        """The snapshot ``reader`` is done; copy-on-write backends may stop copying."""

    @abstractmethod
    def _load_entries(
        self, reg: RegisteredState, key_group: int, keys: list[Any], namespaces: list[Any], values: list[Any]
    ) -> None:
        """Insert restored entries of one state and key group."""

    @abstractmethod
    def _state_keys(self, reg: RegisteredState, namespace: Any) -> Iterator[Any]:
        """The keys having an entry of ``reg`` in ``namespace``."""

    @abstractmethod
    def _state_size(self, reg: RegisteredState) -> int:
        """The number of (key, namespace) entries of ``reg``."""

    def keys(self, state_name: str, namespace: Any = VOID_NAMESPACE) -> Iterator[Any]:
        """The keys that have state ``state_name`` in ``namespace``."""
        reg = self._states.get(state_name)
        if reg is None:
            raise StateAccessError(
                f"state {state_name!r} is not declared; call get_state with its descriptor first"
            )
        return self._state_keys(reg, namespace)

    def num_entries(self, state_name: str | None = None) -> int:
        """Entries of one state, or of all (restored but undeclared states included)."""
        if state_name is not None:
            if state_name in self._pending:
                return sum(s.count for _, s in self._pending[state_name][1])
            reg = self._states.get(state_name) or self._restored.get(state_name)
            return 0 if reg is None else self._state_size(reg)
        return sum(self._state_size(r) for r in (*self._states.values(), *self._restored.values())) + sum(
            s.count for _, secs in self._pending.values() for _, s in secs
        )

    @property
    def state_names(self) -> list[str]:
        """Declared states and restored states not yet declared."""
        return [*self._states, *self._restored, *self._pending]

    @property
    def undeclared_state_names(self) -> list[str]:
        """States a restore brought that the job has not declared (yet).

        A state the new job no longer declares (removed from it) is kept and
        carried into every snapshot, so that a later job declaring it again
        finds its entries; runners name these states once the function opened.
        """
        return [*self._restored, *self._pending]

    @property
    def stored_state_names(self) -> list[str]:
        """The states whose entries the backend stores: declared ones and natively restored ones."""
        return [*self._states, *self._restored]

    def load_undeclared_states(self) -> None:
        """Hand entries of canonically restored, undeclared states to the backend now.

        Core keeps such entries as snapshot sections until the state is declared.
        A backend whose native snapshots must contain every state (an engine's
        files) calls this after :meth:`restore`: each state whose serializers can
        be rebuilt from their configs goes through :meth:`_load_entries` and
        becomes a restored state (as after a native restore). States with custom
        serializers stay with core until they are declared.
        """
        for name, (meta, sections) in list(self._pending.items()):
            reg = RegisteredState.from_meta(meta)
            try:
                decoded = [(kg, self._decode(reg, s)) for kg, s in sections]
            except SnapshotError:
                continue
            for kg, entries in decoded:
                self._load_entries(reg, kg, *entries)
            del self._pending[name]
            self._restored[name] = reg

    @property
    def undeclared_pending_states(self) -> list[str]:
        """Canonically restored states whose entries core still holds (see :meth:`load_undeclared_states`)."""
        return list(self._pending)

    def stored_state_metas(self) -> list[dict[str, Any]]:
        """The snapshot entries (``RegisteredState.meta()``) of every state in :attr:`stored_state_names`."""
        regs = (self.registered_state(n) for n in self.stored_state_names)
        return [r.meta() for r in regs if r is not None]

    def native_handle(
        self,
        checkpoint_id: int,
        files: Sequence[Any],
        *,
        states: list[dict[str, Any]],
        meta: dict[str, Any],
        entries: int = 0,
    ) -> NativeStateHandle:
        """A :class:`NativeStateHandle` of this backend: format, range, serializers filled in."""
        return NativeStateHandle(
            format=str(getattr(self, "native_format", "")),
            backend=self.backend_name,
            checkpoint_id=checkpoint_id,
            key_group_range=self.key_group_range,
            max_parallelism=self.max_parallelism,
            key_serializer=self.key_serializer.config(),
            states=states,
            files=tuple(files),
            meta=meta,
            entries=entries,
        )

    def registered_state(self, name: str) -> RegisteredState | None:
        """The state ``name`` as stored: declared, or restored natively and not declared yet."""
        return self._states.get(name) or self._restored.get(name)

    # --- snapshots ----------------------------------------------------------------

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
        for i, (_, secs) in enumerate(self._pending.values(), start=len(regs)):
            for kg, s in secs:
                pending.setdefault(kg, []).append((i, s))
        reader = self._snapshot_entries()
        return KeyedSnapshot(self, header, regs, reader, pending, self.clock())

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
        decoded = {}
        for name, (meta, secs) in staged.items():
            reg = self._states.get(name)
            if reg is not None:
                plan = reg.plan_from(meta, self._restore_origin)
                reg = reg.restored_as(meta, plan)
                decoded[name] = (reg, self._decode_all(reg, secs, plan))
        for name, (reg, entries) in decoded.items():
            self._states[name] = reg
            for kg, (keys, nss, vals) in entries:
                self._load_entries(reg, kg, keys, nss, vals)
        for name, item in staged.items():
            if name not in self._states:
                self._pending[name] = item

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

        For backends with a native format (:class:`statekit.SupportsNativeSnapshot`):
        call it first in ``restore_native`` with the
        :class:`~statekit.backend_api.NativeStateHandle` objects, then load the
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

    def close(self) -> None:
        """Release resources; the backend cannot be used afterwards."""
        self._closed = True
        self._kg_cache.clear()

    def __enter__(self) -> KeyedBackendBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


# Names a subclass must not define: the base's own private methods, and its attributes.
_INTERNAL_NAMES = (
    frozenset(n for n in vars(KeyedBackendBase) if n.startswith("_") and not n.startswith("__")) - _HOOKS
) - {"_abc_impl"} | RESERVED_ATTRIBUTES


class KeyedSnapshot:
    """A keyed snapshot taken but not yet written; see :meth:`KeyedBackendBase.snapshot`."""

    def __init__(
        self,
        backend: KeyedBackendBase,
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

    def _blocks(self, kg: int) -> Iterable[tuple[int, int, bytes, bytes, bytes]]:
        reader = self._reader
        assert reader is not None
        ks = self._backend.key_serializer
        for i, reg in enumerate(self._regs):
            keys, nss, vals = reader(reg.name, kg)
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
        """Write the snapshot to the binary stream ``out`` (anything with ``write``) and release it."""
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
        if self._reader is not None:
            self._backend._release_snapshot(self._reader)
            self._reader = None


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
