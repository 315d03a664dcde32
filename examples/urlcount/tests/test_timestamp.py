"""The ``@timestamp`` rule of the windowed job: nginx ``$time_local`` to epoch ms, and its reasons."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from statekit_urlcount import (
    MALFORMED_KEY,
    TIMESTAMP_REASONS,
    AccessRecord,
    Malformed,
    parse_line,
    parse_timed_line,
    parse_timestamp,
)

MINUS_0130 = dt.timezone(-dt.timedelta(minutes=90))


def _ms(*args: int, tz: dt.tzinfo = dt.UTC) -> int:
    return int(dt.datetime(*args, tzinfo=tz).timestamp() * 1000)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("18/Apr/2019:00:00:00", _ms(2019, 4, 18)),
        ("18/Apr/2019:23:59:59", _ms(2019, 4, 18, 23, 59, 59)),
        ("01/Jan/1970:00:00:00", 0),
        ("31/Dec/1969:23:59:59", -1000),
        ("29/Feb/2020:12:34:56", _ms(2020, 2, 29, 12, 34, 56)),
        ("05/Sep/2021:07:08:09", _ms(2021, 9, 5, 7, 8, 9)),
        # nginx's $time_local with its zone: the offset is applied.
        ("18/Apr/2019:00:00:00 +0000", _ms(2019, 4, 18)),
        ("18/Apr/2019:02:00:00 +0200", _ms(2019, 4, 18)),
        ("29/Feb/2020:23:59:59 -0130", _ms(2020, 2, 29, 23, 59, 59, tz=MINUS_0130)),
    ],
)
def test_parse_timestamp(text, expected):
    assert parse_timestamp(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "18/Apr/2019",
        "18/Apr/2019 00:00:00",
        "2019-04-18T00:00:00Z",
        "18/apr/2019:00:00:00",  # nginx writes English month names, capitalised
        "18/Avr/2019:00:00:00",
        "31/Apr/2019:00:00:00",  # no such day
        "29/Feb/2019:00:00:00",
        "00/Apr/2019:00:00:00",
        "18/Apr/2019:24:00:00",
        "18/Apr/2019:00:60:00",
        "18/Apr/2019:00:00:60",
        "18/Apr/2019:00:00:00 +2400",
        "18/Apr/2019:00:00:00 UTC",
        "18/Apr/2019:00:00:00 ",
        " 18/Apr/2019:00:00:00",
        "18/Apr/2019:00:00:00.123",
        "１８/Apr/2019:00:00:00",  # non-ASCII digits
    ],
)
def test_bad_timestamps_raise(text):
    with pytest.raises(ValueError):
        parse_timestamp(text)


def _line(**fields):
    return json.dumps({"url": "/api/a", **fields})


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (_line(), "missing-timestamp"),
        (_line(**{"@timestamp": None}), "missing-timestamp"),
        (_line(**{"@timestamp": ""}), "bad-timestamp"),
        (_line(**{"@timestamp": "yesterday"}), "bad-timestamp"),
        (_line(**{"@timestamp": "31/Apr/2019:00:00:00"}), "bad-timestamp"),
        (_line(**{"@timestamp": 1555545600}), "bad-timestamp"),
        (_line(**{"@timestamp": ["18/Apr/2019:00:00:00"]}), "bad-timestamp"),
    ],
)
def test_the_windowed_job_needs_a_timestamp(line, reason):
    parsed = parse_line(line, require_timestamp=True)
    assert isinstance(parsed, Malformed)
    assert parsed.reason == reason in TIMESTAMP_REASONS
    assert parsed.line == line
    # The count job needs only the url: the same line is a request there, without a time.
    counted = parse_line(line)
    assert isinstance(counted, AccessRecord) and counted.time_ms is None


def test_url_reasons_come_first():
    assert parse_line('{"url": null}', require_timestamp=True).reason == "bad-url"
    assert parse_line("[1]", require_timestamp=True).reason == "not-an-object"


def test_parse_timed_line():
    line = _line(**{"@timestamp": "18/Apr/2019:00:01:00"})
    assert parse_timed_line(line) == {
        "url": "/api/a", "time_ms": _ms(2019, 4, 18, 0, 1), "reason": None, "line": None
    }  # fmt: skip
    assert parse_timed_line(_line()) == {
        "url": MALFORMED_KEY, "time_ms": None, "reason": "missing-timestamp", "line": _line()
    }  # fmt: skip
    assert parse_timed_line("")["reason"] == "blank"
