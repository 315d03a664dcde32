"""The windowed job on the LocalRunner, checked against a plain Python model of the watermark rule."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from statekit import RecordSource
from statekit.timers import MAX_WATERMARK
from statekit_urlcount import (
    MALFORMED_KEY,
    BatchStats,
    PendingWindows,
    RunReport,
    WindowedSettings,
    generate_logs,
    pending_windows,
    read_timed_lines,
    windowed_local_runner,
)
from statekit_urlcount._cli import windowed_summary

MINUTE = 60_000
DELAY = 10_000
MEMORY = {"statekit.checkpoint.storage": "jobmanager"}


def local_model(records, delay=DELAY, size=MINUTE):
    """The LocalRunner's rule: the watermark is the newest event time minus ``delay``, after every record.

    Returns the windows emitted after each record (``{(url, start): requests}``,
    those whose last millisecond the watermark reached), what end of input
    emits, and the late records.
    """
    watermark, newest = None, None
    open_windows: Counter[tuple[str, int]] = Counter()
    steps, late = [], []
    for r in records:
        fired = {}
        ts = r["time_ms"]
        if r["url"] != MALFORMED_KEY:
            if watermark is not None and ts <= watermark:
                late.append(r)
            else:
                open_windows[(r["url"], ts - ts % size)] += 1
                if newest is None or ts > newest:
                    newest = ts
                    watermark = max(watermark if watermark is not None else ts - delay, ts - delay)
                    for w in [w for w in open_windows if w[1] + size - 1 <= watermark]:
                        fired[w] = open_windows.pop(w)
        steps.append(fired)
    return steps, dict(open_windows), late


def _windows(outputs):
    rows = [o for o in outputs if o[0] is not None]
    emitted = {(url, start): n for url, start, _, n, _, _ in rows}
    assert len(emitted) == len(rows), "a window was emitted twice"
    assert all(end - start == MINUTE for _, start, end, _, _, _ in rows)
    return emitted


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    out = tmp_path_factory.mktemp("logs")
    gen = generate_logs(
        out, records=6_000, files=3, n_urls=40, malformed_fraction=0.01, late_fraction=0.03, seed=5
    )
    return gen, list(read_timed_lines(gen.paths))


def test_windows_are_emitted_once_when_the_watermark_passes_them(logs, tmp_path):
    gen, records = logs
    steps, at_end, late = local_model(records)
    assert len(late) > 100  # the generator's delayed lines are late with a 10 s delay
    settings = WindowedSettings(str(tmp_path), str(tmp_path), parallelism=2)
    late_seen = []
    runner = windowed_local_runner(settings, late_sink=late_seen.append, config=MEMORY)
    dead = 0
    for record, expected in zip(records, steps):
        out = runner.process(record)
        dead += sum(1 for o in out if o[0] is None)
        assert _windows(out) == expected  # exactly the windows the watermark passed, at that record
    # The end of input moves the watermark to the end of time: the open windows, once each.
    assert _windows(runner.advance_watermark(MAX_WATERMARK)) == at_end
    assert runner.advance_watermark(MAX_WATERMARK) == []
    assert runner.late_records == len(late)
    assert late_seen == late
    assert dead == gen.malformed_total


def every_window(records):
    """The model's windows of a whole run (fired along the way and at the end), and its late lines."""
    steps, at_end, late = local_model(records)
    expected: dict[tuple[str, int], int] = {}
    for fired in steps:
        expected.update(fired)
    expected.update(at_end)
    return expected, late


def test_the_whole_run_equals_the_model(logs, tmp_path):
    gen, records = logs
    expected, late = every_window(records)
    out, late_seen = [], []
    runner = windowed_local_runner(
        WindowedSettings(str(tmp_path), str(tmp_path), parallelism=2),
        late_sink=late_seen.append,
        sink=out.append,
        config=MEMORY,
    )
    result = runner.run(records)
    assert _windows(out) == expected
    assert result.late_records == len(late) and late_seen == late
    # Every valid line is in exactly one window or late.
    assert sum(expected.values()) + len(late) == gen.valid
    assert [o[3] for o in out if o[0] is None] == list(range(1, gen.malformed_total + 1))


def test_windows_and_timers_survive_a_restore(logs, tmp_path):
    gen, records = logs
    expected, late = every_window(records)
    config = {"statekit.checkpoint.storage": "filesystem", "statekit.checkpoints.dir": str(tmp_path)}
    settings = WindowedSettings(str(tmp_path), str(tmp_path), parallelism=2)
    source = RecordSource(records)
    out, late_seen = [], []
    first = windowed_local_runner(settings, late_sink=late_seen.append, sink=out.append, config=config)
    first.run(source, max_records=2_500)  # stops mid-hour with windows open
    first.checkpoint()
    first.close()
    second = windowed_local_runner(settings, late_sink=late_seen.append, sink=out.append, config=config)
    result = second.run(source, restore="latest")
    assert result.restored_from is not None
    assert _windows(out) == expected
    assert late_seen == late


def test_a_window_size_of_five_minutes(logs):
    _, records = logs
    steps, at_end, late = local_model(records, size=5 * MINUTE)
    expected: dict[tuple[str, int], int] = {}
    for fired in steps:
        expected.update(fired)
    expected.update(at_end)
    out = []
    runner = windowed_local_runner(
        WindowedSettings("logs", "state", window="5 minutes"),
        late_sink=lambda r: None,
        sink=out.append,
        config=MEMORY,
    )
    runner.run(records)
    rows = [o for o in out if o[0] is not None]
    assert {(u, s): n for u, s, _, n, _, _ in rows} == expected
    assert all(e - s == 5 * MINUTE for _, s, e, _, _, _ in rows)


# --- a later run over newer logs, and what the summary line says is open -------------------------


def _totals(outputs):
    """Requests per (url, window start), added up over the results of a window emitted twice."""
    totals: Counter[tuple[str, int]] = Counter()
    for url, start, _, n, _, _ in (o for o in outputs if o[0] is not None):
        totals[(url, start)] += n
    return totals


@pytest.mark.parametrize("end_of_input", ["fire", "keep"])
def test_a_run_over_newer_logs_goes_on_after_the_end_of_input(logs, tmp_path, end_of_input):
    gen, records = logs
    expected, late = every_window(records)
    settings = WindowedSettings(str(tmp_path), str(tmp_path), parallelism=2)
    config = {
        "statekit.checkpoints.dir": settings.statekit_checkpoints,
        "statekit.checkpoint.interval-records": 500,
        "statekit.timers.end-of-input": end_of_input,
    }
    split = len(list(read_timed_lines(gen.paths[:2])))  # two log files now, the third one later
    first_out, second_out, late_seen = [], [], []
    first = windowed_local_runner(settings, late_sink=late_seen.append, sink=first_out.append, config=config)
    first.run(RecordSource(records[:split]), restore="latest")
    first.close()
    second = windowed_local_runner(
        settings, late_sink=late_seen.append, sink=second_out.append, config=config
    )
    result = second.run(RecordSource(records), restore="latest")
    second.close()
    # The newer logs were read, late exactly where one run over all of them finds lines late.
    assert result.records == len(records) - split and result.timers_fired > 0
    assert late_seen == late
    if end_of_input == "keep":  # nothing early: one uninterrupted run's windows, but those still open
        _, still_open, _ = local_model(records)
        assert {**_windows(first_out), **_windows(second_out)} == {
            w: n for w, n in expected.items() if w not in still_open
        }
        assert sorted(pending_windows(settings).ends) == sorted(start + MINUTE for _, start in still_open)
        assert not set(_windows(first_out)) & set(_windows(second_out))
    else:  # the windows open at the split were emitted at its end and again with their newer lines
        assert _totals(first_out + second_out) == expected
        assert set(_windows(first_out)) & set(_windows(second_out))


def test_pending_windows_are_the_open_windows_of_the_latest_checkpoint(logs, tmp_path):
    _, records = logs
    steps, at_end, _ = local_model(records)
    settings = WindowedSettings(str(tmp_path), str(tmp_path), parallelism=2)
    assert pending_windows(settings) == PendingWindows()  # no checkpoint yet
    config = {
        "statekit.checkpoints.dir": settings.statekit_checkpoints,
        "statekit.checkpoint.interval-records": 1_000,
        "statekit.timers.end-of-input": "keep",
    }
    with windowed_local_runner(settings, late_sink=lambda r: None, config=config) as runner:
        result = runner.run(RecordSource(records))
    pending = pending_windows(settings)
    assert sorted(pending.ends) == sorted(start + MINUTE for _, start in at_end)
    assert pending.watermark == result.watermark and pending.due == 0  # the LocalRunner fires at once


def _report(**batch):
    stats = BatchStats(batch_id=3, records=600, requests=590, malformed=10, urls_touched=0, seconds=1.0)
    return RunReport([dataclasses.replace(stats, **batch)], seconds=2.5)


def test_the_summary_line_says_which_windows_are_open():
    settings = WindowedSettings("logs", "state")
    minute = 1_555_545_600_000  # 2019-04-18T00:00:00Z
    watermark = minute + 50_000
    # The last batch emitted 7 windows; its watermark passed 2 more, emitted by the next batch.
    pending = PendingWindows(watermark, (minute, minute + MINUTE, minute + 50_001, minute + 2 * MINUTE))
    line = windowed_summary(_report(windows=7, late=4, watermark=watermark), settings, pending)
    assert line.startswith("windowed: read 600 new lines in 1 batch, 2.5 s; emitted 7 windows to ")
    assert "4 late lines" in line and "10 malformed lines" in line
    assert line.endswith(
        "watermark now 2019-04-18T00:00:50Z; 4 windows open in statekit's state, not emitted yet: 2 ending "
        "at or before it, emitted by the first batch of the next run (Spark runs one once newer logs "
        "arrive); 2 ending after it, emitted once newer logs move the watermark past their end"
    )
    line = windowed_summary(
        _report(restored_from="chk-3", started_from="chk-3"), settings, PendingWindows(watermark, ())
    )
    assert line.startswith("windowed: resumed from its checkpoint and read 600")
    assert line.endswith("watermark now 2019-04-18T00:00:50Z; no window is open")
