"""The checkpoint history: every attempt beyond retention, bounded, crash-safe, read by the CLI and the API.

Real parts: the LocalRunner, the filesystem storage on local files, the
jobmanager storage whose state size limit fails a checkpoint for real.
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from statekit import (
    KeyedProcessFunction,
    LocalRunner,
    ProcessContext,
    RecordSource,
    RuntimeContext,
    ValueStateDescriptor,
)
from statekit.checkpointing import CheckpointAttempt, read_checkpoint_history
from statekit.cli._cli import CommandContext, build_parser, main
from statekit.errors import CheckpointError
from statekit.state_processor import checkpoint_history

VALUE = ValueStateDescriptor("value", str)


class KeepValue(KeyedProcessFunction):
    """Keeps each record's ``value`` under its key: a big value makes a big state, a small one shrinks it."""

    def open(self, ctx: RuntimeContext) -> None:
        self.value = ctx.get_state(VALUE)

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        self.value.update(record["value"])
        return ()


def make_runner(conf: dict[str, Any]) -> LocalRunner:
    return LocalRunner(
        KeepValue,
        key_selector=lambda r: r["key"],
        # Canonical files: every checkpoint writes all it holds (the heap's native deltas reference
        # earlier ones, as rocksdb's files do: their sizes are the native cases' here).
        config={
            "statekit.parallelism": 2,
            "statekit.checkpoints.retained": 1,
            "statekit.checkpoint.format": "canonical",
            **conf,
        },
    )


def batch(i: int, *, big: bool = False) -> list[dict[str, Any]]:
    rows = [{"key": f"k{k}", "value": f"v{i}"} for k in range(20)]
    if big:
        rows.append({"key": "k0", "value": "x" * 10_000})
    return rows


def run_batches(r: LocalRunner, batches: list[list[dict[str, Any]]], first: int = 0) -> list[str]:
    """A checkpoint after each of ``batches[first:]``; the failures' messages.

    The source holds every batch's rows: a restored runner goes on from the position it restored.
    """
    src = RecordSource([row for rows in batches for row in rows])
    failures = []
    for rows in batches[first:]:
        r.run(src, max_records=len(rows))
        try:
            r.checkpoint()
        except CheckpointError as e:
            failures.append(str(e))
    return failures


def test_history_keeps_every_attempt_beyond_retention_with_a_failure_and_its_reason() -> None:
    # The jobmanager storage's state size limit fails checkpoint 3 for real (one big value); the
    # next batch shrinks it again and checkpoint 4 completes. Retention keeps one checkpoint.
    r = make_runner(
        {
            "statekit.checkpoint.storage": "jobmanager",
            "statekit.checkpoint.storage.jobmanager.max-state-size": 4000,
            "statekit.checkpoint.tolerable-failures": 1,
        }
    )
    failures = run_batches(r, [batch(1), batch(2), batch(3, big=True), batch(4), batch(5)])
    assert len(failures) == 1
    attempts = checkpoint_history("unused", "job", storage=r.storage)
    r.close()
    assert [(a.checkpoint_id, a.status) for a in attempts] == [
        (1, "subsumed"),
        (2, "subsumed"),
        (3, "failed"),
        (4, "subsumed"),
        (5, "completed"),
    ]
    failed = attempts[2]
    assert failed.failure is not None and "StateSizeLimitError" in failed.failure
    assert "4,000-byte limit" in failed.failure and failed.location.endswith("chk-3")
    done = attempts[-1]
    assert done.kind == "checkpoint" and done.runner == "LocalRunner"
    assert done.sizes.backend == "heap" and done.sizes.parallelism == 2
    assert done.sizes.full > 0 and done.sizes.written == done.sizes.full  # canonical: all written
    assert done.sizes.uploaded is None and done.sizes.referenced is None
    assert all(a.trigger_ms > 0 and a.duration_ms >= 0 for a in attempts)
    assert [a.trigger_ms for a in attempts] == sorted(a.trigger_ms for a in attempts)


def test_history_is_bounded_and_survives_restarts_and_savepoints(tmp_path: Path) -> None:
    conf = {"statekit.checkpoints.dir": str(tmp_path / "ckpt"), "statekit.checkpoints.history.max-entries": 4}
    r = make_runner(conf)
    six = [batch(i) for i in range(6)]
    run_batches(r, six[:3])
    savepoint = r.savepoint(str(tmp_path / "sp"))
    r.close()
    again = make_runner(conf)  # a new run appends to the job's history
    again.restore("latest")
    run_batches(again, six, first=3)
    again.close()
    attempts = read_checkpoint_history(again.storage, "job")
    assert len(attempts) == 4  # the newest 4 of 7 attempts
    assert [(a.kind, a.checkpoint_id) for a in attempts] == [
        ("savepoint", 3),
        ("checkpoint", 4),
        ("checkpoint", 5),
        ("checkpoint", 6),
    ]
    assert attempts[0].location == savepoint and attempts[0].status == "completed"
    assert [a.status for a in attempts[1:]] == ["subsumed", "subsumed", "completed"]


def test_the_history_is_written_once_per_checkpoint_with_what_retention_subsumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One file write per checkpoint (a PUT on S3): the completed attempt and the subsumed one together."""
    from statekit_storage import FileSystemCheckpointStorage

    writes: list[list[str]] = []
    real = FileSystemCheckpointStorage.write_job_file

    def counted(self: Any, job_id: str, name: str, data: bytes) -> None:
        real(self, job_id, name, data)
        writes.append([f"{a.checkpoint_id}:{a.status}" for a in read_checkpoint_history(self, job_id)])

    monkeypatch.setattr(FileSystemCheckpointStorage, "write_job_file", counted)
    r = make_runner({"statekit.checkpoints.dir": str(tmp_path / "ckpt")})  # retention keeps 1
    run_batches(r, [batch(i) for i in range(4)])
    r.close()
    assert writes == [
        ["1:completed"],
        ["1:subsumed", "2:completed"],
        ["1:subsumed", "2:subsumed", "3:completed"],
        ["1:subsumed", "2:subsumed", "3:subsumed", "4:completed"],
    ]


def test_history_off_records_nothing(tmp_path: Path) -> None:
    conf = {"statekit.checkpoints.dir": str(tmp_path / "ckpt"), "statekit.checkpoints.history.max-entries": 0}
    r = make_runner(conf)
    run_batches(r, [batch(1)])
    r.close()
    assert r.storage.latest_checkpoint("job") is not None
    assert read_checkpoint_history(r.storage, "job") == []
    assert not (tmp_path / "ckpt" / "job" / "files").exists()


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    r = make_runner({"statekit.checkpoints.dir": str(tmp_path / "ckpt")})
    run_batches(r, [batch(i) for i in range(3)])
    r.close()
    return tmp_path / "ckpt"


def test_cli_history_tsv_json_and_table(job_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoints", "history", str(job_dir), "--job", "job"]) == 0
    out, err = capsys.readouterr()
    header, *rows = out.splitlines()
    assert header.split("\t")[:3] == ["id", "kind", "status"]
    cells = [dict(zip(header.split("\t"), row.split("\t"), strict=True)) for row in rows]
    assert [(c["id"], c["status"]) for c in cells] == [
        ("1", "subsumed"),
        ("2", "subsumed"),
        ("3", "completed"),
    ]
    assert cells[-1]["location or failure"] == str(job_dir / "job" / "chk-3")
    assert cells[-1]["uploaded"] == "-" and cells[-1]["backend"] == "heap"
    assert "3 attempts of job job" in err
    assert main(["checkpoints", "history", str(job_dir), "--job", "job", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["checkpoint_id"] for r in records] == [1, 2, 3]
    assert CheckpointAttempt.from_json(records[-1]).to_json() == records[-1]
    assert {"trigger_ms", "duration_ms", "full_bytes", "written_bytes", "uploaded_bytes"} <= set(records[0])
    buf = io.StringIO()
    ctx = CommandContext(console=Console(file=buf, force_terminal=True, width=200, color_system=None))
    args = build_parser().parse_args(["checkpoints", "history", str(job_dir), "--job", "job"])
    assert args.run(args, ctx) == 0
    assert "│ subsumed" in buf.getvalue() and "referenced" in buf.getvalue()


def test_cli_history_shows_no_backend_or_parallelism_for_a_failed_savepoint() -> None:
    from statekit.cli._cli_history import HISTORY_COLUMNS, history_cells

    failed = CheckpointAttempt(
        4, "savepoint", "failed", 1_700_000_000_000, 2, "/sp", failure="CheckpointError: x"
    )
    cells = dict(zip(HISTORY_COLUMNS, history_cells(failed), strict=True))
    assert (cells["backend"], cells["parallelism"], cells["snapshot ms"]) == ("-", "-", "-")
    assert cells["location or failure"] == "CheckpointError: x"


def test_cli_history_of_an_unknown_job_is_a_clear_error(
    job_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["checkpoints", "history", str(job_dir), "--job", "nope"]) == 2
    assert "job 'nope' has no checkpoint history under" in capsys.readouterr().err


def _sealed(body: bytes) -> bytes:
    """A history file of ``body`` with a valid magic and checksum: damage the checksum cannot see."""
    import struct
    import zlib

    return b"STKHIST1" + body + struct.pack("<I", zlib.crc32(body))


def _flipped(data: bytes) -> bytes:
    out = bytearray(data)
    out[20] ^= 1
    return bytes(out)


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (_flipped, "checksum mismatch"),
        (lambda d: _sealed(d[8:-4].replace(b'"duration_ms":', b'"duration_ms":1e999,"x":', 1)), "1e999"),
        (lambda d: _sealed(d[8:-4].replace(b'"trigger_ms":', b'"trigger_ms":NaN,"x":', 1)), "NaN"),
        (lambda d: _sealed(d[8:-4][:-7]), "malformed"),  # bad JSON
        (lambda d: _sealed(b'{"version":1,"attempts":[1,2]}'), "not a list of objects"),
        (lambda d: _sealed(d[8:-4].replace(b'"kind":"checkpoint"', b'"kind":7', 1)), "kind is 7"),
        (lambda d: _sealed(b"\xff\xfe"), "malformed"),  # not UTF-8
    ],
    ids=["checksum", "1e999", "nan", "bad-json", "not-objects", "wrong-kind", "not-utf8"],
)
def test_a_damaged_history_is_named_by_readers_set_aside_and_rewritten_once(
    job_dir: Path, capsys: pytest.CaptureFixture[str], damage: Any, why: str
) -> None:
    history = job_dir / "job" / "files" / "checkpoint-history.json"
    damaged = damage(history.read_bytes())
    history.write_bytes(damaged)
    assert main(["checkpoints", "history", str(job_dir), "--job", "job"]) == 2
    err = capsys.readouterr().err
    assert f"{history}, is damaged: " in err and why in err and "Traceback" not in err
    r = make_runner({"statekit.checkpoints.dir": str(job_dir)})
    r.restore("latest")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_batches(r, [batch(i) for i in range(6)], first=3)  # three checkpoints: one warning
    r.close()
    mine = [str(w.message) for w in caught if "checkpoint history" in str(w.message)]
    assert len(mine) == 1, mine
    assert str(history) in mine[0] and "replaced by a new checkpoint history now" in mine[0]
    assert "kept as checkpoint-history.damaged.json" in mine[0]
    assert (history.parent / "checkpoint-history.damaged.json").read_bytes() == damaged
    assert [a.checkpoint_id for a in read_checkpoint_history(r.storage, "job")] == [4, 5, 6]
    assert main(["checkpoints", "history", str(job_dir), "--job", "job"]) == 0


def test_a_history_that_cannot_be_written_never_fails_the_checkpoint(job_dir: Path) -> None:
    # The job files' directory is taken by a file: every write of the history fails, the checkpoints go on.
    files = job_dir / "job" / "files"
    (files / "checkpoint-history.json").unlink()
    files.rmdir()
    files.write_bytes(b"in the way")
    r = make_runner({"statekit.checkpoints.dir": str(job_dir)})
    r.restore("latest")
    five = [batch(i) for i in range(5)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run_batches(r, five[:4], first=3) == []
    said = [str(w.message) for w in caught]
    assert any("cannot read" in m and "a new checkpoint history starts now" in m for m in said), said
    assert any("history could not be written" in m and "not affected" in m for m in said), said
    assert r.storage.latest_checkpoint("job") == str(job_dir / "job" / "chk-4")
    files.unlink()
    run_batches(r, five, first=4)  # the next write holds every attempt this run knows of
    r.close()
    assert [a.checkpoint_id for a in read_checkpoint_history(r.storage, "job")] == [4, 5]


def test_a_storage_without_job_files_says_it_keeps_no_history() -> None:
    class Bare:
        name = "bare"

    with pytest.raises(CheckpointError, match="bare checkpoint storage keeps no job files"):
        read_checkpoint_history(Bare(), "job")  # type: ignore[arg-type]
