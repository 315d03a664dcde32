"""The keyed states that hold timers: their reserved names, one per time domain.

Timers are keyed state (see :mod:`statekit.timers`), and a keyed backend's
snapshot header records which of its states hold them, so the names belong
to the state layer: the keyed backend reads them here without depending on
the timer service, which sits above it and uses them too.
"""

from __future__ import annotations

import enum

__all__ = ["TIMER_STATE_NAMES", "TIMER_STATE_PREFIX", "TimeDomain"]


class TimeDomain(enum.StrEnum):
    """Which clock a timer follows."""

    EVENT_TIME = "event-time"
    """Fires when the watermark reaches the timer's timestamp."""
    PROCESSING_TIME = "processing-time"
    """Fires when the wall clock (on Spark: the micro-batch's timestamp) reaches it."""


#: Keyed state names that start with this are statekit's own (user states may not use it).
TIMER_STATE_PREFIX = "__statekit_timers_"
#: The internal state holding each domain's timers.
TIMER_STATE_NAMES: dict[TimeDomain, str] = {
    TimeDomain.EVENT_TIME: TIMER_STATE_PREFIX + "event",
    TimeDomain.PROCESSING_TIME: TIMER_STATE_PREFIX + "processing",
}
