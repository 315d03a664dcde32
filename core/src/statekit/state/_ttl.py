"""Time-to-live for keyed state: wrappers that stamp and check entries.

A TTL state stores ``(value, last_access_ms)`` per entry: per value for value,
reducing and aggregating state, per element for lists, per entry for maps.
The wrappers here add TTL to any backend's plain handles, as Flink's
``TtlStateFactory`` does, so a backend only stores what it is given.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ..serialization._serializers import (
    DictSerializer,
    IntSerializer,
    ListSerializer,
    TupleSerializer,
    TypeSerializer,
)
from ._state import (
    StateKind,
    StateTtlConfig,
    TtlUpdateType,
    TtlVisibility,
    ValueState,
    list_elements,
)

__all__ = [
    "Clock",
    "TtlListState",
    "TtlMapState",
    "TtlValueState",
    "purge_expired",
    "system_clock",
    "ttl_serializer",
]

Clock = Callable[[], int]
"""Returns the current processing time in milliseconds."""


def system_clock() -> int:
    """Milliseconds since the epoch, from the system clock."""
    return time.time_ns() // 1_000_000


def ttl_serializer(kind: StateKind, stored: TypeSerializer) -> TypeSerializer:
    """The serializer of a TTL state's stored entries, given the plain one."""
    stamp = IntSerializer()
    if kind is StateKind.LIST:
        assert isinstance(stored, ListSerializer)
        return ListSerializer(TupleSerializer([stored.element, stamp]))
    if kind is StateKind.MAP:
        assert isinstance(stored, DictSerializer)
        return DictSerializer(stored.key, TupleSerializer([stored.value, stamp]))
    return TupleSerializer([stored, stamp])


def purge_expired(kind: StateKind, stored: Any, now: int, ttl_ms: int) -> Any:
    """``stored`` without its expired parts; None when nothing is left.

    Returns ``stored`` itself when nothing expired, so callers can test identity.
    """
    limit = now - ttl_ms  # expired when ts + ttl <= now, i.e. ts <= limit
    if kind is StateKind.LIST:
        live = [e for e in stored if e[1] > limit]
        return stored if len(live) == len(stored) else (live or None)
    if kind is StateKind.MAP:
        live_map = {k: e for k, e in stored.items() if e[1] > limit}
        return stored if len(live_map) == len(stored) else (live_map or None)
    return stored if stored[1] > limit else None


class _Ttl:
    __slots__ = ("_clock", "_on_access", "_raw", "_refresh", "_return_expired", "_ttl")

    def __init__(
        self, raw: Any, cfg: StateTtlConfig, clock: Clock, on_access: Callable[[], None] | None
    ) -> None:
        self._raw = raw
        self._ttl = cfg.ttl_ms
        self._clock = clock
        self._refresh = cfg.update_type is TtlUpdateType.ON_READ_AND_WRITE
        self._return_expired = cfg.visibility is TtlVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP
        self._on_access = on_access

    def _touch(self) -> None:
        if self._on_access is not None:
            self._on_access()

    def set_current_namespace(self, namespace: Any) -> None:
        self._raw.set_current_namespace(namespace)

    def clear(self) -> None:
        self._touch()
        self._raw.clear()


class TtlValueState(_Ttl):
    """A value state with TTL over a plain value state storing ``(value, ts)``.

    Also the base of TTL reducing and aggregating state, which core builds on
    top of value state.
    """

    __slots__ = ("_default",)

    def __init__(
        self,
        raw: ValueState[Any],
        cfg: StateTtlConfig,
        clock: Clock,
        on_access: Callable[[], None] | None,
        default: Callable[[], Any],
    ) -> None:
        super().__init__(raw, cfg, clock, on_access)
        self._default = default

    def value(self) -> Any:
        self._touch()
        tv = self._raw.value()
        if tv is None:
            return self._default()
        v, ts = tv
        now = self._clock()
        if ts + self._ttl <= now:
            self._raw.clear()
            return v if self._return_expired else self._default()
        if self._refresh:
            self._raw.update((v, now))
        return v

    def update(self, value: Any) -> None:
        self._touch()
        if value is None:
            self._raw.clear()
        else:
            self._raw.update((value, self._clock()))


class TtlListState(_Ttl):
    """A list state with TTL per element, over a plain list of ``(element, ts)``."""

    __slots__ = ()

    def get(self) -> list[Any]:
        self._touch()
        items = self._raw.get()
        if not items:
            return []
        now = self._clock()
        limit = now - self._ttl
        live = [it for it in items if it[1] > limit]
        if len(live) != len(items):
            self._raw.update(live)
            if self._return_expired:
                return [v for v, _ in items]
        if self._refresh and live:
            self._raw.update([(v, now) for v, _ in live])
        return [v for v, _ in live]

    def add(self, value: Any) -> None:
        if value is None:
            raise ValueError("ListState.add(None): list state elements cannot be None")
        self._touch()
        self._raw.add((value, self._clock()))

    def add_all(self, values: Iterable[Any]) -> None:
        vals = list_elements(values, "ListState.add_all")
        if vals:
            self._touch()
            now = self._clock()
            self._raw.add_all([(v, now) for v in vals])

    def update(self, values: Iterable[Any]) -> None:
        vals = list_elements(values, "ListState.update")
        self._touch()
        now = self._clock()
        self._raw.update([(v, now) for v in vals])

    def merge_namespaces(self, target: Any, sources: Sequence[Any]) -> None:
        # Elements keep their own timestamps; expired ones drop out on read.
        self._touch()
        self._raw.merge_namespaces(target, sources)


class TtlMapState(_Ttl):
    """A map state with TTL per entry, over a plain map of ``key -> (value, ts)``."""

    __slots__ = ()

    def _live(self, key: Any, tv: Any, now: int) -> tuple[bool, Any]:
        v, ts = tv
        if ts + self._ttl <= now:
            self._raw.remove(key)
            return self._return_expired, v
        if self._refresh:
            self._raw.put(key, (v, now))
        return True, v

    def get(self, key: Any) -> Any:
        self._touch()
        tv = self._raw.get(key)
        if tv is None:
            return None
        ok, v = self._live(key, tv, self._clock())
        return v if ok else None

    def contains(self, key: Any) -> bool:
        self._touch()
        tv = self._raw.get(key)
        return tv is not None and self._live(key, tv, self._clock())[0]

    def put(self, key: Any, value: Any) -> None:
        self._touch()
        self._raw.put(key, (value, self._clock()))

    def put_all(self, entries: dict[Any, Any]) -> None:
        self._touch()
        now = self._clock()
        self._raw.put_all({k: (v, now) for k, v in entries.items()})

    def remove(self, key: Any) -> None:
        self._touch()
        self._raw.remove(key)

    def _entries(self) -> list[tuple[Any, Any]]:
        self._touch()
        now = self._clock()
        limit = now - self._ttl
        out, expired, seen = [], [], []
        for k, (v, ts) in list(self._raw.items()):
            if ts <= limit:
                expired.append(k)
                if self._return_expired:
                    out.append((k, v))
            else:
                out.append((k, v))
                seen.append(k)
        for k in expired:
            self._raw.remove(k)
        if self._refresh and seen:
            self._raw.put_all({k: (v, now) for k, v in out if k in set(seen)})
        return out

    def items(self) -> Iterator[tuple[Any, Any]]:
        return iter(self._entries())

    def keys(self) -> Iterator[Any]:
        return (k for k, _ in self._entries())

    def values(self) -> Iterator[Any]:
        return (v for _, v in self._entries())

    def is_empty(self) -> bool:
        return not self._entries()
