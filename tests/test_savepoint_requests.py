"""Savepoint requests to a running job through its files: one at a time, deadlines, damaged files.

The running side is played here by ``take_request``/``respond``, as the Spark
driver calls them after a micro-batch (tests/spark/test_spark_savepoints.py
runs the real query); the storage is the real filesystem one on local files.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from statekit.checkpoints._savepoint_requests import (
    REQUEST_FILE,
    RESPONSE_FILE,
    SavepointRequest,
    SavepointResponse,
    request_savepoint,
    respond,
    take_request,
)
from statekit.errors import CheckpointError
from statekit_storage import FileSystemCheckpointStorage


def _now() -> int:
    return time.time_ns() // 1_000_000


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
        "a" * 32,
        None,
        True,
        time.time_ns() // 1_000_000,
        time.time_ns() // 1_000_000 + 60_000,
        "pid 1 on host h",
    )
    storage.write_job_file("job", REQUEST_FILE, pending.to_bytes())
    with pytest.raises(
        CheckpointError, match=r"a savepoint request of job 'job' is pending: aaaaaaaaaaaa by pid 1"
    ):
        request_savepoint(storage, "job", None, stop=False, timeout=1)


def test_a_request_found_after_its_deadline_is_answered_expired_and_not_honoured(
    storage: FileSystemCheckpointStorage,
) -> None:
    now = time.time_ns() // 1_000_000
    stale = SavepointRequest("b" * 32, None, True, now - 60_000, now - 1, "pid 1 on host h")
    storage.write_job_file("job", REQUEST_FILE, stale.to_bytes())
    assert take_request(storage, "job") is None  # a forgotten --stop stops nothing
    answer = SavepointResponse.from_bytes(storage.read_job_file("job", "savepoint-response.json") or b"")
    assert (answer.request_id, answer.status) == ("b" * 32, "expired")
    # Left for the requester that replaces it (deleting it here raced with that replacement).
    assert storage.read_job_file("job", REQUEST_FILE) == stale.to_bytes()


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


def test_trigger_json_prints_a_failed_answer_too_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--json`` gives the answer a script parses, a failed one too; the reason is also on stderr."""
    import json

    from jobs import count_urls_runner, make_records
    from statekit import RecordSource
    from statekit.cli._cli import main

    runner = count_urls_runner(str(tmp_path / "ckpt"), {})
    runner.run(RecordSource(make_records(40, urls=4)))  # a completed checkpoint: the job exists
    runner.close()
    storage = FileSystemCheckpointStorage(str(tmp_path / "ckpt"))

    def fail_next() -> None:
        while (request := take_request(storage, runner.job_id)) is None:
            time.sleep(0.02)
        respond(storage, runner.job_id, SavepointResponse(request.request_id, "failed", failure="disk full",
                                                          checkpoint_id=1, batch_id=0))  # fmt: skip

    answering = threading.Thread(target=fail_next)
    answering.start()
    status = main(["savepoint", "trigger", str(tmp_path / "ckpt"), "--job", runner.job_id, "--json",
                   "--timeout", "60"])  # fmt: skip
    answering.join()
    out, err = capsys.readouterr()
    assert status == 2
    answer = json.loads(out)
    assert (answer["status"], answer["failure"], answer["location"]) == ("failed", "disk full", None)
    assert err.startswith("statekit: error: the savepoint of job") and "disk full" in err


# --- requests that cannot hurt the job: exclusive, validated, bounded, one at a time -------------------


def test_of_23_requesters_at_once_one_is_pending_and_22_are_refused(
    storage: FileSystemCheckpointStorage,
) -> None:
    """The request file is created exclusively: a second requester never replaces the first."""
    n = 23
    barrier = threading.Barrier(n)
    refused: list[str] = []
    answers: list[SavepointResponse] = []
    lock = threading.Lock()
    all_refused = threading.Event()

    def ask() -> None:
        barrier.wait()
        try:
            answer = request_savepoint(storage, "job", "/sp", stop=False, timeout=120)
        except CheckpointError as e:
            with lock:
                refused.append(str(e))
                if len(refused) == n - 1:
                    all_refused.set()
            return
        with lock:
            answers.append(answer)

    askers = [threading.Thread(target=ask) for _ in range(n)]
    for t in askers:
        t.start()
    assert all_refused.wait(120)
    request = take_request(storage, "job")  # the one pending request, taken once
    assert request is not None and take_request(storage, "job") is None
    respond(storage, "job", SavepointResponse(request.request_id, "completed", location="/sp/savepoint-1"))
    for t in askers:
        t.join()
    assert [a.request_id for a in answers] == [request.request_id]
    assert all("is pending: " + request.request_id[:12] in r for r in refused)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            b'{"request_id": "' + b"a" * 32 + b'", "target": null, "stop": true, "requested_ms": 1, '
            b'"deadline_ms": 1e999, "requested_by": "x"}',
            "deadline_ms is float infinite, expected int",
        ),
        (
            b'{"request_id": "' + b"a" * 32 + b'", "target": null, "stop": "false", "requested_ms": 1, '
            b'"deadline_ms": 2, "requested_by": "x"}',
            "stop is str 'false', expected bool",
        ),
        (
            b'{"request_id": "' + b"a" * 32 + b'", "target": "' + b"t" * 5000 + b'", "stop": false, '
            b'"requested_ms": 1, "deadline_ms": 2}',
            "over the limit of 4,096",
        ),
        (
            b'{"request_id": "' + b"a" * 32 + b'", "target": null, "stop": false, "requested_ms": 1, '
            b'"deadline_ms": 99999999999999}',
            "is not after requested_ms 1 by at most",
        ),
        (
            b'{"request_id": "../x", "target": null, "stop": false, "requested_ms": 1, "deadline_ms": 2}',
            "request_id is not 32 lowercase hex digits",
        ),
        (b"[1, 2]", "a JSON list, not an object"),
        (b"[" * 4000, "not JSON"),
    ],
    ids=["deadline-1e999", "stop-string", "over-size", "deadline-years", "bad-id", "list", "deep"],
)
def test_a_request_with_a_bad_field_is_answered_failed_with_the_reason(
    storage: FileSystemCheckpointStorage, body: bytes, reason: str
) -> None:
    storage.write_job_file("job", REQUEST_FILE, body)
    assert take_request(storage, "job") is None  # nothing done
    assert storage.read_job_file("job", REQUEST_FILE) is None
    answer = SavepointResponse.from_bytes(storage.read_job_file("job", "savepoint-response.json") or b"")
    assert answer.status == "failed" and answer.failure is not None and reason in answer.failure
    if b'"request_id": "aaaa' in body and len(body) <= 4096:
        assert answer.request_id == "a" * 32  # the requester learns its request was refused


def test_a_requester_replaces_only_an_expired_request(storage: FileSystemCheckpointStorage) -> None:
    stale = SavepointRequest("b" * 32, None, True, 0, 1, "pid 1 on host h")
    storage.write_job_file("job", REQUEST_FILE, stale.to_bytes())
    runner = answer_next(storage, "/sp/savepoint-2")
    assert request_savepoint(storage, "job", "/sp", stop=False, timeout=60).status == "completed"
    runner.join()


def test_a_runner_answers_an_expired_request_once_and_leaves_it_for_its_replacement(
    storage: FileSystemCheckpointStorage,
) -> None:
    """A runner that deleted an expired request could delete the new one that just replaced it."""
    stale = SavepointRequest("c" * 32, None, True, 0, 1, "pid 1 on host h")
    storage.write_job_file("job", REQUEST_FILE, stale.to_bytes())
    assert take_request(storage, "job") is None
    assert storage.read_job_file("job", REQUEST_FILE) == stale.to_bytes()
    first = storage.read_job_file("job", RESPONSE_FILE)
    assert first is not None and SavepointResponse.from_bytes(first).status == "expired"
    assert take_request(storage, "job") is None
    assert storage.read_job_file("job", RESPONSE_FILE) == first  # answered once, not every batch


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), 0.0, -1.0, 1e12])
def test_a_request_with_an_unbounded_timeout_is_refused_before_anything_is_written(
    storage: FileSystemCheckpointStorage, timeout: float
) -> None:
    with pytest.raises(CheckpointError, match="at most a week"):
        request_savepoint(storage, "job", None, stop=True, timeout=timeout)
    assert storage.read_job_file("job", REQUEST_FILE) is None


def test_targets_outside_the_savepoints_dir_and_storage_or_inside_a_job_tree_are_refused(
    tmp_path: Path,
) -> None:
    from statekit.checkpoints._honour import check_target

    ckpt = tmp_path / "ckpt"
    storage = FileSystemCheckpointStorage(str(ckpt))
    (ckpt / "other-job" / "chk-1").mkdir(parents=True)
    (ckpt / "other-job" / "chk-1" / "_metadata").write_bytes(b"x")
    sp = str(tmp_path / "sp")
    check_target(storage, "job", sp, sp)  # under statekit.savepoints.dir
    check_target(storage, "job", str(tmp_path / "elsewhere"), None)  # the checkpoints' filesystem
    check_target(storage, "job", f"file://{tmp_path}/elsewhere", None)
    check_target(storage, "job", str(ckpt / "savepoints"), None)  # a directory of its own in the root
    refused = {
        str(ckpt / "job" / "chk-3"): "inside the directory of job 'job'",
        str(ckpt / "job" / "shared" / "sp"): "inside the directory of job 'job'",
        str(ckpt / "other-job" / "x"): "inside the directory of job 'other-job'",
        str(ckpt / "savepoints" / "chk-2"): "lies in the checkpoints directory",
        str(ckpt): "lies in the checkpoints directory",
        "memory://sp": "a requested savepoint goes under statekit.savepoints.dir",
        "s3://bucket/sp": "a requested savepoint goes",
        f"{sp}/../ckpt/job": "inside the directory of job 'job'",
        "s3://bucket/sp/../x": "climbs with '..'",
    }
    (tmp_path / "link").symlink_to(ckpt / "other-job")  # a symlink into a job's tree is inside it
    refused[str(tmp_path / "link" / "sp")] = "inside the directory of job 'other-job'"
    for target, reason in refused.items():
        with pytest.raises(CheckpointError, match=re.escape(reason)):
            check_target(storage, "job", target, sp)


def test_a_target_inside_a_checkpoint_is_answered_failed_and_the_run_goes_on(tmp_path: Path) -> None:
    from jobs import count_urls_runner

    job = count_urls_runner(str(tmp_path / "ckpt"), {}).job_id
    target = str(tmp_path / "ckpt" / job / "chk-1")
    answer, result, _ = _ask_while_a_local_runner_runs(tmp_path, target, stop=True)
    assert answer.status == "failed" and not answer.stopped
    assert answer.failure is not None and f"inside the directory of job {job!r}" in answer.failure
    assert result.records == 600 and result.stopped_with_savepoint is None
    assert not (tmp_path / "ckpt" / job / "chk-1" / "savepoint").exists()


def test_a_request_taken_while_a_savepoint_is_written_is_answered_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One savepoint at a time per job: a flood is answered ``busy``, not written again and again."""
    from statekit.checkpoints import _honour
    from statekit.checkpoints._coordinator import CheckpointCoordinator, CheckpointPolicy
    from statekit.plugins._registry import default_registry

    storage = FileSystemCheckpointStorage(str(tmp_path / "ckpt"))
    coordinator = CheckpointCoordinator(
        storage, "job", max_parallelism=128, retained=1, native=False,
        policy=CheckpointPolicy("test", ""), registry=default_registry(),
    )  # fmt: skip
    entered, release = threading.Event(), threading.Event()
    written: list[str] = []

    def slow_convert(storage: Any, location: str, target: str) -> str:
        entered.set()
        assert release.wait(60)
        written.append(target)
        raise CheckpointError("no checkpoint here (the test's)")

    monkeypatch.setattr(_honour, "convert_to_savepoint", slow_convert)
    requests = _honour.SavepointRequests(coordinator, str(tmp_path / "sp"))
    now = time.time_ns() // 1_000_000
    first = SavepointRequest("c" * 32, None, False, now, now + 60_000, "a")
    storage.write_job_file("job", REQUEST_FILE, first.to_bytes())
    answers: list[SavepointResponse | None] = []
    writer = threading.Thread(target=lambda: answers.append(requests.after_checkpoint("/x/chk-1", 1)))
    writer.start()
    assert entered.wait(60)
    busy = []
    for i in range(22):
        rid = f"{i:032x}"
        storage.write_job_file(
            "job", REQUEST_FILE, SavepointRequest(rid, None, False, now, now + 60_000, "b").to_bytes()
        )
        busy.append(requests.after_checkpoint("/x/chk-1", 1))
    release.set()
    writer.join()
    assert [b.status if b else None for b in busy] == ["busy"] * 22
    assert all(b is not None and "is being written (request cccccccccccc)" in (b.failure or "") for b in busy)
    assert len(written) == 1 and answers[0] is not None and answers[0].status == "failed"


def test_a_savepoint_restored_into_the_same_dead_letter_directory_writes_no_dead_letter_twice(
    tmp_path: Path,
) -> None:
    """The savepoint is its checkpoint for the letters too: the later checkpoints' letters are withdrawn."""
    import json as _json

    from logfiles import CountJob, LogDir
    from statekit.checkpoints._convert import convert_to_savepoint

    logs = LogDir(tmp_path)
    logs.write("access.log", 40)
    logs.write_raw("access.log", b'{"url": "/a"\n')
    logs.write("access.log", 40)
    logs.write_raw("access.log", b'{"url": "/b"\n')
    logs.write("access.log", 20)
    dead = logs.root / "dead"
    job = CountJob(
        logs,
        {"statekit.bad-records.policy": "dead-letter", "statekit.bad-records.dead-letter-path": str(dead),
         "statekit.checkpoints.retained": 50},
        interval=10,
    )  # fmt: skip

    def letters() -> list[str]:
        return [
            _json.loads(x)["raw"]
            for p in sorted(dead.glob("part-*.json"))
            for x in p.read_text().splitlines()
        ]

    with job.runner() as r:
        r.run(job.source(), restore="latest", max_records=50)  # past the first bad line
        chk = r.checkpoint()
    storage = FileSystemCheckpointStorage(str(logs.root / "checkpoints"))
    savepoint = convert_to_savepoint(storage, chk, str(tmp_path / "sp"))
    assert letters() == ['{"url": "/a"']
    job.run()
    assert letters() == ['{"url": "/a"', '{"url": "/b"'] and job.exact()
    # Back to the savepoint, in the same job and dead-letter directory: every letter once.
    with job.runner() as r:
        r.run(job.source(), restore=savepoint)
    assert letters() == ['{"url": "/a"', '{"url": "/b"']


def test_an_idle_spark_query_answers_at_once_and_a_batch_starting_meanwhile_waits_then_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's watcher (issue 43), without Spark: the real coordinator, storage and conversion."""
    from statekit.checkpoints import _honour
    from statekit.checkpoints._coordinator import CheckpointCoordinator, CheckpointPolicy
    from statekit.plugins._registry import default_registry
    from statekit.spark._savepoint_request import SparkSavepointRequests

    storage = FileSystemCheckpointStorage(str(tmp_path / "ckpt"))
    coordinator = CheckpointCoordinator(
        storage, "job", max_parallelism=128, retained=2, native=False,
        policy=CheckpointPolicy("test", ""), registry=default_registry(),
    )  # fmt: skip
    location = coordinator.checkpoint(
        lambda writer, size, native: [], {"spark_query_id": "q", "spark_batch_id": 3}, lambda c, ok: None
    )
    stopped: list[str] = []
    requests = SparkSavepointRequests(coordinator, str(tmp_path / "sp"), stopped.append)
    assert not requests.when_idle("q")  # no request: nothing read but the request file

    converting, release = threading.Event(), threading.Event()
    real = _honour.convert_to_savepoint

    def held(storage: Any, location: str, target: str) -> str:
        converting.set()
        assert release.wait(60)
        return real(storage, location, target)

    monkeypatch.setattr(_honour, "convert_to_savepoint", held)
    asker = threading.Thread(
        target=lambda: answers.append(request_savepoint(storage, "job", None, stop=True, timeout=120))
    )
    answers: list[SavepointResponse] = []
    asker.start()
    while storage.read_job_file("job", REQUEST_FILE) is None:
        time.sleep(0.01)
    assert not requests.when_idle("another-query")  # the newest checkpoint is not that query's
    idle = threading.Thread(target=requests.when_idle, args=("q",))
    idle.start()
    assert converting.wait(60)
    entered, refused = threading.Event(), []

    def batch() -> None:
        try:
            with requests.batch(4):
                entered.set()
        except CheckpointError as e:
            refused.append(str(e))

    starting = threading.Thread(target=batch)
    starting.start()
    assert not entered.wait(0.5)  # waits for the idle savepoint
    release.set()
    for t in (idle, starting, asker):
        t.join(120)
    (answer,) = answers
    assert answer.status == "completed" and answer.stopped and answer.batch_id == 3
    assert answer.checkpoint_id == coordinator.last_completed and location.endswith("chk-1")
    assert not entered.is_set() and "stopped with a savepoint after micro-batch 3" in refused[0]


def test_an_ended_watcher_answers_nothing_and_the_one_that_took_over_answers(tmp_path: Path) -> None:
    """A Connect query's watcher before its first batch, ended by that batch: the driver's answers."""
    from statekit.checkpoints._coordinator import CheckpointCoordinator, CheckpointPolicy
    from statekit.plugins._registry import default_registry
    from statekit.spark._savepoint_request import SparkSavepointRequests

    storage = FileSystemCheckpointStorage(str(tmp_path / "ckpt"))

    def coordinator() -> CheckpointCoordinator:
        return CheckpointCoordinator(
            storage, "job", max_parallelism=128, retained=2, native=False,
            policy=CheckpointPolicy("test", ""), registry=default_registry(),
        )  # fmt: skip

    coordinator().checkpoint(
        lambda writer, size, native: [], {"spark_query_id": "q", "spark_batch_id": 3}, lambda c, ok: None
    )
    before_first_batch = SparkSavepointRequests(coordinator(), str(tmp_path / "sp"), lambda q: None)
    before_first_batch.end_watch()
    answers: list[SavepointResponse] = []
    asker = threading.Thread(
        target=lambda: answers.append(request_savepoint(storage, "job", None, stop=False, timeout=120))
    )
    asker.start()
    while storage.read_job_file("job", REQUEST_FILE) is None:
        assert asker.is_alive()
        time.sleep(0.01)
    assert not before_first_batch.when_idle("q")  # ended: not even with a request pending
    assert storage.read_job_file("job", REQUEST_FILE) is not None  # left for the watcher that took over
    with before_first_batch.batch(4):  # nothing to wait for, not stopped
        pass
    drivers = SparkSavepointRequests(coordinator(), str(tmp_path / "sp"), lambda q: None)
    assert drivers.when_idle("q")
    asker.join(120)
    (answer,) = answers
    assert answer.status == "completed" and answer.batch_id == 3 and not answer.stopped
