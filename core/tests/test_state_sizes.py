"""Each state's entries and bytes as a subtask's keyed part records them: one reading for every channel."""

from __future__ import annotations

from typing import Any

from statekit.checkpoints._metadata import SubtaskState
from statekit.checkpoints._state_sizes import StateSizes, part_state_sizes, summed_state_sizes
from statekit.runtime._metrics import checkpoint_stats
from statekit.serialization._keygroups import KeyGroupRange
from statekit.snapshots._snapshot import CANONICAL_FORMAT

CANONICAL: dict[str, Any] = {
    "format": CANONICAL_FORMAT,
    "size": 900,
    "entries": 6,
    "state_entries": {"count": 3, "seen": 3},
    "state_sizes": {"count": 300, "seen": 500},
}
HEAP_NATIVE: dict[str, Any] = {
    "format": "heap-delta-1",
    "size": 700,
    "uploaded": 200,
    "entries": 2,
    "native": {
        "meta": {"chain": [], "state_entries": {"count": 2, "seen": 0}, "state_sizes": {"count": 250}}
    },
}
ROCKSDB_NATIVE: dict[str, Any] = {
    "format": "statekit-rocksdb-1",
    "size": 4000,
    "uploaded": 4000,
    "entries": 5,
    "native": {"meta": {"entry_counts": {"count": {"0": 5}}}},
}
# A canonical part of a statekit before per-state counts: the bytes only.
OLD_CANONICAL: dict[str, Any] = {"size": 100, "entries": 1, "state_sizes": {"count": 40}}


def test_each_format_records_what_it_records_and_nothing_else_reads_as_zero() -> None:
    assert part_state_sizes(CANONICAL) == StateSizes({"count": 3, "seen": 3}, {"count": 300, "seen": 500})
    assert part_state_sizes(HEAP_NATIVE) == StateSizes({"count": 2, "seen": 0}, {"count": 250})
    assert part_state_sizes(ROCKSDB_NATIVE) == StateSizes(None, None)
    assert part_state_sizes({"format": "x", "native": {"meta": None}}) == StateSizes(None, None)
    assert part_state_sizes(OLD_CANONICAL) == StateSizes(None, {"count": 40})
    assert part_state_sizes(CANONICAL).complete and not part_state_sizes(OLD_CANONICAL).complete


def test_sums_are_per_state_and_unknown_as_soon_as_one_part_does_not_record_them() -> None:
    both = summed_state_sizes([part_state_sizes(CANONICAL), part_state_sizes(HEAP_NATIVE)])
    assert both == StateSizes({"count": 5, "seen": 3}, {"count": 550, "seen": 500})
    assert summed_state_sizes([part_state_sizes(CANONICAL), part_state_sizes(ROCKSDB_NATIVE)]) == StateSizes(
        None, None
    )
    old = summed_state_sizes([part_state_sizes(CANONICAL), part_state_sizes(OLD_CANONICAL)])
    assert old == StateSizes(None, {"count": 340, "seen": 500})
    assert summed_state_sizes([]) == StateSizes({}, {})


def test_the_metrics_show_per_state_numbers_only_where_every_part_records_both() -> None:
    def subtask(keyed: dict[str, Any]) -> SubtaskState:
        return SubtaskState("process", 0, KeyGroupRange(0, 127), keyed=keyed)

    stats = checkpoint_stats(1, [subtask(CANONICAL), subtask(HEAP_NATIVE)])
    assert {n: (s.entries, s.bytes) for n, s in stats.states.items()} == {"count": (5, 550), "seen": (3, 500)}
    assert checkpoint_stats(1, [subtask(CANONICAL), subtask(ROCKSDB_NATIVE)]).states == {}
    assert checkpoint_stats(1, [subtask(OLD_CANONICAL)]).states == {}
