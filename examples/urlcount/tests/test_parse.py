"""Parsing and the dead-letter path, without Spark."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest

from statekit import LocalRunner
from statekit_urlcount import (
    MALFORMED_KEY,
    REASONS,
    AccessRecord,
    CountPerUrl,
    CountPerUrlWithDeadLetters,
    Malformed,
    generate_logs,
    parse_batches,
    parse_line,
)

SEED_LINE = (
    '{"@timestamp": "18/Apr/2019:00:00:00", "remote_addr": "127.0.0.1", "request": "GET", "url": "/api/a"}'
)


def test_the_seed_record():
    assert parse_line(SEED_LINE) == AccessRecord(
        url="/api/a",
        timestamp="18/Apr/2019:00:00:00",
        remote_addr="127.0.0.1",
        request="GET",
        time_ms=1555545600000,
    )


def test_only_url_is_required():
    assert parse_line('{"url": "/x"}') == AccessRecord(url="/x")
    assert parse_line('{"url": "/x", "request": 5}') == AccessRecord(url="/x", request=None)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("", "blank"),
        ("   ", "blank"),
        ('{"url": "/a"', "not-json"),
        ('127.0.0.1 - - [18/Apr/2019:00:00:00 +0000] "GET /api/a HTTP/1.1" 200 5', "not-json"),
        ("\ud800", "not-json"),
        ("[" * 100_000, "not-json"),
        ('["/api/a"]', "not-an-object"),
        ('"/api/a"', "not-an-object"),
        ("null", "not-an-object"),
        ('{"request": "GET"}', "missing-url"),
        ('{"url": null}', "bad-url"),
        ('{"url": 404}', "bad-url"),
        ('{"url": ""}', "bad-url"),
        ('{"url": ["/a"]}', "bad-url"),
        ('{"url": "\\u0000malformed"}', "bad-url"),
    ],
)
def test_malformed_lines(line, reason):
    parsed = parse_line(line)
    assert isinstance(parsed, Malformed)
    assert parsed.reason == reason
    assert parsed.reason in REASONS
    assert parsed.line == line[:4096]


def test_dead_letter_keeps_at_most_4096_chars():
    parsed = parse_line("x" * 10_000)
    assert isinstance(parsed, Malformed) and len(parsed.line) == 4096


def _batch(lines):
    return pa.RecordBatch.from_arrays([pa.array(lines, pa.string())], names=["value"])


def test_parse_batches_routes_malformed_lines_to_the_reserved_key():
    out = list(parse_batches([_batch([SEED_LINE, "oops", None]), _batch([])]))
    assert [b.num_rows for b in out] == [3, 0]
    assert out[0].schema.names == ["url", "reason", "line"]
    assert out[0].to_pylist() == [
        {"url": "/api/a", "reason": None, "line": None},
        {"url": MALFORMED_KEY, "reason": "not-json", "line": "oops"},
        {"url": MALFORMED_KEY, "reason": "blank", "line": ""},
    ]


def test_generated_logs_parse_to_the_ground_truth(tmp_path):
    r = generate_logs(tmp_path, records=4_000, files=2, malformed_fraction=0.02)
    counts: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for p in r.paths:
        lines = open(p, encoding="utf-8").read().split("\n")[:-1]
        for row in next(parse_batches([_batch(lines)])).to_pylist():
            if row["url"] == MALFORMED_KEY:
                reasons[row["reason"]] += 1
            else:
                counts[row["url"]] += 1
    assert counts == r.counts
    assert sum(reasons.values()) == r.malformed_total == 80
    expected = {
        "not-json": r.malformed["truncated"] + r.malformed["plain-text"],
        "bad-url": r.malformed["null-url"] + r.malformed["number-url"] + r.malformed["empty-url"],
        "missing-url": r.malformed["missing-url"],
        "not-an-object": r.malformed["not-an-object"],
        "blank": r.malformed["blank"],
    }
    assert reasons == expected


def test_count_per_url_emits_the_count_so_far():
    runner = LocalRunner(
        CountPerUrl, key_selector=lambda r: r["url"], config={"statekit.checkpoint.storage": "jobmanager"}
    )
    outs = [runner.process({"url": u}) for u in ["/a", "/b", "/a", "/a"]]
    assert outs == [[("/a", 1)], [("/b", 1)], [("/a", 2)], [("/a", 3)]]


def test_dead_letters_are_counted_and_emitted():
    runner = LocalRunner(
        CountPerUrlWithDeadLetters,
        key_selector=lambda r: r["url"],
        config={"statekit.checkpoint.storage": "jobmanager", "statekit.parallelism": 2},
    )
    records = [
        {"url": "/a", "reason": None, "line": None},
        {"url": MALFORMED_KEY, "reason": "not-json", "line": "oops"},
        {"url": "/a", "reason": None, "line": None},
        {"url": MALFORMED_KEY, "reason": "blank", "line": ""},
    ]
    assert [runner.process(r) for r in records] == [
        [("/a", 1, None, None)],
        [(None, 1, "not-json", "oops")],
        [("/a", 2, None, None)],
        [(None, 2, "blank", "")],
    ]


def test_dead_letter_count_survives_a_restore(tmp_path):
    config = {"statekit.checkpoint.storage": "filesystem", "statekit.checkpoints.dir": str(tmp_path)}
    bad = {"url": MALFORMED_KEY, "reason": "blank", "line": ""}
    with LocalRunner(CountPerUrlWithDeadLetters, key_selector=lambda r: r["url"], config=config) as first:
        first.process(bad)
        first.process({"url": "/a"})
        first.checkpoint()
    with LocalRunner(CountPerUrlWithDeadLetters, key_selector=lambda r: r["url"], config=config) as second:
        assert second.restore("latest") is not None
        assert second.process(bad) == [(None, 2, "blank", "")]
        assert second.process({"url": "/a"}) == [("/a", 2, None, None)]
