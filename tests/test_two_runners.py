"""Two runners started on one job and checkpoint directory: the newer one fences the older off.

Real storages: a local directory, a moto S3 server, and a jobmanager storage
shared by two runners in one process. The older runner stops with a
FencedError naming the newer run at its next checkpoint, completes no
checkpoint after the newer one registered, deletes nothing, and the newer run's
state is exact.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from jobs import CountUrls, count_urls_runner, make_records, model_state, state_of_runner
from statekit import LocalRunner, RecordSource
from statekit.backend_api import CheckpointStorage
from statekit.checkpointing import load_checkpoint
from statekit.errors import FencedError

RECORDS = make_records(600, urls=30, seed=23)
INTERVAL = {"statekit.checkpoint.interval-records": 100, "statekit.checkpoints.retained": 10}


def _local(tmp_path: Path, s3: dict[str, str]) -> Callable[[], LocalRunner]:
    return lambda: count_urls_runner(str(tmp_path / "ckpt"), INTERVAL)


def _s3(tmp_path: Path, s3: dict[str, str]) -> Callable[[], LocalRunner]:
    options = json.dumps({"client_kwargs": {"endpoint_url": s3["endpoint_url"]}})
    url = f"s3://{s3['bucket']}/two-runners-{uuid.uuid4().hex[:8]}"
    conf = {**INTERVAL, "statekit.checkpoint.storage.filesystem.storage-options": options}
    return lambda: count_urls_runner(url, conf)


def _jobmanager(tmp_path: Path, s3: dict[str, str]) -> Callable[[], LocalRunner]:
    from statekit_storage import JobManagerCheckpointStorage

    shared = JobManagerCheckpointStorage()  # two runners of one process, one "JobManager"
    config = {"statekit.parallelism": 2, **INTERVAL}
    return lambda: LocalRunner(CountUrls, key_selector=lambda r: r["url"], config=config, storage=shared)


STORAGES = {"local": _local, "s3": _s3, "jobmanager": _jobmanager}


@pytest.fixture(params=sorted(STORAGES))
def make_runner(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], LocalRunner]:
    s3 = request.getfixturevalue("s3_endpoint") if request.param == "s3" else {}
    return STORAGES[request.param](tmp_path, s3)


def checkpoint_ids(storage: CheckpointStorage) -> list[int]:
    return [load_checkpoint(storage, loc).checkpoint_id for loc in storage.list_checkpoints("job")]


def test_the_newer_runner_fences_off_the_older_one(make_runner: Callable[[], LocalRunner]) -> None:
    older = make_runner()
    older_src = RecordSource(RECORDS)
    assert len(older.run(older_src, max_records=200).checkpoints) == 2  # chk-1, chk-2
    # A second runner on the same job, as a second process started by mistake (or a restart
    # while the first is hung) would be: it restores the latest checkpoint and takes over.
    newer = make_runner()
    newer_src = RecordSource(RECORDS)
    taken = newer.run(newer_src, restore="latest", max_records=100)
    # chk-3 is skipped: the older run had not ended, and might have been writing it.
    assert [c.rsplit("/", 1)[1] for c in taken.checkpoints] == ["chk-4"]
    done_before = checkpoint_ids(older.storage)

    with pytest.raises(FencedError) as info:
        older.run(older_src)  # its next checkpoint (after 100 more records) is refused
    message = str(info.value)
    newer_run = newer._fence.run_id[:12]
    assert f"a newer run {newer_run} (epoch 2): LocalRunner, pid {os.getpid()}" in message, message
    assert f"on host {socket.gethostname()}" in message and "is fenced off" in message
    assert f"this run {older._fence.run_id[:12]} (epoch 1)" in message
    # It completed nothing, and deleted nothing (retention would have: 10 are kept).
    assert checkpoint_ids(older.storage) == done_before == [1, 2, 4]

    result = newer.run(newer_src)  # the newer run goes on to the end, exactly
    assert result.failed_checkpoints == []
    assert state_of_runner(newer) == model_state(RECORDS)
    fresh = make_runner()
    assert fresh.restore("latest") == result.checkpoints[-1]
    assert state_of_runner(fresh) == model_state(RECORDS)


@pytest.mark.parametrize("make_runner", ["local", "jobmanager"], indirect=True)
def test_a_runner_that_only_restores_fences_nobody(make_runner: Callable[[], LocalRunner]) -> None:
    """Inspecting a job's state (restore, read) is no second run of it."""
    running = make_runner()
    src = RecordSource(RECORDS)
    running.run(src, max_records=200)
    reader = make_runner()
    assert reader.restore("latest") is not None
    assert state_of_runner(reader) == model_state(RECORDS[:200])
    result = running.run(src)
    assert [c.rsplit("/", 1)[1] for c in result.checkpoints] == ["chk-3", "chk-4", "chk-5", "chk-6"]
    assert state_of_runner(running) == model_state(RECORDS)


def test_a_runner_after_one_that_ended_continues_the_ids(tmp_path: Path) -> None:
    """A closed runner has ended: the next one has no in-flight checkpoint to step over."""
    first = count_urls_runner(str(tmp_path / "ckpt"), INTERVAL)
    first.run(RecordSource(RECORDS[:200]))
    first.close()
    second = count_urls_runner(str(tmp_path / "ckpt"), INTERVAL)
    result = second.run(RecordSource(RECORDS), restore="latest")
    assert [c.rsplit("/", 1)[1] for c in result.checkpoints][:1] == ["chk-3"]
    runs = sorted(p.name for p in (tmp_path / "ckpt" / "job" / "runs").iterdir())
    assert runs == [f"run-1-{first._fence.run_id}.json", f"run-2-{second._fence.run_id}.json"]
    assert json.loads((tmp_path / "ckpt" / "job" / "runs" / runs[0]).read_text())["ended_ms"] > 0
