"""The S3 endpoint goes away in the middle of a checkpoint's uploads and of a restore, or answers slowly.

A real moto server on 127.0.0.1, stopped and started again (see s3faults.py).
The outcomes: the failing checkpoint names the endpoint and the file, the
previous checkpoint stays the latest, the LocalRunner goes on (up to
``statekit.checkpoint.tolerable-failures`` failures in a row), nothing
half-written is read as complete, and nothing of the failed checkpoints is left
after the next completed checkpoint's cleanup.
"""

from __future__ import annotations

import json
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from jobs import count_urls_runner, make_records, model_state, state_of_runner
from s3faults import FaultyS3, get_of, put_of, serving
from statekit import LocalRunner, RecordSource
from statekit.checkpointing import read_checkpoint_history
from statekit.errors import CheckpointError

pytest.importorskip("s3fs")
RECORDS = make_records(600, urls=30, seed=21)
BUCKET = "outage"


@pytest.fixture(scope="module")
def s3(s3_endpoint: dict[str, str]) -> Iterator[FaultyS3]:
    """Our own server (the session's stays up); s3_endpoint sets the dummy credentials."""
    with serving(BUCKET) as server:
        yield server


@pytest.fixture
def faulty(s3: FaultyS3) -> Iterator[FaultyS3]:
    """The server, serving, with no fault armed; restored after the test."""
    yield s3
    s3.heal()


def options(s3: FaultyS3, *, read_timeout: float = 5) -> dict[str, Any]:
    """Short timeouts and few retries, through the storage options (what a user would set)."""
    return {
        "client_kwargs": {"endpoint_url": s3.endpoint},
        "config_kwargs": {"connect_timeout": 2, "read_timeout": read_timeout, "retries": {"max_attempts": 1}},
        # fsspec's instance cache stays on, as by default: one client per set of options, not a
        # new one (a fifth of a second) for every file the storage opens.
    }


def make_runner(s3: FaultyS3, prefix: str, **conf: Any) -> LocalRunner:
    opts = {"statekit.checkpoint.storage.filesystem.storage-options": json.dumps(options(s3))}
    return count_urls_runner(f"s3://{BUCKET}/{prefix}", {**opts, **conf})


def stored(s3: FaultyS3, prefix: str) -> list[str]:
    client = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1")
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{prefix}/")
    return sorted(o["Key"].removeprefix(f"{prefix}/") for page in pages for o in page.get("Contents", []))


def test_endpoint_stops_mid_upload_the_job_goes_on_and_nothing_is_left(faulty: FaultyS3) -> None:
    prefix = f"mid-upload-{uuid.uuid4().hex[:8]}"
    conf = {"statekit.checkpoint.interval-records": 100, "statekit.checkpoint.tolerable-failures": 2}
    r = make_runner(faulty, prefix, **conf)
    src = RecordSource(RECORDS)
    assert len(r.run(src, max_records=200).checkpoints) == 2  # chk-1, chk-2
    # The second upload of checkpoint 3 finds the endpoint gone; it stays gone for checkpoint 4.
    faulty.stop_at(put_of("/chk-3/"), nth=2)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        failed = r.run(src, max_records=200)  # records 201..400: checkpoints 3 and 4 fail
    assert failed.checkpoints == [] and len(failed.failed_checkpoints) == 2
    message = failed.failed_checkpoints[0]
    assert faulty.endpoint in message and f"s3://{BUCKET}/{prefix}/job/chk-3/" in message, message
    faulty.start()
    # Nothing half-written reads as complete: chk-3 has files but no _metadata.
    assert any(k.startswith("job/chk-3/") for k in stored(faulty, prefix))
    assert r.storage.latest_checkpoint("job") == f"s3://{BUCKET}/{prefix}/job/chk-2"
    # The second failure came at its fencing check, before it took an id or wrote a byte: the
    # ids go on from there, and cleanup deletes what chk-3's failed attempt left.
    done = r.run(src)  # records 401..600: checkpoints 4 and 5 complete, and clean up
    assert [c.rsplit("/", 1)[1] for c in done.checkpoints] == ["chk-4", "chk-5"]
    # No orphans of the failed attempt (runs/ holds the record of this run, for fencing; files/
    # the checkpoint history).
    assert {k.split("/")[1] for k in stored(faulty, prefix)} == {"chk-5", "runs", "files"}
    # The history kept chk-3's failure and its reason, though the endpoint was down when it failed
    # (the history is written again by the next completed checkpoint); the second failure came
    # before it took an id: no attempt.
    attempts = read_checkpoint_history(r.storage, "job")
    assert [(a.checkpoint_id, a.status) for a in attempts] == [
        (1, "subsumed"), (2, "subsumed"), (3, "failed"), (4, "subsumed"), (5, "completed"),
    ]  # fmt: skip
    assert attempts[2].failure is not None and faulty.endpoint in attempts[2].failure
    fresh = make_runner(faulty, prefix)
    assert fresh.restore("latest") == f"s3://{BUCKET}/{prefix}/job/chk-5"
    assert state_of_runner(fresh) == model_state(RECORDS)


def test_more_failures_in_a_row_than_tolerable_fail_the_job_and_it_resumes_exactly(faulty: FaultyS3) -> None:
    prefix = f"tolerable-{uuid.uuid4().hex[:8]}"
    conf = {"statekit.checkpoint.interval-records": 100, "statekit.checkpoint.tolerable-failures": 1}
    records = RECORDS[:300]
    r = make_runner(faulty, prefix, **conf)
    src = RecordSource(records)
    r.run(src, max_records=100)  # chk-1
    faulty.stop_at(put_of("/chk-2/"))
    with pytest.warns(RuntimeWarning, match="checkpoint failed, the job goes on"):
        with pytest.raises(
            CheckpointError, match=r"2 checkpoints failed in a row, more than .*tolerable-failures=1"
        ):
            r.run(src)
    faulty.start()
    again = make_runner(faulty, prefix, **conf)
    assert (
        again.run(RecordSource(records), restore="latest").restored_from
        == f"s3://{BUCKET}/{prefix}/job/chk-1"
    )
    assert state_of_runner(again) == model_state(records)


def test_endpoint_stops_mid_restore_nothing_is_restored_and_it_restores_later(faulty: FaultyS3) -> None:
    prefix = f"mid-restore-{uuid.uuid4().hex[:8]}"
    r = make_runner(faulty, prefix)
    r.run(RecordSource(RECORDS))
    location = r.checkpoint()
    faulty.stop_at(get_of(".keyed"))
    broken = make_runner(faulty, prefix)
    with pytest.raises(CheckpointError) as info:
        broken.restore("latest")
    assert faulty.endpoint in str(info.value) and f"{location}/process-" in str(info.value)
    assert broken.position is None
    assert all(ctx.keyed_backend.num_entries() == 0 for ctx in broken.subtasks)
    faulty.start()
    fresh = make_runner(faulty, prefix)
    assert fresh.restore("latest") == location
    assert state_of_runner(fresh) == model_state(RECORDS)


def test_slow_endpoint_times_out_as_configured(faulty: FaultyS3, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads past ``read_timeout`` fail the restore (naming the endpoint); a longer timeout waits.

    Uploads are not timed here: s3fs retries a timed-out PUT on its own, so a slow
    upload ends up completing or failing with a connection error, not a timeout.
    """
    prefix = f"slow-{uuid.uuid4().hex[:8]}"
    r = make_runner(faulty, prefix)
    location = r.run(RecordSource(RECORDS[:50])).checkpoints[-1]  # the end of the input's checkpoint
    # Every answer comes after the impatient timeout (0.1 s) has passed, far within the patient one.
    faulty.delay, faulty.slow = 0.3, get_of(f"{prefix}/job/chk-1/process-")
    key = "statekit.checkpoint.storage.filesystem.storage-options"
    impatient = make_runner(faulty, prefix, **{key: json.dumps(options(faulty, read_timeout=0.1))})
    with monkeypatch.context() as m, pytest.raises(CheckpointError) as info:
        # s3fs retries a timed-out read 5 x 5 times with backoff (no storage option sets it):
        # the same error, half a minute later.
        m.setattr("s3fs.S3FileSystem.retries", 1)
        impatient.restore("latest")
    assert "timeout" in str(info.value).lower() and faulty.endpoint in str(info.value)
    assert all(ctx.keyed_backend.num_entries() == 0 for ctx in impatient.subtasks)
    patient = make_runner(faulty, prefix, **{key: json.dumps(options(faulty, read_timeout=10))})
    assert patient.restore("latest") == location  # the same slow answers, within the timeout
    assert state_of_runner(patient) == model_state(RECORDS[:50])
