"""Fencing: of two runs of one job, only the newest completes checkpoints.

A run (a ``LocalRunner`` that runs, a Spark query's coordinator) registers with
its checkpoint storage before its first checkpoint and gets an epoch higher
than any recorded (Flink's leader epoch). Before it writes a checkpoint and
again right before the checkpoint's ``_metadata``, it checks that it is still
the newest run; an older run stops with :class:`FencedError` naming the newer
one, and deletes nothing (the files may be the newer run's). Storages that do
not implement :class:`SupportsRunFencing` are not fenced.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
import time
import uuid
from typing import Any

from .._contracts import CheckpointStorage, SupportsRunFencing
from .._errors import FencedError

__all__ = ["RunFence", "describe_run", "takeover_note"]


def describe_run(run_id: str, description: dict[str, Any], epoch: int | None = None) -> str:
    """``run 1a2b3c4d5e6f (epoch 3): LocalRunner, pid 123 on host h, started 2025-01-01T10:00:00Z``."""
    started = description.get("started_ms")
    when = (
        dt.datetime.fromtimestamp(started / 1000, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        if isinstance(started, int)
        else "at an unknown time"
    )
    parts = [
        f"run {run_id[:12]}" + (f" (epoch {epoch})" if epoch is not None else ""),
        f": {description.get('runner', 'an unknown runner')}, pid {description.get('pid', '?')}",
        f" on host {description.get('host', '?')}, started {when}",
    ]
    if description.get("ended_ms") is not None:
        parts.append(" (ended)")
    return "".join(parts)


def _when(ms: int) -> str:
    at = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    ago = max(0, time.time_ns() // 1_000_000 - ms) // 1000
    return f"{at} ({ago} s ago)" if ago < 7200 else at


def takeover_note(storage: CheckpointStorage, job_id: str, last_written_ms: int | None = None) -> str:
    """What taking over ``job_id`` (``restore='latest'``) would do to the run that has it now, in words.

    The job's newest registered run, whether it recorded its end, and when the
    job's latest checkpoint was written: a run that never ended may still be
    running (or was killed), and a newer run that takes over the job fences it
    off, so it fails at its next checkpoint. ``""`` when the storage does not
    fence runs and nothing is known of the writer.
    """
    when = f" The latest checkpoint was written at {_when(last_written_ms)}." if last_written_ms else ""
    newest = storage.newest_run(job_id) if isinstance(storage, SupportsRunFencing) else None
    if newest is None:
        return when.strip()
    epoch, run_id, description = newest
    ended = description.get("ended_ms")
    if ended is not None:
        who = describe_run(run_id, {k: v for k, v in description.items() if k != "ended_ms"}, epoch)
        return f"Its newest {who} ended at {_when(int(ended))}.{when}"
    who = describe_run(run_id, description, epoch)
    return (
        f"Its newest {who} never recorded an end: it may still be running (or was killed).{when} "
        "Taking the job over (restore='latest') fences that run off: it stops with a FencedError at its "
        "next checkpoint. Stop it first if it still runs, or give this query another job_id"
    )


class RunFence:
    """One run's claim on a job's checkpoints: :meth:`claim` once, then :meth:`check` before writing.

    Attributes:
        run_id: This run's id (random).
        epoch: The epoch the storage gave this run; None before :meth:`claim`
            or when the storage does not fence.
        displaced: The description of the newest run before this one, if it had
            not ended: its last checkpoint may still be in flight.
    """

    def __init__(self, storage: CheckpointStorage, job_id: str, runner: str) -> None:
        self.storage = storage
        self.job_id = job_id
        self.run_id = uuid.uuid4().hex
        self.description: dict[str, Any] = {
            "runner": runner,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_ms": time.time_ns() // 1_000_000,
        }
        self.epoch: int | None = None
        self.displaced: dict[str, Any] | None = None

    @property
    def fenced_storage(self) -> SupportsRunFencing | None:
        """The storage, if it fences runs."""
        return self.storage if isinstance(self.storage, SupportsRunFencing) else None

    def claim(self) -> None:
        """Register this run as the job's newest (once; later calls do nothing).

        Raises:
            CheckpointError: If the storage cannot record it (the store is down).
        """
        storage = self.fenced_storage
        if storage is None or self.epoch is not None:
            return
        before = storage.newest_run(self.job_id)
        self.epoch = storage.register_run(self.job_id, self.run_id, self.description)
        if before is not None and before[1] != self.run_id and before[2].get("ended_ms") is None:
            self.displaced = {"run_id": before[1], "epoch": before[0], **before[2]}

    def check(self) -> None:
        """Raise :class:`FencedError` if a newer run of the job registered since :meth:`claim`.

        Raises:
            FencedError: Naming this run and the newer one.
            CheckpointError: If the storage cannot be read.
        """
        storage = self.fenced_storage
        if storage is None or self.epoch is None:
            return
        newest = storage.newest_run(self.job_id)
        if newest is None or newest[1] == self.run_id:
            # None: the records were deleted (the job's directory removed by hand); nothing newer.
            return
        epoch, run_id, description = newest
        if (epoch, run_id) < (self.epoch, self.run_id):
            return  # only an older run's record is left (ours was deleted): nothing newer
        raise FencedError(
            f"statekit job {self.job_id!r}: this {describe_run(self.run_id, self.description, self.epoch)} "
            f"is fenced off: a newer {describe_run(run_id, description, epoch)} took over the job's "
            "checkpoints, so this run completes no more of them and deletes nothing. Two runs of one job "
            "must not write its checkpoints at once: stop this one (the newer run goes on from the "
            "checkpoints), or give one of them another job id"
        )

    def end(self) -> None:
        """Record that this run ended (best effort; a run that is killed never does)."""
        storage = self.fenced_storage
        if storage is None or self.epoch is None:
            return
        # Best effort: a later run then just assumes this one's last checkpoint may be in flight.
        with contextlib.suppress(Exception):
            storage.end_run(self.job_id, self.run_id)
