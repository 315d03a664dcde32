"""TTL of keyed state on the heap backend, with a manual clock: DESIGN.md section 6."""

from __future__ import annotations

import operator
from datetime import timedelta
from typing import Any

import pytest

from statekit import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateAccessError,
    StateMigrationError,
    StateTtlConfig,
    TtlUpdateType,
    TtlVisibility,
    ValueStateDescriptor,
    serializer_for,
)

TTL_MS = 100


def ttl(
    *,
    update: TtlUpdateType = TtlUpdateType.ON_CREATE_AND_WRITE,
    visibility: TtlVisibility = TtlVisibility.NEVER_RETURN_EXPIRED,
    full_snapshot: bool = False,
    incremental: int = 0,
) -> StateTtlConfig:
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
        return [0]

    def add(self, value: int, acc: list[int]) -> list[int]:
        return [acc[0] + value]

    def get_result(self, acc: list[int]) -> int:
        return acc[0]

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0]]


def restore_copy(make_backend, source, *descriptors):
    """A new backend restored from ``source``'s snapshot, with ``descriptors`` declared first."""
    handle = source.snapshot().to_handle()
    target = make_backend()
    states = [target.get_state(d) for d in descriptors]
    target.restore([handle])
    return target, states


# --- expiry -----------------------------------------------------------------------------


def test_value_expires_exactly_at_last_access_plus_ttl(backend, clock):
    s = backend.get_state(ValueStateDescriptor("v", int, ttl=ttl()))
    backend.set_current_key("a")
    s.update(1)  # at 1000
    clock.advance(TTL_MS - 1)
    assert s.value() == 1  # 1000 + 100 > 1099
    clock.advance(1)
    assert s.value() is None  # 1000 + 100 <= 1100
    assert backend.num_entries("v") == 0  # read cleans up


def test_value_expired_returns_fresh_default(backend, clock):
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


def test_write_refreshes_on_create_and_write(backend, clock):
    s = backend.get_state(ValueStateDescriptor("v", int, ttl=ttl()))
    backend.set_current_key("a")
    s.update(1)
    clock.advance(60)
    s.update(2)  # now 1060: expires at 1160
    clock.advance(60)
    assert s.value() == 2
    clock.advance(40)
    assert s.value() is None


def test_read_does_not_refresh_on_create_and_write(backend, clock):
    s = backend.get_state(ValueStateDescriptor("v", int, ttl=ttl()))
    backend.set_current_key("a")
    s.update(1)
    clock.advance(60)
    assert s.value() == 1
    clock.advance(40)
    assert s.value() is None


def test_read_refreshes_on_read_and_write(backend, clock):
    s = backend.get_state(ValueStateDescriptor("v", int, ttl=READ_REFRESHES))
    backend.set_current_key("a")
    s.update(1)
    clock.advance(60)
    assert s.value() == 1  # now 1060: expires at 1160
    clock.advance(99)
    assert s.value() == 1  # 1159, and refreshed again: expires at 1259
    clock.advance(100)
    assert s.value() is None


def test_never_return_expired(backend, clock):
    s = backend.get_state(ValueStateDescriptor("v", int, default=-1, ttl=ttl()))
    backend.set_current_key("a")
    s.update(1)
    clock.advance(TTL_MS)
    assert s.value() == -1


def test_return_expired_if_not_cleaned_up(backend, clock):
    s = backend.get_state(ValueStateDescriptor("v", int, default=-1, ttl=RETURN_EXPIRED))
    backend.set_current_key("a")
    s.update(1)
    clock.advance(TTL_MS)
    assert s.value() == 1  # expired but still there: returned, and cleaned up
    assert backend.num_entries("v") == 0
    assert s.value() == -1


# --- lists: per element -------------------------------------------------------------------


def test_list_ttl_is_per_element(backend, clock):
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


def test_list_update_restamps_every_element(backend, clock):
    s = backend.get_state(ListStateDescriptor("l", int, ttl=ttl()))
    backend.set_current_key("a")
    s.add(1)
    clock.advance(90)
    s.update([1, 2])
    clock.advance(90)
    assert s.get() == [1, 2]
    clock.advance(10)
    assert s.get() == []


def test_list_read_refreshes_on_read_and_write(backend, clock):
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


def test_list_return_expired_if_not_cleaned_up(backend, clock):
    s = backend.get_state(ListStateDescriptor("l", int, ttl=RETURN_EXPIRED))
    backend.set_current_key("a")
    s.add(1)
    clock.advance(50)
    s.add(2)
    clock.advance(50)
    assert s.get() == [1, 2]  # element 1 expired, returned once
    assert s.get() == [2]


# --- maps: per entry ----------------------------------------------------------------------


def test_map_ttl_is_per_entry(backend, clock):
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


def test_map_put_refreshes_one_entry(backend, clock):
    s = backend.get_state(MapStateDescriptor("m", str, int, ttl=ttl()))
    backend.set_current_key("a")
    s.put_all({"x": 1, "y": 2})
    clock.advance(60)
    s.put("x", 3)
    assert s.get("y") == 2  # a read does not refresh y
    clock.advance(40)
    assert dict(s.items()) == {"x": 3}


def test_map_read_refreshes_on_read_and_write(backend, clock):
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


def test_map_return_expired_if_not_cleaned_up(backend, clock):
    s = backend.get_state(MapStateDescriptor("m", str, int, ttl=RETURN_EXPIRED))
    backend.set_current_key("a")
    s.put("x", 1)
    clock.advance(TTL_MS)
    assert s.get("x") == 1
    assert s.get("x") is None
    assert backend.num_entries("m") == 0


# --- reducing and aggregating ----------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda cfg: ReducingStateDescriptor("s", operator.add, int, ttl=cfg),
        lambda cfg: AggregatingStateDescriptor("s", SumToList(), list[int], ttl=cfg),
    ],
    ids=["reducing", "aggregating"],
)
def test_reducing_and_aggregating_ttl(backend, clock, make):
    s = backend.get_state(make(ttl()))
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


# --- namespaces, misuse ------------------------------------------------------------------------


def test_list_merge_keeps_each_elements_timestamp(backend, clock):
    s = backend.get_state(ListStateDescriptor("l", int, ttl=ttl()), namespace_serializer=serializer_for(int))
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


def test_reducing_merge_drops_expired_sources(backend, clock):
    s = backend.get_state(
        ReducingStateDescriptor("r", operator.add, int, ttl=ttl()), namespace_serializer=serializer_for(int)
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


TTL_KINDS = {
    "value": (lambda: ValueStateDescriptor("s", int, ttl=ttl()), lambda s: s.value()),
    "list": (lambda: ListStateDescriptor("s", int, ttl=ttl()), lambda s: s.add(1)),
    "reducing": (lambda: ReducingStateDescriptor("s", operator.add, int, ttl=ttl()), lambda s: s.add(1)),
    "aggregating": (
        lambda: AggregatingStateDescriptor("s", SumToList(), list[int], ttl=ttl()),
        lambda s: s.get(),
    ),
    "map": (lambda: MapStateDescriptor("s", str, int, ttl=ttl()), lambda s: s.put("x", 1)),
}


@pytest.mark.parametrize("kind", list(TTL_KINDS))
def test_ttl_state_without_current_key_raises(backend, kind):
    make, call = TTL_KINDS[kind]
    s = backend.get_state(make())
    with pytest.raises(StateAccessError):
        call(s)
    assert backend.num_entries() == 0


# --- cleanup in full snapshots ----------------------------------------------------------------


def _write_aged(backend, clock, descs):
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


def _aged_descs(cfg):
    return (
        ValueStateDescriptor("v", int, ttl=cfg),
        ListStateDescriptor("l", int, ttl=cfg),
        MapStateDescriptor("m", str, int, ttl=cfg),
    )


def test_full_snapshot_cleanup_leaves_expired_entries_out(make_backend, backend, clock):
    descs = _aged_descs(ttl(full_snapshot=True))
    _write_aged(backend, clock, descs)
    assert backend.num_entries() == 3 * 8  # nothing read: nothing cleaned yet

    target, (v, lst, m) = restore_copy(make_backend, backend, *_aged_descs(ttl(full_snapshot=True)))
    assert target.num_entries("v") == 3
    assert target.num_entries("l") == 4
    assert target.num_entries("m") == 4
    assert sorted(target.keys("v")) == ["new0", "new1", "new2"]
    assert sorted(target.keys("l")) == ["new0", "new1", "new2", "old0"]
    target.set_current_key("old0")
    assert lst.get() == [99]
    assert dict(m.items()) == {"y": 99}
    assert backend.num_entries() == 3 * 8  # the source is left as it was


def test_without_full_snapshot_cleanup_expired_entries_are_written(make_backend, backend, clock):
    _write_aged(backend, clock, _aged_descs(ttl()))
    target, (v, lst, m) = restore_copy(make_backend, backend, *_aged_descs(ttl()))
    assert target.num_entries() == 3 * 8
    target.set_current_key("old1")
    assert v.value() is None  # still expired after the restore
    assert target.num_entries("v") == 7


# --- incremental cleanup ----------------------------------------------------------------------


def _value_keys(backend, clock, cfg, n):
    s = backend.get_state(ValueStateDescriptor("v", int, ttl=cfg))
    for i in range(n):
        backend.set_current_key(f"k{i}")
        s.update(i)
    return s


def test_incremental_cleanup_removes_other_keys_on_access(backend, clock):
    s = _value_keys(backend, clock, ttl(incremental=5), 40)
    clock.advance(TTL_MS)
    backend.set_current_key("reader")
    seen = [backend.num_entries("v")]
    for _ in range(20):
        assert s.value() is None  # "reader" has no value: only other keys can be cleaned
        seen.append(backend.num_entries("v"))
    assert seen[0] == 40
    assert seen[-1] == 0
    assert all(a >= b for a, b in zip(seen, seen[1:]))
    assert all(a - b <= 5 for a, b in zip(seen, seen[1:]))  # at most N entries per access


def test_incremental_cleanup_keeps_live_entries(backend, clock):
    s = _value_keys(backend, clock, ttl(incremental=1000), 30)
    clock.advance(50)
    for i in range(10):
        backend.set_current_key(f"k{i}")
        s.update(100 + i)  # refreshed: live until 1150
    clock.advance(50)  # 1100: k10..k29 expired
    backend.set_current_key("k0")
    assert s.value() == 100
    assert backend.num_entries("v") == 10
    assert sorted(backend.keys("v")) == sorted(f"k{i}" for i in range(10))


@pytest.mark.parametrize("kind", ["list", "map"])
def test_incremental_cleanup_of_lists_and_maps(backend, clock, kind):
    cfg = ttl(incremental=1000)
    if kind == "list":
        s = backend.get_state(ListStateDescriptor("s", int, ttl=cfg))
        write = s.add
    else:
        s = backend.get_state(MapStateDescriptor("s", int, int, ttl=cfg))
        write = lambda i: s.put(i, i)  # noqa: E731
    for i in range(20):
        backend.set_current_key(f"k{i}")
        write(i)
    clock.advance(50)
    backend.set_current_key("k0")
    write(100)  # k0 holds one expiring and one live part
    clock.advance(50)
    backend.set_current_key("z")
    s.clear()  # any access triggers the cleanup
    assert backend.num_entries("s") == 1
    assert list(backend.keys("s")) == ["k0"]


def test_no_incremental_cleanup_when_off(backend, clock):
    s = _value_keys(backend, clock, ttl(), 20)
    clock.advance(TTL_MS)
    backend.set_current_key("reader")
    for _ in range(5):
        s.value()
    assert backend.num_entries("v") == 20


def test_incremental_cleanup_does_not_touch_a_pending_snapshot(make_backend, backend, clock):
    s = _value_keys(backend, clock, ttl(incremental=1000), 20)
    snap = backend.snapshot()
    clock.advance(TTL_MS)
    backend.set_current_key("reader")
    s.value()
    assert backend.num_entries("v") == 0
    target = make_backend()
    target.get_state(ValueStateDescriptor("v", int, ttl=ttl()))
    target.restore([snap.to_handle()])
    assert target.num_entries("v") == 20


# --- TTL switched on or off across a restore ---------------------------------------------------

SWITCHES = {
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


def _switch_case(kind: str, turn_on: bool) -> tuple[Any, Any, Any, Any]:
    plain, with_ttl, write, read = SWITCHES[kind]
    return (plain, with_ttl, write, read) if turn_on else (with_ttl, plain, write, read)


@pytest.mark.parametrize("turn_on", [True, False], ids=["on", "off"])
@pytest.mark.parametrize("kind", list(SWITCHES))
def test_switching_ttl_across_restore_raises_at_get_state(make_backend, backend, kind, turn_on):
    before, after, write, read = _switch_case(kind, turn_on)
    s = backend.get_state(before())
    for k in ("a", "b"):
        backend.set_current_key(k)
        write(s)
    expected = read(s)
    handle = backend.snapshot().to_handle()

    target = make_backend()
    target.restore([handle])
    assert target.num_entries("s") == 2
    with pytest.raises(StateMigrationError):
        target.get_state(after())
    # Untouched: the entries are still there, and readable with the original declaration.
    assert target.num_entries("s") == 2
    assert target.state_names == ["s"]
    s2 = target.get_state(before())
    target.set_current_key("a")
    assert read(s2) == expected
    assert target.num_entries("s") == 2


@pytest.mark.parametrize("turn_on", [True, False], ids=["on", "off"])
@pytest.mark.parametrize("kind", list(SWITCHES))
def test_switching_ttl_across_restore_raises_when_declared_first(make_backend, backend, kind, turn_on):
    before, after, write, _ = _switch_case(kind, turn_on)
    s = backend.get_state(before())
    backend.set_current_key("a")
    write(s)
    handle = backend.snapshot().to_handle()

    target = make_backend()
    target.get_state(after())
    with pytest.raises(StateMigrationError):
        target.restore([handle])
    assert target.num_entries() == 0
