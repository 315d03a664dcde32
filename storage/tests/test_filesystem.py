"""The filesystem storage on a local dir, file://, memory:// and s3:// (moto server)."""

from __future__ import annotations

import json
import os
import pickle
import re
import threading
from typing import TYPE_CHECKING, Any

import fsspec
import pytest

from statekit.backend_api import CheckpointStorage
from statekit.errors import CheckpointError, CheckpointNotFoundError, ConfigurationError, CorruptSnapshotError
from statekit_storage import (
    FileStreamHandle,
    FileSystemCheckpointStorage,
    InlineStreamHandle,
    find_latest_checkpoint,
)

if TYPE_CHECKING:
    from conftest import Root


def _typecheck(storage: FileSystemCheckpointStorage) -> CheckpointStorage:
    return storage  # mypy: the class satisfies the contract


def write(writer: Any, name: str, data: bytes, *, shared: bool = False, pieces: int = 1) -> Any:
    out = writer.create_stream(name, shared=shared)
    step = max(1, len(data) // pieces)
    for i in range(0, len(data), step):
        out.write(data[i : i + step])
    assert out.tell() == len(data)
    return out.close_and_get_handle()


def roundtrip(storage: Any, location: str, handle: Any) -> Any:
    """What the coordinator does: description into JSON metadata, back out, resolved."""
    return storage.resolve_handle(location, json.loads(json.dumps(handle.to_json())))


def test_layout_and_complete(root: Root, job_id: str) -> None:
    storage = root.storage(inline_threshold=16)
    assert isinstance(storage, CheckpointStorage)
    writer = storage.begin_checkpoint(job_id, 1)
    assert writer.location == root.sub("chk", job_id, "chk-1")
    own = write(writer, "keyed-op-0.bin", b"x" * 100)
    shared = write(writer, "abc", b"s" * 100, shared=True)
    assert own.to_json() == {"type": "file", "path": "keyed-op-0.bin", "size": 100}
    assert shared.to_json() == {"type": "file", "path": "../shared/abc", "size": 100}
    assert storage.list_checkpoints(job_id) == []  # nothing exists before complete()
    assert writer.complete(b"meta") == writer.location
    assert root.names(root.sub("chk", job_id, "chk-1")) == ["_metadata", "keyed-op-0.bin"]
    assert root.names(root.sub("chk", job_id, "shared")) == ["abc"]
    if root.kind in ("local", "file"):
        assert root.exists(root.sub("chk", job_id, "taskowned"))
    assert storage.task_owned_dir(job_id) == root.sub("chk", job_id, "taskowned")
    assert storage.read_metadata(writer.location) == b"meta"
    assert storage.read_metadata(writer.location + "/_metadata") == b"meta"
    assert storage.list_checkpoints(job_id) == [writer.location]


def test_inline_at_threshold_file_above(root: Root, job_id: str) -> None:
    storage = root.storage(inline_threshold=100)
    writer = storage.begin_checkpoint(job_id, 1)
    at = write(writer, "at.bin", bytes(range(100)), pieces=3)
    above = write(writer, "above.bin", bytes(range(101)), pieces=3)
    empty = write(writer, "empty.bin", b"")
    assert isinstance(at, InlineStreamHandle) and isinstance(empty, InlineStreamHandle)
    assert isinstance(above, FileStreamHandle)
    description = at.to_json()
    assert description["type"] == "inline" and description["size"] == 100
    assert above.to_json() == {"type": "file", "path": "above.bin", "size": 101}
    assert root.names(writer.location) == ["above.bin"]  # inline state wrote no file
    location = writer.complete(b"m")
    assert roundtrip(storage, location, at).read() == bytes(range(100))
    assert roundtrip(storage, location, above).read() == bytes(range(101))
    assert roundtrip(storage, location, empty).read() == b""


def test_past_threshold_streams_to_the_file(tmp_path: Any, job_id: str) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path), inline_threshold=1024)
    out = storage.begin_checkpoint(job_id, 1).create_stream("big.bin")
    chunk = os.urandom(64 * 1024)
    for _ in range(16):
        out.write(chunk)
    # Most of the 1 MiB is already on disk before the stream closes.
    assert os.path.getsize(tmp_path / job_id / "chk-1" / "big.bin") >= 15 * len(chunk)
    assert out.close_and_get_handle().size == 16 * len(chunk)


def test_range_reads(root: Root, job_id: str) -> None:
    storage = root.storage(inline_threshold=10)
    writer = storage.begin_checkpoint(job_id, 3)
    data = os.urandom(5000)
    written = write(writer, "f", data)
    handle = roundtrip(storage, writer.complete(b"m"), written)
    assert handle.size == 5000
    assert handle.read() == data
    assert handle.read(10, 5) == data[10:15]
    assert handle.read(4990) == data[4990:]
    assert handle.read(5000, 0) == b""
    with pytest.raises(CorruptSnapshotError, match="outside"):
        handle.read(4999, 2)
    with pytest.raises(CorruptSnapshotError):
        handle.read(-1, 1)


def test_missing_file_names_it(root: Root, job_id: str) -> None:
    storage = root.storage(inline_threshold=0)
    writer = storage.begin_checkpoint(job_id, 1)
    handle = write(writer, "gone.bin", b"abc")
    location = writer.complete(b"m")
    handle.discard()
    with pytest.raises(CorruptSnapshotError, match=r"gone\.bin: the file is missing"):
        roundtrip(storage, location, handle).read()


def test_stream_discard_deletes_its_file(root: Root, job_id: str) -> None:
    writer = root.storage(inline_threshold=1).begin_checkpoint(job_id, 1)
    out = writer.create_stream("tmp.bin")
    out.write(b"abcdef")
    out.discard()
    assert "tmp.bin" not in root.names(writer.location)
    with pytest.raises(CheckpointError, match="closed"):
        out.write(b"x")


def test_savepoint_is_relocatable(root: Root, job_id: str) -> None:
    storage = root.storage(inline_threshold=10)
    writer = storage.begin_savepoint(job_id)
    prefix = re.escape(root.sub("savepoints", f"savepoint-{job_id[:6]}-"))
    assert re.fullmatch(prefix + "[0-9a-f]{12}", writer.location)
    data, shared_data = os.urandom(300), os.urandom(200)
    handles = [write(writer, "keyed-op-0.bin", data), write(writer, "abc", shared_data, shared=True)]
    assert [h.to_json()["path"] for h in handles] == ["keyed-op-0.bin", "shared/abc"]
    small = write(writer, "small", b"tiny")
    metadata = json.dumps([h.to_json() for h in [*handles, small]]).encode()
    old = writer.complete(metadata)
    assert storage.list_checkpoints(job_id) == []  # savepoints are no checkpoints

    new = root.sub("moved", "sp")
    fs = root.fs
    fs.copy(root.path(old), root.path(new), recursive=True)
    fs.rm(root.path(old), recursive=True)
    fresh = root.storage("other")
    descriptions = json.loads(fresh.read_metadata(new))
    read = [fresh.resolve_handle(new, d).read() for d in descriptions]
    assert read == [data, shared_data, b"tiny"]


def test_savepoint_copied_across_filesystems(tmp_path: Any, job_id: str) -> None:
    source = FileSystemCheckpointStorage(
        "memory://statekit-cross/chk", savepoints_dir="memory://statekit-cross/sp"
    )
    try:
        writer = source.begin_savepoint(job_id)
        handle = write(writer, "state.bin", b"z" * 50000)
        location = writer.complete(json.dumps(handle.to_json()).encode())
        mem = fsspec.filesystem("memory")
        for path in mem.find(location.removeprefix("memory://")):
            target = tmp_path / "sp" / path.rsplit("/", 1)[-1]
            target.parent.mkdir(exist_ok=True)
            target.write_bytes(mem.cat_file(path))
    finally:
        fsspec.filesystem("memory").rm("/statekit-cross", recursive=True)
    local = FileSystemCheckpointStorage(str(tmp_path / "chk"))
    description = json.loads(local.read_metadata(str(tmp_path / "sp")))
    assert local.resolve_handle(str(tmp_path / "sp"), description).read() == b"z" * 50000


def test_savepoint_target_dir_and_missing_dir(root: Root, job_id: str) -> None:
    storage = root.storage(savepoints_dir=None)
    with pytest.raises(ConfigurationError, match=r"statekit\.savepoints\.dir"):
        storage.begin_savepoint(job_id)
    writer = storage.begin_savepoint(job_id, root.sub("target"))
    assert writer.location.startswith(root.sub("target", f"savepoint-{job_id[:6]}-"))
    location = writer.complete(b"sp")
    assert storage.read_metadata(location) == b"sp"
    # The target directory given where the savepoint is meant: the error names the savepoint in it.
    with pytest.raises(CheckpointNotFoundError) as info:
        storage.read_metadata(root.sub("target"))
    assert str(info.value).endswith(
        f"; it holds one that does, {location.rsplit('/', 1)[-1]}: pass {location}"
    )


def test_checkpoint_without_metadata_does_not_exist(root: Root, job_id: str) -> None:
    storage = root.storage(inline_threshold=0)
    for n in (1, 2, 10):
        writer = storage.begin_checkpoint(job_id, n)
        write(writer, "op.bin", b"data")
        if n != 2:  # chk-2 "crashed" before completion
            writer.complete(f"m{n}".encode())
    assert storage.list_checkpoints(job_id) == [root.sub("chk", job_id, f"chk-{n}") for n in (1, 10)]
    assert storage.latest_checkpoint(job_id) == root.sub("chk", job_id, "chk-10")
    missing = root.sub("chk", job_id, "chk-2")
    with pytest.raises(CheckpointNotFoundError, match=re.escape(missing + "/_metadata")) as info:
        storage.read_metadata(missing)
    assert isinstance(info.value, FileNotFoundError)
    assert "holds" not in str(info.value)  # nothing completed inside chk-2: nothing more to say
    # A job's directory given where a checkpoint is meant: the completed ones, the newest named.
    with pytest.raises(CheckpointNotFoundError) as info:
        storage.read_metadata(root.sub("chk", job_id))
    newest = root.sub("chk", job_id, "chk-10")
    assert str(info.value).endswith(
        f"; 2 directories in it do (chk-1, chk-10): pass one of them, such as {newest}"
    )
    assert storage.list_checkpoints("nobody") == [] and storage.latest_checkpoint("nobody") is None


def test_metadata_leaves_no_temp_files(root: Root, job_id: str) -> None:
    storage = root.storage()
    writer = storage.begin_checkpoint(job_id, 1)
    writer.complete(b"m" * 100_000)
    assert root.names(writer.location) == ["_metadata"]
    with pytest.raises(CheckpointError, match="already complete"):
        storage.begin_checkpoint(job_id, 1).complete(b"other")
    assert storage.read_metadata(writer.location) == b"m" * 100_000


def test_metadata_atomicity_by_protocol(root: Root, job_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Renaming filesystems write a temp file and rename it; object stores put _metadata once."""
    fs = root.fs  # fsspec caches instances: the storage uses this one
    calls: list[tuple[str, ...]] = []
    original_mv, original_pipe, original_open = fs.mv, fs.pipe_file, fs.open

    def mv(src: str, dst: str, **kwargs: Any) -> Any:
        assert not fs.exists(dst)  # the rename is what publishes _metadata
        assert fs.cat_file(src) == b"M" * 5000  # and the temp file is complete by then
        calls.append(("mv", src.rsplit("/", 1)[-1], dst.rsplit("/", 1)[-1]))
        return original_mv(src, dst, **kwargs)

    def pipe_file(path: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(("put", path.rsplit("/", 1)[-1]))
        return original_pipe(path, *args, **kwargs)

    def open_(path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        if "w" in mode:
            calls.append(("open", str(path).rsplit("/", 1)[-1]))
        return original_open(path, mode, *args, **kwargs)

    # Instance attributes: async filesystems (s3fs) mirror their sync methods onto the instance.
    monkeypatch.setattr(fs, "mv", mv)
    monkeypatch.setattr(fs, "pipe_file", pipe_file)
    monkeypatch.setattr(fs, "open", open_)
    root.storage().begin_checkpoint(job_id, 1).complete(b"M" * 5000)
    if root.kind in ("local", "file"):
        # A complete temp file, published by a hard link (which fails if _metadata exists: see below).
        ((_, temp),) = calls
        assert re.fullmatch(r"\._metadata\.[0-9a-f]{16}\.inprogress", temp)
        assert root.names(root.sub("chk", job_id, "chk-1")) == ["_metadata"]
    else:
        # One put (which may open the file inside it), never a temp file or a rename.
        assert calls[0] == ("put", "_metadata") and {c[1:] for c in calls} == {("_metadata",)}


def test_metadata_is_never_replaced_by_a_writer_that_slipped_past_the_check(
    root: Root, job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs completing one checkpoint: the second fails even if it checked before the first wrote.

    ``exists`` answering False plays the race (the check came before the other
    writer's _metadata); what refuses the write is the store's own exclusive
    create: a hard link on local disks, a conditional put (If-None-Match) on the
    moto S3 server. (memory:// decides with ``exists`` itself, in this process.)
    """
    if root.kind == "memory":
        pytest.skip("memory:// has no create primitive of its own: its exclusive open calls exists()")
    storage = root.storage()
    storage.begin_checkpoint(job_id, 1).complete(b"first")
    fs = root.fs
    original_exists = fs.exists
    monkeypatch.setattr(
        fs, "exists", lambda path, **kw: False if path.endswith("_metadata") else original_exists(path, **kw)
    )
    with pytest.raises(CheckpointError, match="already complete"):
        storage.begin_checkpoint(job_id, 1).complete(b"second")
    monkeypatch.undo()
    location = root.sub("chk", job_id, "chk-1")
    assert storage.read_metadata(location) == b"first"
    assert root.names(location) == ["_metadata"]  # and no temp file left behind


def test_local_metadata_never_seen_partial(tmp_path: Any, job_id: str) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))
    meta = tmp_path / job_id / "chk-1" / "_metadata"
    payload = os.urandom(8 << 20)
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                seen.append(len(meta.read_bytes()))
            except FileNotFoundError:
                pass

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        storage.begin_checkpoint(job_id, 1).complete(payload)
    finally:
        stop.set()
        watcher.join()
    assert all(n == len(payload) for n in seen)


def test_discard_never_touches_shared_or_savepoints(root: Root, job_id: str) -> None:
    storage = root.storage(inline_threshold=4)
    first = storage.begin_checkpoint(job_id, 1)
    shared = write(first, "sst-1", b"shared-bytes", shared=True)
    write(first, "own-1", b"exclusive")
    chk1 = first.complete(b"m1")
    second = storage.begin_checkpoint(job_id, 2)
    chk2 = second.complete(b"m2")  # references sst-1 too

    storage.discard_checkpoint(chk1)
    assert not root.exists(chk1) and storage.list_checkpoints(job_id) == [chk2]
    assert root.names(root.sub("chk", job_id, "shared")) == ["sst-1"]
    assert roundtrip(storage, chk2, shared).read() == b"shared-bytes"
    storage.discard_checkpoint(chk1)  # again: nothing left, no error

    savepoint = storage.begin_savepoint(job_id)
    sp_handle = write(savepoint, "abc", b"savepoint-shared", shared=True)
    sp = savepoint.complete(b"sp")
    with pytest.raises(CheckpointError, match="savepoints are never deleted"):
        storage.discard_checkpoint(sp)
    with pytest.raises(CheckpointError, match="only shared files"):
        storage.discard_shared(sp, sp_handle.to_json())
    assert storage.read_metadata(sp) == b"sp"
    with pytest.raises(CheckpointError, match="only shared files"):
        storage.discard_shared(chk2, {"type": "file", "path": "own-1", "size": 9})

    storage.discard_shared(chk2, shared.to_json())
    assert root.names(root.sub("chk", job_id, "shared")) == []
    storage.discard_shared(chk2, InlineStreamHandle(b"x").to_json())  # inline: nothing to delete


def test_abort_deletes_only_the_unfinished_checkpoint(root: Root, job_id: str) -> None:
    storage = root.storage(inline_threshold=1)
    done = storage.begin_checkpoint(job_id, 1)
    write(done, "s", b"shared", shared=True)
    done.complete(b"m")
    unfinished = storage.begin_checkpoint(job_id, 2)
    write(unfinished, "own", b"partial")
    write(unfinished, "s2", b"shared2", shared=True)
    unfinished.abort()
    assert not root.exists(unfinished.location)
    assert root.names(root.sub("chk", job_id, "shared")) == ["s", "s2"]
    with pytest.raises(CheckpointError, match="is complete"):
        storage.begin_checkpoint(job_id, 1).abort()
    assert storage.list_checkpoints(job_id) == [done.location]


def test_list_jobs_and_find_latest(root: Root) -> None:
    storage = root.storage()
    for job, ids in (("job-a", (1, 2)), ("job-b", (5,))):
        for n in ids:
            storage.begin_checkpoint(job, n).complete(b"m")
    storage.begin_checkpoint("job-c", 1)  # never completed
    assert storage.list_jobs() == ["job-a", "job-b"]
    opts = root.storage_options
    latest = root.sub("chk", "job-a", "chk-2")
    assert find_latest_checkpoint(root.sub("chk", "job-a"), storage_options=opts) == latest
    with pytest.raises(CheckpointError, match="several jobs .*job-a, job-b"):
        find_latest_checkpoint(root.sub("chk"), storage_options=opts)
    storage.discard_checkpoint(root.sub("chk", "job-b", "chk-5"))
    assert find_latest_checkpoint(root.sub("chk"), storage_options=opts) == latest
    assert find_latest_checkpoint(root.sub("empty"), storage_options=opts) is None


@pytest.mark.parametrize("job", ["", "a/b", "..", ".hidden", "a\\b"])
def test_invalid_job_ids(tmp_path: Any, job: str) -> None:
    with pytest.raises(CheckpointError, match="invalid job id"):
        FileSystemCheckpointStorage(str(tmp_path)).begin_checkpoint(job, 1)


@pytest.mark.parametrize("name", ["", "../x", "a/../b", "/abs", "_metadata", "a//b"])
def test_invalid_stream_names(tmp_path: Any, name: str) -> None:
    writer = FileSystemCheckpointStorage(str(tmp_path)).begin_checkpoint("job", 1)
    with pytest.raises(CheckpointError, match="invalid stream name"):
        writer.create_stream(name)


def test_bad_descriptions(tmp_path: Any) -> None:
    storage = FileSystemCheckpointStorage(str(tmp_path))
    with pytest.raises(CheckpointError, match="unknown state handle type 'bytes'"):
        storage.resolve_handle(str(tmp_path), {"type": "bytes", "name": "x", "size": 1})
    with pytest.raises(CorruptSnapshotError, match="refusing state file path '/etc/passwd'"):
        storage.resolve_handle(str(tmp_path), {"type": "file", "path": "/etc/passwd", "size": 1})
    with pytest.raises(CheckpointError, match="malformed"):
        storage.resolve_handle(str(tmp_path), {"type": "inline", "data": "not base64!"})
    with pytest.raises(CheckpointError, match="says 5"):
        storage.resolve_handle(str(tmp_path), {"type": "inline", "data": "YQ==", "size": 5})


def test_storage_and_handles_pickle(root: Root, job_id: str) -> None:
    storage = pickle.loads(pickle.dumps(root.storage(inline_threshold=2)))
    writer = storage.begin_checkpoint(job_id, 1)
    handle = pickle.loads(pickle.dumps(write(writer, "f", b"hello")))
    assert handle.read(1, 3) == b"ell"
    assert pickle.loads(pickle.dumps(storage)).read_metadata(writer.complete(b"m")) == b"m"


def test_job_files_are_replaced_whole_and_named_safely(root: Root, job_id: str) -> None:
    """SupportsJobFiles: the checkpoint history and savepoint requests, on every kind of URL."""
    from statekit.backend_api import SupportsJobFiles

    storage = root.storage()
    assert isinstance(storage, SupportsJobFiles)
    assert storage.read_job_file(job_id, "checkpoint-history.json") is None
    storage.write_job_file(job_id, "checkpoint-history.json", b"first")
    storage.write_job_file(job_id, "checkpoint-history.json", b"second, longer")
    assert storage.read_job_file(job_id, "checkpoint-history.json") == b"second, longer"
    assert root.names(root.sub("chk", job_id, "files")) == ["checkpoint-history.json"]  # no temporary left
    assert storage.list_checkpoints(job_id) == []  # a job's files are no checkpoint
    storage.delete_job_file(job_id, "checkpoint-history.json")
    storage.delete_job_file(job_id, "checkpoint-history.json")  # gone already: nothing to do
    assert storage.read_job_file(job_id, "checkpoint-history.json") is None
    for bad in ("../x", "a/b", ".hidden", "Upper", ""):
        with pytest.raises(CheckpointError, match="invalid job file name"):
            storage.write_job_file(job_id, bad, b"x")


def test_a_job_file_is_created_by_one_of_many_writers_at_once(tmp_path: Any) -> None:
    """``create_job_file`` is exclusive: of 16 threads racing, one creates it and the others are told."""
    storage = FileSystemCheckpointStorage(str(tmp_path / "ckpt"))
    barrier = threading.Barrier(16)
    created: list[bytes] = []
    lock = threading.Lock()

    def create(i: int) -> None:
        data = f"writer {i}".encode()
        barrier.wait()
        if storage.create_job_file("job", "savepoint-request.json", data):
            with lock:
                created.append(data)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(created) == 1
    assert storage.read_job_file("job", "savepoint-request.json") == created[0]
    assert not [n for n in os.listdir(tmp_path / "ckpt" / "job" / "files") if n.endswith(".inprogress")]


def test_the_jobmanager_storage_creates_a_job_file_once() -> None:
    from statekit_storage import JobManagerCheckpointStorage

    storage = JobManagerCheckpointStorage()
    assert storage.create_job_file("job", "savepoint-request.json", b"a")
    assert not storage.create_job_file("job", "savepoint-request.json", b"b")
    assert storage.read_job_file("job", "savepoint-request.json") == b"a"


def _modes(top: str) -> dict[str, int]:
    """The permission bits of ``top`` and of everything below it, by path relative to ``top``."""
    found = {".": os.stat(top).st_mode & 0o777}
    for here, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(here, name)
            found[os.path.relpath(path, top)] = os.lstat(path).st_mode & 0o777
    return found


@pytest.mark.parametrize("prefix", ["", "file://"])
def test_local_checkpoints_and_savepoints_are_private_whatever_the_umask(
    tmp_path: Any, job_id: str, prefix: str
) -> None:
    old = os.umask(0o002)  # a umask that would make group-writable, world-readable files
    try:
        top = os.path.join(os.fspath(tmp_path), "deep", "checkpoints")
        storage = FileSystemCheckpointStorage(
            prefix + top, savepoints_dir=prefix + os.path.join(os.fspath(tmp_path), "sp"), inline_threshold=0
        )
        writer = storage.begin_checkpoint(job_id, 1)
        write(writer, "keyed-op-0.bin", b"x" * 100)
        write(writer, "abc", b"s" * 100, shared=True)
        writer.complete(b"meta")
        storage.write_job_file(job_id, "history.json", b"{}")
        savepoint = storage.begin_savepoint(job_id)
        write(savepoint, "op.bin", b"y" * 10)
        location = savepoint.complete(b"meta")
    finally:
        os.umask(old)
    for where in (os.path.join(os.fspath(tmp_path), "deep"), location.removeprefix(prefix)):
        modes = _modes(where)
        assert len(modes) >= 3
        for path, mode in modes.items():
            full = os.path.join(where, path)
            assert mode == (0o700 if os.path.isdir(full) else 0o600), (path, oct(mode))
    assert _modes(os.path.join(os.fspath(tmp_path), "sp"))["."] == 0o700


def test_local_permissions_umask_shares_deliberately(tmp_path: Any, job_id: str) -> None:
    from statekit.backend_api import PluginRegistry

    registry = PluginRegistry.load()
    old = os.umask(0o022)
    try:
        storage = registry.create_storage(
            "filesystem", {"checkpoints-dir": os.fspath(tmp_path / "cp"), "local-permissions": "umask"}
        )
        writer = storage.begin_checkpoint(job_id, 1)
        write(writer, "keyed-op-0.bin", b"x" * 100)
        writer.complete(b"meta")
    finally:
        os.umask(old)
    modes = _modes(os.fspath(tmp_path / "cp"))
    assert modes[job_id] == 0o755 and modes[os.path.join(job_id, "chk-1", "_metadata")] == 0o644
    with pytest.raises(ConfigurationError, match="local-permissions"):
        registry.create_storage("filesystem", {"checkpoints-dir": "x", "local-permissions": "shared"})
