"""On Spark a damaged latest checkpoint never falls back: the query fails naming the file and the ways out.

Spark's offset log must match the statekit checkpoint a query continues from,
so restoring an older one would skip or double micro-batches. The documented
way out, an older checkpoint restored into a new query over the input after it,
is exact, and its checkpoints are numbered above the damaged one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sparkutil import OUTPUT, assert_exact_state, run_to_end, stream_of, write_inputs

from jobs import CountUrls, make_records
from statekit.checkpointing import load_checkpoint
from statekit.spark import BatchInfo, keyed

RECORDS = make_records(1800, urls=60, seed=5)


def query(session: Any, tmp_path: Path, job_id: str, source: str, infos: list[BatchInfo]) -> Any:
    return (
        keyed(stream_of(session, tmp_path / source), "url")
        .process(CountUrls, OUTPUT, job_id=job_id, on_batch=infos.append)
        .write_files(str(tmp_path / "out"))
    )


def three_batches(session: Any, tmp_path: Path, job_id: str) -> Path:
    """Checkpoints 1-3 of ``job_id`` after three micro-batches of 400 records; returns the job's dir."""
    for key, value in {
        "spark.statekit.checkpoints.dir": str(tmp_path / "statekit"),
        "spark.statekit.parallelism": "2",
        "spark.statekit.checkpoints.retained": "3",
        "spark.statekit.checkpoint.storage.filesystem.inline-threshold": "0",
        "spark.statekit.checkpoint.format": "canonical",  # heap's keyed files, which the tests damage
    }.items():
        session.conf.set(key, value)
    write_inputs(tmp_path / "in", RECORDS[:1200], 3)
    infos: list[BatchInfo] = []
    run_to_end(query(session, tmp_path, job_id, "in", infos), tmp_path / "spark")
    assert [i.checkpoint_id for i in infos] == [1, 2, 3]
    return tmp_path / "statekit" / job_id


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 4):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def way_out(session: Any, tmp_path: Path, job_id: str, job: Path) -> None:
    """Restore chk-2 into a new query over the input after it (file 3 and a new one): exact."""
    write_inputs(tmp_path / "after", RECORDS[800:1200], 1)
    write_inputs(tmp_path / "after", RECORDS[1200:], 1, start=1)
    infos: list[BatchInfo] = []
    processed = query(session, tmp_path, job_id, "after", infos)
    run_to_end(processed, tmp_path / "spark-new", restore=str(job / "chk-2"))
    assert infos[0].restored_from == str(job / "chk-2")
    # Above the damaged chk-3, never into it. The query before failed and recorded its end (its
    # awaitTermination raised), so no id is skipped: nothing of it may still be writing chk-4.
    assert [i.checkpoint_id for i in infos] == [4, 5]
    assert_exact_state(processed.checkpoint_storage(), job_id, RECORDS)


def test_a_damaged_block_fails_the_query_naming_the_file_and_the_way_out(
    session: Any, tmp_path: Path, job_id: str
) -> None:
    job = three_batches(session, tmp_path, job_id)
    (victim,) = (job / "chk-3").glob("process-1.keyed*")  # task files carry their attempt
    flip(victim)
    write_inputs(tmp_path / "in", RECORDS[1200:], 1, start=3)
    # At another parallelism every subtask must read chk-3's blocks (no open state is reused), from
    # the storage: the executor's intact local copies (task-local recovery) would spare it the damage.
    session.conf.set("spark.statekit.parallelism", "3")
    session.conf.set("spark.statekit.local-recovery", "false")
    with pytest.raises(Exception) as info:
        run_to_end(query(session, tmp_path, job_id, "in", []), tmp_path / "spark")
    text = str(info.value)
    assert f"CorruptCheckpointError: checkpoint {job / 'chk-3'}: {victim}: " in text
    assert "never falls back" in text and "restore=" in text
    session.conf.set("spark.statekit.parallelism", "2")
    session.conf.unset("spark.statekit.local-recovery")
    (tmp_path / "in" / "part-0003.json").unlink()
    way_out(session, tmp_path, job_id, job)


def test_a_damaged_metadata_fails_the_restart_and_an_older_checkpoint_restores_into_a_new_query(
    session: Any, tmp_path: Path, job_id: str
) -> None:
    job = three_batches(session, tmp_path, job_id)
    flip(job / "chk-3" / "_metadata")
    with pytest.raises(Exception) as info:
        run_to_end(query(session, tmp_path, job_id, "in", []), tmp_path / "spark")
    text = str(info.value)
    assert f"checkpoint {job / 'chk-3'}: {job / 'chk-3' / '_metadata'}: checksum mismatch" in text
    assert "never falls back" in text
    way_out(session, tmp_path, job_id, job)
    storage = query(session, tmp_path, job_id, "after", []).checkpoint_storage()
    assert load_checkpoint(storage, str(job / "chk-5")).checkpoint_id == 5
    assert not (job / "chk-6").exists()
