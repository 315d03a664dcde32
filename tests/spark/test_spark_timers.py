"""Timers and event time on Spark: a windowed count, exact across rescales, task failures and restarts."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from sparkjobs import flaky_windowed_count

from statekit import EventTime
from statekit.spark import keyed
from statekit.timers import MAX_WATERMARK, MIN_WATERMARK

MINUTE = 60_000
DELAY = 20_000
URLS = [f"/u{i}" for i in range(7)]


def _batches(seed: int, n_batches: int, per_batch: int) -> list[list[tuple[str, int]]]:
    """Rows ``(url, event ms)``: mostly increasing, some within the delay, a few far behind (late)."""
    rnd = random.Random(seed)
    t = 0
    out = []
    for _ in range(n_batches):
        rows = []
        for _ in range(per_batch):
            t += rnd.randint(0, 4000)
            back = rnd.choice([0, 0, 0, rnd.randint(0, DELAY), rnd.randint(DELAY, 4 * MINUTE)])
            rows.append((rnd.choice(URLS), max(0, t - back)))
        out.append(rows)
    return out


def _model(
    batches: list[list[tuple[str, int]]],
) -> tuple[set[tuple[str, int, int, int]], list[int], list[int]]:
    """What Spark's watermark rule gives: windows emitted, late rows per batch, watermark after each batch.

    Batch ``b`` runs with the watermark of batches before it; rows at or below it
    are late; at its end windows whose last millisecond is at or below it fire;
    the last batch is the end of input.
    """
    wm = MIN_WATERMARK
    counts: dict[tuple[str, int], int] = {}
    emitted: set[tuple[str, int, int, int]] = set()
    lates, marks = [], []
    for i, rows in enumerate(batches):
        late = 0
        top = None
        for url, ts in rows:
            if ts <= wm:
                late += 1
                continue
            start = ts - ts % MINUTE
            counts[(url, start)] = counts.get((url, start), 0) + 1
            top = ts if top is None else max(top, ts)
        last = i == len(batches) - 1
        fire = MAX_WATERMARK if last else wm
        for (url, start), n in list(counts.items()):
            if start + MINUTE - 1 <= fire:
                emitted.add((url, start, start + MINUTE, n))
                del counts[(url, start)]
        lates.append(late)
        wm = MAX_WATERMARK if last else (wm if top is None else max(wm, top - DELAY))
        marks.append(wm)
    return emitted, lates, marks


@pytest.mark.parametrize("failures", [False, True], ids=["clean", "task-failures"])
def test_windowed_count_is_exact_across_rescales_failures_and_restarts(
    session: Any, job_id: str, tmp_path: Path, failures: bool
) -> None:
    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "ckpt"))
    markers = tmp_path / "markers"
    markers.mkdir()
    batches = _batches(seed=11, n_batches=4, per_batch=120)
    expected, expected_late, expected_marks = _model(batches)
    emitted: dict[int, list[tuple[str, int, int, int]]] = {}
    late_rows: dict[int, int] = {}
    factory = flaky_windowed_count(str(markers) if failures else "", seed=job_id)
    for b, (rows, p) in enumerate(zip(batches, [2, 3, 1, 2])):
        df = session.createDataFrame(rows, "url string, ms long").withColumn("ts", F.timestamp_millis("ms"))
        stream = (
            keyed(df, "url")
            .process(
                factory,
                "url string, start long, end long, n long",
                job_id=job_id,
                event_time=EventTime("ts", DELAY),
                config={"statekit.parallelism": p},
            )
            .foreach_batch(lambda out, bid: emitted.__setitem__(bid, [tuple(r) for r in out.collect()]))
            .foreach_late_batch(lambda late, bid: late_rows.__setitem__(bid, late.count()))
        )
        # Every run is a new driver-side coordinator: timers and the watermark come from the checkpoint.
        info = stream.run(batch_id=b, end_of_input=b == len(batches) - 1)
        assert info.parallelism == p
        assert info.late_records == expected_late[b]
        assert late_rows[b] == expected_late[b]
        assert info.watermark == expected_marks[b]
    got = [w for b in sorted(emitted) for w in emitted[b]]
    assert len(got) == len(set(got)), "a window was emitted twice"
    assert set(got) == expected
    assert sum(expected_late) > 0 and len(expected) > 20
    if failures:
        assert list(markers.iterdir()), "no failure was injected"
