"""Local directories (the kit's lifecycle tests), options and TTL cleanup of the LMDB backend."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from statekit import Configuration, StateTtlConfig, ValueStateDescriptor, default_registry
from statekit.errors import ConfigurationError, CorruptSnapshotError, SnapshotCancelledError, StateAccessError
from statekit.testing import OnDiskLifecycleTests, instance_dirs, snapshot_handle

COUNT = ValueStateDescriptor("count", int, default=0)


class TestLMDBLifecycle(OnDiskLifecycleTests):
    """The kit's on-disk lifecycle: restore cycles (both formats), a killed process, a closed backend."""

    @pytest.fixture
    def backend_name(self) -> str:
        return "lmdb"


def test_a_snapshot_pending_at_close_cannot_be_written(make_backend: Any, tmp_path: Path) -> None:
    b = make_backend(local_dir=tmp_path / "l")
    s = b.get_state(COUNT)
    b.set_current_key("a")
    s.update(1)
    snap = b.snapshot()  # pending while the backend closes
    b.close()
    with pytest.raises(SnapshotCancelledError, match="pending when its backend closed"):
        snap.to_handle()


def test_a_failed_native_restore_changes_nothing_and_leaves_no_files(
    make_backend: Any, tmp_path: Path
) -> None:
    import dataclasses

    src = make_backend(options={"native-format": "full"})
    s = src.get_state(COUNT)
    for i in range(100):
        src.set_current_key(f"k{i}")
        s.update(i)
    handle = snapshot_handle(src, native=True)
    f = handle.files[0]
    corrupt = dataclasses.replace(handle, files=(dataclasses.replace(f, sha256="0" * 64),))
    target = make_backend(local_dir=tmp_path / "t")
    with pytest.raises(CorruptSnapshotError, match=r"data\.mdb"):
        target.restore_native([corrupt])
    assert target.num_entries() == 0
    # No download left behind: the live environment and the owner file only.
    assert sorted(p.name for p in instance_dirs(tmp_path / "t")[0].iterdir()) == [".statekit-owner", "db"]
    alien = dataclasses.replace(handle, meta={**handle.meta, "lmdb_version": [1, 0, 0]})
    with pytest.raises(Exception, match="savepoint"):
        target.restore_native([alien])
    target.restore_native([handle])  # still restorable
    assert target.num_entries() == 100
    target.close()
    assert instance_dirs(tmp_path / "t") == []


def test_options_are_validated_by_name() -> None:
    conf = Configuration.from_mapping({"statekit.backend": "lmdb", "statekit.backend.lmdb.writemap": "maybe"})
    with pytest.raises(ConfigurationError, match="writemap"):
        conf.validate(default_registry())
    ok = Configuration.from_mapping(
        {
            "statekit.backend": "lmdb",
            "statekit.backend.lmdb.initial-map-size": "1mb",
            "statekit.backend.lmdb.max-map-size": "2gb",
            "statekit.backend.lmdb.sync": "true",
        }
    )
    ok.validate(default_registry())
    backend = default_registry().create_backend("lmdb", ok.plugin_options("backend", "lmdb"))
    assert backend.options["initial-map-size"] == 1 << 20
    assert backend.options["max-map-size"] == 2 << 30
    assert backend.options["sync"] is True


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"sync": True, "metasync": True, "writemap": True, "readahead": False},
    ],
    ids=["defaults", "all-flipped"],
)
def test_engine_flags_reach_the_environment(make_backend: Any, options: dict[str, Any]) -> None:
    b = make_backend(options={"initial-map-size": 1 << 20, **options})
    flags = b.env.flags()
    assert flags["sync"] is options.get("sync", False)
    assert flags["metasync"] is options.get("metasync", False)
    assert flags["writemap"] is options.get("writemap", False)
    assert flags["readahead"] is options.get("readahead", True)
    assert flags["lock"] is True  # the reader table protects pinned snapshots
    assert b.map_size == 1 << 20
    s = b.get_state(COUNT)
    for i in range(3000):
        b.set_current_key(f"k{i}")
        s.update(i)
    b.set_current_key("k2999")
    assert s.value() == 2999 and b.num_entries() == 3000


def test_max_states_bounds_the_named_databases(make_backend: Any) -> None:
    b = make_backend(options={"max-states": 2})
    b.get_state(ValueStateDescriptor("a", int))
    b.get_state(ValueStateDescriptor("b", int))
    with pytest.raises(StateAccessError, match=r"statekit\.backend\.lmdb\.max-states"):
        b.get_state(ValueStateDescriptor("c", int))


def raw_count(b: Any, name: str = "v") -> int:
    col = b.kv_column(name, create=False)
    with b.env.begin(db=col.engine.db) as txn:
        return int(txn.stat(col.engine.db)["entries"])


def test_the_ttl_sweep_deletes_expired_entries_in_bounded_steps(make_backend: Any, clock: Any) -> None:
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


def test_the_sweep_never_deletes_an_entry_with_a_buffered_update(make_backend: Any, clock: Any) -> None:
    ttl = StateTtlConfig(timedelta(seconds=1), cleanup_incremental_size=1000)
    b = make_backend(options={"ttl-sweep-interval": 2, "write-batch-size": 100_000})
    s = b.get_state(ValueStateDescriptor("v", int, ttl=ttl))
    b.set_current_key("a")
    s.update(1)  # access 1
    assert s.value() == 1  # access 2 sweeps: nothing expired
    b.kv_write_buffered()
    clock.advance(1000)  # the stored "a" expired...
    s.update(2)  # ...access 3: a fresh update of it waits in the buffer
    assert s.value() == 2  # access 4 sweeps: it finds the stored "a" expired, and must leave it
    b.kv_write_buffered()
    assert s.value() == 2 and raw_count(b) == 1


def test_a_native_restore_drops_what_a_full_snapshot_would(make_backend: Any, clock: Any) -> None:
    ttl = StateTtlConfig(timedelta(seconds=10), cleanup_full_snapshot=True)
    b = make_backend()
    s = b.get_state(ValueStateDescriptor("v", int, ttl=ttl))
    for i in range(50):
        b.set_current_key(f"old{i}")
        s.update(i)
    clock.advance(6000)
    for i in range(50):
        b.set_current_key(f"new{i}")
        s.update(i)
    clock.advance(5000)  # the old ones expired, the new ones not
    handle = snapshot_handle(b, native=True)
    assert raw_count(b) == 100  # the live data keeps them until read or swept
    for target in (make_backend(), make_backend()):
        target.restore_native([handle])
        assert raw_count(target) == 50  # undeclared: the snapshot's own TTL applies
        t = target.get_state(ValueStateDescriptor("v", int, ttl=ttl))
        assert sorted(target.keys("v")) == sorted(f"new{i}" for i in range(50))
        target.set_current_key("new3")
        assert t.value() == 3
