"""The checkpoint disk fills up: a clear error, the previous checkpoint intact, the job's state unharmed.

Real local files behind ``fulldisk://`` (see fulldisk.py), which fails writes
with ``ENOSPC`` once a byte budget is spent, as a full disk does.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fulldisk import FullDisk
from jobs import count_urls_runner, make_records, model_state, state_of_runner
from statekit import LocalRunner, RecordSource

RECORDS = make_records(500, urls=30, seed=17)


@pytest.fixture(autouse=True)
def empty_disk() -> Iterator[None]:
    FullDisk.budget, FullDisk.only = None, ""
    yield
    FullDisk.budget, FullDisk.only = None, ""


def make_runner(root: Path, **conf: Any) -> LocalRunner:
    return count_urls_runner(f"fulldisk://{root}", {"statekit.checkpoint.interval-records": 100, **conf})


def run_quietly(r: LocalRunner, src: RecordSource, n: int | None = None) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return r.run(src, max_records=n)


# ._metadata: the temporary file that is renamed to _metadata
@pytest.mark.parametrize("where", ["/chk-3/process-1.keyed", "/chk-3/._metadata", "/chk-3/"])
def test_a_full_disk_fails_the_checkpoint_not_the_job_and_keeps_the_previous_one(
    tmp_path: Path, where: str
) -> None:
    root = tmp_path / "ckpt"
    r = make_runner(root)
    src = RecordSource(RECORDS)
    assert len(run_quietly(r, src, 200).checkpoints) == 2
    FullDisk.only, FullDisk.budget = where, 100  # a few bytes of this checkpoint fit, then the disk is full
    failed = run_quietly(r, src, 100)
    assert failed.checkpoints == [] and len(failed.failed_checkpoints) == 1
    message = failed.failed_checkpoints[0]
    assert "No space left on device" in message and f"fulldisk://{root}/job/chk-3/" in message, message
    job = root / "job"
    assert sorted(p.name for p in job.iterdir() if p.name.startswith("chk-")) == [
        "chk-2"
    ]  # nothing half-written
    previous = make_runner(root)
    assert previous.restore("latest") == f"fulldisk://{root}/job/chk-2"
    assert state_of_runner(previous) == model_state(RECORDS[:200])  # the previous checkpoint, intact
    # The job's own state was not harmed: once there is room, it checkpoints every record exactly.
    FullDisk.budget = None
    assert len(run_quietly(r, src).checkpoints) == 2  # records 301..500: chk-4, chk-5
    assert state_of_runner(r) == model_state(RECORDS)
    fresh = make_runner(root)
    assert fresh.restore("latest") == f"fulldisk://{root}/job/chk-5"
    assert state_of_runner(fresh) == model_state(RECORDS)


@functools.cache
def _can_mount_tmpfs() -> bool:
    """Whether ``unshare`` may mount a tmpfs in a private mount namespace here (probed once)."""
    if shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory() as target:
        probe = ["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=1m tmpfs "$1"', "sh", target]
        return subprocess.run(probe, capture_output=True).returncode == 0


def _tmpfs_runner(size: str) -> list[str] | None:
    """A command prefix that runs its command with a private tmpfs of ``size`` at ``$FULLDISK``, or None."""
    if not _can_mount_tmpfs():
        return None
    return [
        "unshare",
        "-rm",
        "sh",
        "-c",
        # mode=0700: statekit refuses a local directory others may write (a tmpfs root is 1777).
        f'mount -t tmpfs -o size={size},mode=0700 tmpfs "$FULLDISK" && exec "$@"',
        "sh",
    ]


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
def test_a_full_local_disk_of_the_backend_keeps_the_previous_checkpoint_and_resumes_exactly(
    tmp_path: Path, backend: str
) -> None:
    """The backend's local directory (statekit.local-dir) is an 8 MiB tmpfs in a private mount namespace."""
    pytest.importorskip(f"statekit_{backend}")
    prefix = _tmpfs_runner("8m")
    if prefix is None:
        pytest.skip("needs unshare and permission to mount a tmpfs in a private mount namespace")
    from bigstate import VALUE, BigValues, records, value_of

    local, ckpt = tmp_path / "local", tmp_path / "ckpt"
    local.mkdir()
    n = 1000  # about 20 MB of state: more than the disk holds
    child = Path(__file__).with_name("disk_full_child.py")
    done = subprocess.run(
        [*prefix, sys.executable, str(child), backend, str(local), str(ckpt), str(n)],
        capture_output=True,
        text=True,
        env={**os.environ, "FULLDISK": str(local)},
        timeout=600,
        check=True,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # The disk filled up: the job stopped with statekit's error naming the directory, the engine's
    # error chained to it (20 MB of state cannot fit in 8 MiB: it must stop).
    error = report["error"]
    assert error is not None and error["type"] == "statekit._errors.BackendIOError", report
    assert f"the {backend} backend cannot write its state in {local}/" in error["message"], error
    assert "bytes are free on its disk). Free space on that disk" in error["message"], error
    engine = "lmdb." if backend == "lmdb" else "builtins.Exception: "  # "IO error: …" or the OS error itself
    assert error["cause"].startswith(engine), error
    assert "No space left on device" in error["cause"] or "Input/output error" in error["cause"], error
    if backend == "lmdb":  # a snapshot copy that ran out of room fails its checkpoint, not the job
        assert all("cannot copy the LMDB snapshot" in m for m in report["failed_checkpoints"]), report
    # The previous checkpoint is intact and resumes exactly, on a disk with room.
    config = {"statekit.backend": backend, "statekit.checkpoints.dir": str(ckpt), "statekit.parallelism": 1}
    resumed = LocalRunner(BigValues, key_selector=lambda r: r, key_type=int, config=config)
    latest = resumed.restore("latest")
    assert latest is not None
    position = resumed.position
    kb = resumed.subtasks[0].keyed_backend
    state = kb.get_state(VALUE)
    assert sorted(kb.keys("value")) == list(range(position))
    for key in (0, position - 1):
        kb.set_current_key(key)
        assert state.value() == value_of(key)
    resumed.run(RecordSource(records(n)))
    assert sorted(kb.keys("value")) == list(range(n))
    resumed.close()
