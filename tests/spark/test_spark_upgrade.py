"""Upgrades on Spark: a savepoint carries its source position, and every explicit restore is exact or refused.

The rows of issue 42's table, on the shared local session, with Spark's JSON
file source and with ``read_logs``: stop with a savepoint, then restore it
into a new query (new location, new job id) over the same input; restore it
on the savepoint's own location under a new job id (its batch must not run
twice); restore an older savepoint on a location that went on (refused, and
the way out exact). The state is read back with the state processor and
compared with a model of the input.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sparkutil import OUTPUT, run_to_end, stream_of, wait_until, write_inputs

from jobs import CountUrls, make_records
from statekit import LocalRunner
from statekit.checkpointing import load_checkpoint, read_checkpoint_history
from statekit.errors import CheckpointError
from statekit.spark import BatchInfo, keyed, read_logs
from statekit.state_processor import SavepointReader

RECORDS = make_records(400, urls=12, seed=11)
SCHEMA = "url string, request string, bytes long, ts long"


def counts(location: str) -> dict[str, int]:
    """The ``count`` state of every URL in the checkpoint or savepoint at ``location``."""
    with SavepointReader.open(location) as reader:
        return {row["key"]: row["value"] for b in reader.read("process", "count") for row in b.to_pylist()}


def model(records: list[dict[str, Any]]) -> dict[str, int]:
    return dict(Counter(r["url"] for r in records))


def latest_counts(processed: Any, job_id: str) -> dict[str, int]:
    storage = processed.checkpoint_storage()
    return counts(storage.latest_checkpoint(job_id))


class JsonInput:
    """Spark's JSON file source over a folder; ``add`` writes one more file of records."""

    def __init__(self, session: Any, folder: Path) -> None:
        self.session, self.folder, self.files = session, folder, 0

    def add(self, records: list[dict[str, Any]]) -> None:
        write_inputs(self.folder, records, 1, start=self.files)
        self.files += 1

    def stream(self) -> Any:
        return stream_of(self.session, self.folder, files_per_trigger=100)


class LogInput:
    """``read_logs`` over one growing log file; ``add`` appends records as JSON lines."""

    def __init__(self, session: Any, folder: Path) -> None:
        self.session, self.folder = session, folder
        folder.mkdir(parents=True, exist_ok=True)

    def add(self, records: list[dict[str, Any]]) -> None:
        with open(self.folder / "access.log", "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)

    def stream(self) -> Any:
        return read_logs(self.session, self.folder / "access.log", parse=json.loads, schema=SCHEMA)


def counting(source: Any, job_id: str, infos: list[BatchInfo] | None = None) -> Any:
    on_batch = infos.append if infos is not None else None
    return (
        keyed(source.stream(), "url")
        .process(CountUrls, OUTPUT, job_id=job_id, on_batch=on_batch)
        .foreach_batch(lambda df, b: None)
    )


def stop_with_savepoint(source: Any, job_id: str, location: Path, target: Path, more: list[Any]) -> str:
    """Run a query of ``job_id`` on ``location`` until ``more`` is processed, then stop it with a savepoint.

    The query is idle then (nothing new since its newest checkpoint), so the request is answered at
    once with that checkpoint converted (issue 43), whenever the request is seen: no race with a batch.
    """
    infos: list[BatchInfo] = []
    processed = counting(source, job_id, infos)
    query = processed.start(checkpoint_location=str(location), trigger="0.3 seconds")
    wait_until(lambda: len(infos) >= 1, "the first micro-batch")
    source.add(more)
    wait_until(lambda: len(infos) >= 2, "the micro-batch of the records added")
    saved = processed.stop_with_savepoint(str(target), timeout=180)
    wait_until(lambda: not query.isActive, "the query's stop")
    return str(saved)


@pytest.fixture(params=["json", "read_logs"])
def source_kind(request: Any) -> str:
    return str(request.param)


def make_source(kind: str, session: Any, folder: Path) -> Any:
    return JsonInput(session, folder) if kind == "json" else LogInput(session, folder)


def test_a_savepoint_carries_its_source_position_into_a_new_query_and_onto_its_own_location(
    session: Any, tmp_path: Path, job_id: str, source_kind: str
) -> None:
    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "statekit"))
    session.conf.set("spark.statekit.parallelism", "2")
    source = make_source(source_kind, session, tmp_path / "in")
    source.add(RECORDS[:100])
    source.add(RECORDS[100:150])
    savepoint = stop_with_savepoint(source, job_id, tmp_path / "spark", tmp_path / "sp", RECORDS[150:200])
    assert counts(savepoint) == model(RECORDS[:200])
    position = load_checkpoint_props(savepoint)["spark_position"]
    assert position["batch"] == 1 and "handle" in position
    source.add(RECORDS[200:260])  # after the savepoint

    # Row 1 (the docs' example): a new job on a new location over the same input: only what came after.
    infos: list[BatchInfo] = []
    new = counting(source, "upgraded", infos)
    run_to_end(new, tmp_path / "spark-new", restore=savepoint)
    assert latest_counts(new, "upgraded") == model(RECORDS[:260])
    assert infos[0].batch_id == 2 and infos[0].restored_from == savepoint
    assert {i.restore_origin for i in infos} == {savepoint}

    # The same script started again (as after a crash): it goes on, the restore is not taken twice.
    source.add(RECORDS[260:300])
    run_to_end(counting(source, "upgraded"), tmp_path / "spark-new", restore=savepoint)
    assert latest_counts(new, "upgraded") == model(RECORDS[:300])
    history = read_checkpoint_history(new.checkpoint_storage(), "upgraded")
    assert {a.restore_origin for a in history} == {savepoint}

    # Row 2: a new job on the savepoint's own location: Spark runs the saved batch again; it is skipped.
    infos = []
    same = counting(source, "same-location", infos)
    run_to_end(same, tmp_path / "spark", restore=savepoint)
    assert latest_counts(same, "same-location") == model(RECORDS[:300])
    assert all(not i.skipped or i.batch_id <= 1 for i in infos)


def load_checkpoint_props(location: str) -> dict[str, Any]:
    with SavepointReader.open(location) as reader:
        return dict(reader.checkpoint.metadata.properties)


def test_an_older_savepoint_on_a_location_that_went_on_is_refused_and_the_way_out_is_exact(
    session: Any, tmp_path: Path, job_id: str
) -> None:
    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "statekit"))
    source = JsonInput(session, tmp_path / "in")
    source.add(RECORDS[:80])
    older = stop_with_savepoint(source, job_id, tmp_path / "spark", tmp_path / "sp", RECORDS[80:120])
    # The query restarted on its location goes on past the savepoint (a bad deploy, say).
    source.add(RECORDS[120:200])
    processed = counting(source, job_id)
    run_to_end(processed, tmp_path / "spark")
    assert latest_counts(processed, job_id) == model(RECORDS[:200])
    # Rolling back to the older savepoint on that location: refused at start, before any batch.
    before = processed.checkpoint_storage().latest_checkpoint(job_id)
    with pytest.raises(CheckpointError, match="cannot be taken on query .* new checkpoint_location"):
        counting(source, job_id).start(checkpoint_location=str(tmp_path / "spark"), restore=older)
    assert processed.checkpoint_storage().latest_checkpoint(job_id) == before
    # A new query reading two sources cannot continue from a position of one: refused before Spark
    # starts, naming both counts, and the new location is left empty.
    other = JsonInput(session, tmp_path / "in-2")
    other.add(RECORDS[:5])
    two = keyed(source.stream().union(other.stream()), "url").process(CountUrls, OUTPUT, job_id=job_id)
    with pytest.raises(CheckpointError, match=r"1 source\(s\) after micro-batch .* reads 2 source\(s\)"):
        two.foreach_batch(lambda df, b: None).start(checkpoint_location=str(tmp_path / "two"), restore=older)
    assert not (tmp_path / "two").exists() or not any((tmp_path / "two").iterdir())
    # The way out: a new location restoring it; the input after the savepoint is read once.
    source.add(RECORDS[200:230])
    run_to_end(counting(source, job_id), tmp_path / "spark-rollback", restore=older)
    assert latest_counts(processed, job_id) == model(RECORDS[:230])
    # restore="latest" on another new location: the latest checkpoint's position comes along too.
    source.add(RECORDS[230:250])
    run_to_end(counting(source, job_id), tmp_path / "spark-latest", restore="latest")
    assert latest_counts(processed, job_id) == model(RECORDS[:250])


def test_a_savepoint_without_a_spark_position_is_refused_unless_the_input_begins_after_it(
    session: Any, tmp_path: Path, job_id: str
) -> None:
    ckpt = tmp_path / "statekit"
    session.conf.set("spark.statekit.checkpoints.dir", str(ckpt))
    runner = LocalRunner(
        CountUrls,
        key_selector=lambda r: r["url"],
        job_id="local",
        config={"statekit.checkpoints.dir": str(ckpt)},
    )
    runner.run(RECORDS[:50])
    local_savepoint = runner.savepoint(str(tmp_path / "sp-local"))
    runner.close()
    source = JsonInput(session, tmp_path / "in")
    source.add(RECORDS[50:90])
    with pytest.raises(
        CheckpointError, match="carries no Spark source position.*LocalRunner.*input_begins_after"
    ):
        counting(source, job_id).start(checkpoint_location=str(tmp_path / "spark"), restore=local_savepoint)
    assert not (tmp_path / "spark").exists() or not any((tmp_path / "spark").iterdir())
    processed = counting(source, job_id)
    run_to_end(processed, tmp_path / "spark", restore=local_savepoint, input_begins_after_savepoint=True)
    assert latest_counts(processed, job_id) == model(RECORDS[:90])

    # A checkpoint converted after its query's location was deleted: no position, said so.
    chk = processed.checkpoint_storage().latest_checkpoint(job_id)
    shutil.rmtree(tmp_path / "spark")
    from statekit.checkpoints._convert import convert_to_savepoint

    converted = convert_to_savepoint(processed.checkpoint_storage(), chk, str(tmp_path / "sp-converted"))
    assert "is gone or empty" in load_checkpoint_props(converted)["spark_position"]["missing"]
    with pytest.raises(CheckpointError, match="its Spark source position could not be copied"):
        counting(source, "other").start(checkpoint_location=str(tmp_path / "spark-2"), restore=converted)


def test_the_local_runner_refuses_a_spark_savepoint_unless_its_source_begins_after_it(
    session: Any, tmp_path: Path, job_id: str
) -> None:
    ckpt = tmp_path / "statekit"
    session.conf.set("spark.statekit.checkpoints.dir", str(ckpt))
    source = JsonInput(session, tmp_path / "in")
    source.add(RECORDS[:60])
    processed = counting(source, job_id)
    run_to_end(processed, tmp_path / "spark")
    storage = processed.checkpoint_storage()
    from statekit.checkpoints._convert import convert_to_savepoint

    savepoint = convert_to_savepoint(storage, storage.latest_checkpoint(job_id), str(tmp_path / "sp"))
    assert load_checkpoint(storage, savepoint).metadata.properties["spark_position"]["batch"] == 0

    def runner() -> LocalRunner:
        return LocalRunner(
            CountUrls, key_selector=lambda r: r["url"], job_id="local",
            config={"statekit.checkpoints.dir": str(ckpt), "statekit.parallelism": 2},
        )  # fmt: skip

    r = runner()
    with pytest.raises(CheckpointError, match="source position is Spark's.*input_begins_after_savepoint"):
        r.run(RECORDS[:60], restore=savepoint)
    r.close()
    r = runner()
    result = r.run(RECORDS[60:100], restore=savepoint, input_begins_after_savepoint=True)
    assert result.restored_from == savepoint and result.restore_origin == savepoint
    r.close()
    assert counts(r.storage.latest_checkpoint("local")) == model(RECORDS[:100])

    # On Spark the same savepoint (of micro-batch 0) continues after its files: seeded as batch 1 done.
    source.add(RECORDS[100:130])
    infos: list[BatchInfo] = []
    spark_again = counting(source, "spark-again", infos)
    run_to_end(spark_again, tmp_path / "spark-again", restore=savepoint)
    assert [i.batch_id for i in infos] == [2]
    assert latest_counts(spark_again, "spark-again") == model(RECORDS[:60] + RECORDS[100:130])


@pytest.fixture(autouse=True)
def _no_queries_left(session: Any) -> Any:
    yield
    for q in session.streams.active:
        q.stop()
