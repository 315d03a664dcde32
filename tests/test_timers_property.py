"""Property: timers and event time survive checkpoints, crashes, restores and rescales exactly.

A random sequence of records with event times (some late), timer registrations
and deletions runs twice on the LocalRunner: once uninterrupted, once cut into
segments that end in a checkpoint, a crash (outputs since the last checkpoint
are lost, as a transactional sink would drop them) or a rescale. The committed
outputs of the second run, per key, equal the first run's: every timer fires
exactly once, at the same point of the key's history, with the same state.
Both runs also equal a plain Python model of the semantics (:func:`model`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statekit import (
    VOID_NAMESPACE,
    EventTime,
    KeyedProcessFunction,
    LocalRunner,
    OnTimerContext,
    ProcessContext,
    RecordSource,
    RuntimeContext,
    ValueStateDescriptor,
    default_registry,
)

BACKENDS = sorted(set(default_registry().backends()) & {"heap", "rocksdb", "lmdb", "sqlite"})
KEYS = ["a", "b", "c", "d", "e", "f"]


class TimerJob(KeyedProcessFunction):
    """Each record registers and deletes timers relative to its event time; timers report the state."""

    timer_namespace = str

    def open(self, ctx: RuntimeContext) -> None:
        self.seen = ctx.get_state(ValueStateDescriptor("seen", int, default=0))

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        n = self.seen.value() + 1
        self.seen.update(n)
        ts = ctx.timestamp
        assert ts is not None
        ns = "x" if record["ns"] else VOID_NAMESPACE
        for off in record["reg"]:
            ctx.timer_service.register_event_time_timer(ts + off, ns)
        for off in record["del"]:
            ctx.timer_service.delete_event_time_timer(ts + off, ns)
        yield ("rec", ctx.current_key, ts, n)

    def on_timer(self, timestamp: int, ctx: OnTimerContext) -> Iterable[Any]:
        n = self.seen.value() + 100
        self.seen.update(n)
        ns = ctx.namespace if isinstance(ctx.namespace, str) else ""
        yield ("fire", ctx.current_key, timestamp, ns, n)
        if timestamp % 7 == 0 and timestamp < 400:
            ctx.timer_service.register_event_time_timer(timestamp + 11, ctx.namespace)


record = st.fixed_dictionaries(
    {
        "k": st.sampled_from(KEYS),
        "dt": st.integers(-6, 12),
        "reg": st.lists(st.integers(0, 25), max_size=3),
        "del": st.lists(st.integers(0, 25), max_size=2),
        "ns": st.booleans(),
    }
)
segment = st.tuples(
    st.integers(1, 12), st.sampled_from(["checkpoint", "crash", "rescale"]), st.integers(1, 4)
)


def _records(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    t, out = 100, []
    for r in raw:
        t = max(0, t + r["dt"])
        out.append({**r, "ts": t})
    return out


def _runner(backend: str, tmp: str, parallelism: int, sink: Any) -> LocalRunner:
    return LocalRunner(
        TimerJob,
        key_selector=lambda r: r["k"],
        event_time=EventTime("ts", delay=3, late="side-output"),
        late_sink=lambda r: sink(("late", r["k"], r["ts"])),
        sink=sink,
        config={
            "statekit.backend": backend,
            "statekit.checkpoints.dir": tmp,
            "statekit.parallelism": parallelism,
            "statekit.max-parallelism": 16,
            "statekit.checkpoints.retained": 2,
        },
    )


def model(records: list[dict[str, Any]], delay: int = 3) -> list[Any]:
    """What :class:`TimerJob` must emit, in plain Python: late rule, watermark, timers in order."""
    seen: dict[str, int] = {}
    timers: dict[str, set[tuple[int, str]]] = {}
    out: list[Any] = []
    watermark = -(2**63)

    def fire(until: int) -> None:
        while True:
            due = [(t, ns != "", k, ns) for k, ts in timers.items() for t, ns in ts if t <= until]
            if not due:
                return
            t, _, k, ns = min(due)  # per key: time, then the void namespace before "x"
            timers[k].discard((t, ns))
            seen[k] = seen.get(k, 0) + 100
            out.append(("fire", k, t, ns, seen[k]))
            if t % 7 == 0 and t < 400:
                timers[k].add((t + 11, ns))

    for r in records:
        k, ts = r["k"], r["ts"]
        if ts <= watermark:
            out.append(("late", k, ts))
            continue
        seen[k] = seen.get(k, 0) + 1
        ns = "x" if r["ns"] else ""
        mine = timers.setdefault(k, set())
        mine.update((ts + off, ns) for off in r["reg"])
        mine.difference_update((ts + off, ns) for off in r["del"])
        out.append(("rec", k, ts, seen[k]))
        if ts - delay > watermark:
            watermark = ts - delay
            fire(watermark)
    fire(2**63 - 1)  # the end of input
    return out


def _per_key(outputs: list[Any]) -> dict[str, list[Any]]:
    by_key: dict[str, list[Any]] = {}
    for o in outputs:
        by_key.setdefault(o[1], []).append(o)
    return by_key


@pytest.mark.parametrize("backend", BACKENDS)
@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(raw=st.lists(record, min_size=1, max_size=40), plan=st.lists(segment, max_size=6))
def test_timers_fire_exactly_as_in_an_uninterrupted_run(
    backend: str, raw: list[dict[str, Any]], plan: list[tuple[int, str, int]], tmp_path_factory: Any
) -> None:
    records = _records(raw)
    expected: list[Any] = []
    with _runner(backend, str(tmp_path_factory.mktemp("plain")), 1, expected.append) as plain:
        plain.run(RecordSource(records))
    assert _per_key(expected) == _per_key(model(records))

    tmp = str(tmp_path_factory.mktemp("cut"))
    committed: list[Any] = []
    pending: list[Any] = []
    runner = _runner(backend, tmp, 2, pending.append)
    try:
        for n, action, p in plan:
            if runner.run(RecordSource(records), max_records=n).checkpoints:
                # The input ended: its final checkpoint committed every output before it.
                committed += pending
                pending.clear()
            if action in ("checkpoint", "rescale"):
                runner.checkpoint()
                committed += pending
            pending.clear()  # a crash loses them; after a checkpoint they are committed
            if action in ("crash", "rescale"):
                runner.close()
                runner = _runner(backend, tmp, p, pending.append)
                runner.restore("latest")
        runner.run(RecordSource(records))
        committed += pending
    finally:
        runner.close()
    assert _per_key(committed) == _per_key(expected)
