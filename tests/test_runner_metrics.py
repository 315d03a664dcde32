"""The LocalRunner reports each checkpoint as the Spark runner reports each micro-batch.

Its :class:`~statekit.CheckpointInfo` (in ``RunResult.checkpoint_infos`` and
``on_checkpoint``) and its log line carry the same numbers, and the state's
size in them is what the state processor reads from the same checkpoint.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs import count_urls_runner, make_records, model_state, state_of_runner
from statekit import CheckpointInfo, LogSource, RecordSource
from statekit.checkpoints._history import read_checkpoint_history
from statekit.errors import SourceError
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


@pytest.mark.parametrize("backend", ["rocksdb", "heap"])
def test_native_checkpoints_count_their_entries_exactly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, backend: str
) -> None:
    """Issue 43: counted on write (state/_kvcount), not RocksDB's estimate, whose snapshots name no
    per-state bytes; the heap's base and deltas (its default checkpoint) name each state's entries
    and bytes, as a canonical snapshot does."""
    pytest.importorskip(f"statekit_{backend}")

    def run(fmt: str, into: str) -> list[CheckpointInfo]:
        runner = count_urls_runner(
            str(tmp_path / into),
            {
                "statekit.backend": backend,
                "statekit.checkpoint.format": fmt,
                "statekit.checkpoint.interval-records": 500,
                "statekit.checkpoints.retained": 10,
            },
        )
        result = runner.run(RecordSource(RECORDS))
        runner.close()
        return result.checkpoint_infos

    with caplog.at_level(logging.INFO, logger="statekit"):
        infos = run("native", "ckpt")
    for info in infos:
        s = info.stats
        read = entries_read(info.location)
        assert s.state_entries_exact and s.state_entries == sum(read.values())
        assert s.bytes_written + s.bytes_referenced == s.state_bytes + s.operator_state_bytes
        if backend == "heap":
            assert {n: z.entries for n, z in s.states.items()} == read
            assert all(z.bytes > 0 for z in s.states.values())
            assert sum(z.bytes for z in s.states.values()) < s.state_bytes  # the files' headers and index
        else:
            assert s.states == {}
    lines = fields_of(caplog)
    assert [f["state_entries_exact"] for f in lines] == ["1", "1"]
    if backend == "heap":
        assert lines[-1]["state.count.entries"] == str(infos[-1].stats.states["count"].entries)
        # The first checkpoint is a base: each state's bytes are those of the same state written canonically.
        canonical = run("canonical", "canonical")
        assert infos[0].stats.states == canonical[0].stats.states
        # The second is a delta: each state's bytes are the base's and the delta's, which a restore reads.
        second, again = infos[1].stats.states, canonical[1].stats.states
        assert {n: z.entries for n, z in second.items()} == {n: z.entries for n, z in again.items()}
        assert all(second[n].bytes > again[n].bytes for n in STATES)


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


def test_checkpoint_phases_are_the_same_numbers_in_every_channel(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 43: snapshot, upload, _metadata, duration: one meaning in CheckpointInfo, log and history."""
    runner = count_urls_runner(
        str(tmp_path / "ckpt"),
        {"statekit.checkpoint.interval-records": 500, "statekit.checkpoints.history.max-entries": 10},
    )
    with caplog.at_level(logging.INFO, logger="statekit"):
        result = runner.run(RecordSource(RECORDS))
    runner.close()
    infos = result.checkpoint_infos
    history = {a.checkpoint_id: a for a in read_checkpoint_history(runner.storage, runner.job_id)}
    lines = {int(f["checkpoint_id"]): f for f in fields_of(caplog)}
    assert len(infos) == 2
    for info in infos:
        t = info.timing
        assert t.upload > 0 and t.metadata > 0 and t.snapshot > 0  # every subtask wrote files of its own
        assert info.duration == pytest.approx(t.snapshot + t.upload + t.metadata)
        assert t.duration >= info.duration - 0.002  # trigger to _metadata holds the three
        a = history[info.checkpoint_id]
        ms = t.to_ms()
        assert (a.snapshot_ms, a.upload_ms, a.metadata_ms, a.duration_ms) == (
            ms["snapshot_ms"], ms["upload_ms"], ms["metadata_ms"], ms["duration_ms"]
        )  # fmt: skip
        assert ms["upload_ms"] == round(t.upload * 1000)
        f = lines[info.checkpoint_id]
        assert float(f["checkpoint_seconds"]) == round(info.duration, 6)
        for phase in ("snapshot", "upload", "metadata", "duration"):
            assert float(f[f"checkpoint_{phase}_seconds"]) == round(getattr(t, phase), 6)


def test_a_list_handed_again_after_a_restore_says_what_its_position_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 43: a list is positional (Flink's fromElements); the skipped records are reported."""
    records = RECORDS[:200]
    first = count_urls_runner(str(tmp_path / "ckpt"))
    assert first.run(records).records == 200
    first.close()
    again = count_urls_runner(str(tmp_path / "ckpt"))
    with caplog.at_level(logging.INFO, logger="statekit"):
        result = again.run(records, restore="latest")
    again.close()
    assert result.records == 0 and result.skipped_records == 200
    (warning,) = [
        r for r in caplog.records if r.levelno == logging.WARNING and "positional" in r.getMessage()
    ]
    assert "skipped the first 200 of the 200 records" in warning.getMessage()
    # A grown list goes on after the records already processed, and says so at INFO.
    grown = count_urls_runner(str(tmp_path / "ckpt"))
    result = grown.run(RECORDS[:250], restore="latest")
    grown.close()
    assert (result.records, result.skipped_records) == (50, 200)


def test_a_list_shorter_than_its_position_is_refused_and_one_after_a_savepoint_can_say_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A list that cannot be the input its position counts is refused, nothing read; the ways out work."""
    first, later = RECORDS[:200], RECORDS[200:260]
    runner = count_urls_runner(str(tmp_path / "ckpt"))
    assert runner.run(first).records == 200
    savepoint = runner.savepoint(str(tmp_path / "savepoints"))
    # The same runner handed a shorter list: its previous run's position (200) is past it.
    refused = r"position 200 \(left by this runner's previous run.*has 60 records"
    with pytest.raises(SourceError, match=refused):
        runner.run(later)
    runner.close()
    # A savepoint restored by restore() before run(): the same refusal, naming the way out; nothing read.
    again = count_urls_runner(str(tmp_path / "ckpt-2"))
    again.restore(savepoint)
    with pytest.raises(SourceError, match=r"position 200 \(restored.*input_begins_after_savepoint=True"):
        again.run(later)
    # The whole input goes on after the position, with nothing counted twice.
    assert again.run(first + later).records == 60
    assert state_of_runner(again) == model_state(first + later)
    again.close()
    # A list of only what came after the savepoint, said so: read from its first record.
    after = count_urls_runner(str(tmp_path / "ckpt-3"))
    result = after.run(later, restore=savepoint, input_begins_after_savepoint=True)
    assert (result.records, result.skipped_records) == (60, 0)
    assert state_of_runner(after) == model_state(first + later)
    after.close()
    # restore() then a longer list without saying so: it goes on at the position, with a WARNING.
    longer = count_urls_runner(str(tmp_path / "ckpt-4"))
    longer.restore(savepoint)
    with caplog.at_level(logging.INFO, logger="statekit"):
        result = longer.run(RECORDS[:300])
    longer.close()
    assert (result.records, result.skipped_records) == (100, 200)
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("position 200 (restored)" in r.getMessage() for r in warned)


class _Segment:
    """A user's replayable source: one segment of a log of records, its position an offset in it."""

    def __init__(self, records: list[dict[str, object]]) -> None:
        self.records = records

    def read(self, position: dict[str, int] | None) -> Iterator[tuple[object, object]]:
        start = position["offset"] if position else 0
        for offset in range(start, len(self.records)):
            yield self.records[offset], {"offset": offset + 1}


def test_input_begins_after_savepoint_drops_the_restored_position_of_every_source(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The statement is honoured for a user's source and a LogSource as for a list: read from the start."""
    first, later = RECORDS[:200], RECORDS[200:260]
    runner = count_urls_runner(str(tmp_path / "ckpt"))
    assert runner.run(_Segment(first)).records == 200
    savepoint = runner.savepoint(str(tmp_path / "savepoints"))
    runner.close()
    # A new segment of only what came after: its offsets restart at 0, below the restored 200.
    after = count_urls_runner(str(tmp_path / "ckpt-2"))
    with caplog.at_level(logging.INFO, logger="statekit"):
        result = after.run(_Segment(later), restore=savepoint, input_begins_after_savepoint=True)
    assert result.records == 60
    assert state_of_runner(after) == model_state(first + later)
    after.close()
    assert any("{'offset': 200}" in r.getMessage() and "dropped" in r.getMessage() for r in caplog.records)
    # A log file read whole, then replaced at its path by one of only the new lines (its inode
    # reused): said so, it is read from its start with no report of input lost.
    logs = tmp_path / "logs"
    logs.mkdir()
    access = logs / "access.log"
    access.write_text("".join(json.dumps(r) + "\n" for r in first))
    v1 = count_urls_runner(str(tmp_path / "ckpt-3"))
    assert v1.run(LogSource(str(logs), parse=json.loads)).records == 200
    log_savepoint = v1.savepoint(str(tmp_path / "savepoints"))
    v1.close()
    access.unlink()
    access.write_text("".join(json.dumps(r) + "\n" for r in later))
    v2 = count_urls_runner(str(tmp_path / "ckpt-4"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an InputLostWarning would be a false report here
        result = v2.run(
            LogSource(str(logs), parse=json.loads), restore=log_savepoint, input_begins_after_savepoint=True
        )
    assert (result.records, result.input_lost) == (60, [])
    assert state_of_runner(v2) == model_state(first + later)
    v2.close()
