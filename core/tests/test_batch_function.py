"""Batch functions on the LocalRunner: the same state and outputs as per record.

A KeyedBatchFunction gets a key's rows at once; a KeyedColumnsFunction all of a
micro-batch's rows of a subtask.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")

from statekit import (  # noqa: E402
    AggregatingStateDescriptor,
    ColumnsContext,
    EventTime,
    KeyedBatchFunction,
    KeyedColumnsFunction,
    KeyedProcessFunction,
    ListStateDescriptor,
    LocalRunner,
    MapStateDescriptor,
    OnTimerContext,
    ProcessContext,
    RecordSource,
    ReducingStateDescriptor,
    RuntimeContext,
    StateTtlConfig,
    ValueStateDescriptor,
)
from statekit.errors import ConfigurationError  # noqa: E402
from statekit.runtime._columnar import arrow_group_runs, group_runs, output_columns, output_rows  # noqa: E402
from statekit.testing._semantics_state import Mean  # noqa: E402

COUNT = ValueStateDescriptor("count", int, default=0)
SEQS = ListStateDescriptor("seqs", int)
TOTAL = ReducingStateDescriptor("total", lambda a, b: a + b, int)
BY_METHOD = MapStateDescriptor("by_method", str, int)
SEEN = ListStateDescriptor("keys_seen", str)


MEAN = AggregatingStateDescriptor("mean", Mean(), tuple[int, int])
RECENT = ValueStateDescriptor("recent", int, ttl=StateTtlConfig(timedelta(hours=1)))


def records(n: int, *, keys: int = 20, seed: int = 5) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "url": f"/u{rng.randrange(keys)}",
            "seq": i,
            "method": rng.choice(["GET", "POST"]),
            "bytes": rng.randint(1, 100),
        }
        for i in range(n)
    ]


class PerRecord(KeyedProcessFunction):
    """Every state kind, per record; emits (url, count so far, seq)."""

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(COUNT)
        self.seqs = ctx.get_state(SEQS)
        self.total = ctx.get_state(TOTAL)
        self.by_method = ctx.get_state(BY_METHOD)
        self.mean = ctx.get_state(MEAN)
        self.recent = ctx.get_state(RECENT)
        self.seen = ctx.get_list_state(SEEN)

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        n = self.count.value() + 1
        self.count.update(n)
        self.others(ctx.current_key, n, record)
        yield {"url": ctx.current_key, "count": n, "seq": record["seq"]}

    def others(self, key: str, n: int, record: dict[str, Any]) -> None:
        """Every state but the count, for one record of ``key`` (its ``n``-th), the current key's."""
        self.seqs.add(record["seq"])
        self.total.add(record["bytes"])
        m = record["method"]
        self.by_method.put(m, (self.by_method.get(m) or 0) + 1)
        self.mean.add(record["bytes"])
        self.recent.update(record["seq"])
        if n == 1:
            self.seen.add(key)


class Vectorized(KeyedBatchFunction):
    """:class:`PerRecord` a key's rows at a time; checks each call gets all of them, in order."""

    calls: list[tuple[str, list[int]]] = []

    def open(self, ctx: RuntimeContext) -> None:
        PerRecord.open(self, ctx)  # type: ignore[arg-type]

    def process_batch(self, rows: Any, ctx: ProcessContext) -> Any:
        assert isinstance(rows, pa.RecordBatch)
        assert set(rows.column("url").to_pylist()) == {ctx.current_key}
        seqs = rows.column("seq").to_pylist()
        Vectorized.calls.append((ctx.current_key, seqs))
        n, m = self.count.value(), rows.num_rows
        self.count.update(n + m)
        self.seqs.add_all(seqs)
        self.total.add(sum(rows.column("bytes").to_pylist()))
        for method, k in Counter(rows.column("method").to_pylist()).items():
            self.by_method.put(method, (self.by_method.get(method) or 0) + k)
        for b in rows.column("bytes").to_pylist():
            self.mean.add(b)
        self.recent.update(seqs[-1])
        if n == 0:
            self.seen.add(ctx.current_key)
        return pa.table({"url": [ctx.current_key] * m, "count": list(range(n + 1, n + m + 1)), "seq": seqs})


class Columns(KeyedColumnsFunction):
    """:class:`PerRecord` a micro-batch and subtask at a time: the count in bulk, the rest per row."""

    calls: list[tuple[int, list[str], list[int]]] = []

    def open(self, ctx: RuntimeContext) -> None:
        PerRecord.open(self, ctx)  # type: ignore[arg-type]
        self.index = ctx.subtask_index

    def process_columns(self, rows: Any, keys: list[Any], ctx: ColumnsContext) -> Any:
        assert isinstance(rows, pa.RecordBatch) and ctx.current_key in (None, *keys)
        assert rows.column("url").to_pylist() == keys
        seqs = rows.column("seq").to_pylist()
        Columns.calls.append((self.index, keys, seqs))
        counts = self.count.update_batch(keys, lambda n: n + 1)
        for key, n, record in zip(keys, counts, rows.to_pylist()):
            ctx.set_current_key(key)
            PerRecord.others(self, key, n, record)  # type: ignore[arg-type]
        return {"url": keys, "count": counts, "seq": seqs}


def state_of(runner: LocalRunner) -> dict[str, Any]:
    out: dict[str, Any] = {}
    seen: list[str] = []
    for ctx in runner.subtasks:
        kb = ctx.keyed_backend
        handles = [kb.get_state(d) for d in (COUNT, SEQS, TOTAL, BY_METHOD, MEAN, RECENT)]
        for key in list(kb.keys("count")):
            kb.set_current_key(key)
            c, s, t, bm, mean, recent = handles
            out[key] = (c.value(), s.get(), t.get(), dict(bm.items()), mean.get(), recent.value())
        seen += ctx.get_list_state(SEEN).get()
    out["__seen__"] = sorted(seen)
    return out


def run(
    function: Any, recs: list[dict[str, Any]], tmp: Path, **conf: Any
) -> tuple[list[Any], dict[str, Any]]:
    got: list[Any] = []
    config = {"statekit.parallelism": 2, "statekit.checkpoints.dir": str(tmp), **conf}
    with LocalRunner(function, key_selector=lambda r: r["url"], config=config, sink=got.append) as runner:
        runner.run(RecordSource(recs))
        return got, state_of(runner)


def _same_as_per_record(function: Any, tmp_path: Path, batch_size: int) -> list[dict[str, Any]]:
    """500 records through ``function`` and through the per-record job: the same state and outputs."""
    recs = records(500)
    want_out, want_state = run(PerRecord, recs, tmp_path / "a")
    got_out, got_state = run(function, recs, tmp_path / "b", **{"statekit.batch-size": batch_size})
    assert got_state == want_state
    assert sorted(got_out, key=lambda o: o["seq"]) == want_out
    return recs


@pytest.mark.parametrize("batch_size", [1, 7, 10_000])
def test_vectorized_state_and_outputs_equal_per_record(tmp_path: Path, batch_size: int) -> None:
    Vectorized.calls = []
    recs = _same_as_per_record(Vectorized, tmp_path, batch_size)
    # One call per key and micro-batch, its rows in arrival order.
    batches = [recs[i : i + batch_size] for i in range(0, len(recs), batch_size)]
    want_calls = sorted(
        (k, [r["seq"] for r in b if r["url"] == k]) for b in batches for k in {r["url"] for r in b}
    )
    assert sorted(Vectorized.calls) == want_calls


@pytest.mark.parametrize("batch_size", [1, 7, 10_000])
def test_columns_state_and_outputs_equal_per_record(tmp_path: Path, batch_size: int) -> None:
    Columns.calls = []
    recs = _same_as_per_record(Columns, tmp_path, batch_size)
    # One call per subtask and micro-batch, its rows in arrival order; a key stays on its subtask.
    subtask_of: dict[str, set[int]] = {}
    for index, keys, _ in Columns.calls:
        for key in keys:
            subtask_of.setdefault(key, set()).add(index)
    assert all(len(s) == 1 for s in subtask_of.values()) and len({i for i, _, _ in Columns.calls}) == 2
    calls = iter(Columns.calls)
    for start in range(0, len(recs), batch_size):
        want: dict[int, list[int]] = {}
        for r in recs[start : start + batch_size]:
            (index,) = subtask_of[r["url"]]
            want.setdefault(index, []).append(r["seq"])
        got = {}
        for _ in want:
            index, _, seqs = next(calls)
            got[index] = seqs
        assert got == want
    assert next(calls, None) is None


@pytest.mark.parametrize("function", [Vectorized, Columns])
def test_checkpoint_crash_restore_and_rescale_are_exact(tmp_path: Path, function: Any) -> None:
    recs = records(900)
    conf = {
        "statekit.checkpoints.dir": str(tmp_path),
        "statekit.checkpoint.interval-records": 100,
        "statekit.batch-size": 64,
    }
    out: list[Any] = []
    first = LocalRunner(
        function,
        key_selector=lambda r: r["url"],
        sink=out.append,
        config={**conf, "statekit.parallelism": 2},
    )
    result = first.run(RecordSource(recs), max_records=450)
    assert result.records == 450 and len(result.checkpoints) == 4  # at 100, 200, 300, 400
    first.close()  # a crash after 450: the 50 records after the last checkpoint come again
    out = [o for o in out if o["seq"] < 400]
    second = LocalRunner(
        function,
        key_selector=lambda r: r["url"],
        sink=out.append,
        config={**conf, "statekit.parallelism": 3},
    )  # rescaled
    result = second.run(RecordSource(recs), restore="latest")
    assert result.records == 500
    _, want_state = run(PerRecord, recs, tmp_path / "per-record")
    assert state_of(second) == want_state
    second.close()
    counts: dict[str, list[int]] = {}
    for o in sorted(out, key=lambda o: o["seq"]):
        counts.setdefault(o["url"], []).append(o["count"])
    assert counts == {u: list(range(1, c + 1)) for u, c in Counter(r["url"] for r in recs).items()}


class SessionTotals(KeyedBatchFunction):
    """Event time: a key's bytes until its rows stop for 10 s, emitted by a timer as columns."""

    def open(self, ctx: RuntimeContext) -> None:
        self.total = ctx.get_state(TOTAL)

    def process_batch(self, rows: Any, ctx: ProcessContext) -> Any:
        assert ctx.timestamp is None
        self.total.add(sum(rows.column("bytes").to_pylist()))
        ctx.timer_service.register_event_time_timer(max(rows.column("ts").to_pylist()) + 10_000)
        return None

    def on_timer(self, timestamp: int, ctx: OnTimerContext) -> Any:
        return {"url": [ctx.current_key], "total": [self.total.get()], "at": [timestamp]}


class SessionTotalsColumns(KeyedColumnsFunction):
    """:class:`SessionTotals` a micro-batch and subtask at a time; a timer per key after set_current_key."""

    def open(self, ctx: RuntimeContext) -> None:
        self.total = ctx.get_state(TOTAL)

    def process_columns(self, rows: Any, keys: list[Any], ctx: ColumnsContext) -> Any:
        assert ctx.timestamp is None
        last: dict[str, int] = {}
        for key, size, ts in zip(keys, rows.column("bytes").to_pylist(), rows.column("ts").to_pylist()):
            ctx.set_current_key(key)
            self.total.add(size)
            last[key] = max(ts, last.get(key, ts))
        for key, ts in last.items():
            ctx.set_current_key(key)
            ctx.timer_service.register_event_time_timer(ts + 10_000)
        return None

    on_timer = SessionTotals.on_timer


@pytest.mark.parametrize("function", [SessionTotals, SessionTotalsColumns])
def test_event_time_timers_and_late_rows(tmp_path: Path, function: Any) -> None:
    recs = [
        {"url": "/a", "ts": 1_000, "bytes": 1},
        {"url": "/b", "ts": 2_000, "bytes": 2},
        {"url": "/a", "ts": 3_000, "bytes": 4},  # batch 1: watermark 3000 after it
        {"url": "/a", "ts": 2_500, "bytes": 100},  # late in batch 2
        {"url": "/b", "ts": 20_000, "bytes": 8},
    ]
    out: list[Any] = []
    late: list[Any] = []
    runner = LocalRunner(
        function,
        key_selector=lambda r: r["url"],
        sink=out.append,
        late_sink=late.append,
        event_time=EventTime("ts", 0),
        config={"statekit.batch-size": 3, "statekit.checkpoints.dir": str(tmp_path)},
    )
    result = runner.run(RecordSource(recs))
    runner.close()
    assert late == [recs[3]] and result.late_records == 1
    # Batch 2's watermark (20000) passes /b's first timer (12000) and /a's (13000), in timestamp order,
    # after batch 2's rows; /b's second (30000) fires at the end of input.
    assert out == [
        {"url": "/b", "total": 10, "at": 12_000},
        {"url": "/a", "total": 5, "at": 13_000},
        {"url": "/b", "total": 10, "at": 30_000},
    ]


@pytest.mark.parametrize("function", [Vectorized, Columns])
def test_process_of_one_record_is_a_batch_of_one(tmp_path: Path, function: Any) -> None:
    with LocalRunner(function, key_selector=lambda r: r["url"]) as runner:
        assert runner.process({"url": "/a", "seq": 1, "method": "GET", "bytes": 3}) == [
            {"url": "/a", "count": 1, "seq": 1}
        ]
        assert runner.process_batch(records(3, keys=1)) == [
            {"url": "/u0", "count": i + 1, "seq": i} for i in range(3)
        ]


class Bad(KeyedBatchFunction):
    def process_batch(self, rows: Any, ctx: ProcessContext) -> Any:
        return ["not", "columns"]


def test_a_columns_functions_process_batch_needs_its_context() -> None:
    with LocalRunner(Columns, key_selector=lambda r: r["url"]) as runner:
        runner.process({"url": "/a", "seq": 1, "method": "GET", "bytes": 3})  # opens the subtasks
        st = runner._operator.ensure()[0]
        plain = ProcessContext(st.ctx, st.timers)
        plain.current_key = "/a"
        with pytest.raises(TypeError, match="runs with a ColumnsContext"):
            st.function.process_batch(pa.RecordBatch.from_pylist([{"url": "/a"}]), plain)


def test_bad_records_outputs_and_settings_are_named() -> None:
    with LocalRunner(Vectorized, key_selector=lambda r: r[0]) as runner:
        with pytest.raises(TypeError, match="must be dicts"):
            runner.process_batch([("/a", 1)])
    with LocalRunner(Bad, key_selector=lambda r: r["url"]) as runner:
        with pytest.raises(TypeError, match="returns a pyarrow RecordBatch or Table"):
            runner.process_batch([{"url": "/a"}])
    with pytest.raises(ConfigurationError, match="batch-size must be at least 1"):
        LocalRunner(Vectorized, key_selector=lambda r: r["url"], config={"statekit.batch-size": 0})


def test_group_runs_keeps_first_appearance_and_arrival_order() -> None:
    order, runs = group_runs(["b", "a", "b", "c", "a", "b"])
    assert order == [0, 2, 5, 1, 4, 3]
    assert runs == [("b", 0, 3), ("a", 3, 2), ("c", 5, 1)]
    order, runs = group_runs(["b", "a", "b", "c"], [1, 2, 3])
    assert order == [1, 2, 3] and runs == [("a", 0, 1), ("b", 1, 1), ("c", 2, 1)]
    # Unhashable keys group by a stand-in, and come back as they were.
    order, runs = group_runs([{"k": 1}, {"k": 2}, {"k": 1}], fallback=repr)
    assert order == [0, 2, 1] and runs == [({"k": 1}, 0, 2), ({"k": 2}, 2, 1)]


_FEW_STRINGS = st.lists(st.sampled_from(["", "a", "b", "ab", "é", "日本", "a\x00", "A"]), max_size=60)
_STRINGS = st.lists(st.text(max_size=6), max_size=60)
_INTS = st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(-3, 3), max_size=60)


@given(st.one_of(_FEW_STRINGS, _STRINGS, _INTS), st.sampled_from([None, "large", "chunked"]))
def test_arrow_groups_a_key_column_as_group_runs_groups_its_python_values(
    keys: list[Any], form: str | None
) -> None:
    """Arrow's grouping (the Spark runner's, for a batch function) is group_runs' over the same values."""
    strings = all(isinstance(k, str) for k in keys) and bool(keys)
    typ = (pa.large_string() if form == "large" else pa.string()) if strings else pa.int64()
    column = pa.array(keys, typ)
    if form == "chunked":
        half = len(keys) // 2
        column = pa.chunked_array([column.slice(0, half), column.slice(half)], typ)
    grouped = arrow_group_runs(column)
    assert grouped is not None
    order, distinct, offsets, lengths = grouped
    want_order, want_runs = group_runs(keys)
    assert order.to_pylist() == want_order
    assert list(zip(distinct, offsets, lengths)) == want_runs
    assert all(type(k) is type(w) for k, (w, _, _) in zip(distinct, want_runs))


def test_arrow_leaves_columns_whose_equality_is_not_python_s_to_group_runs() -> None:
    """Nulls, floats (NaN, -0.0), binary and dictionary columns are not grouped by Arrow."""
    for column in (
        pa.array(["a", None, "a"]),
        pa.array([0.0, -0.0, float("nan")]),
        pa.array([b"a", b"a"]),
        pa.array(["a", "b", "a"]).dictionary_encode(),
        pa.array([1, None], pa.int32()),
    ):
        assert arrow_group_runs(column) is None, column.type
    assert arrow_group_runs(pa.array([], pa.string())) is not None
    order, keys, offsets, lengths = arrow_group_runs(pa.array([7, 5, 7], pa.uint8()))  # type: ignore[misc]
    assert (order.to_pylist(), keys, offsets, lengths) == ([0, 2, 1], [7, 5], [0, 2], [2, 1])


def test_output_columns_of_every_form() -> None:
    pd = pytest.importorskip("pandas")
    want = [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    forms = [
        {"a": [1, 2], "b": ["x", "y"]},
        {"a": range(1, 3), "b": ("x", "y")},
        pa.record_batch({"a": [1, 2], "b": ["x", "y"]}),
        pa.table({"a": [1, 2], "b": ["x", "y"]}),
        pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}),
    ]
    for form in forms:
        assert output_rows(form) == want, form
    assert output_rows({"a": None, "b": ["x"]}) == [{"a": None, "b": "x"}]
    cols, n = output_columns({"b": ["x"]}, ["a", "b"])
    assert n == 1 and cols == {"a": None, "b": ["x"]}
    with pytest.raises(ValueError, match="different lengths"):
        output_columns({"a": [1], "b": []}, None)
    with pytest.raises(ValueError, match=r"columns \['c'\] that the output schema lacks"):
        output_columns({"c": [1]}, ["a", "b"])
