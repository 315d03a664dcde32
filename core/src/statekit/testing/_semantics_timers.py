"""Timers on a backend: they are keyed state, so every backend keeps, snapshots and rescales them.

A backend writes nothing for timers: the timer service stores them as an
internal map state through the public contract. These tests check that the
contract holds for timers too: register, delete, fire, snapshot, restore (in
the canonical and the native format) and rescale.
"""

from __future__ import annotations

from typing import Any

import pytest

from .._contracts import SupportsNativeSnapshot
from ..serialization._keygroups import KeyGroupRange, key_group_for_bytes
from ..serialization._serializers import StrSerializer
from ..timers import MAX_WATERMARK, TIMER_STATE_NAMES
from ..timers._service import TimeDomain, TimerService
from ._job import snapshot_handle

__all__ = ["TimerSemantics"]

EVENT = TimeDomain.EVENT_TIME
PROC = TimeDomain.PROCESSING_TIME


def _service(backend: Any) -> TimerService:
    return TimerService(
        backend, StrSerializer(), namespace_serializer=StrSerializer(), processing_time=lambda: 0
    )


def _register(backend: Any, timers: TimerService, n: int) -> set[tuple[int, str, Any]]:
    """``n`` keys with an event timer each (two for every third key, one of them in a namespace)."""
    expected: set[tuple[int, str, Any]] = set()
    for i in range(n):
        key = f"key-{i}"
        backend.set_current_key(key)
        timers.register_event_time_timer(1000 + i)
        timers.register_event_time_timer(1000 + i)  # twice: one timer
        expected.add((1000 + i, key, None))
        if i % 3 == 0:
            timers.register_event_time_timer(5000 - i, "w")
            expected.add((5000 - i, key, "w"))
        timers.register_processing_time_timer(77 + i)
    return expected


def _live(timers: TimerService) -> set[tuple[int, str, Any]]:
    return {(ts, key, ns if isinstance(ns, str) else None) for ts, key, ns in timers.timers(EVENT)}


class TimerSemantics:
    """Timers kept by the backend through the state contract."""

    def test_timers_fire_once_in_order_and_leave_no_state(self, backend: Any) -> None:
        timers = _service(backend)
        expected = _register(backend, timers, 30)
        backend.set_current_key("key-4")
        timers.delete_event_time_timer(1004)
        expected.discard((1004, "key-4", None))
        assert _live(timers) == expected
        fired = [(ts, key, ns if isinstance(ns, str) else None) for ts, key, ns in timers.due(EVENT, 3000)]
        assert [f[0] for f in fired] == sorted(f[0] for f in fired)
        assert set(fired) == {e for e in expected if e[0] <= 3000}
        assert list(timers.due(EVENT, 3000)) == []  # each fires once
        rest = {
            (ts, key, ns if isinstance(ns, str) else None) for ts, key, ns in timers.due(EVENT, MAX_WATERMARK)
        }
        assert rest == {e for e in expected if e[0] > 3000}
        assert backend.num_entries(TIMER_STATE_NAMES[EVENT]) == 0
        assert timers.pending(PROC) == 30

    @pytest.mark.parametrize("native", [False, True], ids=["canonical", "native"])
    def test_timers_survive_a_snapshot_and_restore(
        self, make_backend: Any, backend: Any, native: bool
    ) -> None:
        if native and not isinstance(backend, SupportsNativeSnapshot):
            pytest.skip("this backend has no native snapshot format (SupportsNativeSnapshot)")
        timers = _service(backend)
        expected = _register(backend, timers, 40)
        handle = snapshot_handle(backend, native=native)
        # Later changes do not reach the snapshot.
        backend.set_current_key("key-0")
        timers.delete_event_time_timer(1000)
        list(timers.due(EVENT, 1010))
        target = make_backend()
        if native:
            target.restore_native([handle])
        else:
            target.restore([handle])
        restored = _service(target)
        assert restored.restore_timers() == len(expected) + 40
        assert _live(restored) == expected
        assert restored.pending(PROC) == 40
        fired = [ts for ts, _, _ in restored.due(EVENT, MAX_WATERMARK)]
        assert fired == sorted(e[0] for e in expected)

    def test_timers_move_with_their_key_group_on_rescale(self, make_backend: Any, backend: Any) -> None:
        timers = _service(backend)
        expected = _register(backend, timers, 60)
        handle = snapshot_handle(backend)
        halves = [KeyGroupRange.of(0, 63), KeyGroupRange.of(64, 127)]
        union: set[tuple[int, str, Any]] = set()
        for kgr in halves:
            target = make_backend(key_group_range=kgr)
            target.restore([handle])
            part = _service(target)
            part.restore_timers()
            live = _live(part)
            for _, key, _ in live:
                assert key_group_for_bytes(StrSerializer().serialize(key), 128) in kgr
            assert not (live & union)
            union |= live
        assert union == expected
