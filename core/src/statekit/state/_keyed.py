"""The shared machinery of keyed state backends.

:class:`KeyedBackendBase` does what every keyed backend needs, so that a
backend only stores entries: the current key (serialized and assigned to a key
group once per key switch, with a cache), state registration and
re-declaration checks, TTL, reducing and aggregating state (built on value
state), and canonical snapshots and restores. A backend supplies value, list
and map handles for a :class:`~statekit.state._registered.RegisteredState`,
and per key group the entries of each state for snapshots.

Snapshots, restores and the migrations a restore runs are the base's part in
``_keyed_snapshots`` (:class:`~statekit.state._keyed_snapshots.KeyedSnapshots`);
how a state is registered is ``_registered``.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

from .._errors import (
    SnapshotError,
    StateAccessError,
    StateMigrationError,
)
from ..serialization._keygroups import KeyGroupRange, key_group_for_bytes
from ..serialization._serializers import TypeSerializer
from ..snapshots._native import NativeStateHandle
from ..snapshots._snapshot import (
    Section,
)
from ._keyed_snapshots import KeyedSnapshots
from ._migration import (
    MigrationProgress,
    same_schema,
)
from ._parameters import DEFAULT_KEY_CACHE_SIZE, KeyedBackendParameters
from ._registered import RegisteredState, StateEntries
from ._state import (
    VOID_NAMESPACE,
    AggregateFunction,
    AggregatingStateDescriptor,
    ListState,
    ReducingStateDescriptor,
    StateDescriptor,
    StateKind,
    ValueState,
)
from ._ttl import Clock, TtlListState, TtlMapState, TtlValueState, system_clock
from ._uploads import UploadTracker

__all__ = [
    "AggregatingStateImpl",
    "KeyedBackendBase",
    "ReducingStateImpl",
    "merge_list_namespaces",
]

_NO_KEY: Any = object()


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
        "_load_sections",
        "_state_keys",
        "_state_size",
        "_ttl_hook",
        "_migrate_restored",
        "_keys_ahead",
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
        "_remembered",
        "_bytes_key",
        "_key_bytes",
        "_closed",
        "_broken",
        "_restore_origin",
        "_migration_progress",
        "_pending_snapshots",
        "parameters",
        "native_uploads",
    }
)


class KeyedBackendBase(KeyedSnapshots, ABC):
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
        parameters: KeyedBackendParameters | None = None,
        /,
        *,
        key_serializer: TypeSerializer | None = None,
        key_group_range: KeyGroupRange | None = None,
        max_parallelism: int | None = None,
        clock: Clock | None = None,
        key_cache_size: int = DEFAULT_KEY_CACHE_SIZE,
    ) -> None:
        """Take what the base needs from ``parameters`` (the runner's one parameter object).

        Pass the :class:`~statekit.state._parameters.KeyedBackendParameters`
        your backend was made with (``super().__init__(parameters)``), or, as
        before it existed, the keyword arguments; ``self.parameters`` keeps it
        (``self.parameters.local_dir`` is where an on-disk backend makes its
        instance directory).
        """
        if parameters is None:
            if key_serializer is None or key_group_range is None or max_parallelism is None:
                raise TypeError(
                    f"{type(self).__name__}: pass the KeyedBackendParameters (super().__init__(parameters)), "
                    "or key_serializer, key_group_range and max_parallelism"
                )
            parameters = KeyedBackendParameters(
                key_serializer, key_group_range, max_parallelism, clock, key_cache_size
            )
        #: What the backend was made with (the runner's one parameter object).
        self.parameters = parameters
        self.key_serializer = parameters.key_serializer
        self.key_group_range = parameters.key_group_range
        self.max_parallelism = parameters.max_parallelism
        self.clock: Clock = parameters.clock or system_clock
        key_cache_size = parameters.key_cache_size
        #: The completion bookkeeping of native snapshots (see notify_checkpoint_complete).
        self.native_uploads = UploadTracker()
        self._key: Any = None
        self._kg: Any = None  # None until a key is set: indexing with it fails loudly
        self._kg_cache: dict[Any, int] = {}
        self._key_cache_size = max(1, key_cache_size)
        #: The last remember_key_groups' keys (a copy) and groups, not in the key cache yet.
        self._remembered: tuple[list[Any], Sequence[int]] | None = None
        self._bytes_key: Any = _NO_KEY  # the key whose bytes _key_bytes holds
        self._key_bytes = b""
        self._states: dict[str, RegisteredState] = {}
        self._handles: dict[str, Any] = {}
        self._pending: dict[str, tuple[dict[str, Any], list[tuple[int, Section]]]] = {}
        self._restored: dict[str, RegisteredState] = {}
        self._broken: dict[str, str] = {}  # states a failed in-place migration left half rewritten
        self._restore_origin: dict[str, Any] | None = None
        self._migration_progress: MigrationProgress | None = None
        self._pending_snapshots: weakref.WeakSet[Any] = weakref.WeakSet()
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
        if self._remembered is not None:  # a key the cache misses: the remembered ones go in first
            kg = self._cache_remembered(key)
            if kg is not None:
                return kg
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

    def set_current_key_in_group(self, key: Any, key_group: int) -> None:
        """Make ``key`` current, ``key_group`` its key group: a pair :meth:`hand_over_key_groups` took.

        What :meth:`set_current_key` does, without finding the key's group: no
        cache lookup, no serializing or hashing, no check. Only for a pair the
        backend took in the last :meth:`hand_over_key_groups` that returned True
        (the Spark runner uses it for each routed row); anything else is
        :meth:`set_current_key`'s. Where a class keeps this method as the base
        defines it, the Spark runner's per-record loop makes its two writes
        itself (a call per row costs more than the writes); a class that must
        see each switch replaces the method, and then it is called.
        """
        self._key = key
        self._kg = key_group

    def hand_over_key_groups(self, keys: Sequence[Any], key_groups: Sequence[int]) -> bool:
        """Take ``key_groups[i]`` as the key group of ``keys[i]`` for the records that follow; True if taken.

        A runner that routed each record here by its key group (the Spark runner
        computes it in the JVM, from this key serializer's bytes, with the same
        formula) hands them over with the records it routed. When this returns
        True it may make each of those keys current with
        :meth:`set_current_key_in_group` and its group, which costs no lookup
        at all. The keys must be hashable (the Spark runner hands over str and
        int keys only).

        Returns False, taking nothing, when one of the groups is outside
        :attr:`key_group_range` or null (the records did not come by key group),
        the lists differ in length or are empty, the backend is closed, or its
        class replaces :meth:`set_current_key` (a switch of key must then go
        through it). The runner then uses :meth:`remember_key_groups` or
        :meth:`set_current_key`, which compute each key's group and refuse one
        this backend does not own, naming it.
        """
        if type(self).set_current_key is not KeyedBackendBase.set_current_key:
            return False
        if not self._own_key_groups(keys, key_groups):
            return False
        self._keys_ahead(keys, key_groups)
        return True

    def remember_key_groups(self, keys: Sequence[Any], key_groups: Sequence[int]) -> None:
        """Remember ``key_groups[i]`` as the key group of ``keys[i]``: key groups a runner computed.

        As :meth:`hand_over_key_groups` takes them, for keys made current by
        :meth:`set_current_key` (a function's own calls, a runner's per-key
        loop): the key cache gets them at the first key it misses, so a switch
        to a key not seen before costs no serializing and hashing; a bulk
        update over these keys takes them as they are (:meth:`_remembered_groups`).
        Nothing is remembered where
        :meth:`hand_over_key_groups` would take nothing (a class replacing
        :meth:`set_current_key` aside): :meth:`set_current_key` then computes
        each key's and refuses one this backend does not own, naming it. Keys
        that cannot be hashed are left to it too.
        """
        self._remembered = None
        if not self._own_key_groups(keys, key_groups):
            return
        self._keys_ahead(keys, key_groups)
        if len(keys) > self._key_cache_size:
            return
        # Into the cache at the first key it misses (_assign), not now: a function that
        # switches no key one by one (update_batch takes them with their groups, see
        # _remembered_groups) pays nothing per key for them.
        self._remembered = (list(keys), key_groups)

    def _remembered_groups(self, keys: Any) -> Sequence[int] | None:
        """The key groups :meth:`remember_key_groups` last took, if ``keys`` are its keys; else None.

        For a bulk update (a heap value state's ``update_batch``) over the
        keys a runner remembered: their groups without a cache lookup per key.
        ``keys`` must be a list equal to the remembered one, element by
        element (a copy was kept: a list changed since is not taken); the
        check costs a pointer comparison per key where the elements are the
        same objects.
        """
        remembered = self._remembered
        if remembered is None or type(keys) is not list:
            return None
        kept, groups = remembered
        if len(keys) != len(kept):
            return None
        return groups if keys == kept else None

    def _cache_remembered(self, key: Any) -> int | None:
        """The remembered keys and groups into the key cache (once); ``key``'s group, if among them."""
        remembered, self._remembered = self._remembered, None
        if remembered is None:
            return None
        keys, key_groups = remembered
        cache = self._kg_cache
        if len(cache) + len(keys) > self._key_cache_size:
            cache.clear()  # as _assign does when the cache is full
        try:
            cache.update(zip(keys, key_groups))
        except TypeError:  # an unhashable key: set_current_key names it
            return None
        return cache.get(key)

    def _own_key_groups(self, keys: Sequence[Any], key_groups: Sequence[int]) -> bool:
        """Whether ``key_groups`` (one per key of ``keys``, some) are all this open backend's."""
        n = len(keys)
        if self._closed or not n or n != len(key_groups):
            return False
        kgr = self.key_group_range
        try:
            return not (min(key_groups) < kgr.start or max(key_groups) > kgr.end)
        except TypeError:  # a null key group: the records did not all come by key group
            return False

    def _keys_ahead(self, keys: Sequence[Any], key_groups: Sequence[int]) -> None:
        """Optional: the keys the next records are keyed by, with their key groups (all this backend's).

        Called by :meth:`hand_over_key_groups` and :meth:`remember_key_groups`
        once the key groups are checked to be this backend's, before the
        records are processed; a key may repeat, and a record may still read a
        key not handed over. A backend that finds keys faster together (the
        heap, in key groups still held as restored bytes) may look them up now
        or at its first read. Nothing here may change what a read returns. The
        default does nothing.
        """

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
        load = None
        if pending is not None:
            if plan is None or not plan.changes_data:
                load = self._load_sections(reg, pending[1])  # nothing is stored until load()
            if load is None:
                decoded = self._decode_all(reg, pending[1], plan)
        if restored is not None:
            if plan is not None and plan.changes_data:
                self._run_restored_migration(restored, reg, plan)
            del self._restored[name]
        self._states[name] = reg
        h = self._wrap(reg)
        if load is not None:
            load()
            del self._pending[name]
        elif decoded is not None:
            for kg, entries in decoded:
                self._load_entries(reg, kg, *entries)
            del self._pending[name]
        self._handles[name] = h
        return h

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
        frozen view) it returns three empty lists, and never raises. For a key
        group whose restored entries it still holds as one plain
        :class:`~statekit.snapshot_codec.Section` (see :meth:`_load_sections`),
        it may return that section: its bytes are copied through.
        """

    def _release_snapshot(self, reader: Callable[[str, int], StateEntries]) -> None:
        """The snapshot ``reader`` is done; copy-on-write backends may stop copying."""

    @abstractmethod
    def _load_entries(
        self, reg: RegisteredState, key_group: int, keys: list[Any], namespaces: list[Any], values: list[Any]
    ) -> None:
        """Insert restored entries of one state and key group."""

    def _load_sections(
        self, reg: RegisteredState, sections: Sequence[tuple[int, Section]]
    ) -> Callable[[], None] | None:
        """Offer restored entries of ``reg`` still as checked column bytes, to decode when needed.

        ``sections`` are (key group, section) in the order they apply (a delta's
        after what it changes); their bytes passed every check of the restore and
        are in ``reg``'s schema (no migration changes their data). Return None
        (the default) to have them decoded now and handed to
        :meth:`_load_entries`; or check and decode here whatever must be, store
        nothing, and return what stores them: it is called once every state of
        the restore got this far (so a failure leaves nothing restored), and
        never raises. A backend keeping sections decodes each key group when
        first used, and answers counts, iteration and snapshots exactly meanwhile.
        """
        return None

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

    # --- the completion contract of native snapshots ------------------------------------

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: its shared files become what snapshots may reference.

        The bookkeeping of the completion contract (``native_uploads``, an
        :class:`~statekit.state._uploads.UploadTracker`): a native format records
        each handle's shared files under ``out.checkpoint_id``
        (``native_uploads.uploaded``) and references only
        ``native_uploads.reusable(...)``; a restore hands the files it still holds
        to ``native_uploads.restored(c, files)``, which this call with ``c``
        confirms (the runner's claim). A backend without a native format ignores it.
        """
        self.native_uploads.complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` never completes: none of its files is ever referenced for it."""
        self.native_uploads.abort(checkpoint_id)

    def close(self) -> None:
        """Release resources; the backend cannot be used afterwards.

        Snapshots still pending (taken, not written) are cancelled first
        (:meth:`track_snapshot`): released, and their ``write`` raises
        :class:`~statekit.errors.SnapshotCancelledError`. An override calls
        ``super().close()`` before it closes its engine.
        """
        self._closed = True
        self._cancel_pending_snapshots()
        self._kg_cache.clear()
        self._remembered = None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (then every use raises StateAccessError; close again is a no-op)."""
        return self._closed

    def __enter__(self) -> KeyedBackendBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Names a subclass must not define: the base's own private methods (its snapshot part's too), and
# its attributes.
_INTERNAL_NAMES = (
    frozenset(
        n
        for base in (KeyedBackendBase, KeyedSnapshots)
        for n in vars(base)
        if n.startswith("_") and not n.startswith("__")
    )
    - _HOOKS
) - {"_abc_impl"} | RESERVED_ATTRIBUTES
