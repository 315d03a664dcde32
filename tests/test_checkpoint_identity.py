"""Checkpoints bound to their identity: a ``_metadata`` is restored only where it belongs (issue 42, point 6).

The probe's case: another job's ``_metadata`` (state inline, the default for
small state) copied over this job's newest checkpoint. ``checkpoints verify``
flags it, ``restore="latest"`` falls back past it with the reason, and with
fallback off (Spark's policy) the start is refused naming it. Real files, the
real filesystem storage, real LocalRunners.
"""

from __future__ import annotations

import json
import shutil
import struct
import warnings
import zlib
from pathlib import Path
from typing import Any

import pytest

from jobs import expected_counts, make_records
from statekit import LocalRunner, RecordSource
from statekit.checkpoints._coordinator import newest_checkpoint, start_point
from statekit.checkpoints._restore import load_checkpoint
from statekit.checkpoints._verify import KIND_UNCHECKED, verify_checkpoint
from statekit.cli._cli import main
from statekit.errors import CheckpointNotFoundError, CorruptCheckpointError
from statekit_storage import FileSystemCheckpointStorage

RECORDS = make_records(600, urls=12)
INLINE = {
    "statekit.checkpoint.storage.filesystem.inline-threshold": 1 << 20,
    "statekit.checkpoint.interval-records": 200,
    "statekit.checkpoints.retained": 3,
}


def _runner(ckpt: Path, job_id: str, **conf: Any) -> LocalRunner:
    from jobs import CountUrls

    config = {"statekit.checkpoints.dir": str(ckpt), "statekit.parallelism": 2, **INLINE, **conf}
    return LocalRunner(CountUrls, key_selector=lambda r: r["url"], config=config, job_id=job_id)


def _counts(runner: LocalRunner) -> dict[str, int]:
    from jobs import state_of_runner

    return {url: s[0] for url, s in state_of_runner(runner).items()}


@pytest.fixture
def two_jobs(tmp_path: Path) -> Path:
    """Jobs ``mine`` (600 records, checkpoints 1..3) and ``other`` (other records), state inline."""
    ckpt = tmp_path / "ckpt"
    for job, records in (("mine", RECORDS), ("other", make_records(300, urls=5, seed=3))):
        r = _runner(ckpt, job)
        r.run(RecordSource(records))
        r.close()
    assert (ckpt / "mine" / "chk-3" / "_metadata").exists() and (ckpt / "other" / "chk-2").exists()
    return ckpt


def _newest(ckpt: Path, job: str) -> Path:
    return max((ckpt / job).glob("chk-*"), key=lambda p: int(p.name[4:]))


def test_another_jobs_metadata_over_the_newest_is_flagged_by_verify(
    two_jobs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    newest = _newest(two_jobs, "mine")
    shutil.copyfile(_newest(two_jobs, "other") / "_metadata", newest / "_metadata")
    storage = FileSystemCheckpointStorage(str(two_jobs))
    (problem,) = verify_checkpoint(storage, str(newest))
    assert problem.file == f"{newest}/_metadata"
    assert f"sits as checkpoint {newest.name[4:]} of job 'mine' but records job 'other'" in problem.problem
    code = main(["checkpoints", "verify", str(newest)])
    out, _ = capsys.readouterr()
    assert code != 0 and "records job 'other'" in out


def test_restore_latest_falls_back_past_another_jobs_metadata_and_says_why(two_jobs: Path) -> None:
    newest = _newest(two_jobs, "mine")
    shutil.copyfile(_newest(two_jobs, "other") / "_metadata", newest / "_metadata")
    r = _runner(two_jobs, "mine")
    with pytest.warns(RuntimeWarning, match="records job 'other'"):
        result = r.run(RecordSource(RECORDS), restore="latest")
    ((skipped, reason),) = result.skipped_checkpoints
    assert skipped == str(newest) and "records job 'other'" in reason
    assert result.restored_from is not None and result.restored_from != str(newest)
    assert _counts(r) == dict(expected_counts(RECORDS))  # exact: the older one's position and state
    r.close()


def test_with_fallback_off_the_restore_refuses_naming_it(two_jobs: Path) -> None:
    newest = _newest(two_jobs, "mine")
    shutil.copyfile(_newest(two_jobs, "other") / "_metadata", newest / "_metadata")
    r = _runner(two_jobs, "mine", **{"statekit.restore.fallback": False})
    with pytest.raises(CorruptCheckpointError, match=rf"{newest}/_metadata: .*records job 'other'"):
        r.run(RecordSource(RECORDS), restore="latest")
    r.close()
    # Spark's way: the newest checkpoint, no fallback, the ways out appended.
    storage = FileSystemCheckpointStorage(str(two_jobs))
    with pytest.raises(CorruptCheckpointError, match="records job 'other'.*WAYS OUT"):
        newest_checkpoint(storage, "mine", " WAYS OUT")


def test_another_checkpoints_metadata_of_the_same_job_is_refused(two_jobs: Path) -> None:
    chk1, newest = two_jobs / "mine" / "chk-1", _newest(two_jobs, "mine")
    shutil.copyfile(chk1 / "_metadata", newest / "_metadata")
    storage = FileSystemCheckpointStorage(str(two_jobs))
    (problem,) = verify_checkpoint(storage, str(newest))
    assert "records checkpoint id 1" in problem.problem


def test_a_savepoints_metadata_at_a_checkpoint_location_is_refused(two_jobs: Path, tmp_path: Path) -> None:
    r = _runner(two_jobs, "mine")
    r.run(RecordSource([]), restore="latest")  # restored, nothing new to read
    sp = Path(r.savepoint(str(tmp_path / "sp")))
    r.close()
    newest = _newest(two_jobs, "mine")
    shutil.copyfile(sp / "_metadata", newest / "_metadata")
    storage = FileSystemCheckpointStorage(str(two_jobs))
    (problem,) = verify_checkpoint(storage, str(newest))
    assert "records kind 'savepoint'" in problem.problem
    # The savepoint itself records its origin, and restores from anywhere it is moved to.
    meta = load_checkpoint(storage, str(sp)).metadata
    assert meta.kind == "savepoint" and meta.origin == {
        "from": "running job",
        "checkpoint_id": meta.checkpoint_id,
    }
    moved = tmp_path / "moved" / "my-savepoint"
    shutil.copytree(sp, moved)
    assert verify_checkpoint(storage, str(moved)) == []


def test_a_checkpoint_moved_out_of_its_job_is_not_restored(two_jobs: Path, tmp_path: Path) -> None:
    moved = tmp_path / "backup" / "chk-copy"
    shutil.copytree(two_jobs / "mine" / "chk-1", moved)
    storage = FileSystemCheckpointStorage(str(two_jobs))
    (problem,) = verify_checkpoint(storage, str(moved))
    assert (
        "a checkpoint is not relocatable" in problem.problem
        and "statekit savepoint convert" in problem.problem
    )


def _rewrite(path: Path, change: Any) -> None:
    data = path.read_bytes()
    obj = json.loads(data[8:-4])
    change(obj)
    body = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    path.write_bytes(data[:8] + body + struct.pack("<I", zlib.crc32(body)))


def test_metadata_of_an_early_build_without_its_kind_restores_and_verify_says_so(
    two_jobs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    newest = _newest(two_jobs, "mine")
    _rewrite(newest / "_metadata", lambda obj: obj.pop("kind"))
    storage = FileSystemCheckpointStorage(str(two_jobs))
    assert verify_checkpoint(storage, str(newest)) == []
    assert main(["checkpoints", "verify", str(newest)]) == 0
    out, _ = capsys.readouterr()
    assert KIND_UNCHECKED[:40] in " ".join(out.split())
    r = _runner(two_jobs, "mine")
    result = r.run(RecordSource(RECORDS), restore="latest")
    assert result.restored_from == str(newest) and result.skipped_checkpoints == []
    assert _counts(r) == dict(expected_counts(RECORDS))
    r.close()
    # Its job and id are checked all the same: moved over another id, it is refused.
    shutil.copyfile(newest / "_metadata", two_jobs / "mine" / "chk-1" / "_metadata")
    (problem,) = verify_checkpoint(storage, str(two_jobs / "mine" / "chk-1"))
    assert "records checkpoint id" in problem.problem


class _RemovedAfterListing(FileSystemCheckpointStorage):
    """A reader's first listing names a checkpoint that is deleted before the reader reads it.

    ``newer_completed``: the job completed ``chk-3`` after that listing and its
    retention deleted the listed ``chk-2`` (the first listing shows the job as it
    was: ``chk-3`` not yet there). Otherwise someone deleted the newest, ``chk-3``.
    """

    def __init__(self, root: Path, *, newer_completed: bool) -> None:
        super().__init__(str(root))
        self.newer_completed, self.listings = newer_completed, 0

    def list_checkpoints(self, job_id: str) -> list[str]:
        self.listings += 1
        listed = super().list_checkpoints(job_id)
        if self.listings > 1:
            return listed
        if self.newer_completed:
            *listed, _ = listed  # chk-3: not completed yet at this listing
        shutil.rmtree(listed[-1])
        return listed


def test_a_newest_retention_removed_before_it_was_read_gives_way_to_the_newer_one(two_jobs: Path) -> None:
    storage = _RemovedAfterListing(two_jobs, newer_completed=True)
    cp = newest_checkpoint(storage, "mine")
    assert cp is not None and cp.location == str(two_jobs / "mine" / "chk-3") and storage.listings == 2


@pytest.mark.parametrize("fallback", [True, False])
def test_restore_latest_takes_the_newer_one_too_without_counting_a_skip(
    two_jobs: Path, fallback: bool
) -> None:
    storage = _RemovedAfterListing(two_jobs, newer_completed=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "restore skipped": nothing was damaged
        start = start_point(storage, "mine", "latest", fallback=fallback, ways_out=" WAYS OUT")
    assert start.checkpoint is not None and start.checkpoint.location == str(two_jobs / "mine" / "chk-3")
    assert start.skipped == []


def test_a_listed_newest_that_is_gone_with_nothing_newer_is_an_error_naming_it(two_jobs: Path) -> None:
    def removing() -> _RemovedAfterListing:  # each removes the newest left
        return _RemovedAfterListing(two_jobs, newer_completed=False)

    with pytest.raises(CheckpointNotFoundError, match="chk-3"):
        newest_checkpoint(removing(), "mine")
    # restore="latest" calls it damage, as any missing newest: the LocalRunner's way falls back past
    # it with a warning (chk-2 removed, chk-1 taken), Spark's refuses naming it (chk-1 removed).
    with pytest.warns(RuntimeWarning, match="restore skipped .*chk-2"):
        start = start_point(removing(), "mine", "latest", fallback=True, ways_out="")
    assert start.checkpoint is not None and start.checkpoint.location == str(two_jobs / "mine" / "chk-1")
    with pytest.raises(CorruptCheckpointError, match="chk-1.*WAYS OUT"):
        start_point(removing(), "mine", "latest", fallback=False, ways_out=" WAYS OUT")
