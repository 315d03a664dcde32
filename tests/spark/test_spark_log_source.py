"""The rotation-safe log source on Spark (``read_logs``), and Spark's own file source next to it.

The reader's ranges are tested without Spark first (planning on the "driver",
then rotating, then reading the range as a task would); then whole queries:
statekit's keyed count over files that grow, rotate both ways and hold a
malformed line, checked against a model of every line written. Then what
the source refuses, long lines, the copytruncate window and lost input
(issues 32 and 33), and Debian's real logrotate with a writer appending.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
import tracemalloc
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from logfiles import (
    LOGROTATE,
    CountAndSeq,
    CountPerUrl,
    LogDir,
    Logrotate,
    Writer,
    assert_every_line_once,
    drawn_rotations,
    lines_in_files,
    rotate_inside_reads,
    rotated_away_unseen,
)
from statekit import InputLostWarning
from statekit.errors import BadRecordError, SourceError
from statekit.spark import keyed, read_logs
from statekit.spark._log_source import LogDataSource, LogRange, LogStreamReader

SCHEMA = T.StructType([T.StructField("url", T.StringType()), T.StructField("seq", T.LongType())])
needs_logrotate = pytest.mark.skipif(
    LOGROTATE is None, reason="the logrotate binary is not installed (Debian: apt-get install -y logrotate)"
)


def reader(logs: LogDir, **options: str) -> LogStreamReader:
    """The stream reader Spark would make, over ``logs`` (a record per JSON line)."""
    source = type("Src", (LogDataSource,), {"parse": staticmethod(json.loads), "output_schema": SCHEMA})
    r = source({"path": str(logs.dir), **options}).streamReader(SCHEMA)
    assert isinstance(r, LogStreamReader)
    return r


def read_all(r: LogStreamReader, parts: Any) -> list[str]:
    urls: list[str] = []
    for p in parts:
        for batch in r.read(p):
            assert isinstance(batch, pa.RecordBatch)
            urls += batch.column("url").to_pylist()
    return urls


def plan(r: LogStreamReader, start: dict[str, Any]) -> tuple[dict[str, Any], list[LogRange]]:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    end = r.latestOffset(start, ReadAllAvailable())
    parts = list(r.partitions(start, end))
    assert all(isinstance(p, LogRange) for p in parts)
    return end, parts  # type: ignore[return-value]


@pytest.mark.parametrize("rotation", ["rename", "copytruncate"])
def test_a_range_planned_before_a_rotation_is_read_from_the_rotated_file(
    tmp_path: Path, rotation: str
) -> None:
    logs = LogDir(tmp_path)
    first = logs.write("access.log", 30)
    r = reader(logs)
    end, parts = plan(r, r.initialOffset())
    assert len(parts) == 1
    after = logs.write("access.log", 5)  # written after planning: not in this range
    if rotation == "rename":
        logs.rename("access.log", "access.log.1")
        new = logs.write("access.log", 3)
    else:
        logs.copytruncate("access.log", "access.log.1")
        new = logs.write("access.log", 40)  # longer than the range: a seek into it would read new lines
    assert read_all(r, parts) == first  # found by identity, exactly the planned lines
    assert read_all(r, parts) == first  # and again, as a retried task would
    # The next batch finishes the rotated file, then reads the new one.
    _, more = plan(r, end)
    assert [p.entry[0] for p in more] == [str(logs.path("access.log.1")), str(logs.path("access.log"))]
    assert read_all(r, more) == after + new


def test_fail_policy_names_the_place_and_dead_letters_are_one_file_per_range(tmp_path: Path) -> None:
    logs = LogDir(tmp_path)
    logs.write("access.log", 3)
    logs.write_raw("access.log", b'{"url": "/a"\n')
    logs.write_raw("access.log", b'{"url": "/b", "seq": "not a number"}\n')
    logs.write_raw("access.log", b'{"url": "/c\xff"}\n')
    logs.write("access.log", 2)
    r = reader(logs)
    _, parts = plan(r, r.initialOffset())
    with pytest.raises(BadRecordError) as err:
        read_all(r, parts)
    text = str(err.value)
    assert f"{logs.path('access.log')}, byte " in text and "line 4" in text and '\'{"url": "/a"\'' in text

    dead = tmp_path / "dead"
    r = reader(logs, badRecordsPolicy="dead-letter", deadLetterPath=str(dead), jobId="j")
    _, parts = plan(r, r.initialOffset())
    for _ in range(2):  # a retried task replaces its file: each bad line once
        assert len(read_all(r, parts)) == 5
    (name,) = os.listdir(dead)
    letters = [json.loads(x) for x in (dead / name).read_text().splitlines()]
    assert [(x["stage"], x["line"], x["job_id"]) for x in letters] == [
        ("parse", 4, "j"), ("arrow", 5, "j"), ("decode", 6, "j"),
    ]  # fmt: skip
    assert letters[2]["raw"].encode("utf-8", "surrogateescape") == b'{"url": "/c\xff"}'
    assert letters[0]["offset"] == sum(
        len(x) + 1 for x in logs.path("access.log").read_bytes().split(b"\n")[:3]
    )

    r = reader(logs, badRecordsPolicy="dead-letter", deadLetterPath=str(dead), maxBadRecords="2")
    with pytest.raises(BadRecordError, match="more than statekit.bad-records.max=2"):
        read_all(r, plan(r, r.initialOffset())[1])


def test_a_file_gone_between_planning_and_reading_fails_under_on_lost_fail(tmp_path: Path) -> None:
    logs = LogDir(tmp_path)
    logs.write("access.log", 4)
    r = reader(logs, onLost="fail")
    _, parts = plan(r, r.initialOffset())
    logs.move_away("access.log")
    with pytest.raises(SourceError, match="could not be found by inode or fingerprint"):
        read_all(r, parts)


def test_bytes_written_between_a_copy_and_its_truncation_are_reported_as_what_they_are(
    tmp_path: Path,
) -> None:
    """Planned after copytruncate's copy, truncated before the task: lost by logrotate, and said so."""
    logs = LogDir(tmp_path)
    logs.write("access.log", 5)
    r = reader(logs, onLost="fail")
    offset, parts = plan(r, r.initialOffset())
    assert len(read_all(r, parts)) == 5
    shutil.copyfile(logs.path("access.log"), logs.path("access.log.1"))  # the copy
    logs.write("access.log", 3)  # between the copy and the truncation
    _, parts = plan(r, offset)
    with open(logs.path("access.log"), "r+b") as f:
        f.truncate(0)
    copy_end = logs.path("access.log.1").stat().st_size
    with pytest.raises(
        SourceError,
        match=rf"access\.log \(bytes {copy_end}-\d+, after line 5\) was truncated .* copy "
        rf".*access\.log\.1 ends at byte {copy_end}, before this range: these bytes were written to it "
        "after the copy was made",
    ):
        read_all(r, parts)


def test_a_file_truncated_while_its_task_reads_it_is_finished_from_its_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """copytruncate between the task's open and its reads: the rest of the range comes from the copy."""
    import statekit.spark._log_source as log_source

    logs = LogDir(tmp_path)
    logs.write("access.log", 60_000)  # over 2 MiB: read in more than one block
    r = reader(logs, onLost="fail")
    _, parts = plan(r, r.initialOffset())

    class TruncatedMidway(log_source.LineReader):  # type: ignore[misc, name-defined]
        def __iter__(self):  # type: ignore[no-untyped-def]
            for i, piece in enumerate(super().__iter__()):
                yield piece
                if i == 0 and not logs.path("access.log.1").exists():
                    logs.copytruncate("access.log", "access.log.1")

    monkeypatch.setattr(log_source, "LineReader", TruncatedMidway)
    seqs = Counter(s for p in parts for b in r.read(p) for s in b.column("seq").to_pylist())
    assert logs.path("access.log").stat().st_size == 0  # it was truncated under the task
    assert sorted(seqs) == list(range(1, 60_001)) and max(seqs.values()) == 1


def test_a_partial_last_line_waits_for_its_newline_or_the_inactivity_time(tmp_path: Path) -> None:
    logs = LogDir(tmp_path)
    logs.write("access.log", 2)
    logs.write_raw("access.log", b'{"url": "/p", "seq": 0}')
    r = reader(logs)
    end, parts = plan(r, r.initialOffset())
    assert len(read_all(r, parts)) == 2
    assert plan(r, end)[0] is end  # nothing new: the same offset, so Spark runs no batch
    r.clock = lambda: time.time() + 301
    _, parts = plan(r, end)
    assert read_all(r, parts) == ["/p"]


def test_keyed_count_over_growing_rotating_logs_is_exact(session: Any, tmp_path: Path, job_id: str) -> None:
    """Appends, rename and copytruncate rotation and a malformed line between micro-batches, a restart."""
    session.conf.set("spark.statekit.checkpoint.storage", "jobmanager")
    session.conf.set("spark.statekit.parallelism", "2")
    logs = LogDir(tmp_path)
    dead = tmp_path / "dead"
    counts: dict[str, int] = {}
    infos: list[Any] = []

    def sink(df: Any, batch_id: int) -> None:
        for url, n in df.collect():
            counts[url] = max(counts.get(url, 0), n)

    def start() -> Any:
        lines = read_logs(
            session, logs.path("access.log"), parse=json.loads, schema=SCHEMA,
            config={"statekit.bad-records.policy": "dead-letter",
                    "statekit.bad-records.dead-letter-path": str(dead)},
        )  # fmt: skip
        return (
            keyed(lines, "url")
            .process(CountPerUrl, "url string, n long", job_id=job_id, on_batch=infos.append)
            .foreach_batch(sink)
            .start(checkpoint_location=str(tmp_path / "spark"), trigger="0.2 seconds", restore="latest")
        )

    query = start()
    try:
        logs.write("access.log", 40)
        query.processAllAvailable()
        logs.write("access.log", 10)  # appended to a file Spark already read from
        query.processAllAvailable()
        logs.rename("access.log", "access.log.1")  # rename rotation; nginx writes on until it reopens
        logs.write("access.log.1", 4)
        logs.write("access.log", 6)
        query.processAllAvailable()
        query.stop()
        logs.write("access.log", 5)
        query = start()  # a restart: offsets from Spark's log, state from statekit's checkpoint
        query.processAllAvailable()
        logs.write("access.log", 3)
        logs.copytruncate("access.log", "access.log.2")  # copytruncate, the copy kept
        logs.write("access.log", 7)
        logs.write_raw("access.log", b"{not json\n")
        logs.write("access.log", 2)
        query.processAllAvailable()
    finally:
        query.stop()
    assert counts == dict(logs.model)
    assert sum(logs.model.values()) == 77
    letters = [json.loads(x) for p in dead.glob("part-*") for x in p.read_text().splitlines()]
    assert [(x["stage"], x["raw"], x["line"]) for x in letters] == [("parse", "{not json", 8)]
    # read_logs was given no job id: its letters name the statekit job whose batch read them.
    assert [x["job_id"] for x in letters] == [job_id]
    # The dead letter the reading task wrote is counted for its batch (issue 43), and its tally is gone.
    done = [i for i in infos if not i.skipped]
    assert [(i.bad_records, i.source_bad_records) for i in done if i.bad_records] == [(1, 1)]
    assert sum(i.records for i in done) == 77
    assert not list(dead.glob(".count-*"))


def test_a_file_truncated_below_its_offset_names_the_bytes_read_twice_in_batch_info(
    session: Any, tmp_path: Path, job_id: str
) -> None:
    """Issue 44: the kept lines are read again; the batch's BatchInfo names exactly which bytes."""
    session.conf.set("spark.statekit.checkpoint.storage", "jobmanager")
    session.conf.set("spark.statekit.parallelism", "2")
    logs = LogDir(tmp_path)
    counts: dict[str, int] = {}
    infos: list[Any] = []

    def sink(df: Any, batch_id: int) -> None:
        for url, n in df.collect():
            counts[url] = max(counts.get(url, 0), n)

    lines = read_logs(session, logs.path("access.log"), parse=json.loads, schema=SCHEMA)
    query = (
        keyed(lines, "url")
        .process(CountPerUrl, "url string, n long", job_id=job_id, on_batch=infos.append)
        .foreach_batch(sink)
        .start(checkpoint_location=str(tmp_path / "spark"), trigger="0.2 seconds")
    )
    try:
        urls = logs.write("access.log", 10)
        query.processAllAvailable()
        path = logs.path("access.log")
        written = path.read_bytes().splitlines(keepends=True)
        read = sum(len(x) for x in written)
        os.truncate(path, sum(len(x) for x in written[:4]))  # four lines survive, below the offset
        logs.write("access.log", 3)
        size = os.path.getsize(path)
        query.processAllAvailable()
    finally:
        query.stop()
    lost = [m for i in infos for m in i.input_lost]
    assert len(lost) == 1, lost
    assert f"access.log (planned to byte {read}, line 10) was truncated or rewritten in place" in lost[0]
    again = min(size, read)
    assert f"its bytes 0-{again} (its first {again} bytes now) are counted twice" in lost[0]
    for url in urls[:4]:  # exactly those: the four kept lines, and nothing else
        logs.model[url] += 1
    assert counts == dict(logs.model)


def test_spark_file_source_reads_a_growing_file_once(session: Any, tmp_path: Path) -> None:
    """What docs/spark.md says of Spark's own file source: lines appended after a file was read are lost."""
    logs = LogDir(tmp_path)
    logs.write("access.log", 10)
    seen: list[int] = []

    def run() -> None:
        query = (
            session.readStream.text(str(logs.dir))
            .writeStream.foreachBatch(lambda df, b: seen.append(df.count()))
            .option("checkpointLocation", str(tmp_path / "spark"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    run()
    logs.write("access.log", 5)  # appended: the file grew, its name is known
    os.utime(logs.path("access.log"))
    run()
    assert seen == [10]  # the 5 appended lines never come
    logs.write("other.log", 2)
    run()
    assert seen == [10, 2]  # a new file is read, whole


# --- Only what it was pointed at, long lines, the copytruncate window (issues 32 and 33) -----------


def plan_and_read(r: LogStreamReader, start: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A micro-batch: planned on the "driver" (within the read limit), its ranges read as tasks would."""
    end = r.latestOffset(start, r.getDefaultReadLimit())
    return end, read_all(r, r.partitions(start, end))


def test_spark_refuses_what_it_was_not_pointed_at(tmp_path: Path) -> None:
    logs = LogDir(tmp_path)
    logs.write("access.log", 3)
    secret = tmp_path / "secret.txt"
    secret.write_text(json.dumps({"url": "/secret", "seq": 0}) + "\n")
    os.symlink(secret, logs.path("access.log.evil"))
    r = reader(logs)
    with pytest.raises(
        SourceError, match=r"access\.log\.evil is a symlink to .*secret\.txt, outside the watched"
    ):
        plan(r, r.initialOffset())
    r = reader(logs, followSymlinks="true")  # allowed explicitly
    assert sorted(plan_and_read(r, r.initialOffset())[1]) == ["/secret", "/u1", "/u2", "/u3"]
    os.remove(logs.path("access.log.evil"))
    os.mkfifo(logs.path("access.log.1"))
    r = reader(logs)
    with pytest.raises(SourceError, match=r"access\.log\.1 is a FIFO \(named pipe\), not a regular file"):
        plan(r, r.initialOffset())


def test_a_fifo_in_place_of_a_planned_file_fails_the_task_without_blocking(tmp_path: Path) -> None:
    logs = LogDir(tmp_path)
    logs.write("access.log", 3)
    r = reader(logs)
    _, parts = plan(r, r.initialOffset())
    os.remove(logs.path("access.log"))
    os.mkfifo(logs.path("access.log"))  # no writer: a blocking open would never return
    raised: list[BaseException] = []

    def task() -> None:
        try:
            read_all(r, parts)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            raised.append(e)

    thread = threading.Thread(target=task, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the task blocked on the FIFO"
    assert isinstance(raised[0], SourceError) and "is a FIFO (named pipe)" in str(raised[0])


def test_spark_a_path_that_does_not_exist_is_an_error_naming_it(
    session: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs = LogDir(tmp_path)
    logs.write("access.log", 3)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceError, match=r"^log/ does not exist \(did you mean logs/\?\)\.$"):
        read_logs(session, "log/")  # on the caller's thread, before any query
    r = reader(logs)
    end, _ = plan(r, r.initialOffset())
    # A query restored from its offset log, with the file's name mistyped: no "lost" offsets, an error.
    typo = type("Src", (LogDataSource,), {"parse": staticmethod(json.loads), "output_schema": SCHEMA})
    r = typo({"path": str(logs.path("acces.log"))}).streamReader(SCHEMA)
    assert isinstance(r, LogStreamReader)
    with pytest.raises(SourceError, match=r"acces\.log does not exist \(did you mean .*access\.log\?\)"):
        plan(r, end)


def test_spark_long_lines_are_bad_records_cut_short_in_bounded_memory(tmp_path: Path) -> None:
    logs = LogDir(tmp_path)
    limit = 256 << 10
    logs.write("access.log", 2)
    start = logs.path("access.log").stat().st_size
    big = b'{"url": "/big", "pad": "' + b"x" * (16 * limit) + b'"}'
    logs.write_raw("access.log", big + b"\n")
    logs.write("access.log", 2)
    r = reader(logs, maxLineBytes=str(limit))
    _, parts = plan(r, r.initialOffset())
    with pytest.raises(
        BadRecordError, match=rf"bad record \(too-long\) at .*access\.log, byte {start}, line 3: "
    ):
        read_all(r, parts)
    dead = tmp_path / "dead"
    r = reader(logs, maxLineBytes="256kb", badRecordsPolicy="dead-letter", deadLetterPath=str(dead))
    end, parts = plan(r, r.initialOffset())
    tracemalloc.start()
    try:
        urls = read_all(r, parts)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert urls == ["/u1", "/u2", "/u3", "/u4"]
    assert peak < limit + (3 << 20) < len(big)  # a block or two, never the line
    (letter,) = [json.loads(x) for p in dead.iterdir() for x in p.read_text().splitlines()]
    assert (letter["stage"], letter["offset"], letter["line"]) == ("too-long", start, 3)
    assert letter["raw"].encode() == big[: 64 << 10] and f"a line of {len(big)} bytes" in letter["error"]
    # A long line with no newline yet: planned as one (the task reports it), its rest skipped later.
    logs.write_raw("access.log", b"y" * (2 * limit))
    end, parts = plan(r, end)
    assert read_all(r, parts) == []
    logs.write_raw("access.log", b"y" * 1000 + b"\n")
    logs.write("access.log", 1)
    end, parts = plan(r, end)
    assert [p.skip for p in parts] == [True] and read_all(r, parts) == ["/u5"]
    letters = sorted((json.loads(x) for p in dead.iterdir() for x in p.read_text().splitlines()), key=str)
    assert [x["line"] for x in letters] == [3, 6] and "at least 524288 bytes" in letters[1]["error"]
    assert end["files"][0][1][6] == 7  # line numbers go on after it


def test_spark_copytruncate_planned_between_the_copy_and_the_truncation_is_exact(tmp_path: Path) -> None:
    logs = LogDir(tmp_path)
    written = logs.write("access.log", 3000)
    r = reader(logs)
    end, urls = plan_and_read(r, r.initialOffset())
    written += logs.write("access.log", 100)
    logs.copy("access.log", "access.log.1")
    end, more = plan_and_read(r, end)  # the original is still whole: the copy is not planned from byte 0
    urls += more
    assert len(more) == 100 and len(end["files"]) == 1
    written += logs.write("access.log", 50)
    end, more = plan_and_read(r, end)
    urls += more
    logs.truncate("access.log")
    written += logs.write("access.log", 20)
    end, more = plan_and_read(r, end)
    urls += more
    assert urls == written
    assert "lost" not in end


def test_a_range_planned_past_the_copy_reads_what_the_copy_holds_and_names_the_rest(tmp_path: Path) -> None:
    """Lines appended between copytruncate's copy and its truncation, planned, truncated before the task."""
    logs = LogDir(tmp_path)
    logs.write("access.log", 300)
    r = reader(logs)
    end, _ = plan_and_read(r, r.initialOffset())
    kept = logs.write("access.log", 100)
    logs.copy("access.log", "access.log.1")
    copied = logs.path("access.log.1").stat().st_size
    logs.write("access.log", 50)  # only in the original, which is about to be truncated
    planned = logs.path("access.log").stat().st_size
    end, parts = plan(r, end)
    assert [(p.start, p.entry[5]) for p in parts] == [(copied - _bytes(logs, 100), planned)]
    logs.truncate("access.log")
    with pytest.warns(
        RuntimeWarning, match=rf"bytes {copied}-{planned} of the range .* holds only its first"
    ):
        assert read_all(r, parts) == kept  # what the copy holds of the range is read
    logs.write("access.log", 5)
    end, _ = plan(r, end)
    assert "lost" not in end  # planned to its end: the task said what it could not read


def _bytes(logs: LogDir, n: int) -> int:
    """The length of the last ``n`` lines of access.log.1."""
    return sum(len(x) + 1 for x in logs.path("access.log.1").read_bytes().split(b"\n")[-n - 1 : -1])


def test_spark_a_query_that_starts_between_the_copy_and_the_truncation_reads_each_line_once(
    tmp_path: Path,
) -> None:
    logs = LogDir(tmp_path)
    written = logs.write("access.log", 400)
    logs.copy("access.log", "access.log.1")
    written += logs.write("access.log", 10)
    r = reader(logs)
    end, urls = plan_and_read(r, r.initialOffset())
    logs.truncate("access.log")
    written += logs.write("access.log", 5)
    end, more = plan_and_read(r, end)
    assert urls + more == written and "lost" not in end


def test_spark_lost_input_names_what_was_never_planned_and_where_it_went(tmp_path: Path) -> None:
    logs = LogDir(tmp_path)
    logs.write("access.log", 100)
    r = reader(logs, maxLinesPerTrigger="60")
    end, urls = plan_and_read(r, r.initialOffset())
    assert len(urls) == 60
    logs.rename("access.log", "access.log.1")
    logs.compress("access.log.1")
    logs.write("access.log", 5)
    with pytest.warns(InputLostWarning, match="planned to byte"):
        end, urls = plan_and_read(r, end)
    (lost,) = end["lost"]
    assert "access.log (planned to byte " in lost and ", line 60) was compressed to " in lost
    assert "access.log.1.gz before it was read to its end" in lost and "were not read" in lost
    # Planned to its end, then compressed: no loss. A range whose file went to a .gz before its task: named.
    r = reader(logs)
    end, _ = plan_and_read(r, r.initialOffset())
    logs.write("access.log", 5)
    end, parts = plan(r, end)
    logs.rename("access.log", "access.log.2")
    logs.compress("access.log.2")
    with pytest.warns(RuntimeWarning, match=r"could not be found .*its content is in .*access\.log\.2\.gz"):
        read_all(r, parts)
    logs.write("access.log", 1)
    end, _ = plan(r, end)
    assert "lost" not in end  # planned to its end: its range's task reported what it could not read


@needs_logrotate
def test_lines_rotated_and_compressed_between_two_plans_are_reported_once(tmp_path: Path) -> None:
    """The log's new generation, empty at a plan, filled, rotated and compressed before the next: named.

    The offset keeps the compressed files its plan listed (``gz``): the next
    plan looks into those new since; one whose content is no file the source
    has planned is reported, once; an offset without the list (an older
    statekit's) starts the list afresh.
    """
    logs = LogDir(tmp_path)
    rotate = Logrotate(logs, "copytruncate", "compress", "delaycompress")
    logs.write("access.log", 300)
    r = reader(logs)
    end, urls = plan_and_read(r, r.initialOffset())
    assert len(urls) == 300 and end["gz"] == []
    rotate.rotate()
    assert plan(r, end)[0] == end  # the copy is known, the truncated log empty: nothing to plan
    gz, held = rotated_away_unseen(logs, rotate, 40)  # never planned: rotated and compressed in between
    older = {k: v for k, v in end.items() if k != "gz"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputLostWarning)
        plan(reader(logs), older)  # an older statekit's offset: no listing to compare with
    with pytest.warns(InputLostWarning, match=r"access\.log\.2\.gz appeared, compressed"):
        end, urls = plan_and_read(r, end)
    assert len(urls) == 10
    (lost,) = end["lost"]
    assert lost.startswith(f"{gz} appeared, compressed, since the source last looked"), lost
    assert lost.endswith(f"bytes 0-{held} ({held} bytes) were not read"), lost
    logs.write("access.log", 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputLostWarning)
        end, urls = plan_and_read(reader(logs), end)  # a restarted query: its offset knows it
    assert len(urls) == 3 and "lost" not in end


@needs_logrotate
def test_logrotate_copytruncate_planned_in_a_tight_loop_is_exact(tmp_path: Path) -> None:
    """Debian's logrotate (copytruncate, compress, delaycompress), a writer appending, planning non-stop."""
    logs = LogDir(tmp_path)
    rotate = Logrotate(logs, "copytruncate", "compress", "delaycompress")
    r = reader(logs)
    offset = r.initialOffset()
    seqs: Counter[int] = Counter()

    def batch() -> None:
        nonlocal offset
        offset, parts = plan(r, offset)
        for p in parts:
            for b in r.read(p):
                assert isinstance(b, pa.RecordBatch)
                seqs.update(b.column("seq").to_pylist())
        assert "lost" not in offset, offset["lost"]

    writer = Writer(logs, "access.log", per_burst=50)
    try:
        for _ in range(3):
            _bulk(logs, writer, 20_000)
            batch()
            rotating = rotate.start()
            while rotating.poll() is None:
                batch()  # while logrotate copies and truncates
            assert rotating.returncode == 0
            batch()
    finally:
        writer.stop()
    batch()
    held = lines_in_files(logs.dir)
    assert max(seqs.values()) == 1 and not set(held) - set(seqs)


@drawn_rotations
def test_rotations_inside_planning_and_reading_read_every_line_once(
    tmp_path_factory: pytest.TempPathFactory, seed: int, busy: float, mode: str
) -> None:
    """logrotate's steps inside the driver's listings and the tasks' opens (as test_log_rotation_races)."""
    logs = LogDir(tmp_path_factory.mktemp("races"))
    r = reader(logs)
    offset = r.initialOffset()
    planned: list[LogRange] = []
    seqs: Counter[int] = Counter()

    def task() -> None:
        for b in r.read(planned.pop()):
            seqs.update(b.column("seq").to_pylist())

    def batch(rnd: random.Random) -> None:
        """Plans a micro-batch, and reads ranges planned so far in a drawn order (tasks run late)."""
        nonlocal offset
        offset, parts = plan(r, offset)
        assert "lost" not in offset, offset["lost"]
        planned.extend(parts)
        rnd.shuffle(planned)
        while planned and rnd.random() < 0.7:
            task()

    def drain() -> None:
        """A task late by a whole rotation would find its copy compressed: a true loss, not drawn."""
        while planned:
            task()

    rotate_inside_reads(logs, seed, busy, batch, settle=drain, mode=mode)
    assert_every_line_once(logs, seqs)


def _bulk(logs: LogDir, writer: Writer, n: int) -> None:
    """``n`` long lines at once (the writer paused): a file whose copy takes logrotate a while."""
    writer.pause()
    with open(logs.path("access.log"), "a") as f:
        for _ in range(n):
            text, _ = logs.line()
            f.write(text[:-1] + ', "pad": "' + "p" * 300 + '"}\n')
    writer.resume()


@needs_logrotate
def test_keyed_count_under_logrotate_with_a_writer_is_exact(
    session: Any, tmp_path: Path, job_id: str
) -> None:
    """A query over access.log while Debian's logrotate rotates it (copytruncate, compress), a writer on."""
    session.conf.set("spark.statekit.checkpoint.storage", "jobmanager")
    session.conf.set("spark.statekit.parallelism", "2")
    logs = LogDir(tmp_path)
    logs.write("access.log", 10)
    rotate = Logrotate(logs, "copytruncate", "compress", "delaycompress")
    seqs: Counter[int] = Counter()

    def sink(df: Any, batch_id: int) -> None:
        seqs.update(row["seq"] for row in df.collect())

    lines = read_logs(
        session,
        logs.path("access.log"),
        parse=json.loads,
        schema=SCHEMA,
        config={"statekit.source.max-line-bytes": "1mb"},
    )
    query = (
        keyed(lines, "url")
        .process(CountAndSeq, "url string, n long, seq long", job_id=job_id)
        .foreach_batch(sink)
        .start(checkpoint_location=str(tmp_path / "spark"), trigger="0.05 seconds", restore="latest")
    )
    writer = Writer(logs, "access.log", per_burst=20)
    try:
        for _ in range(3):
            _bulk(logs, writer, 5000)
            time.sleep(0.3)
            rotate.rotate()  # while the query plans micro-batches and the writer appends
            writer.pause()  # processAllAvailable returns once no new line comes
            query.processAllAvailable()  # the copy read before the next rotation compresses it
            writer.resume()
        writer.stop()
        query.processAllAvailable()
        lost = [json.loads(p["sources"][0]["endOffset"]).get("lost") for p in query.recentProgress]
    finally:
        writer.stop()
        query.stop()
    held = lines_in_files(logs.dir)
    assert max(seqs.values()) == 1 and not set(held) - set(seqs)
    assert not any(lost), lost
    assert any(p.name.endswith(".gz") for p in logs.dir.iterdir())


def test_a_new_session_on_the_same_context_reads_with_its_own_parse(spark: Any, tmp_path: Path) -> None:
    """Spark refuses a new session a data source name the context's first session registered: it gets its own.

    Both parse functions have one qualified name (as a function redefined in a
    notebook has), so both read_logs calls want one data source name. (The
    shared first session, ``spark``, keeps the first registration: only a name.)
    """
    logs = LogDir(tmp_path)
    logs.write("access.log", 4)

    def parser(suffix: str) -> Any:
        def parse(line: str) -> Any:
            record = json.loads(line)
            record["url"] += suffix
            return record

        return parse

    read_logs(spark, logs.path("access.log"), parse=parser(""), schema=SCHEMA)
    other = spark.newSession()
    lines = read_logs(other, logs.path("access.log"), parse=parser("!"), schema=SCHEMA)
    urls: list[str] = []
    query = (
        lines.writeStream.foreachBatch(lambda df, _: urls.extend(r.url for r in df.collect()))
        .option("checkpointLocation", str(tmp_path / "spark"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert len(urls) == 4 and all(u.endswith("!") for u in urls)  # the second session's parse
