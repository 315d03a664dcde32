"""The S3 endpoint stops while a Spark micro-batch uploads its checkpoint; the restarted query is exact.

The Spark half of tests/test_s3_outage.py: a real moto server on 127.0.0.1 (see
s3faults.py) that stops at the first upload into checkpoint 3, in the middle of
the tasks' uploads of micro-batch 2 (rocksdb: its new SST files are already in
``shared/`` by then, and cannot be deleted while the endpoint is down).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sparkutil import OUTPUT, assert_exact_outputs, assert_exact_state, stream_of, write_inputs

from jobs import CountUrls, make_records

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
pytest.importorskip("statekit_rocksdb")
from s3faults import FaultyS3, put_of, serving  # noqa: E402

BUCKET = "spark-outage"


@pytest.fixture
def faulty(s3_endpoint: dict[str, str]) -> Iterator[FaultyS3]:
    """A moto server of this test's own, serving one bucket; healed and stopped after the test."""
    with serving(BUCKET) as server:
        yield server


def keys(server: FaultyS3, prefix: str) -> list[str]:
    import boto3

    client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{prefix}/")
    return sorted(o["Key"].removeprefix(f"{prefix}/") for page in pages for o in page.get("Contents", []))


def test_endpoint_stops_mid_upload_the_batch_fails_and_the_restarted_query_is_exact(
    session: Any, tmp_path: Path, faulty: FaultyS3
) -> None:
    prefix, job = f"outage-{uuid.uuid4().hex[:8]}", "spark-outage"
    options = {
        "client_kwargs": {"endpoint_url": faulty.endpoint},
        "config_kwargs": {"connect_timeout": 2, "read_timeout": 5, "retries": {"max_attempts": 1}},
    }
    # Credentials as a user passes them to executors whose environment lacks them.
    secret = {"key": "testing", "secret": "testing"}
    for key, value in {
        "backend": "rocksdb",
        "parallelism": "2",
        "checkpoints.dir": f"s3://{BUCKET}/{prefix}",
        "checkpoint.storage.filesystem.storage-options": json.dumps(options),
        "checkpoint.storage.filesystem.secret-storage-options": json.dumps(secret),
        "checkpoint.storage.filesystem.inline-threshold": "0",
    }.items():
        session.conf.set(f"spark.statekit.{key}", value)
    records = make_records(1000, seed=31)
    write_inputs(tmp_path / "in", records, 5)  # one file per micro-batch: batches 0..4

    def start() -> Any:
        return (
            keyed_stream(session, tmp_path / "in", job)
            .write_files(str(tmp_path / "out"))
            .start(checkpoint_location=str(tmp_path / "spark"), trigger={"availableNow": True})
        )

    faulty.stop_at(put_of(f"/{prefix}/{job}/chk-3/"))
    query = start()
    with pytest.raises(Exception) as info:  # noqa: PT011 - Spark's StreamingQueryException
        query.awaitTermination()
    message = str(info.value)
    # The micro-batch failed naming the endpoint and a file of the job's checkpoints (Spark shows
    # the last task attempt's error: the upload into chk-3, or the retry's restore of chk-2).
    assert "CheckpointError" in message and f"s3://{BUCKET}/{prefix}/{job}/chk-" in message, message
    assert faulty.endpoint in message, message
    faulty.start()

    from statekit_storage import FileSystemCheckpointStorage

    storage = FileSystemCheckpointStorage(f"s3://{BUCKET}/{prefix}", storage_options={**options, **secret})
    # The previous checkpoint stays the latest: checkpoint 3 has no _metadata.
    assert storage.latest_checkpoint(job) == f"s3://{BUCKET}/{prefix}/{job}/chk-2"
    stored = keys(faulty, prefix)
    assert f"{job}/chk-3/_metadata" not in stored
    kept = shared_keys(storage, storage.latest_checkpoint(job), job)
    orphans = [k for k in stored if k.startswith(f"{job}/shared/") and k not in kept]
    assert orphans, stored  # the failed attempt's SST uploads, which it could not delete

    # The user restarts the query, same checkpoint location: Spark runs micro-batch 2 again, into
    # chk-4 (the failed query could not record its end, the endpoint being down when it ended: chk-3 is
    # skipped, as on the LocalRunner).
    query = start()
    query.awaitTermination()
    assert storage.latest_checkpoint(job) == f"s3://{BUCKET}/{prefix}/{job}/chk-6"
    assert_exact_state(storage, job, records)
    assert_exact_outputs(tmp_path / "out", records)
    # Nothing of the failed attempt is left: one checkpoint (retained 1), the shared files it
    # references, and the runs' records.
    stored = keys(faulty, prefix)
    wanted = shared_keys(storage, storage.latest_checkpoint(job), job)
    assert wanted and {k for k in stored if k.startswith(f"{job}/shared/")} == wanted
    assert {k.split("/")[1] for k in stored} == {"chk-6", "shared", "runs", "files"}


def shared_keys(storage: Any, location: str, job: str) -> set[str]:
    """The object keys of the shared files the checkpoint at ``location`` references."""
    from statekit.checkpointing import load_checkpoint

    handles = load_checkpoint(storage, location).metadata.shared_handles()
    return {f"{job}/shared/{d['path'].rsplit('/', 1)[1]}" for d in handles}


def keyed_stream(session: Any, directory: Path, job: str) -> Any:
    from statekit.spark import keyed

    return keyed(stream_of(session, directory), "url").process(CountUrls, OUTPUT, job_id=job)
