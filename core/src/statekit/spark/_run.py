"""One task attempt's state: the subtasks it serves (acquired on their first row), its output, its time.

The loops (:mod:`._loops`) feed it rows, :mod:`._snapshots` snapshots what
it served and reports it; :mod:`._task` runs the steps in order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..runtime._subtask import Subtask
from ..timers import LatePolicy
from ._acquire import Acquired, RestoreSource, acquire
from ._bad_keys import BadKeys
from ._cache import OpenSubtask
from ._output import TaskOutput
from ._plan import TASK_PHASES, TaskPlan

__all__ = ["SubtaskCounts", "TaskRun"]


@dataclass(slots=True)
class SubtaskCounts:
    """What one task did with one subtask: rows, outputs, late rows, timers, the largest event time."""

    records: int = 0
    outputs: int = 0
    late: int = 0
    fired: int = 0
    max_event_time: int | None = None


class TaskRun:
    """One task attempt: the subtasks it serves, their outputs, and where its time went."""

    def __init__(self, plan: TaskPlan, source: RestoreSource, attempt: str) -> None:
        self.plan = plan
        self.source = source
        self.attempt = attempt
        self.out = TaskOutput(plan)
        self.active: dict[int, OpenSubtask] = {}
        self.acquired: dict[int, Acquired] = {}  # subtask -> how the task came by its state
        self.counts: dict[int, SubtaskCounts] = {}
        self.phases = dict.fromkeys(TASK_PHASES, 0.0)
        self.started = time.perf_counter()
        self.handed_from: int | None = None  # the sibling worker whose task this is, if handed off
        self.bad_keys = BadKeys(plan)

    def subtask(self, index: Any) -> Subtask:
        """The subtask ``index``, acquired (restored or reused) on its first row."""
        open_st = self.active.get(index)
        if open_st is not None:
            return open_st.subtask
        plan = self.plan
        if index is None:  # the loops hand such rows to bad_keys, never here
            raise ValueError(f"null key in column {plan.key_column!r}: every record needs a key")
        t = time.perf_counter()
        acquired = acquire(plan, index, self.source)
        self.phases["restore"] += time.perf_counter() - t
        open_st = acquired.subtask
        open_st.clock.now = plan.batch_timestamp_ms
        st = open_st.subtask
        st.timers.set_watermark(plan.watermark)
        self.active[index] = open_st
        self.acquired[index] = acquired
        self.counts[index] = SubtaskCounts()
        return st

    def late(self, counts: SubtaskCounts, ts: int, row: int, late_rows: list[int]) -> bool:
        """Whether row ``row`` (event time ``ts``) is late and left out; counts it, notes the event time.

        A late row (at or below the batch's watermark) goes to ``late_rows``
        when a late-records sink takes it, or to the function under the
        ``process`` policy (then this returns False).
        """
        if ts <= self.plan.watermark:
            counts.late += 1
            et = self.plan.event_time
            if et is None or et.late is not LatePolicy.PROCESS:
                if self.out.late_columns:
                    late_rows.append(row)
                return True
        if counts.max_event_time is None or ts > counts.max_event_time:
            counts.max_event_time = ts
        return False
