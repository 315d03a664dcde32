"""Tests of operator (non-keyed) state: the backend, its snapshot bytes, rescaling (DESIGN §4)."""

from __future__ import annotations

import json
import struct
import zlib
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekit._errors import (
    CorruptSnapshotError,
    IncompatibleSerializerError,
    StateMigrationError,
)
from statekit.serialization._serializers import IntSerializer, pack_parts
from statekit.state._operator import (
    OperatorStateBackendImpl,
    OperatorStateData,
    OperatorStateMode,
    decode_operator_snapshot,
    encode_operator_snapshot,
    redistribute_operator_state,
)
from statekit.state._state import ListStateDescriptor, MapStateDescriptor, StateTtlConfig

SPLIT, UNION, BROADCAST = OperatorStateMode.SPLIT, OperatorStateMode.UNION, OperatorStateMode.BROADCAST
INT_CFG = [IntSerializer().config()]


def _split_state(name: str, elements: list[bytes]) -> dict[str, OperatorStateData]:
    return {name: OperatorStateData(name, SPLIT, INT_CFG, list(elements))}


def _elements(snaps: list[dict[str, OperatorStateData]], name: str) -> list[list[bytes]]:
    return [s[name].elements for s in snaps]


def _through_bytes(snap: dict[str, OperatorStateData]) -> dict[str, OperatorStateData]:
    return decode_operator_snapshot(encode_operator_snapshot(snap))


# --------------------------------------------------------------------------------------
# redistribute_operator_state: the three modes, on bytes
# --------------------------------------------------------------------------------------


def test_even_split_design_example() -> None:
    old = [_split_state("s", [b"a", b"b", b"c"]), _split_state("s", [b"d", b"e"])]
    new = redistribute_operator_state(old, 3)
    assert _elements(new, "s") == [[b"a", b"b"], [b"c", b"d"], [b"e"]]


@pytest.mark.parametrize(
    ("old", "p", "expected"),
    [
        ([[b"a", b"b", b"c"], [b"d", b"e"]], 1, [[b"a", b"b", b"c", b"d", b"e"]]),
        ([[b"a", b"b", b"c"], [b"d", b"e"]], 2, [[b"a", b"b", b"c"], [b"d", b"e"]]),
        ([[b"a"], [b"b"]], 4, [[b"a"], [b"b"], [], []]),
        ([[], [b"x", b"y", b"z", b"w"]], 3, [[b"x", b"y"], [b"z"], [b"w"]]),
        ([[], []], 2, [[], []]),
    ],
)
def test_even_split_examples(old: list[list[bytes]], p: int, expected: list[list[bytes]]) -> None:
    new = redistribute_operator_state([_split_state("s", e) for e in old], p)
    assert _elements(new, "s") == expected


@given(
    st.lists(st.lists(st.binary(max_size=3), max_size=8), min_size=1, max_size=6),
    st.integers(1, 12),
)
def test_even_split_keeps_order_and_balances(old: list[list[bytes]], p: int) -> None:
    # Tag the elements so that equal byte strings stay distinguishable.
    tagged = [[b"%d/%d:" % (i, j) + e for j, e in enumerate(lst)] for i, lst in enumerate(old)]
    new = redistribute_operator_state([_split_state("s", e) for e in tagged], p)
    chunks = _elements(new, "s")
    assert len(chunks) == p
    everything = [e for lst in tagged for e in lst]
    # Concatenation in subtask order, cut into contiguous chunks: order is kept.
    assert [e for c in chunks for e in c] == everything
    sizes = [len(c) for c in chunks]
    assert max(sizes) - min(sizes) <= 1
    # The first total % p subtasks get the extra element.
    base, extra = divmod(len(everything), p)
    assert sizes == [base + 1] * extra + [base] * (p - extra)


@given(
    st.lists(st.lists(st.binary(max_size=3), max_size=6), min_size=1, max_size=5),
    st.integers(1, 8),
)
def test_union_gives_every_subtask_the_concatenation(old: list[list[bytes]], p: int) -> None:
    snaps = [{"u": OperatorStateData("u", UNION, INT_CFG, list(e))} for e in old]
    new = redistribute_operator_state(snaps, p)
    everything = [e for lst in old for e in lst]
    assert _elements(new, "u") == [everything] * p
    assert all(s["u"].mode is UNION for s in new)


def _broadcast_state(tag: bytes) -> dict[str, OperatorStateData]:
    # Copies are equal in practice; tagging them shows which one each subtask got.
    cfgs = [IntSerializer().config(), IntSerializer().config()]
    return {"b": OperatorStateData("b", BROADCAST, cfgs, [b"k" + tag, b"v" + tag])}


@pytest.mark.parametrize("p_old", [1, 2, 3, 5])
@pytest.mark.parametrize("p_new", [1, 2, 3, 4, 7])
def test_broadcast_new_subtask_gets_old_i_mod_p_old(p_old: int, p_new: int) -> None:
    old = [_broadcast_state(b"%d" % i) for i in range(p_old)]
    new = redistribute_operator_state(old, p_new)
    assert _elements(new, "b") == [[b"k%d" % (i % p_old), b"v%d" % (i % p_old)] for i in range(p_new)]
    assert all(s["b"].mode is BROADCAST for s in new)


def test_broadcast_from_a_subtask_without_the_state_takes_another_copy() -> None:
    old = [_broadcast_state(b"0"), None, {}]
    new = redistribute_operator_state(old, 4)
    for s in new:
        assert s["b"].elements == [b"k0", b"v0"]


def test_redistribution_copies_element_lists() -> None:
    old = [_split_state("s", [b"a"]), {"u": OperatorStateData("u", UNION, INT_CFG, [b"x"])}]
    new = redistribute_operator_state(old, 2)
    new[0]["u"].elements.append(b"mutated")
    assert new[1]["u"].elements == [b"x"]
    assert old[1]["u"].elements == [b"x"]


def test_states_missing_on_some_old_subtasks_and_none_entries() -> None:
    old = [None, _split_state("s", [b"a", b"b"]), {}, _split_state("s", [b"c"])]
    new = redistribute_operator_state(old, 2)
    assert _elements(new, "s") == [[b"a", b"b"], [b"c"]]


def test_several_states_are_redistributed_independently() -> None:
    old = [
        {**_split_state("s", [b"1", b"2"]), "u": OperatorStateData("u", UNION, INT_CFG, [b"u0"])},
        {**_split_state("s", [b"3"]), "u": OperatorStateData("u", UNION, INT_CFG, [b"u1"])},
    ]
    new = redistribute_operator_state(old, 3)
    assert _elements(new, "s") == [[b"1"], [b"2"], [b"3"]]
    assert _elements(new, "u") == [[b"u0", b"u1"]] * 3


def test_different_modes_across_subtasks_are_refused() -> None:
    old = [_split_state("s", [b"a"]), {"s": OperatorStateData("s", UNION, INT_CFG, [b"b"])}]
    with pytest.raises(StateMigrationError):
        redistribute_operator_state(old, 2)


def test_different_serializers_across_subtasks_are_refused() -> None:
    other = [{"id": "str", "v": 1}]
    old = [_split_state("s", [b"a"]), {"s": OperatorStateData("s", SPLIT, other, [b"b"])}]
    with pytest.raises(StateMigrationError):
        redistribute_operator_state(old, 2)


@pytest.mark.parametrize("p", [0, -1])
def test_new_parallelism_must_be_positive(p: int) -> None:
    with pytest.raises(ValueError):
        redistribute_operator_state([_split_state("s", [b"a"])], p)


# --------------------------------------------------------------------------------------
# Snapshot bytes
# --------------------------------------------------------------------------------------


def _sample_snapshot() -> dict[str, OperatorStateData]:
    return {
        "s": OperatorStateData("s", SPLIT, INT_CFG, [b"\x01" * 8, b"", b"\xff"]),
        "u": OperatorStateData("u", UNION, [{"id": "str", "v": 1}], [b"x"]),
        "b": OperatorStateData("b", BROADCAST, INT_CFG * 2, [b"k", b"v"]),
        "empty": OperatorStateData("empty", SPLIT, INT_CFG, []),
    }


def test_snapshot_bytes_roundtrip() -> None:
    snap = _sample_snapshot()
    assert decode_operator_snapshot(encode_operator_snapshot(snap)) == snap


def test_empty_snapshot_roundtrip() -> None:
    assert decode_operator_snapshot(encode_operator_snapshot({})) == {}


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=5),
        st.tuples(st.sampled_from(list(OperatorStateMode)), st.lists(st.binary(max_size=5), max_size=5)),
        max_size=4,
    )
)
def test_snapshot_bytes_roundtrip_any(states: dict[str, tuple[OperatorStateMode, list[bytes]]]) -> None:
    snap = {n: OperatorStateData(n, m, INT_CFG, e) for n, (m, e) in states.items()}
    assert _through_bytes(snap) == snap


def test_every_single_byte_corruption_is_detected() -> None:
    data = encode_operator_snapshot(_sample_snapshot())
    for pos in range(len(data)):
        for flip in (0x01, 0x80):
            bad = bytearray(data)
            bad[pos] ^= flip
            with pytest.raises(CorruptSnapshotError):
                decode_operator_snapshot(bytes(bad))


def test_every_truncation_is_detected() -> None:
    data = encode_operator_snapshot(_sample_snapshot())
    for n in range(len(data)):
        with pytest.raises(CorruptSnapshotError):
            decode_operator_snapshot(data[:n])


def test_appended_bytes_are_detected() -> None:
    data = encode_operator_snapshot(_sample_snapshot())
    with pytest.raises(CorruptSnapshotError):
        decode_operator_snapshot(data + b"\x00")


def test_corrupt_error_names_where() -> None:
    with pytest.raises(CorruptSnapshotError, match="chk-7/op-3"):
        decode_operator_snapshot(b"garbage garbage garbage", where="chk-7/op-3")


def _with_valid_checksum(body: bytes) -> bytes:
    return b"STKOPST1" + body + struct.pack("<I", zlib.crc32(body))


def _meta(*states: tuple[str, str, int]) -> bytes:
    return json.dumps(
        [{"name": n, "mode": m, "serializers": INT_CFG, "count": c} for n, m, c in states]
    ).encode()


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"", id="empty-body"),
        pytest.param(b"\x05\x00", id="short-body"),
        pytest.param(pack_parts([b"{not json"]), id="meta-not-json"),
        pytest.param(pack_parts([_meta(("s", "bogus-mode", 0)), pack_parts([])]), id="unknown-mode"),
        pytest.param(pack_parts([_meta(("s", "split", 1)), b"\x01"]), id="elements-not-framed"),
        pytest.param(pack_parts([_meta(("s", "split", 2)), pack_parts([b"\x01"])]), id="count-mismatch"),
        pytest.param(
            pack_parts([_meta(("s", "split", 0), ("t", "split", 0)), pack_parts([])]),
            id="fewer-parts-than-states",
        ),
        pytest.param(pack_parts([b'{"a": 1}']), id="meta-not-a-list"),
    ],
)
def test_malformed_body_with_valid_checksum_is_corrupt_snapshot_error(body: bytes) -> None:
    # CorruptSnapshotError: "Snapshot bytes fail their checksum or are malformed."
    with pytest.raises(CorruptSnapshotError):
        decode_operator_snapshot(_with_valid_checksum(body))


# --------------------------------------------------------------------------------------
# OperatorStateBackendImpl end to end
# --------------------------------------------------------------------------------------


def _offsets() -> ListStateDescriptor[int]:
    return ListStateDescriptor("offsets", int)


def _rules() -> MapStateDescriptor[str, int]:
    return MapStateDescriptor("rules", str, int)


def _rescale(backends: list[OperatorStateBackendImpl], p_new: int) -> list[OperatorStateBackendImpl]:
    blobs = [encode_operator_snapshot(b.snapshot()) for b in backends]
    old = [decode_operator_snapshot(x) for x in blobs]
    new = []
    for snap in redistribute_operator_state(old, p_new):
        b = OperatorStateBackendImpl()
        b.restore(snap)
        new.append(b)
    return new


def _job(
    p: int, split: list[list[str]], union: list[list[int]], rules: list[dict[str, Any]]
) -> list[OperatorStateBackendImpl]:
    """``p`` subtasks of a job, each with a split list, a union list and a broadcast map."""
    backends = []
    for i in range(p):
        b = OperatorStateBackendImpl()
        b.get_list_state(ListStateDescriptor("offsets", str)).update(split[i])
        b.get_union_list_state(ListStateDescriptor("members", int)).update(union[i])
        b.get_broadcast_state(_rules()).put_all(rules[i])
        backends.append(b)
    return backends


def test_end_to_end_rescale_2_to_3() -> None:
    rules = {"limit": 10, "none": None, "\u00e9": -1}
    old = _job(2, [["a", "b", "c"], ["d", "e"]], [[1, 2], [3]], [dict(rules), dict(rules)])
    new = _rescale(old, 3)
    got_split = [b.get_list_state(ListStateDescriptor("offsets", str)).get() for b in new]
    assert got_split == [["a", "b"], ["c", "d"], ["e"]]
    for b in new:
        assert b.get_union_list_state(ListStateDescriptor("members", int)).get() == [1, 2, 3]
        r = b.get_broadcast_state(_rules())
        assert dict(r.items()) == rules
        assert list(r.keys()) == ["limit", "none", "\u00e9"]
        assert r.contains("none") and r.get("none") is None


def test_end_to_end_rescale_3_to_1_and_back_to_2() -> None:
    old = _job(3, [["a"], ["b", "c"], []], [[1], [], [2, 3]], [{"k": 1}] * 3)
    one = _rescale(old, 1)
    assert one[0].get_list_state(ListStateDescriptor("offsets", str)).get() == ["a", "b", "c"]
    assert one[0].get_union_list_state(ListStateDescriptor("members", int)).get() == [1, 2, 3]
    assert dict(one[0].get_broadcast_state(_rules()).items()) == {"k": 1}
    two = _rescale(one, 2)
    assert [b.get_list_state(ListStateDescriptor("offsets", str)).get() for b in two] == [["a", "b"], ["c"]]
    # union state is not duplicated by going through parallelism 1
    assert [b.get_union_list_state(ListStateDescriptor("members", int)).get() for b in two] == [[1, 2, 3]] * 2


def test_broadcast_copies_end_to_end_follow_i_mod_p_old() -> None:
    # Deliberately unequal copies, to see which old subtask each new one restores from.
    old = _job(2, [[], []], [[], []], [{"from": 0}, {"from": 1}])
    new = _rescale(old, 5)
    assert [dict(b.get_broadcast_state(_rules()).items()) for b in new] == [{"from": i % 2} for i in range(5)]


def test_same_parallelism_restore_keeps_everything() -> None:
    old = _job(2, [["a"], ["b"]], [[1], [2]], [{"x": 1}, {"x": 1}])
    new = _rescale(old, 2)
    assert [b.get_list_state(ListStateDescriptor("offsets", str)).get() for b in new] == [["a"], ["b"]]


def test_restored_but_undeclared_state_survives_the_next_snapshot() -> None:
    old = _job(2, [["a", "b"], ["c"]], [[1], [2]], [{"x": 1}, {"x": 1}])
    mid = _rescale(old, 3)
    # The job at p=3 declares only the broadcast state, then checkpoints again.
    for b in mid:
        b.get_broadcast_state(_rules())
        assert set(b.state_names) == {"rules", "offsets", "members"}
    final = _rescale(mid, 1)
    b = final[0]
    assert b.get_list_state(ListStateDescriptor("offsets", str)).get() == ["a", "b", "c"]
    # each of the 3 mid subtasks held all of [1, 2] and passed it on untouched
    assert b.get_union_list_state(ListStateDescriptor("members", int)).get() == [1, 2] * 3


def test_get_state_twice_returns_the_same_handle() -> None:
    b = OperatorStateBackendImpl()
    s1 = b.get_list_state(_offsets())
    s1.add(5)
    assert b.get_list_state(_offsets()) is s1
    assert b.get_list_state(_offsets()).get() == [5]
    r = b.get_broadcast_state(_rules())
    assert b.get_broadcast_state(_rules()) is r


def test_redeclaring_differently_in_one_backend_is_refused() -> None:
    b = OperatorStateBackendImpl()
    b.get_list_state(_offsets())
    with pytest.raises(StateMigrationError):
        b.get_union_list_state(_offsets())
    with pytest.raises(StateMigrationError):
        b.get_list_state(ListStateDescriptor("offsets", str))
    b.get_broadcast_state(_rules())
    with pytest.raises(StateMigrationError):
        b.get_broadcast_state(MapStateDescriptor("rules", str, str))


def test_list_and_broadcast_state_of_the_same_name_do_not_lose_state() -> None:
    # Snapshots key states by name; a list and a broadcast state sharing a name must
    # either be refused up front or both survive a snapshot.
    b = OperatorStateBackendImpl()
    b.get_list_state(ListStateDescriptor("x", int)).update([1, 2])
    try:
        bs = b.get_broadcast_state(MapStateDescriptor("x", str, int))
    except StateMigrationError:
        return
    bs.put("k", 3)
    restored = _rescale([b], 1)[0]
    assert restored.get_list_state(ListStateDescriptor("x", int)).get() == [1, 2]
    assert dict(restored.get_broadcast_state(MapStateDescriptor("x", str, int)).items()) == {"k": 3}


# --- restore: wrong mode or serializer --------------------------------------------------


def _restored_backend() -> OperatorStateBackendImpl:
    old = _job(1, [["a", "b"]], [[7]], [{"k": 1}])
    return _rescale(old, 1)[0]


@pytest.mark.parametrize(
    "request_wrongly",
    [
        pytest.param(
            lambda b: b.get_union_list_state(ListStateDescriptor("offsets", str)), id="split-as-union"
        ),
        pytest.param(lambda b: b.get_list_state(ListStateDescriptor("members", int)), id="union-as-split"),
        pytest.param(lambda b: b.get_list_state(ListStateDescriptor("rules", str)), id="broadcast-as-list"),
        pytest.param(
            lambda b: b.get_broadcast_state(MapStateDescriptor("offsets", str, str)), id="list-as-broadcast"
        ),
    ],
)
def test_restore_with_wrong_mode_raises_state_migration_error(request_wrongly: Any) -> None:
    b = _restored_backend()
    with pytest.raises(StateMigrationError, match="mode"):
        request_wrongly(b)
    # nothing changed: the right declarations still find the restored values
    assert b.get_list_state(ListStateDescriptor("offsets", str)).get() == ["a", "b"]
    assert b.get_union_list_state(ListStateDescriptor("members", int)).get() == [7]
    assert dict(b.get_broadcast_state(_rules()).items()) == {"k": 1}


@pytest.mark.parametrize(
    "request_wrongly",
    [
        pytest.param(lambda b: b.get_list_state(ListStateDescriptor("offsets", int)), id="split-elem"),
        pytest.param(lambda b: b.get_union_list_state(ListStateDescriptor("members", str)), id="union-elem"),
        pytest.param(lambda b: b.get_broadcast_state(MapStateDescriptor("rules", int, int)), id="bcast-key"),
        pytest.param(
            lambda b: b.get_broadcast_state(MapStateDescriptor("rules", str, str)), id="bcast-value"
        ),
    ],
)
def test_restore_with_wrong_serializer_raises_state_migration_error(request_wrongly: Any) -> None:
    b = _restored_backend()
    with pytest.raises(StateMigrationError) as ei:
        request_wrongly(b)
    assert isinstance(ei.value, IncompatibleSerializerError)
    assert b.get_list_state(ListStateDescriptor("offsets", str)).get() == ["a", "b"]
    assert b.get_union_list_state(ListStateDescriptor("members", int)).get() == [7]
    assert dict(b.get_broadcast_state(_rules()).items()) == {"k": 1}


def test_restore_into_a_backend_holding_state_is_refused() -> None:
    b = OperatorStateBackendImpl()
    b.get_list_state(_offsets()).add(1)
    with pytest.raises(StateMigrationError):
        b.restore({})


def test_restore_twice_is_refused() -> None:
    b = OperatorStateBackendImpl()
    b.restore(_split_state("s", [IntSerializer().serialize(1)]))
    with pytest.raises(StateMigrationError):
        b.restore({})


def test_restore_from_decoded_bytes_end_to_end_with_int_split() -> None:
    b = OperatorStateBackendImpl()
    b.get_list_state(_offsets()).update([10, 2**70, -3])
    data = encode_operator_snapshot(b.snapshot())
    b2 = OperatorStateBackendImpl()
    b2.restore(decode_operator_snapshot(data))
    assert b2.get_list_state(_offsets()).get() == [10, 2**70, -3]


# --- list semantics ---------------------------------------------------------------------


@pytest.mark.parametrize("getter", ["get_list_state", "get_union_list_state"])
def test_none_elements_raise_value_error_and_change_nothing(getter: str) -> None:
    b = OperatorStateBackendImpl()
    s = getattr(b, getter)(_offsets())
    s.update([1, 2])
    with pytest.raises(ValueError):
        s.add(None)
    with pytest.raises(ValueError):
        s.add_all([3, None])
    with pytest.raises(ValueError):
        s.update([None])
    with pytest.raises(ValueError):
        s.update([4, None, 5])
    assert s.get() == [1, 2]


def test_list_state_operations() -> None:
    s = OperatorStateBackendImpl().get_list_state(_offsets())
    assert s.get() == []
    s.add(1)
    s.add_all([2, 3])
    s.add_all([])
    got = s.get()
    assert got == [1, 2, 3]
    got.append(99)  # get() returns a copy
    assert s.get() == [1, 2, 3]
    s.update(iter([4]))
    assert s.get() == [4]
    s.update([])
    assert s.get() == []
    s.add(5)
    s.clear()
    assert s.get() == []


def test_broadcast_state_operations() -> None:
    r = OperatorStateBackendImpl().get_broadcast_state(_rules())
    assert r.is_empty()
    r.put_all({"a": 1, "b": 2})
    r.put("c", None)
    assert r.get("a") == 1 and r.get("zz") is None
    assert list(r.items()) == [("a", 1), ("b", 2), ("c", None)]
    r.remove("a")
    r.remove("missing")
    assert list(r.keys()) == ["b", "c"] and list(r.values()) == [2, None]
    r.clear()
    assert r.is_empty()


def test_operator_state_refuses_ttl() -> None:
    ttl = StateTtlConfig(timedelta(seconds=1))
    b = OperatorStateBackendImpl()
    with pytest.raises(ValueError):
        b.get_list_state(ListStateDescriptor("x", int, ttl=ttl))
    with pytest.raises(ValueError):
        b.get_broadcast_state(MapStateDescriptor("m", str, int, ttl=ttl))


def test_snapshot_is_taken_at_call_time() -> None:
    b = OperatorStateBackendImpl()
    s = b.get_list_state(_offsets())
    s.update([1])
    snap = b.snapshot()
    s.add(2)
    b2 = OperatorStateBackendImpl()
    b2.restore(snap)
    assert b2.get_list_state(_offsets()).get() == [1]


def test_close_drops_state() -> None:
    b = OperatorStateBackendImpl()
    b.get_list_state(_offsets()).add(1)
    b.close()
    assert b.state_names == []
    assert b.get_list_state(_offsets()).get() == []


# --- types that changed since the snapshot -------------------------------------------------------


def test_operator_state_widens_on_restore() -> None:
    b = OperatorStateBackendImpl()
    b.get_list_state(ListStateDescriptor("offsets", int)).add_all([1, 2])
    b.get_broadcast_state(MapStateDescriptor("rules", str, int)).put("k", 3)
    again = OperatorStateBackendImpl()
    again.restore(b.snapshot())
    assert again.get_list_state(ListStateDescriptor("offsets", float)).get() == [1.0, 2.0]
    rules = again.get_broadcast_state(MapStateDescriptor("rules", str, float))
    assert dict(rules.items()) == {"k": 3.0}
    assert all(type(v) is float for v in rules.values())


@pytest.mark.parametrize(
    ("declare", "words"),
    [
        (lambda b: b.get_list_state(ListStateDescriptor("offsets", int)), "narrowing"),
        (lambda b: b.get_broadcast_state(MapStateDescriptor("rules", int, float)), "keys never change type"),
    ],
    ids=["narrowed-elements", "retyped-broadcast-keys"],
)
def test_operator_state_refuses_what_would_lose_information(declare: Any, words: str) -> None:
    b = OperatorStateBackendImpl()
    b.get_list_state(ListStateDescriptor("offsets", float)).add(1.5)
    b.get_broadcast_state(MapStateDescriptor("rules", str, float)).put("k", 3.0)
    again = OperatorStateBackendImpl()
    again.restore(b.snapshot())
    with pytest.raises(IncompatibleSerializerError, match=words):
        declare(again)
    assert again.get_list_state(ListStateDescriptor("offsets", float)).get() == [1.5]  # nothing changed


def test_operator_state_refuses_an_int_no_float_holds() -> None:
    b = OperatorStateBackendImpl()
    b.get_list_state(ListStateDescriptor("offsets", int)).add(2**53 + 1)
    again = OperatorStateBackendImpl()
    again.restore(b.snapshot())
    with pytest.raises(StateMigrationError, match="no exact float"):
        again.get_list_state(ListStateDescriptor("offsets", float))
    assert again.get_list_state(ListStateDescriptor("offsets", int)).get() == [2**53 + 1]
