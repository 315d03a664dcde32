"""Raw keyed and raw operator state on Spark: counts kept only as raw bytes, rescaled 2 → 3 → 1."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sparkutil import OUTPUT, assert_exact_outputs, run_to_end, stream_of, write_inputs

from jobs import make_records
from statekit import (
    KeyedProcessFunction,
    ProcessContext,
    RawStateRestoreContext,
    RawStateSnapshotContext,
    RuntimeContext,
)
from statekit.errors import StateMigrationError
from statekit.spark import BatchInfo, keyed
from statekit.state_processor import SavepointReader

RECORDS = make_records(600, urls=25, seed=3)


class RawCountUrls(KeyedProcessFunction):
    """Counts per URL in a dict per key group kept only as raw keyed state; one raw item per fresh subtask."""

    def __init__(self) -> None:
        self.counts: dict[int, Counter[str]] = {}
        self.items: list[bytes] | None = None

    def restore_raw_state(self, ctx: RawStateRestoreContext) -> None:
        self.counts = {kg: Counter(json.loads(data)) for kg, data in ctx.raw_keyed_state.items()}
        self.items = list(ctx.raw_operator_items)

    def open(self, ctx: RuntimeContext) -> None:
        self.runtime = ctx
        if self.items is None:
            self.items = [f"origin-{ctx.subtask_index}".encode()]

    def process(self, record: Any, ctx: ProcessContext) -> Iterator[Any]:
        counts = self.counts.setdefault(self.runtime.key_group_of(ctx.current_key), Counter())
        counts[ctx.current_key] += 1
        yield ctx.current_key, counts[ctx.current_key]

    def snapshot_raw_state(self, ctx: RawStateSnapshotContext) -> None:
        for kg, counts in self.counts.items():
            ctx.raw_keyed_output(kg).write(json.dumps(dict(counts)).encode())
        for item in self.items or []:
            ctx.add_raw_operator_item(item)


def test_raw_state_rescales_2_3_1_on_spark(session: Any, tmp_path: Path, job_id: str) -> None:
    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "statekit"))
    infos: list[BatchInfo] = []
    done = 0
    first_items: list[bytes] = []
    for run, (p, size) in enumerate([(2, 200), (3, 250), (1, 150)]):
        session.conf.set("spark.statekit.parallelism", str(p))
        write_inputs(tmp_path / "in", RECORDS[done : done + size], 1, start=run)
        done += size
        processed = (
            keyed(stream_of(session, tmp_path / "in"), "url")
            .process(RawCountUrls, OUTPUT, job_id=job_id, on_batch=infos.append)
            .write_files(str(tmp_path / "out"))
        )
        run_to_end(processed, tmp_path / "spark")  # the same query, restarted at a new parallelism
        assert infos[-1].parallelism == p
        storage = processed.checkpoint_storage()
        raw = SavepointReader.open(storage.latest_checkpoint(job_id), storage=storage).raw_state("process")
        counts: Counter[str] = Counter()
        for data in raw.keyed.values():
            counts.update(json.loads(data))
        assert counts == Counter(r["url"] for r in RECORDS[:done])
        first_items = first_items or sorted(raw.items)
        assert first_items and sorted(raw.items) == first_items  # split and gathered, none lost or doubled
    # Every URL counted 1..n across both rescales: the raw bytes went to the subtask owning the key.
    assert_exact_outputs(tmp_path / "out", RECORDS)


class CountsWithoutRawRestore(KeyedProcessFunction):
    def process(self, record: Any, ctx: ProcessContext) -> Iterator[Any]:
        yield ctx.current_key, 0


def test_raw_state_into_a_function_without_restore_hook_is_refused_on_the_driver(
    session: Any, tmp_path: Path, job_id: str
) -> None:
    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "statekit"))
    session.conf.set("spark.statekit.parallelism", "2")
    write_inputs(tmp_path / "in", RECORDS[:50], 1)

    def query(function: type) -> Any:
        return (
            keyed(stream_of(session, tmp_path / "in"), "url")
            .process(function, OUTPUT, job_id=job_id)
            .write_files(str(tmp_path / "out"))
        )

    run_to_end(query(RawCountUrls), tmp_path / "spark")
    with pytest.raises(StateMigrationError, match="declares no restore_raw_state"):
        run_to_end(query(CountsWithoutRawRestore), tmp_path / "spark")
