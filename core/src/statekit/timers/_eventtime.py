"""Event time: where a record's timestamp is, and how far the watermark trails the largest one."""

from __future__ import annotations

import datetime as _dt
import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigurationError

__all__ = [
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "WATERMARK_PROPERTY",
    "EventTime",
    "LatePolicy",
    "parse_duration_ms",
    "timestamp_ms",
]

#: The watermark before any record: no event time has been seen.
MIN_WATERMARK = -(2**63)
#: The watermark at the end of a bounded input: every event-time timer is due.
MAX_WATERMARK = 2**63 - 1
#: The checkpoint metadata property that holds the job's watermark (absent: ``MIN_WATERMARK``).
WATERMARK_PROPERTY = "event_time_watermark"

_UNITS_MS = {
    "ms": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1000,
    "sec": 1000,
    "second": 1000,
    "seconds": 1000,
    "m": 60_000,
    "min": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "days": 86_400_000,
}
_DURATION = re.compile(r"\s*(\d+)\s*([a-z]+)\s*")


def parse_duration_ms(value: int | str | _dt.timedelta, what: str = "duration") -> int:
    """Milliseconds of ``value``: an int (ms), a ``timedelta`` or Spark's ``"10 minutes"`` form.

    Raises:
        ConfigurationError: For anything else, or a negative duration.
    """
    if isinstance(value, bool):
        raise ConfigurationError(f"{what}: expected milliseconds, a timedelta or '10 minutes', got {value!r}")
    if isinstance(value, int):
        ms = value
    elif isinstance(value, _dt.timedelta):
        ms = int(value.total_seconds() * 1000)
    elif isinstance(value, str):
        total, pos, text = 0, 0, value.strip().lower()
        while pos < len(text):
            m = _DURATION.match(text, pos)
            if m is None or m.group(2) not in _UNITS_MS:
                raise ConfigurationError(
                    f"{what}: cannot read {value!r}; write e.g. '90 seconds', '1 minute 30 seconds' "
                    f"or milliseconds as an int (units: {', '.join(sorted(set(_UNITS_MS)))})"
                )
            total += int(m.group(1)) * _UNITS_MS[m.group(2)]
            pos = m.end()
        if not text:
            raise ConfigurationError(f"{what}: empty duration")
        ms = total
    else:
        raise ConfigurationError(
            f"{what}: expected milliseconds, a timedelta or '10 minutes', got {type(value).__name__}"
        )
    if ms < 0:
        raise ConfigurationError(f"{what}: must not be negative, got {value!r}")
    return ms


class LatePolicy(enum.StrEnum):
    """What happens to a record whose event time is at or below the current watermark."""

    SIDE_OUTPUT = "side-output"
    """Counted and handed to the late-records sink instead of the function (the default)."""
    PROCESS = "process"
    """Counted and passed to the function like any record (``ctx.timestamp`` tells it is late)."""


_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


def timestamp_ms(value: Any, where: str) -> int | None:
    """An event time as epoch milliseconds: ints are ms, datetimes (naive = UTC) are converted."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{where}: an event time must be int milliseconds or a datetime, not bool")
    if isinstance(value, int):
        return value
    if isinstance(value, _dt.datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=_dt.UTC)
        delta = aware - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise TypeError(
        f"{where}: an event time must be int epoch milliseconds or a datetime, "
        f"got {type(value).__name__} {value!r}"
    )


@dataclass(frozen=True)
class EventTime:
    """Where records carry their event time, and the watermark's bounded out-of-orderness.

    As Spark's ``withWatermark(column, delay)`` and Flink's
    ``forBoundedOutOfOrderness``: the watermark is the largest event time seen
    minus ``delay``; it never goes back. A record whose event time is at or
    below the watermark is *late* (see :class:`LatePolicy`); event-time timers
    at or below it fire. A record without an event time (None) is processed,
    never late, and does not move the watermark.

    Args:
        field: The record field (dict key or attribute) or Spark column holding
            the event time, as epoch milliseconds (int) or a datetime (Spark
            ``timestamp`` columns); or, on the LocalRunner, a function of the record.
        delay: The bounded out-of-orderness: ms, a ``timedelta`` or ``"1 minute"``.
        late: ``"side-output"`` (default) or ``"process"``.
    """

    field: str | Callable[[Any], Any]
    delay: int | str | _dt.timedelta = 0
    late: LatePolicy | str = LatePolicy.SIDE_OUTPUT

    def __post_init__(self) -> None:
        if not (isinstance(self.field, str) and self.field) and not callable(self.field):
            raise ConfigurationError("EventTime(field=...) needs a field or column name, or a function")
        parse_duration_ms(self.delay, "EventTime delay")
        try:
            object.__setattr__(self, "late", LatePolicy(self.late))
        except ValueError:
            raise ConfigurationError(
                f"EventTime late={self.late!r}: choose one of {', '.join(p.value for p in LatePolicy)}"
            ) from None

    @property
    def delay_ms(self) -> int:
        """The delay in milliseconds."""
        return parse_duration_ms(self.delay, "EventTime delay")

    def extractor(self) -> Callable[[Any], int | None]:
        """A function from a record to its event time in ms (None when it has none)."""
        f = self.field
        if callable(f):
            fn = f

            def from_function(record: Any) -> int | None:
                return timestamp_ms(fn(record), "the EventTime function's result")

            return from_function
        name = f
        where = f"event-time field {name!r}"

        def from_field(record: Any) -> int | None:
            value = record.get(name) if isinstance(record, Mapping) else getattr(record, name, None)
            return timestamp_ms(value, where)

        return from_field

    def watermark(self, current: int, max_event_time: int | None) -> int:
        """The watermark after seeing ``max_event_time``: never lower than ``current``."""
        if max_event_time is None:
            return current
        return max(current, max_event_time - self.delay_ms)

    def describe(self) -> dict[str, Any]:
        """The settings as JSON (kept in checkpoint metadata)."""
        f = self.field
        field = f if isinstance(f, str) else getattr(f, "__qualname__", "<function>")
        return {"field": field, "delay_ms": self.delay_ms, "late": LatePolicy(self.late).value}
