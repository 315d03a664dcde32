"""Upgrades on the LocalRunner: an explicit restore of a job with history takes that savepoint, state and
source position, and the history says so; restarted from its own checkpoints, the job keeps saying so."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from statekit import (
    KeyedProcessFunction,
    LocalRunner,
    ProcessContext,
    RecordSource,
    RuntimeContext,
    ValueStateDescriptor,
)
from statekit.checkpointing import load_checkpoint, read_checkpoint_history
from statekit.state_processor import SavepointReader

RECORDS = [{"url": f"/u{i % 7}"} for i in range(300)]


class Count(KeyedProcessFunction):
    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", int, default=0))

    def process(self, record: Any, ctx: ProcessContext) -> Iterable[Any]:
        self.count.update(self.count.value() + 1)
        return ()


def runner(ckpt: Path) -> LocalRunner:
    return LocalRunner(
        Count, key_selector=lambda r: r["url"], job_id="job",
        config={"statekit.checkpoints.dir": str(ckpt), "statekit.checkpoint.interval-records": 50},
    )  # fmt: skip


def counts(location: str) -> dict[str, int]:
    with SavepointReader.open(location) as reader:
        return {r["key"]: r["value"] for b in reader.read("process", "count") for r in b.to_pylist()}


def test_an_older_savepoint_restored_over_history_is_taken_whole_and_recorded(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    source = RecordSource(RECORDS)
    first = runner(ckpt)
    first.run(source, max_records=100)
    savepoint = first.savepoint(str(tmp_path / "sp"))
    first.run(source)  # the job goes on past the savepoint: 300 records
    first.close()
    storage = first.storage
    assert counts(storage.latest_checkpoint("job")) == Counter(r["url"] for r in RECORDS)

    # Rolling back: the savepoint's state and its source position (record 100 on), not the job's latest.
    second = runner(ckpt)
    result = second.run(RecordSource(RECORDS), restore=savepoint)
    second.close()
    assert result.restored_from == savepoint and result.restore_origin == savepoint
    assert result.records == 200
    latest = storage.latest_checkpoint("job")
    assert counts(latest) == Counter(r["url"] for r in RECORDS)
    assert load_checkpoint(storage, latest).metadata.properties["restore_origin"]["location"] == savepoint
    # Restarted from its own checkpoints, the job's history still names the restore it descends from.
    third = runner(ckpt)
    more = RECORDS + [{"url": "/new"}]
    again = third.run(RecordSource(more), restore="latest")
    third.close()
    assert again.records == 1 and again.restore_origin == savepoint
    history = read_checkpoint_history(storage, "job")
    assert history[-1].restore_origin == savepoint
    assert history[0].restore_origin is None  # before the restore


def test_a_file_source_position_takes_its_newest_compaction_and_the_entries_up_to_the_saved_offset(
    tmp_path: Path,
) -> None:
    from statekit.checkpoints._source_position import SparkLocation, capture, matches, seed

    loc = tmp_path / "spark"
    (loc / "sources" / "0").mkdir(parents=True)
    (loc / "sources" / "1").mkdir(parents=True)
    (loc / "offsets").mkdir()
    (loc / "metadata").write_text('{"id":"q-1"}\n')
    for i in range(14):  # a file source's log, compacted at 9: the saved batch read up to entry 11
        name = f"{i}.compact" if i == 9 else str(i)
        (loc / "sources" / "0" / name).write_text(f'v1\n{{"path":"file:///in/f{i}","batchId":{i}}}\n')
    (loc / "sources" / "1" / "0").write_text('v1\n{"t":{"0":0}}')  # Kafka's initial offsets
    entry = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n{"logOffset":11}\n{"t":{"0":42}}'
    (loc / "offsets" / "6").write_text(entry)
    (loc / "offsets" / "7").write_text(entry.replace("11", "13"))  # a batch after the savepoint
    position = capture(str(loc), "q-1", 6)
    assert sorted(position.files) == [
        "metadata", "offsets/6", "sources/0/10", "sources/0/11", "sources/0/9.compact", "sources/1/0",
    ]  # fmt: skip
    assert position.source_offsets() == ['{"logOffset":11}', '{"t":{"0":42}}']

    new = tmp_path / "new"
    query = seed(position, str(new))
    assert query != "q-1" and SparkLocation(str(new)).query_id() == query
    assert (new / "offsets" / "5").read_text() == entry == (new / "offsets" / "6").read_text()
    assert (new / "commits" / "6").read_text().startswith("v1\n")
    assert SparkLocation(str(new)).next_batch() == 7 and matches(SparkLocation(str(new)), position)
    assert not (new / "sources" / "0" / "12").exists()
