"""Kit tests of time-to-live (DESIGN.md §6) with a manual clock, on any backend.

Cleanup that a backend may do on its own (incremental, or native background
cleanup) is only checked for safety: it never removes a live entry and never
changes a pending snapshot. How much it removes is the backend's business.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from .._contracts import SupportsNativeSnapshot
from .._errors import StateAccessError
from ..serialization._serializers import serializer_for
from ..state._state import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateTtlConfig,
    TtlUpdateType,
    TtlVisibility,
    ValueStateDescriptor,
)
from ._clock import ManualClock
from ._job import snapshot_handle, write_snapshot

__all__ = ["TtlSemantics"]

TTL_MS = 100


def ttl(
    *,
    update: TtlUpdateType = TtlUpdateType.ON_CREATE_AND_WRITE,
    visibility: TtlVisibility = TtlVisibility.NEVER_RETURN_EXPIRED,
    full_snapshot: bool = False,
    incremental: int = 0,
) -> StateTtlConfig:
    """A TTL of :data:`TTL_MS` ms with the given settings."""
    return StateTtlConfig(
        timedelta(milliseconds=TTL_MS),
        update_type=update,
        visibility=visibility,
        cleanup_full_snapshot=full_snapshot,
        cleanup_incremental_size=incremental,
    )


READ_REFRESHES = ttl(update=TtlUpdateType.ON_READ_AND_WRITE)
RETURN_EXPIRED = ttl(visibility=TtlVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP)


class SumToList(AggregateFunction[int, list[int], int]):
    """Sums ints; the accumulator is a one-element list."""

    def create_accumulator(self) -> list[int]:
        """``[0]``."""
        return [0]

    def add(self, value: int, accumulator: list[int]) -> list[int]:
        """A new accumulator with ``value`` added."""
        return [accumulator[0] + value]

    def get_result(self, accumulator: list[int]) -> int:
        """The sum."""
        return accumulator[0]

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        """Both sums."""
        return [a[0] + b[0]]


REDUCING_OR_AGGREGATING: dict[str, Callable[[StateTtlConfig], StateDescriptor]] = {
    "reducing": lambda cfg: ReducingStateDescriptor("s", operator.add, int, ttl=cfg),
    "aggregating": lambda cfg: AggregatingStateDescriptor("s", SumToList(), list[int], ttl=cfg),
}

TTL_KINDS: dict[str, tuple[Callable[[], StateDescriptor], Callable[[Any], Any]]] = {
    "value": (lambda: ValueStateDescriptor("s", int, ttl=ttl()), lambda s: s.value()),
    "list": (lambda: ListStateDescriptor("s", int, ttl=ttl()), lambda s: s.add(1)),
    "reducing": (lambda: ReducingStateDescriptor("s", operator.add, int, ttl=ttl()), lambda s: s.add(1)),
    "aggregating": (
        lambda: AggregatingStateDescriptor("s", SumToList(), list[int], ttl=ttl()),
        lambda s: s.get(),
    ),
    "map": (lambda: MapStateDescriptor("s", str, int, ttl=ttl()), lambda s: s.put("x", 1)),
}

SWITCHES: dict[
    str,
    tuple[
        Callable[[], StateDescriptor],
        Callable[[], StateDescriptor],
        Callable[[Any], Any],
        Callable[[Any], Any],
    ],
] = {
    "value": (
        lambda: ValueStateDescriptor("s", int),
        lambda: ValueStateDescriptor("s", int, ttl=ttl()),
        lambda s: s.update(7),
        lambda s: s.value(),
    ),
    "list": (
        lambda: ListStateDescriptor("s", int),
        lambda: ListStateDescriptor("s", int, ttl=ttl()),
        lambda s: s.add_all([7, 8]),
        lambda s: s.get(),
    ),
    "map": (
        lambda: MapStateDescriptor("s", str, int),
        lambda: MapStateDescriptor("s", str, int, ttl=ttl()),
        lambda s: s.put("x", 7),
        lambda s: dict(s.items()),
    ),
    "reducing": (
        lambda: ReducingStateDescriptor("s", operator.add, int),
        lambda: ReducingStateDescriptor("s", operator.add, int, ttl=ttl()),
        lambda s: s.add(7),
        lambda s: s.get(),
    ),
    "aggregating": (
        lambda: AggregatingStateDescriptor("s", SumToList(), list[int]),
        lambda: AggregatingStateDescriptor("s", SumToList(), list[int], ttl=ttl()),
        lambda s: s.add(7),
        lambda s: s.get(),
    ),
}


SWITCH_EMPTY: dict[str, Any] = {"value": None, "list": [], "map": {}, "reducing": None, "aggregating": None}
"""What each kind of :data:`SWITCHES` reads once its entry is gone."""


def _restore_copy(make_backend: Any, source: Any, *descriptors: StateDescriptor) -> tuple[Any, list[Any]]:
    """A new backend restored from ``source``'s snapshot, with ``descriptors`` declared first."""
    handle = snapshot_handle(source)
    target = make_backend()
    states = [target.get_state(d) for d in descriptors]
    target.restore([handle])
    return target, states


def _aged_descs(cfg: StateTtlConfig) -> tuple[StateDescriptor, ...]:
    return (
        ValueStateDescriptor("v", int, ttl=cfg),
        ListStateDescriptor("l", int, ttl=cfg),
        MapStateDescriptor("m", str, int, ttl=cfg),
    )


def _write_aged(backend: Any, clock: ManualClock, descs: tuple[StateDescriptor, ...]) -> None:
    """Keys old0..old4 written at t, new0..new2 at t+50; then time moves to t+100."""
    v, lst, m = (backend.get_state(d) for d in descs)
    for i in range(5):
        backend.set_current_key(f"old{i}")
        v.update(i)
        lst.add(i)
        m.put("x", i)
    clock.advance(50)
    for i in range(3):
        backend.set_current_key(f"new{i}")
        v.update(i)
        lst.add(i)
        m.put("x", i)
    backend.set_current_key("old0")
    lst.add(99)  # a list with one expired and one live element
    m.put("y", 99)  # a map with one expired and one live entry
    clock.advance(50)


class TtlSemantics:
    """DESIGN.md §6: expiry, update types, visibility, per element and per entry, cleanup, restores.

    Long on purpose: a test suite class, one short test per rule of §6, grouped
    in the ``# ---`` sections below. A plugin's test class inherits every test
    from the kit classes at once, so splitting this one would only scatter the
    rules of one subject over several files.
    """

    # --- expiry -------------------------------------------------------------------------------

    def test_value_expires_exactly_at_last_access_plus_ttl(self, backend: Any, clock: ManualClock) -> None:
        s = backend.get_state(ValueStateDescriptor("v", int, ttl=ttl()))
        backend.set_current_key("a")
        s.update(1)  # at 1000
        clock.advance(TTL_MS - 1)
        assert s.value() == 1  # 1000 + 100 > 1099
        clock.advance(1)
        assert s.value() is None  # 1000 + 100 <= 1100
        assert backend.num_entries("v") == 0  # the read cleaned up

    def test_value_expired_returns_fresh_default(self, backend: Any, clock: ManualClock) -> None:
        s = backend.get_state(ValueStateDescriptor("v", list[int], default=[], ttl=ttl()))
        backend.set_current_key("a")
        assert s.value() == []
        s.value().append(1)
        assert s.value() == []
        s.update([1, 2])
        clock.advance(TTL_MS)
        got = s.value()
        assert got == []
        got.append(3)
        assert s.value() == []

    def test_write_refreshes_on_create_and_write(self, backend: Any, clock: ManualClock) -> None:
        s = backend.get_state(ValueStateDescriptor("v", int, ttl=ttl()))
        backend.set_current_key("a")
        s.update(1)
        clock.advance(60)
        s.update(2)  # now 1060: expires at 1160
        clock.advance(60)
        assert s.value() == 2
        clock.advance(40)
        assert s.value() is None

    def test_read_does_not_refresh_on_create_and_write(self, backend: Any, clock: ManualClock) -> None:
        s = backend.get_state(ValueStateDescriptor("v", int, ttl=ttl()))
        backend.set_current_key("a")
        s.update(1)
        clock.advance(60)
        assert s.value() == 1
        clock.advance(40)
        assert s.value() is None

    def test_read_refreshes_on_read_and_write(self, backend: Any, clock: ManualClock) -> None:
        s = backend.get_state(ValueStateDescriptor("v", int, ttl=READ_REFRESHES))
        backend.set_current_key("a")
        s.update(1)
        clock.advance(60)
        assert s.value() == 1  # now 1060: expires at 1160
        clock.advance(99)
        assert s.value() == 1  # 1159, and refreshed again: expires at 1259
        clock.advance(100)
        assert s.value() is None

    def test_never_return_expired(self, backend: Any, clock: ManualClock) -> None:
        s = backend.get_state(ValueStateDescriptor("v", int, default=-1, ttl=ttl()))
        backend.set_current_key("a")
        s.update(1)
        clock.advance(TTL_MS)
        assert s.value() == -1

    def test_return_expired_if_not_cleaned_up(self, backend: Any, clock: ManualClock) -> None:
        s = backend.get_state(ValueStateDescriptor("v", int, default=-1, ttl=RETURN_EXPIRED))
        backend.set_current_key("a")
        s.update(1)
        clock.advance(TTL_MS)
        assert s.value() in (1, -1)  # 1 unless the backend cleaned it up already
        assert backend.num_entries("v") == 0
        assert s.value() == -1

    # --- lists: per element --------------------------------------------------------------------

    def test_list_ttl_is_per_element(self, backend: Any, clock: ManualClock) -> None:
        s = backend.get_state(ListStateDescriptor("l", int, ttl=ttl()))
        backend.set_current_key("a")
        s.add(1)  # 1000
        clock.advance(50)
        s.add_all([2, 3])  # 1050
        clock.advance(49)
        assert s.get() == [1, 2, 3]  # 1099
        clock.advance(1)
        assert s.get() == [2, 3]  # 1100: element 1 expired
        assert backend.num_entries("l") == 1
        clock.advance(50)
        assert s.get() == []
        assert backend.num_entries("l") == 0

    def test_list_update_restamps_every_element(self, backend: Any, clock: ManualClock) -> None:
        s = backend.get_state(ListStateDescriptor("l", int, ttl=ttl()))
        backend.set_current_key("a")
        s.add(1)
        clock.advance(90)
        s.update([1, 2])
        clock.advance(90)
        assert s.get() == [1, 2]
        clock.advance(10)
        assert s.get() == []

    def test_list_read_refreshes_on_read_and_write(self, backend: Any, clock: ManualClock) -> None:
        s = backend.get_state(ListStateDescriptor("l", int, ttl=READ_REFRESHES))
        backend.set_current_key("a")
        s.add(1)
        clock.advance(50)
        s.add(2)
        clock.advance(40)
        assert s.get() == [1, 2]  # 1090: both refreshed
        clock.advance(99)
        assert s.get() == [1, 2]
        clock.advance(100)
        assert s.get() == []

    def test_list_return_expired_if_not_cleaned_up(self, backend: Any, clock: ManualClock) -> None:
        s = backend.get_state(ListStateDescriptor("l", int, ttl=RETURN_EXPIRED))
        backend.set_current_key("a")
        s.add(1)
        clock.advance(50)
        s.add(2)
        clock.advance(50)
        assert s.get() == [1, 2]  # element 1 expired, returned once
        assert s.get() == [2]

    # --- maps: per entry -------------------------------------------------------------------------

    def test_map_ttl_is_per_entry(self, backend: Any, clock: ManualClock) -> None:
        s = backend.get_state(MapStateDescriptor("m", str, int, ttl=ttl()))
        backend.set_current_key("a")
        s.put("x", 1)  # 1000
        clock.advance(50)
        s.put_all({"y": 2, "z": None})  # 1050
        clock.advance(50)  # 1100: x expired
        assert s.get("x") is None
        assert not s.contains("x")
        assert s.contains("z") and s.get("z") is None
        assert dict(s.items()) == {"y": 2, "z": None}
        assert sorted(s.keys()) == ["y", "z"]
        assert sorted(s.values(), key=repr) == [2, None]
        assert not s.is_empty()
        clock.advance(50)  # 1150: all expired
        assert s.is_empty()
        assert list(s.items()) == []
        assert backend.num_entries("m") == 0

    def test_map_put_refreshes_one_entry(self, backend: Any, clock: ManualClock) -> None:
        s = backend.get_state(MapStateDescriptor("m", str, int, ttl=ttl()))
        backend.set_current_key("a")
        s.put_all({"x": 1, "y": 2})
        clock.advance(60)
        s.put("x", 3)
        assert s.get("y") == 2  # a read does not refresh y
        clock.advance(40)
        assert dict(s.items()) == {"x": 3}

    def test_map_read_refreshes_on_read_and_write(self, backend: Any, clock: ManualClock) -> None:
        s = backend.get_state(MapStateDescriptor("m", str, int, ttl=READ_REFRESHES))
        backend.set_current_key("a")
        s.put_all({"x": 1, "y": 2})
        clock.advance(60)
        assert s.get("x") == 1  # refreshes x only
        clock.advance(40)
        assert dict(s.items()) == {"x": 1}
        clock.advance(59)
        assert list(s.keys()) == ["x"]  # 1159: x refreshed at 1100 by items()
        clock.advance(100)
        assert s.is_empty()

    def test_map_return_expired_if_not_cleaned_up(self, backend: Any, clock: ManualClock) -> None:
        s = backend.get_state(MapStateDescriptor("m", str, int, ttl=RETURN_EXPIRED))
        backend.set_current_key("a")
        s.put("x", 1)
        clock.advance(TTL_MS)
        assert s.get("x") == 1
        assert s.get("x") is None
        assert backend.num_entries("m") == 0

    # --- reducing and aggregating ----------------------------------------------------------------

    @pytest.mark.parametrize("kind", list(REDUCING_OR_AGGREGATING))
    def test_reducing_and_aggregating_ttl(self, backend: Any, clock: ManualClock, kind: str) -> None:
        s = backend.get_state(REDUCING_OR_AGGREGATING[kind](ttl()))
        backend.set_current_key("a")
        s.add(1)  # 1000
        clock.advance(60)
        s.add(2)  # 1060: the write refreshes the accumulator
        clock.advance(60)
        assert s.get() == 3  # 1120
        clock.advance(40)
        assert s.get() is None  # 1160
        assert backend.num_entries("s") == 0
        s.add(5)
        assert s.get() == 5  # starts afresh, the expired 3 is gone
        clock.advance(99)
        s.add(1)
        clock.advance(99)
        assert s.get() == 6

    # --- namespaces, misuse ----------------------------------------------------------------------

    def test_list_merge_keeps_each_elements_timestamp(self, backend: Any, clock: ManualClock) -> None:
        s = backend.get_state(
            ListStateDescriptor("l", int, ttl=ttl()), namespace_serializer=serializer_for(int)
        )
        backend.set_current_key("a")
        s.set_current_namespace(1)
        s.add(1)  # 1000
        clock.advance(50)
        s.set_current_namespace(2)
        s.add(2)  # 1050
        clock.advance(10)
        s.merge_namespaces(3, [1, 2])  # 1060: the merge is not a write of the elements
        s.set_current_namespace(3)
        assert sorted(s.get()) == [1, 2]
        clock.advance(40)
        assert s.get() == [2]
        clock.advance(50)
        assert s.get() == []
        assert backend.num_entries("l") == 0

    def test_reducing_merge_drops_expired_sources(self, backend: Any, clock: ManualClock) -> None:
        s = backend.get_state(
            ReducingStateDescriptor("r", operator.add, int, ttl=ttl()),
            namespace_serializer=serializer_for(int),
        )
        backend.set_current_key("a")
        s.set_current_namespace(1)
        s.add(1)  # 1000
        clock.advance(50)
        s.set_current_namespace(2)
        s.add(2)  # 1050
        clock.advance(50)  # 1100: namespace 1 expired
        s.merge_namespaces(3, [1, 2])
        s.set_current_namespace(3)
        assert s.get() == 2
        assert backend.num_entries("r") == 1

    @pytest.mark.parametrize("kind", list(TTL_KINDS))
    def test_ttl_state_without_current_key_raises(self, backend: Any, kind: str) -> None:
        make, call = TTL_KINDS[kind]
        s = backend.get_state(make())
        with pytest.raises(StateAccessError):
            call(s)
        assert backend.num_entries() == 0

    # --- cleanup in full snapshots ----------------------------------------------------------------

    def test_full_snapshot_cleanup_leaves_expired_entries_out(
        self, make_backend: Any, backend: Any, clock: ManualClock
    ) -> None:
        _write_aged(backend, clock, _aged_descs(ttl(full_snapshot=True)))
        before = backend.num_entries()
        target, (_, lst, m) = _restore_copy(make_backend, backend, *_aged_descs(ttl(full_snapshot=True)))
        assert target.num_entries("v") == 3
        assert target.num_entries("l") == 4
        assert target.num_entries("m") == 4
        assert sorted(target.keys("v")) == ["new0", "new1", "new2"]
        assert sorted(target.keys("l")) == ["new0", "new1", "new2", "old0"]
        target.set_current_key("old0")
        assert lst.get() == [99]
        assert dict(m.items()) == {"y": 99}
        assert backend.num_entries() == before  # the source is left as it was

    def test_expired_entries_stay_expired_across_a_restore(
        self, make_backend: Any, backend: Any, clock: ManualClock
    ) -> None:
        _write_aged(backend, clock, _aged_descs(ttl()))
        target, (v, lst, m) = _restore_copy(make_backend, backend, *_aged_descs(ttl()))
        for i in range(5):
            target.set_current_key(f"old{i}")
            assert v.value() is None
            assert lst.get() == ([99] if i == 0 else [])
            assert dict(m.items()) == ({"y": 99} if i == 0 else {})
        for i in range(3):
            target.set_current_key(f"new{i}")
            assert (v.value(), lst.get(), dict(m.items())) == (i, [i], {"x": i})

    def test_restore_keeps_ttl_timestamps(self, make_backend: Any, backend: Any, clock: ManualClock) -> None:
        cfg = StateTtlConfig(timedelta(milliseconds=100))
        s = backend.get_state(ValueStateDescriptor("v", int, ttl=cfg))
        for i in range(20):
            backend.set_current_key(f"k{i}")
            s.update(i)
        clock.advance(99)
        target, (t,) = _restore_copy(make_backend, backend, ValueStateDescriptor("v", int, ttl=cfg))
        for i in range(20):
            target.set_current_key(f"k{i}")
            assert t.value() == i  # reads do not refresh (on create and write)
        clock.advance(1)
        for i in range(20):
            target.set_current_key(f"k{i}")
            assert t.value() is None
        assert target.num_entries() == 0

    # --- incremental cleanup: safety only ------------------------------------------------------------

    def test_incremental_cleanup_keeps_live_entries(self, backend: Any, clock: ManualClock) -> None:
        s = backend.get_state(ValueStateDescriptor("v", int, ttl=ttl(incremental=1000)))
        for i in range(30):
            backend.set_current_key(f"k{i}")
            s.update(i)
        clock.advance(50)
        for i in range(10):
            backend.set_current_key(f"k{i}")
            s.update(100 + i)  # refreshed: live until 1150
        clock.advance(50)  # 1100: k10..k29 expired
        backend.set_current_key("k0")
        assert s.value() == 100
        assert 10 <= backend.num_entries("v") <= 30
        assert set(backend.keys("v")) >= {f"k{i}" for i in range(10)}
        for i in range(10):
            backend.set_current_key(f"k{i}")
            assert s.value() == 100 + i

    def test_cleanup_does_not_touch_a_pending_snapshot(
        self, make_backend: Any, backend: Any, clock: ManualClock
    ) -> None:
        s = backend.get_state(ValueStateDescriptor("v", int, ttl=ttl(incremental=1000)))
        for i in range(20):
            backend.set_current_key(f"k{i}")
            s.update(i)
        snap = backend.snapshot()
        clock.advance(TTL_MS)
        backend.set_current_key("reader")
        s.value()
        for i in range(20):
            backend.set_current_key(f"k{i}")
            assert s.value() is None  # reading cleans up, whatever incremental cleanup did
        assert backend.num_entries("v") == 0
        target = make_backend()
        target.get_state(ValueStateDescriptor("v", int, ttl=ttl()))
        target.restore([write_snapshot(snap, backend)])
        assert target.num_entries("v") == 20

    # --- TTL turned on, off or changed across a restore ---------------------------------------------

    def _restore_switched(
        self, make_backend: Any, source: Any, after: StateDescriptor, *, native: bool, declare_first: bool
    ) -> tuple[Any, Any]:
        """A backend restored from ``source`` (canonically or natively), ``after`` declared first or not."""
        if native and not isinstance(source, SupportsNativeSnapshot):
            pytest.skip("this backend has no native snapshot format (SupportsNativeSnapshot)")
        handle = snapshot_handle(source, native=native)
        target = make_backend()
        s = target.get_state(after) if declare_first else None
        if native:
            target.restore_native([handle])
        else:
            target.restore([handle])
        if s is None:
            s = target.get_state(after)
        return target, s

    @pytest.mark.parametrize("native", [False, True], ids=["canonical", "native"])
    @pytest.mark.parametrize("declare_first", [False, True], ids=["declared-after", "declared-first"])
    @pytest.mark.parametrize("kind", list(SWITCHES))
    def test_turning_ttl_on_across_restore_stamps_entries_at_the_restore(
        self,
        make_backend: Any,
        backend: Any,
        clock: ManualClock,
        kind: str,
        declare_first: bool,
        native: bool,
    ) -> None:
        plain, with_ttl, write, read = SWITCHES[kind]
        s = backend.get_state(plain())
        for k in ("a", "b"):
            backend.set_current_key(k)
            write(s)
        expected = read(s)
        clock.advance(10 * TTL_MS)  # the restore is long after the writes: its time is what counts
        target, s2 = self._restore_switched(
            make_backend, backend, with_ttl(), native=native, declare_first=declare_first
        )
        assert target.num_entries("s") == 2
        target.set_current_key("a")
        clock.advance(TTL_MS - 1)
        assert read(s2) == expected, "an entry stamped at the restore expired before the restore's time + TTL"
        clock.advance(1)
        assert read(s2) == SWITCH_EMPTY[kind], (
            "an entry stamped at the restore outlived the restore's time + TTL"
        )
        history = next(m for m in target.snapshot().header.states if m["name"] == "s")["lineage"]
        assert history[-1]["ttl"] is None and history[-1]["migration"] == "converted"

    @pytest.mark.parametrize("native", [False, True], ids=["canonical", "native"])
    @pytest.mark.parametrize("declare_first", [False, True], ids=["declared-after", "declared-first"])
    @pytest.mark.parametrize("kind", list(SWITCHES))
    def test_turning_ttl_off_across_restore_drops_the_timestamps(
        self,
        make_backend: Any,
        backend: Any,
        clock: ManualClock,
        kind: str,
        declare_first: bool,
        native: bool,
    ) -> None:
        plain, with_ttl, write, read = SWITCHES[kind]
        s = backend.get_state(with_ttl())
        for k in ("a", "b"):
            backend.set_current_key(k)
            write(s)
        expected = read(s)
        target, s2 = self._restore_switched(
            make_backend, backend, plain(), native=native, declare_first=declare_first
        )
        clock.advance(100 * TTL_MS)
        target.set_current_key("a")
        assert read(s2) == expected, "an entry of a state whose TTL was turned off expired"
        assert target.num_entries("s") == 2
        again = make_backend()
        again.restore([snapshot_handle(target)])
        again.set_current_key("b")
        assert read(again.get_state(plain())) == expected  # its snapshot is of the new, plain schema

    @pytest.mark.parametrize("native", [False, True], ids=["canonical", "native"])
    @pytest.mark.parametrize("kind", list(SWITCHES))
    def test_changing_ttl_across_restore_applies_it_to_the_stored_last_access_times(
        self, make_backend: Any, backend: Any, clock: ManualClock, kind: str, native: bool
    ) -> None:
        _, with_ttl, write, read = SWITCHES[kind]
        s = backend.get_state(with_ttl())
        backend.set_current_key("a")
        write(s)  # last access: now
        expected = read(s)
        longer = with_ttl()
        longer.ttl = StateTtlConfig(timedelta(milliseconds=3 * TTL_MS))
        clock.advance(TTL_MS)  # expired under the old TTL, live under the new one
        target, s2 = self._restore_switched(make_backend, backend, longer, native=native, declare_first=False)
        target.set_current_key("a")
        clock.advance(2 * TTL_MS - 1)
        assert read(s2) == expected, "the new TTL was not applied to the stored last-access time"
        clock.advance(1)
        assert read(s2) == SWITCH_EMPTY[kind], "the stored last-access time was not kept"
