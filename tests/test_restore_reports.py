"""What a LocalRunner restore tells: a migration's progress, and the states the function does not declare."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from statekit import (
    KeyedProcessFunction,
    ListStateDescriptor,
    LocalRunner,
    ProcessContext,
    RecordSource,
    RuntimeContext,
    ValueStateDescriptor,
)

RECORDS = [{"url": f"/u{i % 40}"} for i in range(400)]
OFFSETS = ListStateDescriptor("offsets", int)


class CountInt(KeyedProcessFunction):
    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", int, default=0))
        self.offsets = ctx.get_list_state(OFFSETS)
        self.index = ctx.subtask_index

    def process(self, record: Any, ctx: ProcessContext) -> Iterable[Any]:
        self.count.update(self.count.value() + 1)
        if not self.offsets.get():
            self.offsets.add(self.index)
        return ()


class CountFloat(KeyedProcessFunction):
    """``count`` widened to float: every entry is migrated at the restore."""

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", float, default=0.0))
        self.offsets = ctx.get_list_state(OFFSETS)

    def process(self, record: Any, ctx: ProcessContext) -> Iterable[Any]:
        self.count.update(self.count.value() + 1)
        return ()


class DeclaresNothing(KeyedProcessFunction):
    def process(self, record: Any, ctx: ProcessContext) -> Iterable[Any]:
        return ()


def _runner(tmp_path: Path, function: type, backend: str, p: int, **kw: Any) -> LocalRunner:
    config = {
        "statekit.checkpoints.dir": str(tmp_path / "ckpt"),
        "statekit.backend": backend,
        "statekit.parallelism": p,
        "statekit.max-parallelism": 128,
    }
    return LocalRunner(function, key_selector=lambda r: r["url"], config=config, **kw)


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_migrating_restore_reports_progress_to_the_log_and_the_callback(
    tmp_path: Path, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    r1 = _runner(tmp_path, CountInt, backend, 2)
    r1.run(RecordSource(RECORDS))
    r1.close()
    calls: list[tuple[str, int, int | None]] = []
    r2 = _runner(tmp_path, CountFloat, backend, 3, on_migration_progress=lambda *a: calls.append(a))
    with caplog.at_level(logging.INFO, logger="statekit.state"):
        r2.run(RecordSource([]), restore="latest")
    r2.close()
    # Each subtask reports from 0 to its total; the totals cover every key once.
    finals = [c for c in calls if c[0] == "count" and c[1] == c[2] and c[2]]
    assert sum(total or 0 for _, _, total in finals) == len(Counter(r["url"] for r in RECORDS))
    # Totals only grow, and an ordered engine's are unknown (None) until its last report.
    assert all(done <= total for _, done, total in calls if total is not None)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(line.startswith("operator 'process' subtask 0: migrating state 'count'") for line in lines)
    assert any("migrated state 'count'" in line for line in lines)


def test_states_the_function_no_longer_declares_are_named_and_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    r1 = _runner(tmp_path, CountInt, "heap", 2)
    r1.run(RecordSource(RECORDS))
    r1.close()
    r2 = _runner(tmp_path, DeclaresNothing, "heap", 3)
    with caplog.at_level(logging.WARNING, logger="statekit.state"):
        result = r2.run(RecordSource([]), restore="latest")
    assert result.undeclared_states == {"keyed": ["count"], "operator": ["offsets"]}
    assert r2.undeclared_states == result.undeclared_states
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "keyed state 'count'; operator state 'offsets'" in warning.getMessage()
    r2.checkpoint()
    r2.close()
    # Kept: a later version that declares them again finds every count and offset.
    r3 = _runner(tmp_path, CountInt, "heap", 1)
    assert r3.run(RecordSource([]), restore="latest").undeclared_states == {}
    backend = r3.subtasks[0].keyed_backend
    count = backend.get_state(ValueStateDescriptor("count", int, default=0))
    counts = {}
    for key in backend.keys("count"):
        backend.set_current_key(key)
        counts[key] = count.value()
    assert counts == Counter(r["url"] for r in RECORDS)
    assert sorted(r3.subtasks[0].get_list_state(OFFSETS).get()) == [0, 1]
    r3.close()
