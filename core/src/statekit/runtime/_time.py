"""Time in the embedded runner: the job's watermark, late records, and firing every subtask's timers.

As Flink keeps its timer services and watermarks apart from the record
processing, the :class:`~statekit.LocalRunner` hands time to a
:class:`TimeCoordinator`: the event-time watermark (the largest event time
minus the delay, never moving back, kept in each checkpoint's metadata),
which records are late and where they go, firing every subtask's event-time
timers as the watermark passes them and its processing-time timers when the
clock reaches them, and the end of a bounded input. The timers themselves
are keyed state in each subtask's :class:`~statekit.TimerService`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ..state._ttl import Clock
from ..timers import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    NO_TIMER,
    WATERMARK_PROPERTY,
    LatePolicy,
    ProcessingTimeHint,
)
from ..timers._eventtime import EventTime
from ..timers._service import TimeDomain, TimerService

__all__ = ["TimeCoordinator", "TimedSubtask", "end_of_time_message"]


class TimedSubtask(Protocol):
    """What the coordinator asks of a runner's subtask: its timer service, and firing its timers."""

    @property
    def timers(self) -> TimerService:
        """The subtask's timer service."""

    def fire(self, domain: TimeDomain, until: int, outputs: list[Any]) -> None:
        """Call ``on_timer`` for every timer of ``domain`` due at ``until``, collecting outputs."""


class TimeCoordinator:
    """Event time and processing time of one :class:`~statekit.LocalRunner`'s subtasks.

    Args:
        subtasks: The runner's current subtasks (asked each time: a restore replaces them).
        event_time: Where records' event times come from, the delay and the late policy;
            None: no event time (the watermark stays ``MIN_WATERMARK``).
        clock: The clock processing-time timers fire by.
        fire_at_end_of_input: Whether the end of a bounded input fires every event-time
            timer (``statekit.timers.end-of-input=fire``).
        late_sink: Receives late records under the side-output policy.
    """

    def __init__(
        self,
        subtasks: Callable[[], Sequence[TimedSubtask]],
        *,
        event_time: EventTime | None,
        clock: Clock,
        fire_at_end_of_input: bool,
        late_sink: Callable[[Any], None] | None,
    ) -> None:
        self._subtasks = subtasks
        self.clock = clock
        self.fire_at_end_of_input = fire_at_end_of_input
        self.late_sink = late_sink
        self.event_time_of: Callable[[Any], int | None] | None = (
            event_time.extractor() if event_time is not None else None
        )
        """The event time of a record (None: the record has none); None without event time."""
        self._delay = event_time.delay_ms if event_time is not None else 0
        self._late_to_function = event_time is not None and event_time.late is LatePolicy.PROCESS
        self.processing_hint = ProcessingTimeHint()
        """Shared with every subtask's timer service: the earliest processing-time timer, or earlier."""
        self.watermark = MIN_WATERMARK
        """The event-time watermark in ms (``MIN_WATERMARK`` before any event time)."""
        self._max_event_time = MIN_WATERMARK
        self.late_records = 0
        """Records at or below the watermark so far (see :class:`~statekit.timers.LatePolicy`)."""
        self.late_unsunk = 0
        """Late records of this run that were left out with no late sink to receive them."""

    # --- the watermark in checkpoints -------------------------------------------------------

    def properties(self) -> dict[str, Any]:
        """What a checkpoint's metadata keeps of time: the watermark, once there is one."""
        return {} if self.watermark == MIN_WATERMARK else {WATERMARK_PROPERTY: self.watermark}

    def restored(self, properties: Mapping[str, Any]) -> None:
        """Continue from a restored checkpoint's metadata ``properties``: its watermark."""
        self.watermark = int(properties.get(WATERMARK_PROPERTY, MIN_WATERMARK))
        self._max_event_time = MIN_WATERMARK

    # --- records ---------------------------------------------------------------------------

    def left_out_late(self, record: Any, ts: int) -> bool:
        """Whether ``record`` (event time ``ts``) is late and not processed: counted, sent to the late sink.

        Under the ``process`` late policy a late record is counted and processed (False).
        """
        if ts > self.watermark:
            return False
        self.late_records += 1
        if self._late_to_function:
            return False
        if self.late_sink is not None:
            self.late_sink(record)
        else:
            self.late_unsunk += 1
        return True

    def event_time_seen(self, ts: int, outputs: list[Any]) -> None:
        """Records up to event time ``ts`` were processed: the watermark follows, firing into ``outputs``."""
        if ts > self._max_event_time:
            self._max_event_time = ts
            wm = ts - self._delay
            if wm > self.watermark:
                self.advance(wm, outputs)

    # --- firing timers ---------------------------------------------------------------------

    def fire_processing_time(self, outputs: list[Any]) -> list[Any]:
        """Fire every subtask's processing-time timers the clock has reached; returns ``outputs``."""
        hint = self.processing_hint
        now = self.clock()
        if hint.earliest > now:
            return outputs
        earliest = NO_TIMER
        for st in self._subtasks():
            st.fire(TimeDomain.PROCESSING_TIME, now, outputs)
            nxt = st.timers.next_timestamp(TimeDomain.PROCESSING_TIME)
            if nxt is not None and nxt < earliest:
                earliest = nxt
        hint.earliest = earliest
        return outputs

    def advance(self, watermark: int, outputs: list[Any]) -> list[Any]:
        """Move the watermark to ``watermark`` (never back) and fire the timers it passes.

        ``MAX_WATERMARK`` fires every event-time timer and keeps the watermark
        (see :meth:`fire_at_end_of_time`). Returns ``outputs``, the fired
        timers' outputs appended.
        """
        if watermark == MAX_WATERMARK:
            return self.fire_at_end_of_time(outputs)
        if watermark <= self.watermark:
            return outputs
        self.watermark = watermark
        for st in self._subtasks():
            st.timers.set_watermark(watermark)
            st.fire(TimeDomain.EVENT_TIME, watermark, outputs)
        return outputs

    def end_of_input(self) -> list[Any]:
        """At the end of a bounded input under ``fire``, as Flink's: every event-time timer fires."""
        if not self.fire_at_end_of_input:
            return []
        return self.fire_at_end_of_time([])

    def fire_at_end_of_time(self, outputs: list[Any]) -> list[Any]:
        """Fire every pending event-time timer as at the end of time, and keep the event-time watermark.

        Flink ends a bounded input with the maximum watermark and never resumes
        that job. Here a later run over grown input may restore the final
        checkpoint, so the end of time lasts for this pass only: the timers
        fire with ``current_watermark()`` at ``MAX_WATERMARK`` (as in Flink, and
        how ``on_timer`` tells the end of input from time passing), then every
        subtask's watermark is the one the records made again, and that is what
        :attr:`watermark` and a checkpoint hold. A later run's records are late
        exactly as in an uninterrupted run's; the fired timers are gone, their
        outputs emitted once.
        """
        subtasks = self._subtasks()
        if not any(st.timers.pending(TimeDomain.EVENT_TIME) for st in subtasks):
            return outputs
        for st in subtasks:
            st.timers.set_watermark(MAX_WATERMARK)
            try:
                st.fire(TimeDomain.EVENT_TIME, MAX_WATERMARK, outputs)
            finally:
                st.timers.end_of_time_passed(self.watermark)
        return outputs

    def start_run(self) -> tuple[int, int]:
        """A run starts: what it counts from (late records, fired timers); late records unsunk afresh."""
        self.late_unsunk = 0
        return self.late_records, self.timers_fired

    @property
    def timers_fired(self) -> int:
        """Timers the current subtasks fired so far, both domains."""
        return sum(st.timers.fired for st in self._subtasks())


def end_of_time_message(job: str, checkpoint: str | None, records: str) -> str:
    """The warning for records that met a restored watermark at the end of time (both runners)."""
    where = f"checkpoint {checkpoint}" if checkpoint else "the checkpoint it restored"
    return (
        f"{job}: the event-time watermark of {where} is the end of time, so {records} were late "
        "and no event-time timer will fire again. Older statekit versions checkpointed that "
        "watermark after firing the timers at the end of an input (statekit.timers.end-of-input=fire); "
        "now the end of input keeps the watermark the records made. Way out: restore a checkpoint or "
        "savepoint taken before that end of input (`statekit checkpoints list` shows the retained "
        "ones), so the records after it are read again"
    )
