"""The windowed job on Spark local[2], streaming, checked against a model of Spark's watermark rule."""

from __future__ import annotations

import os
from collections import Counter

import pytest

pytest.importorskip("pyspark")

from statekit_urlcount import (  # noqa: E402
    MALFORMED_KEY,
    WindowedSettings,
    generate_logs,
    read_output,
    read_timed_lines,
    run_windowed_job,
)

MINUTE = 60_000
DELAY = 10_000


def spark_model(files, delay=DELAY, size=MINUTE):
    """Spark's rule: batch ``b`` runs with the watermark of batches before it and fires at its end.

    ``files`` is one list of records per micro-batch. Returns the windows
    emitted, the late records per batch and the watermark after the last batch.
    """
    watermark = None
    open_windows: Counter[tuple[str, int]] = Counter()
    emitted: dict[tuple[str, int], int] = {}
    late: list[list[tuple[str, int]]] = []
    for records in files:
        newest, late_here = None, []
        for r in records:
            if r["url"] == MALFORMED_KEY:
                continue
            ts = r["time_ms"]
            if watermark is not None and ts <= watermark:
                late_here.append((r["url"], ts))
                continue
            open_windows[(r["url"], ts - ts % size)] += 1
            newest = ts if newest is None else max(newest, ts)
        if watermark is not None:
            for w in [w for w in open_windows if w[1] + size - 1 <= watermark]:
                emitted[w] = open_windows.pop(w)
        if newest is not None:
            watermark = newest - delay if watermark is None else max(watermark, newest - delay)
        late.append(late_here)
    return emitted, late, watermark


def test_streaming_windows_equal_the_model(tmp_path, local_spark):
    logs = tmp_path / "logs"
    gen = generate_logs(
        logs, records=1_800, files=3, n_urls=20, malformed_fraction=0.01, late_fraction=0.25, seed=9
    )
    # Spark's file source takes the oldest files first: one file per batch, in index order.
    for i, path in enumerate(gen.paths):
        os.utime(path, (1_700_000_000 + 10 * i, 1_700_000_000 + 10 * i))
    files = [list(read_timed_lines([p])) for p in gen.paths]
    emitted, late, watermark = spark_model(files)
    assert emitted and sum(map(len, late)) > 5  # lines stamped back into the previous file

    settings = WindowedSettings(str(logs), str(tmp_path / "state"), delay="10 seconds")
    report = run_windowed_job(local_spark, settings)

    assert [b.batch_id for b in report.batches] == [0, 1, 2]
    assert [b.records for b in report.batches] == [len(f) for f in files]
    assert [b.late for b in report.batches] == [len(x) for x in late]
    assert report.watermark == watermark
    rows = read_output(settings.windows_dir)
    got = {(r["url"], r["window_start"]): r["requests"] for r in rows}
    assert len(got) == len(rows)  # each window once
    assert got == emitted
    assert all(r["window_end"] - r["window_start"] == MINUTE for r in rows)
    assert report.windows == len(rows)
    late_rows = read_output(settings.late_dir)
    assert Counter((r["batch"], r["url"], r["time_ms"]) for r in late_rows) == Counter(
        (b, url, ts) for b, batch in enumerate(late) for url, ts in batch
    )
    dead = read_output(settings.dead_letter_dir)
    assert len(dead) == report.malformed == report.state.malformed == gen.malformed_total
