"""Exact ``state_entries`` on ordered key-value engines: counted on write, kept across restore and rescale.

Issue 43: RocksDB's ``estimate-num-keys`` wandered from 999 to 2,619 for at
most 1,000 keys. The ordered base counts (key, namespace) entries as writes
reach the engine (``state/_kvcount``), as Spark's RocksDB store keeps
``numRowsTotal``; native snapshots record the counts per key group, so a
restore at another parallelism sums those it owns. Every checkpoint's count
is checked against what the state processor reads from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from statekit import (
    KeyedProcessFunction,
    ListStateDescriptor,
    LocalRunner,
    MapStateDescriptor,
    ProcessContext,
    RecordSource,
    RuntimeContext,
    ValueStateDescriptor,
)
from statekit.state._kvcount import ENTRY_COUNTS, EntryCounts
from statekit.state._kvlayout import KeyLayout
from statekit.state_processor import SavepointReader

STATES = ("count", "flag", "events", "methods")


class Churn(KeyedProcessFunction):
    """Value, list and map state that grow, are overwritten, shrink and are cleared."""

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", int, default=0))
        self.flag = ctx.get_state(ValueStateDescriptor("flag", int))
        self.events = ctx.get_state(ListStateDescriptor("events", int))
        self.methods = ctx.get_state(MapStateDescriptor("methods", str, int))

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Any:
        n = self.count.value() + 1
        self.count.update(n)
        if n % 3 == 0:
            self.flag.clear()
        else:
            self.flag.update(n)
        if n % 5 == 0:
            self.events.clear()
        else:
            self.events.add(record["i"])
        self.methods.put(record["m"], n)
        if n % 7 == 0:
            self.methods.remove(record["m"])
        if n % 11 == 0:
            self.methods.clear()
        yield n


def records(n: int, keys: int) -> list[dict[str, Any]]:
    return [{"k": f"k{(i * 7919) % keys}", "m": ("GET", "POST", "PUT")[i % 3], "i": i} for i in range(n)]


def entries_read(location: str) -> int:
    """(key, namespace) entries of every state, as the state processor reads them from the checkpoint."""
    total = 0
    with SavepointReader.open(location) as reader:
        for name in STATES:
            table = reader.read_table("process", name)
            cols = [c for c in ("key", "namespace") if c in table.column_names]
            total += len(set(zip(*(table.column(c).to_pylist() for c in cols))))
    return total


def runner(tmp_path: Path, backend: str, parallelism: int) -> LocalRunner:
    return LocalRunner(
        Churn,
        key_selector=lambda r: r["k"],
        job_id="churn",
        config={
            "statekit.checkpoints.dir": str(tmp_path / "ckpt"),
            "statekit.backend": backend,
            "statekit.parallelism": parallelism,
            "statekit.checkpoint.interval-records": 700,
            "statekit.checkpoints.retained": 20,
            "statekit.backend.rocksdb.write-batch-size": 64,  # many write batches per checkpoint
        }
        if backend == "rocksdb"
        else {
            "statekit.checkpoints.dir": str(tmp_path / "ckpt"),
            "statekit.backend": backend,
            "statekit.parallelism": parallelism,
            "statekit.checkpoint.interval-records": 700,
            "statekit.checkpoints.retained": 20,
        },
    )


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
def test_entries_are_exact_through_churn_restore_and_rescale(tmp_path: Path, backend: str) -> None:
    pytest.importorskip(f"statekit_{backend}")
    seen = 0
    for parallelism, start in ((2, 0), (3, 2000), (1, 4000), (2, 6000)):  # each run restores the last
        r = runner(tmp_path, backend, parallelism)
        # A list is positional: each run is handed the grown list and goes on after what it read.
        result = r.run(RecordSource(records(start + 2000, 300)), restore="latest")
        r.close()
        assert result.records == 2000
        for info in result.checkpoint_infos:
            s = info.stats
            assert s.state_entries_exact, (parallelism, info.location)
            assert s.state_entries == entries_read(info.location), (parallelism, info.location)
            seen += 1
    assert seen >= 12


def test_counts_without_recorded_ones_are_unknown_and_labelled() -> None:
    counts = EntryCounts(KeyLayout(128))
    counts.restored([{"range": [0, 63]}], range(0, 64), ["count"])
    assert counts.exact(["count"]) is None and counts.meta(["count"]) is None
    counts.restored([{ENTRY_COUNTS: {"count": {"3": 5, "70": 2}}}], range(0, 64), ["count"])
    assert counts.exact(["count"]) == {"count": 5}  # key group 70 is another subtask's


def test_entries_are_exact_after_a_canonical_savepoint_restored_at_another_parallelism(
    tmp_path: Path,
) -> None:
    """A heap job's savepoint (canonical) restored into rocksdb at parallelism 3: bulk loads count."""
    pytest.importorskip("statekit_rocksdb")
    heap = runner(tmp_path, "heap", 2)
    heap.run(RecordSource(records(1500, 200)))
    savepoint = heap.savepoint(str(tmp_path / "savepoints"))
    heap.close()
    r = runner(tmp_path / "rocks", "rocksdb", 3)
    result = r.run(RecordSource(records(2500, 200)), restore=savepoint)
    r.close()
    assert result.skipped_records == 1500 and result.records == 1000
    for info in result.checkpoint_infos:
        assert info.stats.state_entries_exact
        assert info.stats.state_entries == entries_read(info.location)
