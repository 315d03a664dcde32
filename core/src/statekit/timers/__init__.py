"""Timers, watermarks and event time: state that can act when time passes.

- :class:`TimerService` registers and deletes processing-time and event-time
  timers for the current key (and namespace); a runner fires them through the
  function's ``on_timer``, in timestamp order per subtask, each once.
- Timers are keyed state. Each time domain is one internal map state
  (``__statekit_timers_event``, ``__statekit_timers_processing``) of the
  subtask's keyed backend, so timers are in every snapshot, move with their key
  group on rescale, and work on every backend without backend code. An
  in-memory queue per domain orders them; it is rebuilt from the state on
  restore.
- :class:`EventTime` names a record's event-time field and the bounded
  out-of-orderness that the watermark trails the largest event time by.
"""

from __future__ import annotations

from ._eventtime import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    WATERMARK_PROPERTY,
    EventTime,
    LatePolicy,
    parse_duration_ms,
    timestamp_ms,
)
from ._service import (
    NO_TIMER,
    TIMER_STATE_NAMES,
    TIMER_STATE_PREFIX,
    ProcessingTimeHint,
    TimeDomain,
    TimerService,
    decode_timer,
    encode_timer,
)

__all__ = [
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "NO_TIMER",
    "TIMER_STATE_NAMES",
    "TIMER_STATE_PREFIX",
    "WATERMARK_PROPERTY",
    "EventTime",
    "LatePolicy",
    "ProcessingTimeHint",
    "TimeDomain",
    "TimerService",
    "decode_timer",
    "encode_timer",
    "parse_duration_ms",
    "timestamp_ms",
]
