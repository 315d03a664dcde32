"""Savepoints of a running Spark query (the CLI) and stop-with-savepoint (the API), restored exactly.

On the shared local session: a query runs on a file stream; the savepoint is
taken after the micro-batch that follows the request, restored into a new
query at another parallelism, and the state checked against the model.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from sparkutil import OUTPUT, assert_exact_state, driver_env, run_to_end, stream_of, wait_until, write_inputs

from jobs import COUNT, CountUrls, make_records
from statekit import (
    KeyedProcessFunction,
    ProcessContext,
    RuntimeContext,
    ValueStateDescriptor,
    default_registry,
)
from statekit.checkpointing import load_checkpoint, read_checkpoint_history
from statekit.spark import BatchInfo, keyed

RECORDS = make_records(1200, urls=40, seed=5)
# A native incremental backend when installed: the savepoint is canonical all the same.
BACKEND = "rocksdb" if "rocksdb" in default_registry().backends() else "heap"


def configure(session: Any, ckpt: Path, parallelism: int) -> None:
    session.conf.set("spark.statekit.checkpoints.dir", str(ckpt))
    session.conf.set("spark.statekit.parallelism", str(parallelism))
    session.conf.set("spark.statekit.backend", BACKEND)


def counting(session: Any, inputs: Path, job_id: str, infos: list[BatchInfo]) -> Any:
    return (
        keyed(stream_of(session, inputs), "url")
        .process(CountUrls, OUTPUT, job_id=job_id, on_batch=infos.append)
        .foreach_batch(lambda df, b: None)
    )


def restore_elsewhere(
    session: Any, tmp_path: Path, savepoint: str, more: list[dict[str, Any]], p: int
) -> Any:
    """A new query of a new job from ``savepoint`` at parallelism ``p``, over ``more`` rows; its storage."""
    configure(session, tmp_path / "restored", p)
    write_inputs(tmp_path / "in-restored", more, 1)
    infos: list[BatchInfo] = []
    processed = counting(session, tmp_path / "in-restored", "restored", infos)
    run_to_end(processed, tmp_path / "spark-restored", restore=savepoint)
    assert infos[-1].parallelism == p
    return processed.checkpoint_storage()


def test_cli_savepoint_of_an_idle_query_is_answered_at_once_and_restores_exactly_at_another_parallelism(
    session: Any, tmp_path: Path, job_id: str
) -> None:
    """Issue 43: no new input, no micro-batch: the newest checkpoint is the savepoint, answered at once."""
    ckpt = tmp_path / "statekit"
    configure(session, ckpt, 2)
    write_inputs(tmp_path / "in", RECORDS[:600], 2)
    infos: list[BatchInfo] = []
    processed = counting(session, tmp_path / "in", job_id, infos)
    query = processed.start(checkpoint_location=str(tmp_path / "spark"), trigger="0.5 seconds")
    try:
        wait_until(lambda: len(infos) >= 2, "the first two micro-batches")
        done = subprocess.run(
            [sys.executable, "-m", "statekit", "savepoint", "trigger", str(ckpt), "--job", job_id,
             "--target", str(tmp_path / "sp"), "--timeout", "300", "--json"],
            capture_output=True, text=True, env=driver_env(), check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        # Answered with no further micro-batch: the query had nothing to process.
        assert answer["status"] == "completed" and answer["batch_id"] == 1 and not answer["stopped"]
        assert [i.batch_id for i in infos] == [0, 1]
        assert query.isActive  # a savepoint without --stop: the query goes on
        write_inputs(tmp_path / "in", RECORDS[600:700], 1, start=2)
        wait_until(lambda: len(infos) >= 3, "a micro-batch after the savepoint")
    finally:
        query.stop()
    savepoint = answer["location"]
    meta = load_checkpoint(processed.checkpoint_storage(), savepoint).metadata
    assert meta.kind == "savepoint" and meta.properties["spark_batch_id"] == 1
    assert {st.keyed["format"] for st in meta.operators["process"]} == {"statekit-canonical"}
    history = read_checkpoint_history(processed.checkpoint_storage(), job_id)
    assert [(a.kind, a.status, a.batch_id) for a in history if a.batch_id == 1] == [
        ("checkpoint", "subsumed", 1),
        ("savepoint", "completed", 1),
    ]
    (saved,) = [a for a in history if a.kind == "savepoint"]
    assert saved.location == savepoint and saved.sizes.uploaded is None  # canonical
    storage = restore_elsewhere(session, tmp_path, savepoint, RECORDS[600:1200], 3)
    assert_exact_state(storage, "restored", RECORDS[:1200])


def test_a_request_no_query_answers_times_out_saying_so(session: Any, tmp_path: Path, job_id: str) -> None:
    ckpt = tmp_path / "statekit"
    configure(session, ckpt, 2)
    write_inputs(tmp_path / "in", RECORDS[:100], 1)
    run_to_end(counting(session, tmp_path / "in", job_id, []), tmp_path / "spark")  # ended: no query runs
    done = subprocess.run(
        [sys.executable, "-m", "statekit", "savepoint", "trigger", str(ckpt), "--job", job_id,
         "--target", str(tmp_path / "sp"), "--stop", "--timeout", "1.5"],
        capture_output=True, text=True, env=driver_env(), check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"no running query of job '{job_id}' answered the savepoint request within 1.5 s" in done.stderr
    assert not (ckpt / job_id / "files" / "savepoint-request.json").exists()  # withdrawn
    assert not (tmp_path / "sp").exists()


def test_stop_with_savepoint_processes_nothing_after_it_and_restores_exactly(
    session: Any, tmp_path: Path, job_id: str
) -> None:
    ckpt = tmp_path / "statekit"
    configure(session, ckpt, 2)
    write_inputs(tmp_path / "in", RECORDS[:500], 1)
    infos: list[BatchInfo] = []
    processed = counting(session, tmp_path / "in", job_id, infos)
    query = processed.start(checkpoint_location=str(tmp_path / "spark"), trigger="0.5 seconds")
    wait_until(lambda: len(infos) >= 1, "the first micro-batch")
    # The query is idle: the savepoint is its newest checkpoint, and the query stops at once.
    location = processed.stop_with_savepoint(str(tmp_path / "sp"), timeout=300)
    wait_until(lambda: not query.isActive, "the stop")
    write_inputs(tmp_path / "in", RECORDS[500:800], 1, start=1)  # arrives after the stop: never processed
    storage = processed.checkpoint_storage()
    latest = load_checkpoint(storage, storage.latest_checkpoint(job_id)).metadata
    assert [i.batch_id for i in infos] == [0] and latest.properties["spark_batch_id"] == 0
    saved = load_checkpoint(storage, location).metadata
    assert saved.kind == "savepoint" and saved.checkpoint_id == latest.checkpoint_id
    restored = restore_elsewhere(session, tmp_path, location, RECORDS[500:1000], 1)
    assert_exact_state(restored, "restored", RECORDS[:1000])


@pytest.fixture(autouse=True)
def _no_queries_left(session: Any) -> Any:
    yield
    for q in session.streams.active:
        q.stop()


class CountAsText(CountUrls):
    """The count's type changed incompatibly (``int`` → ``str``)."""

    def open(self, ctx: Any) -> None:
        from statekit import ValueStateDescriptor

        self.count = ctx.get_state(ValueStateDescriptor(COUNT.name, str, default=""))


def test_an_incompatible_state_fails_at_start_on_the_driver_before_any_micro_batch(
    session: Any, tmp_path: Path, job_id: str
) -> None:
    """Issue 42, point 5: not in every task at the first input, not an idle query holding doomed state."""
    from statekit.errors import IncompatibleSerializerError

    ckpt = tmp_path / "statekit"
    configure(session, ckpt, 2)
    write_inputs(tmp_path / "in", RECORDS[:200], 1)
    run_to_end(counting(session, tmp_path / "in", job_id, []), tmp_path / "spark")
    infos: list[BatchInfo] = []
    changed = (
        keyed(stream_of(session, tmp_path / "in"), "url")
        .process(CountAsText, OUTPUT, job_id=job_id, on_batch=infos.append)
        .foreach_batch(lambda df, b: None)
    )
    before = len(session.streams.active)
    for location, restore in ((tmp_path / "spark", None), (tmp_path / "spark-new", "latest")):
        with pytest.raises(
            IncompatibleSerializerError,
            match=rf"state '{COUNT.name}' was written as int and is declared as str",
        ):
            changed.start(checkpoint_location=str(location), trigger="0.5 seconds", restore=restore)
        assert len(session.streams.active) == before and infos == []  # no query started, no batch ran


@dataclasses.dataclass
class Hits:
    count: int = 0
    extra: int = 0


@dataclasses.dataclass
class HitsWithoutExtra:
    count: int = 0


class CountHits(KeyedProcessFunction):
    kind: type = Hits

    def open(self, ctx: RuntimeContext) -> None:
        self.hits = ctx.get_state(ValueStateDescriptor("hits", self.kind, default=self.kind()))

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        v = self.hits.value()
        v.count += 1
        self.hits.update(v)
        yield (ctx.current_key, v.count)


class CountHitsWithoutExtra(CountHits):
    kind = HitsWithoutExtra


def test_a_restore_that_drops_a_field_says_so_in_batch_info_and_the_history(
    session: Any, tmp_path: Path, job_id: str
) -> None:
    """Issue 42, point 4: not only in ``checkpoints inspect``."""
    ckpt = tmp_path / "statekit"
    configure(session, ckpt, 2)
    write_inputs(tmp_path / "in", RECORDS[:100], 1)
    for function, infos in ((CountHits, []), (CountHitsWithoutExtra, [])):
        if function is CountHitsWithoutExtra:
            write_inputs(tmp_path / "in", RECORDS[100:150], 1, start=1)
        processed = (
            keyed(stream_of(session, tmp_path / "in"), "url")
            .process(function, OUTPUT, job_id=job_id, on_batch=infos.append)
            .foreach_batch(lambda df, b: None)
        )
        run_to_end(processed, tmp_path / "spark")
    change = "HitsWithoutExtra: field 'extra' removed (its values are dropped)"
    assert [dict(i.dropped_fields) for i in infos] == [{"hits": [change]}]
    history = read_checkpoint_history(processed.checkpoint_storage(), job_id)
    assert history[-1].dropped_fields == {"hits": [change]} and history[0].dropped_fields == {}


def test_a_savepoint_asked_of_a_query_that_has_stopped_fails_at_once_naming_the_way_out(
    session: Any, tmp_path: Path, job_id: str
) -> None:
    """An availableNow query stops when its input is read: nothing would answer, so nothing is asked;
    the message names its newest checkpoint and the conversion, which restores exactly."""
    ckpt = tmp_path / "statekit"
    configure(session, ckpt, 2)
    write_inputs(tmp_path / "in", RECORDS[:600], 2)
    processed = counting(session, tmp_path / "in", job_id, [])
    run_to_end(processed, tmp_path / "spark")
    storage = processed.checkpoint_storage()
    latest = storage.latest_checkpoint(job_id)
    started = time.monotonic()
    with pytest.raises(Exception, match="has stopped") as e:
        processed.savepoint(str(tmp_path / "sp"), timeout=300)
    assert time.monotonic() - started < 60  # not the 300 s a request would have waited
    message = str(e.value)
    assert f"statekit savepoint convert {latest} --target {tmp_path / 'sp'}" in message
    assert "statekit savepoint trigger" in message
    assert not (tmp_path / "sp").exists()
    from statekit.checkpoints._savepoint_requests import REQUEST_FILE, job_files

    assert job_files(storage).read_job_file(job_id, REQUEST_FILE) is None  # nothing was requested
    command = ["savepoint", "convert", str(latest), "--target", str(tmp_path / "sp"), "--no-progress"]
    converted = subprocess.run(
        [sys.executable, "-m", "statekit", *command], capture_output=True, text=True, env=driver_env()
    )
    assert converted.returncode == 0, converted.stderr
    savepoint = next(p for p in (tmp_path / "sp").iterdir() if p.is_dir())
    more = make_records(300, urls=40, seed=9)
    restored = restore_elsewhere(session, tmp_path, str(savepoint), more, 3)
    assert_exact_state(restored, "restored", RECORDS[:600] + more)
