"""What the RocksDB backend puts on disk: a column family per state, composite keys, raw values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from statekit import VOID_NAMESPACE, ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from statekit.backend_api import KeyGroupRange, key_group_for_bytes
from statekit.ordered_kv import KeyLayout
from statekit.serializers import IntSerializer, StrSerializer, serializer_for
from statekit.testing import snapshot_handle

INT_NS = serializer_for(int)


def test_every_state_has_its_own_column_family(make_backend: Any) -> None:
    b = make_backend()
    for d in (
        ValueStateDescriptor("a", int),
        ListStateDescriptor("b", int),
        MapStateDescriptor("c", str, int),
    ):
        b.get_state(d)
    assert not Path(b.db_path).exists()  # nothing written yet: the instance is created on first use
    b.db  # noqa: B018 - opens it
    from rocksdict import Rdict

    assert {"state:a", "state:b", "state:c"} <= set(Rdict.list_cf(b.db_path))


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
    """Counts the engine reads of a column: point reads and iterations."""

    def __init__(self, col: Any) -> None:
        self.col, self.get, self.iterate = col, col.get, col.iterate
        self.reads = 0
        col.get, col.iterate = self._get, self._iterate

    def _get(self, key: bytes) -> Any:
        self.reads += 1
        return self.get(key)

    def _iterate(self, start: bytes) -> Any:
        self.reads += 1
        return self.iterate(start)

    def restore(self) -> None:
        self.col.get, self.col.iterate = self.get, self.iterate


def test_list_add_and_map_point_operations_read_nothing_else(make_backend: Any) -> None:
    b = make_backend()
    lst = b.get_state(ListStateDescriptor("l", int))
    m = b.get_state(MapStateDescriptor("m", str, int))
    b.set_current_key("k")
    lst.add_all(list(range(1000)))
    b.kv_write_buffered()  # the instance exists: the columns read RocksDB
    counting = _Counting(b.kv_column("l"))
    for i in range(100):
        lst.add(i)  # appends under a new sequence number: no read of the 1000 elements
    lst.add_all([1, 2, 3])
    assert counting.reads == 0
    mcount = _Counting(b.kv_column("m"))
    m.put("a", 1)
    assert m.contains("a") and m.get("a") == 1 and m.get("zz") is None
    assert mcount.reads == 1  # only the miss of "zz" reached the engine; "a" is still buffered
    counting.restore()
    mcount.restore()
    assert len(lst.get()) == 1103


def test_buffered_writes_are_read_back_and_reach_the_engine_in_batches(
    make_backend: Any, raw_count: Any
) -> None:
    b = make_backend(options={"write-batch-size": 10})
    v = b.get_state(ValueStateDescriptor("v", int, default=0))
    for i in range(9):
        b.set_current_key(f"k{i}")
        v.update(i)
    assert raw_count(b) == 0 and b.kv_pending == 9  # nothing written yet
    b.set_current_key("k3")
    assert v.value() == 3
    b.set_current_key("k9")
    v.update(9)  # the tenth update writes the batch
    assert raw_count(b) == 10


def test_a_restore_into_part_of_the_key_groups_keeps_exactly_those(make_backend: Any) -> None:
    src = make_backend()
    v = src.get_state(ValueStateDescriptor("v", int))
    for i in range(300):
        src.set_current_key(f"k{i}")
        v.update(i)
    handle = snapshot_handle(src, native=True)
    part = make_backend(KeyGroupRange.of(10, 70))
    part.restore_native([handle])
    pv = part.get_state(ValueStateDescriptor("v", int))
    owned = [
        i for i in range(300) if 10 <= key_group_for_bytes(StrSerializer().serialize(f"k{i}"), 128) <= 70
    ]
    assert sorted(part.keys("v", VOID_NAMESPACE)) == sorted(f"k{i}" for i in owned)
    for i in owned:
        part.set_current_key(f"k{i}")
        assert pv.value() == i
