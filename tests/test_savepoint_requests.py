"""Savepoint requests to a running job through its files: one at a time, deadlines, damaged files.

The running side is played here by ``take_request``/``respond``, as the Spark
driver calls them after a micro-batch (tests/spark/test_spark_savepoints.py
runs the real query); the storage is the real filesystem one on local files.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

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


def _counts_at(location: str) -> dict[str, int]:
    from statekit.state_processor import SavepointReader

    with SavepointReader.open(location) as reader:
        table = reader.read_table("process", "count")
        return dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist()))


def test_a_local_runner_stops_with_a_savepoint_at_the_checkpoint_that_finds_the_request(
    tmp_path: Path,
) -> None:
    """``statekit savepoint trigger --stop`` against a LocalRunner's run: savepoint, stop, resume exactly."""
    from jobs import count_urls_runner, expected_counts, make_records
    from statekit import RecordSource

    records = make_records(1000, urls=30)
    ckpt = str(tmp_path / "ckpt")
    conf = {"statekit.checkpoint.interval-records": 300}
    runner = count_urls_runner(ckpt, conf)
    storage = FileSystemCheckpointStorage(ckpt)
    answers: list[SavepointResponse] = []
    asker = threading.Thread(
        target=lambda: answers.append(
            request_savepoint(storage, runner.job_id, str(tmp_path / "sp"), stop=True, timeout=60)
        )
    )
    asker.start()
    while storage.read_job_file(runner.job_id, REQUEST_FILE) is None:  # the request is pending
        time.sleep(0.01)
    result = runner.run(RecordSource(records))
    runner.close()
    asker.join()

    # Taken at the first checkpoint (300 records); nothing read after it.
    (answer,) = answers
    assert answer.status == "completed" and answer.stopped
    assert result.stopped_with_savepoint == answer.location
    assert answer.location is not None and answer.location.startswith(str(tmp_path / "sp"))
    assert result.records == 300 and len(result.checkpoints) == 1
    assert _counts_at(answer.location) == dict(expected_counts(records[:300]))

    # Restored from the savepoint, the rest of the input; the counts are exact.
    again = count_urls_runner(ckpt, conf)
    rest = again.run(RecordSource(records), restore=answer.location)
    again.close()
    assert rest.records == 700 and rest.stopped_with_savepoint is None
    assert _counts_at(rest.checkpoints[-1]) == dict(expected_counts(records))


def _ask_while_a_local_runner_runs(
    tmp_path: Path, target: str | None, *, stop: bool
) -> tuple[SavepointResponse, Any, list[Any]]:
    """A request made from another thread before a LocalRunner counts 600 records (a checkpoint per 200).

    Returns the answer, the run's result and the records.
    """
    from jobs import count_urls_runner, make_records
    from statekit import RecordSource

    records = make_records(600, urls=10)
    runner = count_urls_runner(str(tmp_path / "ckpt"), {"statekit.checkpoint.interval-records": 200})
    storage = FileSystemCheckpointStorage(str(tmp_path / "ckpt"))
    answers: list[SavepointResponse] = []
    asker = threading.Thread(
        target=lambda: answers.append(
            request_savepoint(storage, runner.job_id, target, stop=stop, timeout=60)
        )
    )
    asker.start()
    while storage.read_job_file(runner.job_id, REQUEST_FILE) is None:
        time.sleep(0.01)
    result = runner.run(RecordSource(records))
    runner.close()
    asker.join()
    (answer,) = answers
    return answer, result, records


def test_a_local_runner_answers_a_savepoint_request_and_goes_on(tmp_path: Path) -> None:
    from jobs import expected_counts

    answer, result, records = _ask_while_a_local_runner_runs(tmp_path, str(tmp_path / "sp"), stop=False)
    assert answer.status == "completed" and not answer.stopped
    assert result.records == 600 and result.stopped_with_savepoint is None
    assert answer.location is not None
    assert _counts_at(answer.location) == dict(expected_counts(records[:200]))  # at the first checkpoint


def test_a_stop_request_whose_savepoint_fails_stops_nothing(tmp_path: Path) -> None:
    """As Flink's stop-with-savepoint: no savepoint, no stop; the requester gets the reason."""
    # No --target and no statekit.savepoints.dir: the savepoint cannot be written.
    answer, result, _ = _ask_while_a_local_runner_runs(tmp_path, None, stop=True)
    assert answer.status == "failed" and not answer.stopped
    assert answer.failure is not None and "statekit.savepoints.dir" in answer.failure
    assert result.records == 600 and result.stopped_with_savepoint is None
