"""What a Python worker keeps between tasks: its open subtasks, and storages and backends by configuration.

A Python worker keeps the subtasks it served in a process-wide cache between
micro-batches. An entry is reused only when it holds *exactly* the state of the
checkpoint the driver says to start from. Entries are taken out of the cache
while a task works on them and put back only after the task processed every
row and wrote its snapshot, marked with the id of that task attempt (unique,
and random per batch run); the driver records in each checkpoint which attempt
wrote each subtask's snapshot, and a later task reuses an entry only if it was
made by that very attempt. A failed or killed task therefore leaves nothing
behind, a retried task restores from the checkpoint storage, and stale local
state is never used.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from .._contracts import CheckpointStorage, StateBackend
from ..plugins._config import Configuration
from ..runtime._configured import checkpoint_storage_from_config, state_backend_from_config
from ..runtime._subtask import Subtask
from ._plan import TaskPlan

__all__ = [
    "BatchClock",
    "OpenSubtask",
    "backend_for",
    "evict_stale",
    "holds",
    "put_back",
    "reset_cache",
    "storage_for",
    "take",
    "unsafe_local_recovery",
]


class BatchClock:
    """Processing time on Spark: the micro-batch's timestamp, the same for every task and retry."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


@dataclass(eq=False)
class OpenSubtask:
    """A subtask open in this Python worker, and which state it holds: of which run, batch and attempt."""

    subtask: Subtask
    run_id: str
    clock: BatchClock
    """The processing time its timers fire by: the micro-batch's timestamp."""
    token: str | None = None  # the batch whose state this is
    attempt: str | None = None  # the task attempt that made it (and wrote its snapshot)
    fingerprint: str | None = None
    """What it was made for (configuration, parallelism, function): a restarted query (another run)
    reuses it only for the same (see ``_acquire``)."""

    def close(self) -> None:
        """Close the subtask, best effort: it is being dropped, an error here must not hide the real one."""
        self.subtask.discard()


_LOCK = threading.Lock()
_CACHE: dict[tuple[str, str, int], OpenSubtask] = {}
_T = TypeVar("_T")
_STORAGES: dict[str, CheckpointStorage] = {}
_BACKENDS: dict[str, StateBackend] = {}
#: Local-recovery directories found unsafe in this process, and why: never checked again, never
#: written or deleted in (see _acquire.local_copies).
_UNSAFE_LOCAL_RECOVERY: dict[str, str] = {}


def reset_cache() -> None:
    """Close and forget every cached subtask of this process (tests, and shutdown)."""
    with _LOCK:
        entries = list(_CACHE.values())
        _CACHE.clear()
    for entry in entries:
        entry.close()


def _config_key(config: Configuration) -> str:
    return json.dumps(config.as_dict(), sort_keys=True, default=str)


def _one_per_configuration(
    table: dict[str, _T], config: Configuration, make: Callable[[Configuration], _T]
) -> _T:
    """``table``'s object for ``config``, made with ``make`` the first time (made outside the lock)."""
    key = _config_key(config)
    with _LOCK:
        found = table.get(key)
    if found is None:
        made = make(config)
        with _LOCK:
            found = table.setdefault(key, made)
    return found


def storage_for(config: Configuration) -> CheckpointStorage:
    """The checkpoint storage ``config`` names: one object per configuration and process."""
    return _one_per_configuration(_STORAGES, config, checkpoint_storage_from_config)


def backend_for(config: Configuration) -> StateBackend:
    """The state backend ``config`` names: one object per configuration and process."""
    return _one_per_configuration(_BACKENDS, config, state_backend_from_config)


def unsafe_local_recovery(root: str, reason: str | None = None) -> str | None:
    """Why local-recovery directory ``root`` was found unsafe in this process (None: it was not).

    With ``reason``, records it first: the directory is never checked, written or deleted in again.
    """
    with _LOCK:
        if reason is not None:
            _UNSAFE_LOCAL_RECOVERY[root] = reason
        return _UNSAFE_LOCAL_RECOVERY.get(root)


def evict_stale(plan: TaskPlan) -> None:
    """Drop cached subtasks of this job that can never be reused: older runs, older states."""
    stale = []
    with _LOCK:
        for key, entry in list(_CACHE.items()):
            if key[:2] != (plan.job_id, plan.operator_id):
                continue
            if entry.token not in (plan.restore_token, plan.token):
                stale.append(_CACHE.pop(key))
            elif entry.run_id != plan.run_id and entry.attempt != plan.restore_attempts.get(key[2]):
                # Another run's, and not the state the checkpoint this run restores holds.
                stale.append(_CACHE.pop(key))
    for entry in stale:
        entry.close()


def take(plan: TaskPlan, index: int) -> OpenSubtask | None:
    """Subtask ``index`` of the plan's job, out of the cache (a task works on it), if it is there."""
    with _LOCK:
        return _CACHE.pop((plan.job_id, plan.operator_id, index), None)


def holds(plan: TaskPlan, index: int) -> OpenSubtask | None:
    """Subtask ``index`` of the plan's job as the cache holds it (left there), if it does."""
    with _LOCK:
        return _CACHE.get((plan.job_id, plan.operator_id, index))


def put_back(plan: TaskPlan, entries: Iterable[tuple[int, OpenSubtask]]) -> None:
    """Subtasks a task finished with, into the cache: they hold the state of the plan's checkpoint."""
    with _LOCK:
        for index, st in entries:
            _CACHE[(plan.job_id, plan.operator_id, index)] = st
