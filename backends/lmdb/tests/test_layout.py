"""What the LMDB backend puts on disk: a named database per state, composite keys, raw values."""

from __future__ import annotations

from typing import Any

import pytest

from statekit import VOID_NAMESPACE, ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from statekit.backend_api import KeyGroupRange, key_group_for_bytes
from statekit.errors import StateAccessError
from statekit.ordered_kv import KeyLayout
from statekit.serializers import IntSerializer, StrSerializer, serializer_for
from statekit.testing import ReferenceKeyedStateBackend, snapshot_handle
from statekit_lmdb._layout import state_names

INT_NS = serializer_for(int)


def test_every_state_has_its_own_named_database(make_backend: Any) -> None:
    b = make_backend()
    for d in (
        ValueStateDescriptor("a", int),
        ListStateDescriptor("b", int),
        MapStateDescriptor("c", str, int),
    ):
        b.get_state(d)
    with b.env.begin() as txn:
        assert state_names(txn) == ["a", "b", "c"]
        # The main database holds nothing but the records of the named ones.
        assert [k for k, _ in txn.cursor()] == [b"state:a", b"state:b", b"state:c"]


def test_entries_are_composite_keys_and_statekit_encoded_values(make_backend: Any, raw_entries: Any) -> None:
    b = make_backend()
    v = b.get_state(ValueStateDescriptor("v", int), namespace_serializer=INT_NS)
    b.set_current_key("user-1")
    v.update(41)
    v.set_current_namespace(7)
    v.update(42)
    layout = KeyLayout(128)
    key = StrSerializer().serialize("user-1")
    kg = key_group_for_bytes(key, 128)
    entries = dict(raw_entries(b, "v"))
    void = layout.key_prefix(kg, key) + layout.namespace_part(None)
    seven = layout.key_prefix(kg, key) + layout.namespace_part(INT_NS.serialize(7))
    assert entries == {void: IntSerializer().serialize(41), seven: IntSerializer().serialize(42)}
    assert layout.split(seven) == (kg, key, INT_NS.serialize(7), b"")


def test_key_groups_are_contiguous_ranges_in_key_order(make_backend: Any, raw_entries: Any) -> None:
    b = make_backend()
    v = b.get_state(ValueStateDescriptor("v", int))
    for i in range(500):
        b.set_current_key(f"k{i}")
        v.update(i)
    groups = [KeyLayout(128).key_group_of(k) for k, _ in raw_entries(b, "v")]
    assert groups == sorted(groups) and len(set(groups)) > 100


def test_list_elements_and_map_entries_are_entries_of_their_own(make_backend: Any, raw_entries: Any) -> None:
    b = make_backend()
    lst = b.get_state(ListStateDescriptor("l", str))
    m = b.get_state(MapStateDescriptor("m", str, int))
    b.set_current_key("k")
    lst.add_all(["x", "y"])
    lst.add("z")
    m.put_all({"a": 1, "b": 2})
    layout = KeyLayout(128)
    elements = raw_entries(b, "l")
    assert [v for _, v in elements] == [StrSerializer().serialize(s) for s in "xyz"]
    suffixes = [layout.split(k)[3] for k, _ in elements]
    assert suffixes == sorted(suffixes) and all(len(s) == 8 for s in suffixes)
    assert sorted(layout.split(k)[3] for k, _ in raw_entries(b, "m")) == [b"a", b"b"]
    assert lst.get() == ["x", "y", "z"] and dict(m.items()) == {"a": 1, "b": 2}


class _Counting:
    """Wraps a column's ``get`` or ``iterate``: counts calls."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def __call__(self, *a: Any) -> Any:
        self.calls += 1
        return self.inner(*a)


def test_list_add_and_map_point_operations_read_nothing_else(make_backend: Any) -> None:
    b = make_backend(options={"write-batch-size": 100_000})
    lst = b.get_state(ListStateDescriptor("l", int))
    m = b.get_state(MapStateDescriptor("m", str, int))
    b.set_current_key("k")
    lst.add_all(list(range(1000)))
    b.kv_write_buffered()
    cols = [b.kv_column("l"), b.kv_column("m")]
    wrapped = [(_Counting(c.get), _Counting(c.iterate)) for c in cols]
    for c, (get, it) in zip(cols, wrapped):
        c.get, c.iterate = get, it
    for i in range(100):
        lst.add(i)  # appends under a new sequence number: no read of the 1000 elements
    lst.add_all([1, 2, 3])
    m.put("a", 1)
    assert m.contains("a") and m.get("a") == 1 and m.get("zz") is None
    # Only the miss of "zz" reached LMDB ("a" is still buffered), as one point read.
    assert [(get.calls, it.calls) for get, it in wrapped] == [(0, 0), (1, 0)]
    assert len(lst.get()) == 1103


def test_buffered_writes_are_read_back_and_committed_in_batches(make_backend: Any, raw_entries: Any) -> None:
    b = make_backend(options={"write-batch-size": 10})
    v = b.get_state(ValueStateDescriptor("v", int, default=0))
    col = b.kv_column("v")
    for i in range(9):
        b.set_current_key(f"k{i}")
        v.update(i)
    with b.env.begin(db=col.engine.db) as txn:
        assert txn.stat(col.engine.db)["entries"] == 0  # nothing committed yet
    assert b.kv_pending == 9
    b.set_current_key("k3")
    assert v.value() == 3
    b.set_current_key("k9")
    v.update(9)  # the tenth update commits the batch
    with b.env.begin(db=col.engine.db) as txn:
        assert txn.stat(col.engine.db)["entries"] == 10
    assert b.kv_pending == 0 and len(raw_entries(b, "v")) == 10


def test_no_write_transaction_is_left_open_between_calls(make_backend: Any) -> None:
    """LMDB ties a write transaction to its thread: the backend holds none once a call returns."""
    b = make_backend(options={"write-batch-size": 3})
    v = b.get_state(ValueStateDescriptor("v", int, default=0))
    lst = b.get_state(ListStateDescriptor("l", int))
    for i in range(10):
        b.set_current_key(f"k{i}")
        v.update(i)
        lst.add(i)
        assert lst.get() == [i]
        with b.env.begin(write=True) as txn:  # would raise (same thread) if one were open
            txn.put(b"probe", b"")


def test_keys_longer_than_lmdb_allows_are_refused_clearly(make_backend: Any) -> None:
    b = make_backend()
    v = b.get_state(ValueStateDescriptor("v", int))
    lst = b.get_state(ListStateDescriptor("l", int))
    m = b.get_state(MapStateDescriptor("m", str, int))
    ns = b.get_state(ValueStateDescriptor("ns", int), namespace_serializer=StrSerializer())
    # A key too long for any entry: refused at its first use, before anything is buffered.
    b.set_current_key("x" * 600)
    with pytest.raises(StateAccessError, match="at most 511 bytes"):
        v.update(1)
    with pytest.raises(StateAccessError, match="at most 511 bytes"):
        lst.add(1)
    b.set_current_key("x" * 400)
    v.update(1)  # fits
    # Too long only with a map's user key or a namespace: refused too, before anything is buffered.
    m.put("ok", 1)
    with pytest.raises(StateAccessError, match="at most 511 bytes"):
        m.put("u" * 200, 2)
    with pytest.raises(StateAccessError, match="at most 511 bytes"):
        m.put_all({"fine": 3, "u" * 200: 4})  # all or nothing
    ns.set_current_namespace("n" * 200)
    with pytest.raises(StateAccessError, match="at most 511 bytes"):
        ns.update(3)
    assert m.get("u" * 200) is None and not m.contains("u" * 200)  # such keys read as absent
    m.remove("u" * 200)
    b.kv_write_buffered()
    assert dict(m.items()) == {"ok": 1} and v.value() == 1 and b.num_entries() == 2


@pytest.mark.parametrize(
    ("start", "end", "adopted"),
    [(10, 70, False), (0, 20, False), (100, 127, False), (0, 95, True), (20, 127, True)],
)
def test_a_native_restore_into_part_of_the_key_groups_keeps_exactly_those(
    make_backend: Any, monkeypatch: Any, start: int, end: int, adopted: bool
) -> None:
    """Mostly the snapshot's key groups: its file is adopted and clipped; else the owned range is copied."""
    from statekit_lmdb import LMDBKeyedStateBackend

    replaced: list[str] = []
    real = LMDBKeyedStateBackend.lmdb_replace_env

    def spy(self: Any, data_file: str) -> None:
        replaced.append(data_file)
        real(self, data_file)

    monkeypatch.setattr(LMDBKeyedStateBackend, "lmdb_replace_env", spy)
    src = make_backend(options={"native-format": "full"})  # full copies: adopted and clipped
    v = src.get_state(ValueStateDescriptor("v", int))
    m = src.get_state(MapStateDescriptor("m", str, int))
    for i in range(300):
        src.set_current_key(f"k{i}")
        v.update(i)
        m.put("a", i)
    handle = snapshot_handle(src, native=True)
    part_range = KeyGroupRange.of(start, end)
    part = make_backend(part_range)
    part.restore_native([handle])
    assert bool(replaced) is adopted
    pv = part.get_state(ValueStateDescriptor("v", int))
    owned = [
        i for i in range(300) if key_group_for_bytes(StrSerializer().serialize(f"k{i}"), 128) in part_range
    ]
    assert sorted(part.keys("v", VOID_NAMESPACE)) == sorted(f"k{i}" for i in owned)
    assert part.num_entries() == 2 * len(owned)  # the map state too, undeclared
    for i in owned:
        part.set_current_key(f"k{i}")
        assert pv.value() == i


def test_a_savepoint_with_keys_too_long_for_lmdb_is_refused_clearly(make_backend: Any) -> None:
    source = ReferenceKeyedStateBackend(
        key_serializer=StrSerializer(), key_group_range=KeyGroupRange.of(0, 127), max_parallelism=128
    )
    v = source.get_state(ValueStateDescriptor("v", int))
    source.set_current_key("short")
    v.update(1)
    source.set_current_key("y" * 600)
    v.update(2)
    handle = snapshot_handle(source)
    target = make_backend()
    target.get_state(ValueStateDescriptor("v", int))
    with pytest.raises(StateAccessError, match="at most 511 bytes"):
        target.restore([handle])
    assert target.num_entries() == 0  # nothing of it was written


def test_update_batch_reads_through_commits_its_function_causes(make_backend: Any) -> None:
    b = make_backend(options={"write-batch-size": 5})
    v = b.get_state(ValueStateDescriptor("v", int, default=0))
    lst = b.get_state(ListStateDescriptor("l", int))
    keys = [f"k{i}" for i in range(50)]
    v.update_batch(keys, lambda x: x + 1)

    def fn(x: int) -> int:
        lst.add(x)
        assert lst.get()  # a scan: commits the buffer, and a new read transaction begins
        return x + 10

    b.set_current_key("side")  # every key of the batch is known: it stays current during the batch
    assert v.update_batch(keys + keys, fn) == [11] * 50 + [21] * 50
    assert b.get_current_key() == "k49"
    b.set_current_key("k7")
    assert v.value() == 21
    b.set_current_key("side")
    assert lst.get() == [1] * 50 + [11] * 50
