"""The jobmanager storage: checkpoints in this process's memory, savepoints as files."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from statekit.backend_api import CheckpointStorage
from statekit.errors import CheckpointError, CheckpointNotFoundError, ConfigurationError
from statekit_storage import DEFAULT_MAX_STATE_SIZE, InlineStreamHandle, JobManagerCheckpointStorage


def _typecheck(storage: JobManagerCheckpointStorage) -> CheckpointStorage:
    return storage  # mypy: the class satisfies the contract


def test_checkpoints_live_in_memory(
    jobmanager: JobManagerCheckpointStorage, job_id: str, tmp_path: Path
) -> None:
    assert isinstance(jobmanager, CheckpointStorage)
    assert jobmanager.max_state_size == DEFAULT_MAX_STATE_SIZE == 5 * 1024 * 1024
    before = set(tmp_path.rglob("*"))
    for n in (2, 10, 1):
        writer = jobmanager.begin_checkpoint(job_id, n)
        assert writer.location == f"jobmanager://{job_id}/chk-{n}"
        assert writer.complete(f"meta-{n}".encode()) == writer.location
    assert set(tmp_path.rglob("*")) == before  # nothing written anywhere
    expected = [f"jobmanager://{job_id}/chk-{n}" for n in (1, 2, 10)]
    assert jobmanager.list_checkpoints(job_id) == expected
    assert jobmanager.latest_checkpoint(job_id) == expected[-1]
    # The object is the JobManager: another one (or a pickled copy) holds none of them.
    for other in (JobManagerCheckpointStorage(), pickle.loads(pickle.dumps(jobmanager))):
        assert other.list_checkpoints(job_id) == []
        with pytest.raises(CheckpointNotFoundError):
            other.read_metadata(expected[1])
    assert jobmanager.read_metadata(expected[1]) == b"meta-2"
    with pytest.raises(CheckpointError, match="already complete"):
        jobmanager.begin_checkpoint(job_id, 2).complete(b"again")

    jobmanager.discard_checkpoint(expected[0])
    assert jobmanager.list_checkpoints(job_id) == expected[1:]
    with pytest.raises(CheckpointNotFoundError, match="chk-1.*memory of the storage object"):
        jobmanager.read_metadata(expected[0])
    with pytest.raises(CheckpointNotFoundError, match="expected jobmanager://"):
        jobmanager.read_metadata(f"jobmanager://{job_id}")
    assert jobmanager.latest_checkpoint("nobody") is None
    jobmanager.forget_job(job_id)
    assert jobmanager.list_checkpoints(job_id) == []


def test_streams_are_inline_and_survive_json(jobmanager: JobManagerCheckpointStorage, job_id: str) -> None:
    writer = jobmanager.begin_checkpoint(job_id, 1)
    big = os.urandom(1 << 20)  # far above any inline threshold: still in memory
    handles = []
    for name, data, shared in (("keyed-op-0.bin", big, False), ("sst", b"shared", True), ("e", b"", False)):
        out = writer.create_stream(name, shared=shared)
        out.write(data[:10])
        out.write(data[10:])
        assert out.tell() == len(data)
        handles.append(out.close_and_get_handle())
    assert all(isinstance(h, InlineStreamHandle) for h in handles)
    metadata = json.dumps([h.to_json() for h in handles]).encode()
    location = writer.complete(metadata)
    descriptions = json.loads(jobmanager.read_metadata(location))
    resolved = [jobmanager.resolve_handle(location, d) for d in descriptions]
    assert [h.read() for h in resolved] == [big, b"shared", b""]
    assert resolved[0].read(100, 5) == big[100:105]
    jobmanager.discard_shared(location, descriptions[1])  # inline: nothing to delete
    with pytest.raises(CheckpointError, match="only inline"):
        jobmanager.resolve_handle(location, {"type": "file", "path": "x", "size": 1})


def test_handles_travel_between_processes(jobmanager: JobManagerCheckpointStorage, job_id: str) -> None:
    """An executor process writes a stream; the driver (this process) resolves its description."""
    code = (
        "import json, sys\n"
        "from statekit_storage import JobManagerCheckpointStorage\n"
        f"out = JobManagerCheckpointStorage().begin_checkpoint({job_id!r}, 7).create_stream('op.bin')\n"
        "out.write(bytes(range(256)) * 40)\n"
        "print(json.dumps(out.close_and_get_handle().to_json()))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    description = json.loads(result.stdout)
    location = jobmanager.begin_checkpoint(job_id, 7).complete(json.dumps([description]).encode())
    handle = jobmanager.resolve_handle(location, json.loads(jobmanager.read_metadata(location))[0])
    assert handle.read() == bytes(range(256)) * 40
    assert pickle.loads(pickle.dumps(handle)).read(0, 3) == b"\x00\x01\x02"


def test_abort_and_closed_streams(jobmanager: JobManagerCheckpointStorage, job_id: str) -> None:
    writer = jobmanager.begin_checkpoint(job_id, 1)
    out = writer.create_stream("x")
    out.write(b"abc")
    out.discard()
    with pytest.raises(CheckpointError, match="closed"):
        out.write(b"more")
    writer.abort()
    assert jobmanager.list_checkpoints(job_id) == []


def test_savepoints_are_files(jobmanager: JobManagerCheckpointStorage, job_id: str, tmp_path: Path) -> None:
    writer = jobmanager.begin_savepoint(job_id)
    assert writer.location.startswith(str(tmp_path / "savepoints" / f"savepoint-{job_id[:6]}-"))
    out = writer.create_stream("keyed-op-0.bin")
    out.write(b"s" * 30000)
    description = out.close_and_get_handle().to_json()
    assert description == {"type": "file", "path": "keyed-op-0.bin", "size": 30000}
    location = writer.complete(json.dumps(description).encode())
    assert (Path(location) / "_metadata").is_file()
    assert jobmanager.list_checkpoints(job_id) == []
    read_back = json.loads(jobmanager.read_metadata(location))
    assert jobmanager.resolve_handle(location, read_back).read(0, 3) == b"sss"
    with pytest.raises(CheckpointError, match="savepoints are never deleted"):
        jobmanager.discard_checkpoint(location)
    with pytest.raises(CheckpointError, match="not a jobmanager checkpoint"):
        jobmanager.discard_shared(location, read_back)
    assert (Path(location) / "keyed-op-0.bin").is_file()
    target = jobmanager.begin_savepoint(job_id, str(tmp_path / "elsewhere"))
    assert target.location.startswith(str(tmp_path / "elsewhere" / "savepoint-"))


def test_savepoint_needs_a_directory(job_id: str) -> None:
    with pytest.raises(ConfigurationError, match=r"set statekit\.savepoints\.dir"):
        JobManagerCheckpointStorage().begin_savepoint(job_id)


def test_max_state_size_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="max-state-size"):
        JobManagerCheckpointStorage(max_state_size=0)


def test_job_files_live_with_the_checkpoints_in_memory(jobmanager: JobManagerCheckpointStorage) -> None:
    jobmanager.write_job_file("job", "checkpoint-history.json", b"h")
    assert jobmanager.read_job_file("job", "checkpoint-history.json") == b"h"
    assert pickle.loads(pickle.dumps(jobmanager)).read_job_file("job", "checkpoint-history.json") is None
    jobmanager.forget_job("job")
    assert jobmanager.read_job_file("job", "checkpoint-history.json") is None
