"""A canonical savepoint moves heap -> rocksdb -> lmdb -> sqlite -> heap with every state intact.

Every kind of keyed state (value, list, map, reducing, aggregating), with
namespaces and with TTL, plus operator state; the job changes state between
the moves, so each backend both restores and writes what the next one reads.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from statekit import (
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedProcessFunction,
    ListStateDescriptor,
    LocalRunner,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
    default_registry,
)
from statekit.serializers import serializer_for

BACKENDS = ["heap", "rocksdb", "lmdb", "sqlite", "heap"]
INT_NS = serializer_for(int)
TTL = StateTtlConfig(timedelta(hours=1))


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
        "ttl": ValueStateDescriptor("ttl", str, ttl=TTL),
        "windows": ListStateDescriptor("windows", int),
    }


class Everything(KeyedProcessFunction):
    """Records are (key, n): every kind of state changes with each record."""

    def open(self, ctx: Any) -> None:
        d = descriptors()
        self.s = {n: ctx.get_state(x) for n, x in d.items() if n != "windows"}
        self.s["windows"] = ctx.get_state(d["windows"], namespace_serializer=INT_NS)
        self.seen = ctx.get_list_state(ListStateDescriptor("seen", str))

    def process(self, record: Any, ctx: Any) -> None:
        key, n = record
        s = self.s
        s["value"].update(s["value"].value() + n)
        s["list"].add(f"{key}:{n}")
        s["map"].put(f"m{n % 3}", n)
        s["sum"].add(n)
        s["mean"].add(n)
        s["ttl"].update(f"last={n}")
        s["windows"].set_current_namespace(n % 4)
        s["windows"].add(n)
        if n % 5 == 0:
            self.seen.add(key)


def dump(runner: LocalRunner) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ctx in runner.subtasks:
        kb = ctx.keyed_backend
        d = descriptors()
        handles = {n: kb.get_state(x) for n, x in d.items() if n != "windows"}
        handles["windows"] = kb.get_state(d["windows"], namespace_serializer=INT_NS)
        for key in kb.keys("value"):
            kb.set_current_key(key)
            windows = {}
            for ns in range(4):
                handles["windows"].set_current_namespace(ns)
                windows[ns] = handles["windows"].get()
            out[key] = (
                handles["value"].value(),
                handles["list"].get(),
                dict(handles["map"].items()),
                handles["sum"].get(),
                handles["mean"].get(),
                handles["ttl"].value(),
                windows,
            )
        out.setdefault("__seen__", []).extend(ctx.get_list_state(ListStateDescriptor("seen", str)).get())
    out["__seen__"] = sorted(out["__seen__"])
    return out


def records(start: int, n: int) -> list[tuple[str, int]]:
    return [(f"user-{i % 37}", start + i) for i in range(n)]


def test_a_savepoint_moves_through_every_backend_intact(tmp_path: Path) -> None:
    installed = set(default_registry().backends())
    if not set(BACKENDS) <= installed:
        pytest.skip(f"needs the backends {sorted(set(BACKENDS) - installed)}")
    reference = LocalRunner(Everything, key_selector=lambda r: r[0], config={"statekit.parallelism": 1})
    savepoint = None
    for step, backend in enumerate(BACKENDS):
        runner = LocalRunner(
            Everything,
            key_selector=lambda r: r[0],
            config={
                "statekit.backend": backend,
                "statekit.parallelism": 1 + step % 3,  # and another parallelism each time
                "statekit.max-parallelism": 128,
                "statekit.checkpoints.dir": str(tmp_path / backend / str(step)),
                "statekit.local-dir": str(tmp_path / "local"),
            },
        )
        if savepoint is not None:
            runner.restore(savepoint)
            assert dump(runner) == dump(reference), f"restoring into {backend} changed the state"
        for r in records(step * 1000, 300):
            runner.process(r)
            reference.process(r)
        expected = dump(reference)
        assert len(expected) == 37 + 1 and len(expected["__seen__"]) == 60 * (step + 1)
        assert dump(runner) == expected, f"{backend} diverged while processing"
        savepoint = runner.savepoint(str(tmp_path / "savepoints"))
        runner.close()
    reference.close()
