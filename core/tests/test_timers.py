"""Timer semantics on the LocalRunner: order, deduplication, deletion, namespaces, end of input, lateness."""

from __future__ import annotations

import io
import json
import struct
import warnings
import zlib
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from statekit import (
    VOID_NAMESPACE,
    EventTime,
    KeyedProcessFunction,
    LocalRunner,
    OnTimerContext,
    ProcessContext,
    RecordSource,
    RuntimeContext,
    TimeDomain,
    ValueStateDescriptor,
    default_registry,
)
from statekit.serializers import serializer_for
from statekit.snapshot_codec import BytesStreamHandle, KeyedStateHandle
from statekit.testing import ManualClock
from statekit.timers import (
    MAX_WATERMARK,
    TIMER_STATE_NAMES,
    WATERMARK_PROPERTY,
    decode_timer,
    encode_timer,
    parse_duration_ms,
)
from statekit.windows import (
    Count,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    WindowedAggregate,
)


class Scripted(KeyedProcessFunction):
    """Records say what to do: ``{"k", "ts", "reg": [..], "del": [..], "proc": [..], "ns": ..}``."""

    timer_namespace = str

    def open(self, ctx: RuntimeContext) -> None:
        self.seen = ctx.get_state(ValueStateDescriptor("seen", int, default=0))

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        self.seen.update(self.seen.value() + 1)
        ns = record.get("ns", VOID_NAMESPACE)
        for t in record.get("reg", []):
            ctx.timer_service.register_event_time_timer(t, ns)
        for t in record.get("del", []):
            ctx.timer_service.delete_event_time_timer(t, ns)
        for t in record.get("proc", []):
            ctx.timer_service.register_processing_time_timer(t)
        return ()

    def on_timer(self, timestamp: int, ctx: OnTimerContext) -> Iterable[Any]:
        ns = None if ctx.namespace is VOID_NAMESPACE else ctx.namespace
        yield (ctx.current_key, timestamp, ctx.time_domain.value, ns, self.seen.value())
        if ctx.time_domain is TimeDomain.EVENT_TIME and timestamp % 100 == 1 and timestamp < 300:
            # A timer that schedules the next one: registration from the callback.
            ctx.timer_service.register_event_time_timer(timestamp + 100, ctx.namespace)


def runner(**kw: Any) -> LocalRunner:
    kw.setdefault("event_time", EventTime("ts"))
    return LocalRunner(Scripted, key_selector=lambda r: r["k"], **kw)


def test_event_timers_fire_in_timestamp_order_once_when_the_watermark_passes() -> None:
    out: list[Any] = []
    r = runner(sink=out.append, config={"statekit.parallelism": 1})
    records = [
        {"k": "a", "ts": 1, "reg": [30, 10, 20, 10]},
        {"k": "b", "ts": 2, "reg": [10, 25]},
        {"k": "a", "ts": 15},
        {"k": "c", "ts": 26},
    ]
    result = r.run(records)
    # ts 15: a@10 and b@10 fire (same time: key order); ts 26: a@20 and b@25; end of input: a@30.
    assert out == [
        ("a", 10, "event-time", None, 2),
        ("b", 10, "event-time", None, 1),
        ("a", 20, "event-time", None, 2),
        ("b", 25, "event-time", None, 1),
        ("a", 30, "event-time", None, 2),
    ]
    assert result.timers_fired == 5
    assert result.watermark == 26  # the end of time lasted for the firing only


def test_a_deleted_timer_never_fires_and_a_re_registered_one_fires_once() -> None:
    out: list[Any] = []
    r = runner(sink=out.append)
    r.run(
        [
            {"k": "a", "ts": 1, "reg": [10, 20]},
            {"k": "a", "ts": 2, "del": [10]},
            {"k": "a", "ts": 3, "del": [20]},
            {"k": "a", "ts": 4, "reg": [20]},
            {"k": "a", "ts": 5, "del": [99]},  # deleting what does not exist is a no-op
        ]
    )
    assert [o[1] for o in out] == [20]


def test_namespaces_are_separate_timers_and_reach_the_callback() -> None:
    out: list[Any] = []
    r = runner(sink=out.append)
    r.run(
        [
            {"k": "a", "ts": 1, "reg": [10], "ns": "x"},
            {"k": "a", "ts": 2, "reg": [10], "ns": "y"},
            {"k": "a", "ts": 3, "reg": [10]},
            {"k": "a", "ts": 4, "del": [10], "ns": "y"},
        ]
    )
    assert [(o[1], o[3]) for o in out] == [(10, None), (10, "x")]  # void first: namespace byte order


def test_registration_from_the_callback_fires_when_due() -> None:
    out: list[Any] = []
    r = runner(sink=out.append)
    r.run([{"k": "a", "ts": 0, "reg": [1]}, {"k": "a", "ts": 250}])
    # 1 fires at ts 250 and registers 101, already due, which registers 201, also due: all fire now.
    assert [o[1] for o in out[:3]] == [1, 101, 201]
    assert [o[1] for o in out] == [1, 101, 201, 301]  # 301 fires at the end of input


def test_end_of_input_keep_leaves_timers_for_the_next_run(tmp_path: Any) -> None:
    out: list[Any] = []
    conf = {
        "statekit.timers.end-of-input": "keep",
        "statekit.checkpoints.dir": str(tmp_path),
        "statekit.checkpoint.interval-records": 1,
    }
    records = [{"k": "a", "ts": 1, "reg": [50]}, {"k": "a", "ts": 20}]
    with runner(sink=out.append, config=conf) as r:
        result = r.run(RecordSource(records))
    assert out == [] and result.watermark == 20
    records.append({"k": "a", "ts": 60})
    with runner(sink=out.append, config=conf) as r:
        result = r.run(RecordSource(records), restore="latest")
    assert result.records == 1 and [o[1] for o in out] == [50]


# --- the end of input with fire: the end of time lasts for the firing only -----------------------

SIZE, DELAY = 10, 3


def windowed_runner(conf: dict[str, Any], out: list[Any], late: list[Any]) -> LocalRunner:
    return LocalRunner(
        lambda: WindowedAggregate(TumblingEventTimeWindows(SIZE), Count()),
        key_selector=lambda r: r["k"],
        event_time=EventTime("ts", DELAY),
        sink=out.append,
        late_sink=late.append,
        config=conf,
    )


def window_model(records: list[dict[str, Any]]) -> tuple[list[bool], list[int]]:
    """The LocalRunner's rule: per record, whether it is late, and the watermark after it."""
    watermark = -(2**63)
    late, marks = [], []
    for r in records:
        late.append(r["ts"] <= watermark)
        if not late[-1]:
            watermark = max(watermark, r["ts"] - DELAY)
        marks.append(watermark)
    return late, marks


def window_counts(records: list[dict[str, Any]], late: list[bool]) -> Counter[tuple[str, int]]:
    return Counter((r["k"], r["ts"] - r["ts"] % SIZE) for r, is_late in zip(records, late) if not is_late)


def emitted(out: list[Any]) -> Counter[tuple[str, int]]:
    """Window results as counts per (key, window start), added up over repeated results."""
    totals: Counter[tuple[str, int]] = Counter()
    for key, start, end, n in out:
        assert end - start == SIZE
        totals[(key, start)] += n
    return totals


@pytest.mark.parametrize("resume", ["restored", "same-runner"])
def test_a_run_after_an_end_of_input_that_fired_goes_on_from_the_records_watermark(
    tmp_path: Any, resume: str
) -> None:
    # Three keys; every 7th record 6 ms behind (DELAY is 3: late), every 5th 2 ms behind (not late).
    records = [{"k": "abc"[i % 3], "ts": 2 * i - 6 * (i % 7 == 3) - 2 * (i % 5 == 1)} for i in range(200)]
    split = 93  # mid-window: key a's [180, 190) has records at 180 (run 1) and 186 (run 2)
    late, marks = window_model(records)
    assert 20 < sum(late) < 40 and not late[1]
    conf = {
        "statekit.checkpoints.dir": str(tmp_path),
        "statekit.checkpoint.interval-records": 7,
        "statekit.parallelism": 2,
    }  # statekit.timers.end-of-input: fire, the default
    source = RecordSource(records)
    out1: list[Any] = []
    out2: list[Any] = []
    late_seen: list[Any] = []
    first = windowed_runner(conf, out1, late_seen)
    result1 = first.run(RecordSource(records[:split]))
    # Every window run 1 saw was emitted, those still open at its end too; the watermark is the records'.
    assert emitted(out1) == window_counts(records[:split], late[:split])
    assert result1.watermark == first.watermark == marks[split - 1]
    if resume == "restored":
        first.close()
        second = windowed_runner(conf, out2, late_seen)
        assert second.restore("latest") == result1.checkpoints[-1]
        assert second.watermark == marks[split - 1]  # what the final checkpoint holds
    else:
        second = first
        second.sink = out2.append
    result2 = second.run(source)
    second.close()
    # Run 2 processed the new records, late exactly where one uninterrupted run finds them late.
    assert result2.records == len(records) - split
    assert result2.late_records == sum(late[split:])
    assert late_seen == [r for r, is_late in zip(records, late) if is_late]
    assert result2.timers_fired > 0 and result2.watermark == marks[-1]
    # Run 2 emitted only its own records: run 1's results were not emitted again. A window open at
    # the split was emitted twice, with the records of each run; the results add up to the model.
    assert emitted(out2) == window_counts(records[split:], late[split:])
    twice = set(emitted(out1)) & set(emitted(out2))
    assert twice and all(start + SIZE - 1 > marks[split - 1] for _, start in twice)
    assert emitted(out1 + out2) == window_counts(records, late)


class WatermarkAtTimer(KeyedProcessFunction):
    """Registers ``ts + 5`` per record; reports the watermark ``process`` and ``on_timer`` read."""

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        assert ctx.timestamp is not None
        ctx.timer_service.register_event_time_timer(ctx.timestamp + 5)
        yield ("process", record["ts"], ctx.timer_service.current_watermark())

    def on_timer(self, timestamp: int, ctx: OnTimerContext) -> Iterable[Any]:
        yield ("timer", timestamp, ctx.timer_service.current_watermark())


def test_on_timer_reads_the_end_of_time_at_the_end_of_input_and_the_records_watermark_after() -> None:
    out: list[Any] = []
    r = LocalRunner(
        WatermarkAtTimer, key_selector=lambda r: r["k"], event_time=EventTime("ts"), sink=out.append
    )
    records = [{"k": "a", "ts": 1}, {"k": "b", "ts": 2}]
    r.run(RecordSource(records))
    assert out == [
        ("process", 1, -(2**63)),
        ("process", 2, 1),
        ("timer", 6, MAX_WATERMARK),  # how a function tells the end of input from time passing
        ("timer", 7, MAX_WATERMARK),
    ]
    assert r.watermark == 2
    out.clear()
    records += [{"k": "a", "ts": 3}, {"k": "a", "ts": 20}]  # the same runner reads on, past 2 records
    r.run(RecordSource(records))
    assert out == [("process", 3, 2), ("process", 20, 3), ("timer", 8, 20), ("timer", 25, MAX_WATERMARK)]
    assert r.watermark == 20
    # advance_watermark(MAX_WATERMARK) is the same end of input.
    assert r.process({"k": "b", "ts": 30}) == [("process", 30, 20)]
    assert r.advance_watermark(MAX_WATERMARK) == [("timer", 35, MAX_WATERMARK)]
    assert r.watermark == 30 and r.advance_watermark(MAX_WATERMARK) == []
    r.close()


def test_a_restored_watermark_at_the_end_of_time_warns_when_records_arrive(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = {"statekit.checkpoints.dir": str(tmp_path), "statekit.checkpoint.interval-records": 100}
    records = [{"k": "a", "ts": 1, "reg": [5]}, {"k": "b", "ts": 2}]
    with runner(config=conf) as old:
        old.run(RecordSource(records))
        # What statekit wrote before the end of time lasted for the firing only.
        monkeypatch.setattr(old, "_time_properties", lambda: {WATERMARK_PROPERTY: MAX_WATERMARK})
        location = old.checkpoint()
    late: list[Any] = []
    with runner(config=conf) as r, warnings.catch_warnings():
        warnings.simplefilter("error")
        result = r.run(RecordSource(records), restore="latest")  # nothing new: nothing to warn of
    assert result.records == 0 and result.restored_from == location
    records += [{"k": "a", "ts": 10**12, "reg": [10**12 + 1]}, {"k": "c", "ts": 10**12 + 1}]
    with runner(config=conf, late_sink=late.append) as r, pytest.warns(RuntimeWarning) as caught:
        result = r.run(RecordSource(records), restore="latest")
    assert result.late_records == 2 and late == records[2:] and result.timers_fired == 0
    assert result.watermark == MAX_WATERMARK
    [warning] = [w for w in caught.list if "end of time" in str(w.message)]
    text = str(warning.message)
    assert location in text and "all 2 records were late" in text
    assert "restore a checkpoint or savepoint taken before that end of input" in text


def test_the_timers_example_of_the_docs_runs_over_a_log_that_grows(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "state.md"
    if not page.exists():
        pytest.skip("docs are not part of this checkout")
    section = page.read_text().split("## Timers and event time", 1)[1]
    example = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" / "access.log"
    minute = 60_000

    def append(*lines: dict[str, Any]) -> None:
        with log.open("a") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)

    def run_example() -> dict[str, Any]:
        namespace: dict[str, Any] = {}
        exec(compile(example, str(page), "exec"), namespace)
        return namespace

    append(*({"url": "/a" if i % 2 else "/b", "ts": i * minute} for i in range(8)), {"url": "/a"})
    first = run_example()  # a record without "ts" is processed, and nothing is quiet yet
    assert first["result"].records == 9 and first["alerts"] == []
    append({"url": "/c", "ts": 20 * minute}, {"url": "/c", "ts": 21 * minute})
    second = run_example()
    # /a's last request was at minute 7, /b's at minute 6: the new log says both went quiet.
    assert second["result"].records == 2 and second["result"].late_records == 0
    assert sorted(second["alerts"]) == [("/a", 12 * minute), ("/b", 11 * minute)]


def test_processing_time_timers_fire_when_the_clock_reaches_them() -> None:
    clock = ManualClock(1000)
    out: list[Any] = []
    r = LocalRunner(Scripted, key_selector=lambda r: r["k"], clock=clock, sink=out.append)
    assert r.process({"k": "a", "proc": [1500, 1200, 1200]}) == []
    clock.advance(300)
    assert r.process({"k": "b"}) == [("a", 1200, "processing-time", None, 1)]
    clock.advance(1000)
    assert r.process({"k": "a"}) == [("a", 1500, "processing-time", None, 2)]


def test_late_records_go_to_the_late_sink_and_are_not_processed() -> None:
    late: list[Any] = []
    out: list[Any] = []
    r = runner(event_time=EventTime("ts", delay=5), late_sink=late.append, sink=out.append)
    recs = [
        {"k": "a", "ts": 10, "reg": [6]},
        {"k": "a", "ts": 20},
        {"k": "a", "ts": 15},
        {"k": "a", "ts": 16},
    ]
    result = r.run(recs, max_records=4)
    assert late == [{"k": "a", "ts": 15}]  # watermark 15 after ts 20: 15 is late, 16 is not
    assert result.late_records == 1
    assert out == [("a", 6, "event-time", None, 2)]  # fired once ts 20 moved the watermark past it


def test_late_records_reach_the_function_by_policy() -> None:
    r = runner(event_time=EventTime("ts", late="process"))
    r.process({"k": "a", "ts": 10})
    r.process({"k": "a", "ts": 5})
    assert r.late_records == 1
    st = r.subtasks[0]
    st.keyed_backend.set_current_key("a")
    assert st.keyed_backend.get_state(ValueStateDescriptor("seen", int, default=0)).value() == 2


def test_late_records_without_a_sink_are_counted_with_a_warning() -> None:
    r = runner()
    with pytest.warns(RuntimeWarning, match="1 late records"):
        result = r.run([{"k": "a", "ts": 10}, {"k": "a", "ts": 10}])
    assert result.late_records == 1


def test_a_namespace_without_timer_namespace_is_refused_with_the_fix() -> None:
    class NoNs(Scripted):
        timer_namespace = None

    r = LocalRunner(NoNs, key_selector=lambda r: r["k"])
    with pytest.raises(Exception, match="timer_namespace"):
        r.process({"k": "a", "reg": [5], "ns": "x"})


def test_timer_state_names_are_reserved() -> None:
    class Sneaky(KeyedProcessFunction):
        def open(self, ctx: RuntimeContext) -> None:
            ctx.get_state(ValueStateDescriptor(TIMER_STATE_NAMES[TimeDomain.EVENT_TIME], int))

        def process(self, record: Any, ctx: ProcessContext) -> None:
            return None

    with pytest.raises(ValueError, match="statekit's timers"):
        LocalRunner(Sneaky, key_selector=lambda r: r).process("x")


def test_timer_keys_order_by_time_and_round_trip() -> None:
    codes = [encode_timer(t, b"\x00") for t in (-(2**63), -5, 0, 7, 2**63 - 1)]
    assert codes == sorted(codes)
    assert [decode_timer(c)[0] for c in codes] == [-(2**63), -5, 0, 7, 2**63 - 1]
    assert decode_timer(encode_timer(3, b"\x01abc")) == (3, b"\x01abc")


@pytest.mark.parametrize(
    ("text", "ms"), [("10 seconds", 10_000), ("1 minute 30 s", 90_000), ("2 hours", 7_200_000), (250, 250)]
)
def test_durations(text: Any, ms: int) -> None:
    assert parse_duration_ms(text) == ms


def test_bad_durations_name_the_fix() -> None:
    with pytest.raises(Exception, match="90 seconds"):
        parse_duration_ms("ten minutes")


# --- checkpoints: timers and the watermark are state ---------------------------------------------


def test_timers_and_watermark_survive_restore_and_rescale(tmp_path: Any) -> None:
    conf = {"statekit.checkpoints.dir": str(tmp_path), "statekit.max-parallelism": 16}
    keys = [f"k{i}" for i in range(12)]
    first = [{"k": k, "ts": i, "reg": [20 + i]} for i, k in enumerate(keys)]
    with runner(config={**conf, "statekit.parallelism": 2}) as r:
        r.run(first, max_records=len(first))
        r.advance_watermark(3)
        r.checkpoint()
    out: list[Any] = []
    with runner(config={**conf, "statekit.parallelism": 3}, sink=out.append) as r:
        r.restore("latest", input_begins_after_savepoint=True)  # the two records come after it
        assert r.watermark == 11
        assert (
            sum(st.keyed_backend.num_entries(TIMER_STATE_NAMES[TimeDomain.EVENT_TIME]) for st in r.subtasks)
            == 12
        )
        r.run([{"k": "k0", "ts": 2}, {"k": "k0", "ts": 100}])
    assert sorted(o[1] for o in out) == list(range(20, 32))  # ts 2 was late; everything else fired once


def test_a_version_1_snapshot_still_restores() -> None:
    """Version 2 added timers to the header; version 1 files (no timers) read unchanged."""
    backend = default_registry().create_backend("heap", {})
    from statekit.backend_api import KeyedBackendParameters, KeyGroupRange

    kb = backend.create_keyed_backend(
        KeyedBackendParameters(
            key_serializer=serializer_for(str), key_group_range=KeyGroupRange.of(0, 7), max_parallelism=8
        )
    )
    state = kb.get_state(ValueStateDescriptor("n", int))
    for i in range(20):
        kb.set_current_key(f"k{i}")
        state.update(i)
    buf = io.BytesIO()
    res = kb.snapshot().write(buf)
    data = buf.getvalue()
    magic, version, hlen = struct.unpack_from("<8sHI", data)
    assert version == 2
    header = json.loads(data[14 : 14 + hlen])
    assert header["timers"] == {}
    del header["timers"]
    hj = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    head = struct.pack("<8sHI", magic, 1, len(hj)) + hj
    head += struct.pack("<I", zlib.crc32(head))
    old_head_len = 14 + hlen + 4
    shift = len(head) - old_head_len
    body = data[old_head_len:]
    # The index at the end stores absolute offsets: rewrite it for the shorter header.
    (index_off,) = struct.unpack_from("<Q", body, len(body) - 16)
    n_blocks = struct.unpack_from("<I", data, index_off)[0]
    entries = [struct.unpack_from("<IQQ", data, index_off + 4 + 20 * i) for i in range(n_blocks)]
    ib = struct.pack("<I", n_blocks) + b"".join(struct.pack("<IQQ", kg, o + shift, n) for kg, o, n in entries)
    blocks = data[old_head_len:index_off]
    v1 = (
        head
        + blocks
        + ib
        + struct.pack("<I", zlib.crc32(ib))
        + struct.pack("<Q8s", index_off + shift, b"STKINDEX")
    )
    handle = KeyedStateHandle(
        BytesStreamHandle(v1, "v1"),
        KeyGroupRange.of(0, 7),
        {kg: (o + shift, n) for kg, (o, n) in res.offsets.items()},
        len(head),
    )
    target = backend.create_keyed_backend(
        KeyedBackendParameters(
            key_serializer=serializer_for(str), key_group_range=KeyGroupRange.of(0, 7), max_parallelism=8
        )
    )
    target.restore([handle])
    s2 = target.get_state(ValueStateDescriptor("n", int))
    for i in range(20):
        target.set_current_key(f"k{i}")
        assert s2.value() == i


# --- windows ------------------------------------------------------------------------------


def test_window_assigners() -> None:
    assert TumblingEventTimeWindows(10).assign(25) == [TimeWindow(20, 30)]
    assert TumblingEventTimeWindows(10).assign(-1) == [TimeWindow(-10, 0)]
    assert TumblingEventTimeWindows(10, offset=3).assign(12) == [TimeWindow(3, 13)]
    assert SlidingEventTimeWindows(10, 5).assign(12) == [TimeWindow(5, 15), TimeWindow(10, 20)]
    assert TumblingEventTimeWindows("1 minute").assign(61_000) == [TimeWindow(60_000, 120_000)]


@pytest.mark.parametrize("backend", ["heap", "rocksdb", "lmdb"])
def test_windowed_counts_are_emitted_once_and_their_state_cleared(backend: str) -> None:
    if backend not in default_registry().backends():
        pytest.skip(f"{backend} is not installed")
    out: list[Any] = []
    r = LocalRunner(
        lambda: WindowedAggregate(SlidingEventTimeWindows(20, 10), Count()),
        key_selector=lambda r: r["k"],
        event_time=EventTime("ts", 5),
        sink=out.append,
        config={"statekit.backend": backend, "statekit.parallelism": 2},
    )
    ts = [1, 3, 12, 15, 9, 31, 44, 2]
    r.run([{"k": "a", "ts": t} for t in ts] + [{"k": "b", "ts": 50}], max_records=9)
    # ts 15 moves the watermark to 10: [-10,10) fires, so ts 9 is late; after 44 it is 39.
    assert out == [
        ("a", -10, 10, 2),
        ("a", 0, 20, 4),
        ("a", 10, 30, 2),
        ("a", 20, 40, 1),
    ]
    assert r.late_records == 2  # ts 9 and ts 2
    remaining = r.advance_watermark(MAX_WATERMARK)
    assert sorted(remaining) == [("a", 30, 50, 2), ("a", 40, 60, 1), ("b", 40, 60, 1), ("b", 50, 70, 1)]
    for st in r.subtasks:
        assert st.keyed_backend.num_entries() == 0  # every window's state and timer is gone
    r.close()
