"""What a Spark restore tells in BatchInfo: the states the function no longer declares, kept."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from sparkutil import OUTPUT, run_to_end, stream_of, write_inputs

from jobs import COUNT, CountUrls, make_records
from statekit import KeyedProcessFunction, ProcessContext, RuntimeContext
from statekit.spark import BatchInfo, keyed

RECORDS = make_records(300, urls=20, seed=5)


class CountOnly(KeyedProcessFunction):
    """CountUrls without its list, reducing, operator and broadcast states."""

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(COUNT)

    def process(self, record: Any, ctx: ProcessContext) -> Iterable[Any]:
        n = self.count.value() + 1
        self.count.update(n)
        yield ctx.current_key, n


def test_batch_info_names_restored_states_the_function_does_not_declare(
    session: Any, tmp_path: Path, job_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "statekit"))
    session.conf.set("spark.statekit.parallelism", "2")
    infos: list[BatchInfo] = []
    for run, function in enumerate([CountUrls, CountOnly]):
        write_inputs(tmp_path / "in", RECORDS[run * 150 : (run + 1) * 150], 1, start=run)
        processed = (
            keyed(stream_of(session, tmp_path / "in"), "url")
            .process(function, OUTPUT, job_id=job_id, on_batch=infos.append)
            .write_files(str(tmp_path / "out"))
        )
        with caplog.at_level(logging.WARNING, logger="statekit.state"):
            run_to_end(processed, tmp_path / "spark")
    assert infos[0].undeclared_states == {}
    assert infos[-1].undeclared_states == {
        "keyed": ["bytes", "last_methods"],
        "operator": ["rules", "seen_by_subtask"],
    }
    assert any("keyed state 'bytes', 'last_methods'" in r.getMessage() for r in caplog.records)
