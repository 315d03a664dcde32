"""Timers, watermarks and event time: state that can act when time passes.

- :class:`~statekit.TimerService` registers and deletes processing-time and event-time
  timers for the current key (and namespace); a runner fires them through the
  function's ``on_timer``, in timestamp order per subtask, each once.
- Timers are keyed state. Each time domain is one internal map state
  (``__statekit_timers_event``, ``__statekit_timers_processing``) of the
  subtask's keyed backend, so timers are in every snapshot, move with their key
  group on rescale, and work on every backend without backend code. An
  in-memory queue per domain orders them; it is rebuilt from the state on
  restore.
- :class:`~statekit.EventTime` names a record's event-time field and the bounded
  out-of-orderness that the watermark trails the largest event time by.

A job author imports ``EventTime``, ``TimeDomain`` and ``TimerService`` from
:mod:`statekit`, their one public home; this package exports what runners and
the kit share (watermark bounds, the timer states' names and encoding).
"""

from __future__ import annotations

from typing import Any

from .._errors import warn_moved
from . import _eventtime, _service
from ._eventtime import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    WATERMARK_PROPERTY,
    LatePolicy,
    parse_duration_ms,
    timestamp_ms,
)
from ._service import (
    NO_TIMER,
    TIMER_STATE_NAMES,
    TIMER_STATE_PREFIX,
    ProcessingTimeHint,
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
    "LatePolicy",
    "ProcessingTimeHint",
    "decode_timer",
    "encode_timer",
    "parse_duration_ms",
    "timestamp_ms",
]

#: Names this package exported before their one home became :mod:`statekit`.
_MOVED = {"EventTime": _eventtime, "TimeDomain": _service, "TimerService": _service}


def __getattr__(name: str) -> Any:
    """The names that moved to :mod:`statekit`, for one release, with a DeprecationWarning."""
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warn_moved(__name__, name, "statekit")
    return getattr(module, name)
