"""Rows without a key on Spark follow ``statekit.bad-records.*``, per record and vectorized (issue 33).

A JSON line without ``url`` (or one Spark's JSON reader cannot parse: every
column null) used to fail every task with ``ValueError: null key``, whatever
the policy. Now it is a bad record of stage ``key`` with its micro-batch, the
file Spark read it from and the row's values: ``fail`` stops the query naming
them, ``dead-letter`` writes it once into the dead-letter directory, also when
the micro-batch runs again.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sparkutil import OUTPUT, assert_exact_state, run_to_end, stream_of, write_inputs

from jobs import CountUrls, CountUrlsBatch, make_records
from statekit.spark import BatchInfo, keyed
from statekit_storage import FileSystemCheckpointStorage


def with_bad_rows(records: list[dict[str, Any]], every: int) -> list[dict[str, Any]]:
    """``records`` with the url of every ``every``-th one left out (its key is null)."""
    out = []
    for i, r in enumerate(records):
        out.append({k: v for k, v in r.items() if k != "url"} if i % every == 3 else r)
    return out


def letters_in(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for p in sorted(directory.glob("part-*.json")) for x in p.read_text().splitlines()]


@pytest.mark.parametrize("function", [CountUrls, CountUrlsBatch], ids=["per-record", "vectorized"])
def test_null_keys_are_dead_letters_once_with_batch_file_and_values(
    session: Any, job_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, function: Any
) -> None:
    records = with_bad_rows(make_records(600, urls=20, seed=3), every=37)
    good = [r for r in records if "url" in r]
    bad = len(records) - len(good)
    write_inputs(tmp_path / "in", records, 2)
    monkeypatch.chdir(tmp_path)  # the driver's working directory: the relative path below is taken from it
    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "statekit"))
    session.conf.set("spark.statekit.parallelism", "2")
    session.conf.set("spark.statekit.bad-records.policy", "dead-letter")
    session.conf.set("spark.statekit.bad-records.dead-letter-path", "dead")
    infos: list[BatchInfo] = []
    failed = [False]

    def sink(df: Any, batch_id: int) -> None:
        df.count()
        if batch_id == 1 and not failed[0]:
            failed[0] = True  # the batch's tasks ran (its letters are written): it must run again
            raise RuntimeError("the sink fails once")

    stream = keyed(stream_of(session, tmp_path / "in"), "url").process(
        function, OUTPUT, job_id=job_id, on_batch=infos.append
    )
    with pytest.raises(Exception, match="the sink fails once"):
        run_to_end(stream.foreach_batch(sink), tmp_path / "spark-checkpoint")
    run_to_end(stream.foreach_batch(sink), tmp_path / "spark-checkpoint")  # batch 1 again, then the rest

    assert_exact_state(FileSystemCheckpointStorage(str(tmp_path / "statekit")), job_id, good)
    assert sum(i.bad_records for i in infos) == bad and sum(i.records for i in infos) == len(good)
    dead = tmp_path / "dead"
    assert stat.S_IMODE(os.stat(dead).st_mode) == 0o700
    letters = letters_in(dead)
    assert len(letters) == bad  # batch 1's file was written twice: replaced, not appended
    assert Counter(x["batch"] for x in letters) == Counter(
        {i.batch_id: i.bad_records for i in infos if i.bad_records}
    )
    files = {x["file"] for x in letters}
    assert files == {str(tmp_path / "in" / "part-0000.json"), str(tmp_path / "in" / "part-0001.json")}
    for x in letters:
        assert x["stage"] == "key" and x["job_id"] == job_id and x["operator_id"] == "process"
        assert x["error"] == "ValueError: null key in column 'url': every record needs a key"
        row = eval(x["raw"])  # noqa: S307 - the repr of a dict of the row's values, written by us
        assert row["url"] is None and row["request"] in {"GET", "POST", "PUT", "DELETE"}
    assert [p.name for p in dead.iterdir() if not p.name.startswith("part-")] == []


def test_under_fail_a_null_key_stops_the_batch_naming_it(session: Any, job_id: str, tmp_path: Path) -> None:
    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "statekit"))
    session.conf.set("spark.statekit.parallelism", "2")
    df = session.createDataFrame(
        [("/a", "GET", 1), (None, "PUT", 2), ("/b", "GET", 3)], "url string, request string, bytes long"
    )
    with pytest.raises(Exception) as info:
        keyed(df, "url").process(CountUrls, OUTPUT, job_id=job_id).run()
    message = str(info.value)
    assert (
        "BadRecordError: bad record (key) at micro-batch 0: ValueError: null key in column 'url'" in message
    )
    assert "'request': 'PUT'" in message and "statekit.bad-records.policy=dead-letter" in message
    assert FileSystemCheckpointStorage(str(tmp_path / "statekit")).latest_checkpoint(job_id) is None


def test_keys_the_serializer_refuses_take_the_python_pass_into_dead_letters(
    session: Any, job_id: str, tmp_path: Path
) -> None:
    """``bytes`` keys are routed by a Python pass; a null one there is a dead letter too (static run)."""
    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "statekit"))
    session.conf.set("spark.statekit.parallelism", "3")
    session.conf.set("spark.statekit.bad-records.policy", "dead-letter")
    session.conf.set("spark.statekit.bad-records.dead-letter-path", str(tmp_path / "dead"))
    rows = [(f"/u{i % 5}".encode() if i % 9 else None, "GET", i) for i in range(200)]
    df = session.createDataFrame(rows, "url binary, request string, bytes long")
    info = keyed(df, "url", key_type=bytes).process(CountUrlsBatch, "url binary, n long", job_id=job_id).run()
    nulls = sum(1 for r in rows if r[0] is None)
    assert (info.bad_records, info.records) == (nulls, len(rows) - nulls)
    letters = letters_in(tmp_path / "dead")
    assert len(letters) == nulls and {x["batch"] for x in letters} == {0}
    assert {x["query_id"] for x in letters} == {"static"} and all(x["file"] is None for x in letters)
    assert sorted(eval(x["raw"])["bytes"] for x in letters) == [r[2] for r in rows if r[0] is None]  # noqa: S307


#: Microseconds since the epoch of a timestamp in the year 201841: Spark holds it, Python's datetime cannot.
OUT_OF_RANGE = 6_307_200_000_000_000_000


def _timestamp_keys(session: Any, every: int) -> Any:
    """120 rows keyed by a timestamp; every ``every``-th one (from the third) past Python's datetime range."""
    from pyspark.sql import functions as F

    return session.range(0, 120, numPartitions=2).select(
        F.when(F.col("id") % every == 3, F.timestamp_micros(F.lit(OUT_OF_RANGE)))
        .otherwise(F.timestamp_micros(F.col("id") % 7 * 1_000_000))
        .alias("url"),
        F.lit("GET").alias("request"),
        F.col("id").alias("bytes"),
    )


@pytest.mark.parametrize("function", [CountUrls, CountUrlsBatch], ids=["per-record", "vectorized"])
def test_keys_python_cannot_hold_are_bad_records_row_by_row(
    session: Any, job_id: str, tmp_path: Path, function: Any
) -> None:
    """A key Arrow cannot convert to Python (a timestamp past the year 9999): a bad record, no failed task."""
    from statekit.serializers import PickleSerializer

    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "statekit"))
    session.conf.set("spark.statekit.parallelism", "2")
    session.conf.set("spark.statekit.bad-records.policy", "dead-letter")
    session.conf.set("spark.statekit.bad-records.dead-letter-path", str(tmp_path / "dead"))
    df = _timestamp_keys(session, every=10)
    info = (
        keyed(df, "url", key_type=PickleSerializer())
        .process(function, "url timestamp, n long", job_id=job_id)
        .run()
    )
    assert (info.bad_records, info.records) == (12, 108)
    letters = letters_in(tmp_path / "dead")
    # The raw row shows the key as Arrow holds it, with why Python cannot.
    assert sorted(int(re.search(r"'bytes': (\d+)", x["raw"])[1]) for x in letters) == list(range(3, 120, 10))
    for x in letters:
        assert x["stage"] == "key" and x["batch"] == 0, x
        assert x["error"].startswith(f"ValueError: value {OUT_OF_RANGE} (timestamp[us, tz="), x["error"]
        assert "of column 'url' cannot be converted to Python" in x["error"], x["error"]
        assert f"'url': <{OUT_OF_RANGE} (timestamp[us, tz=" in x["raw"] and "out of range" in x["raw"]


def test_under_fail_a_key_python_cannot_hold_stops_the_batch_naming_it(
    session: Any, job_id: str, tmp_path: Path
) -> None:
    from statekit.serializers import PickleSerializer

    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "statekit"))
    session.conf.set("spark.statekit.parallelism", "2")
    with pytest.raises(Exception) as info:
        keyed(_timestamp_keys(session, every=1000), "url", key_type=PickleSerializer()).process(
            CountUrls, "url timestamp, n long", job_id=job_id
        ).run()
    message = str(info.value)
    assert "BadRecordError: bad record (key) at micro-batch 0: ValueError: value " in message, message
    assert f"{OUT_OF_RANGE} (timestamp[us" in message and "cannot be converted to Python" in message
    assert FileSystemCheckpointStorage(str(tmp_path / "statekit")).latest_checkpoint(job_id) is None
