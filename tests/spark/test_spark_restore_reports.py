"""What a Spark restore tells in BatchInfo: the states the function no longer declares, kept."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from sparkutil import OUTPUT, SCHEMA, run_to_end, stream_of, write_inputs

from jobs import COUNT, CountUrls, make_records
from statekit import KeyedProcessFunction, ProcessContext, RuntimeContext, default_registry
from statekit.backend_api import hookimpl
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


class _RestoreListener:
    """Appends every ``statekit_restore_done`` of one job to a file (the hook runs in the Python workers)."""

    def __init__(self, job_id: str, path: str) -> None:
        self.listens_to = (job_id, path)

    @hookimpl
    def statekit_restore_done(
        self, job_id: str, checkpoint_id: int | None, subtask_index: int, parallelism: int
    ) -> None:
        if job_id == self.listens_to[0]:
            with open(self.listens_to[1], "a") as f:
                f.write(f"{checkpoint_id} {subtask_index} {parallelism}\n")


class HookedCount(CountOnly):
    """CountOnly that registers a restore listener in the process that makes it (once per process).

    Whether one listens is asked of the process's registry: this class may travel to the
    workers by value (with a copy of any module global), and again for every task.
    """

    def __init__(self, job_id: str, path: str) -> None:
        super().__init__()
        registry = default_registry()
        if all(getattr(p, "listens_to", None) != (job_id, path) for p in registry._pm.get_plugins()):
            registry._pm.register(_RestoreListener(job_id, path))


def test_restore_done_fires_once_per_subtask(session: Any, tmp_path: Path, job_id: str) -> None:
    """A hook implementation sees each subtask index: started empty at 3, restored at 2 (its hookspec)."""
    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "statekit"))
    heard = tmp_path / "restore_done.txt"
    factory = functools.partial(HookedCount, job_id, str(heard))
    for batch, p in enumerate([3, 2]):
        session.conf.set("spark.statekit.parallelism", str(p))
        df = session.createDataFrame(RECORDS[batch * 150 : (batch + 1) * 150], SCHEMA)
        keyed(df, "url").process(factory, OUTPUT, job_id=job_id).run(
            batch_id=batch, restore="latest" if batch else None
        )
    lines = sorted(tuple(line.split()) for line in heard.read_text().splitlines())
    started = [("None", str(i), "3") for i in range(3)]
    restored = [("1", str(i), "2") for i in range(2)]
    assert lines == sorted(started + restored)
