"""Raw state's file, its redistribution, its metadata entry and the function's contexts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from statekit import RawStateRestoreContext, RawStateSnapshotContext
from statekit.backend_api import KeyGroupRange
from statekit.checkpointing import CheckpointMetadata
from statekit.checkpoints._metadata import SubtaskState
from statekit.errors import CorruptSnapshotError
from statekit.state._raw import decode_raw_file, encode_raw_file, even_split
from statekit.state_processor import RawSnapshot

KGR = KeyGroupRange.of(0, 63)


def _decode(data: bytes, entry: Any, **kw: Any) -> RawSnapshot:
    args: dict[str, Any] = {"key_groups": KGR, "item_slice": (0, 10), "where": "f.raw", **kw}
    return decode_raw_file(data, entry, KGR, **args)


def test_a_raw_file_round_trips_and_gives_only_the_key_groups_and_items_asked_for() -> None:
    snap = RawSnapshot({3: b"three", 0: b"zero", 40: b"forty"}, [b"a", b"", b"c"])
    data, entry = encode_raw_file(snap)
    assert data.startswith(b"STKRAW01") and entry["size"] == len(data)
    whole = _decode(data, entry)
    assert whole.keyed == snap.keyed and whole.items == snap.items
    part = _decode(data, entry, key_groups=KeyGroupRange.of(2, 39), item_slice=(1, 3))
    assert part.keyed == {3: b"three"} and part.items == [b"", b"c"]
    assert not RawSnapshot() and RawSnapshot(items=[b""])


@pytest.mark.parametrize(
    ("counts", "p", "expected"),
    [
        # Old [a,b,c],[d,e] at p'=3: [a,b],[c,d],[e], as operator list state.
        ([3, 2], 3, [[(0, 0, 2)], [(0, 2, 3), (1, 0, 1)], [(1, 1, 2)]]),
        ([1, 1], 3, [[(0, 0, 1)], [(1, 0, 1)], []]),
        ([1, 0, 1], 1, [[(0, 0, 1), (2, 0, 1)]]),
        ([0, 0], 2, [[], []]),
    ],
)
def test_even_split_cuts_the_concatenated_items_in_subtask_order(
    counts: list[int], p: int, expected: list[list[tuple[int, int, int]]]
) -> None:
    assert [even_split(counts, p, i) for i in range(p)] == expected


def test_damage_names_the_key_group_or_the_items_and_nothing_is_returned() -> None:
    data, entry = encode_raw_file(RawSnapshot({5: b"five", 6: b"six"}, [b"item"]))
    flipped = bytearray(data)
    flipped[entry["key_groups"]["6"][0]] ^= 1
    with pytest.raises(CorruptSnapshotError, match="f.raw: the bytes are not the ones"):
        _decode(bytes(flipped), entry)
    # The whole file matches a (crafted) entry, one block's digest does not: that block is named.
    crafted = {**entry, "block_sha256": {**entry["block_sha256"], "6": "0" * 64}}
    with pytest.raises(CorruptSnapshotError, match="raw block of key group 6"):
        _decode(data, crafted)
    crafted = {**entry, "items_sha256": "0" * 64}
    with pytest.raises(CorruptSnapshotError, match="raw operator items"):
        _decode(data, crafted)
    with pytest.raises(CorruptSnapshotError, match="the bytes are not the ones"):
        _decode(data[:-1], entry)


@pytest.mark.parametrize(
    "change",
    [
        {"key_groups": {"64": [8, 1]}},  # a key group another subtask owns
        {"items": [[8, 10_000]]},  # past the end of the file
        {"items": [[0, 4]]},  # inside the magic
        {"sha256": None},
        {"format": "other"},
        {"block_sha256": {}},
    ],
)
def test_a_malformed_entry_is_refused_before_any_byte_is_handed_over(change: dict[str, Any]) -> None:
    data, entry = encode_raw_file(RawSnapshot({5: b"five"}, [b"item"]))
    with pytest.raises(CorruptSnapshotError, match="f.raw: malformed raw state entry"):
        _decode(data, {**entry, **change})


def _metadata(raw: dict[str, Any] | None) -> CheckpointMetadata:
    st = SubtaskState("op", 0, KeyGroupRange.of(0, 127), raw=raw)
    return CheckpointMetadata("job", 1, 128, {"op": [st]})


def test_metadata_without_raw_state_stays_version_1_and_with_it_is_version_2() -> None:
    plain = _metadata(None).to_bytes()
    assert json.loads(plain[8:-4])["version"] == 1 and b'"raw"' not in plain
    assert CheckpointMetadata.from_bytes(plain).operators["op"][0].raw is None
    _, entry = encode_raw_file(RawSnapshot({1: b"x"}))
    with_raw = _metadata({**entry, "handle": {"type": "inline"}}).to_bytes()
    assert json.loads(with_raw[8:-4])["version"] == 2
    assert CheckpointMetadata.from_bytes(with_raw).operators["op"][0].raw == {
        **entry,
        "handle": {"type": "inline"},
    }


def test_the_snapshot_context_takes_only_owned_key_groups_and_bytes() -> None:
    ctx = RawStateSnapshotContext(KeyGroupRange.of(10, 19), 1, 3)
    ctx.raw_keyed_output(10).write(b"ab")
    ctx.raw_keyed_output(10).write(b"cd")  # the same stream: appended
    ctx.raw_keyed_output(11)  # opened, nothing written: left out
    ctx.add_raw_operator_item(bytearray(b"it"))
    with pytest.raises(ValueError, match="owns key groups"):
        ctx.raw_keyed_output(20)
    with pytest.raises(ValueError, match="owns key groups"):
        ctx.raw_keyed_output(True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not str"):
        ctx.add_raw_operator_item("text")  # type: ignore[arg-type]
    snap = ctx.snapshot()
    assert snap.keyed == {10: b"abcd"} and snap.items == [b"it"]
    restored = RawStateRestoreContext(KeyGroupRange.of(10, 19), snap, 7)
    assert [(kg, s.read()) for kg, s in restored.raw_keyed_inputs()] == [(10, b"abcd")]
    assert restored.raw_operator_items == [b"it"] and restored.checkpoint_id == 7
