"""LogSource on real files: every rotation and move of issue 22's table, counted exactly once or reported.

Then issues 32 and 33: what the source refuses to read (symlinks out, FIFOs,
sockets, directories) and paths that do not exist; lines longer than the
limit; the copytruncate window and what is (not) reported as lost; and
Debian's real ``logrotate`` with a writer appending.

Each test writes lines, runs the URL count to the end of its input (a job
restarted from its latest checkpoint), changes the files as a user or
logrotate would, runs again, and compares the counts with the model of every
well-formed line written (minus lines the test made unreadable, which must be
reported).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import tracemalloc
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from logfiles import (
    LOGROTATE,
    CountJob,
    LogDir,
    Logrotate,
    SeqJob,
    Writer,
    lines_in_files,
    rotated_away_unseen,
)
from statekit import BadRecord, InputLostWarning, LocalRunner, LogSource
from statekit.errors import BadRecordError, SourceError
from statekit.sources import LONG_LINE_HEAD, POSITION_TAG
from statekit.sources._files import open_candidate


@pytest.fixture
def logs(tmp_path: Path) -> LogDir:
    return LogDir(tmp_path)


@pytest.fixture
def job(logs: LogDir) -> CountJob:
    return CountJob(logs)


def run_quiet(job: CountJob, **kw: object) -> None:
    """A run that must report no lost input."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputLostWarning)
        job.run(**kw)  # type: ignore[arg-type]


def run_lost(job: CountJob, name: str) -> None:
    """A run that must report lost input, naming ``name``."""
    with pytest.warns(InputLostWarning, match=name):
        job.run()


def test_appends_across_runs(logs: LogDir, job: CountJob) -> None:
    logs.write("access.log", 100)
    run_quiet(job)
    assert job.exact()
    logs.write("access.log", 25)
    run_quiet(job)
    run_quiet(job)  # nothing new: nothing counted twice
    assert job.exact()


def test_copytruncate_copy_kept(logs: LogDir, job: CountJob) -> None:
    logs.write("access.log", 100)
    run_quiet(job)
    logs.write("access.log", 20)  # after the checkpoint, before the rotation: only in the copy
    logs.copytruncate("access.log", "access.log.1")
    logs.write("access.log", 30)
    run_quiet(job)
    assert job.exact()


def test_copytruncate_new_content_longer_than_the_offset(logs: LogDir, job: CountJob) -> None:
    logs.write("access.log", 100)
    run_quiet(job)
    logs.copytruncate("access.log", "access.log.1")
    logs.write("access.log", 150)  # past the saved offset: never read from the middle of a line
    run_quiet(job)
    assert job.exact()


def test_copytruncate_copy_moved_away_reports_the_loss(logs: LogDir, job: CountJob) -> None:
    logs.write("access.log", 100)
    run_quiet(job)
    logs.write("access.log", 30, counted=False)  # only in the copy, which leaves: lost
    logs.copytruncate("access.log", logs.away / "access.log.1")
    logs.write("access.log", 10)
    run_lost(job, "access.log")
    assert job.exact()


def test_copytruncate_copy_moved_away_longer_new_content(logs: LogDir, job: CountJob) -> None:
    logs.write("access.log", 100)
    run_quiet(job)
    logs.copytruncate("access.log", logs.away / "access.log.1")
    logs.write("access.log", 200)
    run_lost(job, "truncated")
    assert job.exact()


def test_rename_rotation(logs: LogDir, job: CountJob) -> None:
    logs.write("access.log", 100)
    run_quiet(job)
    logs.write("access.log", 10)  # lands in the renamed file
    logs.rename("access.log", "access.log.1")
    logs.write("access.log", 100)
    run_quiet(job)
    assert job.exact()


def test_rename_rotation_old_file_moved_away_reports_the_loss(logs: LogDir, job: CountJob) -> None:
    logs.write("access.log", 100)
    job.run(max_records=56)  # stops at a checkpoint, as a kill would: the source saw 44 lines it did not read
    unread = logs.path("access.log").stat().st_size - _end_of_line(logs, "access.log", 56)
    for line in _lines(logs, "access.log")[56:]:
        logs.uncount([str(line["url"])])
    logs.rename("access.log", "access.log.1")
    logs.move_away("access.log.1")
    logs.write("access.log", 100)
    with pytest.warns(
        InputLostWarning, match=rf"no longer among the watched files.*\({unread} bytes\) were not read"
    ):
        job.run()
    assert job.exact()
    run_quiet(job)  # reported once: the next position no longer holds the file
    assert job.exact()


def _end_of_line(logs: LogDir, name: str, n: int) -> int:
    """The byte offset after line ``n`` of ``name``."""
    return sum(len(x) + 1 for x in logs.path(name).read_bytes().split(b"\n")[:n])


def test_new_file_whose_name_sorts_first(logs: LogDir, job: CountJob) -> None:
    logs.write("b.log", 100)
    run_quiet(job)
    logs.write("a.log", 30)
    logs.write("b.log", 5)
    run_quiet(job)
    assert job.exact()


def test_current_file_renamed_to_a_dated_name(logs: LogDir, job: CountJob) -> None:
    logs.write("access.log", 100)
    run_quiet(job)
    logs.write("access.log", 10)
    logs.rename("access.log", "access.log-20250102")
    logs.write("access.log", 20)
    run_quiet(job)
    logs.write("access.log", 20)
    run_quiet(job)
    assert job.exact()


def test_a_file_read_to_its_end_then_deleted_is_no_loss(
    logs: LogDir, job: CountJob, caplog: pytest.LogCaptureFixture
) -> None:
    """An old rotation deleted (logrotate's ``rotate N``) after it was read: said at debug level only."""
    logs.write("a.log", 40)
    logs.write("b.log", 40)
    run_quiet(job)
    os.remove(logs.path("a.log"))
    logs.write("b.log", 10)
    logs.write("c.log", 10)
    with caplog.at_level(logging.DEBUG, logger="statekit.sources"):
        run_quiet(job)
    assert job.exact()
    assert "a.log (read to byte 1" in caplog.text and "read to its end as last seen" in caplog.text


def test_lost_input_fails_when_asked(logs: LogDir, job: CountJob) -> None:
    logs.write("access.log", 80)
    job.run(max_records=49)
    logs.move_away("access.log")
    with pytest.raises(SourceError, match=r"access\.log .*read to byte \d+, line 49.*bytes \d+-\d+"):
        job.run(on_lost="fail")


def test_last_line_without_newline_waits_for_it(logs: LogDir, job: CountJob) -> None:
    logs.write("a.log", 10)
    text, url = logs.line()
    logs.write_raw("a.log", text[:9].encode())  # half a line, still being written
    logs.write("b.log", 10)
    run_quiet(job)
    assert job.exact()  # the half line is not read
    logs.write_raw("a.log", text[9:].encode() + b"\n")
    logs.model[url] += 1
    logs.write("a.log", 3)
    run_quiet(job)
    assert job.exact()


def test_last_line_without_newline_read_once_the_file_is_idle(logs: LogDir, job: CountJob) -> None:
    logs.write("a.log", 10)
    text, url = logs.line()
    logs.write_raw("a.log", text.encode())  # complete JSON, no newline, never finished
    logs.model[url] += 1
    logs.write("b.log", 10)
    run_quiet(job, inactive_after=3600)
    assert job.counts.get(url, 0) == logs.model[url] - 1
    run_quiet(job, inactive_after=0)
    assert job.exact()
    logs.write("b.log", 5)
    run_quiet(job, inactive_after=0)  # the file that ended without newline is still recognised
    assert job.exact()


def test_a_single_file_and_its_rotations(logs: LogDir, tmp_path: Path) -> None:
    logs.write("access.log", 30)
    logs.write("other.log", 1000, counted=False)  # not watched
    src = LogSource(logs.path("access.log"), parse=json.loads)
    first = list(src.read(None))
    assert len(first) == 30
    logs.write("access.log", 5)
    logs.rename("access.log", "access.log.1")
    logs.write("access.log", 7)
    second = list(src.read(first[-1][1]))
    assert [r["seq"] for r, _ in second] == [r["seq"] for r in _lines(logs, "access.log.1")][30:] + [
        r["seq"] for r in _lines(logs, "access.log")
    ]


def _lines(logs: LogDir, name: str) -> list[dict[str, object]]:
    return [json.loads(x) for x in logs.path(name).read_text().splitlines()]


def test_compressed_rotations_are_not_read(logs: LogDir, job: CountJob) -> None:
    logs.write("access.log", 20)
    logs.write_raw("access.log.2.gz", b"\x1f\x8b\x08\x00binary\n")
    run_quiet(job)
    assert job.exact()


def test_killed_in_the_middle_resumes_exactly(logs: LogDir, job: CountJob) -> None:
    logs.write("a.log", 60)
    logs.write("b.log", 60)
    job.run(max_records=45)  # stops between checkpoints, like a kill
    logs.write("a.log", 10)
    logs.rename("a.log", "a.log.1")
    logs.write("a.log", 10)
    job.run(max_records=80)
    run_quiet(job)
    assert job.exact()


def test_positions_are_json_and_say_where_they_are(logs: LogDir) -> None:
    logs.write("access.log", 3)
    src = LogSource(logs.dir, parse=json.loads)
    (_, p1), (_, p2), (_, p3) = src.read(None)
    assert json.loads(json.dumps(p3)) == p3
    assert p3[0] == POSITION_TAG
    size = logs.path("access.log").stat().st_size
    assert p3[3] == size and p3[4] == 3
    assert list(src.read(json.loads(json.dumps(p3)))) == []
    rest = [r["seq"] for r, _ in src.read(p1)]
    assert rest == [2, 3]


class _OldFileSource:
    """The FileSource before statekit 0.2: files in name order, position [file name, byte offset]."""

    def __init__(self, directory: Path) -> None:
        self.paths = sorted(directory.iterdir())

    def read(self, position: object):  # type: ignore[no-untyped-def]
        start_name, start_off = position or [None, 0]  # type: ignore[misc]
        started = start_name is None
        for path in self.paths:
            offset = 0
            if not started:
                if path.name != start_name:
                    continue
                started, offset = True, int(start_off)
            with open(path, "rb") as f:
                f.seek(offset)
                for raw in f:
                    if not raw.endswith(b"\n"):
                        break
                    offset += len(raw)
                    yield json.loads(raw), [path.name, offset]


def test_a_checkpoint_of_the_old_file_source_is_restored(logs: LogDir, job: CountJob) -> None:
    logs.write("a.log", 30)
    logs.write("b.log", 30)
    with job.runner() as runner:
        runner.run(_OldFileSource(logs.dir), max_records=45)
        runner.checkpoint()
    logs.write("b.log", 10)
    logs.write("c.log", 10)
    with pytest.warns(RuntimeWarning, match="FileSource position"):
        job.run()
    assert job.exact()


def test_an_old_position_naming_a_missing_file_is_refused(logs: LogDir, job: CountJob) -> None:
    logs.write("a.log", 30)
    logs.write("b.log", 30)
    with job.runner() as runner:
        runner.run(_OldFileSource(logs.dir), max_records=45)
        runner.checkpoint()
    logs.move_away("b.log")
    with pytest.raises(SourceError, match=r"\['b\.log', \d+\].*no watched file is named 'b\.log'"):
        job.run()


def test_a_position_of_another_source_is_refused(logs: LogDir) -> None:
    logs.write("a.log", 3)
    with pytest.raises(SourceError, match="another source"):
        list(LogSource(logs.dir).read(17))


def test_file_source_is_the_log_source() -> None:
    from statekit import FileSource

    assert FileSource is LogSource
    assert isinstance(LogSource("."), __import__("statekit").ReplayableSource)
    assert LocalRunner is not None


# --- Only what the source was pointed at (issues 32 and 33) ------------------------------------


def bounded(fn: Callable[[], object], seconds: float = 60) -> BaseException | None:
    """Runs ``fn`` in a thread and returns what it raised; fails if it does not return in time (blocked)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            raised.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"blocked for {seconds} s"
    return raised[0] if raised else None


def _published(folder: Path) -> list[dict[str, Any]]:
    """The dead letters published in ``folder``, in the order of their files and lines."""
    return [json.loads(x) for p in sorted(folder.glob("part-*.json")) for x in p.read_text().splitlines()]


def test_a_symlink_out_of_the_watched_directory_is_refused(
    logs: LogDir, job: CountJob, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text(json.dumps({"url": "/secret", "seq": 0}) + "\n")
    logs.write("access.log", 10)
    os.symlink(secret, logs.path("access.log.evil"))
    dead = tmp_path / "dead-letters"
    job.conf.update(
        {"statekit.bad-records.policy": "dead-letter", "statekit.bad-records.dead-letter-path": dead}
    )
    with pytest.raises(SourceError) as err:
        job.run()
    assert str(err.value).startswith(
        f"{logs.path('access.log.evil')} is a symlink to {secret}, outside the watched directory {logs.dir}"
    )
    assert "follow_symlinks=True" in str(err.value) and "statekit.source.follow-symlinks" in str(err.value)
    assert job.counts == {} and _published(dead) == []  # nothing read, nothing dead-lettered
    job.conf["statekit.source.follow-symlinks"] = "true"  # explicitly allowed: read where it points
    run_quiet(job)
    logs.model["/secret"] += 1
    assert job.exact()
    logs.write("access.log", 5)
    run_quiet(job, follow_symlinks=True)  # the argument, as the key
    assert job.exact()


def test_a_symlink_to_a_watched_file_is_read_once_under_its_own_name(logs: LogDir, job: CountJob) -> None:
    logs.write("access.log.1", 10)
    os.symlink("access.log.1", logs.path("access.log.current"))  # a "current" link beside its target
    run_quiet(job)
    assert job.exact()
    src = LogSource(logs.path("current"), parse=json.loads)  # the very path given may be a link
    os.symlink(logs.path("access.log.1"), logs.path("current"))
    assert len(list(src.read(None))) == 10


@pytest.mark.parametrize("kind", ["FIFO", "socket", "directory"])
def test_special_files_named_like_logs_are_refused(logs: LogDir, job: CountJob, kind: str) -> None:
    logs.write("access.log", 5)
    path = logs.path("access.log.1")
    sock = socket.socket(socket.AF_UNIX)
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "socket":
        sock.bind(str(path))
    else:
        path.mkdir()
    try:
        err = bounded(job.run)  # never blocks on the FIFO
    finally:
        sock.close()
    assert isinstance(err, SourceError)
    assert str(err).startswith(
        f"{path} is a{'n' if kind == 'FIFO' else ''} {kind}".replace("an FIFO", "a FIFO")
    )
    assert "not a regular file" in str(err) and "pattern=" in str(err)
    run_quiet(job, pattern="*.log")  # the way out: a pattern that leaves it out
    assert job.exact()


def test_a_fifo_that_replaces_a_listed_log_never_blocks(logs: LogDir) -> None:
    logs.write("access.log", 5)
    src = LogSource(logs.dir, parse=json.loads)
    (_, position), *_ = src.read(None)
    ((_, listed),) = src.locate_files([])  # listed as the regular file it was
    os.remove(logs.path("access.log"))
    os.mkfifo(logs.path("access.log"))  # no writer: a blocking open would wait forever
    err = bounded(lambda: open_candidate(listed))
    assert isinstance(err, SourceError) and "is a FIFO (named pipe), not a regular file" in str(err)
    assert isinstance(bounded(lambda: list(src.read(position))), SourceError)
    place = src.locate(position)  # an error message about an earlier record: says what it can
    assert place is not None and place.file == str(logs.path("access.log")) and place.offset is None


def test_a_path_that_does_not_exist_is_an_error_naming_it(
    logs: LogDir, job: CountJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs.write("access.log", 10)
    monkeypatch.chdir(logs.root)

    def run(path: str) -> None:
        with job.runner() as runner, warnings.catch_warnings():
            warnings.simplefilter("error", InputLostWarning)  # not "16 files moved or deleted"
            runner.run(LogSource(path, parse=json.loads), restore="latest")

    with pytest.raises(SourceError, match=r"^log/ does not exist \(did you mean logs/\?\)\.$"):
        run("log/")  # a fresh job
    run("logs/")
    assert job.exact()
    with pytest.raises(SourceError, match=r"^log/ does not exist \(did you mean logs/\?\)\.$"):
        run("log/")  # restored from a checkpoint that knows logs/access.log
    with pytest.raises(
        SourceError, match=r"^logs/acces\.log does not exist \(did you mean logs/access\.log\?\)"
    ):
        run("logs/acces.log")
    with pytest.raises(SourceError, match=r"^zzz/logs/ does not exist: .*/zzz does not exist\.$"):
        run("zzz/logs/")
    with pytest.raises(SourceError) as e:
        run("log")  # no trailing '/': a file and its rotations, and logs/ starts with "log"
    assert str(e.value).startswith("log was read as a file-name prefix (the file log and its rotations")
    assert "logs/ is a directory whose name starts with it" in str(e.value)
    assert "LogSource('logs/') ('log/' would name the folder log/, which does not exist)" in str(e.value)
    run("logs/")
    assert job.exact()


def test_a_glob_that_matches_nothing_yet_is_fine(logs: LogDir, job: CountJob) -> None:
    logs.write("notes.txt", 3, counted=False)
    assert job.run(pattern="*.log").records == 0  # an existing directory: files may come
    logs.write("a.log", 4)
    run_quiet(job, pattern="*.log")
    assert job.exact()


def test_a_file_whose_rotations_are_all_compressed_is_no_missing_path(logs: LogDir) -> None:
    logs.write("access.log", 10)
    src = LogSource(logs.path("access.log"), parse=json.loads)
    *_, (_, position) = src.read(None)
    logs.rename("access.log", "access.log.1")  # logrotate nocreate: the name comes back with the next line
    logs.compress("access.log.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputLostWarning)
        assert list(src.read(position)) == []  # known files were here: they rotated, no typo


# --- Long lines (issue 32) ---------------------------------------------------------------------


def _long_line(n: int) -> bytes:
    return b'{"url": "/big", "pad": "' + b"x" * n + b'"}'


def test_a_long_line_is_a_bad_record_cut_short_in_bounded_memory(logs: LogDir) -> None:
    limit = 512 << 10
    logs.write("a.log", 3)
    big = _long_line(16 * limit)  # 8 MiB, sixteen times the limit
    start = logs.path("a.log").stat().st_size
    logs.write_raw("a.log", big + b"\n")
    logs.write("a.log", 2)
    src = LogSource(logs.dir, parse=json.loads, max_line_bytes=limit)
    tracemalloc.start()
    try:
        out = list(src.read_marked(None))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [r["seq"] if isinstance(r, dict) else r.stage for r, _ in out] == [1, 2, 3, "too-long", 4, 5]
    bad = out[3][0]
    assert isinstance(bad, BadRecord)
    assert (bad.file, bad.offset, bad.line) == (str(logs.path("a.log")), start, 4)
    assert bad.raw.encode() == big[:LONG_LINE_HEAD]  # its first 64 KiB
    assert f"a line of {len(big)} bytes, more than statekit.source.max-line-bytes={limit}" in bad.error
    assert out[3][1][3:5] == [start + len(big) + 1, 4]  # the position is past it
    # The line is never held: a block or two, and at most the limit of an unfinished line.
    assert peak < limit + (3 << 20) < len(big)


def test_long_lines_on_the_local_runner_dead_letters_and_the_fail_policy(
    logs: LogDir, tmp_path: Path
) -> None:
    dead = tmp_path / "dead-letters"
    job = CountJob(logs, {"statekit.source.max-line-bytes": "64kb"})
    logs.write("a.log", 3)
    logs.write_raw("a.log", _long_line(200_000) + b"\n")
    logs.write("a.log", 2)
    with pytest.raises(
        BadRecordError, match=rf"bad record \(too-long\) at {logs.path('a.log')}, byte \d+, line 4: "
    ):
        job.run()
    job.conf.update(
        {"statekit.bad-records.policy": "dead-letter", "statekit.bad-records.dead-letter-path": dead}
    )
    assert job.run().bad_records == 1
    assert job.exact()
    # A long line still being written (no newline yet): reported once, its rest skipped when it comes.
    logs.write_raw("a.log", _long_line(100_000))
    assert job.run().bad_records == 1
    logs.write_raw("a.log", b"x" * 50_000 + b"\n")
    logs.write("a.log", 4)
    assert job.run().bad_records == 0
    assert job.exact()
    letters = _published(dead)
    assert [(x["stage"], x["line"], len(x["raw"])) for x in letters] == [
        ("too-long", 4, 65536),
        ("too-long", 7, 65536),
    ]
    assert "a line of 200026 bytes" in letters[0]["error"]
    assert "at least 100026 bytes (no newline yet)" in letters[1]["error"]
    assert job.run(max_line_bytes=1 << 20).records == 0  # the argument beats the key; nothing read twice


# --- The copytruncate window and what is reported (issue 32) -----------------------------------


@pytest.mark.parametrize("lines", [400, 20], ids=["longer-than-the-fingerprint", "shorter-than-it"])
def test_copytruncate_read_between_the_copy_and_the_truncation_is_exact(
    logs: LogDir, job: CountJob, lines: int
) -> None:
    logs.write("access.log", lines)
    run_quiet(job)
    logs.write("access.log", 100)
    logs.copy("access.log", "access.log.1")
    run_quiet(job)  # the original is still whole: the copy is no new file, nothing is read twice
    assert job.exact()
    logs.write("access.log", 50)  # after the copy: only in the original, read from it
    run_quiet(job)
    logs.truncate("access.log")
    logs.write("access.log", 20)  # a new generation, from byte 0
    run_quiet(job)  # the copy holds less than was read: all of it read
    assert job.exact()
    logs.write("access.log", 5)
    run_quiet(job)
    assert job.exact()


def test_a_job_that_starts_between_the_copy_and_the_truncation_reads_each_line_once(
    logs: LogDir, job: CountJob
) -> None:
    logs.write("access.log", 400)
    logs.copy("access.log", "access.log.1")  # both new to the job: the copy is still no new file
    logs.write("access.log", 10)
    run_quiet(job)
    assert job.exact()
    logs.truncate("access.log")
    logs.write("access.log", 5)
    run_quiet(job)
    assert job.exact()


def test_copytruncate_copy_still_being_written_is_no_new_file(logs: LogDir, job: CountJob) -> None:
    logs.write("access.log", 600)
    run_quiet(job)
    data = logs.path("access.log").read_bytes()
    logs.path("access.log.1").write_bytes(data[: len(data) // 3 + 7])  # mid-line, as a copy under way
    logs.write("access.log", 30)
    run_quiet(job)
    assert job.exact()
    logs.path("access.log.1").write_bytes(logs.path("access.log").read_bytes())  # the copy completes
    logs.truncate("access.log")
    logs.write("access.log", 10)
    run_quiet(job)
    assert job.exact()


def test_a_file_read_to_its_end_then_compressed_is_no_loss(
    logs: LogDir, job: CountJob, caplog: pytest.LogCaptureFixture
) -> None:
    logs.write("access.log", 100)
    run_quiet(job)
    logs.rename("access.log", "access.log.1")
    logs.write("access.log", 10)
    run_quiet(job)
    logs.compress("access.log.1")
    with caplog.at_level(logging.DEBUG, logger="statekit.sources"):
        run_quiet(job)
    assert f"was read to its end, then compressed to {logs.path('access.log.1.gz')}" in caplog.text
    assert job.exact()


def test_a_file_compressed_before_it_was_read_to_its_end_names_the_compressed_file(
    logs: LogDir, job: CountJob
) -> None:
    logs.write("access.log", 100)
    run_quiet(job)
    read = logs.path("access.log").stat().st_size
    logs.write("access.log", 10, counted=False)
    total = logs.path("access.log").stat().st_size
    logs.rename("access.log", "access.log.1")
    logs.compress("access.log.1")
    logs.write("access.log", 5)
    gz = logs.path("access.log.1.gz")
    with pytest.warns(InputLostWarning) as caught:
        job.run()
    (lost,) = [str(w.message) for w in caught if w.category is InputLostWarning]
    assert lost == (
        f"input lost: {logs.path('access.log')} (read to byte {read}, line 100) was compressed to {gz} "
        "before it was read to its end (compressed files are not read); "
        f"bytes {read}-{total} ({total - read} bytes) were not read"
    )
    assert job.exact()


def test_a_reused_inode_number_is_not_taken_for_a_truncation(
    logs: LogDir, job: CountJob, caplog: pytest.LogCaptureFixture
) -> None:
    logs.write("a.log", 30)
    run_quiet(job)
    ino = logs.path("a.log").stat().st_ino
    os.remove(logs.path("a.log"))
    probes = [logs.path(f".probe-{k}") for k in range(500)]  # hidden: not watched
    for probe in probes:
        probe.touch()
        if probe.stat().st_ino == ino:
            probe.rename(logs.path("b.log"))  # the new file gets the deleted one's inode number
            break
    else:
        pytest.skip("the file system did not reuse the inode number")
    for other in probes:
        other.unlink(missing_ok=True)
    logs.write("b.log", 1)
    with caplog.at_level(logging.DEBUG, logger="statekit.sources"):
        run_quiet(job)
    assert f"its inode number now belongs to another file, {logs.path('b.log')}" in caplog.text
    assert "truncated" not in caplog.text
    assert job.exact()


# --- Debian's logrotate, the real binary -----------------------------------------------------

needs_logrotate = pytest.mark.skipif(
    LOGROTATE is None, reason="the logrotate binary is not installed (Debian: apt-get install -y logrotate)"
)


@needs_logrotate
def test_logrotate_copytruncate_with_a_writer_appending_is_exact(logs: LogDir) -> None:
    """copytruncate, compress, delaycompress; each rotation read while logrotate copies and truncates."""
    job = SeqJob(logs)
    rotate = Logrotate(logs, "copytruncate", "compress", "delaycompress")
    writer = Writer(logs, "access.log", per_burst=100)
    try:
        for _ in range(6):
            time.sleep(0.1)
            rotating = rotate.start()
            while rotating.poll() is None:
                run_quiet(job)  # while logrotate copies and truncates
            assert rotating.returncode == 0, rotating.stderr.read() if rotating.stderr else ""
            run_quiet(job)  # the copy read to its end before the next rotation compresses it
    finally:
        writer.stop()
    run_quiet(job)
    job.check()
    names = sorted(p.name for p in logs.dir.iterdir())
    assert "access.log.5.gz" in names and writer.written > 1000


@needs_logrotate
def test_logrotate_copytruncate_read_in_a_tight_loop_is_exact(logs: LogDir) -> None:
    """The same, read without pause by LogSource itself: reads land between the copy and the truncation."""
    rotate = Logrotate(logs, "copytruncate", "compress", "delaycompress")
    src = LogSource(logs.path("access.log"), parse=json.loads)
    position = None
    seqs: Counter[int] = Counter()

    def read() -> None:
        nonlocal position
        with warnings.catch_warnings():
            warnings.simplefilter("error", InputLostWarning)
            for record, position in src.read(position):  # noqa: B007 - the position after the last one
                seqs[record["seq"]] += 1

    writer = Writer(logs, "access.log", per_burst=50)
    try:
        for _ in range(3):
            writer.pause()  # long lines at once: a file whose copy takes logrotate a while
            with open(logs.path("access.log"), "a") as f:
                for _ in range(20_000):
                    text, _ = logs.line()
                    f.write(text[:-1] + ', "pad": "' + "p" * 300 + '"}\n')
            writer.resume()
            read()
            rotating = rotate.start()
            while rotating.poll() is None:
                read()
            assert rotating.returncode == 0
            read()
    finally:
        writer.stop()
    read()
    held = lines_in_files(logs.dir)
    assert max(seqs.values()) == 1 and not set(held) - set(seqs)


@needs_logrotate
def test_logrotate_copy_keeps_copies_that_are_not_read_again(logs: LogDir, job: CountJob) -> None:
    """logrotate's copy (no truncation): each rotation is a copy of a file that stays whole."""
    rotate = Logrotate(logs, "copy", "compress", "delaycompress")
    for _ in range(4):
        logs.write("access.log", 500)
        run_quiet(job)
        rotate.rotate()
        run_quiet(job)
    logs.write("access.log", 10)
    run_quiet(job)
    assert job.exact()
    assert logs.path("access.log.1").exists() and logs.path("access.log.3.gz").exists()


@needs_logrotate
def test_logrotate_compress_reports_only_what_was_not_read(logs: LogDir, job: CountJob) -> None:
    """copytruncate, compress at once: read to its end then compressed is no loss; else bytes, file named."""
    rotate = Logrotate(logs, "copytruncate", "compress")
    for _ in range(3):
        logs.write("access.log", 300)
        run_quiet(job)
        rotate.rotate()
    logs.write("access.log", 40)
    run_quiet(job)
    assert job.exact()
    logs.write("access.log", 25, counted=False)  # after the last read, then compressed away
    rotate.rotate()
    with pytest.warns(
        InputLostWarning, match=r"was compressed to .*access\.log\.1\.gz before .*; bytes \d+-\d+"
    ):
        job.run()
    assert job.exact()


@pytest.mark.skipif(LOGROTATE is None, reason="logrotate is not installed (apt-get install logrotate)")
def test_lines_written_rotated_and_compressed_between_two_reads_are_reported(
    logs: LogDir, job: CountJob
) -> None:
    """The log's new generation, empty at a read, filled, rotated and compressed before the next: reported.

    copytruncate, compress, delaycompress, two rotations between two reads:
    the 40 lines written between them are only in ``access.log.2.gz``.
    """
    rotate = Logrotate(logs, "copytruncate", "compress", "delaycompress")
    logs.write("access.log", 300)
    run_quiet(job)
    rotate.rotate()
    run_quiet(job)  # the copy is known; the truncated log is empty, so not tracked
    gz, held = rotated_away_unseen(logs, rotate, 40, counted=False)
    with pytest.warns(InputLostWarning) as caught:
        job.run()
    (lost,) = [str(w.message) for w in caught if w.category is InputLostWarning]
    assert lost.startswith(f"input lost: {gz} appeared, compressed, since the source last looked, and "), lost
    assert lost.endswith(f"; bytes 0-{held} ({held} bytes) were not read"), lost
    assert job.exact()  # the 10 lines of the last generation were read; the 300 are in .3.gz, known
    logs.write("access.log", 5)
    run_quiet(job)  # said once: the position now knows it
    assert job.exact()


def test_compressed_files_new_since_the_position_are_looked_into_and_an_old_position_starts_afresh(
    logs: LogDir,
) -> None:
    """Archives there before the first read are no loss; a new one is, unless it holds a file read."""
    logs.write("access.log", 20)
    logs.write("old.log", 5)
    logs.compress("old.log")  # an archive older than the source
    src = LogSource(logs.dir, parse=json.loads)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputLostWarning)
        out = list(src.read(None))
    position = out[-1][1]
    assert position[0] == POSITION_TAG and len(position) == 6
    assert len(position[5]) == 1  # old.log.gz, as listed
    logs.write("other.log", 7)
    logs.compress("other.log")  # never read
    logs.write("access.log", 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputLostWarning)
        assert len(list(src.read(position[:5]))) == 3  # an older statekit's position: nothing to compare
    with pytest.warns(InputLostWarning, match=r"other\.log\.gz appeared, compressed"):
        assert len(list(src.read(position))) == 3
    assert [x.path for x in src.lost] == [str(logs.path("other.log.gz"))]
    with pytest.raises(SourceError, match=r"input lost: .*other\.log\.gz appeared"):
        list(LogSource(logs.dir, parse=json.loads, on_lost="fail").read(position))
    # A copy of a file the source has read, compressed, is no loss.
    logs.path("other.log.gz").unlink()
    (logs.dir / "access.log.1").write_bytes(logs.path("access.log").read_bytes())
    logs.compress("access.log.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputLostWarning)
        assert len(list(src.read(position))) == 3


def test_a_file_truncated_below_the_offset_to_a_non_zero_length_names_the_bytes_read_twice(
    logs: LogDir, job: CountJob
) -> None:
    """Issue 44: the surviving lines are read again; the warning names exactly which bytes."""
    urls = logs.write("access.log", 10)
    run_quiet(job)
    path = logs.path("access.log")
    with open(path, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    kept = sum(len(x) for x in lines[:4])
    read = sum(len(x) for x in lines)
    os.truncate(path, kept)  # four lines survive the truncation, below the offset read
    logs.write("access.log", 3)
    size = os.path.getsize(path)
    with pytest.warns(InputLostWarning) as caught:
        result = job.run()
    (message,) = [str(w.message) for w in caught]
    assert result.input_lost == [message.removeprefix("input lost: ")]
    assert f"access.log (read to byte {read}, line 10) was truncated or rewritten in place" in message
    assert (
        f"its bytes 0-{min(size, read)} (its first {min(size, read)} bytes now) are counted twice" in message
    )
    for url in urls[:4]:  # exactly those: the four kept lines, and nothing else
        logs.model[url] += 1
    assert job.exact()
