"""The heap keyed state backend: Python dicts per state, namespace and key group.

Layout: for each state, for each namespace, a list indexed by key group whose
items are ``dict[key, stored value]``. A snapshot pins every key group; the
first write (or read of a mutable value) to a pinned key group replaces its
dicts by copies, so the snapshot keeps the dicts as they were at the snapshot
point while processing goes on: copy-on-write at key-group granularity.

Namespaces come and go (a window each): a namespace whose entries are all
removed has its list dropped, so memory follows the live namespaces, not every
namespace ever used. Handles re-resolve their namespace's list whenever they
create a dict, so a handle whose namespace was dropped writes into the live table.

Restores are lazy: a restored key group of a state is kept as the checked
column bytes it was restored from (:meth:`HeapKeyedStateBackend._load_sections`)
and decoded into its dicts the first time a handle touches that key group (a
record's key group is known before its state is). Until then its exact entry
count answers counts, a snapshot copies its bytes through (or decodes them
aside, after deltas), and iterating a state decodes all of it first.

A value state's lazy key group is first read and written key by key, still as
bytes (:class:`_Partial`): a lookup searches its key columns in C
(:class:`~statekit.snapshot_codec.SectionLookup`), and what is read or written
is kept aside until the key group is decoded, once its lookups have taken
``_LOOKUP_BUDGET`` of the time its decode would (timed, against the table's
own decodes) or at the first access that needs all of it.
A restarted job whose first records touch a few keys of every key group so
does not decode every key group before its first output. Keys a runner hands
over ahead of their records (Spark's routing does, per task:
:meth:`_keys_ahead`) are looked up together, at the first lookup in their key
group: one pass over each section's key column for all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from time import perf_counter
from typing import Any

from statekit import VOID_NAMESPACE
from statekit.backend_api import (
    DeclaredStateBackend,
    DeltaKeyedBackendBase,
    KeyedBackendParameters,
    KeyGroupRange,
    RegisteredState,
    StateEntries,
    StateKind,
    merge_list_namespaces,
    purge_expired,
)
from statekit.errors import SerializationError, StateAccessError
from statekit.serializers import DictSerializer, ListSerializer
from statekit.snapshot_codec import REMOVED, DeltaChanges, Section, SectionLookup

from ._plugin import OPTIONS

__all__ = ["HeapKeyedStateBackend", "HeapStateBackend"]

_Dicts = list[dict[Any, Any] | None]
_Over = dict[Any, Any]

#: The share of a key group's decode time its lookups by key may take before it is decoded:
#: all of it (an index costs a third of it, so a smaller share would leave little for lookups).
_LOOKUP_BUDGET = 1.0
#: Seconds to decode one entry, until a table has timed its own decodes (str keys and
#: int values on 2 cores with pyarrow loaded: 250-470 ns).
_DECODE_SECONDS = 300e-9
#: Decodes of fewer entries are not timed: their fixed costs would dominate.
_TIMED_DECODE_MIN = 1_000


def _copier(reg: RegisteredState) -> Callable[[Any], Any] | None:
    """How to copy a stored value so that in-place changes leave snapshots alone."""
    ser = reg.serializer
    if ser.immutable:
        return None
    if isinstance(ser, ListSerializer) and ser.element.immutable:
        return list
    if isinstance(ser, DictSerializer) and ser.key.immutable and ser.value.immutable:
        return dict
    return ser.copy


class _Table:
    """The entries of one state."""

    __slots__ = (
        "changed",
        "changed_ns",
        "cleanup_kg",
        "cleanup_todo",
        "copy",
        "decode_seconds",
        "deep",
        "kgr",
        "lazy",
        "lazy_entries",
        "ns",
        "partial",
        "pins",
        "reg",
        "void",
    )

    def __init__(self, kgr: KeyGroupRange, copy: Callable[[Any], Any] | None, deep: bool) -> None:
        n = kgr.end + 1
        self.kgr = kgr
        self.void: _Dicts = [None] * n
        for kg in kgr:
            self.void[kg] = {}
        self.ns: dict[Any, _Dicts] = {VOID_NAMESPACE: self.void}
        # Per key group, the tokens of the snapshots still sharing its dicts.
        # unshare() replaces the set rather than emptying it, so a snapshot
        # released concurrently from a writer thread only ever discards its
        # own token from a set nobody else relies on: no lost update.
        self.pins: list[set[object] | tuple[()]] = [()] * n
        self.copy = copy
        # True when values may change in place, so even reads must unshare them.
        self.deep = deep
        self.cleanup_kg = kgr.start
        self.cleanup_todo: list[tuple[Any, int, Any]] = []
        # Per key group, the keys (void namespace) and (namespace, key) pairs written since the
        # last native snapshot; None while nothing records them (no native snapshot yet).
        self.changed: list[set[Any] | None] | None = None
        self.changed_ns: list[set[Any] | None] | None = None
        # Restored key groups not decoded yet: their sections (in order) and exact entry count. A lazy
        # key group has no dict in any namespace until HeapKeyedStateBackend._heap_materialize.
        self.lazy: dict[int, tuple[list[Section], int]] = {}
        self.lazy_entries = 0
        # Lazy key groups read or written by key so far (value states, void namespace only).
        self.partial: dict[int, _Partial] = {}
        # Seconds to decode one entry of this state, as its own decodes took (else the default).
        self.decode_seconds = _DECODE_SECONDS
        self.reg: RegisteredState | None = None

    def track(self) -> tuple[list[set[Any] | None] | None, list[set[Any] | None] | None]:
        """Record changes afresh; returns what was recorded so far (None, None if nothing recorded)."""
        old = self.changed, self.changed_ns
        n = self.kgr.end + 1
        self.changed = [None] * n
        self.changed_ns = [None] * n
        for kg in self.kgr:
            self.changed[kg] = set()
            self.changed_ns[kg] = set()
        return old

    def touch(self, namespace: Any, kg: int, key: Any) -> None:
        """Record that the entry of ``key`` in ``namespace`` and key group ``kg`` may have changed."""
        if self.changed is not None:
            if namespace is VOID_NAMESPACE:
                self.changed[kg].add(key)  # type: ignore[union-attr]
            else:
                self.changed_ns[kg].add((namespace, key))  # type: ignore[index, union-attr]

    def dicts(self, namespace: Any) -> _Dicts:
        d = self.ns.get(namespace)
        if d is None:
            d = self.ns[namespace] = [None] * (self.kgr.end + 1)
        return d

    def emptied(self, namespace: Any, lst: _Dicts, kg: int) -> None:
        """Key group ``kg`` of ``namespace`` is empty: free it, and the namespace if all are."""
        lst[kg] = None
        if namespace is not VOID_NAMESPACE and not any(lst) and self.ns.get(namespace) is lst:
            del self.ns[namespace]
            lst[:] = [None] * len(lst)  # empty dicts left in it must not take writes any more

    def unshare(self, kg: int) -> None:
        """Copy key group ``kg``'s dicts (and mutable values) away from snapshots."""
        cp = self.copy
        for lst in self.ns.values():
            d = lst[kg]
            if d is not None:
                lst[kg] = d.copy() if cp is None else {k: cp(v) for k, v in d.items()}
        self.pins[kg] = ()

    def size(self) -> int:
        return sum(len(d) for lst in self.ns.values() for d in lst if d) + self.lazy_entries


def _unreadable(t: _Table, kg: int, e: SerializationError) -> StateAccessError:
    """The error for restored entries of key group ``kg`` that ``t``'s serializer cannot read by key."""
    reg = t.reg
    assert reg is not None
    return StateAccessError(
        f"state {reg.name!r}, key group {kg}: its restored entries (checked when restored) "
        f"cannot be read by its serializer {reg.serializer!r}: {e}. Fix the serializer and "
        "restore again (the checkpoint is unchanged)"
    )


class _Partial:
    """A lazy key group of a value state, read and written by key while its sections stay bytes.

    ``over`` holds the current value of every key read or written since the
    restore (the sections hold the others), ``missing`` the keys looked up and
    found in no section, ``added`` how many keys of ``over`` no section holds
    (the key group's count is its restored count plus ``added``). Writes that
    remove an entry decode the key group first, so ``over`` has no removals.
    """

    __slots__ = ("added", "ahead", "budget", "lookups", "missing", "over", "spent")

    def __init__(self, sections: list[SectionLookup], budget: float) -> None:
        self.lookups = sections  # newest first: a later section's entry wins
        self.over: dict[Any, Any] = {}
        self.missing: set[Any] = set()
        self.added = 0
        self.ahead = -1  # the round of keys ahead (HeapKeyedStateBackend._ahead_round) looked up here
        # Lookups may take a decode's time before the key group is decoded: one read by
        # very many keys pays about 2 decodes, one read by a few thousand never decodes.
        self.budget = budget
        self.spent = 0.0  # seconds the lookups (and making them) took so far


class _Handle:
    """What heap handles share: the current key and namespace."""

    __slots__ = ("_b", "_maps", "_ns", "_reg", "_t")

    def __init__(self, backend: HeapKeyedStateBackend, table: _Table, reg: RegisteredState) -> None:
        self._b = backend
        self._t = table
        self._reg = reg
        self._maps = table.void
        self._ns = VOID_NAMESPACE

    @property
    def current_namespace(self) -> Any:
        return self._ns

    def set_current_namespace(self, namespace: Any) -> None:
        if namespace is not VOID_NAMESPACE and self._reg.namespace_serializer is None:
            raise StateAccessError(
                f"state {self._reg.name!r} has no namespace serializer; pass "
                "namespace_serializer= to get_state to use namespaces"
            )
        self._maps = self._t.dicts(namespace)
        self._ns = namespace

    def _kg(self) -> int:
        kg = self._b._kg
        if kg is None:
            raise self._b._no_key()
        return kg  # type: ignore[no-any-return]

    def _write_dict(self) -> dict[Any, Any]:
        """The current key group's dict, unshared and created if needed."""
        kg = self._kg()
        t = self._t
        if t.pins[kg]:
            t.unshare(kg)
        if t.changed is not None:
            t.touch(self._ns, kg, self._b._key)
        d = self._maps[kg]
        if d is None:
            d = self._new_dict(kg)
        return d

    def _new_dict(self, kg: int) -> dict[Any, Any]:
        t = self._t
        if t.lazy and kg in t.lazy:
            self._b._heap_materialize(t, kg)
        # The namespace's list may have been dropped while empty: write into the table's.
        self._maps = maps = t.dicts(self._ns)
        d = maps[kg]
        if d is None:
            d = maps[kg] = {}
        return d

    def _restored_dict(self, kg: int) -> dict[Any, Any] | None:
        """The dict of ``kg`` once its restored entries are decoded (no dict: None); ``kg`` is lazy."""
        t = self._t
        self._b._heap_materialize(t, kg)
        lst = t.ns.get(self._ns)
        if lst is not None:
            self._maps = lst
            return lst[kg]
        return None

    def _pop(self, d: dict[Any, Any], kg: int) -> None:
        """Remove the current key from ``d`` (the writable dict of ``kg``); free what empties."""
        d.pop(self._b._key, None)
        if not d:
            self._t.emptied(self._ns, self._maps, kg)

    def _read_dict(self) -> dict[Any, Any] | None:
        kg = self._kg()
        t = self._t
        if t.deep:
            if t.pins[kg]:
                t.unshare(kg)
            if t.changed is not None:  # the value handed out may be changed in place
                t.touch(self._ns, kg, self._b._key)
        d = self._maps[kg]
        if d is None and t.lazy and kg in t.lazy:
            return self._restored_dict(kg)
        return d

    def clear(self) -> None:
        kg = self._kg()
        t = self._t
        if self._maps[kg] is None and not t.pins[kg] and not (t.lazy and kg in t.lazy):
            return  # nothing stored in this namespace and key group
        self._pop(self._write_dict(), kg)


class HeapValueState(_Handle):
    """Value state for immutable values (ints, strs, frozen dataclasses...)."""

    __slots__ = ("_copy_default", "_default")

    def __init__(self, backend: HeapKeyedStateBackend, table: _Table, reg: RegisteredState) -> None:
        super().__init__(backend, table, reg)
        self._default = reg.default_value()
        self._copy_default = self._default is not None and not reg.serializer.immutable

    def value(self) -> Any:
        b = self._b
        try:
            d = self._maps[b._kg]
        except TypeError:
            raise b._no_key() from None
        if d is None and self._t.lazy and b._kg in self._t.lazy:
            if self._ns is VOID_NAMESPACE:
                v = b._heap_get(self._t, b._kg, b._key)
            else:
                d = self._restored_dict(b._kg)
                v = None if d is None else d.get(b._key)
        else:
            v = None if d is None else d.get(b._key)
        if v is None:
            return self._reg.default_value() if self._copy_default else self._default
        return v

    def update(self, value: Any) -> None:
        if value is None:
            self.clear()
            return
        b = self._b
        kg = b._kg
        t = self._t
        try:
            if t.pins[kg]:
                t.unshare(kg)
        except TypeError:
            raise b._no_key() from None
        ch = t.changed
        if ch is not None:
            if self._ns is VOID_NAMESPACE:
                ch[kg].add(b._key)
            else:
                t.touch(self._ns, kg, b._key)
        d = self._maps[kg]
        if d is None:
            if t.lazy and kg in t.lazy and self._ns is VOID_NAMESPACE:
                b._heap_put(t, kg, b._key, value)
                return
            d = self._new_dict(kg)
        d[b._key] = value

    def update_batch(self, keys: Iterable[Any], fn: Callable[[Any], Any]) -> list[Any]:
        """For each key in order, store ``fn(value)``; returns the stored values.

        The batched form of ``set_current_key(k); s.update(fn(s.value()))``: one
        Python frame for the whole batch. Leaves the last key current. Like
        every handle, it must be called from the thread that drives the backend.
        """
        b = self._b
        t = self._t
        maps = self._maps
        cache = b._kg_cache
        out: list[Any] = []
        append = out.append
        key: Any = None
        kg: Any = None
        fast = not self._copy_default and not any(t.pins)
        lazy = t.lazy
        if lazy and self._ns is VOID_NAMESPACE:
            fast = fast and all(maps[g] is not None or g in lazy for g in t.kgr)
        else:
            fast = fast and all(maps[g] is not None for g in t.kgr)
        if fast:
            # No snapshot shares a dict, every dict exists (or is restored bytes, decoded
            # into one on its first key), the default is a shared immutable value,
            # fn never returns None: nothing else to check per key.
            dflt = self._default
            restored = self._b._heap_update
            ch = t.changed if self._ns is VOID_NAMESPACE else None
            if t.changed is not None and ch is None:
                ns = self._ns
                for key in keys:
                    kg = cache.get(key)
                    if kg is None:
                        kg = b._assign(key)
                    t.touch(ns, kg, key)
                    d = maps[kg]
                    new = fn(d.get(key, dflt))
                    if new is None:
                        d.pop(key, None)
                    else:
                        d[key] = new
                    append(new)
            elif ch is not None:
                # The keys a runner remembered with their groups (the Spark runner's batch) come
                # with them: no lookup. Others are looked up, each once, as they go.
                if type(keys) is not list:
                    keys = list(keys)  # iterated twice below
                groups = b._remembered_groups(keys)
                for key, kg in zip(keys, map(cache.get, keys) if groups is None else groups):
                    if kg is None:
                        kg = b._assign(key)
                    ch[kg].add(key)
                    d = maps[kg]
                    if d is None:  # a restored key group not decoded yet (void namespace: maps is t.void)
                        append(restored(t, kg, key, fn, dflt))
                        continue
                    new = fn(d.get(key, dflt))
                    if new is None:
                        d.pop(key, None)
                    else:
                        d[key] = new
                    append(new)
            else:
                for key in keys:
                    kg = cache.get(key)
                    if kg is None:
                        kg = b._assign(key)
                    d = maps[kg]
                    if d is None:  # as above
                        append(restored(t, kg, key, fn, dflt))
                        continue
                    new = fn(d.get(key, dflt))
                    if new is None:
                        d.pop(key, None)
                    else:
                        d[key] = new
                    append(new)
        else:
            for key in keys:
                kg = cache.get(key)
                if kg is None:
                    kg = b._assign(key)
                b._key, b._kg = key, kg
                new = fn(self.value())
                self.update(new)
                append(new)
        if kg is not None:
            b._key, b._kg = key, kg
        return out


class HeapMutableValueState(HeapValueState):
    """Value state whose values may change in place: reads unshare pinned key groups."""

    __slots__ = ()

    def value(self) -> Any:
        d = self._read_dict()
        v = None if d is None else d.get(self._b._key)
        if v is None:
            return self._reg.default_value() if self._copy_default else self._default
        return v


def _checked(values: Iterable[Any], what: str) -> list[Any]:
    out = list(values)
    for v in out:
        if v is None:
            raise ValueError(f"{what}: list state elements cannot be None")
    return out


class HeapListState(_Handle):
    """List state; elements are appended in place to unshared lists."""

    __slots__ = ()

    def get(self) -> list[Any]:
        d = self._read_dict()
        v = None if d is None else d.get(self._b._key)
        return list(v) if v else []

    def add(self, value: Any) -> None:
        if value is None:
            raise ValueError("ListState.add(None): list state elements cannot be None")
        d = self._write_dict()
        key = self._b._key
        lst = d.get(key)
        if lst is None:
            d[key] = [value]
        else:
            lst.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        vals = _checked(values, "ListState.add_all")
        if not vals:
            return
        d = self._write_dict()
        key = self._b._key
        lst = d.get(key)
        if lst is None:
            d[key] = vals
        else:
            lst.extend(vals)

    def update(self, values: Iterable[Any]) -> None:
        vals = _checked(values, "ListState.update")
        d = self._write_dict()
        if vals:
            d[self._b._key] = vals
        else:
            self._pop(d, self._b._kg)

    def merge_namespaces(self, target: Any, sources: Sequence[Any]) -> None:
        merge_list_namespaces(self, target, sources)


class HeapMapState(_Handle):
    """Map state; one dict of user keys per key and namespace."""

    __slots__ = ()

    def _map(self) -> dict[Any, Any] | None:
        d = self._read_dict()
        return None if d is None else d.get(self._b._key)

    def get(self, key: Any) -> Any:
        m = self._map()
        return None if m is None else m.get(key)

    def contains(self, key: Any) -> bool:
        m = self._map()
        return m is not None and key in m

    def put(self, key: Any, value: Any) -> None:
        d = self._write_dict()
        k = self._b._key
        m = d.get(k)
        if m is None:
            d[k] = {key: value}
        else:
            m[key] = value

    def put_all(self, entries: dict[Any, Any]) -> None:
        if not entries:
            return
        d = self._write_dict()
        k = self._b._key
        m = d.get(k)
        if m is None:
            d[k] = dict(entries)
        else:
            m.update(entries)

    def remove(self, key: Any) -> None:
        d = self._write_dict()
        k = self._b._key
        m = d.get(k)
        if m is not None:
            m.pop(key, None)
            if not m:
                self._pop(d, self._b._kg)

    def items(self) -> Iterator[tuple[Any, Any]]:
        m = self._map()
        return iter(list(m.items()) if m else [])

    def keys(self) -> Iterator[Any]:
        m = self._map()
        return iter(list(m) if m else [])

    def values(self) -> Iterator[Any]:
        m = self._map()
        return iter(list(m.values()) if m else [])

    def is_empty(self) -> bool:
        return not self._map()


class HeapKeyedStateBackend(DeltaKeyedBackendBase):
    """Keyed state in Python dicts, per key group; see the module docstring.

    Native snapshots (checkpoints) are a base now and then and a delta per
    checkpoint: the entries written since the last confirmed checkpoint
    (:class:`~statekit.backend_api.DeltaKeyedBackendBase`); writes record
    their key per key group once the first native snapshot is taken.
    """

    backend_name = "heap"
    native_format = "heap-delta-1"
    #: Declared to the kit: a checkpoint's bytes are bounded by the change since the last one plus a constant.
    checkpoint_bytes_follow_change = True

    def __init__(
        self,
        parameters: KeyedBackendParameters | None = None,
        options: Mapping[str, Any] | None = None,
        /,
        **keywords: Any,
    ) -> None:
        """Take the runner's parameters and the heap's options; keywords as KeyedBackendBase."""
        super().__init__(parameters, **keywords)
        opts = options or {}
        self._tables: dict[str, _Table] = {}
        self._heap_tracking = False
        # The keys the runner said its next records are keyed by, per lazy key group (_keys_ahead).
        self._ahead: dict[int, list[Any]] = {}
        self._ahead_round = 0
        self._delta_setup(
            int(opts.get("max-deltas", 10)),
            float(opts.get("max-delta-ratio", 0.5)),
            bool(opts.get("base-in-background", True)),
        )

    def _table(self, reg: RegisteredState) -> _Table:
        cp = _copier(reg)
        # Value handles hand out the stored object itself, so a mutable value
        # must be unshared even on reads; list and map handles only hand out copies.
        deep = cp is not None and (reg.storage_kind is StateKind.VALUE or cp not in (list, dict))
        t = _Table(self.key_group_range, cp, deep=deep)
        t.reg = reg
        if self._heap_tracking:
            t.track()
        self._tables[reg.name] = t
        return t

    def _create_value(self, reg: RegisteredState) -> HeapValueState:
        t = self._table(reg)
        cls = HeapValueState if reg.serializer.immutable else HeapMutableValueState
        return cls(self, t, reg)

    def _create_list(self, reg: RegisteredState) -> HeapListState:
        return HeapListState(self, self._table(reg), reg)

    def _create_map(self, reg: RegisteredState) -> HeapMapState:
        return HeapMapState(self, self._table(reg), reg)

    def _ttl_hook(self, reg: RegisteredState) -> Callable[[], None] | None:
        assert reg.ttl is not None
        n = reg.ttl.cleanup_incremental_size
        if not n:
            return None
        t = self._tables[reg.name]
        ttl_ms = reg.ttl.ttl_ms
        kind = reg.storage_kind
        clock = self.clock

        def cleanup() -> None:
            _cleanup_incremental(t, n, clock(), ttl_ms, kind)

        return cleanup

    def _snapshot_entries(self) -> Callable[[str, int], StateEntries]:
        token = object()
        frozen: dict[str, dict[Any, list[Any]]] = {}
        # The registered states the snapshot writes (core's, as it takes them): a state without a
        # TTL whose key group is all in the void namespace is encoded here, as core would encode it,
        # without a namespace per entry to build and then check (a quarter of a base's time).
        plain = {r.name: r for r in (*self._states.values(), *self._restored.values()) if r.ttl is None}
        # Key groups still held as restored bytes: immutable, so the snapshot reads them as they are.
        lazy: dict[str, tuple[RegisteredState, dict[int, tuple[list[Section], int]], dict[int, _Over]]] = {}
        for name, t in self._tables.items():
            frozen[name] = {ns: list(lst) for ns, lst in t.ns.items()}
            if t.lazy:
                assert t.reg is not None
                # What was read or written by key in a lazy key group is copied: it is small and live.
                over = {kg: dict(p.over) for kg, p in t.partial.items() if p.over}
                lazy[name] = (t.reg, dict(t.lazy), over)
            pins = t.pins
            for kg in t.kgr:
                held = pins[kg]
                if not held:
                    held = pins[kg] = set()
                held.add(token)

        def read(name: str, kg: int) -> Any:
            held = lazy.get(name)
            if held is not None and kg in held[1]:
                return self._heap_restored_entries(held[0], held[1][kg][0], held[2].get(kg), plain.get(name))
            nsl = frozen[name]
            if len(nsl) == 1:
                d = nsl[VOID_NAMESPACE][kg]
                if not d:
                    return [], [], []
                return self._heap_void_entries(d, plain.get(name))
            keys: list[Any] = []
            nss: list[Any] = []
            vals: list[Any] = []
            for ns, lst in nsl.items():
                d = lst[kg]
                if d:
                    keys.extend(d)
                    vals.extend(d.values())
                    nss.extend([ns] * len(d))
            return keys, nss, vals

        read.token = token  # type: ignore[attr-defined]
        read.tables = [self._tables[n] for n in frozen]  # type: ignore[attr-defined]
        return read

    def _release_snapshot(self, reader: Callable[[str, int], StateEntries]) -> None:
        token = reader.token  # type: ignore[attr-defined]
        for t in reader.tables:  # type: ignore[attr-defined]
            pins = t.pins
            for kg in t.kgr:
                held = pins[kg]
                if held:
                    held.discard(token)

    def _load_entries(
        self, reg: RegisteredState, key_group: int, keys: list[Any], namespaces: list[Any], values: list[Any]
    ) -> None:
        t = self._tables[reg.name]
        if key_group in t.lazy:
            self._heap_materialize(t, key_group)
        if t.pins[key_group]:
            t.unshare(key_group)
        _apply(t, key_group, keys, namespaces, values)

    def _load_sections(
        self, reg: RegisteredState, sections: Sequence[tuple[int, Section]]
    ) -> Callable[[], None] | None:
        """Keep each key group's restored sections as bytes where its exact entry count is known.

        Every byte was checked by the restore already. A key group whose count
        is not known (after deltas written without counts) is decoded now, as are
        states with a TTL (expiry drops entries in snapshots and cleanups).
        """
        name = reg.name
        if reg.ttl is not None:
            return None
        by_kg: dict[int, list[Section]] = {}
        for kg, sec in sections:
            by_kg.setdefault(kg, []).append(sec)
        lazy: dict[int, tuple[list[Section], int]] = {}
        eager: list[tuple[int, list[Section]]] = []
        for kg, secs in by_kg.items():
            n = self._delta_restored_count(name, kg, secs)
            if n is None:
                eager.append((kg, secs))
            elif n:
                lazy[kg] = (secs, n)
        decoded = [(kg, [self._decode(reg, sec) for sec in secs]) for kg, secs in eager]  # all, then load

        def load() -> None:
            self._delta_restored_counts_done(name)
            t = self._tables[name]
            for kg, held in lazy.items():
                t.lazy[kg] = held
                t.lazy_entries += held[1]
                t.void[kg] = None  # a lazy key group has no dict until it is decoded
            for kg, entries in decoded:
                for keys, nss, vals in entries:
                    _apply(t, kg, keys, nss, vals)

        return load

    def _heap_materialize(self, t: _Table, kg: int) -> None:
        """Decode key group ``kg``'s restored sections of table ``t`` into its dicts (``kg`` is lazy)."""
        secs, n = t.lazy[kg]
        reg = t.reg
        assert reg is not None
        p = t.partial.get(kg)
        started = perf_counter()
        try:
            decoded = [self._decode(reg, sec) for sec in secs]
        except Exception as e:
            raise StateAccessError(
                f"state {reg.name!r}, key group {kg}: its restored entries ({n}, checked when restored) "
                f"cannot be decoded by its serializer {reg.serializer!r}: {e}; nothing of them was "
                "loaded. Fix the serializer and restore again (the checkpoint is unchanged)"
            ) from e
        del t.lazy[kg]
        t.lazy_entries -= n
        if p is not None:
            del t.partial[kg]
            t.lazy_entries -= p.added
        t.pins[kg] = ()  # its dicts are new: no snapshot shares them
        for keys, nss, vals in decoded:
            _apply(t, kg, keys, nss, vals)
        if t.void[kg] is None:
            t.void[kg] = {}
        if sum(len(lst[kg] or ()) for lst in t.ns.values()) != n:
            raise StateAccessError(
                f"state {reg.name!r}, key group {kg}: its restored sections decoded to "
                f"{sum(len(lst[kg] or ()) for lst in t.ns.values())} entries where the checkpoint "
                f"recorded {n}: the checkpoint is inconsistent; restore an earlier one"
            )
        if p is not None and p.over:
            void = t.void[kg]
            assert void is not None
            void.update(p.over)  # what was read or written since the restore: the newest values
        if n >= _TIMED_DECODE_MIN:
            t.decode_seconds = (perf_counter() - started) / n

    def _heap_partial(self, t: _Table, kg: int) -> _Partial | None:
        """Lazy key group ``kg`` of ``t`` to be read by key, or None once it is decoded (now or before).

        Only a value state's key groups whose sections hold the void namespace
        alone and whose keys can be searched undecoded are read by key; others,
        and one whose lookups have taken as long as its decode would, are decoded here.
        """
        if kg not in t.lazy:
            return None
        p = t.partial.get(kg)
        if p is None:
            started = perf_counter()
            reg = t.reg
            assert reg is not None
            looks: list[SectionLookup] | None = None
            if not t.deep and reg.storage_kind is StateKind.VALUE and reg.ttl is None:
                looks = []
                try:
                    for sec in reversed(t.lazy[kg][0]):
                        look = SectionLookup.of(sec, self.key_serializer, reg.serializer)
                        if look is None:
                            looks = None
                            break
                        looks.append(look)
                except Exception:  # noqa: BLE001 - decoding the key group next reports it
                    looks = None  # with the state and key group named
            if looks is not None:
                budget = t.lazy[kg][1] * t.decode_seconds * _LOOKUP_BUDGET
                p = t.partial[kg] = _Partial(looks, budget)
                p.spent = perf_counter() - started
        if p is None or p.spent >= p.budget:
            self._heap_materialize(t, kg)
            return None
        return p

    def _keys_ahead(self, keys: Sequence[Any], key_groups: Sequence[int]) -> None:
        """Keep the keys of key groups still held as restored bytes, for :meth:`_heap_lookup_many`."""
        self._ahead_round += 1
        lazy = [t.lazy for t in self._tables.values() if t.lazy and not t.deep]
        if not lazy:
            self._ahead = {}
            return
        held = set().union(*lazy) if len(lazy) > 1 else lazy[0]
        ahead: dict[int, list[Any]] = {}
        for key, kg in zip(keys, key_groups):
            if kg in held:
                got = ahead.get(kg)
                if got is None:
                    ahead[kg] = [key]
                else:
                    got.append(key)
        self._ahead = ahead

    def _heap_lookup(self, t: _Table, kg: int, p: _Partial, key: Any) -> Any:
        """The value of ``key`` in partial key group ``kg`` (None: no entry)."""
        v = p.over.get(key)
        if v is not None or key in p.missing:
            return v
        if p.ahead != self._ahead_round:  # the first lookup here since keys were handed over
            p.ahead = self._ahead_round
            ahead = self._ahead.get(kg)
            if ahead is not None and len(ahead) > 1:
                self._heap_lookup_many(t, kg, p, ahead)
                v = p.over.get(key)
                if v is not None or key in p.missing:
                    return v
        started = perf_counter()
        try:
            for look in p.lookups:
                i = look.index(key)
                if i >= 0:
                    if not look.removal:  # else the newest section with the key removed it
                        v = p.over[key] = look.value(i)
                    break
        except SerializationError as e:
            raise _unreadable(t, kg, e) from e
        p.spent += perf_counter() - started
        if v is None:
            p.missing.add(key)
        return v

    def _heap_lookup_many(self, t: _Table, kg: int, p: _Partial, keys: list[Any]) -> None:
        """Look ``keys`` up together in partial key group ``kg``: as :meth:`_heap_lookup` does each."""
        started = perf_counter()
        over, missing = p.over, p.missing
        try:
            todo = [k for k in dict.fromkeys(keys) if k not in over and k not in missing]
        except TypeError:  # an unhashable key: each record's own lookup names it
            return
        try:
            for look in p.lookups:  # newest first: the newest section holding a key decides
                if not todo:
                    break
                rest: list[Any] = []
                for key, i in zip(todo, look.index_many(todo)):
                    if i < 0:
                        rest.append(key)
                        continue
                    v = None if look.removal else look.value(i)
                    if v is None:
                        missing.add(key)
                    else:
                        over[key] = v
                todo = rest
        except SerializationError as e:
            raise _unreadable(t, kg, e) from e
        missing.update(todo)  # in no section
        p.spent += perf_counter() - started

    def _heap_get(self, t: _Table, kg: int, key: Any) -> Any:
        """The value of ``key`` in lazy key group ``kg`` of ``t`` (void namespace; None: no entry)."""
        p = self._heap_partial(t, kg)
        if p is None:
            d = t.void[kg]
            return None if d is None else d.get(key)
        return self._heap_lookup(t, kg, p, key)

    def _heap_put(self, t: _Table, kg: int, key: Any, value: Any) -> None:
        """Store ``value`` (not None) for ``key`` in lazy key group ``kg`` of ``t`` (void namespace)."""
        p = self._heap_partial(t, kg)
        if p is None:
            d = t.void[kg]
            if d is None:
                d = t.void[kg] = {}
            d[key] = value
            return
        over = p.over
        if key not in over:
            if key not in p.missing:
                self._heap_lookup(t, kg, p, key)
            if key in p.missing:  # no section holds it: the key group gains an entry
                p.missing.discard(key)
                p.added += 1
                t.lazy_entries += 1
        over[key] = value

    def _heap_update(self, t: _Table, kg: int, key: Any, fn: Callable[[Any], Any], default: Any) -> Any:
        """``update_batch``'s step for a key of lazy key group ``kg`` (void namespace): the new value."""
        v = self._heap_get(t, kg, key)
        new = fn(default if v is None else v)
        if new is None:
            if kg in t.lazy:
                self._heap_materialize(t, kg)
            d = t.void[kg]
            if d is not None:
                d.pop(key, None)
        else:
            self._heap_put(t, kg, key, new)
        return new

    def _heap_void_entries(self, d: dict[Any, Any], encode_with: RegisteredState | None) -> Any:
        """A snapshot's entries of a void-namespace key group ``d`` (key to value).

        Encoded with ``encode_with`` (the snapshot's registered state, without a
        TTL) as core would encode them, a void-namespace section instead of a
        namespace per entry for core to build and check; as lists without it.
        """
        if encode_with is None:
            return list(d), [VOID_NAMESPACE] * len(d), list(d.values())
        return Section.void(
            encode_with.name,
            len(d),
            self.key_serializer.encode_column(list(d)),
            encode_with.serializer.encode_column(list(d.values())),
        )

    def _heap_restored_entries(
        self,
        reg: RegisteredState,
        secs: list[Section],
        over: dict[Any, Any] | None = None,
        encode_with: RegisteredState | None = None,
    ) -> Any:
        """A lazy key group's entries for a snapshot: its one section as it is, or decoded aside.

        Decoded aside after deltas, or with ``over``, the values read or written by
        key since the restore (void namespace), which win. A merge in the void
        namespace is encoded here with ``encode_with`` (the snapshot's registered
        state, without a TTL), as the snapshot would encode it.
        """
        if not over and len(secs) == 1 and not secs[0].removal:
            return secs[0]
        if all(sec.in_void_namespace for sec in secs):
            # The void namespace throughout (all value states, most others): merged by key alone,
            # without a (namespace, key) tuple per entry (a third of the time).
            by_key: dict[Any, Any] = {}
            for sec in secs:
                keys, _, vals = self._decode(reg, sec)
                if sec.removal:
                    pop = by_key.pop
                    for k in keys:
                        pop(k, None)
                else:
                    by_key.update(zip(keys, vals))
            if over:
                by_key.update(over)
            return self._heap_void_entries(by_key, encode_with)
        merged: dict[tuple[Any, Any], Any] = {}
        for sec in secs:
            keys, nss, vals = self._decode(reg, sec)
            if sec.removal:
                for k, ns in zip(keys, nss):
                    merged.pop((ns, k), None)
            else:
                merged.update(zip(zip(nss, keys), vals))
        if over:
            merged.update(((VOID_NAMESPACE, k), v) for k, v in over.items())
        return [k for _, k in merged], [ns for ns, _ in merged], list(merged.values())

    # --- the delta hooks (DeltaKeyedBackendBase) -------------------------------------

    def _delta_track(self) -> None:
        if not self._heap_tracking:
            self._heap_tracking = True
            for t in self._tables.values():
                t.track()

    def _delta_epoch(self) -> Any:
        return {name: t.track() for name, t in self._tables.items()}

    def _delta_changes(self, epochs: Sequence[Any]) -> dict[str, dict[int, DeltaChanges]]:
        out: dict[str, dict[int, DeltaChanges]] = {}
        for name, t in self._tables.items():
            recorded = [e[name] for e in epochs if name in e and e[name][0] is not None]
            by_kg: dict[int, DeltaChanges] = {}
            for kg in t.kgr:
                voids = [r[0][kg] for r in recorded if r[0][kg]]
                pairs = [r[1][kg] for r in recorded if r[1][kg]]
                if not voids and not pairs:
                    continue
                keys = voids[0] if len(voids) == 1 else set().union(*voids)
                d = t.void[kg]
                size = -1
                if kg in t.lazy:
                    # Written by key since the restore: ``over`` holds each written key's value.
                    p = t.partial.get(kg)
                    if p is None or pairs or not all(k in p.over for k in keys):
                        self._heap_materialize(t, kg)
                        d = t.void[kg]
                    else:
                        d = p.over
                        size = t.lazy[kg][1] + p.added
                c = DeltaChanges([], [], [], [], [])
                if keys:
                    get = d.get if d else {}.get
                    for k in keys:
                        v = get(k)
                        if v is None:
                            c.removed_keys.append(k)
                        else:
                            c.keys.append(k)
                            c.values.append(v)
                    c.namespaces = [VOID_NAMESPACE] * len(c.keys)
                    c.removed_namespaces = [VOID_NAMESPACE] * len(c.removed_keys)
                for ns, k in pairs[0] if len(pairs) == 1 else set().union(*pairs):
                    lst = t.ns.get(ns)
                    dn = None if lst is None else lst[kg]
                    v = None if dn is None else dn.get(k)
                    if v is None:
                        c.removed_keys.append(k)
                        c.removed_namespaces.append(ns)
                    else:
                        c.keys.append(k)
                        c.namespaces.append(ns)
                        c.values.append(v)
                c.size = size if size >= 0 else sum(len(lst[kg] or ()) for lst in t.ns.values())
                by_kg[kg] = c
            if by_kg:
                out[name] = by_kg
        return out

    def _state_keys(self, reg: RegisteredState, namespace: Any) -> Iterator[Any]:
        t = self._tables[reg.name]
        for kg in list(t.lazy):  # iterating a state needs all of it
            self._heap_materialize(t, kg)
        lst = t.ns.get(namespace)
        if lst is None:
            return iter(())
        return (k for d in list(lst) if d for k in list(d))

    def _state_size(self, reg: RegisteredState) -> int:
        return self._tables[reg.name].size()


def _apply(t: _Table, kg: int, keys: list[Any], namespaces: list[Any], values: list[Any]) -> None:
    """Store decoded entries of one key group of ``t`` (a delta's removals if ``values`` is REMOVED)."""
    if values is REMOVED:  # a delta's removals (restores replay them in order)
        for k, ns in zip(keys, namespaces):
            lst = t.ns.get(ns)
            d = None if lst is None else lst[kg]
            if d is not None and d.pop(k, None) is not None and not d:
                t.emptied(ns, lst, kg)  # type: ignore[arg-type]
        return
    if namespaces.count(VOID_NAMESPACE) == len(namespaces):
        d = t.void[kg]
        if d is None:
            d = t.void[kg] = {}
        d.update(zip(keys, values))
        return
    for k, ns, v in zip(keys, namespaces, values):
        lst = t.dicts(ns)
        d = lst[kg]
        if d is None:
            d = lst[kg] = {}
        d[k] = v


def _cleanup_incremental(t: _Table, n: int, now: int, ttl_ms: int, kind: StateKind) -> None:
    """Check up to ``n`` entries for expiry, resuming where the last call stopped."""
    todo = t.cleanup_todo
    kgr = t.kgr
    refills = 0
    while n > 0:
        if not todo:
            if refills > len(kgr):
                return  # a full round found nothing to check
            refills += 1
            kg = t.cleanup_kg
            t.cleanup_kg = kg + 1 if kg < kgr.end else kgr.start
            todo.extend((ns, kg, k) for ns, lst in t.ns.items() if lst[kg] for k in lst[kg])  # type: ignore[union-attr]
            continue
        ns, kg, key = todo.pop()
        n -= 1
        lst = t.ns.get(ns)
        d = None if lst is None else lst[kg]
        v = None if d is None else d.get(key)
        if v is None:
            continue
        live = purge_expired(kind, v, now, ttl_ms)
        if live is v:
            continue
        if t.pins[kg]:
            t.unshare(kg)
        t.touch(ns, kg, key)
        lst = t.ns[ns]
        d = lst[kg]
        assert d is not None
        if live is None:
            del d[key]
            if not d:
                t.emptied(ns, lst, kg)
        else:
            d[key] = live


class HeapStateBackend(DeclaredStateBackend):
    """The ``heap`` state backend: creates heap keyed backends and operator backends."""

    name = "heap"
    declared_options = OPTIONS
    keyed_backend = HeapKeyedStateBackend
