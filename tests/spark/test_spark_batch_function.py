"""Batch functions (KeyedBatchFunction, KeyedColumnsFunction) on a real local Spark.

Exact across rescales, task failures, restarts and event time.
"""

from __future__ import annotations

import functools
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from sparkutil import OUTPUT, assert_exact_outputs, restored_state, run_to_end, stream_of, write_inputs
from test_spark_timers import DELAY, MINUTE, _batches, _model

from jobs import make_records, model_state
from statekit import (
    EventTime,
    KeyedBatchFunction,
    MapStateDescriptor,
    OnTimerContext,
    ProcessContext,
    RuntimeContext,
)
from statekit.spark import BatchInfo, keyed

RECORDS = make_records(1800)


# The heap's bulk update (update_batch, over lazily restored key groups) runs in ci; rocksdb's goes
# through the ordered engines' path the per-record Spark tests cover, and runs nightly (ci's time).
# "columns" is a KeyedColumnsFunction: one call per batch and subtask.
@pytest.mark.parametrize(
    ("backend", "form"),
    [
        ("heap", "batch"),
        ("heap", "columns"),
        pytest.param("rocksdb", "batch", marks=pytest.mark.nightly),
        pytest.param("rocksdb", "columns", marks=pytest.mark.nightly),
    ],
)
def test_vectorized_count_is_exact_across_rescales_and_task_failures(
    session: Any, tmp_path: Path, job_id: str, backend: str, form: str
) -> None:
    from sparkjobs import FlakyCountUrlsBatch, FlakyCountUrlsColumns

    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "statekit"))
    session.conf.set("spark.statekit.backend", backend)
    markers = tmp_path / "failures"
    markers.mkdir()
    function = FlakyCountUrlsColumns if form == "columns" else FlakyCountUrlsBatch
    flaky = functools.partial(function, str(markers), uuid.uuid4().hex)
    infos: list[BatchInfo] = []
    done = 0
    for run, (p, size) in enumerate([(2, 1000), (3, 800)]):
        session.conf.set("spark.statekit.parallelism", str(p))
        write_inputs(tmp_path / "in", RECORDS[done : done + size], 2, start=2 * run)
        done += size
        processed = (
            keyed(stream_of(session, tmp_path / "in"), "url")
            .process(flaky, OUTPUT, job_id=job_id, on_batch=infos.append)
            .write_files(str(tmp_path / "out"))
        )
        run_to_end(processed, tmp_path / "spark")  # the same query, restarted at another parallelism
        assert infos[-1].parallelism == p
        storage = processed.checkpoint_storage()
        assert restored_state(storage, job_id, parallelism=p) == model_state(RECORDS[:done])
    assert list(markers.iterdir()), "no failure was injected: the test proves nothing"
    assert sum(i.records for i in infos) == sum(i.outputs for i in infos) == len(RECORDS)
    assert_exact_outputs(tmp_path / "out", RECORDS)


class WindowedCount(KeyedBatchFunction):
    """Requests per URL per minute of event time, a key's rows at once; each window emitted by its timer."""

    def open(self, ctx: RuntimeContext) -> None:
        self.windows = ctx.get_state(MapStateDescriptor("windows", int, int))

    def process_batch(self, rows: Any, ctx: ProcessContext) -> Any:
        for start, n in Counter(ms - ms % MINUTE for ms in rows.column("ms").to_pylist()).items():
            self.windows.put(start, (self.windows.get(start) or 0) + n)
            ctx.timer_service.register_event_time_timer(start + MINUTE - 1)
        return None

    def on_timer(self, timestamp: int, ctx: OnTimerContext) -> Any:
        start = timestamp + 1 - MINUTE
        n = self.windows.get(start)
        self.windows.remove(start)
        return {"url": [ctx.current_key], "start": [start], "end": [start + MINUTE], "n": [n]}


def test_vectorized_windows_follow_the_watermark_across_rescales(
    session: Any, job_id: str, tmp_path: Path
) -> None:
    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "ckpt"))
    batches = _batches(seed=12, n_batches=4, per_batch=120)
    expected, expected_late, expected_marks = _model(batches)
    emitted: list[tuple[str, int, int, int]] = []
    late: dict[int, int] = {}
    for b, (rows, p) in enumerate(zip(batches, [2, 3, 1, 2])):
        df = session.createDataFrame(rows, "url string, ms long").withColumn("ts", F.timestamp_millis("ms"))
        info = (
            keyed(df, "url")
            .process(WindowedCount, "url string, start long, end long, n long", job_id=job_id,
                     event_time=EventTime("ts", DELAY), config={"statekit.parallelism": p})
            .foreach_batch(lambda out, bid: emitted.extend(tuple(r) for r in out.collect()))
            .foreach_late_batch(lambda rows, bid: late.__setitem__(bid, rows.count()))
            .run(batch_id=b, end_of_input=b == len(batches) - 1)
        )  # fmt: skip
        assert (info.parallelism, info.late_records, info.watermark) == (
            p,
            expected_late[b],
            expected_marks[b],
        )
        assert late[b] == expected_late[b]
    assert len(emitted) == len(set(emitted)) and Counter(emitted) == expected
    assert sum(expected_late) > 0 and len(expected) > 20
