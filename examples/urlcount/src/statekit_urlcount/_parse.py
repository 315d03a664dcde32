"""Parsing access-log lines: a request, or a reason why the line is dead-lettered.

The one rule for the whole job, used unchanged inside Spark's Python workers
and in the tests: a line is a request when it is a JSON object whose ``url``
is a non-empty string. Anything else is *malformed*: counted, written to the
dead-letter output with its reason, and never fatal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["MALFORMED_KEY", "REASONS", "AccessRecord", "Malformed", "parse_line"]

#: The reasons a line is malformed, as written to the dead-letter output.
REASONS: tuple[str, ...] = ("blank", "not-json", "not-an-object", "missing-url", "bad-url")

#: The key malformed lines are routed under. No request has it: a URL is never
#: empty, and this one starts with a NUL byte that no valid URL contains.
MALFORMED_KEY = "\x00malformed"

_MAX_DEAD_LETTER_CHARS = 4096


@dataclass(frozen=True, slots=True)
class AccessRecord:
    """One request. Only ``url`` is required; the other fields are kept when present."""

    url: str
    timestamp: str | None = None
    remote_addr: str | None = None
    request: str | None = None


@dataclass(frozen=True, slots=True)
class Malformed:
    """A line that is not a request, with why (one of :data:`REASONS`).

    ``line`` is the raw line, cut to 4096 characters so a runaway line cannot
    swamp the dead-letter output.
    """

    reason: str
    line: str
    detail: str = ""


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def parse_line(line: str) -> AccessRecord | Malformed:
    """Parses one log line (without its line break).

    Example::

        >>> parse_line('{"url": "/api/a", "request": "GET"}')
        AccessRecord(url='/api/a', timestamp=None, remote_addr=None, request='GET')
        >>> parse_line('{"url": null}').reason
        'bad-url'
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
    return AccessRecord(
        url=url,
        timestamp=_text(obj.get("@timestamp")),
        remote_addr=_text(obj.get("remote_addr")),
        request=_text(obj.get("request")),
    )
