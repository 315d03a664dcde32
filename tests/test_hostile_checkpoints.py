"""Damaged and crafted checkpoints: refused with statekit's error, never half-restored or deleting outside.

A checkpoint directory is input like any other: a ``_metadata`` may point
outside its job directory, length fields may be huge, JSON nested without end.
Each case is a real checkpoint written by a real job, then damaged on disk.
The fuzz tests run ``max(100, 5 × the profile's max_examples)`` examples
(100 under ``ci``, 10,000 under ``nightly``); the damages named above each have
a test of their own.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from jobs import RULES, SEEN, CountUrls, count_urls_runner, make_records, state_of_runner
from statekit import LocalRunner, RecordSource
from statekit.errors import CorruptSnapshotError, StateError
from statekit_storage import FileSystemCheckpointStorage

RECORDS = make_records(600, urls=40, seed=11)
_META_MAGIC = b"STKMETA1"
FUZZ = settings(
    max_examples=max(100, 5 * settings.default.max_examples),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    deadline=None,
)


def make_runner(root: Path, **conf: Any) -> LocalRunner:
    return count_urls_runner(str(root), conf)


def everything(runner: LocalRunner) -> dict[str, Any]:
    """Keyed state, operator state and source position: what a restore must bring back exactly."""
    return {
        "keyed": state_of_runner(runner),
        "seen": [sorted(ctx.get_list_state(SEEN).get()) for ctx in runner.subtasks],
        "rules": [dict(ctx.get_broadcast_state(RULES).items()) for ctx in runner.subtasks],
        "position": runner.position,
    }


def is_untouched(runner: LocalRunner) -> bool:
    return runner.position is None and all(ctx.keyed_backend.num_entries() == 0 for ctx in runner.subtasks)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A completed checkpoint (every stream a file) and the state it holds."""
    root = tmp_path_factory.mktemp("hostile") / "ckpt"
    r = make_runner(root)
    chk = Path(r.run(RecordSource(RECORDS)).checkpoints[-1])  # the end of the input's checkpoint
    r.close()
    check = make_runner(root)
    check.restore(str(chk))
    expected = everything(check)
    check.close()
    return chk, expected


@pytest.fixture
def chk(written: tuple[Path, dict[str, Any]]) -> Iterator[Path]:
    """The checkpoint directory; every file is put back after the test."""
    path = written[0]
    saved = {p: p.read_bytes() for p in path.iterdir() if p.is_file()}
    try:
        yield path
    finally:
        for p in path.iterdir():
            if p not in saved:
                p.unlink()
        for p, data in saved.items():
            p.write_bytes(data)


def seal(obj: Any) -> bytes:
    """Metadata bytes with a valid checksum: what a crafter (not a bit flip) produces."""
    body = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    return _META_MAGIC + body + struct.pack("<I", zlib.crc32(body))


def unseal(data: bytes) -> Any:
    return json.loads(data[len(_META_MAGIC) : -4])


def craft(chk: Path, change: Callable[[dict[str, Any]], None]) -> None:
    meta = unseal((chk / "_metadata").read_bytes())
    change(meta)
    (chk / "_metadata").write_bytes(seal(meta))


def before_digests(meta: Any) -> None:
    """Drop every SHA-256 from metadata: a checkpoint of a statekit before digests.

    Then the CRC-32s and the parser are what refuses a crafted file (as they are
    for a crafter who records the digests of the crafted bytes too).
    """
    if isinstance(meta, dict):
        for key in ("sha256", "header_sha256", "block_sha256", "tail_sha256"):
            meta.pop(key, None)
        for value in meta.values():
            before_digests(value)
    elif isinstance(meta, list):
        for value in meta:
            before_digests(value)


NOT_RECORDED = "the bytes are not the ones this checkpoint recorded"


def keyed_handle(meta: dict[str, Any], subtask: int = 0) -> dict[str, Any]:
    handle: dict[str, Any] = meta["operators"]["process"][subtask]["keyed"]["handle"]
    return handle


def restore_fails(chk: Path, match: str) -> CorruptSnapshotError:
    r = make_runner(chk.parent.parent)
    with pytest.raises(CorruptSnapshotError, match=match) as info:
        r.restore(str(chk))
    assert is_untouched(r)
    r.close()
    return info.value


# --- handles pointing outside the job's directory --------------------------------------------------


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file outside every checkpoint that a crafted handle tries to read or delete."""
    path = tmp_path / "victim.txt"
    path.write_text("not yours")
    return path


def hostile_paths(chk: Path, victim: Path) -> list[str]:
    return [
        "../../../" * 10 + str(victim).lstrip("/"),  # .. far past the root
        str(victim),  # absolute
        f"file://{victim}",  # another scheme
        "s3://another-bucket/key",  # another bucket
        "../../other-job/chk-1/process-0.keyed",  # another job's directory
        "~/x",
        "a\\..\\..\\x",
        "..",
    ]


def test_handles_outside_the_job_directory_are_refused_on_restore(chk: Path, victim: Path) -> None:
    for bad in hostile_paths(chk, victim):
        craft(chk, lambda m, bad=bad: keyed_handle(m).update(path=bad))
        error = restore_fails(chk, "refusing state file path")
        assert str(chk / "_metadata") in str(error)
        # The operator-state handle is refused the same way.
        craft(chk, lambda m, bad=bad: keyed_handle(m).update(path="process-0.keyed"))
        craft(chk, lambda m, bad=bad: m["operators"]["process"][1]["operator"]["handle"].update(path=bad))
        restore_fails(chk, "refusing state file path")
        craft(
            chk,
            lambda m: m["operators"]["process"][1]["operator"]["handle"].update(path="process-1.operator"),
        )
    assert victim.read_text() == "not yours"


def test_a_path_inside_the_job_directory_still_restores(chk: Path, written: tuple[Path, Any]) -> None:
    craft(chk, lambda m: keyed_handle(m).update(path="../chk-1/./process-0.keyed"))
    r = make_runner(chk.parent.parent)
    r.restore(str(chk))
    assert everything(r) == written[1]


def test_retention_and_discard_never_delete_outside_the_job_shared_directory(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    outside = tmp_path / "victim.txt"
    outside.write_text("keep")
    other_job = root / "other" / "chk-1"
    other_job.mkdir(parents=True)
    (other_job / "state").write_text("keep too")
    r = make_runner(root, **{"statekit.checkpoints.retained": 1})
    src = RecordSource(RECORDS)
    r.run(src, max_records=100)
    first = Path(r.checkpoint())
    hostile = [
        {"type": "file", "path": "../../../" * 8 + str(outside).lstrip("/"), "size": 4},
        {"type": "file", "path": str(outside), "size": 4},
        {"type": "file", "path": "../../other/chk-1/state", "size": 8},
        {"type": "file", "path": "process-0.keyed", "size": 1},  # the checkpoint's own, not shared
        {"type": "file", "path": f"file://{outside}"},
    ]
    craft(first, lambda m: m["operators"]["process"][0]["keyed"].update(shared=hostile))
    storage = r.storage
    for desc in hostile:
        with pytest.raises(StateError, match="refusing"):
            storage.discard_shared(str(first), desc)
    r.run(src, max_records=100)
    with pytest.warns(RuntimeWarning, match="retention left a file alone"):
        second = r.checkpoint()  # retention drops the crafted first checkpoint
    assert storage.list_checkpoints("job") == [second]
    assert not first.exists()
    assert outside.read_text() == "keep"
    assert (other_job / "state").read_text() == "keep too"
    with pytest.raises(StateError, match="refusing to discard"):
        storage.discard_checkpoint(str(other_job.parent))


def test_another_bucket_on_s3_is_neither_read_nor_deleted(s3_endpoint: dict[str, str]) -> None:
    pytest.importorskip("s3fs")
    import boto3

    endpoint, bucket = s3_endpoint["endpoint_url"], s3_endpoint["bucket"]
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="someone-else")
    s3.put_object(Bucket="someone-else", Key="secret", Body=b"theirs")
    options = {"client_kwargs": {"endpoint_url": endpoint}}
    storage = FileSystemCheckpointStorage(
        f"s3://{bucket}/hostile", inline_threshold=0, storage_options=options
    )
    r = LocalRunner(
        CountUrls,
        key_selector=lambda rec: rec["url"],
        storage=storage,
        parallelism=2,
        config={"statekit.checkpoints.retained": 1, "statekit.checkpoint.format": "canonical"},
    )
    src = RecordSource(RECORDS)
    r.run(src, max_records=50)
    location = r.checkpoint()
    key = location.removeprefix(f"s3://{bucket}/") + "/_metadata"
    meta = unseal(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    escape = "../../../../someone-else/secret"
    meta["operators"]["process"][0]["keyed"]["handle"]["path"] = escape
    meta["operators"]["process"][0]["keyed"]["shared"] = [{"type": "file", "path": escape, "size": 6}]
    s3.put_object(Bucket=bucket, Key=key, Body=seal(meta))
    with pytest.raises(CorruptSnapshotError, match="refusing state file path"):
        LocalRunner(CountUrls, key_selector=lambda rec: rec["url"], storage=storage, parallelism=2).restore(
            location
        )
    r.run(src, max_records=50)
    with pytest.warns(RuntimeWarning, match="retention left a file alone"):
        r.checkpoint()
    assert s3.get_object(Bucket="someone-else", Key="secret")["Body"].read() == b"theirs"
    assert location not in storage.list_checkpoints("job")


# --- damaged structure: lengths, nesting, truncation, versions ----------------------------------------

_HDR = struct.Struct("<8sHI")


def rewrite_header(data: bytes, *, version: int | None = None, hjson: bytes | None = None) -> bytes:
    """The keyed file with another version or header JSON, checksum recomputed (a crafted file)."""
    magic, old_version, hlen = _HDR.unpack_from(data)
    end = _HDR.size + hlen + 4
    body = hjson if hjson is not None else data[_HDR.size : _HDR.size + hlen]
    head = _HDR.pack(magic, old_version if version is None else version, len(body)) + body
    return head + struct.pack("<I", zlib.crc32(head)) + data[end:]


@pytest.mark.parametrize("which", ["zero", "newer", "max"])
def test_a_wrong_format_version_is_corrupt_and_names_the_file(chk: Path, which: str) -> None:
    f = chk / "process-1.keyed"
    data = f.read_bytes()
    current = _HDR.unpack_from(data)[1]  # the version this statekit writes (and the newest it reads)
    version = {"zero": 0, "newer": current + 1, "max": 0xFFFF}[which]
    f.write_bytes(rewrite_header(data, version=version))
    restore_fails(chk, rf"process-1\.keyed: the header: {NOT_RECORDED}")
    craft(chk, before_digests)
    restore_fails(
        chk, rf"process-1\.keyed: canonical format version {version} is not one this statekit reads"
    )


@pytest.mark.parametrize("version", [0, 3, "1", None])
def test_a_wrong_metadata_version_is_corrupt_and_names_the_file(chk: Path, version: Any) -> None:
    craft(chk, lambda m: m.update(version=version))
    restore_fails(chk, "_metadata: metadata version")


def test_oversized_length_fields_are_refused_before_reading(chk: Path) -> None:
    f = chk / "process-0.keyed"
    original = f.read_bytes()
    # The header's length field claims 4 GiB: refused from the 14 bytes before it.
    f.write_bytes(original[:10] + struct.pack("<I", 0xFFFFFFF0) + original[14:])
    restore_fails(chk, rf"process-0\.keyed: the header: {NOT_RECORDED}")  # the recorded length is read
    craft(chk, before_digests)
    restore_fails(chk, r"process-0\.keyed: header length 4294967280 exceeds")
    # A header of 65 MiB in a (sparse) file large enough to hold it: over the header limit.
    with open(f, "wb") as out:
        out.write(original[:10] + struct.pack("<I", 65 << 20))
        out.truncate(70 << 20)
    craft(chk, lambda m: keyed_handle(m).update(size=70 << 20))
    restore_fails(
        chk, r"process-0\.keyed: header length 68157440 exceeds the file or the 67108864-byte limit"
    )


def test_a_block_whose_column_length_overruns_it_is_corrupt(chk: Path) -> None:
    f = chk / "process-0.keyed"
    data = bytearray(f.read_bytes())
    meta = unseal((chk / "_metadata").read_bytes())
    offsets = meta["operators"]["process"][0]["keyed"]["offsets"]
    kg, (off, ln) = next(iter(offsets.items()))
    block = data[off : off + ln - 4]
    # key group, sections, state, entries, then the first column's length: make it huge, re-checksum.
    struct.pack_into("<I", block, 8 + 6, 0x7FFFFFFF)
    data[off : off + ln] = bytes(block) + struct.pack("<I", zlib.crc32(bytes(block)))
    f.write_bytes(bytes(data))
    restore_fails(chk, rf"process-0\.keyed: the block of key group {kg}: {NOT_RECORDED}")
    craft(chk, before_digests)
    restore_fails(chk, rf"process-0\.keyed: malformed block of key group {kg}: a column of 2147483647 bytes")


def test_an_index_entry_count_that_overruns_the_index_is_corrupt(chk: Path) -> None:
    f = chk / "process-1.keyed"
    data = bytearray(f.read_bytes())
    (ioff,) = struct.unpack_from("<Q", data, len(data) - 16)
    index = data[ioff : len(data) - 16 - 4]
    struct.pack_into("<I", index, 0, 0xFFFFFFFF)
    data[ioff : len(data) - 16] = bytes(index) + struct.pack("<I", zlib.crc32(bytes(index)))
    f.write_bytes(bytes(data))
    restore_fails(chk, r"process-1\.keyed: the index's entry count disagrees")


def test_deeply_nested_json_is_corrupt_not_a_recursion_error(chk: Path) -> None:
    deep = b"[" * 200_000 + b"]" * 200_000
    f = chk / "process-0.keyed"
    f.write_bytes(rewrite_header(f.read_bytes(), hjson=deep))
    craft(chk, lambda m: keyed_handle(m).update(size=f.stat().st_size))
    restore_fails(chk, rf"process-0\.keyed: the header: {NOT_RECORDED}")
    craft(chk, before_digests)
    restore_fails(chk, r"process-0\.keyed: malformed header: RecursionError")
    (chk / "_metadata").write_bytes(_META_MAGIC + deep + struct.pack("<I", zlib.crc32(deep)))
    restore_fails(chk, r"_metadata: malformed metadata \(RecursionError")


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("ttl", True, "its ttl is bool"),  # found by the fuzz below: an AttributeError, not a StateError
        ("ttl", {"ttl_ms": "1", "update_type": "x", "visibility": "y"}, "its ttl_ms is str"),
        ("name", 5, "a state's name is int"),
        ("serializer", [], "its serializer is list"),
        ("lineage", {"serializer": {}}, "its lineage is dict"),
        ("schema_version", "2", "its schema_version is str"),
    ],
)
def test_a_state_entry_of_the_wrong_shape_is_corrupt_and_names_it(
    chk: Path, field: str, value: Any, match: str
) -> None:
    original = (chk / "_metadata").read_bytes()
    craft(chk, lambda m: m["operators"]["process"][0]["states"][0].update({field: value}))
    try:
        restore_fails(chk, rf"_metadata: .*{match}")
    finally:
        (chk / "_metadata").write_bytes(original)


def test_a_huge_metadata_file_is_refused_without_loading_it(
    chk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from statekit_storage import _files

    # The real limit is 256 MiB; a lower one keeps the test's memory small, the code path is the same.
    monkeypatch.setattr(_files, "MAX_METADATA_SIZE", 1 << 20)
    with open(chk / "_metadata", "r+b") as f:
        f.truncate(3 << 20)
    restore_fails(chk, "_metadata is larger than 1,048,576 bytes")


def test_truncation_anywhere_is_corrupt_and_names_the_file(chk: Path) -> None:
    for name in ("process-0.keyed", "process-1.operator", "__source__-0.operator", "_metadata"):
        f = chk / name
        data = f.read_bytes()
        for cut in (0, 1, 13, len(data) // 2, len(data) - 17, len(data) - 1):
            f.write_bytes(data[:cut])
            r = make_runner(chk.parent.parent)
            with pytest.raises(StateError) as info:
                r.restore(str(chk))
            assert name in str(info.value), (name, cut, info.value)
            assert is_untouched(r)
        f.write_bytes(data)


def test_a_narrowed_key_group_range_or_a_dropped_block_is_not_a_partial_restore(chk: Path) -> None:
    craft(chk, lambda m: m["operators"]["process"][0].update(key_group_range=[0, 40]))
    restore_fails(chk, r"subtask 0 of 2 claims key groups")
    craft(chk, lambda m: m["operators"]["process"][0].update(key_group_range=[0, 63]))
    craft(chk, lambda m: m["operators"]["process"][0]["keyed"]["offsets"].popitem())
    restore_fails(chk, "the block index disagrees with the checkpoint metadata")


def test_another_subtasks_valid_file_is_not_read_as_this_ones(chk: Path) -> None:
    def operator_file(name: str) -> Callable[[dict[str, Any]], None]:
        return lambda m: m["operators"]["process"][0]["operator"]["handle"].update(path=name)

    craft(chk, operator_file("process-1.operator"))
    restore_fails(chk, f"process-1.operator: operator 'process' subtask 0: {NOT_RECORDED}")
    craft(chk, operator_file("process-0.operator"))
    craft(chk, lambda m: keyed_handle(m).update(path="process-1.keyed"))
    craft(chk, lambda m: keyed_handle(m).pop("size"))  # else the size alone gives it away
    restore_fails(chk, rf"process-1\.keyed: the header: {NOT_RECORDED}")
    # Before digests, the CRC-32 of the operator file's entry and the block index caught them.
    craft(chk, before_digests)
    restore_fails(chk, "the block index disagrees")
    craft(chk, lambda m: keyed_handle(m).update(path="process-0.keyed"))
    craft(chk, operator_file("process-1.operator"))
    restore_fails(chk, "its CRC-32 is not the one")


# --- fuzz: restore is exact or a StateError, never anything else, never partial ------------------------


def restore_outcome(chk: Path, expected: dict[str, Any]) -> str:
    r = make_runner(chk.parent.parent)
    try:
        r.restore(str(chk))
    except StateError:
        assert is_untouched(r), "a failed restore changed the runner"
        return "refused"
    else:
        assert everything(r) == expected, "a restore succeeded with other state than was checkpointed"
        return "restored"
    finally:
        r.close()


_U32_EDGES = st.sampled_from([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF])
_EDIT = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 30), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 30)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 30), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 30), st.integers(1, 16)),
    st.tuples(st.just("u32"), st.integers(0, 1 << 30), _U32_EDGES),
)


def apply_edit(data: bytes, edit: tuple[Any, ...]) -> bytes:
    if not data:
        return data
    kind, pos = edit[0], edit[1] % len(data)
    if kind == "flip":
        return data[:pos] + bytes([data[pos] ^ edit[2]]) + data[pos + 1 :]
    if kind == "truncate":
        return data[:pos]
    if kind == "insert":
        return data[:pos] + edit[2] + data[pos:]
    if kind == "delete":
        return data[:pos] + data[pos + edit[2] :]
    return data[:pos] + struct.pack("<I", edit[2]) + data[pos + 4 :]


@FUZZ
@given(which=st.integers(0, 100), edits=st.lists(_EDIT, min_size=1, max_size=3))
def test_fuzz_mutated_bytes_restore_exactly_or_raise_state_error(
    chk: Path, written: tuple[Path, dict[str, Any]], which: int, edits: list[tuple[Any, ...]]
) -> None:
    files = sorted(p for p in chk.iterdir() if p.is_file())
    victim = files[which % len(files)]
    original = victim.read_bytes()
    damaged = original
    for edit in edits:
        damaged = apply_edit(damaged, edit)
    victim.write_bytes(damaged)
    try:
        outcome = restore_outcome(chk, written[1])
    finally:
        victim.write_bytes(original)
    event(outcome)
    assert outcome == "refused" or damaged == original


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from(
        ["../../../etc/passwd", "/etc/passwd", "s3://other/x", "process-1.keyed", "..", "inline"]
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def leaf_paths(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths to every scalar or empty container, and to every entry of an ``offsets`` map."""
    if isinstance(obj, dict) and obj:
        for k, v in obj.items():
            if path and path[-1] == "offsets":
                yield (*path, k)  # a whole key group's entry: dropping it must not go unnoticed
            yield from leaf_paths(v, (*path, k))
    elif isinstance(obj, list) and obj:
        for i, v in enumerate(obj):
            yield from leaf_paths(v, (*path, i))
    else:
        yield path


@pytest.fixture(scope="module")
def metadata_leaves(written: tuple[Path, dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(leaf_paths(unseal((written[0] / "_metadata").read_bytes())), key=repr)


@FUZZ
@given(data=st.data())
def test_fuzz_crafted_metadata_restores_exactly_or_raises_state_error(
    chk: Path,
    written: tuple[Path, dict[str, Any]],
    metadata_leaves: list[tuple[Any, ...]],
    data: st.DataObject,
) -> None:
    """A metadata field changed (or an entry dropped) with a valid checksum, as a crafter would."""
    path = data.draw(st.sampled_from(metadata_leaves), label="path")
    drop = isinstance(path[-1], str) and data.draw(st.booleans(), label="drop")
    value = None if drop else data.draw(_JSON, label="value")

    def change(meta: dict[str, Any]) -> None:
        parent = meta
        for step in path[:-1]:
            parent = parent[step]
        if drop:
            del parent[path[-1]]  # type: ignore[arg-type]
        else:
            parent[path[-1]] = value  # type: ignore[index]

    original = (chk / "_metadata").read_bytes()
    craft(chk, change)
    try:
        event(restore_outcome(chk, written[1]))
    finally:
        (chk / "_metadata").write_bytes(original)
