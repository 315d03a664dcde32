"""What is particular to the sqlite backend: its files, its options, its registration."""

from __future__ import annotations

import os
import sqlite3
import threading

from statekit import LocalRunner, RecordSource, ValueStateDescriptor, default_registry
from statekit.backend_api import KeyedBackendParameters, KeyGroupRange
from statekit.ordered_kv import column_prefix
from statekit.serializers import serializer_for
from statekit_sqlite import SqliteKeyedStateBackend, SqliteStateBackend


def make(local_dir=None, **options):
    return SqliteStateBackend(options).create_keyed_backend(
        KeyedBackendParameters(
            key_serializer=serializer_for(str),
            key_group_range=KeyGroupRange.of(0, 127),
            max_parallelism=128,
            local_dir=local_dir,
        )
    )


def test_entries_are_rows_of_a_file_in_local_dir(tmp_path):
    """One row per composite key (statekit's ordered layout), under the state's name."""
    b = make(str(tmp_path))
    s = b.get_state(ValueStateDescriptor("count", int))
    for k in ("a", "b", "c"):
        b.set_current_key(k)
        s.update(len(k))
    b.kv_write_buffered()
    assert os.path.dirname(os.path.dirname(b.path)) == str(tmp_path)
    with sqlite3.connect(b.path) as conn:
        rows = [k for (k,) in conn.execute("SELECT k FROM kv ORDER BY k").fetchall()]
    prefix = column_prefix("count")  # one key space: the state's prefix, then statekit's composite key
    assert all(k.startswith(prefix) for k in rows) and len(rows) == 3
    assert sorted(b.layout.split(k[len(prefix) :])[1] for k in rows) == [b"a", b"b", b"c"]
    b.close()
    assert not os.path.exists(b.path)  # the file is a working copy; checkpoints hold the state


def test_without_local_dir_a_temporary_directory_is_used_and_removed():
    b = make()
    directory = os.path.dirname(b.path)
    assert os.path.isdir(directory)
    b.close()
    assert not os.path.exists(directory)


def test_native_checkpoints_upload_only_the_keys_that_changed(tmp_path):
    import dataclasses

    from statekit.testing import KitNativeOutput

    b = make(str(tmp_path))
    s = b.get_state(ValueStateDescriptor("v", int))
    for i in range(1000):
        b.set_current_key(f"k{i}")
        s.update(i)
    first = b.native_snapshot(1).write(KitNativeOutput(1))
    b.notify_checkpoint_complete(1)
    b.set_current_key("k7")
    s.update(-7)
    second = b.native_snapshot(2).write(KitNativeOutput(2))
    assert len(first.files) == 128 and len(second.files) == 129  # every key group's file, one delta
    new = [f for f in second.files if f.checkpoint_id == 2]
    assert [f.name for f in new] == ["kg-delta-2"] and new[0].size < 64
    target = make(str(tmp_path))
    target.restore_native([second])
    ts = target.get_state(ValueStateDescriptor("v", int))
    target.set_current_key("k7")
    assert ts.value() == -7
    target.close()
    # A checkpoint of the format before deltas (statekit-sqlite-kg-1) still restores.
    meta = {k: v for k, v in first.meta.items() if k != "deltas"}
    older = dataclasses.replace(first, format="statekit-sqlite-kg-1", meta=meta)
    target = make(str(tmp_path))
    target.restore_native([older])
    ts = target.get_state(ValueStateDescriptor("v", int))
    target.set_current_key("k7")
    assert ts.value() == 7
    target.close()
    b.close()


def test_a_snapshot_is_written_by_another_thread_from_its_own_read_transaction(tmp_path):
    b = make(str(tmp_path))
    s = b.get_state(ValueStateDescriptor("v", int))
    b.set_current_key("a")
    s.update(1)
    snap = b.snapshot()
    s.update(2)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("handle", snap.to_handle()))
    t.start()
    t.join(timeout=60)
    target = make(str(tmp_path))
    ts = target.get_state(ValueStateDescriptor("v", int))
    target.restore([result["handle"]])
    target.set_current_key("a")
    assert ts.value() == 1
    assert s.value() == 2


def test_registered_by_entry_point_with_its_options():
    reg = default_registry()
    assert "sqlite" in reg.backends()
    assert reg.backends()["sqlite"].distribution == "statekit-sqlite"
    backend = reg.create_backend("sqlite", {"synchronous": "normal", "cache-size": "1mb"})
    assert isinstance(backend, SqliteStateBackend)
    assert backend.options == {
        "synchronous": "normal",
        "cache-size": 1 << 20,
        "write-batch-size": 1024,
        "ttl-sweep-interval": 1000,
        "max-deltas": 10,
        "max-delta-ratio": 0.5,
    }


def test_a_job_runs_on_it_by_name(tmp_path):
    from statekit import KeyedProcessFunction

    class Count(KeyedProcessFunction):
        def open(self, ctx):
            self.count = ctx.get_state(ValueStateDescriptor("count", int, default=0))

        def process(self, record, ctx):
            self.count.update(self.count.value() + 1)
            yield ctx.current_key, self.count.value()

    conf = {
        "statekit.backend": "sqlite",
        "statekit.checkpoints.dir": str(tmp_path / "chk"),
        "statekit.parallelism": 2,
    }
    records = [f"k{i % 7}" for i in range(100)]
    r = LocalRunner(Count, key_selector=lambda x: x, config=conf)
    r.run(RecordSource(records), max_records=60)
    r.checkpoint()
    r.close()
    r2 = LocalRunner(Count, key_selector=lambda x: x, config={**conf, "statekit.parallelism": 3})
    out = []
    r2.sink = out.append
    r2.run(RecordSource(records), restore="latest")
    assert isinstance(r2.subtasks[0].keyed_backend, SqliteKeyedStateBackend)
    assert sorted(out)[-1] == ("k6", 14)
    r2.close()
