"""The task's report to the driver: one typed message per subtask, and its JSON in one place.

Each task ends with one row per subtask it served, whose handle column
carries a :class:`TaskReport` as JSON (:meth:`TaskReport.to_json`); the
driver reads them back with :meth:`TaskReport.from_json` and sums them into
the batch's :class:`~statekit.spark.BatchInfo`. :class:`SubtaskOrigin` says
how the task came by the subtask's state.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._errors import CheckpointError
from ..checkpoints._metadata import SubtaskState

__all__ = ["SubtaskOrigin", "TaskReport"]


class SubtaskOrigin(enum.Enum):
    """How a task came by a subtask's state."""

    REUSED = "reused"
    """Open in the Python worker that ran the task, at exactly the checkpoint's task attempt."""
    HANDED_OFF = "handed-off"
    """Open in a sibling Python worker of the executor, to which the task handed its rows."""
    RESTORED_LOCALLY = "local"
    """Restored reading nothing from the checkpoint storage: this executor's local copies, or
    state small enough to travel inside the checkpoint's metadata."""
    RESTORED_REMOTELY = "remote"
    """Restored reading files from the checkpoint storage (those without a usable local copy)."""
    NEW = "empty"
    """Started empty: the batch has no checkpoint to start from."""

    @property
    def reused(self) -> bool:
        """Whether open state was reused (here or in a sibling worker), not restored."""
        return self in (SubtaskOrigin.REUSED, SubtaskOrigin.HANDED_OFF)


@dataclass(frozen=True)
class TaskReport:
    """What a task says of one subtask it served: where its snapshot is, what the task did, its time.

    Attributes:
        subtask: The subtask's index.
        state: Its entry in the checkpoint's metadata (the snapshot's files).
        attempt: The task attempt that wrote the snapshot (the checkpoint records it).
        attempt_number: Spark's attempt number of the task.
        origin: How the task came by the subtask's state.
        pid: The Python worker that ran the subtask.
        handed_from: The worker whose task this was, when handed off (``origin`` then says so).
        records: Rows processed.
        outputs: Output records.
        late: Rows at or below the watermark.
        bad: Rows without a key group (reported with the task's first subtask).
        fired: Timers fired.
        max_event_time: The largest event time seen (None: none).
        downloaded: Bytes the restore read from the checkpoint storage.
        copies_rejected: Local copies there but not used.
        copy_rejections: Why, one line per rejected copy.
        local_recovery: ``"on"``, ``"off"`` or ``"off: <why>"``.
        handoff: ``"on"`` or ``"off: <why>"``.
        phases: Seconds the task spent per phase (``BatchInfo.phases``, summed over tasks).
        undeclared_states: Restored states the function does not declare, by kind.
        outputs_digest: A digest of every output and late row the task emitted (its run's
            fingerprint: two runs of a batch's task agree when their digests are equal).
    """

    subtask: int
    state: SubtaskState
    attempt: str
    attempt_number: int
    origin: SubtaskOrigin
    pid: int
    handed_from: int | None = None
    records: int = 0
    outputs: int = 0
    late: int = 0
    bad: int = 0
    fired: int = 0
    max_event_time: int | None = None
    downloaded: int = 0
    copies_rejected: int = 0
    copy_rejections: tuple[str, ...] = ()
    local_recovery: str = "off"
    handoff: str = "on"
    phases: Mapping[str, float] = field(default_factory=dict)
    undeclared_states: Mapping[str, list[str]] = field(default_factory=dict)
    outputs_digest: str = ""

    @property
    def reused(self) -> bool:
        """Whether the task reused open state (here or in a sibling worker)."""
        return self.origin.reused

    def to_json(self) -> str:
        """The report as the handle column carries it.

        ``how`` is the state's origin as restores name it (a handed-off
        subtask's is ``reused``); ``handed_from`` says whether it was handed off.
        """
        how = SubtaskOrigin.REUSED if self.origin is SubtaskOrigin.HANDED_OFF else self.origin
        return json.dumps(
            {
                "subtask": self.subtask,
                "state": self.state.to_json(),
                "records": self.records,
                "outputs": self.outputs,
                "late": self.late,
                "bad": self.bad,
                "fired": self.fired,
                "max_event_time": self.max_event_time,
                "reused": self.reused,
                "how": how.value,
                "downloaded": self.downloaded,
                "copies_rejected": self.copies_rejected,
                "copy_rejections": list(self.copy_rejections),
                "local_recovery": self.local_recovery,
                "pid": self.pid,
                "handed_from": self.handed_from,
                "attempt": self.attempt,
                "attempt_number": self.attempt_number,
                "phases": dict(self.phases),
                "handoff": self.handoff,
                "undeclared_states": dict(self.undeclared_states),
                "outputs_digest": self.outputs_digest,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> TaskReport:
        """A report from the handle column.

        Raises:
            CheckpointError: If it is no report (a task of another statekit version).
        """
        try:
            r: dict[str, Any] = json.loads(text)
            origin = SubtaskOrigin(r["how"])
            handed_from = None if r.get("handed_from") is None else int(r["handed_from"])
            if origin is SubtaskOrigin.REUSED and handed_from is not None:
                origin = SubtaskOrigin.HANDED_OFF
            mark = r.get("max_event_time")
            return cls(
                subtask=int(r["subtask"]),
                state=SubtaskState.from_json(r["state"]),
                attempt=str(r["attempt"]),
                attempt_number=int(r["attempt_number"]),
                origin=origin,
                pid=int(r["pid"]),
                handed_from=handed_from,
                records=int(r["records"]),
                outputs=int(r["outputs"]),
                late=int(r["late"]),
                bad=int(r["bad"]),
                fired=int(r["fired"]),
                max_event_time=None if mark is None else int(mark),
                downloaded=int(r["downloaded"]),
                copies_rejected=int(r["copies_rejected"]),
                copy_rejections=tuple(str(m) for m in r["copy_rejections"]),
                local_recovery=str(r["local_recovery"]),
                handoff=str(r["handoff"]),
                phases={str(k): float(v) for k, v in r["phases"].items()},
                undeclared_states={
                    str(k): [str(n) for n in v] for k, v in (r.get("undeclared_states") or {}).items()
                },
                outputs_digest=str(r.get("outputs_digest") or ""),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(
                f"a task's report cannot be read ({type(e).__name__}: {e}): {text[:200]}"
            ) from e
