"""Local directories, options and the TTL sweep of the RocksDB backend."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from statekit import (
    Configuration,
    ConfigurationError,
    KeyedProcessFunction,
    LocalRunner,
    StateAccessError,
    StateTtlConfig,
    ValueStateDescriptor,
    default_registry,
)
from statekit.testing import run_killed_job, snapshot_handle, value_state_contents

COUNT = ValueStateDescriptor("count", int, default=0)


class Count(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.c = ctx.get_state(COUNT)

    def process(self, record: Any, ctx: Any) -> None:
        self.c.update(self.c.value() + 1)


def instances(local: Path) -> list[Path]:
    return sorted(local.rglob("rocksdb-*"))


def test_twenty_restore_cycles_leave_only_the_live_instances(tmp_path: Path) -> None:
    local = tmp_path / "local"
    conf = {
        "statekit.backend": "rocksdb",
        "statekit.checkpoints.dir": str(tmp_path / "chk"),
        "statekit.local-dir": str(local),
        "statekit.parallelism": 2,
    }
    for cycle in range(20):
        r = LocalRunner(Count, key_selector=lambda x: x, config=conf)
        r.restore("latest")
        for i in range(50):
            r.process(f"k{i % 7}")
        r.checkpoint()
        assert len(instances(local)) == 2  # one instance per subtask, nothing left from earlier cycles
        if cycle % 2:
            r.close()
        else:  # a failed run: the subtasks' backends are dropped without a clean shutdown of the job
            for ctx in r.subtasks:
                ctx.keyed_backend.close()
            r.close()
        assert instances(local) == []
    r = LocalRunner(Count, key_selector=lambda x: x, config=conf)
    r.restore("latest")
    total = sum(value_state_contents(r, COUNT).values())
    assert total == 20 * 50
    r.close()


def test_a_closed_backend_refuses_use_and_releases_its_files(make_backend: Any, tmp_path: Path) -> None:
    b = make_backend(local_dir=tmp_path / "l")
    s = b.get_state(COUNT)
    b.set_current_key("a")
    s.update(1)
    snap = b.snapshot()  # pending while the backend closes
    b.close()
    assert instances(tmp_path / "l") == []
    with pytest.raises(StateAccessError):
        s.value()
    snap.release()


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


def test_instances_of_a_killed_process_are_removed_by_the_next_run(tmp_path: Path) -> None:
    import signal

    local = tmp_path / "local"
    proc = run_killed_job("rocksdb", local)  # two subtasks
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert len(instances(local)) == 2  # SIGKILL: nobody could clean up
    r = LocalRunner(
        Count,
        key_selector=lambda x: x,
        config={"statekit.backend": "rocksdb", "statekit.local-dir": str(local)},
    )
    r.process("a")
    assert len(instances(local)) == 1  # only the live one: the dead process's directories are gone
    r.close()
    assert instances(local) == []
