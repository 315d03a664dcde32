"""Savepoint requests to a running job through its files: one at a time, deadlines, damaged files.

The running side is played here by ``take_request``/``respond``, as the Spark
driver calls them after a micro-batch (tests/spark/test_spark_savepoints.py
runs the real query); the storage is the real filesystem one on local files.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from statekit.checkpoints._savepoint_requests import (
    REQUEST_FILE,
    SavepointRequest,
    SavepointResponse,
    request_savepoint,
    respond,
    take_request,
)
from statekit.errors import CheckpointError
from statekit_storage import FileSystemCheckpointStorage


@pytest.fixture
def storage(tmp_path: Path) -> FileSystemCheckpointStorage:
    return FileSystemCheckpointStorage(str(tmp_path / "ckpt"))


def answer_next(storage: FileSystemCheckpointStorage, location: str) -> threading.Thread:
    """A runner that answers the next request with ``location``."""

    def run() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            request = take_request(storage, "job")
            if request is not None:
                respond(storage, "job", SavepointResponse(request.request_id, "completed", location=location))
                return
            time.sleep(0.05)

    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_request_is_answered_once_and_taken_once(storage: FileSystemCheckpointStorage) -> None:
    runner = answer_next(storage, "/sp/savepoint-1")
    response = request_savepoint(storage, "job", "/sp", stop=False, timeout=30)
    runner.join()
    assert response.status == "completed" and response.location == "/sp/savepoint-1"
    assert take_request(storage, "job") is None  # honoured once


def test_a_second_request_while_one_is_pending_is_refused(storage: FileSystemCheckpointStorage) -> None:
    pending = SavepointRequest(
        "a" * 32, None, True, 0, time.time_ns() // 1_000_000 + 60_000, "pid 1 on host h"
    )
    storage.write_job_file("job", REQUEST_FILE, pending.to_bytes())
    with pytest.raises(
        CheckpointError, match=r"a savepoint request of job 'job' is pending: aaaaaaaaaaaa by pid 1"
    ):
        request_savepoint(storage, "job", None, stop=False, timeout=1)


def test_a_request_found_after_its_deadline_is_answered_expired_and_not_honoured(
    storage: FileSystemCheckpointStorage,
) -> None:
    stale = SavepointRequest("b" * 32, None, True, 0, time.time_ns() // 1_000_000 - 1, "pid 1 on host h")
    storage.write_job_file("job", REQUEST_FILE, stale.to_bytes())
    assert take_request(storage, "job") is None  # a forgotten --stop stops nothing
    answer = SavepointResponse.from_bytes(storage.read_job_file("job", "savepoint-response.json") or b"")
    assert (answer.request_id, answer.status) == ("b" * 32, "expired")
    assert storage.read_job_file("job", REQUEST_FILE) is None


def test_a_damaged_request_is_answered_failed(storage: FileSystemCheckpointStorage) -> None:
    storage.write_job_file("job", REQUEST_FILE, b"{not json")
    assert take_request(storage, "job") is None
    answer = SavepointResponse.from_bytes(storage.read_job_file("job", "savepoint-response.json") or b"")
    assert answer.status == "failed" and answer.failure is not None


def test_an_unanswered_request_times_out_and_is_withdrawn(storage: FileSystemCheckpointStorage) -> None:
    with pytest.raises(CheckpointError, match=r"no running query of job 'job' answered .* within 0.3 s"):
        request_savepoint(storage, "job", None, stop=True, timeout=0.3)
    assert storage.read_job_file("job", REQUEST_FILE) is None
