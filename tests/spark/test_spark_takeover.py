"""A second query on a job: refused without fencing the first, and told what taking over does (issue 33).

A user who started a second query on a running job got "already has state ...
pass restore='latest'"; following it took the job over, and the first query,
still running, died with a FencedError. The refusal now names the job's
newest run and when the latest checkpoint was written, and says that taking
over stops that run; and a query that is refused fences nobody.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from sparkutil import OUTPUT, stream_of, write_inputs

from jobs import CountUrls, make_records
from statekit.spark import BatchInfo, keyed
from statekit_storage import FileSystemCheckpointStorage


def test_a_refused_second_query_says_what_taking_over_does_and_fences_nobody(
    session: Any, job_id: str, tmp_path: Path
) -> None:
    records = make_records(400, urls=10, seed=5)
    write_inputs(tmp_path / "in", records[:200], 1)
    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "statekit"))
    session.conf.set("spark.statekit.parallelism", "2")
    first_batches: list[BatchInfo] = []

    def stream(on_batch: Any = None) -> Any:
        processed = keyed(stream_of(session, tmp_path / "in"), "url").process(
            CountUrls, OUTPUT, job_id=job_id, on_batch=on_batch
        )
        return processed.foreach_batch(lambda df, batch_id: df.count())

    first = stream(first_batches.append).start(
        checkpoint_location=str(tmp_path / "spark-1"), trigger="200 milliseconds"
    )
    try:
        first.processAllAvailable()
        second = stream().start(checkpoint_location=str(tmp_path / "spark-2"), trigger={"availableNow": True})
        with pytest.raises(Exception) as info:
            second.awaitTermination()
        message = " ".join(str(info.value).split())
        assert f"statekit job {job_id!r} already has state" in message
        assert "pass restore='latest' to start(), or use another job_id" in message
        assert "never recorded an end: it may still be running (or was killed)" in message
        assert "The latest checkpoint was written at " in message and " s ago)" in message
        assert "fences that run off: it stops with a FencedError at its next checkpoint" in message

        # The refused query claimed nothing: the first goes on with new input.
        runs = sorted(p.name for p in (tmp_path / "statekit" / job_id / "runs").iterdir())
        assert len(runs) == 1 and runs[0].startswith("run-1-")
        write_inputs(tmp_path / "in", records[200:], 1, start=1)
        first.processAllAvailable()
        assert first.exception() is None and first.isActive
        assert sum(b.records for b in first_batches) == len(records)
    finally:
        first.stop()
    storage = FileSystemCheckpointStorage(str(tmp_path / "statekit"))
    assert storage.latest_checkpoint(job_id) == first_batches[-1].location


def newest_run(tmp_path: Path, job_id: str) -> tuple[int, dict[str, Any]]:
    """The job's newest run record: its epoch and description."""
    newest = FileSystemCheckpointStorage(str(tmp_path / "statekit")).newest_run(job_id)
    assert newest is not None
    return newest[0], newest[2]


def test_a_query_that_ended_says_so_to_the_next(session: Any, job_id: str, tmp_path: Path) -> None:
    """A query stopped, run to its end, or failed records its run's end: the next query of the job reads
    that the run has ended (not that it may still be running) and numbers its checkpoints right on."""
    records = make_records(600, urls=10, seed=6)
    write_inputs(tmp_path / "in", records[:200], 1)
    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "statekit"))
    session.conf.set("spark.statekit.parallelism", "2")
    infos: list[BatchInfo] = []
    fail = {"now": False}

    def on_batch(info: BatchInfo) -> None:
        infos.append(info)
        if fail["now"]:
            raise RuntimeError("the sink's callback failed")

    def stream() -> Any:
        processed = keyed(stream_of(session, tmp_path / "in"), "url").process(
            CountUrls, OUTPUT, job_id=job_id, on_batch=on_batch
        )
        return processed.foreach_batch(lambda df, batch_id: df.count())

    # 1. Run to the end of its input (availableNow), awaited: ended.
    stream().start(
        checkpoint_location=str(tmp_path / "spark-1"), trigger={"availableNow": True}
    ).awaitTermination()
    assert newest_run(tmp_path, job_id)[1].get("ended_ms") is not None
    # The next query is still refused without restore=, and told the run has ended.
    with pytest.raises(Exception) as info:
        stream().start(
            checkpoint_location=str(tmp_path / "spark-2"), trigger={"availableNow": True}
        ).awaitTermination()
    message = " ".join(str(info.value).split())
    assert "already has state" in message
    ended = (
        r"Its newest run \w+ \(epoch 1\): Spark driver .* started \S+ ended at \S+ \(\d+ s ago\)\. The latest"
    )
    assert re.search(ended, message), message
    assert "(ended)" not in message
    assert "may still be running" not in message

    # 2. Stopped: ended, and the query after it numbers its checkpoints right after the latest.
    write_inputs(tmp_path / "in", records[200:400], 1, start=1)
    running = stream().start(checkpoint_location=str(tmp_path / "spark-1"), trigger="200 milliseconds")
    try:
        running.processAllAvailable()
    finally:
        running.stop()
    epoch, run = newest_run(tmp_path, job_id)
    assert run.get("ended_ms") is not None
    assert [i.checkpoint_id for i in infos] == [1, 2]  # no id skipped after the run before ended

    # 3. Failed while nobody waited on it: the savepoint watcher finds it ended.
    fail["now"] = True
    write_inputs(tmp_path / "in", records[400:], 1, start=2)
    failing = stream().start(checkpoint_location=str(tmp_path / "spark-1"), trigger="200 milliseconds")
    deadline = time.monotonic() + 180
    while True:  # the failed query's run (a newer epoch) has recorded its end
        newer, run = newest_run(tmp_path, job_id)
        if newer > epoch and run.get("ended_ms") is not None:
            break
        assert time.monotonic() < deadline, "the failed query's run never recorded its end"
        time.sleep(0.2)
    assert failing.exception() is not None and "the sink's callback failed" in str(failing.exception())
