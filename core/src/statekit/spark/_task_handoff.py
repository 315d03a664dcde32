"""The task's side of the hand-off: asking the sibling worker that holds a subtask open, and answering.

:mod:`._handoff` moves a task's rows between the Python workers of one
executor and knows nothing of tasks; this module decides with the task's
plan and the worker's cache: whether a task's subtask is open in a sibling
at exactly the attempt the checkpoint recorded (then its rows go there),
whether this worker holds what a sibling's task asks for, and what a worker
announces after a task.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from . import _cache, _handoff
from ._acquire import local_root, reusable
from ._plan import InlineMetadata, StoredMetadata, TaskPlan
from ._routing import SUBTASK_COLUMN

__all__ = ["accepts_handoff", "announce", "hand_off"]


def _job_key(plan: TaskPlan) -> str:
    return f"{plan.job_id}/{plan.operator_id}"


def hand_off(
    plan: TaskPlan, metadata: Any, first: Any, rest: Iterator[Any], attempt_id: Any, attempt_number: int
) -> Iterator[Any] | None:
    """The partition handed to the sibling worker holding its subtask open; None to run it here.

    Only when the subtask's state, at exactly the attempt the checkpoint
    recorded, is open in another Python worker of this executor (see
    :mod:`._handoff`).
    """
    if not first.num_rows:
        return None
    index = first.column(SUBTASK_COLUMN)[0].as_py()
    wanted = plan.restore_attempts.get(index)
    if wanted is None:
        return None
    mine = _cache.holds(plan, index)
    if mine is not None and mine.attempt == wanted:
        return None  # open here
    root = local_root(plan)
    owner = _handoff.owner_of(root, _job_key(plan), index)
    if owner is None or owner[0] == os.getpid() or owner[1] != wanted:
        return None
    if not isinstance(metadata, (InlineMetadata, StoredMetadata)):
        metadata = InlineMetadata(metadata.value)  # a broadcast's bytes: the sibling may not have loaded it
    header = {
        "plan": plan,
        "metadata": metadata,
        "subtask": index,
        "attempt_id": attempt_id,
        "attempt_number": attempt_number,
        "from": os.getpid(),
    }
    timeout = float(plan.config.get("statekit.spark.worker-handoff.timeout"))
    return _handoff.forward(root, owner[0], header, first, rest, timeout)


def accepts_handoff(header: dict[str, Any]) -> bool:
    """Whether this process holds the subtask a handed-off task asks for, at the attempt it wants."""
    plan = header.get("plan")
    if not isinstance(plan, TaskPlan):
        return False
    index = header.get("subtask")
    if not isinstance(index, int):
        return False
    entry = _cache.holds(plan, index)
    return entry is not None and reusable(entry, plan, index)


def announce(plan: TaskPlan, indices: list[int], attempt: str, serve: _handoff.Handle) -> str:
    """Say that this worker holds ``indices`` open, made by ``attempt``; what ``BatchInfo.handoff`` says.

    ``serve`` runs a sibling's handed-off task here.
    """
    if not plan.config.get("statekit.spark.worker-handoff"):
        return "off: statekit.spark.worker-handoff=false"
    with contextlib.suppress(OSError):  # hand-off only ever saves a restore
        _handoff.announce(local_root(plan), _job_key(plan), indices, attempt, accepts_handoff, serve)
    return _handoff.status()  # "off: <why>" when this worker's directory was refused
