"""Canonical snapshots of the heap backend, beyond the conformance kit: TTL timestamps,
corruption, copy-on-write while a snapshot is pending, and what a rescale reads."""

from __future__ import annotations

import dataclasses
import io
import linecache
import operator
import queue
import sys
import threading
from datetime import timedelta
from typing import Any

import pytest

from statekit import (
    VOID_NAMESPACE,
    AggregateFunction,
    AggregatingStateDescriptor,
    CorruptSnapshotError,
    KeyGroupRange,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateMigrationError,
    StateTtlConfig,
    ValueStateDescriptor,
    key_group_for_bytes,
    key_group_range_for_operator,
    operator_index_for_key_group,
    serializer_for,
)
from statekit.backend_api import BytesStreamHandle, KeyedStateHandle
from statekit.serializers import IntSerializer, StrSerializer

MAXP = 128
INT_NS = serializer_for(int)
NAMESPACES = [VOID_NAMESPACE, 1, 2, 3, 4]


class Mean(AggregateFunction[int, tuple[int, int], float]):
    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: int, acc: tuple[int, int]) -> tuple[int, int]:
        return (acc[0] + value, acc[1] + 1)

    def get_result(self, acc: tuple[int, int]) -> float:
        return acc[0] / acc[1]

    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], a[1] + b[1])


class Collect(AggregateFunction[int, list[int], list[int]]):
    """Collects added ints into a list accumulator that it changes in place."""

    def create_accumulator(self) -> list[int]:
        return []

    def add(self, value: int, acc: list[int]) -> list[int]:
        acc.append(value)
        return acc

    def get_result(self, acc: list[int]) -> list[int]:
        return list(acc)

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return a + b


def descriptors(ttl: StateTtlConfig | None = None) -> dict[str, Any]:
    """One state of each kind, named after its kind."""
    return {
        "value": ValueStateDescriptor("value", int, ttl=ttl),
        "list": ListStateDescriptor("list", int, ttl=ttl),
        "reducing": ReducingStateDescriptor("reducing", operator.add, int, ttl=ttl),
        "aggregating": AggregatingStateDescriptor("aggregating", Mean(), tuple[int, int], ttl=ttl),
        "map": MapStateDescriptor("map", str, int, ttl=ttl),
    }


def declare(backend, ttl: StateTtlConfig | None = None) -> dict[str, Any]:
    return {n: backend.get_state(d, namespace_serializer=INT_NS) for n, d in descriptors(ttl).items()}


def write_key(states: dict[str, Any], i: int) -> None:
    """Write key number ``i``'s state, in the void namespace and, for some keys, another one."""
    for ns in (VOID_NAMESPACE, i % 4 + 1) if i % 2 == 0 else (VOID_NAMESPACE,):
        for s in states.values():
            s.set_current_namespace(ns)
        x = i if ns is VOID_NAMESPACE else -i
        states["value"].update(x)
        states["list"].add_all([x, x + 1])
        states["reducing"].add(x)
        states["reducing"].add(1)
        states["aggregating"].add(x)
        states["map"].put_all({"a": x, "none": None})
    for s in states.values():
        s.set_current_namespace(VOID_NAMESPACE)


def populate(backend, keys, ttl: StateTtlConfig | None = None) -> dict[str, Any]:
    states = declare(backend, ttl)
    for i, k in enumerate(keys):
        backend.set_current_key(k)
        write_key(states, i)
    return states


def read(kind: str, s: Any) -> Any:
    if kind == "value":
        return s.value()
    if kind == "map":
        return dict(s.items())
    return s.get()


def dump(backend, states: dict[str, Any]) -> dict[tuple[str, Any, Any], Any]:
    """Everything ``backend`` holds in ``states``: (state, namespace, key) -> what a read returns."""
    out = {}
    for kind, s in states.items():
        for ns in NAMESPACES:
            for key in backend.keys(kind, ns):
                backend.set_current_key(key)
                s.set_current_namespace(ns)
                out[(kind, ns, key)] = read(kind, s)
        s.set_current_namespace(VOID_NAMESPACE)
    return out


def keys_of(n: int) -> list[str]:
    return [f"key-{i}" for i in range(n)]


def key_group(key: str) -> int:
    return key_group_for_bytes(StrSerializer().serialize(key), MAXP)


# --- round trips ------------------------------------------------------------------------


def test_round_trip_keeps_ttl_timestamps(make_backend, backend, clock):
    cfg = StateTtlConfig(timedelta(milliseconds=100))
    populate(backend, keys_of(20), cfg)
    handle = backend.snapshot().to_handle()
    clock.advance(99)
    target = make_backend()
    restored = declare(target, cfg)
    target.restore([handle])
    before = dump(target, restored)  # reads do not refresh (on create and write)
    assert len(before) == 5 * 30
    assert all(v not in (None, [], {}) for v in before.values())
    clock.advance(1)
    after = dump(target, restored)  # each read finds its entry expired
    assert len(after) == 5 * 30
    assert all(v in (None, [], {}) for v in after.values())
    assert target.num_entries() == 0


def test_declared_but_empty_states_restore_to_empty(make_backend, backend):
    declare(backend)
    handle = backend.snapshot().to_handle()
    assert dict(handle.offsets) == {}
    target = make_backend()
    restored = declare(target)
    target.restore([handle])
    assert target.num_entries() == 0
    assert dump(target, restored) == {}


# --- refused restores ----------------------------------------------------------------------


def test_wrong_key_serializer_raises_without_declared_states(make_backend, backend):
    populate(backend, keys_of(30))
    handle = backend.snapshot().to_handle()
    target = make_backend(key_serializer=IntSerializer())
    with pytest.raises(StateMigrationError):
        target.restore([handle])
    assert target.num_entries() == 0
    assert target.state_names == []


# --- corruption ---------------------------------------------------------------------------


def flipped(handle: KeyedStateHandle, pos: int) -> KeyedStateHandle:
    data = bytearray(handle.stream.read())
    data[pos] ^= 0xFF
    return dataclasses.replace(handle, stream=BytesStreamHandle(bytes(data)))


def _corrupt_positions(make_backend, handle, positions, declare_first):
    """The positions whose flip is not refused with CorruptSnapshotError, or leaves state behind."""
    bad = []
    for pos in positions:
        target = make_backend()
        if declare_first:
            declare(target)
        try:
            target.restore([flipped(handle, pos)])
        except CorruptSnapshotError:
            if target.num_entries() or len(target.state_names) != (5 if declare_first else 0):
                bad.append((pos, "state left behind"))
        except Exception as e:  # noqa: BLE001 - reported below
            bad.append((pos, f"{type(e).__name__}: {e}"))
        else:
            bad.append((pos, "no error"))
    return bad


@pytest.fixture
def small_snapshot(backend) -> KeyedStateHandle:
    populate(backend, keys_of(6))
    return backend.snapshot().to_handle()


@pytest.mark.parametrize("declare_first", [True, False], ids=["declared-before", "declared-after"])
def test_flipped_byte_in_header_raises_corrupt(make_backend, small_snapshot, declare_first):
    bad = _corrupt_positions(make_backend, small_snapshot, range(small_snapshot.header_length), declare_first)
    assert bad == []


@pytest.mark.parametrize("declare_first", [True, False], ids=["declared-before", "declared-after"])
def test_flipped_byte_in_any_block_raises_corrupt(make_backend, small_snapshot, declare_first):
    assert len(small_snapshot.offsets) >= 3
    positions = [p for off, ln in small_snapshot.offsets.values() for p in range(off, off + ln)]
    assert _corrupt_positions(make_backend, small_snapshot, positions, declare_first) == []


# --- copy-on-write ----------------------------------------------------------------------------


def cow_descriptors() -> dict[str, Any]:
    return {
        "int": ValueStateDescriptor("int", int),
        "dict": ValueStateDescriptor("dict", dict[str, int]),
        "ints": ValueStateDescriptor("ints", list[int]),
        "list": ListStateDescriptor("list", int),
        "map": MapStateDescriptor("map", str, int),
        "collect": AggregatingStateDescriptor("collect", Collect(), list[int]),
        "sum": ReducingStateDescriptor("sum", operator.add, int),
    }


def cow_read(name: str, s: Any) -> Any:
    if name in ("int", "dict", "ints"):
        return s.value()
    if name == "map":
        return dict(s.items())
    return s.get()


def cow_write(states: dict[str, Any], i: int) -> None:
    states["int"].update(i)
    states["dict"].update({"n": i})
    states["ints"].update([i])
    states["list"].add(i)
    states["map"].put("n", i)
    states["collect"].add(i)
    states["sum"].add(i)


def cow_mutate(states: dict[str, Any], i: int, in_place_only: bool = False) -> None:
    """Change key ``i``'s state of every kind, the way user code does."""
    d = states["dict"].value()
    d["n"] += 1000
    d["new"] = 1
    xs = states["ints"].value()
    xs.append(1000)
    if not in_place_only:
        states["dict"].update(d)
        states["ints"].update(xs)
    states["int"].update(i + 1000)
    states["list"].add(1000)
    states["map"].put("n", i + 1000)
    states["map"].put("new", 1)
    states["collect"].add(1000)
    states["sum"].add(1000)


def cow_expected(i: int, mutated: bool) -> dict[str, Any]:
    if not mutated:
        return {
            "int": i,
            "dict": {"n": i},
            "ints": [i],
            "list": [i],
            "map": {"n": i},
            "collect": [i],
            "sum": i,
        }
    return {
        "int": i + 1000,
        "dict": {"n": i + 1000, "new": 1},
        "ints": [i, 1000],
        "list": [i, 1000],
        "map": {"n": i + 1000, "new": 1},
        "collect": [i, 1000],
        "sum": i + 1000,
    }


def cow_state(backend, states, keys) -> dict[str, dict[str, Any]]:
    out = {}
    for k in keys:
        backend.set_current_key(k)
        out[k] = {n: cow_read(n, s) for n, s in states.items()}
    return out


def restored_cow_state(make_backend, handle, keys):
    target = make_backend()
    states = {n: target.get_state(d) for n, d in cow_descriptors().items()}
    target.restore([handle])
    return cow_state(target, states, keys)


def _cow_setup(backend, n):
    keys = keys_of(n)
    states = {name: backend.get_state(d) for name, d in cow_descriptors().items()}
    for i, k in enumerate(keys):
        backend.set_current_key(k)
        cow_write(states, i)
    return keys, states


def test_update_batch_does_not_touch_a_pending_snapshot(make_backend, backend):
    keys, states = _cow_setup(backend, 40)
    snap = backend.snapshot()
    states["int"].update_batch(keys, lambda v: v + 1000)
    states["ints"].update_batch(keys, lambda v: (v.append(1000), v)[1])
    restored = restored_cow_state(make_backend, snap.to_handle(), keys)
    live = cow_state(backend, states, keys)
    for i, k in enumerate(keys):
        assert (restored[k]["int"], restored[k]["ints"]) == (i, [i]), k
        assert (live[k]["int"], live[k]["ints"]) == (i + 1000, [i, 1000]), k


def _write_in_thread(snap, progress=None):
    result: dict[str, Any] = {}

    def run():
        try:
            buf = io.BytesIO()
            written = snap.write(buf, progress=progress)
            result["handle"] = KeyedStateHandle(
                BytesStreamHandle(buf.getvalue()),
                snap.header.key_group_range,
                written.offsets,
                written.header_length,
            )
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            result["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, result


def _join(t, result):
    t.join(timeout=60)
    assert not t.is_alive(), "the writer thread hung"
    if "error" in result:
        raise result["error"]
    return result["handle"]


def test_snapshot_written_by_another_thread_while_processing_goes_on(make_backend, backend):
    keys, states = _cow_setup(backend, 2000)
    snap = backend.snapshot()
    t, result = _write_in_thread(snap)
    for i, k in enumerate(keys):
        backend.set_current_key(k)
        cow_mutate(states, i)
    handle = _join(t, result)
    restored = restored_cow_state(make_backend, handle, keys)
    live = cow_state(backend, states, keys)
    for i, k in enumerate(keys):
        assert restored[k] == cow_expected(i, mutated=False), k
        assert live[k] == cow_expected(i, mutated=True), k


def test_release_racing_a_write_does_not_unprotect_the_next_snapshot(make_backend, backend):
    """The writer thread releases snapshot A while the main thread writes the same key group.

    The writer is paused (by a trace hook, no sleeping) on the line of
    ``_release_snapshot`` that decrements a key group's pin count, after its check
    passed; the main thread's write then unshares that key group. A later
    snapshot B must still be protected from writes made while it is pending.
    """
    s = backend.get_state(ValueStateDescriptor("v", int))
    backend.set_current_key("key-0")
    s.update(0)
    kg = backend.current_key_group
    snap_a = backend.snapshot()
    events: queue.Queue[str] = queue.Queue()
    resume = threading.Event()

    def local_trace(frame, event, arg):
        if (
            event == "line"
            and not resume.is_set()
            and frame.f_locals.get("kg") == kg
            and "-= 1" in linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        ):
            events.put("paused")
            resume.wait(timeout=30)
        return local_trace

    def trace(frame, event, arg):
        return local_trace if frame.f_code.co_name == "_release_snapshot" else None

    def run():
        sys.settrace(trace)
        try:
            snap_a.to_handle()
        finally:
            sys.settrace(None)
            events.put("done")

    t = threading.Thread(target=run)
    t.start()
    first = events.get(timeout=30)
    s.update(1)  # while A's release is paused (or after it finished, if it never pauses)
    resume.set()
    t.join(timeout=30)
    assert not t.is_alive()
    assert first in ("paused", "done")

    snap_b = backend.snapshot()
    s.update(2)
    restored = make_backend()
    rs = restored.get_state(ValueStateDescriptor("v", int))
    restored.restore([snap_b.to_handle()])
    restored.set_current_key("key-0")
    assert rs.value() == 1
    assert s.value() == 2


# --- rescaling ------------------------------------------------------------------------------

RESCALE_KEYS = keys_of(2000)


def subtask_backends(make_backend, p):
    return [make_backend(key_group_range=key_group_range_for_operator(MAXP, p, i)) for i in range(p)]


def owner(key: str, p: int) -> int:
    return operator_index_for_key_group(MAXP, p, key_group(key))


def expected_of(i: int) -> dict[tuple[str, Any], Any]:
    """What key number ``i`` holds after :func:`write_key`: (state, namespace) -> read."""
    out = {}
    for ns in (VOID_NAMESPACE, i % 4 + 1) if i % 2 == 0 else (VOID_NAMESPACE,):
        x = i if ns is VOID_NAMESPACE else -i
        out.update(
            {
                ("value", ns): x,
                ("list", ns): [x, x + 1],
                ("reducing", ns): x + 1,
                ("aggregating", ns): float(x),
                ("map", ns): {"a": x, "none": None},
            }
        )
    return out


def write_spread(make_backend, p, keys):
    """``keys`` written over ``p`` subtasks, each key at its owner; returns their snapshots."""
    subtasks = subtask_backends(make_backend, p)
    states = [declare(b) for b in subtasks]
    for i, k in enumerate(keys):
        j = owner(k, p)
        subtasks[j].set_current_key(k)
        write_key(states[j], i)
    assert sum(b.num_entries() for b in subtasks) == sum(len(expected_of(i)) for i in range(len(keys)))
    return [b.snapshot().to_handle() for b in subtasks]


@dataclasses.dataclass(frozen=True, eq=False)
class RecordingStream:
    """A stream handle that records the byte ranges read from it."""

    inner: BytesStreamHandle
    reads: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    @property
    def size(self) -> int:
        return self.inner.size

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        data = self.inner.read(offset, length)
        self.reads.append((offset, len(data)))
        return data

    def discard(self) -> None:
        self.inner.discard()

    def to_json(self) -> dict[str, Any]:
        return self.inner.to_json()


def recording(handle: KeyedStateHandle) -> tuple[KeyedStateHandle, RecordingStream]:
    assert isinstance(handle.stream, BytesStreamHandle)
    rec = RecordingStream(handle.stream)
    return dataclasses.replace(handle, stream=rec), rec


def _check_reads(rec: RecordingStream, handle: KeyedStateHandle, owned: KeyGroupRange) -> None:
    blocks = {o: kg for kg, o in handle.offsets.items()}
    index_start = max(o + n for o, n in handle.offsets.values())  # the index follows the last block
    block_reads = set()
    other = 0
    for off, ln in rec.reads:
        if off + ln <= handle.header_length or off >= index_start:
            other += 1
            continue  # the header, or the small index and trailer at the end (checked for corruption)
        assert (off, ln) in blocks, f"read of [{off}, {off + ln}) is neither the header nor a block"
        kg = blocks[(off, ln)]
        assert kg in owned, f"read the block of key group {kg}, which {owned} does not own"
        block_reads.add(kg)
    assert block_reads == {kg for kg in handle.offsets if kg in owned}
    assert other <= 4  # the header and the index, each read in at most two pieces


@pytest.mark.parametrize("i", [0, 1, 2])
def test_restoring_some_key_groups_reads_only_the_header_and_their_blocks(make_backend, i):
    (full,) = write_spread(make_backend, 1, RESCALE_KEYS)
    assert len(full.offsets) == MAXP
    handle, rec = recording(full)
    owned = key_group_range_for_operator(MAXP, 3, i)
    target = make_backend(key_group_range=owned)
    declare(target)
    target.restore([handle])
    assert target.num_entries() > 0
    _check_reads(rec, full, owned)


def test_rescale_does_not_read_handles_it_does_not_need(make_backend):
    handles = write_spread(make_backend, 4, RESCALE_KEYS)
    recorded = [recording(h) for h in handles]
    owned = key_group_range_for_operator(MAXP, 8, 3)  # inside the old subtask 1's range
    target = make_backend(key_group_range=owned)
    target.restore([h for h, _ in recorded])
    for j, (h, rec) in enumerate(recorded):
        if j == 1:
            _check_reads(rec, handles[j], owned)
        else:
            assert rec.reads == [], f"read old subtask {j}'s snapshot, which holds none of {owned}"
    states = declare(target)
    assert {k for (_, _, k) in dump(target, states)} == {k for k in RESCALE_KEYS if key_group(k) in owned}
