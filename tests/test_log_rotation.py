"""LogSource on real files: every rotation and move of issue 22's table, counted exactly once or reported.

Each test writes lines, runs the URL count to the end of its input (a job
restarted from its latest checkpoint), changes the files as a user or
logrotate would, runs again, and compares the counts with the model of every
well-formed line written (minus lines the test made unreadable, which must be
reported).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

from logfiles import CountJob, LogDir
from statekit import (
    InputLostWarning,
    LocalRunner,
    LogSource,
    SourceError,
)
from statekit.sources import POSITION_TAG


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
    run_quiet(job)
    logs.write("access.log", 10, counted=False)
    logs.rename("access.log", "access.log.1")
    logs.move_away("access.log.1")
    logs.write("access.log", 100)
    run_lost(job, "no longer among the watched files")
    assert job.exact()
    run_quiet(job)  # reported once: the next position no longer holds the file
    assert job.exact()


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


def test_saved_file_missing_after_it_was_read(logs: LogDir, job: CountJob) -> None:
    logs.write("a.log", 40)
    logs.write("b.log", 40)
    run_quiet(job)
    os.remove(logs.path("a.log"))  # read to its end: nothing lost, but the source cannot know that
    logs.write("b.log", 10)
    logs.write("c.log", 10)
    run_lost(job, "a.log")
    assert job.exact()


def test_lost_input_fails_when_asked(logs: LogDir, job: CountJob) -> None:
    logs.write("access.log", 50)
    run_quiet(job)
    logs.move_away("access.log")
    with pytest.raises(SourceError, match=r"access\.log .*read to byte \d+, line 50"):
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
