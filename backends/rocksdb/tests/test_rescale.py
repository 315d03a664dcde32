"""Native rescales (2 -> 3 -> 2) keep every kind of state, TTL timestamps and timers exact.

The base instance of each new subtask is clipped with range deletions; the
other overlapping instances' ranges are written into SST files and ingested.
Each rescaled job is compared with the job it was restored from, at the same
clock: the same entries (expired ones as invisible), the same timers firing.
The first checkpoint after each rescale restores exactly too.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

from statekit import (
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedProcessFunction,
    ListStateDescriptor,
    LocalRunner,
    MapStateDescriptor,
    OnTimerContext,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from statekit.serializers import serializer_for
from statekit.testing import ManualClock, keyed_checkpoint_part

INT_NS = serializer_for(int)
HOUR = 3_600_000


class Mean(AggregateFunction[int, tuple[int, int], float]):
    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: int, acc: tuple[int, int]) -> tuple[int, int]:
        return (acc[0] + value, acc[1] + 1)

    def get_result(self, acc: tuple[int, int]) -> float:
        return acc[0] / acc[1]

    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], a[1] + b[1])


def descriptors() -> dict[str, Any]:
    return {
        "value": ValueStateDescriptor("value", int, default=0),
        "list": ListStateDescriptor("list", str),
        "map": MapStateDescriptor("map", str, int),
        "sum": ReducingStateDescriptor("sum", lambda a, b: a + b, int),
        "mean": AggregatingStateDescriptor("mean", Mean(), tuple[int, int]),
        "ttl": ValueStateDescriptor("ttl", str, ttl=StateTtlConfig(timedelta(hours=1))),
        "ttl_map": MapStateDescriptor("ttl_map", int, str, ttl=StateTtlConfig(timedelta(hours=1))),
        "windows": ListStateDescriptor("windows", int),
    }


class Everything(KeyedProcessFunction):
    """Records are (key, n): every kind of state changes, and an event-time timer is set at n."""

    def open(self, ctx: Any) -> None:
        d = descriptors()
        self.s = {n: ctx.get_state(x) for n, x in d.items() if n != "windows"}
        self.s["windows"] = ctx.get_state(d["windows"], namespace_serializer=INT_NS)

    def process(self, record: Any, ctx: Any) -> None:
        key, n = record
        s = self.s
        s["value"].update(s["value"].value() + n)
        s["list"].add(f"{key}:{n}")
        s["map"].put(f"m{n % 3}", n)
        s["sum"].add(n)
        s["mean"].add(n)
        s["ttl"].update(f"last={n}")
        s["ttl_map"].put(n % 5, f"v{n}")
        s["windows"].set_current_namespace(n % 4)
        s["windows"].add(n)
        ctx.timer_service.register_event_time_timer(n)

    def on_timer(self, timestamp: int, ctx: OnTimerContext) -> Iterable[Any]:
        yield (ctx.current_key, timestamp, self.s["value"].value())


def runner(tmp_path: Path, clock: ManualClock, p: int) -> LocalRunner:
    return LocalRunner(
        Everything,
        key_selector=lambda r: r[0],
        config={
            "statekit.backend": "rocksdb",
            "statekit.checkpoint.format": "native",
            "statekit.checkpoints.dir": str(tmp_path / "chk"),
            "statekit.local-dir": str(tmp_path / "local"),
            "statekit.checkpoints.retained": 5,
            "statekit.parallelism": p,
        },
        job_id="rescale",
        clock=clock,
    )


def dump(r: LocalRunner) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ctx in r.subtasks:
        kb = ctx.keyed_backend
        d = descriptors()
        h = {n: kb.get_state(x) for n, x in d.items() if n != "windows"}
        h["windows"] = kb.get_state(d["windows"], namespace_serializer=INT_NS)
        for key in kb.keys("value"):
            assert key not in out, f"{key} is held by two subtasks"
            kb.set_current_key(key)
            windows = {}
            for ns in range(4):
                h["windows"].set_current_namespace(ns)
                windows[ns] = h["windows"].get()
            out[key] = (
                h["value"].value(),
                h["list"].get(),
                dict(h["map"].items()),
                h["sum"].get(),
                h["mean"].get(),
                h["ttl"].value(),
                dict(h["ttl_map"].items()),
                windows,
            )
    return out


def feed(r: LocalRunner, keys: range, start: int) -> None:
    for i in keys:
        r.process((f"user-{i:05d}", start + i))


def fired(r: LocalRunner) -> list[Any]:
    return sorted(r.advance_watermark(10**9))


def test_native_rescale_2_to_3_to_2_keeps_every_state_ttl_and_timer(tmp_path: Path) -> None:
    clock = ManualClock()
    first = runner(tmp_path, clock, 2)
    feed(first, range(4000), 0)  # written at t=0: their TTL state expires at 1 h
    clock.advance(40 * 60 * 1000)
    feed(first, range(0, 4000, 3), 10_000)  # refreshed at 40 min: visible until 1 h 40 min
    first.checkpoint()
    clock.advance(30 * 60 * 1000)  # 70 min: the t=0 TTL entries have expired, the refreshed ones not
    expected = dump(first)
    assert any(v[5] is None for v in expected.values()) and any(v[5] is not None for v in expected.values())
    first.close()

    up = runner(tmp_path, clock, 3)
    up.restore("latest")
    assert dump(up) == expected
    feed(up, range(1, 4000, 5), 20_000)
    second = up.checkpoint()  # the first checkpoint after a rescale
    part = keyed_checkpoint_part(up, second)
    assert {f["checkpoint_id"] for f in part["native"]["files"]} <= {1, 2}
    expected = dump(up)
    up.close()

    down = runner(tmp_path, clock, 2)
    assert down.restore("latest") == second
    assert dump(down) == expected
    down.close()

    # Timers move with their keys: the rescaled job fires what the original would.
    again = runner(tmp_path, clock, 2)
    again.restore("latest")
    reference = fired(again)
    again.close()
    three = runner(tmp_path, clock, 3)
    three.restore("latest")
    assert fired(three) == reference and len(reference) > 4000
    three.close()
