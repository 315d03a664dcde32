"""Parsing access-log lines: a request, or a reason why the line is dead-lettered.

The one rule for both jobs, used unchanged inside Spark's Python workers, on
the LocalRunner and in the tests: a line is a request when it is a JSON object
whose ``url`` is a non-empty string. The windowed job (requests per URL per
minute) also needs the request's time: with ``require_timestamp=True`` a line
whose ``@timestamp`` is missing or not nginx's ``$time_local`` is malformed too.
Anything malformed is counted, written to the dead-letter output with its
reason, and never fatal.
"""

from __future__ import annotations

import calendar
import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MALFORMED_KEY",
    "REASONS",
    "TIMESTAMP_REASONS",
    "AccessRecord",
    "Malformed",
    "MalformedLine",
    "parse_line",
    "parse_request",
    "parse_timestamp",
]

#: The reasons a line is malformed for either job, as written to the dead-letter output.
REASONS: tuple[str, ...] = ("blank", "not-json", "not-an-object", "missing-url", "bad-url")

#: The further reasons of the windowed job, which needs each request's ``@timestamp``.
TIMESTAMP_REASONS: tuple[str, ...] = ("missing-timestamp", "bad-timestamp")

#: The key malformed lines are routed under. No request has it: a URL is never
#: empty, and this one starts with a NUL byte that no valid URL contains.
MALFORMED_KEY = "\x00malformed"

_MAX_DEAD_LETTER_CHARS = 4096

# nginx's $time_local, "18/Apr/2019:00:00:00", with an optional zone as nginx writes it (" +0000").
_TIME_LOCAL = re.compile(
    r"(\d{2})/([A-Z][a-z]{2})/(\d{4}):(\d{2}):(\d{2}):(\d{2})(?: ([+-])(\d{2})(\d{2}))?", re.ASCII
)
# Month names are nginx's, whatever the locale (strptime's %b is not).
_MONTH_NAMES = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTHS = {m: i + 1 for i, m in enumerate(_MONTH_NAMES)}


def parse_timestamp(text: str) -> int:
    """Epoch milliseconds of an nginx ``$time_local`` such as ``18/Apr/2019:00:00:00``.

    Without a zone the time is UTC (the seed's format has none); with one, as
    nginx writes it (``18/Apr/2019:02:00:00 +0200``), it is honoured. Month
    names are English whatever the locale. Example::

        >>> parse_timestamp("18/Apr/2019:00:00:00")
        1555545600000
        >>> parse_timestamp("18/Apr/2019:02:00:00 +0200")
        1555545600000

    Raises:
        ValueError: If ``text`` is not such a timestamp, or names a day or time
            that does not exist (``31/Apr``, ``24:00:00``).
    """
    m = _TIME_LOCAL.fullmatch(text)
    if m is None:
        raise ValueError(f"not a timestamp like 18/Apr/2019:00:00:00: {text[:64]!r}")
    day, mon, year, hour, minute, second, sign, zh, zm = m.groups()
    month = _MONTHS.get(mon)
    if month is None:
        raise ValueError(f"unknown month {mon!r} in {text!r}")
    y, d, h, mi, sec = int(year), int(day), int(hour), int(minute), int(second)
    if not 1 <= d <= calendar.monthrange(y, month)[1] or h > 23 or mi > 59 or sec > 59:
        raise ValueError(f"no such time: {text!r}")
    seconds = calendar.timegm((y, month, d, h, mi, sec, 0, 0, 0))
    if sign is not None:
        if int(zh) > 23 or int(zm) > 59:
            raise ValueError(f"no such zone offset: {text!r}")
        offset = int(zh) * 3600 + int(zm) * 60
        seconds -= offset if sign == "+" else -offset
    return seconds * 1000


@dataclass(frozen=True, slots=True)
class AccessRecord:
    """One request. Only ``url`` is required; the other fields are kept when present.

    ``time_ms`` is ``timestamp`` as epoch milliseconds (see :func:`parse_timestamp`),
    None when the line has no valid ``@timestamp``.
    """

    url: str
    timestamp: str | None = None
    remote_addr: str | None = None
    request: str | None = None
    time_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Malformed:
    """A line that is not a request, with why (one of :data:`REASONS` or :data:`TIMESTAMP_REASONS`).

    ``line`` is the raw line, cut to 4096 characters so a runaway line cannot
    swamp the dead-letter output.
    """

    reason: str
    line: str
    detail: str = ""


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def parse_line(line: str, *, require_timestamp: bool = False) -> AccessRecord | Malformed:
    """Parses one log line (without its line break).

    With ``require_timestamp`` (the windowed job), a request also needs a valid
    ``@timestamp``: absent or null is ``missing-timestamp``, anything that
    :func:`parse_timestamp` rejects is ``bad-timestamp``. Without it (the
    count job) a bad timestamp is kept as text and ``time_ms`` is None.

    Example::

        >>> parse_line('{"url": "/api/a", "request": "GET"}')
        AccessRecord(url='/api/a', timestamp=None, remote_addr=None, request='GET', time_ms=None)
        >>> parse_line('{"url": null}').reason
        'bad-url'
        >>> parse_line('{"url": "/api/a"}', require_timestamp=True).reason
        'missing-timestamp'
    """
    kept = line[:_MAX_DEAD_LETTER_CHARS]
    if not line.strip():
        return Malformed("blank", kept)
    try:
        obj = json.loads(line)
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for lone surrogates
        return Malformed("not-json", kept, str(exc))
    except RecursionError:
        return Malformed("not-json", kept, "nested too deeply")
    if not isinstance(obj, dict):
        return Malformed("not-an-object", kept, type(obj).__name__)
    if "url" not in obj:
        return Malformed("missing-url", kept)
    url = obj["url"]
    if not isinstance(url, str) or not url:
        return Malformed("bad-url", kept, f"url is {url!r}")
    if url == MALFORMED_KEY:
        return Malformed("bad-url", kept, "url is the reserved malformed key")
    stamp = obj.get("@timestamp")
    time_ms = None
    if isinstance(stamp, str):
        try:
            time_ms = parse_timestamp(stamp)
        except ValueError as exc:
            if require_timestamp:
                return Malformed("bad-timestamp", kept, str(exc))
    elif require_timestamp:
        if stamp is None:
            return Malformed("missing-timestamp", kept)
        return Malformed("bad-timestamp", kept, f"@timestamp is {stamp!r}")
    return AccessRecord(
        url=url,
        timestamp=_text(stamp),
        remote_addr=_text(obj.get("remote_addr")),
        request=_text(obj.get("request")),
        time_ms=time_ms,
    )


class MalformedLine(ValueError):
    """Raised by :func:`parse_request` for a line that is not a request.

    Attributes:
        malformed: Why (its ``reason`` is one of :data:`REASONS` or :data:`TIMESTAMP_REASONS`).
    """

    def __init__(self, malformed: Malformed) -> None:
        detail = f": {malformed.detail}" if malformed.detail else ""
        super().__init__(f"{malformed.reason}{detail}")
        self.malformed = malformed


def parse_request(line: str, *, require_timestamp: bool = False) -> dict[str, Any]:
    """:func:`parse_line` for statekit's bad-records policy: a request as a dict, or :class:`MalformedLine`.

    Give it to a :class:`~statekit.LogSource` and a malformed line becomes a
    bad record: with ``statekit.bad-records.policy=dead-letter`` it is written
    to the dead letters with its file, offset, line number and reason, and the
    job goes on; the rule is :func:`parse_line`'s, unchanged. Example::

        LogSource("logs/", parse=parse_request)

        >>> parse_request('{"url": "/api/a", "request": "GET"}')["url"]
        '/api/a'

    Raises:
        MalformedLine: If the line is not a request.
    """
    parsed = parse_line(line, require_timestamp=require_timestamp)
    if isinstance(parsed, Malformed):
        raise MalformedLine(parsed)
    return {"url": parsed.url, "request": parsed.request, "time_ms": parsed.time_ms}
