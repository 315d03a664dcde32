"""Exact ``state_entries`` on ordered key-value engines: counted on write, kept across restore and rescale.

Issue 43: RocksDB's ``estimate-num-keys`` wandered from 999 to 2,619 for at
most 1,000 keys. The ordered base counts (key, namespace) entries as writes
reach the engine (``state/_kvcount``), as Spark's RocksDB store keeps
``numRowsTotal``; native snapshots record the counts per key group, so a
restore at another parallelism sums those it owns. Every checkpoint's count
is checked against what the state processor reads from it.
"""

from __future__ import annotations

from datetime import timedelta
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
    StateTtlConfig,
    ValueStateDescriptor,
)
from statekit.backend_api import KeyedBackendParameters, KeyGroupRange
from statekit.serializers import IntSerializer, StrSerializer
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


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb", "sqlite", "heap"])
def test_entries_are_exact_through_churn_restore_and_rescale(tmp_path: Path, backend: str) -> None:
    if backend != "heap":
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


def _ordered_backend(engine: str, tmp_path: Path, clock: Any) -> Any:
    """A subtask's keyed backend of an ordered engine, writing every 8 updates (many write batches)."""
    module = pytest.importorskip(f"statekit_{engine}")
    cls = {"rocksdb": "RocksDBStateBackend", "lmdb": "LMDBStateBackend", "sqlite": "SqliteStateBackend"}
    factory = getattr(module, cls[engine])({"write-batch-size": 8})
    return factory.create_keyed_backend(
        KeyedBackendParameters(
            key_serializer=StrSerializer(),
            key_group_range=KeyGroupRange(0, 127),
            max_parallelism=128,
            clock=clock,
            local_dir=str(tmp_path),
        )
    )


def _stored(b: Any) -> int:
    """(key, namespace) entries the engine holds, every state's, read from its columns (not counted)."""
    total = 0
    for name in b.stored_state_names:
        col = b.kv_column(name, create=False)
        if col is None:
            continue
        b.kv_write_column(col)
        split = b.layout.split
        total += len({k[: len(k) - len(split(k)[3])] for k, _ in col.iterate(b"")})
    return total


@pytest.mark.parametrize("engine", ["rocksdb", "lmdb", "sqlite"])
def test_entries_are_exact_through_blind_writes_ttl_expiry_and_namespace_merges(
    tmp_path: Path, engine: str
) -> None:
    """What the churn job does not: writes without a read, expiry on read and by sweep, merged windows."""
    now = [1_000]
    b = _ordered_backend(engine, tmp_path, lambda: now[0])
    try:
        ttl = StateTtlConfig(timedelta(seconds=10))
        value = b.get_state(ValueStateDescriptor("v", int, ttl=ttl))
        plain = b.get_state(ValueStateDescriptor("p", int))
        windows = b.get_state(ListStateDescriptor("w", int), namespace_serializer=IntSerializer())

        def check(step: str) -> None:
            assert b.kv_exact_entries() == _stored(b), step

        keys = [f"k{i}" for i in range(40)]
        for i, k in enumerate(keys):  # blind writes: no read told whether the entry existed
            b.set_current_key(k)
            value.update(i)
            plain.update(i)
            if i % 4 == 0:
                plain.update(None)  # a delete in the same write batch as its put
        check("blind puts")
        for i, k in enumerate(keys):
            b.set_current_key(k)
            plain.update(i + 1)  # over an entry, over a deleted one
            if i % 3 == 0:
                plain.clear()  # a blind delete of an entry, or of nothing
            if i % 5 == 0:
                value.update(value.value() + 1)  # read-modify-write of a live entry
        check("overwrites and deletes")
        # The batched read-modify-write: 12 new keys, 4 live entries, 2 cleared ones (k0, k3) put again.
        plain.update_batch([f"n{i}" for i in range(12)] + keys[:6], lambda v: (v or 0) + 1)
        check("update_batch")
        for i, k in enumerate(keys):
            b.set_current_key(k)
            for ns in (1, 2, 3):
                windows.set_current_namespace(ns)
                windows.add(i * ns)
            if i % 2 == 0:
                windows.merge_namespaces(10, [1, 2])  # two windows merge into a new one
            if i % 7 == 0:
                windows.merge_namespaces(3, [3])  # a window merged into itself
        check("namespace merges")
        now[0] += 11_000  # every TTL entry expired
        for k in keys[:20]:
            b.set_current_key(k)
            assert value.value() is None  # expired on read: dropped
        check("expired on read")
        b.sweep_expired("v", ttl.ttl_ms, b"", 1 << 62)  # the rest by a sweep
        check("swept")
        # 40 plain values (26 of the 40 keys, 2 put again, 12 new), windows {10, 3} for even keys and
        # {1, 2, 3} for odd ones.
        assert b.kv_exact_entries() == _stored(b) == 40 + 20 * 2 + 20 * 3
    finally:
        b.close()


@pytest.mark.parametrize("engine", ["rocksdb", "lmdb", "sqlite"])
def test_what_reads_noted_is_forgotten_when_the_engine_loads_besides_the_write_path(
    tmp_path: Path, engine: str
) -> None:
    """Reads note which keys the engine lacks; a bulk load (a restore) after only reads voids that."""
    keys = [f"k{i}" for i in range(24)]
    src = _ordered_backend(engine, tmp_path / "src", None)
    b = _ordered_backend(engine, tmp_path / "dst", None)
    try:
        s = src.get_state(ValueStateDescriptor("v", int))
        for k in keys[:12]:
            src.set_current_key(k)
            s.update(5)
        col = src.kv_column("v")
        src.kv_write_column(col)
        items = list(col.iterate(b""))
        v = b.get_state(ValueStateDescriptor("v", int))
        for k in keys:  # every key read absent, nothing written: the notes wait for a write
            b.set_current_key(k)
            assert v.value() is None
        b._kv_load_sorted("v", items)  # what a canonical restore loads: 12 of the keys read absent above
        assert b.kv_exact_entries() == _stored(b) == 12
        for k in keys:  # blind writes: 12 over loaded entries, 12 new ones
            b.set_current_key(k)
            v.update(1)
        assert b.kv_exact_entries() == _stored(b) == 24
    finally:
        src.close()
        b.close()
