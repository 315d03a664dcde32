"""A plain Python model of keyed and operator state, written from DESIGN.md §4 to §6.

The model stores what a backend stores, entry by entry: per state, per
``(key, namespace)``, the *stored* value (with its last-access timestamp when
the state has TTL: ``(value, ts)`` for values and accumulators, a list of
``(element, ts)`` for lists, ``{user key: (value, ts)}`` for maps). Each
operation applies the documented semantics, including TTL's side effects on
reads, and returns what the backend's handle must return. It shares no code
with core's TTL layer on purpose: it is the second opinion.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..serialization._serializers import serializer_for
from ..state._state import (
    VOID_NAMESPACE,
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateKind,
    StateTtlConfig,
    TtlUpdateType,
    TtlVisibility,
    ValueStateDescriptor,
)

__all__ = [
    "KEYED_STATE_NAMES",
    "NAMESPACES",
    "NAMESPACE_SERIALIZER",
    "VALUE_DEFAULT",
    "KeyedModel",
    "KeyedStateSpec",
    "OperatorModel",
    "SumCount",
    "purge",
]

VALUE_DEFAULT = -1
"""The default of the model's value state."""

NAMESPACES: tuple[Any, ...] = (VOID_NAMESPACE, 1, 2, 3)
"""The namespaces the model uses: the void one and three windows."""

NAMESPACE_SERIALIZER = serializer_for(int)

KEYED_STATE_NAMES = ("value", "list", "reducing", "aggregating", "map")

Slot = tuple[Any, Any]
"""``(key, namespace)``."""


class SumCount(AggregateFunction[int, list[int], tuple[int, int]]):
    """Sum and count of added ints; its accumulator is a list it changes in place.

    Changing the accumulator in place is allowed (``AggregateFunction.add`` may),
    so a backend that shares stored objects with a pending snapshot shows it here.
    """

    def create_accumulator(self) -> list[int]:
        """``[0, 0]``."""
        return [0, 0]

    def add(self, value: int, accumulator: list[int]) -> list[int]:
        """Adds in place."""
        accumulator[0] += value
        accumulator[1] += 1
        return accumulator

    def get_result(self, accumulator: list[int]) -> tuple[int, int]:
        """``(sum, count)``."""
        return (accumulator[0], accumulator[1])

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        """A new accumulator of both."""
        return [a[0] + b[0], a[1] + b[1]]


@dataclass(frozen=True)
class KeyedStateSpec:
    """One keyed state of the model: its name (= its kind) and TTL."""

    kind: StateKind
    ttl: StateTtlConfig | None = None

    @property
    def name(self) -> str:
        """The state's name, which is its kind."""
        return self.kind.value

    def descriptor(self) -> StateDescriptor:
        """A fresh descriptor of the state (aggregate functions are not shared)."""
        ttl = self.ttl
        if self.kind is StateKind.VALUE:
            return ValueStateDescriptor("value", int, default=VALUE_DEFAULT, ttl=ttl)
        if self.kind is StateKind.LIST:
            return ListStateDescriptor("list", int, ttl=ttl)
        if self.kind is StateKind.REDUCING:
            return ReducingStateDescriptor("reducing", operator.add, int, ttl=ttl)
        if self.kind is StateKind.AGGREGATING:
            return AggregatingStateDescriptor("aggregating", SumCount(), list[int], ttl=ttl)
        return MapStateDescriptor("map", str, int, ttl=ttl)

    @property
    def ttl_ms(self) -> int:
        """The TTL in ms (only for TTL states)."""
        assert self.ttl is not None
        return self.ttl.ttl_ms

    @property
    def refresh_on_read(self) -> bool:
        """Whether reads refresh timestamps."""
        return self.ttl is not None and self.ttl.update_type is TtlUpdateType.ON_READ_AND_WRITE

    @property
    def return_expired(self) -> bool:
        """Whether an expired entry not yet cleaned up is returned (once)."""
        return self.ttl is not None and self.ttl.visibility is TtlVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP

    @property
    def cleans_incrementally(self) -> bool:
        """Whether the backend may drop expired entries at any state access."""
        return self.ttl is not None and self.ttl.cleanup_incremental_size > 0

    @property
    def cleans_full_snapshots(self) -> bool:
        """Whether full snapshots leave expired entries out."""
        return self.ttl is not None and self.ttl.cleanup_full_snapshot


def purge(spec: KeyedStateSpec, stored: Any, now: int) -> Any:
    """``stored`` without its parts expired at ``now``; None when nothing is left."""
    if spec.ttl is None:
        return stored
    limit = now - spec.ttl_ms
    if spec.kind is StateKind.LIST:
        live = [e for e in stored if e[1] > limit]
        return live or None
    if spec.kind is StateKind.MAP:
        live_map = {k: e for k, e in stored.items() if e[1] > limit}
        return live_map or None
    return stored if stored[1] > limit else None


class KeyedModel:
    """The expected keyed state of a whole job (every subtask together)."""

    def __init__(self, specs: Sequence[KeyedStateSpec], clock: Callable[[], int]) -> None:
        """An empty model of ``specs``, reading time from ``clock``."""
        self.specs = {s.name: s for s in specs}
        self.clock = clock
        self.entries: dict[str, dict[Slot, Any]] = {s.name: {} for s in specs}

    # --- copies, for snapshots ----------------------------------------------------------------

    def copy_entries(self) -> dict[str, dict[Slot, Any]]:
        """A deep copy of every stored entry."""
        return copy.deepcopy(self.entries)

    def snapshot_view(
        self, entries: Mapping[str, Mapping[Slot, Any]], now: int
    ) -> dict[str, dict[Slot, Any]]:
        """What a full snapshot taken at ``now`` holds: expired parts left out where the state says so."""
        out: dict[str, dict[Slot, Any]] = {}
        for name, table in entries.items():
            spec = self.specs[name]
            if spec.cleans_full_snapshots:
                purged = {slot: purge(spec, v, now) for slot, v in table.items()}
                out[name] = {slot: v for slot, v in purged.items() if v is not None}
            else:
                out[name] = copy.deepcopy(dict(table))
        return out

    def restore_from(self, entries: Mapping[str, Mapping[Slot, Any]], now: int) -> None:
        """Become what a backend restored from a snapshot of ``entries`` taken at ``now`` holds."""
        self.entries = self.snapshot_view(entries, now)

    # --- TTL building blocks: one stored value (values, reducing, aggregating) -----------------

    def _default(self, spec: KeyedStateSpec) -> Any:
        return VALUE_DEFAULT if spec.kind is StateKind.VALUE else None

    def _read_value(self, spec: KeyedStateSpec, slot: Slot) -> Any:
        table = self.entries[spec.name]
        stored = table.get(slot)
        if spec.ttl is None:
            return self._default(spec) if stored is None else copy.deepcopy(stored)
        if stored is None:
            return self._default(spec)
        v, ts = stored
        now = self.clock()
        if ts + spec.ttl_ms <= now:
            del table[slot]
            return copy.deepcopy(v) if spec.return_expired else self._default(spec)
        if spec.refresh_on_read:
            table[slot] = (v, now)
        return copy.deepcopy(v)

    def _write_value(self, spec: KeyedStateSpec, slot: Slot, value: Any) -> None:
        table = self.entries[spec.name]
        if value is None:
            table.pop(slot, None)
        else:
            table[slot] = value if spec.ttl is None else (value, self.clock())

    # --- value ----------------------------------------------------------------------------------

    def value_get(self, key: Any, ns: Any) -> Any:
        """``ValueState.value()``."""
        return self._read_value(self.specs["value"], (key, ns))

    def value_update(self, key: Any, ns: Any, value: Any) -> None:
        """``ValueState.update(value)``; None clears."""
        self._write_value(self.specs["value"], (key, ns), value)

    def clear(self, name: str, key: Any, ns: Any) -> None:
        """``clear()`` of any state: the current key and namespace only."""
        self.entries[name].pop((key, ns), None)

    # --- reducing and aggregating ---------------------------------------------------------------

    def reducing_get(self, key: Any, ns: Any) -> Any:
        """``ReducingState.get()``."""
        return self._read_value(self.specs["reducing"], (key, ns))

    def reducing_add(self, key: Any, ns: Any, value: int) -> None:
        """``ReducingState.add(value)`` with ``operator.add``."""
        spec = self.specs["reducing"]
        cur = self._read_value(spec, (key, ns))
        self._write_value(spec, (key, ns), value if cur is None else cur + value)

    def aggregating_get(self, key: Any, ns: Any) -> Any:
        """``AggregatingState.get()`` of :class:`SumCount`."""
        acc = self._read_value(self.specs["aggregating"], (key, ns))
        return None if acc is None else (acc[0], acc[1])

    def aggregating_add(self, key: Any, ns: Any, value: int) -> None:
        """``AggregatingState.add(value)`` of :class:`SumCount`."""
        spec = self.specs["aggregating"]
        acc = self._read_value(spec, (key, ns))
        acc = [0, 0] if acc is None else acc
        self._write_value(spec, (key, ns), [acc[0] + value, acc[1] + 1])

    def _merge_values(self, name: str, key: Any, target: Any, sources: Sequence[Any]) -> None:
        spec = self.specs[name]
        if not sources:
            return

        def combine(a: Any, b: Any) -> Any:
            return a + b if name == "reducing" else [a[0] + b[0], a[1] + b[1]]

        acc = None
        for ns in sources:
            x = self._read_value(spec, (key, ns))
            if x is not None:
                self.entries[name].pop((key, ns), None)
                acc = x if acc is None else combine(acc, x)
        if acc is not None:
            cur = self._read_value(spec, (key, target))
            self._write_value(spec, (key, target), acc if cur is None else combine(cur, acc))

    # --- list -----------------------------------------------------------------------------------

    def list_get(self, key: Any, ns: Any) -> list[Any]:
        """``ListState.get()``."""
        spec = self.specs["list"]
        table = self.entries["list"]
        stored = table.get((key, ns))
        if not stored:
            return []
        if spec.ttl is None:
            return list(stored)
        now = self.clock()
        limit = now - spec.ttl_ms
        live = [e for e in stored if e[1] > limit]
        if len(live) != len(stored):
            if live:
                table[(key, ns)] = live
            else:
                del table[(key, ns)]
            if spec.return_expired:
                return [v for v, _ in stored]
        if spec.refresh_on_read and live:
            table[(key, ns)] = [(v, now) for v, _ in live]
        return [v for v, _ in live]

    def _stamp(self, spec: KeyedStateSpec, values: Sequence[Any]) -> list[Any]:
        if spec.ttl is None:
            return list(values)
        now = self.clock()
        return [(v, now) for v in values]

    def list_add_all(self, key: Any, ns: Any, values: Sequence[int]) -> None:
        """``ListState.add_all(values)`` (and ``add`` of one)."""
        if values:
            spec = self.specs["list"]
            table = self.entries["list"]
            table[(key, ns)] = [*table.get((key, ns), []), *self._stamp(spec, values)]

    def list_update(self, key: Any, ns: Any, values: Sequence[int]) -> None:
        """``ListState.update(values)``; an empty list clears."""
        table = self.entries["list"]
        if values:
            table[(key, ns)] = self._stamp(self.specs["list"], values)
        else:
            table.pop((key, ns), None)

    def merge(self, name: str, key: Any, target: Any, sources: Sequence[Any]) -> None:
        """``merge_namespaces(target, sources)`` of list, reducing or aggregating state.

        Lists: the target's elements, then each source's in the order given
        (elements keep their timestamps); the sources are cleared.
        """
        if name != "list":
            self._merge_values(name, key, target, sources)
            return
        table = self.entries["list"]
        merged: list[Any] = []
        for ns in sources:
            items = table.pop((key, ns), None)
            if items:
                merged.extend(items)
        if merged:
            table[(key, target)] = [*table.get((key, target), []), *merged]

    # --- map ------------------------------------------------------------------------------------

    def _map_entries(self, key: Any, ns: Any) -> list[tuple[Any, Any]]:
        """What ``items()`` returns, with TTL's side effects."""
        spec = self.specs["map"]
        table = self.entries["map"]
        stored = table.get((key, ns))
        if not stored:
            return []
        if spec.ttl is None:
            return list(stored.items())
        now = self.clock()
        limit = now - spec.ttl_ms
        out = []
        live = {}
        for uk, (v, ts) in stored.items():
            if ts <= limit:
                if spec.return_expired:
                    out.append((uk, v))
            else:
                out.append((uk, v))
                live[uk] = (v, now) if spec.refresh_on_read else (v, ts)
        if live:
            table[(key, ns)] = live
        else:
            del table[(key, ns)]
        return out

    def _map_lookup(self, key: Any, ns: Any, uk: str) -> tuple[bool, Any]:
        """``(found, value)`` of one user key, with TTL's side effects."""
        spec = self.specs["map"]
        table = self.entries["map"]
        m = table.get((key, ns))
        if m is None or uk not in m:
            return False, None
        if spec.ttl is None:
            return True, m[uk]
        v, ts = m[uk]
        now = self.clock()
        if ts + spec.ttl_ms <= now:
            del m[uk]
            if not m:
                del table[(key, ns)]
            return spec.return_expired, v if spec.return_expired else None
        if spec.refresh_on_read:
            m[uk] = (v, now)
        return True, v

    def map_get(self, key: Any, ns: Any, uk: str) -> Any:
        """``MapState.get(uk)``."""
        return self._map_lookup(key, ns, uk)[1]

    def map_contains(self, key: Any, ns: Any, uk: str) -> bool:
        """``MapState.contains(uk)``."""
        return self._map_lookup(key, ns, uk)[0]

    def map_items(self, key: Any, ns: Any) -> dict[Any, Any]:
        """``dict(MapState.items())``."""
        return dict(self._map_entries(key, ns))

    def map_is_empty(self, key: Any, ns: Any) -> bool:
        """``MapState.is_empty()``."""
        return not self._map_entries(key, ns)

    def map_put_all(self, key: Any, ns: Any, entries: Mapping[str, Any]) -> None:
        """``MapState.put_all(entries)`` (and ``put`` of one); None is a value."""
        if not entries:
            return
        spec = self.specs["map"]
        table = self.entries["map"]
        m = dict(table.get((key, ns), {}))
        now = self.clock()
        for uk, v in entries.items():
            m[uk] = v if spec.ttl is None else (v, now)
        table[(key, ns)] = m

    def map_remove(self, key: Any, ns: Any, uk: str) -> None:
        """``MapState.remove(uk)``; removing the last entry removes the state."""
        table = self.entries["map"]
        m = table.get((key, ns))
        if m is not None and uk in m:
            del m[uk]
            if not m:
                del table[(key, ns)]

    # --- what the backend must hold -----------------------------------------------------------

    def expected_entries(self, name: str, now: int) -> dict[Slot, Any]:
        """The entries of ``name`` a backend must hold, comparable with :meth:`comparable`."""
        return self.comparable(name, self.entries[name], now)

    def comparable(self, name: str, table: Mapping[Slot, Any], now: int) -> dict[Slot, Any]:
        """``table`` made comparable: where the backend may clean up any time, only live parts count."""
        spec = self.specs[name]
        if not spec.cleans_incrementally:
            return dict(table)
        purged = {slot: purge(spec, v, now) for slot, v in table.items()}
        return {slot: v for slot, v in purged.items() if v is not None}


@dataclass
class OperatorModel:
    """The expected operator state of every subtask: even-split and union lists, a broadcast map."""

    split: list[list[int]]
    union: list[list[int]]
    broadcast: list[dict[str, int]]

    @classmethod
    def empty(cls, parallelism: int) -> OperatorModel:
        """No state on ``parallelism`` subtasks."""
        return cls(
            [[] for _ in range(parallelism)],
            [[] for _ in range(parallelism)],
            [{} for _ in range(parallelism)],
        )

    @property
    def parallelism(self) -> int:
        """The number of subtasks."""
        return len(self.split)

    def copy(self) -> OperatorModel:
        """A deep copy."""
        return copy.deepcopy(self)

    def redistributed(self, new_parallelism: int) -> OperatorModel:
        """The state of ``new_parallelism`` subtasks after a restore (DESIGN.md §4)."""
        everything = [x for lst in self.split for x in lst]
        base, extra = divmod(len(everything), new_parallelism)
        split, pos = [], 0
        for i in range(new_parallelism):
            n = base + (1 if i < extra else 0)
            split.append(everything[pos : pos + n])
            pos += n
        union_all = [x for lst in self.union for x in lst]
        union = [list(union_all) for _ in range(new_parallelism)]
        broadcast = [dict(self.broadcast[i % self.parallelism]) for i in range(new_parallelism)]
        return OperatorModel(split, union, broadcast)
