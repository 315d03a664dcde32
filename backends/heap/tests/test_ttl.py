"""TTL cleanup on the heap backend, with a manual clock.

TTL semantics every backend shares (DESIGN.md section 6) are the conformance
kit's; these cases cover the heap backend's own cleanup strategies: in full
snapshots and incremental, and how they meet a pending snapshot.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from statekit import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

TTL_MS = 100


def ttl(incremental: int = 0) -> StateTtlConfig:
    """A TTL of :data:`TTL_MS` ms (on create and write, never return expired)."""
    return StateTtlConfig(timedelta(milliseconds=TTL_MS), cleanup_incremental_size=incremental)


def restore_copy(make_backend, source, *descriptors):
    """A new backend restored from ``source``'s snapshot, with ``descriptors`` declared first."""
    handle = source.snapshot().to_handle()
    target = make_backend()
    states = [target.get_state(d) for d in descriptors]
    target.restore([handle])
    return target, states


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
