"""End to end on Spark local[2]: the demo's two runs, checked against counts made here without Spark."""

from __future__ import annotations

import io
import json
import os
from collections import Counter

import pytest

pytest.importorskip("pyspark")

from rich.console import Console  # noqa: E402

from statekit_urlcount import MALFORMED_KEY, parse_line  # noqa: E402
from statekit_urlcount._cli import build_parser, demo  # noqa: E402


def _expected(paths):
    counts: Counter[str] = Counter()
    dead: Counter[tuple[str, str]] = Counter()
    for p in paths:
        for line in open(p, encoding="utf-8").read().split("\n")[:-1]:
            parsed = parse_line(line)
            if hasattr(parsed, "reason"):
                dead[(parsed.reason, parsed.line)] += 1
            else:
                counts[parsed.url] += 1
    return counts, dead


def _json_rows(directory):
    rows = []
    for root, _, names in os.walk(directory):
        for name in sorted(names):
            if name.endswith(".json"):
                rows.extend(json.loads(line) for line in open(os.path.join(root, name), encoding="utf-8"))
    return rows


# heap: the demo's default (make demo); rocksdb: a native, incremental checkpoint that the second
# run and read_state read back through the backend. lmdb's native checkpoints on Spark (restarts,
# rescales, a killed driver) and through SavepointReader are proven in tests/spark and
# tests/test_state_processor.py: the demo on it runs nightly.
# The demo's default (heap) runs in ci; the other backends' demo runs go nightly (ci's time: each
# starts Spark twice), their Spark restores being covered by tests/spark.
@pytest.mark.parametrize(
    "backend",
    ["heap", *(pytest.param(b, marks=pytest.mark.nightly) for b in ("rocksdb", "lmdb"))],
)
def test_demo_resumes_from_the_checkpoint_with_exact_counts(tmp_path, backend):
    work = tmp_path / "demo"
    args = build_parser().parse_args(
        ["demo", "--workdir", str(work), "--records", "6000", "--files", "3", "--more-records", "2500",
         "--more-files", "2", "--urls", "300", "--malformed", "0.02", "--backend", backend]
    )  # fmt: skip
    out = io.StringIO()
    report = demo(args, Console(file=out, width=120))
    printed = out.getvalue()

    logs = sorted(os.path.join(work, "logs", n) for n in os.listdir(work / "logs"))
    first_counts, first_dead = _expected(logs[:3])
    all_counts, all_dead = _expected(logs)
    assert len(logs) == 5

    # The first run: three files, read through statekit's log source in one micro-batch.
    assert not report.first.resumed
    assert [b.batch_id for b in report.first.batches] == [0]
    assert report.first.records == 6000
    assert report.first.state.counts == dict(first_counts)
    assert report.first.state.malformed == sum(first_dead.values()) == 120

    # The second run, in a new SparkSession: resumes, reads only the two new files, counts go on.
    assert report.second.resumed
    assert report.second.restored_from == report.first.state.location  # exactly where run 1 ended
    assert [b.batch_id for b in report.second.batches] == [1]
    assert report.second.records == 2500
    assert report.second.state.counts == dict(all_counts)
    assert report.second.state.malformed == sum(all_dead.values()) == 170
    assert report.second.state.checkpoint_id > report.first.state.checkpoint_id
    assert report.second.state.entries == len(all_counts)  # every URL; malformed lines are dead letters
    assert MALFORMED_KEY not in report.second.state.counts

    # The output: per batch, the latest count of each URL touched; the last one seen is the total.
    latest: dict[str, int] = {}
    for row in sorted(_json_rows(work / "state" / "output" / "counts"), key=lambda r: r["count"]):
        latest[row["url"]] = row["count"]
    assert latest == dict(all_counts)

    # Every malformed line is in the dead-letter output once, with its reason and place.
    dead = _json_rows(work / "state" / "output" / "dead-letter")
    reasons = Counter((r["error"].removeprefix("MalformedLine: ").split(":")[0], r["raw"]) for r in dead)
    assert reasons == all_dead
    assert len({(r["file"], r["offset"]) for r in dead}) == len(dead) == 170
    assert {r["stage"] for r in dead} == {"parse"}

    assert report.ok
    assert "all checks passed" in printed
    assert "counts continue exactly" in printed
    # Not a terminal (a pipe, CI): a line before Spark starts and one per batch, never silence.
    lines = printed.splitlines()
    assert (
        "first run: starting Spark (local[2]) ..." in lines
        and "second run: starting Spark (local[2]) ..." in lines
    )
    assert any(line.startswith("batch 0: 6,000 records (120 malformed)") for line in lines), printed
    assert any(line.startswith("batch 1: 2,500 records (50 malformed)") for line in lines), printed
    assert lines[-1].startswith("the demo took ")
