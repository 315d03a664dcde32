"""Integrity by content: every checkpoint file is known by the SHA-256 of its bytes.

A CRC-32 over sections that each end in their own CRC is the same for every
file of one layout (the CRC residue), so each keyed, operator and native file's
entry in ``_metadata`` records a SHA-256 of its bytes, and a canonical keyed
file's entry one per header and key-group block: a restore that reads some key
groups checks exactly what it reads, and ``verify`` checks every byte.

Task-local recovery (real files in a real local-recovery directory, restores
through :class:`LocalRecoveryStorage` exactly as a Spark task restores) uses a
local copy only if its bytes have the digest the checkpoint records: every
copy that is there but is not that file (another checkpoint's, another
subtask's, deleted, changed or unreadable after it was checked) sends the
restore to the storage, is counted, and the state is exact.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import zlib
from pathlib import Path
from typing import Any

import pytest

from statekit import ListStateDescriptor, ValueStateDescriptor
from statekit.backend_api import KeyGroupRange, OperatorStateBackendImpl, key_group_for_bytes
from statekit.checkpointing import key_group_range_for_operator
from statekit.checkpoints._local_recovery import (
    Downloads,
    LocalCopies,
    LocalRecoveryStorage,
    LocalRecoveryWriter,
    digests_of,
)
from statekit.checkpoints._restore import load_checkpoint
from statekit.checkpoints._verify import CRC_ONLY, crc_only_files, verify_loaded
from statekit.checkpoints._writing import complete_checkpoint, write_subtask_state
from statekit.errors import CorruptCheckpointError, CorruptSnapshotError, UnsafeLocalPathError
from statekit.serializers import serializer_for
from statekit.snapshot_codec import NativeFile, upload_native_file
from statekit.snapshots._digest import (
    INLINE_BELOW,
    NOT_RECORDED,
    FileDigest,
    check_sha256,
    check_sha256_soon,
    fd_has_digest,
    file_sha256,
    parse_sha256,
    parts_digest,
    recorded_digest,
    sha256_of,
    sha256_soon,
)
from statekit.testing import ReferenceCheckpointStorage, ReferenceKeyedStateBackend

MAXP = 128
KEYS = serializer_for(str)
COUNT = ValueStateDescriptor("count", int)
SEEN = ListStateDescriptor("seen", str)
DIGESTS = ("sha256", "header_sha256", "block_sha256", "tail_sha256")
DATA = bytes(range(256)) * 64


def keys_of(kgr: KeyGroupRange) -> list[str]:
    keys = (f"url-{i}" for i in range(400))
    return [k for k in keys if key_group_for_bytes(KEYS.serialize(k), MAXP) in kgr]


class CountingJob:
    """Operator ``op`` of job ``job``: two subtasks counting keys (``i + bump``) and listing what they saw.

    Checkpoints go into a :class:`ReferenceCheckpointStorage` (blobs in memory,
    so a test can swap a file's bytes), through task-local recovery when given
    local copies, exactly as a Spark task writes them.
    """

    def __init__(self) -> None:
        self.storage = ReferenceCheckpointStorage()

    def checkpoint(
        self, n: int, *, bump: int, native: bool = False, copies: LocalCopies | None = None
    ) -> str:
        subtasks = []
        for index in range(2):
            kgr = key_group_range_for_operator(MAXP, 2, index)
            keyed = ReferenceKeyedStateBackend(key_serializer=KEYS, key_group_range=kgr, max_parallelism=MAXP)
            count = keyed.get_state(COUNT)
            for i, key in enumerate(keys_of(kgr)):
                keyed.set_current_key(key)
                count.update(i + bump)
            operator = OperatorStateBackendImpl()
            operator.get_list_state(SEEN).update([f"{index}-{bump}"])
            inner = self.storage.begin_checkpoint("job", n)
            local = None if copies is None else LocalRecoveryWriter(inner, copies)
            state = write_subtask_state(
                inner if local is None else local,
                "op",
                index,
                keyed,
                operator,
                native_checkpoint_id=n if native else None,
            )
            if local is not None and copies is not None:
                copies.remember(index, local.keep(state.to_json()))
            subtasks.append(state)
        return complete_checkpoint(
            self.storage.begin_checkpoint("job", n),
            job_id="job",
            checkpoint_id=n,
            max_parallelism=MAXP,
            subtasks=subtasks,
        )

    def restored(self, location: str, *, parallelism: int = 2, index: int = 0, through: Any = None) -> Any:
        """New subtask ``index`` of ``parallelism`` restored from ``location``, read ``through`` a storage."""
        cp = load_checkpoint(self.storage if through is None else through, location)
        kgr = key_group_range_for_operator(MAXP, parallelism, index)
        keyed = ReferenceKeyedStateBackend(key_serializer=KEYS, key_group_range=kgr, max_parallelism=MAXP)
        operator = OperatorStateBackendImpl()
        cp.restore_subtask("op", index, parallelism, keyed, operator)
        count = keyed.get_state(COUNT)
        out: dict[str, Any] = {}
        for key in keys_of(kgr):
            keyed.set_current_key(key)
            if count.value() is not None:
                out[key] = count.value()
        out["seen"] = sorted(operator.get_list_state(SEEN).get())
        return out

    @staticmethod
    def expected(bump: int, *, parallelism: int = 2, index: int = 0) -> dict[str, Any]:
        """What :meth:`restored` gives after a checkpoint with ``bump``."""
        out: dict[str, Any] = {}
        for old in range(2):
            kgr = key_group_range_for_operator(MAXP, 2, old)
            out.update({k: i + bump for i, k in enumerate(keys_of(kgr))})
        mine = set(keys_of(key_group_range_for_operator(MAXP, parallelism, index)))
        out = {k: v for k, v in out.items() if k in mine}
        # Operator state: the old lists [0-b], [1-b], split evenly over the new subtasks.
        seen = [f"{i}-{bump}" for i in range(2)]
        share, extra = divmod(len(seen), parallelism)
        start = index * share + min(index, extra)
        out["seen"] = sorted(seen[start : start + share + (1 if index < extra else 0)])
        return out

    def entry(self, location: str, subtask: int, part: str = "keyed") -> dict[str, Any]:
        """The metadata entry of a subtask's keyed (for a native snapshot: its file) or operator file."""
        st = load_checkpoint(self.storage, location).metadata.operators["op"][subtask]
        found: dict[str, Any] = getattr(st, part)
        if part == "keyed" and "native" in found:
            return dict(found["native"]["files"][0])
        return found

    def blob(self, location: str, subtask: int, part: str = "keyed") -> int:
        """The blob that holds that file: ``storage._blobs[n]`` are its bytes."""
        return int(self.entry(location, subtask, part)["handle"]["blob"])

    def strip_digests(self, location: str) -> None:
        """Rewrite ``location``'s metadata without any digest: as a statekit before digests wrote it."""
        meta = load_checkpoint(self.storage, location).metadata

        def drop(obj: Any) -> Any:
            if isinstance(obj, dict):
                return {k: drop(v) for k, v in obj.items() if k not in DIGESTS}
            if isinstance(obj, list):
                return [drop(v) for v in obj]
            return obj

        for sts in meta.operators.values():
            for st in sts:
                st.keyed, st.operator = drop(st.keyed), drop(st.operator)
        self.storage._metadata[location] = meta.to_bytes()

    def reading(self, copies: LocalCopies | None, location: str) -> LocalRecoveryStorage:
        """What a Spark task restores through: the checkpoint's digest of each file, and the local copies."""
        meta = load_checkpoint(self.storage, location).metadata
        digests = digests_of([st.to_json() for st in meta.operators["op"]])
        return LocalRecoveryStorage(self.storage, copies, Downloads(), digests)


def name_of(entry: dict[str, Any]) -> str:
    """The name of a file's local copy: the digest its metadata entry records."""
    digest = recorded_digest(entry)
    assert digest is not None
    return digest.name


@pytest.fixture
def job() -> CountingJob:
    return CountingJob()


@pytest.fixture
def copies(tmp_path: Path) -> LocalCopies:
    root = tmp_path / "local" / "statekit" / "local-recovery" / "job" / "op"
    return LocalCopies(str(root), base=str(tmp_path / "local"))


# --- the digest helper ------------------------------------------------------------------------


def test_sha256_helpers_agree_with_hashlib(tmp_path: Path) -> None:
    data = os.urandom(100_000)
    want = hashlib.sha256(data).hexdigest()
    assert sha256_of(data) == sha256_of(memoryview(data)) == want
    path = tmp_path / "f"
    path.write_bytes(data)
    assert file_sha256(path, chunk_size=4096) == want  # in chunks
    fd = os.open(path, os.O_RDONLY)
    try:
        os.lseek(fd, 500, os.SEEK_SET)  # a descriptor is read from its start, whatever its offset
        assert file_sha256(fd, chunk_size=777) == want
    finally:
        os.close(fd)
    (tmp_path / "empty").write_bytes(b"")
    assert file_sha256(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()


@pytest.mark.parametrize("value", [1, "", "AB" * 32, "0" * 63, "g" * 64, ["0" * 64], {"x": 1}])
def test_a_malformed_recorded_digest_is_corrupt(value: Any) -> None:
    with pytest.raises(CorruptSnapshotError, match="malformed SHA-256 of the header"):
        parse_sha256(value, "the header")
    assert parse_sha256(None, "x") is None and parse_sha256("a" * 64, "x") == "a" * 64


def test_a_mismatch_names_the_file_the_part_and_what_it_means() -> None:
    check_sha256(b"x", sha256_of(b"x"), "f")
    with pytest.raises(CorruptSnapshotError) as e:
        check_sha256(b"y", sha256_of(b"x"), "/ckpt/chk-3/process-0.keyed", "the block of key group 7")
    assert str(e.value) == f"/ckpt/chk-3/process-0.keyed: the block of key group 7: {NOT_RECORDED}"
    assert "another checkpoint's or subtask's file?" in NOT_RECORDED


@pytest.mark.parametrize("size", [0, 1, INLINE_BELOW - 1, INLINE_BELOW, 3 * INLINE_BELOW])
def test_later_digests_agree_on_either_side_of_the_inline_bound(size: int) -> None:
    """Short bytes are hashed at once, long ones on the hashing thread: the same digest, the same errors."""
    data = os.urandom(size)
    soon = sha256_soon(data)
    assert isinstance(soon, str) == (size < INLINE_BELOW)  # short: the digest itself, not a future
    assert (soon if isinstance(soon, str) else soon.result(timeout=60)) == hashlib.sha256(data).hexdigest()
    checked = check_sha256_soon(data, sha256_of(data), "f")
    assert (checked is None) == (size < INLINE_BELOW)  # short: checked before the call returns
    assert checked is None or checked.result(timeout=60) is None
    with pytest.raises(CorruptSnapshotError) as e:  # short: raised at once; long: by the future
        wrong = check_sha256_soon(data, sha256_of(data + b"x"), "/ckpt/f", "the block of key group 3")
        assert wrong is not None
        wrong.result(timeout=60)
    assert str(e.value) == f"/ckpt/f: the block of key group 3: {NOT_RECORDED}"


# --- what a checkpoint records and checks -----------------------------------------------------


def test_the_metadata_records_each_files_sha256_and_each_part_a_restore_reads_alone(job: Any) -> None:
    location = job.checkpoint(1, bump=0)
    keyed, operator = job.entry(location, 0), job.entry(location, 0, "operator")
    data = job.storage._blobs[job.blob(location, 0)]
    # A keyed file records its parts, which cover every byte once; no byte is hashed twice.
    assert "sha256" not in keyed
    assert keyed["header_sha256"] == hashlib.sha256(data[: keyed["header_length"]]).hexdigest()
    assert set(keyed["block_sha256"]) == set(keyed["offsets"]) and keyed["offsets"]
    for kg, (off, ln) in keyed["offsets"].items():
        assert keyed["block_sha256"][kg] == hashlib.sha256(data[off : off + ln]).hexdigest()
    end = max(off + ln for off, ln in keyed["offsets"].values())
    assert keyed["tail_sha256"] == hashlib.sha256(data[end:]).hexdigest() and keyed["size"] == len(data)
    digest = recorded_digest(keyed)
    assert digest is not None and digest.size == len(data)
    assert b"".join(data[off : off + ln] for off, ln, _ in digest.parts) == data
    assert digest.name == parts_digest(len(data), digest.parts)
    op_data = job.storage._blobs[job.blob(location, 0, "operator")]
    assert operator["sha256"] == hashlib.sha256(op_data).hexdigest()
    assert operator["crc32"] == zlib.crc32(op_data)  # still written, for readers before digests
    assert job.restored(location) == job.expected(0)


def test_parts_that_do_not_tile_the_file_are_refused() -> None:
    good = {
        "size": 30,
        "header_length": 10,
        "offsets": {"3": [10, 15]},
        "header_sha256": "a" * 64,
        "block_sha256": {"3": "b" * 64},
        "tail_sha256": "c" * 64,
    }
    digest = recorded_digest(good)
    assert digest is not None and digest.parts == ((0, 10, "a" * 64), (10, 15, "b" * 64), (25, 5, "c" * 64))
    for change, why in (
        ({"offsets": {"3": [11, 14]}}, "do not cover it exactly once"),  # a gap
        ({"offsets": {"3": [9, 15]}}, "do not cover it exactly once"),  # an overlap
        ({"size": 20}, "do not cover it exactly once"),  # the tail would end before the last block
        ({"block_sha256": {}}, "incomplete or malformed"),
        ({"header_sha256": None}, "incomplete or malformed"),
        ({"offsets": {"3": "x"}}, "incomplete or malformed"),
    ):
        with pytest.raises(CorruptSnapshotError, match=why):
            recorded_digest({**good, **change}, "op-0.keyed")
    # Another layout of the same bytes is another digest; a whole-file SHA-256 wins where recorded.
    other = {**good, "offsets": {"3": [10, 14]}, "tail_sha256": "c" * 64}
    assert recorded_digest(other) != digest
    assert recorded_digest({**good, "sha256": "d" * 64}) == FileDigest("d" * 64)


def test_a_local_file_is_checked_against_its_parts_in_one_pass(tmp_path: Path) -> None:
    data = os.urandom(5000)
    parts = (
        (0, 100, sha256_of(data[:100])),
        (100, 4000, sha256_of(data[100:4100])),
        (4100, 900, sha256_of(data[4100:])),
    )
    digest = FileDigest(parts_digest(len(data), parts), len(data), parts)
    path = tmp_path / "f"
    flipped = data[:4200] + bytes([data[4200] ^ 0xFF]) + data[4201:]  # a byte that surely differs
    for content, matches in ((data, True), (data[:-1], False), (flipped, False)):
        path.write_bytes(content)
        fd = os.open(path, os.O_RDONLY)
        try:
            assert fd_has_digest(fd, digest, chunk_size=333) is matches
        finally:
            os.close(fd)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert fd_has_digest(fd, FileDigest(sha256_of(data))) and not fd_has_digest(fd, FileDigest("0" * 64))
    finally:
        os.close(fd)


def test_a_keyed_file_of_an_earlier_build_is_checked_by_its_whole_sha256(
    job: Any, copies: LocalCopies
) -> None:
    """Keyed files of earlier 0.1 builds record the SHA-256 of the whole file and no tail_sha256."""
    location = job.checkpoint(1, bump=6, copies=copies)
    meta = load_checkpoint(job.storage, location).metadata
    for st in meta.operators["op"]:
        assert st.keyed is not None
        data = job.storage._blobs[int(st.keyed["handle"]["blob"])]
        st.keyed = {k: v for k, v in st.keyed.items() if k != "tail_sha256"} | {"sha256": sha256_of(data)}
        Path(copies.path_of(sha256_of(data))).write_bytes(data)  # its copy, as that build named it
    job.storage._metadata[location] = meta.to_bytes()
    cp = load_checkpoint(job.storage, location)
    assert verify_loaded(cp, deep=True) == [] and crc_only_files(cp) == []
    through = job.reading(copies, location)
    assert job.restored(location, through=through) == job.expected(6)
    assert through.downloads.remote_files == 0 and through.downloads.rejected == 0
    blob = job.blob(location, 1)
    data = bytearray(job.storage._blobs[blob])
    data[-1] ^= 1  # the trailer: only the whole file's digest covers it
    job.storage._blobs[blob] = bytes(data)
    (problem,) = verify_loaded(load_checkpoint(job.storage, location), deep=True)
    assert problem.file == "op-1.keyed" and problem.problem.endswith(NOT_RECORDED)


def test_a_changed_index_is_found_by_its_digest(job: Any, copies: LocalCopies) -> None:
    """The index and trailer have a digest of their own: verify and a local copy's check both see it."""
    location = job.checkpoint(1, bump=1, copies=copies)
    entry = job.entry(location, 0)
    blob = job.blob(location, 0)
    end = max(off + ln for off, ln in entry["offsets"].values())
    data = bytearray(job.storage._blobs[blob])
    data[end + 1] ^= 1  # a byte of the index (the restore compares it with the metadata, too)
    copy = Path(copies.path_of(name_of(entry)))
    copy.write_bytes(bytes(data))
    through = job.reading(copies, location)
    assert job.restored(location, through=through) == job.expected(1)
    assert through.downloads.rejected == 1 and not copy.exists()
    job.storage._blobs[blob] = bytes(data)
    (problem,) = verify_loaded(load_checkpoint(job.storage, location), deep=True)
    assert problem.problem == f"the index and trailer: {NOT_RECORDED}" or problem.problem.endswith(
        f"the index and trailer: {NOT_RECORDED}"
    )


def test_the_crc_residue_gives_every_keyed_file_of_one_layout_one_crc_but_not_one_digest(job: Any) -> None:
    """Why a CRC cannot tell files apart (DESIGN.md §16), and the digest can."""
    a = job.storage._blobs[job.blob(job.checkpoint(1, bump=0), 0)]
    b = job.storage._blobs[job.blob(job.checkpoint(2, bump=5), 0)]
    assert a != b and zlib.crc32(a) == zlib.crc32(b)
    assert sha256_of(a) != sha256_of(b)


def test_a_file_swapped_in_from_another_checkpoint_is_refused_naming_it(job: Any) -> None:
    old, new = job.checkpoint(1, bump=0), job.checkpoint(2, bump=9)
    blobs = job.storage._blobs
    for part in ("keyed", "operator"):
        target = job.blob(new, 0, part)
        saved = blobs[target]
        blobs[target] = blobs[job.blob(old, 0, part)]  # a valid file of chk-1
        with pytest.raises(CorruptCheckpointError) as e:
            job.restored(new)
        assert str(e.value).startswith(f"checkpoint {new}: op-0.{part}: ") and NOT_RECORDED in str(e.value)
        (problem,) = verify_loaded(load_checkpoint(job.storage, new), deep=True)
        assert problem.file == f"op-0.{part}" and problem.problem.endswith(NOT_RECORDED)
        blobs[target] = saved
    assert job.restored(new) == job.expected(9)
    assert verify_loaded(load_checkpoint(job.storage, new), deep=True) == []


def test_another_subtasks_file_is_refused(job: Any) -> None:
    location = job.checkpoint(1, bump=0)
    job.storage._blobs[job.blob(location, 0)] = job.storage._blobs[job.blob(location, 1)]
    with pytest.raises(CorruptCheckpointError, match=f"op-0.keyed: the header: {re.escape(NOT_RECORDED)}"):
        job.restored(location)


def test_a_rescaled_restore_checks_exactly_the_blocks_it_reads(job: Any) -> None:
    """Subtask 0 of 4 reads half of old subtask 0's file: a damaged block in the other half is not its own."""
    location = job.checkpoint(1, bump=0)
    keyed = job.entry(location, 0)
    mine = key_group_range_for_operator(MAXP, 4, 0)
    theirs = max(int(kg) for kg in keyed["offsets"] if int(kg) not in mine)
    off, ln = keyed["offsets"][str(theirs)]
    data = bytearray(job.storage._blobs[job.blob(location, 0)])
    data[off + ln // 2] ^= 0xFF
    job.storage._blobs[job.blob(location, 0)] = bytes(data)
    assert job.restored(location, parallelism=4, index=0) == job.expected(0, parallelism=4, index=0)
    damaged = f"the block of key group {theirs}: {re.escape(NOT_RECORDED)}"
    with pytest.raises(CorruptCheckpointError, match=damaged):
        job.restored(location, parallelism=4, index=1)


@pytest.mark.parametrize("native", [False, True], ids=["canonical", "native"])
def test_a_checkpoint_without_digests_restores_and_verify_says_crc_only(job: Any, native: bool) -> None:
    location = job.checkpoint(1, bump=3, native=native)
    assert crc_only_files(load_checkpoint(job.storage, location)) == []
    job.strip_digests(location)
    cp = load_checkpoint(job.storage, location)
    assert b"sha256" not in cp.metadata.to_bytes()
    assert job.restored(location) == job.expected(3)
    assert verify_loaded(cp, deep=True) == []
    # Two keyed (or native) files and two operator files, checked by their CRC-32s.
    assert crc_only_files(cp) == ["op-0.keyed", "op-0.operator", "op-1.keyed", "op-1.operator"] or native
    assert len(crc_only_files(cp)) == 4
    assert CRC_ONLY == "CRC only (written by a statekit before digests)"
    # Damage is still found, by the CRC-32s.
    blob = job.blob(location, 1, "operator")
    data = bytearray(job.storage._blobs[blob])
    data[len(data) // 2] ^= 1
    job.storage._blobs[blob] = bytes(data)
    (problem,) = verify_loaded(cp, deep=True)
    assert "CRC-32" in problem.problem


def test_native_files_carry_their_digest_and_are_checked_by_it(job: Any) -> None:
    location = job.checkpoint(1, bump=2, native=True)
    entry = job.entry(location, 0)
    data = job.storage._blobs[job.blob(location, 0)]
    assert entry["sha256"] == hashlib.sha256(data).hexdigest() and entry["crc32"] == zlib.crc32(data)
    assert job.restored(location) == job.expected(2)
    other = job.checkpoint(2, bump=7, native=True)
    job.storage._blobs[job.blob(location, 0)] = job.storage._blobs[job.blob(other, 0)]
    with pytest.raises(CorruptCheckpointError, match=f"native file .*: {re.escape(NOT_RECORDED)}"):
        job.restored(location)


def test_bytes_checked_by_their_digest_are_parsed_in_place_without_the_blocks_crcs(job: Any) -> None:
    """A block of bytes vouched for by a digest over all of them is not CRC-checked again; others are.

    The heap's native restore reads each file whole and checks its SHA-256
    first; its blocks are then parsed where they lie. Every column is still
    ``bytes`` of its own (nothing keeps a view of the file).
    """
    from statekit.snapshots._snapshot import BytesStreamHandle, read_block, read_header, read_index

    location = job.checkpoint(1, bump=2, native=False)
    data = bytearray(job.storage._blobs[job.blob(location, 0)])
    header, _ = read_header(BytesStreamHandle(bytes(data), "f"))
    names = [st["name"] for st in header.states]
    kg, (off, ln) = min(read_index(BytesStreamHandle(bytes(data), "f")).items())
    want = read_block(BytesStreamHandle(bytes(data), "f"), kg, off, ln, names)
    data[off + ln - 1] ^= 0xFF  # the block's recorded CRC-32, not its sections
    with pytest.raises(CorruptSnapshotError, match=f"f: checksum mismatch in the block of key group {kg}"):
        read_block(BytesStreamHandle(bytes(data), "f"), kg, off, ln, names)
    got = read_block(BytesStreamHandle(bytes(data), "f", digest_checked=True), kg, off, ln, names)
    assert got == want and got
    assert all(type(c) is bytes for s in got for c in (s.keys, s.namespaces, s.values))
    short = BytesStreamHandle(bytes(data[: off + ln - 1]), "f", digest_checked=True)
    with pytest.raises(CorruptSnapshotError, match="outside its"):
        read_block(short, kg, off, ln, names)


def test_native_file_entries_round_trip_with_and_without_a_digest(tmp_path: Path) -> None:
    storage = ReferenceCheckpointStorage()
    writer = storage.begin_checkpoint("job", 1)
    src = tmp_path / "000001.sst"
    src.write_bytes(os.urandom(10_000))
    f = upload_native_file(
        lambda n, s: writer.create_stream(n, shared=s),
        "x",
        "000001.sst",
        str(src),
        shared=True,
        checkpoint_id=1,
    )
    assert f.sha256 == hashlib.sha256(src.read_bytes()).hexdigest()
    resolve = lambda d: storage.resolve_handle("loc", d)  # noqa: E731
    again = NativeFile.from_json(f.to_json(), resolve)
    assert again.sha256 == f.sha256 and again.read() == src.read_bytes()
    old = {k: v for k, v in f.to_json().items() if k != "sha256"}  # an entry of a statekit before digests
    before = NativeFile.from_json(old, resolve)
    assert before.sha256 is None and before.to_json() == old and before.read() == src.read_bytes()
    with pytest.raises(CorruptSnapshotError, match="malformed SHA-256"):
        NativeFile.from_json({**f.to_json(), "sha256": "not hex"}, resolve)
    wrong = NativeFile.from_json({**f.to_json(), "sha256": sha256_of(b"other")}, resolve)
    with pytest.raises(CorruptSnapshotError, match=re.escape(NOT_RECORDED)):
        wrong.copy_to(tmp_path / "copy.sst")
    assert not (tmp_path / "copy.sst").exists()
    with pytest.raises(CorruptSnapshotError, match=f"native file 000001.sst: {re.escape(NOT_RECORDED)}"):
        wrong.read()  # read whole in one request, checked before it is returned
    longer = NativeFile.from_json({**f.to_json(), "size": 10_001}, resolve)
    with pytest.raises(CorruptSnapshotError, match="has 10000 bytes, the checkpoint says 10001"):
        longer.read()


# --- local copies: named by content, read only when their bytes are the recorded ones ---------


@pytest.mark.parametrize("native", [False, True], ids=["canonical", "native"])
def test_a_written_checkpoint_restores_from_its_local_copies(
    job: Any, copies: LocalCopies, native: bool
) -> None:
    location = job.checkpoint(1, bump=4, native=native, copies=copies)
    names = set(copies.index())
    for index in range(2):
        for part in ("keyed", "operator"):
            data = job.storage._blobs[job.blob(location, index, part)]
            digest = name_of(job.entry(location, index, part))
            assert digest in names
            assert Path(copies.path_of(digest)).read_bytes() == data
    through = job.reading(copies, location)
    assert job.restored(location, through=through) == job.expected(4)
    d = through.downloads
    assert (d.remote_files, d.remote_bytes, d.rejected) == (0, 0, 0) and d.local_files >= 2 and d.local_bytes
    assert through.used and set(through.used) <= names


@pytest.mark.parametrize("native", [False, True], ids=["canonical", "native"])
def test_a_copy_swapped_in_from_another_checkpoint_is_rejected_and_the_storage_read(
    job: Any, copies: LocalCopies, native: bool
) -> None:
    """The finding of issue #32: chk-3's bytes over chk-4's copy, under chk-4's name."""
    old = job.checkpoint(3, bump=0, native=native, copies=copies)
    new = job.checkpoint(4, bump=10, native=native, copies=copies)
    victim = Path(copies.path_of(name_of(job.entry(new, 0))))
    victim.write_bytes(Path(copies.path_of(name_of(job.entry(old, 0)))).read_bytes())
    through = job.reading(copies, new)
    assert job.restored(new, through=through) == job.expected(10)
    d = through.downloads
    assert d.rejected == 1 and d.remote_files == 1 and d.remote_bytes > 0
    (reason,) = d.reasons
    assert reason.startswith("op-0") and "bytes are not the ones the checkpoint records" in reason
    assert reason.endswith("read from the checkpoint storage instead")
    assert not victim.exists()  # a copy found bad is deleted
    again = job.reading(copies, new)
    assert job.restored(new, through=again) == job.expected(10) and again.downloads.rejected == 0


def test_another_subtasks_bytes_under_the_right_name_are_rejected(job: Any, copies: LocalCopies) -> None:
    location = job.checkpoint(1, bump=2, copies=copies)
    theirs = Path(copies.path_of(name_of(job.entry(location, 1)))).read_bytes()
    Path(copies.path_of(name_of(job.entry(location, 0)))).write_bytes(theirs)
    through = job.reading(copies, location)
    assert job.restored(location, through=through) == job.expected(2)
    assert through.downloads.rejected == 1


class _Vanishing(LocalCopies):
    """Copies that lose the file right after it was checked, before any of it is read."""

    def check(self, digest: FileDigest) -> Any:
        found = super().check(digest)
        if found is not None:
            os.unlink(found.path)
        return found


@pytest.mark.parametrize("native", [False, True], ids=["canonical", "native"])
def test_a_copy_deleted_after_it_was_checked_sends_the_read_to_the_storage(
    job: Any, tmp_path: Path, native: bool
) -> None:
    root = str(tmp_path / "lr" / "job" / "op")
    location = job.checkpoint(1, bump=6, native=native, copies=LocalCopies(root))
    through = job.reading(_Vanishing(root), location)
    assert job.restored(location, through=through) == job.expected(6)
    d = through.downloads
    assert d.rejected >= 1 and all("deleted after it was checked" in r for r in d.reasons), d.reasons


def test_a_copy_that_cannot_be_read_sends_the_read_to_the_storage(
    job: Any, copies: LocalCopies, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error of the local disk (EIO, injected into reads after the check) is not the checkpoint's."""
    location = job.checkpoint(1, bump=1, copies=copies)
    real_pread = os.pread
    local = {os.stat(p).st_ino for p in copies.index().values()}

    def failing(fd: int, n: int, offset: int) -> bytes:
        if n < (4 << 20) and os.fstat(fd).st_ino in local:  # a range read, not the check's whole pass
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", failing)
    through = job.reading(copies, location)
    assert job.restored(location, through=through) == job.expected(1)
    d = through.downloads
    assert d.rejected >= 1 and all("cannot be read (Input/output error)" in r for r in d.reasons), d.reasons


def test_a_copy_changed_after_it_was_checked_is_not_read(job: Any, copies: LocalCopies) -> None:
    location = job.checkpoint(1, bump=3, copies=copies)
    through = job.reading(copies, location)
    desc = job.entry(location, 0)["handle"]
    handle = through.resolve_handle(location, desc)  # checked now
    path = copies.path_of(name_of(job.entry(location, 0)))
    with open(path, "r+b") as f:  # rewritten in place: the same inode, another modification time
        f.seek(30)
        f.write(b"\xff" * 8)
    os.utime(path, ns=(0, os.stat(path).st_mtime_ns + 1_000_000))
    assert handle.read(0, 64) == job.storage._blobs[int(desc["blob"])][:64]
    d = through.downloads
    assert d.rejected == 1 and "replaced or changed after it was checked" in d.reasons[0]


def test_files_of_a_checkpoint_before_digests_are_read_from_the_storage(
    job: Any, copies: LocalCopies
) -> None:
    location = job.checkpoint(1, bump=5, copies=copies)
    job.strip_digests(location)  # as a statekit before digests wrote it: copies cannot be checked
    through = job.reading(copies, location)
    assert job.restored(location, through=through) == job.expected(5)
    assert through.downloads.local_files == 0 and through.downloads.rejected == 0


def test_a_restore_from_local_copies_hashes_each_byte_once(
    job: Any, copies: LocalCopies, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy's check is the one pass: the parts a restore then reads from it are not hashed again."""
    from statekit.checkpoints import _restore
    from statekit.snapshots import _snapshot

    location = job.checkpoint(1, bump=0, copies=copies)
    checks: list[int] = []

    def counted(real: Any) -> Any:
        def check(data: bytes, *args: Any) -> Any:
            checks.append(len(data))
            return real(data, *args)

        return check

    for module, name in (
        (_snapshot, "check_sha256"),
        (_snapshot, "check_sha256_soon"),
        (_restore, "sha256_of"),
    ):
        monkeypatch.setattr(module, name, counted(getattr(module, name)))
    through = job.reading(copies, location)
    assert job.restored(location, through=through) == job.expected(0)
    assert through.downloads.remote_files == 0 and checks == []
    # Read from the storage, every part is checked as it is read.
    assert job.restored(location, through=job.reading(None, location)) == job.expected(0)
    keyed = job.entry(location, 0)
    assert len(checks) == 1 + len(keyed["offsets"]) + 2  # the header, each block, two operator files


def test_each_copy_is_hashed_once_per_restore(
    job: Any, copies: LocalCopies, monkeypatch: pytest.MonkeyPatch
) -> None:
    location = job.checkpoint(1, bump=0, copies=copies)
    checked: list[str] = []
    original = LocalCopies.check

    def counting(self: LocalCopies, digest: FileDigest) -> Any:
        checked.append(digest.name)
        return original(self, digest)

    monkeypatch.setattr(LocalCopies, "check", counting)
    through = job.reading(copies, location)
    # Rescaled to 3, subtask 1 reads both old keyed files; the restores share one reading storage.
    for index in range(3):
        assert job.restored(location, parallelism=3, index=index, through=through) == job.expected(
            0, parallelism=3, index=index
        )
    assert len(checked) == len(set(checked)) == 4 and through.downloads.remote_files == 0


# --- native files: linked when checked, downloaded and kept when not ---------------------------------


def _uploaded(copies: LocalCopies, storage: ReferenceCheckpointStorage, src: Path) -> NativeFile:
    writer = LocalRecoveryWriter(storage.begin_checkpoint("job", 1), copies)
    f = upload_native_file(
        lambda n, s: writer.create_stream(n, shared=s), "s/000012.sst", "000012.sst", str(src),
        shared=True, checkpoint_id=1,
    )  # fmt: skip
    writer.keep(f.to_json())
    return f


def _restored_file(f: NativeFile, through: LocalRecoveryStorage) -> NativeFile:
    return NativeFile.from_json(f.to_json(), lambda d: through.resolve_handle("loc", d))


def test_native_files_are_linked_from_checked_copies_and_kept_when_downloaded(
    tmp_path: Path, copies: LocalCopies
) -> None:
    storage = ReferenceCheckpointStorage()
    sst = tmp_path / "000012.sst"
    sst.write_bytes(DATA)
    f = _uploaded(copies, storage, sst)
    assert f.sha256 is not None
    assert os.stat(copies.path_of(f.sha256)).st_ino == os.stat(sst).st_ino  # linked, not copied
    through = LocalRecoveryStorage(storage, copies, Downloads(), digests_of(f.to_json()))
    _restored_file(f, through).copy_to(tmp_path / "linked.sst", link=True)
    assert os.stat(tmp_path / "linked.sst").st_ino == os.stat(sst).st_ino
    assert through.downloads.remote_bytes == 0 and through.downloads.local_bytes == len(DATA)

    # Downloaded where there is no copy: checked by its digest, then kept for the next restore here.
    elsewhere = LocalCopies(str(tmp_path / "elsewhere" / "job" / "op"))
    through = LocalRecoveryStorage(storage, elsewhere, Downloads(), digests_of(f.to_json()))
    _restored_file(f, through).copy_to(tmp_path / "fetched.sst", link=True)
    assert through.downloads.remote_bytes == len(DATA)
    assert list(elsewhere.index()) == [f.sha256] and through.used == [f.sha256]
    # A file the engine writes into (link=False) is copied and never kept.
    third = LocalCopies(str(tmp_path / "third" / "job" / "op"))
    through = LocalRecoveryStorage(storage, third, Downloads(), digests_of(f.to_json()))
    _restored_file(f, through).copy_to(tmp_path / "data.mdb")
    assert third.index() == {}


def test_a_native_file_read_from_a_checked_copy_is_not_hashed_again(
    tmp_path: Path, copies: LocalCopies, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine file read (not linked) from its local copy: the copy's check is the one pass."""
    from statekit.snapshots import _native

    storage = ReferenceCheckpointStorage()
    src = tmp_path / "data.mdb"
    src.write_bytes(DATA)
    f = _uploaded(copies, storage, src)
    hashed: list[int] = []
    real = _native.new_sha256

    class Counting:
        def __init__(self) -> None:
            self._h = real()

        def update(self, data: bytes) -> None:
            hashed.append(len(data))
            self._h.update(data)

        def hexdigest(self) -> str:
            return str(self._h.hexdigest())

    monkeypatch.setattr(_native, "new_sha256", Counting)
    through = LocalRecoveryStorage(storage, copies, Downloads(), digests_of(f.to_json()))
    assert b"".join(_restored_file(f, through).chunks(chunk_size=1000)) == DATA
    assert hashed == [] and through.downloads.local_bytes == len(DATA) and through.downloads.remote_bytes == 0
    assert _restored_file(f, through).read() == DATA  # whole, from the copy
    assert (
        hashed == []
        and through.downloads.local_bytes == 2 * len(DATA)
        and through.downloads.remote_bytes == 0
    )
    # From the storage, every byte is hashed as it is read.
    assert _restored_file(f, LocalRecoveryStorage(storage, None, Downloads())).read() == DATA
    assert sum(hashed) == len(DATA)


class _GoneAfterOneRead(LocalCopies):
    """Copies whose file is replaced by other bytes after the first read of it."""

    reads = 0

    def read(self, copy: Any, offset: int, length: int | None) -> bytes:
        data = super().read(copy, offset, length)
        self.reads += 1
        if self.reads == 1:
            os.unlink(copy.path)
            Path(copy.path).write_bytes(b"x" * copy.size)  # another inode: never read
        return data


@pytest.mark.parametrize("storage_damaged", [False, True], ids=["storage-sound", "storage-damaged"])
def test_a_native_copy_rejected_part_way_is_finished_from_the_storage_and_checked_whole(
    tmp_path: Path, storage_damaged: bool
) -> None:
    root = tmp_path / "local" / "statekit" / "local-recovery" / "job" / "op"
    copies = _GoneAfterOneRead(str(root), base=str(tmp_path / "local"))
    storage = ReferenceCheckpointStorage()
    src = tmp_path / "data.mdb"
    src.write_bytes(DATA)
    f = _uploaded(copies, storage, src)
    if (
        storage_damaged
    ):  # its first bytes, which the copy gave sound: the storage's file is not the recorded one
        blob = int(f.to_json()["handle"]["blob"])
        storage._blobs[blob] = bytes([storage._blobs[blob][0] ^ 1]) + storage._blobs[blob][1:]
    through = LocalRecoveryStorage(storage, copies, Downloads(), digests_of(f.to_json()))
    restored = _restored_file(f, through)
    if storage_damaged:
        with pytest.raises(CorruptSnapshotError, match=re.escape(NOT_RECORDED)):
            b"".join(restored.chunks(chunk_size=1000))
        return
    assert b"".join(restored.chunks(chunk_size=1000)) == DATA
    d = through.downloads
    # The copy gave the first 1,000 bytes; the storage gives them again (to hash them) and the rest.
    assert d.rejected == 1 and d.local_bytes == 1000 and d.remote_bytes == len(DATA)
    (reason,) = d.reasons
    assert "replaced or changed after it was checked" in reason


@pytest.mark.parametrize("how", ["linked", "read whole"])
def test_a_native_copy_deleted_after_it_was_checked_comes_from_the_storage(tmp_path: Path, how: str) -> None:
    storage = ReferenceCheckpointStorage()
    root = str(tmp_path / "lr" / "job" / "op")
    sst = tmp_path / "000012.sst"
    sst.write_bytes(DATA)
    f = _uploaded(LocalCopies(root), storage, sst)
    through = LocalRecoveryStorage(storage, _Vanishing(root), Downloads(), digests_of(f.to_json()))
    if how == "linked":
        _restored_file(f, through).copy_to(tmp_path / "restored.sst", link=True)
        assert (tmp_path / "restored.sst").read_bytes() == DATA
    else:
        assert _restored_file(f, through).read() == DATA
    assert through.downloads.rejected == 1 and through.downloads.remote_bytes == len(DATA)
    assert through.downloads.local_bytes == 0


def test_a_source_changed_after_its_upload_is_never_used(tmp_path: Path, copies: LocalCopies) -> None:
    storage = ReferenceCheckpointStorage()
    src = tmp_path / "file.sst"
    src.write_bytes(DATA)
    f = _uploaded(copies, storage, src)
    with open(src, "r+b") as changed:  # the same inode: the kept link sees the change
        changed.write(b"\0" * 16)
    through = LocalRecoveryStorage(storage, copies, Downloads(), digests_of(f.to_json()))
    assert _restored_file(f, through).read() == DATA
    assert through.downloads.remote_bytes == len(DATA) and through.downloads.rejected == 1
    assert copies.index() == {}


def test_a_description_recorded_with_two_digests_uses_no_copy() -> None:
    handle = {"type": "file", "path": "a"}
    assert digests_of([{"handle": handle, "sha256": "a" * 64}, {"handle": handle, "sha256": "b" * 64}]) == {}
    assert digests_of({"handle": handle, "sha256": "oops"}) == {}
    assert list(digests_of({"x": [{"handle": handle, "sha256": "c" * 64}]}).values()) == [
        FileDigest("c" * 64)
    ]
    assert digests_of({"handle": {"type": "inline", "data": ""}, "sha256": "c" * 64}) == {}


# --- bounded: each subtask keeps its last two snapshots ----------------------------------------------


def test_each_subtask_keeps_its_last_two_snapshots_and_collect_frees_the_rest(
    job: Any, tmp_path: Path
) -> None:
    root = str(tmp_path / "lr" / "job" / "op")
    young = LocalCopies(root)
    job.checkpoint(99, bump=99, copies=young)
    for name in os.listdir(root):
        if name.startswith("subtask-"):
            os.unlink(os.path.join(root, name))  # no manifest keeps them...
    assert young.collect() == 0  # ...but another process may be about to write its manifest
    copies = LocalCopies(root, grace_seconds=0)
    kept = []
    for n in range(1, 5):
        location = job.checkpoint(n, bump=n, copies=copies)
        kept.append({name_of(job.entry(location, i, p)) for i in range(2) for p in ("keyed", "operator")})
        copies.collect()
    assert set(copies.index()) == kept[-1] | kept[-2]
    before = os.path.join(root, "files", "0" * 40 + ".1234abcd")  # a copy of a statekit before digests
    with open(before, "wb") as f:
        f.write(b"old")
    assert copies.collect() == 3 and set(copies.index()) == kept[-1] | kept[-2]
    assert not os.path.exists(before)


# --- confinement ---------------------------------------------------------------------------------------


def test_directories_are_0700_and_copies_and_manifests_0600(
    job: Any, copies: LocalCopies, tmp_path: Path
) -> None:
    old = os.umask(0)  # a permissive umask changes nothing
    try:
        job.checkpoint(1, bump=0, copies=copies)
    finally:
        os.umask(old)
    top = tmp_path / "local"
    for d in [p for p in top.rglob("*") if p.is_dir()]:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    files = [p for p in top.rglob("*") if p.is_file()]
    assert sum(p.name.startswith("subtask-") for p in files) == 2 and len(files) == 6
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


def test_a_planted_symlink_or_a_writable_directory_is_refused_and_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    (target / "keep").write_text("x")
    root = tmp_path / "local" / "statekit" / "local-recovery" / "job" / "op"
    root.mkdir(parents=True)
    (root / "files").symlink_to(target)
    with pytest.raises(UnsafeLocalPathError, match=re.escape(f"{root / 'files'} is a symlink")):
        LocalCopies(str(root), base=str(tmp_path / "local"))
    assert os.listdir(target) == ["keep"]
    (root / "files").unlink()
    os.chmod(root.parent, 0o777)
    with pytest.raises(UnsafeLocalPathError, match="can be written by its group or by others"):
        LocalCopies(str(root), base=str(tmp_path / "local"))
    assert not (root / "files").exists()


def test_a_restore_never_reads_a_symlink_planted_as_a_copy(
    job: Any, copies: LocalCopies, tmp_path: Path
) -> None:
    location = job.checkpoint(1, bump=8, copies=copies)
    path = copies.path_of(name_of(job.entry(location, 0)))
    elsewhere = tmp_path / "elsewhere"
    os.replace(path, elsewhere)
    os.symlink(elsewhere, path)  # the right bytes, through a link: still not a copy statekit made
    through = job.reading(copies, location)
    assert job.restored(location, through=through) == job.expected(8)
    assert through.downloads.rejected == 1 and "cannot be opened" in through.downloads.reasons[0]


def test_a_copy_checked_before_is_not_hashed_again_until_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy is immutable: one this process hashed and that is still the same file is trusted."""
    from statekit.checkpoints import _local_recovery

    copies = LocalCopies(str(tmp_path / "local" / "job" / "op"), base=str(tmp_path / "local"))
    data = os.urandom(3000)
    digest = FileDigest(sha256_of(data))
    path = copies.path_of(digest.name)
    Path(path).write_bytes(data)
    hashed: list[int] = []
    real = _local_recovery.fd_has_digest
    monkeypatch.setattr(_local_recovery, "fd_has_digest", lambda fd, d: hashed.append(1) or real(fd, d))
    old = os.stat(path).st_mtime_ns - 10_000_000_000
    os.utime(path, ns=(old, old))  # written long before it is hashed
    assert copies.check(digest) is not None and copies.check(digest) is not None
    assert len(hashed) == 1
    with open(path, "r+b") as f:  # rewritten in place: the same inode, another modification time
        f.write(b"\x00" * 8)
    with pytest.raises(_local_recovery._Rejected, match="not the ones the checkpoint records"):
        copies.check(digest)
    assert len(hashed) == 2
    Path(path).write_bytes(data)  # fresh: its mtime is now, so it is hashed each time until it ages
    assert copies.check(digest) is not None and copies.check(digest) is not None
    assert len(hashed) == 4
