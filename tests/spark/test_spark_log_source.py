"""The rotation-safe log source on Spark (``read_logs``), and Spark's own file source next to it.

The reader's ranges are tested without Spark first (planning on the "driver",
then rotating, then reading the range as a task would); then whole queries:
statekit's keyed count over files that grow, rotate both ways and hold a
malformed line, checked against a model of every line written.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from logfiles import CountPerUrl, LogDir
from statekit import BadRecordError, SourceError
from statekit.spark import keyed, read_logs
from statekit.spark._log_source import LogDataSource, LogRange, LogStreamReader

SCHEMA = T.StructType([T.StructField("url", T.StringType()), T.StructField("seq", T.LongType())])


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
            .process(CountPerUrl, "url string, n long", job_id=job_id)
            .foreach_batch(sink)
            .start(checkpoint_location=str(tmp_path / "spark"), trigger="0.2 seconds", restore="latest")
        )

    t0 = time.perf_counter()
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
    letters = [json.loads(x) for p in dead.iterdir() for x in p.read_text().splitlines()]
    assert [(x["stage"], x["raw"], x["line"]) for x in letters] == [("parse", "{not json", 8)]
    assert time.perf_counter() - t0 < 60


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
