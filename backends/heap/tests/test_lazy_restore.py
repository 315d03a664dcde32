"""Lazy restores of the heap backend: key groups held as checked bytes until first used.

The kit (``tests/test_conformance.py``) holds every backend to exact restores;
these cases reach into the heap's own tables to check what stays undecoded and
that every way of reading the state (handles, counts, iteration, snapshots of
both kinds, rescales) sees exactly the restored entries meanwhile.

Every case runs twice (the ``by_key`` fixture): with value states read and
written by key while their key groups stay bytes (numpy loaded, as in a
Spark worker), and with every key group decoded at its first use (no key
column searchable).
"""

from __future__ import annotations

import dataclasses
import random
import sys
from datetime import timedelta
from typing import Any

import pytest

from statekit import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    TtlVisibility,
    ValueStateDescriptor,
)
from statekit.backend_api import KeyGroupRange, key_group_for_bytes
from statekit.checkpointing import key_group_range_for_operator
from statekit.errors import CorruptSnapshotError, SnapshotError, StateAccessError
from statekit.serializers import StrSerializer
from statekit.snapshot_codec import NativeFile, NativeStateHandle, SectionLookup
from statekit.snapshots import _lookup as snapshots_lookup
from statekit.testing import KitNativeOutput
from statekit_heap import HeapKeyedStateBackend
from statekit_heap import _backend as heap_backend

VALUE = ValueStateDescriptor("v", int)
LIST = ListStateDescriptor("l", int)
MAP = MapStateDescriptor("m", str, int)
WINDOWED = ValueStateDescriptor("w", int)
NAMESPACES = ["w1", "w2", "w3"]

Model = dict[tuple[str, Any, str], Any]  # (state, namespace or None, key) -> value


@pytest.fixture(autouse=True, params=["by key", "decoded"])
def by_key(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """True: str key columns are searchable (numpy loaded) and lookups never decode a key group
    (these states are small: a few lookups would cost more than decoding); False: no key column is."""
    if request.param == "by key":
        pytest.importorskip("numpy")
        monkeypatch.setattr(heap_backend, "_LOOKUP_BUDGET", 1e9)
        return True
    monkeypatch.setattr(SectionLookup, "of", classmethod(lambda cls, *args: None))
    return False


def declare(b: HeapKeyedStateBackend) -> dict[str, Any]:
    return {
        "v": b.get_state(VALUE),
        "l": b.get_state(LIST),
        "m": b.get_state(MAP),
        "w": b.get_state(WINDOWED, namespace_serializer=StrSerializer()),
    }


def mutate(b: HeapKeyedStateBackend, model: Model, rng: random.Random, n: int, keys: int) -> None:
    """``n`` random writes and removals over every kind of state, mirrored in ``model``."""
    hs = declare(b)
    for _ in range(n):
        key = f"k{rng.randrange(keys)}"
        b.set_current_key(key)
        op = rng.randrange(8)
        if op == 0:
            hs["v"].update(rng.randrange(100))
            model["v", None, key] = hs["v"].value()
        elif op == 1:
            hs["v"].clear()
            model.pop(("v", None, key), None)
        elif op == 2:
            hs["l"].add(rng.randrange(100))
            model["l", None, key] = hs["l"].get()
        elif op == 3:
            hs["l"].clear()
            model.pop(("l", None, key), None)
        elif op == 4:
            hs["m"].put(f"u{rng.randrange(3)}", rng.randrange(100))
            model["m", None, key] = dict(hs["m"].items())
        elif op == 5:
            hs["m"].remove(f"u{rng.randrange(3)}")
            m = dict(hs["m"].items())
            if m:
                model["m", None, key] = m
            else:
                model.pop(("m", None, key), None)
        else:
            ns = rng.choice(NAMESPACES)
            hs["w"].set_current_namespace(ns)
            if op == 6:
                hs["w"].update(rng.randrange(100))
                model["w", ns, key] = hs["w"].value()
            else:
                hs["w"].clear()
                model.pop(("w", ns, key), None)


def read_all(b: HeapKeyedStateBackend, keys: list[str]) -> Model:
    """Every entry of ``keys``, read through the handles (key group by key group as records would)."""
    hs = declare(b)
    out: Model = {}
    for key in keys:
        b.set_current_key(key)
        if hs["v"].value() is not None:
            out["v", None, key] = hs["v"].value()
        if hs["l"].get():
            out["l", None, key] = hs["l"].get()
        if not hs["m"].is_empty():
            out["m", None, key] = dict(hs["m"].items())
        for ns in NAMESPACES:
            hs["w"].set_current_namespace(ns)
            if hs["w"].value() is not None:
                out["w", ns, key] = hs["w"].value()
    return out


def counts(model: Model) -> dict[str, int]:
    out = dict.fromkeys("vlmw", 0)
    for state, _, _ in model:
        out[state] += 1
    return out


def lazy_groups(b: HeapKeyedStateBackend) -> dict[str, int]:
    """Per state, its key groups still bytes and never read (a key group read by key is still bytes)."""
    return {name: len(t.lazy.keys() - t.partial.keys()) for name, t in b._tables.items()}


def checkpoint(b: HeapKeyedStateBackend, cid: int) -> NativeStateHandle:
    h = b.native_snapshot(cid).write(KitNativeOutput(cid))
    b.notify_checkpoint_complete(cid)
    return h


def chain_of(make_backend: Any, seed: int, deltas: int) -> tuple[NativeStateHandle, Model]:
    """A checkpoint whose chain is a base and ``deltas`` deltas (removals among them), and its model."""
    rng = random.Random(seed)
    b = make_backend()
    b.delta_max_ratio = 100.0  # deltas, however small the base
    model: Model = {}
    mutate(b, model, rng, 600, 150)
    h = checkpoint(b, 1)
    for i in range(deltas):
        mutate(b, model, rng, 80, 150)
        h = checkpoint(b, 2 + i)
    assert [link["kind"] for link in h.meta["chain"]] == ["base"] + ["delta"] * deltas
    return h, model


@pytest.mark.parametrize("deltas", [0, 3])
def test_a_restore_decodes_nothing_until_a_key_group_is_used(make_backend, deltas, by_key):
    h, model = chain_of(make_backend, 7, deltas)
    b = make_backend()
    declare(b)
    b.restore_native([h])
    held = lazy_groups(b)
    assert held and all(held.values())  # every restored key group is still bytes
    assert {s: b.num_entries(s) for s in "vlmw"} == counts(model)
    assert b.num_entries() == len(model)
    keys = sorted({k for _, _, k in model})
    b.set_current_key(keys[0])
    kg = b.current_key_group
    assert declare(b)["v"].value() == model.get(("v", None, keys[0]))
    v = b._tables["v"]
    assert (kg in v.partial) if by_key else (kg not in v.lazy)  # read by key, or decoded
    assert lazy_groups(b)["v"] == held["v"] - 1  # only this key group of this state
    assert all(len(b._tables[s].lazy) == held[s] for s in "lmw")
    assert read_all(b, keys) == model
    assert lazy_groups(b) == dict.fromkeys("vlmw", 0)
    assert {s: b.num_entries(s) for s in "vlmw"} == counts(model)


def test_states_declared_after_the_restore_are_lazy_too(make_backend):
    h, model = chain_of(make_backend, 8, 2)
    b = make_backend()
    b.restore_native([h])  # nothing declared: the runner's order (restore, then open())
    assert b.num_entries() == len(model)
    declare(b)
    assert all(lazy_groups(b).values())
    assert read_all(b, sorted({k for _, _, k in model})) == model


@pytest.mark.parametrize("deltas", [0, 2])
def test_writes_and_checkpoints_while_key_groups_are_lazy_restore_exactly(make_backend, deltas):
    h, model = chain_of(make_backend, 9, deltas)
    rng = random.Random(90)
    b = make_backend()
    b.delta_max_ratio = 100.0
    b.restore_native([h])
    b.notify_checkpoint_complete(h.checkpoint_id)  # the runner's claim: later deltas build on the chain
    mutate(b, model, rng, 40, 150)  # touches some key groups only
    assert any(lazy_groups(b).values())
    canonical = b.snapshot().to_handle()  # untouched key groups' bytes copied through (or merged)
    cid = h.checkpoint_id + 1
    delta = checkpoint(b, cid)  # a delta against the restored chain
    assert delta.meta["chain"][-1]["kind"] == "delta"
    assert any(lazy_groups(b).values())
    base_b = make_backend()
    base_b.restore_native([h])
    base_b._delta_forget_chain()
    base = checkpoint(base_b, cid)  # a base written while every key group is lazy
    assert base.meta["chain"][-1]["kind"] == "base"
    keys = sorted({f"k{i}" for i in range(150)})
    from_canonical = make_backend()
    from_canonical.restore([canonical])
    assert read_all(from_canonical, keys) == model
    for handle, expected in ((delta, model), (base, None)):
        r = make_backend()
        r.restore_native([handle])
        assert r.num_entries() == (len(model) if expected is not None else base_b.num_entries())
        got = read_all(r, keys)
        assert got == (expected if expected is not None else read_all(base_b, keys))


def test_a_snapshot_taken_while_lazy_keeps_the_entries_as_they_were(make_backend):
    h, model = chain_of(make_backend, 10, 1)
    b = make_backend()
    b.restore_native([h])
    snap = b.snapshot()
    rng = random.Random(100)
    after = dict(model)
    mutate(b, after, rng, 300, 150)  # decodes and changes key groups the snapshot still holds as bytes
    assert after != model
    r = make_backend()
    r.restore([snap.to_handle()])
    assert read_all(r, [f"k{i}" for i in range(150)]) == model


def test_iterating_a_state_decodes_it_and_sees_every_key(make_backend):
    h, model = chain_of(make_backend, 11, 2)
    b = make_backend()
    b.restore_native([h])
    declare(b)
    assert sorted(b.keys("v")) == sorted(k for s, _, k in model if s == "v")
    assert sorted(b.keys("w", "w2")) == sorted(k for s, ns, k in model if s == "w" and ns == "w2")
    assert not b._tables["v"].lazy and not b._tables["w"].lazy


def test_a_rescale_restores_each_half_lazily_and_exactly(make_backend):
    h, model = chain_of(make_backend, 12, 2)
    halves = [KeyGroupRange.of(0, 63), KeyGroupRange.of(64, 127)]
    got: Model = {}
    total = 0
    for r in halves:
        b = make_backend(key_group_range=r)
        b.restore_native([h])
        assert all(lazy_groups(declare(b) and b).values())
        total += b.num_entries()
        mine = []
        for key in sorted({k for _, _, k in model}):
            try:
                b.set_current_key(key)
            except StateAccessError:
                continue
            mine.append(key)
        got.update(read_all(b, mine))
    assert total == len(model)
    assert got == model


def test_a_base_written_after_a_rescale_merges_each_key_groups_base_and_deltas(make_backend):
    """A rescaled subtask's first checkpoint is a base: its lazy key groups' base, changes and removals
    merged (by key in the void namespace, by namespace and key otherwise), with what it wrote since."""
    b = make_backend()
    b.delta_max_ratio = 100.0
    hs = declare(b)
    model: Model = {}
    keys = [f"k{i}" for i in range(200)]
    for i, key in enumerate(keys):
        b.set_current_key(key)
        hs["v"].update(i)
        model["v", None, key] = i
        for ns in NAMESPACES:
            hs["w"].set_current_namespace(ns)
            hs["w"].update(i)
            model["w", ns, key] = i
    checkpoint(b, 1)
    for i, key in enumerate(keys):
        b.set_current_key(key)
        hs["w"].set_current_namespace(NAMESPACES[i % 3])
        if i % 4 == 0:  # removals of base entries, in both states
            hs["v"].clear()
            hs["w"].clear()
            model.pop(("v", None, key))
            model.pop(("w", NAMESPACES[i % 3], key))
        elif i % 4 == 1:  # changes
            hs["v"].update(-i)
            hs["w"].update(-i)
            model["v", None, key] = -i
            model["w", NAMESPACES[i % 3], key] = -i
    h = checkpoint(b, 2)
    assert [link["kind"] for link in h.meta["chain"]] == ["base", "delta"]
    halves = [KeyGroupRange.of(0, 63), KeyGroupRange.of(64, 127)]
    got: Model = {}
    for r in halves:
        sub = make_backend(key_group_range=r)
        sub.restore_native([h])  # another parallelism: no chain to write deltas against
        sh = declare(sub)
        mine = []
        for key in keys:
            try:
                sub.set_current_key(key)
            except StateAccessError:
                continue
            mine.append(key)
        sub.set_current_key(mine[0])  # one write by key since the restore, in each state
        sh["v"].update(1000)
        sh["w"].set_current_namespace("w2")
        sh["w"].update(1000)
        model["v", None, mine[0]] = 1000
        model["w", "w2", mine[0]] = 1000
        base = checkpoint(sub, 3)
        assert [link["kind"] for link in base.meta["chain"]] == ["base"]
        r2 = make_backend(key_group_range=r)
        r2.restore_native([base])
        got.update(read_all(r2, mine))
        assert r2.num_entries() == sum(1 for _, _, k in model if k in set(mine))
    assert got == model


def test_a_delta_written_after_a_later_checkpoint_applies_on_the_chain_it_was_taken_on(make_backend):
    """Snapshot 3 taken, checkpoint 4 written and completed, then 3 written: 3 shows its own state,
    and 3 completing late does not replace 4's chain."""
    b = make_backend()
    b.delta_max_ratio = 100.0
    v = declare(b)["v"]

    def put(key: str, value: int) -> None:
        b.set_current_key(key)
        v.update(value)

    def values(h: NativeStateHandle) -> dict[str, Any]:
        r = make_backend()
        r.restore_native([h])
        rv = declare(r)["v"]
        out = {}
        for key in ("a", "b", "c"):
            r.set_current_key(key)
            out[key] = rv.value()
        return out

    put("a", 1)
    checkpoint(b, 1)
    put("a", 2)
    checkpoint(b, 2)
    taken = b.native_snapshot(3)
    put("a", 3)
    put("b", 30)
    checkpoint(b, 4)
    h3 = taken.write(KitNativeOutput(3))
    assert [link["kind"] for link in h3.meta["chain"]][-1] == "delta"
    assert values(h3) == {"a": 2, "b": None, "c": None}
    b.notify_checkpoint_complete(3)
    put("c", 5)
    assert values(checkpoint(b, 5)) == {"a": 3, "b": 30, "c": 5}


def test_a_delta_written_as_a_checkpoint_not_after_its_chain_is_refused_naming_both(make_backend):
    """A delta holds the changes since the chain it was taken on: written as an older checkpoint's
    (or that chain's own) file, it would apply on a chain that is not before it."""
    b = make_backend()
    b.delta_max_ratio = 100.0
    v = declare(b)["v"]
    b.set_current_key("a")
    v.update(1)
    checkpoint(b, 2)
    v.update(2)
    taken = b.native_snapshot(3)
    assert not taken.is_base
    with pytest.raises(SnapshotError, match="checkpoint 2.*changes since checkpoint 2"):
        taken.write(KitNativeOutput(2))


def test_a_corrupt_chain_file_is_refused_at_restore_and_nothing_is_restored(make_backend):
    h, _ = chain_of(make_backend, 13, 1)
    base = next(f for f in h.files if f.name == h.meta["chain"][0]["file"])
    data = bytearray(base.stream.data)
    data[len(data) // 2] ^= 0x40  # a byte in the middle of the entries
    base.stream.data = bytes(data)
    b = make_backend()
    declare(b)
    with pytest.raises(CorruptSnapshotError):
        b.restore_native([h])
    assert b.num_entries() == 0 and lazy_groups(b) == dict.fromkeys("vlmw", 0)


def test_deltas_without_counts_are_decoded_at_restore(make_backend, monkeypatch):
    """Deltas written before they recorded per-key-group counts: their key groups are decoded at once."""
    original = HeapKeyedStateBackend._delta_changes

    def uncounted(self: HeapKeyedStateBackend, epochs: Any) -> Any:
        out = original(self, epochs)
        for by_kg in out.values():
            for c in by_kg.values():
                c.size = None
        return out

    monkeypatch.setattr(HeapKeyedStateBackend, "_delta_changes", uncounted)
    h, model = chain_of(make_backend, 14, 2)
    b = make_backend()
    b.restore_native([h])
    declare(b)
    t = b._tables["v"]
    changed = {int(kg) for kg in range(128) if t.void[kg] and kg not in t.lazy}
    assert changed  # the key groups the deltas changed, decoded
    assert b.num_entries() == len(model)
    assert read_all(b, sorted({k for _, _, k in model})) == model


def test_states_with_a_ttl_are_decoded_at_restore(make_backend, clock):
    desc = ValueStateDescriptor("t", int, ttl=StateTtlConfig(timedelta(minutes=1)))
    b = make_backend()
    s = b.get_state(desc)
    for i in range(50):
        b.set_current_key(f"k{i}")
        s.update(i)
    h = checkpoint(b, 1)
    r = make_backend()
    r.restore_native([h])
    s2 = r.get_state(desc)
    assert not r._tables["t"].lazy
    r.set_current_key("k7")
    assert s2.value() == 7


@pytest.mark.parametrize("remembered", [False, True], ids=["looked-up", "remembered"])
def test_update_batch_decodes_the_key_groups_it_reaches(make_backend, remembered):
    h, model = chain_of(make_backend, 15, 1)
    b = make_backend()
    b.restore_native([h])
    s = declare(b)["v"]
    keys = sorted(k for st, _, k in model if st == "v")[:5]
    if remembered:  # as the Spark runner hands a batch's keys over: their groups taken as they are
        groups = [key_group_for_bytes(b.key_serializer.serialize(k), b.max_parallelism) for k in keys]
        b.remember_key_groups(keys, groups)
        assert b._remembered_groups(keys) is not None
    before = lazy_groups(b)["v"]
    got = s.update_batch(keys, lambda v: (v or 0) + 1000)
    assert got == [model["v", None, k] + 1000 for k in keys]
    assert 0 < before - lazy_groups(b)["v"] <= len(keys)  # only the key groups of these keys
    for k in keys:
        model["v", None, k] += 1000
    assert b.num_entries("v") == counts(model)["v"]
    assert read_all(b, sorted({k for _, _, k in model})) == model


def test_a_state_failing_to_decode_leaves_nothing_restored(make_backend, monkeypatch):
    """A TTL state is decoded at the restore; its failure must not leave the lazy states stored."""
    desc = ValueStateDescriptor("t", int, ttl=StateTtlConfig(timedelta(minutes=1)))
    src = make_backend()
    s, ttl_state = src.get_state(VALUE), src.get_state(desc)
    for i in range(50):
        src.set_current_key(f"k{i}")
        s.update(i)
        ttl_state.update(i)
    handle = src.snapshot().to_handle()
    b = make_backend()
    b.get_state(VALUE)
    b.get_state(desc)
    decode = b._decode

    def failing(reg: Any, sec: Any, plan: Any = None) -> Any:
        if reg.name == "t":
            raise ValueError("undecodable")
        return decode(reg, sec, plan)

    monkeypatch.setattr(b, "_decode", failing)
    with pytest.raises(ValueError, match="undecodable"):
        b.restore([handle])
    assert b.num_entries() == 0 and not b._tables["v"].lazy


def test_key_groups_of_many_keys_decode_exactly_where_arrow_splits_them(make_backend, monkeypatch):
    # A Spark worker has pyarrow loaded: key columns of 256 keys or more are split by Arrow. Keys
    # ASCII and not, overwritten and removed by a delta: every entry as written, none twice.
    pytest.importorskip("pyarrow")
    pytest.importorskip("numpy")
    from statekit.serialization import _serializers

    split: list[int] = []
    real = _serializers._ascii_strings

    def spy(lengths: Any, blob: Any, size: int) -> Any:
        out = real(lengths, blob, size)
        split.append(0 if out is None else len(out))
        return out

    monkeypatch.setattr(_serializers, "_ascii_strings", spy)
    monkeypatch.setattr(SectionLookup, "of", classmethod(lambda cls, *args: None))  # decoded, to be split
    b = make_backend(max_parallelism=4, key_group_range=KeyGroupRange.of(0, 3))
    b.delta_max_ratio = 100.0
    keys = [f"k{i}" for i in range(3000)] + [f"\u00e9{i}" for i in range(3)] + [""]
    v = b.get_state(VALUE)
    model = {}
    for i, k in enumerate(keys):
        b.set_current_key(k)
        v.update(i)
        model[k] = i
    checkpoint(b, 1)
    for i, k in enumerate(keys[::7]):
        b.set_current_key(k)
        if i % 2:
            v.clear()
            del model[k]
        else:
            v.update(-i)
            model[k] = -i
    h = checkpoint(b, 2)
    r = make_backend(max_parallelism=4, key_group_range=KeyGroupRange.of(0, 3))
    r.restore_native([h])
    rv = r.get_state(VALUE)
    got = {}
    for k in keys:
        r.set_current_key(k)
        if rv.value() is not None:
            got[k] = rv.value()
    assert got == model and r.num_entries() == len(model)
    assert any(split)  # Arrow split the key columns of the key groups whose keys are all ASCII


@pytest.mark.parametrize("ahead", [False, True], ids=["keys one by one", "keys handed over ahead"])
@pytest.mark.parametrize("budget", ["default", "endless"])
@pytest.mark.parametrize("key_type", [str, int])
@pytest.mark.parametrize("deltas", [0, 2])
def test_value_state_read_and_written_by_key_follows_a_model_through_checkpoints(
    make_backend, by_key, key_type, deltas, budget, ahead, monkeypatch
):
    """Reads, writes of known and new keys, batches and removals on lazy key groups; every checkpoint kind.

    With the default budget key groups are decoded along the way; with an endless one they stay
    bytes until something needs all of them. ``ahead``: every 150 steps the runner hands over
    the keys of the next 150 (as Spark's routing does per task), with keys no step reads,
    and the backend looks them up together (``_heap_lookup_many``); sections of more than
    4 keys are then searched by their column finders, not a dict of their decoded keys.
    """
    from statekit.serializers import IntSerializer

    if budget == "default":
        monkeypatch.setattr(heap_backend, "_LOOKUP_BUDGET", 1.0)

    def key(i: int) -> Any:
        return f"/u/{i}" if key_type is str else i * 7919 - 300_000

    kser = IntSerializer() if key_type is int else None
    mk = (lambda: make_backend(key_serializer=kser)) if kser else make_backend
    rng = random.Random(31 + deltas)
    src = mk()
    src.delta_max_ratio = 100.0
    sv = src.get_state(VALUE)
    model: dict[Any, int] = {}
    h = None
    for round_ in range(deltas + 1):
        for i in rng.sample(range(3000), 2000 if round_ == 0 else 200):
            src.set_current_key(key(i))
            if round_ and i % 5 == 0:
                sv.clear()
                model.pop(key(i), None)
            else:
                sv.update(i + round_)
                model[key(i)] = i + round_
        h = checkpoint(src, 1 + round_)
    assert h is not None
    b = mk()
    b.delta_max_ratio = 100.0
    v = b.get_state(VALUE)
    b.restore_native([h])
    b.notify_checkpoint_complete(h.checkpoint_id)
    t = b._tables["v"]
    universe = [key(i) for i in range(3600)]  # 600 keys no checkpoint holds
    snapshots = []
    picks = [rng.choice(universe) for _ in range(600)]
    together = []
    if ahead:
        if by_key and key_type is str:
            pytest.importorskip(
                "pyarrow.compute"
            )  # loaded, as in a Spark worker: str columns are searched by it
        monkeypatch.setattr(snapshots_lookup, "_DECODED_KEYS_MAX", 4)
        many = heap_backend.HeapKeyedStateBackend._heap_lookup_many
        monkeypatch.setattr(
            heap_backend.HeapKeyedStateBackend,
            "_heap_lookup_many",
            lambda self, *a: (together.append(len(a[-1])), many(self, *a))[1],
        )
    for step in range(600):
        k = picks[step]
        if ahead and step % 150 == 0:
            handed = picks[step : step + 150] + rng.sample(universe, 50)  # and keys no step reads
            groups = [key_group_for_bytes(b.key_serializer.serialize(x), b.max_parallelism) for x in handed]
            b.remember_key_groups(handed, groups)
        b.set_current_key(k)
        op = rng.randrange(10)
        if op < 4:
            assert v.value() == model.get(k)
        elif op < 8:
            v.update(step)
            model[k] = step
        elif op == 8:
            ks = rng.sample(universe, 5)
            got = v.update_batch(ks, lambda x: (x or 0) + 1)
            for kk, g in zip(ks, got):
                model[kk] = model.get(kk, 0) + 1
                assert g == model[kk]
        else:
            v.clear()
            model.pop(k, None)
        if step % 150 == 75:
            snapshots.append((b.snapshot(), dict(model)))
    assert b.num_entries("v") == len(model)
    if by_key and budget != "default":
        assert t.partial and t.lazy  # read and written by key, still bytes
    if by_key and ahead and budget != "default":  # (the default decodes these small key groups at once)
        assert together and max(together) > 1  # looked up together
    delta = checkpoint(b, h.checkpoint_id + 1)
    assert delta.meta["chain"][-1]["kind"] == "delta"
    canonical = b.snapshot().to_handle()
    b._delta_forget_chain()
    base = checkpoint(b, h.checkpoint_id + 2)
    assert base.meta["chain"][-1]["kind"] == "base"

    def read(r: HeapKeyedStateBackend) -> dict[Any, int]:
        rv = r.get_state(VALUE)
        out = {}
        for k in universe:
            r.set_current_key(k)
            x = rv.value()
            if x is not None:
                out[k] = x
        return out

    for handle in (delta, base):
        r = mk()
        r.restore_native([handle])
        assert r.num_entries("v") == len(model)
        assert read(r) == model
    for snap_handle, expected in [(canonical, model)] + [(s.to_handle(), m) for s, m in snapshots]:
        r = mk()
        r.restore([snap_handle])
        assert read(r) == expected
    assert read(b) == model
    assert sorted(b.keys("v")) == sorted(model)  # iterating decodes every key group, writes kept
    assert not t.lazy and not t.partial and b.num_entries("v") == len(model)


def test_a_key_group_read_by_many_keys_is_decoded_with_what_was_written(make_backend, by_key, monkeypatch):
    # The default budget, a decode estimated at 30 µs an entry: lookups may take 75 ms in all,
    # far more than the first three take even on a busy machine.
    monkeypatch.setattr(heap_backend, "_LOOKUP_BUDGET", 1.0)
    monkeypatch.setattr(heap_backend, "_DECODE_SECONDS", 30e-6)
    # Indexed at once: a scan by Arrow would load its compute functions on the first call (0.6 s).
    monkeypatch.setitem(sys.modules, "pyarrow.compute", None)
    one = KeyGroupRange.of(0, 0)
    src = make_backend(max_parallelism=1, key_group_range=one)
    s = src.get_state(VALUE)
    for i in range(5000):
        src.set_current_key(f"k{i}")
        s.update(i)
    h = checkpoint(src, 1)
    b = make_backend(max_parallelism=1, key_group_range=one)
    v = b.get_state(VALUE)
    b.restore_native([h])
    t = b._tables["v"]
    b.set_current_key("k3")
    v.update(-3)
    b.set_current_key("new")
    v.update(7)
    b.set_current_key("k3")
    assert v.value() == -3  # read beside the bytes: no lookup
    assert b.num_entries("v") == 5001
    if by_key:
        p = t.partial[0]
        assert 0 < p.spent < p.budget
    looked = 0
    while 0 in t.lazy:  # absent keys, each looked up in the bytes
        b.set_current_key(f"absent{looked}")
        assert v.value() is None
        looked += 1
        assert looked < 200_000  # a lookup takes more than 0.4 µs, even indexed
    assert (looked > 1) == by_key  # by key: decoded once the lookups took half a decode's time
    assert not t.partial
    assert dict(t.void[0]) == {**{f"k{i}": i for i in range(5000)}, "k3": -3, "new": 7}
    assert b.num_entries("v") == 5001


# --- rescaled chains: a rescaled subtask's checkpoints write what changed -------------------------

MAXP = 128
KEYS = 150


def _subtasks(make_backend: Any, p: int, max_deltas: int = 10) -> list[HeapKeyedStateBackend]:
    out = []
    for i in range(p):
        b = make_backend(key_group_range=key_group_range_for_operator(MAXP, p, i))
        b.delta_max_ratio = 100.0  # deltas, however small the base
        b.delta_max_deltas = max_deltas
        out.append(b)
    return out


def _owner(subtasks: list[HeapKeyedStateBackend], key: str) -> HeapKeyedStateBackend:
    for b in subtasks:
        try:
            b.set_current_key(key)
        except StateAccessError:
            continue
        return b
    raise AssertionError(f"no subtask owns {key}")


def _mutate_all(
    subtasks: list[HeapKeyedStateBackend], model: Model, rng: random.Random, n: int, keys: int = KEYS
) -> None:
    """About ``n`` random writes, each by the subtask that owns its key (``mutate`` draws the key)."""
    for _ in range(n * len(subtasks)):
        b = rng.choice(subtasks)
        try:
            mutate(b, {}, rng, 1, keys)
        except StateAccessError:  # another subtask's key: nothing was written
            continue
        _merge(model, b)


def _merge(model: Model, b: HeapKeyedStateBackend) -> None:
    """What one ``mutate`` call did, read back from ``b`` for the key it touched."""
    key = b.get_current_key()
    for state, ns in [("v", None), ("l", None), ("m", None)] + [("w", n) for n in NAMESPACES]:
        model.pop((state, ns, key), None)
    model.update(read_all(b, [key]))


def _checkpoint(subtasks: list[HeapKeyedStateBackend], cid: int) -> list[NativeStateHandle]:
    handles = [b.native_snapshot(cid).write(KitNativeOutput(cid)) for b in subtasks]
    for b in subtasks:
        b.notify_checkpoint_complete(cid)
    return handles


def _restore(
    make_backend: Any,
    handles: list[NativeStateHandle],
    p: int,
    *,
    claim: bool,
    max_deltas: int = 10,
    limited: bool = True,
) -> list[HeapKeyedStateBackend]:
    """Subtasks at ``p`` restored from ``handles``: each limited to the subtask's key groups, as runners
    hand them (``limited``), or whole where they overlap."""
    subtasks = _subtasks(make_backend, p, max_deltas)
    for b in subtasks:
        own = b.key_group_range
        mine = [
            h.intersect(own) if limited else h for h in handles if len(h.key_group_range.intersection(own))
        ]
        b.restore_native([h for h in mine if h is not None])
        if claim:
            b.notify_checkpoint_complete(handles[0].checkpoint_id)
    return subtasks


def _read_back(make_backend: Any, handles: list[NativeStateHandle], keys: int = KEYS) -> Model:
    one = make_backend(key_group_range=KeyGroupRange.of(0, MAXP - 1))
    one.restore_native(handles)
    return read_all(one, [f"k{i}" for i in range(keys)])


def _uploaded(handles: list[NativeStateHandle]) -> int:
    return sum(f.size for h in handles for f in h.files if f.checkpoint_id == h.checkpoint_id)


@pytest.mark.parametrize("seed", range(6))
def test_lineages_of_rescales_write_deltas_and_restore_exactly(make_backend, seed):
    """Random rescales and restores, claimed or not, with writes and checkpoints between: every
    checkpoint reads back as the model; a claimed rescale's first checkpoint is a delta (even seeds:
    no base is ever due) and an unclaimed one's a base. Odd seeds write a base every few deltas."""
    rng = random.Random(seed)
    max_deltas = 10_000 if seed % 2 == 0 else 3
    model: Model = {}
    cid = 1
    subtasks = _subtasks(make_backend, 2)
    _mutate_all(subtasks, model, rng, 400)
    handles = _checkpoint(subtasks, cid)
    for _ in range(6):
        p = rng.choice([1, 2, 3, 4, 5])
        claim = rng.random() < 0.85
        rescaled = p != len(subtasks)
        limited = rng.random() < 0.5
        subtasks = _restore(make_backend, handles, p, claim=claim, max_deltas=max_deltas, limited=limited)
        for _ in range(rng.randrange(1, 4)):
            _mutate_all(subtasks, model, rng, rng.randrange(0, 40))
            cid += 1
            first = [link["kind"] for h in handles for link in h.meta["chain"]]
            handles = _checkpoint(subtasks, cid)
            assert _read_back(make_backend, handles) == model, f"checkpoint {cid} at p={p}"
            kinds = {
                link["kind"] for h in handles for link in h.meta["chain"] if link["checkpoint_id"] == cid
            }
            if not claim and first:
                assert kinds == {"base"}, "an unclaimed restore writes a base"
                claim = True  # later checkpoints are the instance's own
            elif rescaled and max_deltas > 1000:
                assert kinds == {"delta"}, f"checkpoint {cid}: the first after a claimed rescale to p={p}"
            rescaled = False
    assert model, "the lineage wrote nothing"


def test_a_rescaled_subtasks_first_checkpoint_is_a_delta_of_the_change(make_backend):
    """2 → 3 and 3 → 2: each new subtask's first checkpoint uploads its change only, and restores exactly."""
    rng = random.Random(7)
    model: Model = {}
    two = _subtasks(make_backend, 2)
    _mutate_all(two, model, rng, 3000, keys=2000)
    full = _checkpoint(two, 1)
    everything = _uploaded(full)
    for cid, p in [(2, 3), (3, 2)]:
        new = _restore(make_backend, full, p, claim=True)
        _mutate_all(new, model, rng, 10, keys=2000)
        handles = _checkpoint(new, cid)
        for h in handles:
            own = [link for link in h.meta["chain"] if link["checkpoint_id"] == cid]
            assert [link["kind"] for link in own] == ["delta"]
            assert len({f.name for f in h.files}) == len(h.files)
        # The middle subtask of three (and each of two after three) holds parts of two old ones: its
        # chain lists both, each limited to the key groups it took over.
        spanning = [h for h in handles if sum(link["kind"] == "base" for link in h.meta["chain"]) == 2]
        assert len(spanning) == (1 if p == 3 else 2)
        for h in spanning:
            parts = [
                KeyGroupRange.of(*link["key_groups"]) for link in h.meta["chain"] if link["kind"] == "base"
            ]
            assert parts[0].start == h.key_group_range.start and parts[1].end == h.key_group_range.end
            assert parts[0].end + 1 == parts[1].start
        assert _uploaded(handles) < everything / 5
        assert _read_back(make_backend, handles, keys=2000) == model
        full = handles  # 3 → 2 restores the rescaled chains


def test_an_unclaimed_rescale_writes_a_base(make_backend):
    rng = random.Random(3)
    model: Model = {}
    two = _subtasks(make_backend, 2)
    _mutate_all(two, model, rng, 300)
    handles = _checkpoint(two, 1)
    three = _restore(make_backend, handles, 3, claim=False)
    again = _checkpoint(three, 2)
    assert all([link["kind"] for link in h.meta["chain"]] == ["base"] for h in again)
    assert _read_back(make_backend, again) == model


def test_a_rescaled_chain_that_leaves_key_groups_out_is_refused_naming_them(make_backend):
    rng = random.Random(5)
    two = _subtasks(make_backend, 2)
    _mutate_all(two, {}, rng, 300)
    three = _restore(make_backend, _checkpoint(two, 1), 3, claim=True)
    h = _checkpoint(three, 2)[1]
    chain = [dict(link) for link in h.meta["chain"]]
    first = next(link for link in chain if "key_groups" in link)
    first["key_groups"] = [first["key_groups"][0] + 1, first["key_groups"][1]]
    target = make_backend(key_group_range=h.key_group_range)
    with pytest.raises(
        CorruptSnapshotError,
        match=r"for key groups KeyGroupRange\[\d+, \d+\] \['delta'\] is not a base followed",
    ):
        target.restore_native([dataclasses.replace(h, meta={**h.meta, "chain": chain})])
    assert target.num_entries() == 0
    outside = [dict(link) for link in h.meta["chain"]]
    outside[0]["key_groups"] = [10, 5]
    with pytest.raises(CorruptSnapshotError, match="holds no key groups"):
        target.restore_native([dataclasses.replace(h, meta={**h.meta, "chain": outside})])


# --- a delta written late, and TTL cleanup in full snapshots, along a chain of deltas ------------------


def test_a_delta_written_after_later_checkpoints_wrote_a_base_finds_its_chain_kept(make_backend):
    """Snapshot 2 (a delta on checkpoint 1's base) waits while checkpoints 3 and 4 complete, 4 a base.
    Every handle written meanwhile holds the base it applies on, so retention (keeping only what the
    newest checkpoint holds) keeps it: 2 is written afterwards and restores its own state."""
    b = make_backend()
    b.delta_max_ratio = 100.0
    b.delta_background = False  # the base of checkpoint 4 is written by checkpoint 4
    v = declare(b)["v"]
    keys = [f"k{i}" for i in range(50)]
    for i, key in enumerate(keys):
        b.set_current_key(key)
        v.update(i)
    checkpoint(b, 1)
    b.set_current_key("k0")
    v.update(-1)
    at_2 = {key: (-1 if key == "k0" else i) for i, key in enumerate(keys)}
    pending = b.native_snapshot(2)
    b.set_current_key("k1")
    v.update(-2)
    checkpoint(b, 3)
    b.delta_max_deltas = 1  # checkpoint 4 writes a base
    newest = checkpoint(b, 4)
    assert [link["kind"] for link in newest.meta["chain"]] == ["base"]
    assert "base-1" in {f.name for f in newest.files}, "the waiting delta's base is held"
    late = pending.write(KitNativeOutput(2))
    r = make_backend()
    r.restore_native([late])
    rv = declare(r)["v"]
    got = {}
    for key in keys:
        r.set_current_key(key)
        got[key] = rv.value()
    assert got == at_2
    b.delta_max_deltas = 10
    after = checkpoint(b, 5)
    assert "base-1" not in {f.name for f in after.files}, "nothing waits on it any more"


@pytest.mark.parametrize("rescale", [False, True])
def test_entries_that_expired_without_a_write_are_dropped_by_a_restore_of_deltas(
    make_backend, clock, rescale
):
    """A state whose full snapshots leave expired entries out: a restore of a base and deltas drops
    what expired by the last delta's time, changed since the base or not, as a full snapshot would."""
    ttl = StateTtlConfig(
        timedelta(milliseconds=10),
        visibility=TtlVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP,
        cleanup_full_snapshot=True,
    )
    desc = MapStateDescriptor("tm", str, int, ttl=ttl)
    b = make_backend()
    b.delta_max_ratio = 100.0
    m = b.get_state(desc)
    for key in ("old", "kept"):
        b.set_current_key(key)
        m.put("u", 1)
    checkpoint(b, 1)
    clock.advance(20)  # both expire; "kept" is written again
    b.set_current_key("kept")
    m.put("u", 2)
    h = checkpoint(b, 2)
    assert [link["kind"] for link in h.meta["chain"]] == ["base", "delta"]
    parts = [KeyGroupRange.of(0, 63), KeyGroupRange.of(64, 127)] if rescale else [KeyGroupRange.of(0, 127)]
    found: dict[str, Any] = {}
    for r in parts:
        target = make_backend(key_group_range=r)
        target.restore_native([h])
        tm = target.get_state(desc)
        for key in ("old", "kept"):
            try:
                target.set_current_key(key)
            except StateAccessError:
                continue
            found[key] = dict(tm.items())
        found.setdefault("entries", 0)
        found["entries"] += target.num_entries()
    assert found == {"old": {}, "kept": {"u": 2}, "entries": 1}


def test_a_file_two_handles_list_is_read_once_by_a_restore(make_backend, monkeypatch):
    """3 → 2 after 2 → 3: the first old subtask's base is listed by two of the handles the new first
    subtask restores (each limited to its key groups, as runners hand them); it is read, and hashed,
    once."""
    rng = random.Random(9)
    model: Model = {}
    two = _subtasks(make_backend, 2)
    _mutate_all(two, model, rng, 300)
    three = _restore(make_backend, _checkpoint(two, 1), 3, claim=True)
    _mutate_all(three, model, rng, 10)
    handles = _checkpoint(three, 2)
    own = key_group_range_for_operator(MAXP, 2, 0)
    views = [v for v in (h.intersect(own) for h in handles) if v is not None]
    listing = [{f.sha256 for f in v.files} for v in views]
    assert len(views) == 2 and listing[0] & listing[1], "one file in both handles"
    reads: list[str | None] = []
    real = NativeFile.read

    def counted(self: NativeFile) -> bytes:
        reads.append(self.sha256)
        return real(self)

    monkeypatch.setattr(NativeFile, "read", counted)
    target = make_backend(key_group_range=own)
    target.restore_native(views)
    assert reads and len(reads) == len(set(reads)), reads
    monkeypatch.undo()
    mine = []
    for key in (f"k{i}" for i in range(KEYS)):
        try:
            target.set_current_key(key)
        except StateAccessError:
            continue
        mine.append(key)
    assert read_all(target, mine) == {k: v for k, v in model.items() if k[2] in set(mine)}
