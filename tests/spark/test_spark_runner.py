"""statekit on a real local Spark: exact state and outputs per backend and storage, rescale, failures."""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from sparkutil import (
    OUTPUT,
    SCHEMA,
    assert_exact_outputs,
    assert_exact_state,
    read_outputs,
    restored_state,
    run_to_end,
    stream_of,
    write_inputs,
)

from jobs import SEEN, CountUrls, make_records, model_state
from statekit import LocalRunner, default_registry
from statekit.checkpointing import load_checkpoint
from statekit.errors import CheckpointError, ConfigurationError, UnknownPluginError
from statekit.spark import BatchInfo, keyed
from statekit.spark._upgrade import prepare_latest

RECORDS = make_records(2400)
BACKENDS = sorted(default_registry().backends())
# The in-memory default and the engines on disk (native checkpoints: incremental for rocksdb).
ON_DISK = [b for b in ("heap", "rocksdb", "lmdb") if b in BACKENDS]


def configure(session: Any, values: dict[str, Any]) -> None:
    for key, value in values.items():
        session.conf.set(key, str(value))


def two_subtasks_over_two_files(session: Any, tmp_path: Path) -> None:
    """Filesystem checkpoints under ``tmp_path``, parallelism 2, and RECORDS in two input files."""
    configure(
        session, {"spark.statekit.checkpoints.dir": tmp_path / "statekit", "spark.statekit.parallelism": 2}
    )
    write_inputs(tmp_path / "in", RECORDS, 2)


@pytest.fixture(params=["jobmanager", "filesystem", "s3"])
def storage_conf(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """Spark configuration selecting one checkpoint storage, by name."""
    if request.param == "jobmanager":
        return {"spark.statekit.checkpoint.storage": "jobmanager"}
    if request.param == "filesystem":
        return {"spark.statekit.checkpoints.dir": str(tmp_path / "statekit")}
    s3 = request.getfixturevalue("s3_endpoint")
    # Python workers do not share the driver's environment: everything s3fs needs travels
    # in the storage options, which the runner ships to the tasks with the configuration.
    options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": s3["endpoint_url"]}}
    return {
        "spark.statekit.checkpoint.storage": "filesystem",
        "spark.statekit.checkpoints.dir": f"s3://{s3['bucket']}/{uuid.uuid4().hex}",
        "spark.statekit.checkpoint.storage.filesystem.storage-options": json.dumps(options),
    }


def counting(
    session: Any, tmp_path: Path, job_id: str, infos: list[BatchInfo], function: Any = CountUrls
) -> Any:
    return (
        keyed(stream_of(session, tmp_path / "in"), "url")
        .process(function, OUTPUT, job_id=job_id, on_batch=infos.append)
        .write_files(str(tmp_path / "out"))
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_and_storage_counts_exactly(
    session: Any, storage_conf: dict[str, str], backend: str, tmp_path: Path, job_id: str
) -> None:
    configure(session, {**storage_conf, "spark.statekit.backend": backend, "spark.statekit.parallelism": 2})
    write_inputs(tmp_path / "in", RECORDS, 3)
    infos: list[BatchInfo] = []
    processed = counting(session, tmp_path, job_id, infos)
    run_to_end(processed, tmp_path / "spark")

    assert [(i.batch_id, i.checkpoint_id, i.skipped) for i in infos] == [(b, b + 1, False) for b in range(3)]
    assert sum(i.records for i in infos) == sum(i.outputs for i in infos) == len(RECORDS)
    assert [i.task_runs for i in infos] == [1, 1, 1]  # the sink's one action ran the tasks once
    storage = processed.checkpoint_storage()
    assert storage.name == ("jobmanager" if "jobmanager" in storage_conf.values() else "filesystem")
    meta = load_checkpoint(storage, storage.latest_checkpoint(job_id)).metadata
    assert meta.backend == backend and meta.checkpoint_id == 3 and meta.parallelism("process") == 2
    assert meta.properties["spark_batch_id"] == 2
    assert_exact_state(storage, job_id, RECORDS)
    assert_exact_outputs(tmp_path / "out", RECORDS)


@pytest.mark.parametrize("backend", ON_DISK)
def test_rescale_2_3_1_redistributes_state_by_key_group(
    session: Any, tmp_path: Path, job_id: str, backend: str
) -> None:
    configure(
        session, {"spark.statekit.checkpoints.dir": tmp_path / "statekit", "spark.statekit.backend": backend}
    )
    infos: list[BatchInfo] = []
    done = 0
    for run, (p, size) in enumerate([(2, 800), (3, 900), (1, 700)]):
        session.conf.set("spark.statekit.parallelism", str(p))
        write_inputs(tmp_path / "in", RECORDS[done : done + size], 2, start=2 * run)
        done += size
        processed = counting(session, tmp_path, job_id, infos)
        run_to_end(processed, tmp_path / "spark")  # the same query, restarted
        storage = processed.checkpoint_storage()
        meta = load_checkpoint(storage, storage.latest_checkpoint(job_id)).metadata
        assert meta.parallelism("process") == p
        assert infos[-1].parallelism == p and infos[-1].batch_id == 2 * run + 1
        assert restored_state(storage, job_id, parallelism=p) == model_state(RECORDS[:done])
        # Operator state moved too: each URL's first sighting, split over the new subtasks.
        runner = LocalRunner(CountUrls, key_selector=lambda r: r["url"], storage=storage, job_id=job_id,
                             config={"statekit.parallelism": p, "statekit.max-parallelism": 128,
                                     "statekit.backend": backend})  # fmt: skip
        runner.restore("latest")
        assert sum(len(ctx.get_list_state(SEEN).get()) for ctx in runner.subtasks) == len(
            {r["url"] for r in RECORDS[:done]}
        )
        runner.close()
    assert done == len(RECORDS)
    assert_exact_outputs(tmp_path / "out", RECORDS)


def test_spark_own_state_store_keeps_its_partition_count(session: Any, tmp_path: Path) -> None:
    """What statekit's rescale does that Spark's state stores cannot: they keep the first run's partitions."""
    sink_calls: list[int] = []

    def start(partitions: int) -> None:
        session.conf.set("spark.sql.shuffle.partitions", str(partitions))
        counts = stream_of(session, tmp_path / "in").groupBy("url").count()
        query = (
            counts.writeStream.outputMode("update")
            .foreachBatch(lambda df, b: sink_calls.append(b) if df.count() >= 0 else None)
            .option("checkpointLocation", str(tmp_path / "spark"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    write_inputs(tmp_path / "in", RECORDS[:400], 1)
    start(2)
    write_inputs(tmp_path / "in", RECORDS[400:800], 1, start=1)
    start(3)  # asks for three partitions...
    state_partitions = sorted(
        p.name for p in (tmp_path / "spark" / "state" / "0").iterdir() if p.name.isdigit()
    )
    assert sink_calls == [0, 1]
    assert state_partitions == ["0", "1"]  # ...and still has two: the checkpoint fixed them


# lmdb's task failures run nightly: its snapshots are the key-group native format the sqlite and
# kit tests cover, and its Spark path is the ordered engines' that rocksdb's case runs in ci.
@pytest.mark.parametrize(
    "backend", [b if b != "lmdb" else pytest.param(b, marks=pytest.mark.nightly) for b in ON_DISK]
)
def test_injected_task_failures_leave_state_and_outputs_exact(
    session: Any, tmp_path: Path, job_id: str, backend: str
) -> None:
    configure(
        session,
        {
            "spark.statekit.checkpoints.dir": tmp_path / "statekit",
            "spark.statekit.parallelism": 3,
            "spark.statekit.backend": backend,
        },
    )
    markers = tmp_path / "failures"
    markers.mkdir()
    write_inputs(tmp_path / "in", RECORDS, 4)
    infos: list[BatchInfo] = []
    flaky = functools.partial(sparkjobs_flaky(), str(markers), uuid.uuid4().hex)
    processed = counting(session, tmp_path, job_id, infos, function=flaky)
    run_to_end(processed, tmp_path / "spark")
    assert len(list(markers.iterdir())) >= 1, "no failure was injected: the test proves nothing"
    assert [i.batch_id for i in infos] == [0, 1, 2, 3]
    assert_exact_state(processed.checkpoint_storage(), job_id, RECORDS)
    assert_exact_outputs(tmp_path / "out", RECORDS)


def sparkjobs_flaky() -> Any:
    from sparkjobs import FlakyCountUrls

    return FlakyCountUrls


def test_a_batch_that_failed_after_its_sink_wrote_runs_again_exactly(
    session: Any, tmp_path: Path, job_id: str
) -> None:
    """The same batch twice: outputs written, then a failure before the checkpoint completes."""
    configure(
        session, {"spark.statekit.checkpoints.dir": tmp_path / "statekit", "spark.statekit.parallelism": 2}
    )
    write_inputs(tmp_path / "in", RECORDS, 4)
    calls: list[int] = []

    def sink(df: Any, batch_id: int) -> None:
        df.write.mode("overwrite").parquet(str(tmp_path / "out" / f"batch_id={batch_id}"))
        calls.append(batch_id)
        if batch_id == 1 and calls.count(1) == 1:
            raise RuntimeError("the driver fails after the sink wrote batch 1")

    infos: list[BatchInfo] = []

    def processed() -> Any:
        return (
            keyed(stream_of(session, tmp_path / "in"), "url")
            .process(CountUrls, OUTPUT, job_id=job_id, on_batch=infos.append)
            .foreach_batch(sink)
        )

    with pytest.raises(Exception, match="after the sink wrote batch 1"):
        run_to_end(processed(), tmp_path / "spark")
    storage = processed().checkpoint_storage()
    assert (
        load_checkpoint(storage, storage.latest_checkpoint(job_id)).metadata.properties["spark_batch_id"] == 0
    )
    run_to_end(processed(), tmp_path / "spark")
    assert calls == [0, 1, 1, 2, 3]
    assert [i.batch_id for i in infos] == [0, 1, 2, 3]
    assert_exact_state(storage, job_id, RECORDS)
    assert_exact_outputs(tmp_path / "out", RECORDS)


def _job_descriptions(session: Any, job_id: str) -> list[str]:
    """The descriptions of the Spark jobs statekit ran for ``job_id`` (Spark's status store)."""
    found = []
    jobs = session.sparkContext._jsc.sc().statusStore().jobsList(None)  # a Scala Seq
    for i in range(jobs.length()):
        d = jobs.apply(i).description()
        if d.isDefined() and f"statekit {job_id} " in d.get():
            found.append(d.get())
    return found


@pytest.mark.parametrize("reads", ["every row", "one row", "nothing"])
def test_the_sinks_job_runs_the_tasks_and_every_batch_commits_exactly(
    session: Any, tmp_path: Path, job_id: str, reads: str
) -> None:
    """A batch is one Spark job when the sink reads every partition; else the handle column is read."""
    two_subtasks_over_two_files(session, tmp_path)
    seen: list[int] = []

    def sink(df: Any, batch_id: int) -> None:
        if reads == "every row":
            seen.append(len(df.collect()))
        elif reads == "one row":
            seen.append(len(df.limit(1).collect()))

    infos: list[BatchInfo] = []
    processed = (
        keyed(stream_of(session, tmp_path / "in"), "url")
        .process(CountUrls, OUTPUT, job_id=job_id, on_batch=infos.append)
        .foreach_batch(sink)
    )
    run_to_end(processed, tmp_path / "spark")
    assert [(i.batch_id, i.checkpoint_id, i.skipped) for i in infos] == [(0, 1, False), (1, 2, False)]
    assert sum(i.records for i in infos) == sum(i.outputs for i in infos) == len(RECORDS)
    assert all("sink" not in i.phases and i.phases["tasks"] > 0 for i in infos)  # the sink's job ran them
    assert_exact_state(processed.checkpoint_storage(), job_id, RECORDS)
    jobs = _job_descriptions(session, job_id)
    for b in (0, 1):
        assert (f"statekit {job_id} batch {b}: tasks and sink" in jobs) == (reads != "nothing")
        # The handle column is read only when the sink's jobs did not run every partition.
        assert (f"statekit {job_id} batch {b}: tasks" in jobs) == (reads != "every row")
    assert seen == {"every row": [i.outputs for i in infos], "one row": [1, 1], "nothing": []}[reads]


def test_every_subtask_snapshots_each_batch_also_without_rows(
    session: Any, tmp_path: Path, job_id: str
) -> None:
    """The routing is in the query's plan, without marker rows: partition i is subtask i, rows or not."""
    configure(
        session, {"spark.statekit.checkpoints.dir": tmp_path / "statekit", "spark.statekit.parallelism": 4}
    )
    few = RECORDS[:2]  # two files of one record: at least two of the four subtasks get no row per batch
    write_inputs(tmp_path / "in", few, 2)
    infos: list[BatchInfo] = []
    processed = counting(session, tmp_path, job_id, infos)
    run_to_end(processed, tmp_path / "spark")
    assert [(i.batch_id, i.records, sorted(i.subtask_locations)) for i in infos] == [
        (0, 1, [0, 1, 2, 3]),
        (1, 1, [0, 1, 2, 3]),
    ]
    latest = infos[-1].location  # the one checkpoint retained
    assert latest is not None
    assert len(load_checkpoint(processed.checkpoint_storage(), latest).metadata.operators["process"]) == 4
    assert restored_state(processed.checkpoint_storage(), job_id, parallelism=4) == model_state(few)
    assert_exact_outputs(tmp_path / "out", few)


@pytest.mark.parametrize("storage", ["filesystem", "jobmanager"])
def test_restore_metadata_too_large_for_the_batch_plan_is_read_from_the_storage(
    session: Any, tmp_path: Path, job_id: str, storage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tasks in the query's plan take no broadcast: metadata past the inline limit comes from the storage,
    except from the jobmanager storage (in the driver only), whose metadata travels in the plan whatever
    its size."""
    import statekit.spark._driver as driver_module

    monkeypatch.setattr(driver_module, "_INLINE_METADATA", 0)
    conf: dict[str, Any] = {"spark.statekit.parallelism": 2}
    if storage == "filesystem":
        conf["spark.statekit.checkpoints.dir"] = tmp_path / "statekit"
    else:
        conf["spark.statekit.checkpoint.storage"] = "jobmanager"
    configure(session, conf)
    write_inputs(tmp_path / "in", RECORDS, 3)
    infos: list[BatchInfo] = []
    processed = counting(session, tmp_path, job_id, infos)
    run_to_end(processed, tmp_path / "spark")
    assert [(i.batch_id, i.restored_from is not None) for i in infos] == [(0, False), (1, True), (2, True)]
    assert_exact_state(processed.checkpoint_storage(), job_id, RECORDS)
    assert_exact_outputs(tmp_path / "out", RECORDS)


@pytest.mark.parametrize("thread", ["plain", "inheritable"])
def test_a_sink_acting_on_another_thread_needs_one_that_carries_spark_s_local_properties(
    session: Any, tmp_path: Path, job_id: str, thread: str
) -> None:
    """Each batch's part of the task plan travels with its Spark jobs, as a local property of the thread."""
    from pyspark import InheritableThread

    two_subtasks_over_two_files(session, tmp_path)
    counted: list[int] = []

    def sink(df: Any, batch_id: int) -> None:
        errors: list[BaseException] = []

        def act() -> None:
            try:
                counted.append(df.count())
            except BaseException as e:  # noqa: BLE001 - raised again on the sink's thread
                errors.append(e)

        worker = (InheritableThread if thread == "inheritable" else threading.Thread)(target=act)
        worker.start()
        worker.join()
        if errors:
            raise errors[0]

    processed = (
        keyed(stream_of(session, tmp_path / "in"), "url").process(CountUrls, OUTPUT, job_id=job_id)
    ).foreach_batch(sink)
    if thread == "inheritable":
        run_to_end(processed, tmp_path / "spark")
        assert sum(counted) == len(RECORDS)
        assert_exact_state(processed.checkpoint_storage(), job_id, RECORDS)
        return
    with pytest.raises(Exception) as e:
        run_to_end(processed, tmp_path / "spark")
    assert "local property statekit.batch.plan missing" in str(e.value)
    assert "pyspark.InheritableThread" in str(e.value)
    assert counted == [] and processed.checkpoint_storage().latest_checkpoint(job_id) is None


def test_a_sink_with_two_actions_runs_the_batch_again_from_its_checkpoint_and_counts_exactly(
    session: Any, tmp_path: Path, job_id: str
) -> None:
    """As Spark's foreachBatch, the sink's DataFrame is not cached: a second action runs the batch's
    tasks again, and the subtasks they find open already hold the batch, so they restore; the runs
    agree and the batch commits once, with one run's counts."""
    two_subtasks_over_two_files(session, tmp_path)
    seen: list[tuple[int, int]] = []

    def sink(df: Any, batch_id: int) -> None:
        seen.append((df.count(), len(df.collect())))

    infos: list[BatchInfo] = []
    processed = (
        keyed(stream_of(session, tmp_path / "in"), "url").process(
            CountUrls, OUTPUT, job_id=job_id, on_batch=infos.append
        )
    ).foreach_batch(sink)
    run_to_end(processed, tmp_path / "spark")
    assert [a == b for a, b in seen] == [True, True] and sum(a for a, _ in seen) == len(RECORDS)
    assert [(i.batch_id, i.records, i.outputs) for i in infos] == [(b, n, n) for b, (n, _) in enumerate(seen)]
    assert infos[1].restored_subtasks == 2 and infos[1].reused_subtasks == 0  # the second run restored
    assert [i.task_runs for i in infos] == [2, 2]
    assert_exact_state(processed.checkpoint_storage(), job_id, RECORDS)


@pytest.mark.parametrize("cache", ["auto", "always"])
def test_runs_of_a_batch_that_emit_different_rows_fail_it_uncommitted_unless_it_is_cached(
    session: Any, tmp_path: Path, job_id: str, cache: str
) -> None:
    """A function whose outputs are not determined by its records and state (here a random stamp),
    under a sink with two actions: with the outputs not cached the two runs differ and the batch fails
    before its checkpoint, naming the way out; cached (the way out), the batch runs once."""
    from sparkjobs import StampedCountUrls

    two_subtasks_over_two_files(session, tmp_path)
    configure(session, {"spark.statekit.spark.cache-output": cache})
    seen: list[set[str]] = []

    def sink(df: Any, batch_id: int) -> None:
        first = {r[0] for r in df.collect()}
        seen.append(first ^ {r[0] for r in df.collect()})  # the rows one action saw and the other not

    processed = (
        keyed(stream_of(session, tmp_path / "in"), "url").process(StampedCountUrls, OUTPUT, job_id=job_id)
    ).foreach_batch(sink)
    if cache == "always":
        run_to_end(processed, tmp_path / "spark")
        assert seen == [set(), set()]
        assert_exact_state(processed.checkpoint_storage(), job_id, RECORDS)
        return
    with pytest.raises(Exception) as e:
        run_to_end(processed, tmp_path / "spark")
    message = str(e.value)
    assert "micro-batch 0: the task of subtask" in message and "ran 2 times in this batch" in message
    assert "spark.statekit.spark.cache-output=always" in message and "df.persist()" in message
    assert len(seen) == 1 and seen[0]  # the sink saw two different outputs
    assert processed.checkpoint_storage().latest_checkpoint(job_id) is None


def test_a_replayed_batch_that_was_completed_is_skipped(session: Any, tmp_path: Path, job_id: str) -> None:
    """The driver died after completing checkpoint n, before Spark committed the batch."""
    two_subtasks_over_two_files(session, tmp_path)
    infos: list[BatchInfo] = []
    run_to_end(counting(session, tmp_path, job_id, infos), tmp_path / "spark")
    for name in ("1", ".1.crc"):  # Spark forgets it finished batch 1
        (tmp_path / "spark" / "commits" / name).unlink()
    processed = counting(session, tmp_path, job_id, infos)
    run_to_end(processed, tmp_path / "spark")
    assert [(i.batch_id, i.skipped, i.checkpoint_id, i.task_runs) for i in infos] == [
        (0, False, 1, 1),
        (1, False, 2, 1),
        (1, True, 2, 0),
    ]
    assert_exact_state(processed.checkpoint_storage(), job_id, RECORDS)
    assert_exact_outputs(tmp_path / "out", RECORDS)


def test_lost_jobmanager_checkpoints_stop_the_query_with_a_clear_error(
    session: Any, tmp_path: Path, job_id: str
) -> None:
    configure(session, {"spark.statekit.checkpoint.storage": "jobmanager", "spark.statekit.parallelism": 2})
    write_inputs(tmp_path / "in", RECORDS[:600], 1)
    processed = counting(session, tmp_path, job_id, [])
    run_to_end(processed, tmp_path / "spark")
    processed.checkpoint_storage().forget_job(job_id)  # as if the driver had been replaced
    write_inputs(tmp_path / "in", RECORDS[600:1200], 1, start=1)
    with pytest.raises(Exception, match="has no checkpoint: its state is lost"):
        run_to_end(counting(session, tmp_path, job_id, []), tmp_path / "spark")


def test_a_new_query_must_say_where_its_state_comes_from(
    session: Any, tmp_path: Path, job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(
        session, {"spark.statekit.checkpoints.dir": tmp_path / "statekit", "spark.statekit.parallelism": 2}
    )
    write_inputs(tmp_path / "in", RECORDS[:1000], 1)
    run_to_end(counting(session, tmp_path, job_id, []), tmp_path / "spark")

    write_inputs(tmp_path / "in2", RECORDS[1000:], 2)
    second = (
        keyed(stream_of(session, tmp_path / "in2"), "url")
        .process(CountUrls, OUTPUT, job_id=job_id)
        .write_files(str(tmp_path / "out"))
    )
    with pytest.raises(Exception, match="already has state"):
        run_to_end(second, tmp_path / "spark2")
    # The refused query left its first batch's offsets there: taking the state over on that location
    # would read that batch's input again from its own position. Refused before Spark starts.
    offsets = sorted(os.listdir(tmp_path / "spark2" / "offsets"))
    with pytest.raises(CheckpointError, match=r"spark2 belongs to query .*no committed micro-batch"):
        run_to_end(second, tmp_path / "spark2", restore="latest")
    assert sorted(os.listdir(tmp_path / "spark2" / "offsets")) == offsets
    storage = second.checkpoint_storage()
    first_state = restored_state(storage, job_id)
    # Where start() cannot see the location (a Spark Connect client given a relative path: it is the
    # server's), the driver refuses the query's first batch, before any state is touched.
    with monkeypatch.context() as m:
        m.setattr("statekit.spark._api.prepare_latest", lambda *a, **kw: None)
        with pytest.raises(Exception, match=r"spark2 runs micro-batch 0 of query .*not micro-batch 2 after"):
            run_to_end(second, tmp_path / "spark2", restore="latest")
    assert restored_state(storage, job_id) == first_state
    shutil.rmtree(tmp_path / "spark2")
    # A location start() seeded from the checkpoint is the new query's own: started again (after a crash
    # before its first checkpoint, say) it goes on from the seeded position.
    latest = load_checkpoint(storage, storage.latest_checkpoint(job_id))
    assert prepare_latest(str(tmp_path / "spark2"), latest, storage, job_id=job_id) is not None
    run_to_end(second, tmp_path / "spark2", restore="latest")
    assert_exact_state(storage, job_id, RECORDS)


def test_static_dataframe_runs_as_resumable_batches(session: Any, tmp_path: Path, job_id: str) -> None:
    configure(
        session, {"spark.statekit.checkpoints.dir": tmp_path / "statekit", "spark.statekit.parallelism": 3}
    )

    def run(records: list[dict[str, Any]], batch_id: int | None) -> BatchInfo:
        df = session.createDataFrame(records, SCHEMA)
        return (
            keyed(df, "url")
            .process(CountUrls, OUTPUT, job_id=job_id)
            .write_files(str(tmp_path / "out"))
            .run(batch_id=batch_id)
        )

    first = run(RECORDS[:1000], 0)
    assert (first.checkpoint_id, first.skipped, first.records) == (1, False, 1000)
    again = run(RECORDS[:1000], 0)  # a re-run of a batch that completed: nothing happens
    assert (again.checkpoint_id, again.skipped) == (1, True)
    second = run(RECORDS[1000:], None)  # the next batch id
    assert (second.batch_id, second.checkpoint_id, second.restored_from) == (1, 2, first.location)
    from statekit_storage import FileSystemCheckpointStorage

    storage = FileSystemCheckpointStorage(str(tmp_path / "statekit"))
    assert_exact_state(storage, job_id, RECORDS)
    assert sorted({b for _, _, b in read_outputs(tmp_path / "out")}) == [0, 1]
    assert_exact_outputs(tmp_path / "out", RECORDS)


def test_static_run_of_a_streaming_dataframe_is_refused(session: Any, tmp_path: Path) -> None:
    write_inputs(tmp_path / "in", RECORDS[:10], 1)
    processed = keyed(stream_of(session, tmp_path / "in"), "url").process(CountUrls, OUTPUT, job_id="x")
    with pytest.raises(TypeError, match="use start"):
        processed.run()


@pytest.mark.parametrize(
    ("key", "value", "error", "message"),
    [
        ("spark.statekit.backend", "nosuch", UnknownPluginError, "backend 'nosuch' is not installed"),
        (
            "spark.statekit.backend.heap.cache",
            "1",
            ConfigurationError,
            "unknown option statekit.backend.heap.cache",
        ),
        (
            "spark.statekit.checkpoints.dirr",
            "/tmp/x",
            ConfigurationError,
            "Did you mean statekit.checkpoints.dir",
        ),
        (
            "spark.statekit.parallelism",
            "lots",
            ConfigurationError,
            "invalid value 'lots' for statekit.parallelism",
        ),
        (
            "spark.statekit.checkpoint.storage",
            "nosuch",
            UnknownPluginError,
            "storage 'nosuch' is not installed",
        ),
    ],
)
def test_configuration_errors_are_those_outside_spark(
    session: Any, key: str, value: str, error: type[Exception], message: str
) -> None:
    session.conf.set(key, value)
    df = session.createDataFrame(RECORDS[:10], SCHEMA)
    processed = keyed(df, "url").process(CountUrls, OUTPUT, job_id="config")
    with pytest.raises(error, match=message) as on_spark:
        processed.run()
    from statekit import Configuration

    with pytest.raises(error) as outside:
        Configuration.from_mapping({key: value}).validate(default_registry())
    assert str(on_spark.value) == str(outside.value)


@pytest.mark.parametrize("typo", ["spark.python.deamon.module", "spark.pyhton.daemon.module"])
def test_a_misspelt_daemon_module_key_is_refused_where_spark_would_ignore_it(session: Any, typo: str) -> None:
    """Spark ignores a key it does not know; the daemon setting docs/spark.md asks for is checked here."""
    session.conf.set(typo, "statekit_spark_daemon")
    try:
        df = session.createDataFrame(RECORDS[:10], SCHEMA)
        processed = keyed(df, "url").process(CountUrls, OUTPUT, job_id="config")
        with pytest.raises(ConfigurationError, match=rf"unknown Spark setting {typo}; Did you mean "
                           r"spark\.python\.daemon\.module\?"):  # fmt: skip
            processed.run()
    finally:
        session.conf.unset(typo)


def test_jobmanager_size_limit_fails_the_batch(session: Any, job_id: str) -> None:
    configure(session, {"spark.statekit.checkpoint.storage": "jobmanager",
                        "spark.statekit.checkpoint.storage.jobmanager.max-state-size": "1k"})  # fmt: skip
    df = session.createDataFrame(RECORDS, SCHEMA)
    processed = keyed(df, "url").process(CountUrls, OUTPUT, job_id=job_id)
    with pytest.raises(Exception, match="over the 1,024-byte limit"):
        processed.run()
    assert processed.checkpoint_storage().latest_checkpoint(job_id) is None


@pytest.mark.parametrize("backend", ON_DISK)
def test_executors_reuse_open_state_between_batches(
    session: Any, tmp_path: Path, job_id: str, backend: str
) -> None:
    """With one subtask, one Python worker serves every batch and keeps its backend open."""
    configure(
        session,
        {
            "spark.statekit.checkpoints.dir": tmp_path / "statekit",
            "spark.statekit.parallelism": 1,
            "spark.statekit.backend": backend,
        },
    )
    write_inputs(tmp_path / "in", RECORDS[:1200], 3)
    infos: list[BatchInfo] = []
    processed = counting(session, tmp_path, job_id, infos)
    run_to_end(processed, tmp_path / "spark")
    assert infos[0].restored_subtasks == 1
    assert sum(i.reused_subtasks for i in infos[1:]) >= 1
    assert_exact_state(processed.checkpoint_storage(), job_id, RECORDS[:1200])
    if backend == "rocksdb":
        # The open instance lives in a directory Spark manages for the executor (SPARK_LOCAL_DIRS,
        # a block manager directory under spark.local.dir), not loose in the system's temp dir.
        local = Path(session.sparkContext.getConf().get("spark.local.dir", tempfile.gettempdir()))
        found = list(local.glob(f"*/statekit/{job_id}-process-0-*/rocksdb-*/db/CURRENT"))
        assert found, sorted(local.glob("*/statekit/*"))
        # A reused subtask checkpoints incrementally: the last checkpoint references earlier uploads.
        storage = processed.checkpoint_storage()
        last = load_checkpoint(storage, storage.latest_checkpoint(job_id)).metadata
        part = last.operators["process"][0].keyed
        assert part is not None and part["format"] == "statekit-rocksdb-1"
        ids = {f["checkpoint_id"] for f in part["native"]["files"]}
        assert min(ids) < last.checkpoint_id, ids


@pytest.mark.parametrize("backend", [b for b in ("heap", "rocksdb") if b in BACKENDS])
def test_every_subtask_reuses_open_state_on_an_executor_with_two_python_workers(
    session: Any, tmp_path: Path, job_id: str, backend: str
) -> None:
    """``local[2]``: three subtasks over two Python workers; Spark picks the worker, the hand-off fixes it.

    Without the hand-off about half of these subtask-batches restored (24-62 %
    reused in the benchmark), because a task goes to whichever worker of the
    executor has been idle longest.
    """
    configure(session, {"spark.statekit.checkpoints.dir": tmp_path / "statekit",
                        "spark.statekit.parallelism": 3, "spark.statekit.backend": backend})  # fmt: skip
    write_inputs(tmp_path / "in", RECORDS[:1800], 6)
    infos: list[BatchInfo] = []
    processed = counting(session, tmp_path, job_id, infos)
    run_to_end(processed, tmp_path / "spark")
    assert len(infos) == 6 and infos[0].restored_subtasks == 3
    for info in infos[1:]:
        assert info.reused_subtasks == 3 and info.restored_subtasks == 0, info
    assert_exact_state(processed.checkpoint_storage(), job_id, RECORDS[:1800])


@pytest.mark.parametrize("backend", [b for b in ("heap", "rocksdb") if b in BACKENDS])
def test_a_subtask_that_moved_restores_from_its_executors_local_copies(
    session: Any, tmp_path: Path, job_id: str, backend: str
) -> None:
    """Task-local recovery: state not open in the worker comes from the executor's local copies.

    Each ``run`` is a run of its own (a restart): its subtasks reuse the open state
    of the run before when it is exactly the checkpoint they restore and nothing
    they were made for changed, as Spark's own store finds its instance loaded. A
    changed configuration makes them restore, as a subtask whose task moved to
    another Python worker does. The executor kept a copy of every file the first
    run wrote, so that restore reads nothing from the storage; with local recovery
    off it does.
    """
    configure(session, {"spark.statekit.checkpoints.dir": tmp_path / "statekit",
                        "spark.statekit.checkpoint.storage.filesystem.inline-threshold": 0,
                        "spark.statekit.parallelism": 2, "spark.statekit.backend": backend})  # fmt: skip

    def run(records: list[dict[str, Any]]) -> BatchInfo:
        df = session.createDataFrame(records, SCHEMA)
        return keyed(df, "url").process(CountUrls, OUTPUT, job_id=job_id).run()

    first = run(RECORDS[:300])
    assert first.restored_subtasks == 2 and (first.restored_locally, first.restored_remotely) == (0, 0)
    assert first.locality == "on" and set(first.subtask_locations) == {0, 1}
    again = run(RECORDS[300:600])  # a restart, the same query: the open state is reused
    assert again.reused_subtasks == 2 and again.restored_subtasks == 0, again
    session.conf.set("spark.statekit.key-cache-size", 4096)  # a restart with another configuration
    second = run(RECORDS[600:1200])
    assert second.reused_subtasks == 0 and second.restored_locally == 2, second
    assert second.bytes_downloaded == 0 and second.phases["task_restore"] > 0
    df = session.createDataFrame(RECORDS[:1], SCHEMA)
    storage = keyed(df, "url").process(CountUrls, OUTPUT, job_id=job_id).checkpoint_storage()
    if backend == "rocksdb":
        # The restored checkpoint is the job's own: its SST files are referenced, not uploaded again.
        meta = load_checkpoint(storage, second.location).metadata
        ids = {f["checkpoint_id"] for st in meta.operators["process"] for f in st.keyed["native"]["files"]}
        assert again.checkpoint_id in ids, ids
    session.conf.set("spark.statekit.local-recovery", "false")
    third = run(RECORDS[1200:1800])
    assert third.restored_remotely == 2 and third.bytes_downloaded > 0, third
    assert_exact_state(storage, job_id, RECORDS[:1800])


def test_a_streaming_query_turns_aqe_off_in_its_own_session_only(
    session: Any, tmp_path: Path, job_id: str
) -> None:
    """As Spark does for stateful queries: AQE off for the query's batches from batch 0, the user's session
    unchanged, and no Spark job of the query outside statekit's jobs of each batch."""
    configure(
        session, {"spark.statekit.checkpoints.dir": tmp_path / "statekit", "spark.statekit.parallelism": 2}
    )
    session.conf.set("spark.sql.adaptive.enabled", "true")
    write_inputs(tmp_path / "in", RECORDS[:600], 2)
    seen: list[tuple[int, str, str, int]] = []

    def sink(df: Any, batch_id: int) -> None:
        conf = df.sparkSession.conf
        seen.append((batch_id, conf.get("spark.sql.adaptive.enabled"),
                     conf.get("spark.sql.inMemoryColumnarStorage.compressed"), df.count()))  # fmt: skip

    processed = keyed(stream_of(session, tmp_path / "in"), "url").process(CountUrls, OUTPUT, job_id=job_id)
    query = run_to_end(processed.foreach_batch(sink), tmp_path / "spark")
    # The batch's own cache is made uncompressed; the setting is back before the sink runs.
    assert seen == [(0, "false", "true", 300), (1, "false", "true", 300)]
    assert session.conf.get("spark.sql.adaptive.enabled") == "true"
    # The clone had AQE off from batch 0: under AQE, Spark's planning of batch 0 ran the routing's
    # shuffle as a job of its own before foreachBatch, outside the batch's jobs and local properties.
    jobs = session.sparkContext._jsc.sc().statusStore().jobsList(None)
    spark_own = []
    for i in range(jobs.length()):
        d = jobs.apply(i).description()
        if d.isDefined() and f"runId = {query.runId}" in d.get():
            spark_own.append(d.get())
    assert spark_own == []
    assert len([d for d in _job_descriptions(session, job_id) if " batch " in d]) == 2


def test_state_moves_between_spark_and_the_embedded_runner(session: Any, tmp_path: Path, job_id: str) -> None:
    """A Spark checkpoint restores into LocalRunner; its savepoint starts a Spark job at a new parallelism."""
    configure(
        session, {"spark.statekit.checkpoints.dir": tmp_path / "statekit", "spark.statekit.parallelism": 2}
    )
    first = keyed(session.createDataFrame(RECORDS[:1200], SCHEMA), "url").process(
        CountUrls, OUTPUT, job_id=job_id
    )
    first.run()
    runner = LocalRunner(CountUrls, key_selector=lambda r: r["url"], storage=first.checkpoint_storage(),
                         job_id=job_id, config={"statekit.parallelism": 3})  # fmt: skip
    runner.restore("latest")
    savepoint = runner.savepoint(str(tmp_path / "savepoints"))
    runner.close()

    session.conf.set("spark.statekit.parallelism", "4")
    second = keyed(session.createDataFrame(RECORDS[1200:], SCHEMA), "url").process(
        CountUrls, OUTPUT, job_id=f"{job_id}-2", allow_non_restored_state=True
    )
    info = second.run(restore=savepoint)
    assert (info.restored_from, info.parallelism) == (savepoint, 4)
    assert restored_state(second.checkpoint_storage(), f"{job_id}-2") == model_state(RECORDS)


def test_keys_and_columns_are_checked_before_anything_runs(session: Any) -> None:
    df = session.createDataFrame([(1, "GET")], "url bigint, request string")
    with pytest.raises(ConfigurationError, match="'url' is bigint, not a str column"):
        keyed(df, "url")
    with pytest.raises(ConfigurationError, match="not a column"):
        keyed(df, "path", key_type=int)
    with pytest.raises(ConfigurationError, match="reserved"):
        keyed(df.withColumnRenamed("request", "__statekit_x"), "url", key_type=int)
    with pytest.raises(ConfigurationError, match="reserved"):
        keyed(df, "url", key_type=int).process(CountUrls, "__statekit_handle string", job_id="x")
