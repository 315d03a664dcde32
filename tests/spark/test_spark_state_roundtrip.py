"""Bootstrapped savepoints on Spark: written from rows or from a DataFrame, run, read back as the model."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sparkutil import OUTPUT, SCHEMA, read_outputs

from jobs import make_records
from statekit import ListStateDescriptor, LocalRunner
from statekit.errors import StateError
from statekit.spark import keyed, write_savepoint
from statekit.state_processor import SavepointReader, SavepointWriter
from statekit_urlcount import COUNT_STATE, CountPerUrl

BOOT = {f"/api/{i}": 1000 + i for i in range(0, 50, 2)}
TAGS = ListStateDescriptor("tags", str)


def counts_of(reader: SavepointReader, state: str = "count") -> dict[str, int]:
    t = reader.read_table("process", state)
    return dict(zip(t.column("key").to_pylist(), t.column("value").to_pylist()))


def bootstrap_from_dataframe(session: Any, target: Path) -> str:
    counts = session.createDataFrame(list(BOOT.items()), "key string, value long")
    tags = session.createDataFrame(
        [(k, i, f"t{i}") for k in list(BOOT)[:5] for i in range(3)], "key string, position int, value string"
    )
    return write_savepoint(str(target), {COUNT_STATE: counts, TAGS: tags}, parallelism=3, max_parallelism=128)


@pytest.mark.parametrize("source", ["rows", "dataframe"])
def test_a_bootstrapped_savepoint_runs_on_spark_and_reads_back_as_the_model(
    session: Any, tmp_path: Path, job_id: str, source: str
) -> None:
    if source == "rows":
        boot = SavepointWriter.new(max_parallelism=128).with_state("process", COUNT_STATE, BOOT)
        boot.with_state("process", TAGS, {k: [f"t{i}" for i in range(3)] for k in list(BOOT)[:5]})
        location = boot.write(str(tmp_path / "boot"))
    else:
        location = bootstrap_from_dataframe(session, tmp_path / "boot")
    written = SavepointReader.open(location)
    assert counts_of(written) == BOOT
    assert written.get("process", "tags", list(BOOT)[0]) == ["t0", "t1", "t2"]
    if source == "dataframe":  # written in parallel: one file per subtask that has keys
        assert written.operators()[0].parallelism == 3

    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "statekit"))
    session.conf.set("spark.statekit.parallelism", "2")
    records = make_records(900, urls=50, seed=4)
    df = session.createDataFrame(records, SCHEMA)
    info = (
        keyed(df, "url")
        .process(CountPerUrl, OUTPUT, job_id=job_id, allow_non_restored_state=False)
        .write_files(str(tmp_path / "out"))
        .run(restore=location)
    )
    assert info.restored_from == location
    seen: Counter[str] = Counter(BOOT)
    expected = []
    for r in records:
        seen[r["url"]] += 1
        expected.append((r["url"], seen[r["url"]]))
    assert sorted((u, n) for u, n, _ in read_outputs(tmp_path / "out")) == sorted(expected)
    latest = SavepointReader.latest(str(tmp_path / "statekit"), job_id)
    assert counts_of(latest) == dict(seen)
    # The job does not declare "tags"; its entries are carried along untouched.
    assert latest.get("process", "tags", list(BOOT)[1]) == ["t0", "t1", "t2"]

    # The LocalRunner restores the same savepoint, at another parallelism.
    out: list[Any] = []
    local = LocalRunner(
        CountPerUrl,
        key_selector=lambda r: r["url"],
        config={"statekit.parallelism": 3, "statekit.checkpoints.dir": str(tmp_path / "local")},
        sink=out.append,
    )
    local.run(records, restore=location)
    assert sorted(out) == sorted(expected)


def test_write_savepoint_refuses_missing_columns_and_duplicate_keys_and_leaves_nothing(
    session: Any, tmp_path: Path
) -> None:
    bad = session.createDataFrame([("a", 1)], "url string, value long")
    with pytest.raises(StateError, match=r"lacks columns \['key'\]"):
        write_savepoint(str(tmp_path / "sp"), {COUNT_STATE: bad})
    twice = session.createDataFrame([("a", 1), ("a", 2)], "key string, value long")
    with pytest.raises(Exception, match="appears twice"):
        write_savepoint(str(tmp_path / "sp"), {COUNT_STATE: twice}, parallelism=2)
    # No _metadata anywhere: nothing reads as a savepoint.
    assert not list((tmp_path / "sp").rglob("_metadata"))
