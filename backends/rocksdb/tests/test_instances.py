"""A rescale keeps the old instances, clipped, instead of copying their keys (``_restore``).

The subtask that takes key groups from two old subtasks holds two instances;
every read, write and scan goes to the one holding the key's key group, its
snapshots carry both (``statekit-rocksdb-2``), and they restore at any
parallelism and read through the tools (verify, convert, the state
processor). Past ``MAX_INSTANCES`` the smallest part is copied into a
neighbour. A malformed instance list, or a reader of format 1 only, stops
with an error naming the snapshot.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import statekit_rocksdb._restore as restore_module
from statekit import KeyedProcessFunction, LocalRunner, ValueStateDescriptor
from statekit.backend_api import key_group_for_bytes
from statekit.checkpointing import (
    complete_checkpoint,
    key_group_range_for_operator,
    load_checkpoint,
    write_subtask_state,
)
from statekit.cli._cli import main
from statekit.errors import CheckpointError, CorruptSnapshotError
from statekit.serializers import StrSerializer
from statekit.snapshot_codec import NativeFile
from statekit.state_processor import SavepointReader
from statekit.testing import keyed_checkpoint_part
from statekit_rocksdb import ROCKSDB_INSTANCES_FORMAT, ROCKSDB_NATIVE_FORMAT, RocksDBKeyedStateBackend
from statekit_storage import FileSystemCheckpointStorage

MAXP = 128
COUNT = ValueStateDescriptor("count", int, default=0)
KEYS = [f"k{i:05d}" for i in range(30_000)]  # above the size a canonical snapshot copies into memory


def group(key: str) -> int:
    return key_group_for_bytes(StrSerializer().serialize(key), MAXP)


class Job:
    """Subtasks of one operator at some parallelism, checkpointed into a real storage."""

    def __init__(self, make: Callable[..., RocksDBKeyedStateBackend], root: Path) -> None:
        self.make = make
        self.storage = FileSystemCheckpointStorage(str(root / "chk"))
        self.next_id = 1

    def subtasks(self, p: int) -> list[RocksDBKeyedStateBackend]:
        return [self.make(key_group_range=key_group_range_for_operator(MAXP, p, i)) for i in range(p)]

    def checkpoint(self, backends: list[RocksDBKeyedStateBackend], native: bool = True) -> str:
        cid, self.next_id = self.next_id, self.next_id + 1
        writer = self.storage.begin_checkpoint("job", cid)
        sts = [
            write_subtask_state(writer, "op", i, b, None, native_checkpoint_id=cid if native else None)
            for i, b in enumerate(backends)
        ]
        loc = complete_checkpoint(writer, job_id="job", checkpoint_id=cid, max_parallelism=MAXP, subtasks=sts)
        for b in backends:
            b.notify_checkpoint_complete(cid)
        return loc

    def restore(self, loc: str, p: int) -> list[RocksDBKeyedStateBackend]:
        cp = load_checkpoint(self.storage, loc)
        out = self.subtasks(p)
        for i, b in enumerate(out):
            cp.restore_subtask("op", i, p, b, None)
        return out

    def handles(self, loc: str, b: RocksDBKeyedStateBackend) -> list[Any]:
        return list(load_checkpoint(self.storage, loc).native_handles("op", b.key_group_range))


@pytest.fixture
def job(make_backend: Callable[..., RocksDBKeyedStateBackend], tmp_path: Path) -> Iterator[Job]:
    yield Job(make_backend, tmp_path)


def contents(backends: list[RocksDBKeyedStateBackend]) -> dict[str, int]:
    out: dict[str, int] = {}
    for b in backends:
        s = b.get_state(COUNT)
        keys = list(b.keys(COUNT.name))
        groups = [group(k) for k in keys]
        assert groups == sorted(groups), "a scan crosses the instances out of key-group order"
        for k in keys:
            assert k not in out, f"{k} is held by two subtasks"
            b.set_current_key(k)
            out[k] = s.value()
    return out


def fill(backends: list[RocksDBKeyedStateBackend], keys: list[str], fn: Callable[[int], int]) -> None:
    for b in backends:
        own = b.key_group_range
        b.get_state(COUNT).update_batch([k for k in keys if group(k) in own], fn)


def checkpointed(job: Job, parallelism: int, value: int) -> tuple[str, dict[Any, Any]]:
    """``parallelism`` subtasks holding ``value`` for every key, checkpointed: its location and contents."""
    first = job.subtasks(parallelism)
    fill(first, KEYS, lambda _: value)
    return job.checkpoint(first), contents(first)


def test_a_rescale_copies_no_entry_and_routes_every_access_by_key_group(
    job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    loc, expected = checkpointed(job, 2, 1)

    def no_copy(*args: Any) -> None:
        raise AssertionError("a rescale within MAX_INSTANCES copied entries")

    monkeypatch.setattr(restore_module, "_ingest_range", no_copy)
    up = job.restore(loc, 3)
    assert [len(b.databases) for b in up] == [1, 2, 1]
    middle = up[1]
    (r0, _), (r1, _) = middle.databases
    assert (r0.start, r0.end, r1.start, r1.end) == (43, 63, 64, 85)
    assert contents(up) == expected
    assert middle.num_entries() == sum(1 for k in KEYS if 43 <= group(k) <= 85)

    # Writes, deletes and new keys land in the instance of their key group, and read back.
    fill(up, KEYS[::7], lambda v: v + 10)
    fresh = [f"new{i}" for i in range(500)]
    fill(up, fresh, lambda _: 5)
    gone = KEYS[1::11]
    for b in up:
        s = b.get_state(COUNT)
        for k in gone:
            if group(k) in b.key_group_range:
                b.set_current_key(k)
                s.clear()
    for k in KEYS[::7]:
        expected[k] += 10
    expected.update(dict.fromkeys(fresh, 5))
    for k in gone:
        del expected[k]
    assert contents(up) == expected
    for r, db in middle.databases:  # each instance holds its own key groups only
        assert _groups_in(db, middle) <= set(r)

    loc2 = job.checkpoint(up)
    handles = job.handles(loc2, middle)
    mid = next(h for h in handles if h.key_group_range == middle.key_group_range)
    assert mid.format == ROCKSDB_INSTANCES_FORMAT
    assert mid.meta["instances"] == [{"files": "0-", "range": [43, 63]}, {"files": "1-", "range": [64, 85]}]
    assert {f.name.split("-", 1)[0] for f in mid.files} == {"0", "1"}
    assert all(h.format == ROCKSDB_NATIVE_FORMAT for h in handles if h is not mid)
    for b in up:
        b.close()

    # Both formats restore at any parallelism, exactly.
    for p in (3, 2, 1, 4):
        again = job.restore(loc2, p)
        assert contents(again) == expected, p
        for b in again:
            b.close()


def _groups_in(db: Any, backend: RocksDBKeyedStateBackend) -> set[int]:
    """The key groups of every entry a database holds (range deletions hide the clipped ones)."""
    cf = db.get_column_family("state:count")
    try:
        return {backend.layout.split(k)[0] for k in cf.keys()}
    finally:
        cf.close()


def test_a_canonical_snapshot_of_several_instances_is_exact(job: Job) -> None:
    first = job.subtasks(2)
    fill(first, KEYS, lambda _: 3)
    up = job.restore(job.checkpoint(first), 3)
    expected = contents(first)
    savepoint = job.checkpoint(up, native=False)  # read from frozen checkpoints of each instance
    for b in up:
        b.close()
    assert contents(job.restore(savepoint, 2)) == expected


def test_past_the_limit_the_smallest_part_is_copied_into_a_neighbour(
    job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    loc, expected = checkpointed(job, 5, 2)
    copies = []
    ingest = restore_module._ingest_range

    def counted(*args: Any) -> None:
        copies.append(args[1])
        ingest(*args)

    monkeypatch.setattr(restore_module, "_ingest_range", counted)
    monkeypatch.setattr(restore_module, "MAX_INSTANCES", 2)
    down = job.restore(loc, 2)  # subtask 0 (0-63) overlaps 3 old ones (0-25, 26-51, 52-76)
    assert [len(b.databases) for b in down] == [2, 2]
    assert copies  # the third part of each was copied
    assert contents(down) == expected
    fill(down, KEYS[::5], lambda v: v * 10)
    for k in KEYS[::5]:
        expected[k] *= 10
    loc2 = job.checkpoint(down)
    for b in down:
        b.close()
    assert contents(job.restore(loc2, 3)) == expected


def test_a_malformed_instance_list_is_refused_before_anything_changes(job: Job) -> None:
    first = job.subtasks(2)
    fill(first, KEYS[:3000], lambda _: 1)
    up = job.restore(job.checkpoint(first), 3)
    loc = job.checkpoint(up)
    mid = job.handles(loc, up[1])[0]
    bad = [
        {**mid.meta, "instances": [{"files": "0-", "range": [43, 60]}, {"files": "1-", "range": [64, 85]}]},
        {**mid.meta, "instances": [{"files": "0-", "range": [43, 85]}]},
        {**mid.meta, "instances": "0-"},
    ]
    for meta in bad:
        b = job.make(key_group_range=up[1].key_group_range)
        with pytest.raises(CorruptSnapshotError, match="instance"):
            b.restore_native([dataclasses.replace(mid, meta=meta)])
        assert not os.path.exists(b.db_path) and b.num_entries() == 0
    stray = dataclasses.replace(mid, files=(*mid.files, dataclasses.replace(mid.files[0], name="x.sst")))
    with pytest.raises(CorruptSnapshotError, match="x.sst"):
        job.make(key_group_range=up[1].key_group_range).restore_native([stray])


def test_a_reader_of_format_1_only_names_the_format_it_cannot_read(job: Job) -> None:
    first = job.subtasks(2)
    fill(first, KEYS[:3000], lambda _: 1)
    up = job.restore(job.checkpoint(first), 3)
    loc = job.checkpoint(up)
    old = job.make(key_group_range=key_group_range_for_operator(MAXP, 3, 1))
    old.readable_native_formats = (ROCKSDB_NATIVE_FORMAT,)  # type: ignore[misc]  # as statekit before it
    with pytest.raises(CheckpointError, match=ROCKSDB_INSTANCES_FORMAT):
        load_checkpoint(job.storage, loc).restore_subtask("op", 1, 3, old, None)


class Put(KeyedProcessFunction):
    """Records are (key, value): the key's count becomes value."""

    def open(self, ctx: Any) -> None:
        self.v = ctx.get_state(COUNT)

    def process(self, record: Any, ctx: Any) -> None:
        self.v.update(record[1])


def test_tools_read_a_checkpoint_of_several_instances(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def runner(p: int) -> LocalRunner:
        return LocalRunner(
            Put,
            key_selector=lambda r: r[0],
            config={
                "statekit.backend": "rocksdb",
                "statekit.checkpoints.dir": str(tmp_path / "chk"),
                "statekit.local-dir": str(tmp_path / "local"),
                "statekit.parallelism": p,
            },
            job_id="tools",
        )

    expected = {k: i for i, k in enumerate(KEYS[:3000])}
    first = runner(2)
    for item in expected.items():
        first.process(item)
    first.checkpoint()
    first.close()
    up = runner(3)
    up.restore("latest")
    chk = up.checkpoint()
    assert keyed_checkpoint_part(up, chk, 1)["format"] == ROCKSDB_INSTANCES_FORMAT
    up.close()

    assert main(["checkpoints", "verify", chk]) == 0
    reader = SavepointReader.latest(str(tmp_path / "chk"), "tools")  # through the backend
    t = reader.read_table("process", COUNT.name)
    reader.close()
    assert dict(zip(t["key"].to_pylist(), t["value"].to_pylist())) == expected
    capsys.readouterr()
    assert main(["savepoint", "convert", chk, "--target", str(tmp_path / "sp"), "--no-progress"]) == 0
    location = capsys.readouterr().out.strip().rsplit(" ", 1)[-1]
    back = runner(1)
    back.restore(location)
    kb = back.subtasks[0].keyed_backend
    s = kb.get_state(COUNT)
    got = {}
    for k in kb.keys(COUNT.name):
        kb.set_current_key(k)
        got[k] = s.value()
    back.close()
    assert got == expected


def _sst_copies(monkeypatch: pytest.MonkeyPatch, what: Callable[[NativeFile], Any]) -> list[Any]:
    """``what`` of every SST file copied (downloaded or linked) into an instance from now on."""
    copied: list[Any] = []
    copy_to = NativeFile.copy_to

    def counted(self: NativeFile, path: Any, *, link: bool = False) -> None:
        if self.name.endswith(".sst"):
            copied.append(what(self))
        copy_to(self, path, link=link)

    monkeypatch.setattr(NativeFile, "copy_to", counted)
    return copied


def test_a_rescale_downloads_each_sst_file_once_per_process_and_links_only_an_unchanged_copy(
    job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    loc, expected = checkpointed(job, 2, 4)
    copied = _sst_copies(monkeypatch, lambda f: f.name)
    up = job.restore(loc, 3)  # the middle subtask links what its neighbours downloaded
    ssts = [f.name for h in job.handles(loc, up[1]) for f in h.files if f.name.endswith(".sst")]
    assert sorted(copied) == sorted(ssts)
    assert contents(up) == expected

    # A copy that is gone (its instance closed), or whose modification time changed, is downloaded.
    old = job.handles(loc, up[1])
    first_ssts = [f.name for h in old if h.meta["range"][0] == 0 for f in h.files if f.name.endswith(".sst")]
    expected_mid = contents([up[1]])
    up[0].close()
    up[1].close()
    touched = next(n for n in sorted(os.listdir(up[2].db_path)) if n.endswith(".sst"))
    os.utime(os.path.join(up[2].db_path, touched), ns=(1, 1))
    copied.clear()
    again = job.make(key_group_range=key_group_range_for_operator(MAXP, 3, 1))
    load_checkpoint(job.storage, loc).restore_subtask("op", 1, 3, again, None)
    assert sorted(copied) == sorted([*first_ssts, touched])
    assert contents([again]) == expected_mid


def test_a_rescale_back_downloads_each_sst_file_once_also_within_one_subtask(
    job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = job.subtasks(2)
    fill(first, KEYS, lambda _: 6)
    up = job.restore(job.checkpoint(first), 3)
    loc = job.checkpoint(up)  # old subtask 1 holds two instances that share files with its neighbours
    expected = contents(up)
    for b in up:
        b.close()
    copied = _sst_copies(monkeypatch, lambda f: f.sha256)
    down = job.restore(loc, 2)  # subtask 0 holds the old subtask 0 and part of 1: the same SST files
    files = {f.sha256 for b in down for h in job.handles(loc, b) for f in h.files if f.name.endswith(".sst")}
    assert sorted(copied, key=str) == sorted(files, key=str)
    assert contents(down) == expected
