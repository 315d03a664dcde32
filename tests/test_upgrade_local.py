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
