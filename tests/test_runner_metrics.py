"""The LocalRunner reports each checkpoint as the Spark runner reports each micro-batch.

Its :class:`~statekit.CheckpointInfo` (in ``RunResult.checkpoint_infos`` and
``on_checkpoint``) and its log line carry the same numbers, and the state's
size in them is what the state processor reads from the same checkpoint.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from jobs import count_urls_runner, make_records
from statekit import CheckpointInfo, RecordSource
from statekit.state_processor import SavepointReader

RECORDS = make_records(1000, urls=30)
STATES = ("bytes", "count", "last_methods")


def entries_read(location: str) -> dict[str, int]:
    """(key, namespace) entries per state, as the state processor reads them."""
    with SavepointReader.open(location) as reader:
        out = {}
        for name in STATES:
            table = reader.read_table("process", name)
            cols = [c for c in ("key", "namespace") if c in table.column_names]
            out[name] = len(set(zip(*(table.column(c).to_pylist() for c in cols))))
        return out


def fields_of(caplog: pytest.LogCaptureFixture) -> list[dict[str, str]]:
    return [
        dict(kv.split("=", 1) for kv in r.getMessage().split()[2:])
        for r in caplog.records
        if r.name == "statekit" and r.getMessage().startswith("statekit checkpoint ")
    ]


def test_each_checkpoint_is_reported_logged_and_exact(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runner = count_urls_runner(
        str(tmp_path / "ckpt"),
        {"statekit.checkpoint.interval-records": 300, "statekit.checkpoints.retained": 10},
    )
    called: list[CheckpointInfo] = []
    runner.on_checkpoint = called.append
    with caplog.at_level(logging.INFO, logger="statekit"):
        result = runner.run(RecordSource(RECORDS))
    runner.close()

    infos = result.checkpoint_infos
    assert called == infos and [i.location for i in infos] == result.checkpoints
    assert [i.records for i in infos] == [300, 300, 300, 100]  # the last one: the end of the input
    assert sum(i.outputs for i in infos) == len(RECORDS)
    for info in infos:
        read = entries_read(info.location)
        assert info.stats.state_entries_exact
        assert {n: s.entries for n, s in info.stats.states.items()} == read
        assert info.stats.state_entries == sum(read.values())
        assert info.duration > 0 and info.stats.bytes_written > info.stats.state_bytes > 0
    lines = fields_of(caplog)
    assert [int(f["checkpoint_id"]) for f in lines] == [i.checkpoint_id for i in infos]
    assert [int(f["records_in"]) for f in lines] == [i.records for i in infos]
    assert [int(f["state_entries"]) for f in lines] == [i.stats.state_entries for i in infos]
    assert lines[-1]["state.count.entries"] == str(infos[-1].stats.states["count"].entries)


def test_a_checkpoint_outside_run_counts_what_came_since(tmp_path: Path) -> None:
    runner = count_urls_runner(str(tmp_path / "ckpt"))
    result = runner.run(RecordSource(RECORDS), max_records=250)  # stops early: no checkpoint
    assert result.checkpoint_infos == []
    called: list[CheckpointInfo] = []
    runner.on_checkpoint = called.append
    runner.checkpoint()
    runner.close()
    assert [(c.records, c.outputs) for c in called] == [(250, 250)]
    assert result.checkpoint_infos == []  # the run had ended: its result is left alone


def test_native_checkpoints_say_their_entries_are_the_engines_estimate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("statekit_rocksdb")
    runner = count_urls_runner(
        str(tmp_path / "ckpt"), {"statekit.backend": "rocksdb", "statekit.checkpoint.interval-records": 500}
    )
    with caplog.at_level(logging.INFO, logger="statekit"):
        result = runner.run(RecordSource(RECORDS))
    runner.close()
    for info in result.checkpoint_infos:
        s = info.stats
        assert not s.state_entries_exact and s.states == {}
        assert s.bytes_written + s.bytes_referenced == s.state_bytes + s.operator_state_bytes
    assert [f["state_entries_exact"] for f in fields_of(caplog)] == ["0", "0"]


def test_metrics_off_write_no_line_but_keep_the_numbers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runner = count_urls_runner(
        str(tmp_path / "ckpt"),
        {"statekit.checkpoint.interval-records": 500, "statekit.metrics.enabled": False},
    )
    with caplog.at_level(logging.INFO, logger="statekit"):
        result = runner.run(RecordSource(RECORDS))
    runner.close()
    assert [i.records for i in result.checkpoint_infos] == [500, 500]
    assert fields_of(caplog) == []
