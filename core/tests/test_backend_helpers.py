"""What backend authors build on: the declared factory, parameters, the closed guard, key-group snapshots.

The backend here is the smallest one on :class:`OrderedKVBackendBase`: each
state a dict, a frozen view a copy of them, and incremental native snapshots
from :class:`KeyGroupNativeSnapshots` (one content-addressed file per key group).
"""

from __future__ import annotations

import dataclasses
import io
import os
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from statekit import (
    Configuration,
    KeyedProcessFunction,
    ListStateDescriptor,
    LocalRunner,
    MapStateDescriptor,
    ProcessContext,
    RecordSource,
    RuntimeContext,
    ValueStateDescriptor,
)
from statekit._contracts import create_keyed_backend
from statekit.backend_api import (
    ConfigOption,
    DeclaredStateBackend,
    KeyedBackendParameters,
    KeyGroupRange,
    key_group_for_bytes,
)
from statekit.errors import ConfigurationError, CorruptSnapshotError, SnapshotCancelledError, StateAccessError
from statekit.ordered_kv import (
    KEY_GROUP_NATIVE_OPTIONS,
    KeyGroupNativeSnapshots,
    KVColumn,
    OrderedKVBackendBase,
    PrefixedKVBackendBase,
    column_prefix,
)
from statekit.plugins._registry import default_registry
from statekit.serializers import StrSerializer
from statekit.snapshot_codec import NativeFile, UploadTracker
from statekit.state._kvcount import ENTRY_COUNTS
from statekit.testing import KitNativeOutput, ManualClock, snapshot_handle

OPTIONS = (
    ConfigOption("write-batch-size", int, 1024, "Updates buffered.", minimum=1),
    ConfigOption("cache-size", int, 1 << 20, "Bytes of cache.", byte_size=True),
)


class _View:
    def __init__(self, tables: dict[str, dict[bytes, bytes]]) -> None:
        self.tables = {name: dict(t) for name, t in tables.items()}
        self.released = False

    def items(self, name: str, lower: bytes, upper: bytes | None) -> list[tuple[bytes, bytes]]:
        t = self.tables.get(name, {})
        return sorted((k, v) for k, v in t.items() if k >= lower and (upper is None or k < upper))

    def release(self) -> None:
        self.released = True


class DictKV(KeyGroupNativeSnapshots, OrderedKVBackendBase):
    """Each state a dict of composite keys; the engine functions count their calls."""

    backend_name = "dictkv"
    native_format = "dictkv-kg-1"

    def __init__(self, parameters: KeyedBackendParameters, options: Mapping[str, Any]) -> None:
        super().__init__(parameters, options=options)
        self.dictkv_options = options
        self.dictkv_tables: dict[str, dict[bytes, bytes]] = {}
        self.dictkv_calls = 0

    def kv_bind(self, col: KVColumn, create: bool) -> bool:
        table = self.dictkv_tables.get(col.name)
        if table is None:
            if not create:
                return False
            table = self.dictkv_tables[col.name] = {}

        def get(k: bytes, t: dict[bytes, bytes] = table) -> bytes | None:
            self.dictkv_calls += 1
            return t.get(k)

        def iterate(start: bytes, t: dict[bytes, bytes] = table) -> Any:
            self.dictkv_calls += 1
            return iter(sorted((k, v) for k, v in t.items() if k >= start))

        col.get, col.iterate = get, iterate
        return True

    def kv_write(self, columns: Sequence[KVColumn]) -> None:
        self.dictkv_calls += 1
        for col in columns:
            table = self.dictkv_tables[col.name]
            for k, v in col.buffer.items():
                if v is None:
                    table.pop(k, None)
                else:
                    table[k] = v
            col.buffer.clear()

    def kv_load(self, name: str, items: list[tuple[bytes, bytes]]) -> None:
        self.dictkv_tables.setdefault(name, {}).update(items)

    def kv_freeze(self) -> _View:
        return _View(self.dictkv_tables)


class DictKVBackend(DeclaredStateBackend):
    name = "dictkv"
    declared_options = OPTIONS
    keyed_backend = DictKV


def make(backend: DictKVBackend | None = None, kgr: KeyGroupRange | None = None, maxp: int = 16) -> DictKV:
    b = backend or DictKVBackend()
    keyed: DictKV = b.create_keyed_backend(
        KeyedBackendParameters(
            key_serializer=StrSerializer(),
            key_group_range=kgr or KeyGroupRange.of(0, maxp - 1),
            max_parallelism=maxp,
            clock=ManualClock(),
        )
    )
    return keyed


VALUE = ValueStateDescriptor("v", int)
LIST = ListStateDescriptor("l", int)
MAP = MapStateDescriptor("m", str, int)


def fill(b: DictKV, keys: range, base: int = 0) -> None:
    v, lst, m = b.get_state(VALUE), b.get_state(LIST), b.get_state(MAP)
    for i in keys:
        b.set_current_key(f"k{i}")
        v.update(base + i)
        lst.add_all([i, i + 1])
        m.put("a", i)


def contents(b: DictKV, keys: range) -> dict[str, tuple[Any, Any, Any]]:
    v, lst, m = b.get_state(VALUE), b.get_state(LIST), b.get_state(MAP)
    out = {}
    for i in keys:
        try:
            b.set_current_key(f"k{i}")
        except StateAccessError:
            continue  # another subtask's key
        out[f"k{i}"] = (v.value(), lst.get(), dict(m.items()))
    return out


# --- the declared factory and the parameters -------------------------------------------------------


def test_the_declared_factory_parses_defaults_and_passes_options_and_parameters() -> None:
    backend = DictKVBackend({"cache-size": "2mb"})
    assert backend.options == {"write-batch-size": 1024, "cache-size": 2 << 20}
    keyed = make(backend)
    assert keyed.dictkv_options == backend.options
    assert keyed.parameters.max_parallelism == 16 and keyed.max_parallelism == 16
    assert keyed.kv_batch_size == 1024
    assert make(DictKVBackend({"write-batch-size": 7})).kv_batch_size == 7
    with pytest.raises(ConfigurationError, match=r"has no options \['cach-size'\]"):
        DictKVBackend({"cach-size": 1})
    with pytest.raises(ConfigurationError, match=r"statekit\.backend\.dictkv\.write-batch-size"):
        DictKVBackend({"write-batch-size": 0})


def test_the_base_still_takes_keyword_arguments_and_needs_the_three() -> None:
    class Plain(DictKV):
        def __init__(self, **kw: Any) -> None:
            OrderedKVBackendBase.__init__(self, **kw)
            self.dictkv_tables = {}
            self.dictkv_calls = 0

    b = Plain(key_serializer=StrSerializer(), key_group_range=KeyGroupRange.of(0, 3), max_parallelism=4)
    assert b.parameters == KeyedBackendParameters(StrSerializer(), KeyGroupRange.of(0, 3), 4)
    with pytest.raises(TypeError, match="pass the KeyedBackendParameters"):
        Plain(key_serializer=StrSerializer())


# --- the closed guard, and the reserved names ----------------------------------------------------


@pytest.mark.parametrize("buffer", [1, 1024])
def test_a_handle_used_after_close_raises_naming_the_state_and_never_reaches_the_engine(buffer: int) -> None:
    b = make(DictKVBackend({"write-batch-size": buffer}))
    v, lst, m = b.get_state(VALUE), b.get_state(LIST), b.get_state(MAP)
    b.set_current_key("k")
    v.update(1)
    lst.add(1)
    m.put("a", 1)
    b.close()
    calls = b.dictkv_calls
    uses = [
        ("v", lambda: v.value()),
        ("v", lambda: v.update(2)),
        ("v", lambda: v.update_batch(["k"], lambda x: x)),
        ("l", lambda: lst.get()),
        ("l", lambda: lst.add(2)),
        ("m", lambda: m.put("b", 2)),
        ("m", lambda: m.get("a")),
        ("m", lambda: list(m.items())),
        ("m", lambda: m.is_empty()),
    ]
    for name, use in uses:
        with pytest.raises(StateAccessError, match=f"state {name!r} is used after its backend was closed"):
            use()
    assert b.dictkv_calls == calls  # nothing reached the engine


def test_layout_and_sequence_are_reserved_when_the_class_is_defined() -> None:
    for name in ("layout", "sequence"):
        with pytest.raises(TypeError, match=f"defines {name}, which OrderedKVBackendBase uses"):
            type("Mine", (DictKV,), {name: None})
    with pytest.raises(TypeError, match="defines native_uploads, which KeyedBackendBase uses"):
        type("Mine", (DictKV,), {"native_uploads": None})


# --- the completion bookkeeping ------------------------------------------------------------------


def _file(name: str, cid: int, shared: bool = True) -> NativeFile:
    return NativeFile(name, None, 0, 0, shared, cid, "0" * 64)  # type: ignore[arg-type]


def test_the_last_confirmed_checkpoint_s_files_are_the_referenceable_ones() -> None:
    t = UploadTracker()
    t.uploaded(1, {"a": _file("a", 1), "b": _file("b", 1), "x": _file("x", 1, shared=False)})
    assert t.reusable("a") is None  # not confirmed yet
    t.uploaded(2, {"a": _file("a", 1)})
    t.complete(1)
    assert set(t.referenceable) == {"a", "b"}  # unshared files are never referenced
    t.complete(2)
    assert set(t.referenceable) == {"a"}  # b is no longer held: retention may delete it
    t.uploaded(3, {"c": _file("c", 3)})
    t.abort(3)
    t.complete(3)
    assert set(t.referenceable) == {"a"}
    t.uploaded(4, {})
    t.complete(4)
    assert t.referenceable == {}  # checkpoint 4 held nothing, so nothing is sure to exist
    t.restored(9, {"r": _file("r", 8)})
    assert t.referenceable == {}
    t.complete(9)  # the claim
    assert set(t.referenceable) == {"r"}


# --- per-key-group native snapshots ----------------------------------------------------------------


def _write(b: DictKV, cid: int, out: KitNativeOutput) -> Any:  # out: an in-memory storage
    snap = b.native_snapshot(cid)
    return snap.write(out)


def test_key_group_snapshots_upload_only_changed_key_groups_once_confirmed(tmp_path: Any) -> None:
    b = make()
    fill(b, range(200))
    out1 = KitNativeOutput(1)
    h1 = _write(b, 1, out1)
    assert len(h1.files) == 16 and h1.uploaded_size == h1.size  # every key group, uploaded
    assert all(f.name == f"kg-{kg}-{f.sha256}" for kg, f in zip(range(16), h1.files))
    b.set_current_key("k7")
    b.get_state(VALUE).update(-1)
    h2 = _write(b, 2, KitNativeOutput(2))
    assert h2.uploaded_size == h2.size  # 1 was not confirmed: nothing is referenced
    b.notify_checkpoint_complete(2)
    b.set_current_key("k8")
    b.get_state(VALUE).update(-1)
    h3 = _write(b, 3, KitNativeOutput(3))
    changed = [f for f in h3.files if f.checkpoint_id == 3]
    assert len(changed) == 1 and changed[0].name.startswith(f"kg-{b.key_group_range.start}") is False
    assert h3.entries == 200 * 3


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_key_group_snapshots_restore_and_rescale_by_whole_key_groups(tmp_path: Any, parts: int) -> None:
    src = [make(kgr=r) for r in (KeyGroupRange.of(0, 9), KeyGroupRange.of(10, 15))]
    handles = []
    for i, b in enumerate(src):
        keys = [k for k in range(300) if _owns(b, k)]
        for k in keys:
            fill(b, range(k, k + 1))
        handles.append(_write(b, 5, KitNativeOutput(5)))
    whole = {}
    for b in src:
        whole.update(contents(b, range(300)))
    bounds = {1: [(0, 15)], 2: [(0, 7), (8, 15)], 3: [(0, 4), (5, 12), (13, 15)]}[parts]
    got = {}
    for lo, hi in bounds:
        target = make(kgr=KeyGroupRange.of(lo, hi))
        own = target.key_group_range
        target.restore_native([h for h in handles if len(h.key_group_range.intersection(own))])
        got.update(contents(target, range(300)))
        target.notify_checkpoint_complete(5)  # the claim: unchanged key groups are referenced
        again = _write(target, 6, KitNativeOutput(6))
        assert again.uploaded_size == 0
    assert got == whole


def _owns(b: DictKV, k: int) -> bool:
    try:
        b.set_current_key(f"k{k}")
    except StateAccessError:
        return False
    return True


def test_a_damaged_key_group_file_is_named_before_anything_is_loaded(tmp_path: Any) -> None:
    b = make()
    fill(b, range(50))
    h = _write(b, 1, KitNativeOutput(1))
    bad = dataclasses.replace(h.files[3], sha256="1" * 64)
    damaged = dataclasses.replace(h, files=(*h.files[:3], bad, *h.files[4:]))
    target = make()
    with pytest.raises(CorruptSnapshotError, match=f"native file {bad.name}"):
        target.restore_native([damaged])
    assert target.dictkv_tables == {} or all(not t for t in target.dictkv_tables.values())
    assert snapshot_handle(target) is not None


# --- key-group deltas -------------------------------------------------------------------------------


class DeltaDictKVBackend(DeclaredStateBackend):
    name = "dictkv"
    declared_options = (*OPTIONS, *KEY_GROUP_NATIVE_OPTIONS)
    keyed_backend = DictKV


def _confirmed(b: DictKV, cid: int) -> Any:
    h = _write(b, cid, KitNativeOutput(cid))
    b.notify_checkpoint_complete(cid)
    return h


def _change(b: DictKV, i: int, r: int) -> None:
    v, lst, m = b.get_state(VALUE), b.get_state(LIST), b.get_state(MAP)
    b.set_current_key(f"k{i}")
    if i % 5 == 0:
        v.clear()
        lst.clear()
        m.clear()
    else:
        v.update(-r)
        lst.add(r)
        m.put(f"r{r}", r)


def test_changes_are_recorded_only_once_native_snapshots_are_taken() -> None:
    b = make()
    fill(b, range(50))
    b.kv_write_buffered()
    assert b.kv_changes is None  # canonical-only jobs pay nothing
    _confirmed(b, 1)
    fill(b, range(3), base=100)
    b.kv_write_buffered()
    assert {n: len(ks) for n, ks in (b.kv_changes or {}).items()} == {"v": 3, "l": 6, "m": 3}


def test_deltas_upload_the_changed_keys_and_restore_at_any_parallelism() -> None:
    b = make()
    fill(b, range(400))
    first = _confirmed(b, 1)
    handles = []
    for r in range(1, 4):
        for i in range(r, 400, 97):  # 4-5 keys, in as many key groups, some cleared
            _change(b, i, r)
        h = _confirmed(b, r + 1)
        new = [f for f in h.files if f.checkpoint_id == r + 1]
        assert [f.name for f in new] == [f"kg-delta-{r + 1}"] and new[0].size < 600
        assert [d["checkpoint_id"] for d in h.meta["deltas"]] == list(range(2, r + 2))
        assert h.entries == b.num_entries() and len(h.files) == len(first.files) + r
        handles.append(h)
    expected = contents(b, range(400))
    for bounds in ([(0, 15)], [(0, 6), (7, 15)]):
        got = {}
        for lo, hi in bounds:
            target = make(kgr=KeyGroupRange.of(lo, hi))
            target.restore_native([handles[-1]])
            got.update(contents(target, range(400)))
        assert got == expected


def test_whole_files_again_after_max_deltas_and_for_a_key_group_its_deltas_outgrow() -> None:
    b = make(DeltaDictKVBackend({"max-deltas": 2}))
    fill(b, range(400))
    _confirmed(b, 1)
    shapes = []
    for cid in range(2, 6):
        _change(b, cid, cid)
        h = _confirmed(b, cid)
        shapes.append(len(h.meta["deltas"]))
    assert shapes == [1, 2, 0, 1]  # the fourth writes every key group's file: a new chain
    # Every key of one key group changes: that key group's whole file, no block for it.
    kg = key_group_for_bytes(StrSerializer().serialize("k1"), 16)
    for i in range(400):
        if key_group_for_bytes(StrSerializer().serialize(f"k{i}"), 16) == kg:
            _change(b, i, 77)
    h = _confirmed(b, 6)
    assert h.meta["kg_since"] == {str(kg): 6}
    assert {f.name.split("-")[1] for f in h.files if f.checkpoint_id == 6} == {str(kg)}
    expected = contents(b, range(400))
    target = make()
    target.restore_native([h])
    assert contents(target, range(400)) == expected


def test_a_key_group_file_is_written_whole_with_max_deltas_off() -> None:
    b = make(DeltaDictKVBackend({"max-deltas": 0}))
    assert not b.checkpoint_bytes_follow_change
    fill(b, range(100))
    _confirmed(b, 1)
    _change(b, 3, 1)
    h = _confirmed(b, 2)
    assert b.kv_changes is None and "deltas" in h.meta and not h.meta["deltas"]
    assert [f.name.startswith("kg-") and "delta" not in f.name for f in h.files if f.checkpoint_id == 2] == [
        True
    ]


def test_a_damaged_delta_is_named_before_anything_is_loaded() -> None:
    b = make()
    fill(b, range(50))
    _confirmed(b, 1)
    _change(b, 7, 1)
    h = _confirmed(b, 2)
    i = next(i for i, f in enumerate(h.files) if f.name == "kg-delta-2")
    bad = dataclasses.replace(h.files[i], sha256="1" * 64)
    target = make()
    with pytest.raises(CorruptSnapshotError, match="native file kg-delta-2"):
        target.restore_native([dataclasses.replace(h, files=(*h.files[:i], bad, *h.files[i + 1 :]))])
    assert target.num_entries() == 0
    shuffled = dict(h.meta, deltas=[dict(h.meta["deltas"][0], checkpoint_id=9)])
    with pytest.raises(CorruptSnapshotError, match="out of order"):
        target.restore_native([dataclasses.replace(h, meta=shuffled)])


def test_a_restored_chain_is_claimed_and_continued_with_deltas() -> None:
    b = make()
    fill(b, range(200))
    _confirmed(b, 1)
    _change(b, 4, 1)
    h = _confirmed(b, 2)
    target = make()
    target.restore_native([h])
    target.notify_checkpoint_complete(2)  # the claim
    _change(target, 6, 3)
    again = _write(target, 3, KitNativeOutput(3))
    assert [f.name for f in again.files if f.checkpoint_id == 3] == ["kg-delta-3"]
    assert [d["checkpoint_id"] for d in again.meta["deltas"]] == [2, 3]
    _change(b, 6, 3)
    last = make()
    last.restore_native([again])
    assert contents(last, range(200)) == contents(b, range(200))


# --- create_keyed_backend: the parameters whole; the keyword form of 0.1 until 0.2.0 ---------------


class _KeywordFactory:
    """A third-party factory written for statekit 0.1: create_keyed_backend takes keyword arguments."""

    name = "keywords"

    def __init__(self) -> None:
        self.got: dict[str, Any] = {}

    def create_keyed_backend(self, *, key_serializer: Any, key_group_range: Any, **rest: Any) -> DictKV:
        self.got = {"key_serializer": key_serializer, "key_group_range": key_group_range, **rest}
        return DictKV(KeyedBackendParameters(key_serializer, key_group_range, rest["max_parallelism"]), {})

    def create_operator_backend(self) -> Any:
        raise NotImplementedError


def test_a_keyword_factory_still_works_and_is_told_when_it_stops(tmp_path: Any) -> None:
    params = KeyedBackendParameters(StrSerializer(), KeyGroupRange.of(0, 7), 8, local_dir=str(tmp_path))
    factory = _KeywordFactory()
    with pytest.warns(DeprecationWarning, match=r"keyword form.*removed in statekit 0\.2\.0"):
        keyed = create_keyed_backend(factory, params)
    assert factory.got["local_dir"] == str(tmp_path)
    assert factory.got["key_cache_size"] == params.key_cache_size
    assert keyed.key_group_range == KeyGroupRange.of(0, 7)
    keyed.close()


def test_declared_backends_take_the_parameters_whole_and_keywords_with_a_warning() -> None:
    params = KeyedBackendParameters(StrSerializer(), KeyGroupRange.of(0, 7), 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        keyed = create_keyed_backend(DictKVBackend(), params)  # the new form: no warning
    assert keyed.parameters == params
    keyed.close()
    with pytest.warns(DeprecationWarning, match=r"removed in statekit 0\.2\.0"):
        old = DictKVBackend().create_keyed_backend(
            key_serializer=StrSerializer(), key_group_range=KeyGroupRange.of(0, 7), max_parallelism=8
        )
    assert old.parameters == params
    old.close()
    with pytest.raises(TypeError, match="not both"):
        DictKVBackend().create_keyed_backend(params, max_parallelism=8)


# --- the ordered base owns what every engine repeated: prefixes, views, buffers, directory ------


def _scan(
    data: dict[bytes, bytes], lower: bytes, upper: bytes | None, limit: int
) -> list[tuple[bytes, bytes]]:
    keys = sorted(k for k in data if k >= lower and (upper is None or k < upper))
    return [(k, data[k]) for k in keys[:limit]]


class _Reader:
    """A copy of the key space; ``scan`` may wait on ``gate`` (to hold a read in progress)."""

    def __init__(self, data: dict[bytes, bytes], events: list[str]) -> None:
        self.data, self.events = data, events
        self.gate: threading.Event | None = None
        self.reading = threading.Event()

    def scan(self, lower: bytes, upper: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        self.reading.set()
        if self.gate is not None:
            self.gate.wait(60)
        return _scan(self.data, lower, upper, limit)

    def release(self) -> None:
        self.events.append("view released")


class OneKeySpace(KeyGroupNativeSnapshots, PrefixedKVBackendBase):
    """A sorted dict as an engine with one key space: nothing but the four methods and kv_close."""

    backend_name = "onekeyspace"
    native_format = "onekeyspace-kg-1"
    kv_dir_prefix = "onekeyspace-"
    kv_page_size = 3  # pages of three: every scan of more entries takes several

    def __init__(self, parameters: KeyedBackendParameters, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(parameters, options=options or {})
        self.data: dict[bytes, bytes] = {}
        self.events: list[str] = []
        self.readers: list[_Reader] = []

    def kv_get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def kv_scan(self, lower: bytes, upper: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        return _scan(self.data, lower, upper, limit)

    def kv_apply(self, ops: list[tuple[bytes, bytes | None]]) -> None:  # never clears a buffer
        for k, v in ops:
            if v is None:
                self.data.pop(k, None)
            else:
                self.data[k] = v

    def kv_reader(self) -> _Reader:
        self.readers.append(_Reader(dict(self.data), self.events))
        return self.readers[-1]

    def kv_close(self) -> None:
        self.events.append("engine closed")


def one_key_space(tmp_path: Any, maxp: int = 16) -> OneKeySpace:
    kgr = KeyGroupRange.of(0, maxp - 1)
    return OneKeySpace(KeyedBackendParameters(StrSerializer(), kgr, maxp, local_dir=str(tmp_path)))


def test_one_key_space_keeps_states_apart_by_prefix_and_clears_buffers_itself(tmp_path: Any) -> None:
    b = one_key_space(tmp_path)
    fill(b, range(20))
    b.kv_write_buffered()
    assert all(not c.buffer for c in b.kv_columns)  # the engine's kv_apply cleared nothing
    names = {c.name for c in b.kv_columns}
    assert names and all(any(k.startswith(column_prefix(n)) for k in b.data) for n in names)
    assert {k for n in names for k in b.data if k.startswith(column_prefix(n))} == set(b.data)
    got = contents(b, range(20))
    target = one_key_space(tmp_path)
    target.restore([snapshot_handle(b)])
    assert contents(target, range(20)) == got
    h = _write(b, 1, KitNativeOutput(1))
    native = one_key_space(tmp_path)
    native.restore_native([h])
    assert contents(native, range(20)) == got
    for x in (b, target, native):
        x.close()


def test_the_base_makes_and_removes_the_instance_directory_and_releases_views_first(tmp_path: Any) -> None:
    b = one_key_space(tmp_path)
    assert b.kv_dir is not None and os.path.dirname(b.kv_dir) == str(tmp_path) and os.path.isdir(b.kv_dir)
    fill(b, range(5))
    pending = b.snapshot()
    native = b.native_snapshot(1)
    b.close()
    assert b.closed and not os.path.exists(b.kv_dir)
    assert b.events == ["view released", "view released", "engine closed"]
    with pytest.raises(SnapshotCancelledError):
        pending.write(io.BytesIO())
    with pytest.raises(SnapshotCancelledError):
        native.write(KitNativeOutput(1))
    b.close()
    assert b.events[-1] == "engine closed" and b.events.count("engine closed") == 1


def test_a_release_waits_for_a_read_in_progress_on_another_thread(tmp_path: Any) -> None:
    b = one_key_space(tmp_path)
    fill(b, range(5))
    snap = b.native_snapshot(1)
    reader = b.readers[-1]
    reader.gate = threading.Event()
    outcome: list[Any] = []

    def write() -> None:
        try:
            outcome.append(snap.write(KitNativeOutput(1)))
        except Exception as e:  # noqa: BLE001 - the test looks at it
            outcome.append(e)

    writer = threading.Thread(target=write)
    writer.start()
    assert reader.reading.wait(60)
    closer = threading.Thread(target=b.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive() and "view released" not in b.events  # close waits for the read
    reader.gate.set()
    closer.join(60)
    writer.join(60)
    assert b.events == ["view released", "engine closed"]  # released once, after the read, before close
    # The write either finished before the release (the view stayed whole while it read) or met
    # the released view at its next read: never a read of a released view.
    assert len(outcome) == 1
    assert isinstance(outcome[0], SnapshotCancelledError) or outcome[0].checkpoint_id == 1


# --- exact entry counts, per instance (statekit.metrics.exact-entries) ------------------------------


def make_counting(exact: bool, backend: DictKVBackend | None = None) -> DictKV:
    b = backend or DictKVBackend()
    keyed: DictKV = b.create_keyed_backend(
        KeyedBackendParameters(StrSerializer(), KeyGroupRange.of(0, 15), 16, exact_entries=exact)
    )
    return keyed


def test_two_instances_in_one_process_count_or_not_each_as_its_parameters_say() -> None:
    """As two jobs in one reused Python worker: one counts exactly, the other keeps nothing."""
    factory = DictKVBackend()
    on, off = make_counting(True, factory), make_counting(False, factory)
    for b in (on, off, on):  # interleaved: neither instance's setting leaks into the other
        fill(b, range(30))
        b.kv_write_buffered()
    assert on.kv_exact_entries() == 90 == on.num_entries()  # 30 keys x (value, list, map)
    assert sum(on.kv_counts.by_state["v"].values()) == 30
    assert off.kv_exact_entries() is None and off.num_entries() == 90
    # Off: no bookkeeping on the hot path: no counts, and no engine read noted for them.
    assert off.kv_counts.by_state == {} and not off.kv_counts.enabled
    assert all(not c.known and not c.absent and c.known_limit == 0 for c in off.kv_columns)
    assert on.kv_counts.enabled and all(c.known_limit > 0 for c in on.kv_columns)
    # What a native snapshot records: the counts, or no counts and the label tools read.
    assert on.kv_native_meta()[ENTRY_COUNTS] == on.kv_counts.meta(on.stored_state_names)
    assert "entries_estimated" not in on.kv_native_meta()
    meta = off.kv_native_meta()
    assert ENTRY_COUNTS not in meta and meta["entries_estimated"] is True
    h = _write(off, 1, KitNativeOutput(1))
    assert h.meta["entries_estimated"] is True and h.entries == 90  # whole files count as they go
    on.close()
    off.close()


class _Count(KeyedProcessFunction):
    def open(self, ctx: RuntimeContext) -> None:
        self.n = ctx.get_state(ValueStateDescriptor("n", int, default=0))

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Any:
        self.n.update(self.n.value() + 1)
        yield record["k"]


@pytest.mark.parametrize("exact", [True, False])
def test_the_job_option_reaches_the_local_runner_s_backends_and_its_metrics(
    tmp_path: Any, exact: bool
) -> None:
    """statekit.metrics.exact-entries: exact state_entries, or the engine's estimate labelled one."""
    runner = LocalRunner(
        _Count,
        key_selector=lambda r: r["k"],
        job_id="counts",
        backend=DictKVBackend(),
        config={
            "statekit.checkpoints.dir": str(tmp_path / "ckpt"),
            "statekit.parallelism": 2,
            "statekit.checkpoint.interval-records": 100,
            "statekit.metrics.exact-entries": str(exact).lower(),  # as Spark's conf carries it
        },
    )
    with runner:
        result = runner.run(RecordSource([{"k": f"k{i % 37}"} for i in range(300)]))
    assert len(result.checkpoint_infos) >= 3
    for info in result.checkpoint_infos:
        assert info.stats.state_entries_exact is exact, info.location
        if exact:
            assert info.stats.state_entries == 37


def test_a_misspelled_exact_entries_key_is_refused_with_the_right_one_named() -> None:
    conf = Configuration({"spark.statekit.metrics.exact-entrys": "false"})
    with pytest.raises(ConfigurationError, match=r"Did you mean statekit\.metrics\.exact-entries\?"):
        conf.validate(default_registry(), backend_given=True, storage_given=True)
    with pytest.raises(ConfigurationError, match="expected a boolean"):
        Configuration({"statekit.metrics.exact-entries": "sometimes"}).get("statekit.metrics.exact-entries")
    assert (
        Configuration({"spark.statekit.metrics.exact-entries": "false"}).get("statekit.metrics.exact-entries")
        is False
    )
    assert Configuration().get("statekit.metrics.exact-entries") is True
