"""Timers and event time on Spark: a windowed count, exact across rescales, failures, restarts, ends."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from sparkjobs import flaky_windowed_count

from statekit import EventTime
from statekit.spark import keyed
from statekit.spark._driver import MicroBatchDriver
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
    batches: list[list[tuple[str, int]]], ends: set[int] | None = None
) -> tuple[Counter[tuple[str, int, int, int]], list[int], list[int]]:
    """What Spark's watermark rule gives: windows emitted, late rows per batch, watermark after each batch.

    Batch ``b`` runs with the watermark of batches before it; rows at or below it
    are late; at its end windows whose last millisecond is at or below it fire.
    The batches in ``ends`` (default: the last) end an input: every open window
    fires, and the watermark stays the rows'.
    """
    ends = {len(batches) - 1} if ends is None else ends
    wm = MIN_WATERMARK
    counts: dict[tuple[str, int], int] = {}
    emitted: Counter[tuple[str, int, int, int]] = Counter()
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
        fire = MAX_WATERMARK if i in ends else wm
        for (url, start), n in list(counts.items()):
            if start + MINUTE - 1 <= fire:
                emitted[(url, start, start + MINUTE, n)] += 1
                del counts[(url, start)]
        lates.append(late)
        wm = wm if top is None else max(wm, top - DELAY)
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
    assert Counter(got) == expected
    assert sum(expected_late) > 0 and len(expected) > 20
    if failures:
        assert list(markers.iterdir()), "no failure was injected"


def _run_batch(
    session: Any,
    job_id: str,
    b: int,
    rows: list[tuple[str, int]],
    out: tuple[dict[int, list[Any]], dict[int, int]],
    *,
    end_of_input: bool,
) -> Any:
    """One static ``run`` of the windowed count over ``rows`` as batch ``b``, at parallelism 2."""
    df = session.createDataFrame(rows, "url string, ms long").withColumn("ts", F.timestamp_millis("ms"))
    emitted, late_rows = out
    stream = (
        keyed(df, "url")
        .process(
            flaky_windowed_count(""),
            "url string, start long, end long, n long",
            job_id=job_id,
            event_time=EventTime("ts", DELAY),
            config={"statekit.parallelism": 2},
        )
        .foreach_batch(lambda out, bid: emitted.__setitem__(bid, [tuple(r) for r in out.collect()]))
        .foreach_late_batch(lambda late, bid: late_rows.__setitem__(bid, late.count()))
    )
    return stream.run(batch_id=b, end_of_input=end_of_input)


def test_a_run_after_an_end_of_input_goes_on_from_the_rows_watermark(
    session: Any, job_id: str, tmp_path: Path
) -> None:
    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "ckpt"))
    batches = _batches(seed=23, n_batches=4, per_batch=80)
    ends = {1, 3}  # a bounded input of two batches, then one of two more batches
    expected, expected_late, expected_marks = _model(batches, ends)
    # Windows open at the first end fire there and again, with their later rows, in the second input.
    assert len({(url, start) for url, start, _, _ in expected}) < sum(expected.values())
    assert expected_late[2] < len(batches[2]) // 4
    out: tuple[dict[int, list[Any]], dict[int, int]] = ({}, {})
    for b, rows in enumerate(batches):
        info = _run_batch(session, job_id, b, rows, out, end_of_input=b in ends)
        assert info.late_records == out[1][b] == expected_late[b]
        assert info.watermark == expected_marks[b] < MAX_WATERMARK
    assert Counter(w for b in sorted(out[0]) for w in out[0][b]) == expected


def test_a_checkpoint_at_the_end_of_time_warns_when_rows_arrive(
    session: Any, job_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "ckpt"))
    batches = _batches(seed=5, n_batches=2, per_batch=40)
    out: tuple[dict[int, list[Any]], dict[int, int]] = ({}, {})
    with monkeypatch.context() as m:  # what statekit wrote before: the end of time as the watermark
        m.setattr(MicroBatchDriver, "_next_watermark", lambda self, current, reports, source: MAX_WATERMARK)
        first = _run_batch(session, job_id, 0, batches[0], out, end_of_input=True)
    assert first.watermark == MAX_WATERMARK and out[0][0]
    with pytest.warns(RuntimeWarning, match="end of time") as caught:
        info = _run_batch(session, job_id, 1, batches[1], out, end_of_input=False)
    assert info.late_records == out[1][1] == len(batches[1]) and out[0][1] == []
    assert info.watermark == MAX_WATERMARK and info.timers_fired == 0
    [warning] = [str(w.message) for w in caught.list if "end of time" in str(w.message)]
    assert first.location in warning and f"all {len(batches[1])} rows were late" in warning
