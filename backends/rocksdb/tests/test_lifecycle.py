"""Local directories (the kit's lifecycle tests), options and the TTL sweep of the RocksDB backend."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from statekit import Configuration, StateTtlConfig, ValueStateDescriptor, default_registry
from statekit.errors import ConfigurationError
from statekit.testing import OnDiskLifecycleTests, snapshot_handle

COUNT = ValueStateDescriptor("count", int, default=0)


class TestRocksDBLifecycle(OnDiskLifecycleTests):
    """The kit's on-disk lifecycle: restore cycles, a killed process, a closed backend."""

    # Native only, as before the kit had these tests: canonical restores into RocksDB are the
    # conformance kit's (tests/test_conformance.py), and the cycles cost about 4 s per format here.
    restore_formats = ("native",)

    @pytest.fixture
    def backend_name(self) -> str:
        return "rocksdb"


def test_options_are_validated_by_name() -> None:
    conf = Configuration.from_mapping(
        {"statekit.backend": "rocksdb", "statekit.backend.rocksdb.compression": "gzip"}
    )
    with pytest.raises(ConfigurationError, match="compression"):
        conf.validate(default_registry())
    ok = Configuration.from_mapping(
        {"statekit.backend": "rocksdb", "statekit.backend.rocksdb.memory-budget": "64mb"}
    )
    ok.validate(default_registry())
    backend = default_registry().create_backend("rocksdb", ok.plugin_options("backend", "rocksdb"))
    assert backend.options["memory-budget"] == 64 << 20


def test_memory_budget_shares_one_cache_and_charges_memtables_to_it(make_backend: Any) -> None:
    a = make_backend(options={"memory-budget": 32 << 20})
    engine = a._rocksdb_engine
    assert engine.write_buffer_manager is not None
    assert engine.write_buffer_manager.get_buffer_size() == 16 << 20
    assert engine.write_buffer_size <= 4 << 20
    s = a.get_state(COUNT)
    for i in range(20_000):
        a.set_current_key(f"key-{i}")
        s.update(i)
    a.kv_write_buffered()
    assert 0 < engine.write_buffer_manager.get_usage() <= 16 << 20
    assert engine.cache.get_usage() <= 32 << 20


def test_wal_is_off_by_default_and_on_as_an_option(make_backend: Any) -> None:
    assert make_backend()._rocksdb_engine.write_options.disable_wal is True
    assert make_backend(options={"wal": True})._rocksdb_engine.write_options.disable_wal is False


def test_the_ttl_sweep_deletes_expired_entries_in_bounded_steps(
    make_backend: Any, clock: Any, raw_count: Any
) -> None:
    ttl = StateTtlConfig(timedelta(seconds=1), cleanup_incremental_size=2)
    b = make_backend(options={"ttl-sweep-interval": 10})
    s = b.get_state(ValueStateDescriptor("v", int, ttl=ttl))
    for i in range(200):
        b.set_current_key(f"k{i}")
        s.update(i)
    clock.advance(1000)
    b.set_current_key("fresh")
    s.update(0)
    b.kv_write_buffered()
    snap = snapshot_handle(b)  # taken before the sweep: it keeps everything it saw
    assert snap.entries == 201
    stored = raw_count(b)
    for _ in range(10):  # 10 accesses: one sweep of 2 x 10 entries
        s.value()
    assert stored - raw_count(b) in (19, 20)  # 20 checked: every one expired but "fresh"
    for _ in range(10 * 20):
        s.value()
    assert raw_count(b) == 1  # only the live entry is left
    b.set_current_key("fresh")
    assert s.value() == 0
