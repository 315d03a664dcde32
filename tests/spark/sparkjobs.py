"""Keyed functions for the Spark tests (statekit.spark ships them to the executors by value)."""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Iterable
from typing import Any

from jobs import CountUrls, CountUrlsBatch, CountUrlsColumns
from statekit import ColumnsContext, ProcessContext, RuntimeContext


class FailFirstAttempts:
    """Fails a task's first attempt at its ``FAIL_AT``-th record: partition 0's always, others at random.

    Partition 0 always fails once, so every run injects at least one failure.
    Each injected failure leaves a file in ``marker_dir`` ("" injects none).
    """

    FAIL_AT = 5

    def __init__(self, marker_dir: str, seed: str) -> None:
        self.marker_dir = marker_dir
        self.seed = seed
        self._attempt = -1
        self._n = 0

    def __call__(self) -> None:
        from pyspark import TaskContext

        tc = TaskContext.get()
        if not self.marker_dir or tc is None or tc.attemptNumber() != 0:
            return
        if tc.taskAttemptId() != self._attempt:
            self._attempt, self._n = tc.taskAttemptId(), 0
        self._n += 1
        pick = (
            tc.partitionId() == 0
            or random.Random(f"{self.seed}/{tc.stageId()}/{tc.partitionId()}").random() < 0.5
        )
        if self._n == self.FAIL_AT and pick:
            name = f"stage{tc.stageId()}-part{tc.partitionId()}-{tc.taskAttemptId()}"
            with open(os.path.join(self.marker_dir, name), "w"):
                pass
            raise RuntimeError(f"injected failure in {name}")


class FlakyCountUrls(CountUrls):
    """CountUrls whose tasks fail midway on their first attempt (see :class:`FailFirstAttempts`).

    The failure comes after the task changed state for a few records, so a runner
    that kept or reused that state would count those records twice.
    """

    def __init__(self, marker_dir: str, seed: str = "") -> None:
        self.fail = FailFirstAttempts(marker_dir, seed)

    def open(self, ctx: RuntimeContext) -> None:
        super().open(ctx)

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        self.fail()
        return super().process(record, ctx)


class FlakyCountUrlsBatch(CountUrlsBatch):
    """CountUrlsBatch whose tasks fail midway on their first attempt (at their fifth key)."""

    def __init__(self, marker_dir: str, seed: str = "") -> None:
        self.fail = FailFirstAttempts(marker_dir, seed)

    def process_batch(self, rows: Any, ctx: ProcessContext) -> Any:
        self.fail()
        return super().process_batch(rows, ctx)


class FlakyCountUrlsColumns(CountUrlsColumns):
    """CountUrlsColumns whose tasks fail on their first attempt, after their first call changed state."""

    def __init__(self, marker_dir: str, seed: str = "") -> None:
        self.fail = FailFirstAttempts(marker_dir, seed)

    def process_columns(self, rows: Any, keys: list[Any], ctx: ColumnsContext) -> Any:
        out = super().process_columns(rows, keys, ctx)
        for _ in range(FailFirstAttempts.FAIL_AT):  # the call counts as FAIL_AT records
            self.fail()
        return out


def flaky_windowed_count(marker_dir: str, seed: str = "") -> Any:
    """A count per URL and minute (WindowedAggregate) whose first task attempts fail midway.

    The failure comes after the task added records to windows and registered
    timers, so a retry that kept that state would count them twice or fire a
    timer twice. See :class:`FailFirstAttempts` ("" for no failures).
    """
    from statekit.windows import Count, TumblingEventTimeWindows, WindowedAggregate

    class Flaky(WindowedAggregate):
        def __init__(self) -> None:
            super().__init__(TumblingEventTimeWindows("1 minute"), Count())
            self.fail = FailFirstAttempts(marker_dir, seed)

        def process(self, record: Any, ctx: ProcessContext) -> Any:
            self.fail()
            return super().process(record, ctx)

    return Flaky


class StallOnceCountUrls(CountUrls):
    """CountUrls whose first task attempt that *reused* a subtask kept open by its executor stalls.

    Only once per job (the first to create ``<marker_dir>/stalled.json``), from
    micro-batch 1 on: it writes its Python worker's pid, subtask, batch and task
    attempt there and waits (for ``<marker_dir>/release``, at most two minutes),
    so a test can kill that executor while the task runs. The subtask's state
    lived only in that executor's cache and in the checkpoint storage: the retry
    must restore it from the storage.
    """

    def __init__(self, marker_dir: str) -> None:
        self.marker_dir = marker_dir
        self._opened_in: int | None = None
        self._checked: int | None = None

    def open(self, ctx: RuntimeContext) -> None:
        from pyspark import TaskContext

        super().open(ctx)
        tc = TaskContext.get()
        self._opened_in = tc.taskAttemptId() if tc is not None else None

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc is not None and tc.taskAttemptId() != self._checked:
            self._checked = tc.taskAttemptId()
            batch = int(tc.getLocalProperty("streaming.sql.batchId") or -1)
            reused = self._opened_in != tc.taskAttemptId()
            if batch >= 1 and reused and tc.attemptNumber() == 0:
                self._stall_once(batch, tc.taskAttemptId())
        return super().process(record, ctx)

    def _stall_once(self, batch: int, task: int) -> None:
        import json
        import time

        flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
        try:
            fd = os.open(os.path.join(self.marker_dir, "stalled.json"), flags)
        except FileExistsError:
            return  # another task stalled already
        info = {"pid": os.getpid(), "subtask": self.index, "batch": batch, "task": task}
        os.write(fd, json.dumps(info).encode())
        os.close(fd)
        release = os.path.join(self.marker_dir, "release")
        deadline = time.monotonic() + 120
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.1)


class StampedCountUrls(CountUrls):
    """CountUrls whose outputs differ between two runs of a batch: each URL carries a random stamp.

    What a function that reads the clock or a random source emits; its state is
    CountUrls' own, exact however often a batch runs.
    """

    def process(self, record: dict[str, Any], ctx: ProcessContext) -> Iterable[Any]:
        for url, n in super().process(record, ctx):
            yield (f"{url}#{uuid.uuid4().hex[:8]}", n)
