"""The log generator: byte-for-byte determinism, exact malformed fraction, ground truth."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter

import pytest

from statekit_urlcount import MALFORMED_KINDS, file_name, generate_logs, url_names


def _digest(paths: list[str]) -> dict[str, str]:
    return {os.path.basename(p): hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths}


def test_same_seed_same_bytes(tmp_path):
    a = generate_logs(tmp_path / "a", records=5_000, files=3, seed=7)
    b = generate_logs(tmp_path / "b", records=5_000, files=3, seed=7)
    assert _digest(a.paths) == _digest(b.paths)
    assert a.counts == b.counts and a.malformed == b.malformed


def test_other_seed_other_logs(tmp_path):
    a = generate_logs(tmp_path / "a", records=2_000, files=1, seed=1)
    b = generate_logs(tmp_path / "b", records=2_000, files=1, seed=2)
    assert _digest(a.paths) != _digest(b.paths)


def test_generating_in_two_steps_equals_one_step(tmp_path):
    whole = generate_logs(tmp_path / "whole", records=6_000, files=6, seed=3)
    first = generate_logs(tmp_path / "parts", records=4_000, files=4, seed=3)
    more = generate_logs(tmp_path / "parts", records=2_000, files=2, first_file=4, seed=3)
    assert _digest(whole.paths) == _digest(first.paths + more.paths)
    assert first.merge(more).counts == whole.counts


def test_files_records_and_names(tmp_path):
    r = generate_logs(tmp_path, records=1_003, files=4, first_file=2)
    assert [os.path.basename(p) for p in r.paths] == [file_name(i) for i in range(2, 6)]
    assert sorted(os.listdir(tmp_path)) == [file_name(i) for i in range(2, 6)]  # no temporary files left
    per_file = [sum(1 for _ in open(p, encoding="utf-8")) for p in r.paths]
    assert per_file == [251, 251, 251, 250]
    assert r.lines == 1_003 == r.valid + r.malformed_total


@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.1, 1.0])
def test_malformed_fraction_is_exact_per_file(tmp_path, fraction):
    r = generate_logs(tmp_path, records=4_000, files=4, malformed_fraction=fraction)
    assert r.malformed_total == 4 * round(fraction * 1_000)


def test_ground_truth_matches_the_files(tmp_path):
    """Count the files independently: valid JSON with a non-empty string url, or malformed."""
    r = generate_logs(tmp_path, records=3_000, files=2, malformed_fraction=0.05, n_urls=50)
    counts: Counter[str] = Counter()
    bad = 0
    for p in r.paths:
        for line in open(p, encoding="utf-8"):
            try:
                obj = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if isinstance(obj, dict) and isinstance(obj.get("url"), str) and obj["url"]:
                counts[obj["url"]] += 1
                assert set(obj) == {"@timestamp", "remote_addr", "request", "url"}
            else:
                bad += 1
    assert counts == r.counts
    assert bad == r.malformed_total == 150
    assert set(r.malformed) == set(MALFORMED_KINDS)  # 150 bad lines cycle through every kind


def test_records_look_like_the_seed(tmp_path):
    r = generate_logs(tmp_path, records=10, files=1, malformed_fraction=0.0)
    obj = json.loads(open(r.paths[0], encoding="utf-8").readline())
    assert obj["@timestamp"] == "18/Apr/2019:00:00:00"
    assert obj["request"] in {"GET", "POST", "PUT", "DELETE"}
    assert obj["url"].startswith("/api/")
    assert obj["remote_addr"].count(".") == 3


def test_urls_are_zipf_like(tmp_path):
    r = generate_logs(tmp_path, records=50_000, files=1, n_urls=1_000, malformed_fraction=0.0)
    ranked = [c for _, c in r.counts.most_common()]
    names = url_names(1_000, 42)
    assert r.counts.most_common(1)[0][0] == names[0]  # rank 1 is the most requested
    # Zipf s=1.1 over 1000 URLs: the top URL takes about 18% of requests, the top 10 over half.
    assert 0.12 < ranked[0] / 50_000 < 0.25
    assert sum(ranked[:10]) > 0.45 * 50_000
    assert len(ranked) > 300  # and there is a long tail


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        generate_logs(tmp_path, records=10, files=0)
    with pytest.raises(ValueError):
        generate_logs(tmp_path, records=10, malformed_fraction=1.5)


def _times(paths):
    from statekit_urlcount import parse_timestamp

    out = []
    for p in paths:
        for line in open(p, encoding="utf-8"):
            try:
                out.append(parse_timestamp(json.loads(line)["@timestamp"]))
            except (ValueError, KeyError, TypeError):
                out.append(None)  # malformed lines (e.g. cut short) may have no timestamp
    return out


def test_timestamps_mostly_increase_with_some_lines_late(tmp_path):
    from statekit_urlcount import JITTER_SECONDS, LATE_SECONDS

    r = generate_logs(tmp_path, records=6_000, files=2, late_fraction=0.02, malformed_fraction=0.0)
    assert r.delayed == 2 * round(0.02 * 3_000) == 120
    times = _times(r.paths)
    assert None not in times
    # File i is hour i of 18 April 2019 (UTC), give or take the lines stamped behind.
    base = 1555545600000
    assert times[0] == base and max(times) < base + 2 * 3_600_000
    # Lines stamped behind the newest time so far: by at most the jitter, or by 1-5 minutes.
    newest, behind = base, []
    for t in times:
        if t < newest:
            behind.append(newest - t)
        newest = max(newest, t)
    far = [b for b in behind if b > JITTER_SECONDS * 1000]
    assert 100 <= len(far) <= 120  # the delayed lines (a few land where the jitter hides them)
    assert max(far) <= (LATE_SECONDS[1] + JITTER_SECONDS) * 1000
    assert len(behind) < len(times) / 2  # mostly increasing


def test_late_fraction_zero_and_bad(tmp_path):
    r = generate_logs(tmp_path / "a", records=1_000, files=1, late_fraction=0.0)
    assert r.delayed == 0
    with pytest.raises(ValueError):
        generate_logs(tmp_path / "b", records=10, late_fraction=-0.1)
