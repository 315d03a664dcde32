"""Task-local recovery: local copies of checkpoint files are used only when they are the very file, intact."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from statekit.backend_api import NativeFile, upload_native_file
from statekit.checkpoints._local_recovery import (
    Downloads,
    LocalCopies,
    LocalRecoveryStorage,
    LocalRecoveryWriter,
)
from statekit.testing import ReferenceCheckpointStorage

DATA = bytes(range(256)) * 64


def _write(storage: ReferenceCheckpointStorage, copies: LocalCopies, n: int, data: bytes = DATA) -> dict:
    writer = LocalRecoveryWriter(storage.begin_checkpoint("job", n), copies)
    out = writer.create_stream(f"state-{n}")
    out.write(data[:100])
    out.write(data[100:])
    handle = out.close_and_get_handle()
    assert len(writer.kept) == 1
    return handle.to_json()


def test_a_written_file_is_read_back_from_its_local_copy(tmp_path: Path) -> None:
    storage = ReferenceCheckpointStorage()
    copies = LocalCopies(str(tmp_path / "copies"))
    desc = _write(storage, copies, 1)
    downloads = Downloads()
    reading = LocalRecoveryStorage(storage, copies, downloads)
    h = reading.resolve_handle("loc", desc)
    assert h.size == len(DATA) and h.read(10, 20) == DATA[10:30] and h.read() == DATA
    assert downloads.remote_bytes == 0 and downloads.local_bytes == 20 + len(DATA)
    assert h.to_json() == desc  # metadata never names a local file
    assert reading.used == list(copies.index())  # the subtask's manifest keeps what it read


def test_a_damaged_copy_is_deleted_and_the_storage_read(tmp_path: Path) -> None:
    storage = ReferenceCheckpointStorage()
    copies = LocalCopies(str(tmp_path / "copies"))
    desc = _write(storage, copies, 1)
    (path,) = copies.index().values()
    raw = bytearray(Path(path).read_bytes())
    raw[7] ^= 0xFF
    Path(path).write_bytes(bytes(raw))
    downloads = Downloads()
    h = LocalRecoveryStorage(storage, copies, downloads).resolve_handle("loc", desc)
    assert h.read() == DATA  # the storage's bytes, not the damaged copy's
    assert downloads.remote_bytes == len(DATA) and downloads.local_bytes == 0
    assert copies.index() == {}


def test_another_files_copy_is_never_used(tmp_path: Path) -> None:
    storage = ReferenceCheckpointStorage()
    copies = LocalCopies(str(tmp_path / "copies"))
    _write(storage, copies, 1)
    other = storage.begin_checkpoint("job", 2).create_stream("state-2")  # written elsewhere, no copy here
    other.write(b"other bytes")
    desc = other.close_and_get_handle().to_json()
    downloads = Downloads()
    assert (
        LocalRecoveryStorage(storage, copies, downloads).resolve_handle("loc", desc).read() == b"other bytes"
    )
    assert downloads.remote_bytes == len(b"other bytes")


def test_without_copies_reads_are_only_counted(tmp_path: Path) -> None:
    storage = ReferenceCheckpointStorage()
    out = storage.begin_checkpoint("job", 1).create_stream("s")
    out.write(DATA)
    desc = out.close_and_get_handle().to_json()
    downloads = Downloads()
    assert LocalRecoveryStorage(storage, None, downloads).resolve_handle("loc", desc).read() == DATA
    assert downloads.remote_bytes == len(DATA) and downloads.remote_files == 1


def test_each_subtask_keeps_its_last_two_snapshots_and_collect_frees_the_rest(tmp_path: Path) -> None:
    storage = ReferenceCheckpointStorage()
    young = LocalCopies(str(tmp_path / "copies"))
    _write(storage, young, 99)
    assert young.collect() == 0  # no manifest keeps it, but another process may be about to
    copies = LocalCopies(str(tmp_path / "copies"), grace_seconds=0)
    names = []
    for n in range(1, 5):
        before = set(copies.index())
        _write(storage, copies, n, DATA[n:] + DATA[:n])
        (key,) = set(copies.index()) - before
        names.append(key)
        copies.remember(0, [key])
        freed = copies.collect()
        assert freed == (0 if n == 2 else len(DATA))  # n == 1: the young one no manifest kept
    assert set(copies.index()) == set(names[-2:])
    copies.remember(1, [names[0]])  # another subtask's manifest keeps nothing that is gone
    assert copies.collect() == 0 and set(copies.index()) == set(names[-2:])


def test_native_files_are_linked_from_copies_and_kept_when_downloaded(tmp_path: Path) -> None:
    storage = ReferenceCheckpointStorage()
    copies = LocalCopies(str(tmp_path / "copies"))
    sst = tmp_path / "000012.sst"
    sst.write_bytes(DATA)
    writer = LocalRecoveryWriter(storage.begin_checkpoint("job", 1), copies)
    f = upload_native_file(
        lambda n, s: writer.create_stream(n, shared=s), "s/000012.sst", "000012.sst", str(sst),
        shared=True, checkpoint_id=1,
    )  # fmt: skip
    (copy,) = copies.index().values()
    assert os.stat(copy).st_ino == os.stat(sst).st_ino  # an immutable file is linked, not copied
    desc = f.to_json()
    downloads = Downloads()
    reading = LocalRecoveryStorage(storage, copies, downloads)
    restored = NativeFile.from_json(desc, lambda d: reading.resolve_handle("loc", d))
    restored.copy_to(tmp_path / "linked.sst", link=True)
    assert os.stat(tmp_path / "linked.sst").st_ino == os.stat(sst).st_ino
    assert downloads.remote_bytes == 0

    # Downloaded on a machine without the copy: checked, then kept for the next restore here.
    elsewhere = LocalCopies(str(tmp_path / "elsewhere"))
    downloads = Downloads()
    reading = LocalRecoveryStorage(storage, elsewhere, downloads)
    fetched = NativeFile.from_json(desc, lambda d: reading.resolve_handle("loc", d))
    fetched.copy_to(tmp_path / "fetched.sst", link=True)
    assert downloads.remote_bytes == len(DATA)
    (kept,) = elsewhere.index().values()
    assert Path(kept).read_bytes() == DATA and kept.endswith(f".{zlib.crc32(DATA):08x}")
    # A file the engine writes into (link=False) is copied and never kept.
    third = LocalCopies(str(tmp_path / "third"))
    reading = LocalRecoveryStorage(storage, third, Downloads())
    NativeFile.from_json(desc, lambda d: reading.resolve_handle("loc", d)).copy_to(tmp_path / "data.mdb")
    assert third.index() == {}


def test_a_source_changed_after_its_upload_is_never_used(tmp_path: Path) -> None:
    storage = ReferenceCheckpointStorage()
    copies = LocalCopies(str(tmp_path / "copies"))
    src = tmp_path / "file.sst"
    src.write_bytes(DATA)
    writer = LocalRecoveryWriter(storage.begin_checkpoint("job", 1), copies)
    f = upload_native_file(
        lambda n, s: writer.create_stream(n, shared=s),
        "s/f",
        "file.sst",
        str(src),
        shared=True,
        checkpoint_id=1,
    )
    with open(src, "r+b") as changed:  # the same inode: the kept link sees the change
        changed.write(b"\0" * 16)
    downloads = Downloads()
    reading = LocalRecoveryStorage(storage, copies, downloads)
    assert NativeFile.from_json(f.to_json(), lambda d: reading.resolve_handle("loc", d)).read() == DATA
    assert downloads.remote_bytes == len(DATA) and copies.index() == {}
