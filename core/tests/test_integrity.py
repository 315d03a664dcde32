"""Integrity by content: every checkpoint file is known by the SHA-256 of its bytes.

A CRC-32 over sections that each end in their own CRC is the same for every
file of one layout (the CRC residue), so each keyed, operator and native file's
entry in ``_metadata`` records a SHA-256 of its bytes, and a canonical keyed
file's entry one per header and key-group block: a restore that reads some key
groups checks exactly what it reads, and ``verify`` checks every byte.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import zlib
from pathlib import Path
from typing import Any

import pytest

from statekit import (
    CorruptCheckpointError,
    CorruptSnapshotError,
    KeyGroupRange,
    ListStateDescriptor,
    ValueStateDescriptor,
    key_group_for_bytes,
    key_group_range_for_operator,
    serializer_for,
)
from statekit.backend_api import NativeFile, OperatorStateBackendImpl, upload_native_file
from statekit.checkpoints._checkpoint import complete_checkpoint, load_checkpoint, write_subtask_state
from statekit.checkpoints._verify import CRC_ONLY, crc_only_files, verify_loaded
from statekit.snapshots._digest import (
    NOT_RECORDED,
    HashingOutput,
    check_sha256,
    file_sha256,
    parse_sha256,
    sha256_of,
)
from statekit.testing import ReferenceCheckpointStorage, ReferenceKeyedStateBackend

MAXP = 128
KEYS = serializer_for(str)
COUNT = ValueStateDescriptor("count", int)
SEEN = ListStateDescriptor("seen", str)
DIGESTS = ("sha256", "header_sha256", "block_sha256")
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

    def checkpoint(self, n: int, *, bump: int, native: bool = False) -> str:
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
            state = write_subtask_state(
                self.storage.begin_checkpoint("job", n),
                "op",
                index,
                keyed,
                operator,
                native_checkpoint_id=n if native else None,
            )
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


@pytest.fixture
def job() -> CountingJob:
    return CountingJob()


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


def test_hashing_output_hashes_what_passes_and_delegates_the_rest() -> None:
    class Stream(io.BytesIO):
        def close_and_get_handle(self) -> str:
            return "handle"

    inner = Stream()
    out = HashingOutput(inner)
    assert out.write(b"abc") == 3 and out.write(memoryview(b"def")) == 3
    assert out.sha256 == hashlib.sha256(b"abcdef").hexdigest() and out.size == 6
    assert inner.getvalue() == b"abcdef" and out.close_and_get_handle() == "handle"


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


# --- what a checkpoint records and checks -----------------------------------------------------


def test_the_metadata_records_each_files_sha256_and_each_part_a_restore_reads_alone(job: Any) -> None:
    location = job.checkpoint(1, bump=0)
    keyed, operator = job.entry(location, 0), job.entry(location, 0, "operator")
    data = job.storage._blobs[job.blob(location, 0)]
    assert keyed["sha256"] == hashlib.sha256(data).hexdigest()
    assert keyed["header_sha256"] == hashlib.sha256(data[: keyed["header_length"]]).hexdigest()
    assert set(keyed["block_sha256"]) == set(keyed["offsets"]) and keyed["offsets"]
    for kg, (off, ln) in keyed["offsets"].items():
        assert keyed["block_sha256"][kg] == hashlib.sha256(data[off : off + ln]).hexdigest()
    op_data = job.storage._blobs[job.blob(location, 0, "operator")]
    assert operator["sha256"] == hashlib.sha256(op_data).hexdigest()
    assert operator["crc32"] == zlib.crc32(op_data)  # still written, for readers before digests
    assert job.restored(location) == job.expected(0)


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
