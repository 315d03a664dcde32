"""Corrupt checkpoints are detected and never half-restored; retention; state size limits."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import pytest

from jobs import CountUrls, count_urls_runner, make_records
from statekit import LocalRunner, RecordSource, ValueStateDescriptor
from statekit.backend_api import KeyGroupRange
from statekit.checkpointing import SubtaskState, apply_retention, complete_checkpoint
from statekit.errors import CorruptSnapshotError, StateError, StateSizeLimitError
from statekit.serializers import StrSerializer
from statekit_heap import HeapKeyedStateBackend
from statekit_storage import FileSystemCheckpointStorage

RECORDS = make_records(2000, urls=60, seed=3)


def make_runner(ckpt: Path, **conf: Any) -> LocalRunner:
    # Canonical keyed files, one per subtask and checkpoint: what these tests damage. Heap's own
    # (delta) checkpoints are damaged in test_checkpoint_lifecycle and test_swapped_files.
    return count_urls_runner(str(ckpt), {"statekit.checkpoint.format": "canonical", **conf})


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ckpt = tmp_path_factory.mktemp("corrupt") / "ckpt"
    r = make_runner(ckpt)
    r.run(RecordSource(RECORDS))
    return Path(r.checkpoint())


def files_of(chk: Path) -> list[Path]:
    files = sorted(p for p in chk.iterdir() if p.is_file())
    assert {p.name for p in files} >= {
        "_metadata",
        "process-0.keyed",
        "process-1.keyed",
        "process-0.operator",
    }
    return files


def positions(size: int, rng: random.Random) -> list[int]:
    edges = [*range(min(12, size)), *range(max(0, size - 12), size)]
    return sorted({*edges, *rng.sample(range(size), min(20, size))})


def test_a_flipped_byte_anywhere_is_detected_and_nothing_is_restored(checkpoint: Path) -> None:
    rng = random.Random(1)
    good = make_runner(checkpoint.parent.parent)
    assert good.restore(str(checkpoint)) == str(checkpoint)  # the untouched checkpoint restores
    tried = 0
    for path in files_of(checkpoint):
        original = path.read_bytes()
        for pos in positions(len(original), rng):
            damaged = bytearray(original)
            damaged[pos] ^= 0xFF
            path.write_bytes(bytes(damaged))
            r = make_runner(checkpoint.parent.parent)
            with pytest.raises(StateError) as info:
                r.restore(str(checkpoint))
            assert path.name in str(info.value), f"{path.name}@{pos}: {info.value}"
            # Nothing half-restored: the runner still has no state and no source position.
            assert r.position is None
            assert all(ctx.keyed_backend.num_entries() == 0 for ctx in r.subtasks)
            tried += 1
        path.write_bytes(original)
    assert tried > 100


def test_a_missing_state_file_is_named(checkpoint: Path, tmp_path: Path) -> None:
    victim = checkpoint / "process-1.keyed"
    data = victim.read_bytes()
    victim.unlink()
    try:
        with pytest.raises(StateError, match="process-1.keyed"):
            make_runner(checkpoint.parent.parent).restore(str(checkpoint))
    finally:
        victim.write_bytes(data)


def test_retention_keeps_the_last_n_checkpoint_folders(tmp_path: Path) -> None:
    r = make_runner(tmp_path / "ckpt", **{"statekit.checkpoints.retained": 2})
    src = RecordSource(RECORDS)
    for _ in range(10):
        r.run(src, max_records=100)
        r.checkpoint()
    job = tmp_path / "ckpt" / "job"
    assert sorted(p.name for p in job.iterdir() if p.name.startswith("chk-")) == ["chk-10", "chk-9"]
    assert r.storage.list_checkpoints("job") == [str(job / "chk-9"), str(job / "chk-10")]


def test_retention_deletes_exactly_the_shared_files_no_retained_checkpoint_references(tmp_path: Path) -> None:
    """Incremental backends reference shared files from several checkpoints; simulate one."""
    storage = FileSystemCheckpointStorage(str(tmp_path / "ckpt"), inline_threshold=0)
    backend = HeapKeyedStateBackend(
        key_serializer=StrSerializer(), key_group_range=KeyGroupRange(0, 127), max_parallelism=128
    )
    count = backend.get_state(ValueStateDescriptor("count", int, default=0))
    shared: dict[int, dict[str, Any]] = {}
    references: dict[int, list[int]] = {}
    for cid in range(1, 11):
        backend.set_current_key(f"k{cid}")
        count.update(cid)
        writer = storage.begin_checkpoint("job", cid)
        stream = writer.create_stream(f"sst-{cid}", shared=True)
        stream.write(b"x" * 100 + bytes([cid]))
        shared[cid] = stream.close_and_get_handle().to_json()
        # Each checkpoint reuses the files of the two before it, as an incremental one does.
        references[cid] = [c for c in (cid - 2, cid - 1, cid) if c >= 1]
        st = SubtaskState("op", 0, backend.key_group_range)
        buf = io.BytesIO()
        res = backend.snapshot().write(buf)
        out = writer.create_stream("op-0.keyed")
        out.write(buf.getvalue())
        st.keyed = {
            "handle": out.close_and_get_handle().to_json(),
            "header_length": res.header_length,
            "offsets": {str(k): list(v) for k, v in res.offsets.items()},
            "entries": res.entries,
            "size": res.size,
            "shared": [shared[c] for c in references[cid]],
        }
        complete_checkpoint(writer, job_id="job", checkpoint_id=cid, max_parallelism=128, subtasks=[st])
        apply_retention(storage, "job", 2)
    job = tmp_path / "ckpt" / "job"
    assert sorted(p.name for p in job.iterdir() if p.name.startswith("chk-")) == ["chk-10", "chk-9"]
    wanted = {f"sst-{c}" for c in set(references[9]) | set(references[10])}
    assert {p.name for p in (job / "shared").iterdir()} == wanted == {"sst-7", "sst-8", "sst-9", "sst-10"}


def test_jobmanager_state_size_limit_fails_the_checkpoint_not_the_job(tmp_path: Path) -> None:
    r = LocalRunner(
        CountUrls,
        key_selector=lambda x: x["url"],
        config={
            "statekit.checkpoint.storage": "jobmanager",
            "statekit.checkpoint.storage.jobmanager.max-state-size": "4kb",
            "statekit.checkpoint.interval-records": 100,
            "statekit.parallelism": 1,
        },
    )
    with pytest.warns(RuntimeWarning, match="checkpoint failed, the job goes on"):
        result = r.run(RecordSource(RECORDS))
    assert result.records == len(RECORDS)
    assert result.checkpoints, "small state checkpoints first succeed"
    assert result.failed_checkpoints, "the state outgrows the limit"
    msg = result.failed_checkpoints[0]
    assert "'last_methods'" in msg and "4,096-byte limit" in msg
    # The previous checkpoint stays the latest.
    assert r.storage.latest_checkpoint("job") == result.checkpoints[-1]
    with pytest.raises(StateSizeLimitError, match="last_methods"):
        r.checkpoint()
    assert r.storage.latest_checkpoint("job") == result.checkpoints[-1]


def test_a_truncated_metadata_file_is_corrupt(tmp_path: Path) -> None:
    r = make_runner(tmp_path / "ckpt")
    r.run(RecordSource(RECORDS[:100]))
    loc = Path(r.checkpoint())
    meta = loc / "_metadata"
    meta.write_bytes(meta.read_bytes()[:-7])
    with pytest.raises(CorruptSnapshotError, match="_metadata"):
        make_runner(tmp_path / "ckpt").restore("latest")


def test_retention_deletes_what_failed_checkpoints_left_but_nothing_a_kept_checkpoint_needs(
    tmp_path: Path,
) -> None:
    """A checkpoint that failed while its store was down could not delete its files: the next cleanup does."""
    storage = FileSystemCheckpointStorage(str(tmp_path / "ckpt"), inline_threshold=0)

    def checkpoint(cid: int, shared: list[str], *, complete: bool = True) -> None:
        writer = storage.begin_checkpoint("job", cid)
        st = SubtaskState("op", 0, KeyGroupRange(0, 127))  # only shared files: no backend needed
        st.keyed = {"shared": []}
        for name in shared:
            out = writer.create_stream(name, shared=True)
            out.write(name.encode())
            st.keyed["shared"].append(out.close_and_get_handle().to_json())
        leftover = writer.create_stream("op-0.keyed")
        leftover.write(b"x")
        leftover.close_and_get_handle()
        if complete:
            complete_checkpoint(writer, job_id="job", checkpoint_id=cid, max_parallelism=128, subtasks=[st])

    job = tmp_path / "ckpt" / "job"
    checkpoint(1, ["a"])
    checkpoint(2, ["b"], complete=False)  # failed: chk-2/ and shared/b stay behind
    (job / "chk-9").mkdir()  # newer than every completed one: maybe in flight, never touched
    checkpoint(3, ["c"])
    assert sorted(p.name for p in (job / "shared").iterdir()) == ["a", "b", "c"]
    (job / "chk-3" / "_metadata").write_bytes(b"damaged")  # a kept checkpoint we cannot read
    with pytest.warns(RuntimeWarning):
        apply_retention(storage, "job", 2)
    assert sorted(p.name for p in (job / "shared").iterdir()) == ["a", "b", "c"]  # so no orphan is sure
    checkpoint(4, ["d"])
    apply_retention(storage, "job", 1)
    assert sorted(p.name for p in job.iterdir()) == ["chk-4", "chk-9", "shared", "taskowned"]
    assert sorted(p.name for p in (job / "shared").iterdir()) == ["d"]
