"""The vectorized URL count gives what the per-record one gives: on the LocalRunner and on Spark."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("pyarrow")

from statekit import LocalRunner, RecordSource  # noqa: E402
from statekit_urlcount import (  # noqa: E402
    CountPerUrl,
    CountPerUrlColumns,
    CountPerUrlVectorized,
    JobSettings,
    generate_logs,
    parse_line,
)


class _ValueOnly:
    """A value state handle with value and update only: a backend without bulk updates."""

    def __init__(self, state):
        self.value, self.update = state.value, state.update


class CountPerUrlColumnsKeyByKey(CountPerUrlColumns):
    def open(self, ctx):
        super().open(ctx)
        self.count = _ValueOnly(self.count)


def _records(logs):
    out = []
    for name in sorted(os.listdir(logs)):
        with open(os.path.join(logs, name), encoding="utf-8") as f:
            for line in f.read().split("\n")[:-1]:
                parsed = parse_line(line)
                if not hasattr(parsed, "reason"):
                    out.append({"url": parsed.url, "request": parsed.request})
    return out


@pytest.mark.parametrize("batch_size", [1, 100, 10_000])
def test_local_runner_outputs_the_same_counts_per_request(tmp_path, batch_size):
    generate_logs(tmp_path / "logs", records=3000, files=2, n_urls=200, malformed_fraction=0.0, seed=3)
    records = _records(tmp_path / "logs")
    outputs = {}
    functions = (
        ("per-record", CountPerUrl),
        ("vectorized", CountPerUrlVectorized),
        ("columns", CountPerUrlColumns),
        ("key by key", CountPerUrlColumnsKeyByKey),
    )
    for name, function in functions:
        got = []
        config = {"statekit.parallelism": 2, "statekit.batch-size": batch_size}
        with LocalRunner(function, key_selector=lambda r: r["url"], config=config, sink=got.append) as runner:
            runner.run(RecordSource(records))
        outputs[name] = got
    for name in ("vectorized", "columns", "key by key"):
        got = [(o["url"], o["count"]) for o in outputs[name]]
        assert sorted(got) == sorted(outputs["per-record"]) and len(got) == len(records), name


def test_spark_job_gives_the_same_counts_and_dead_letters(tmp_path, local_spark):
    from statekit_urlcount import run_job

    generate_logs(tmp_path / "logs", records=4000, files=2, n_urls=300, malformed_fraction=0.02, seed=4)
    reports = {}
    for vectorized in (False, True):
        settings = JobSettings(
            logs_dir=str(tmp_path / "logs"), state_dir=str(tmp_path / f"state-{vectorized}"),
            vectorized=vectorized,
        )  # fmt: skip
        reports[vectorized] = (run_job(local_spark, settings), settings)

    def outputs(settings):
        # A dead letter records when it was written; the two runs wrote theirs at other times.
        dead = spark_rows(settings.dead_letter_dir)
        letters = [(d, {k: v for k, v in row.items() if k != "time"}) for d, row in dead]
        rows = spark_rows(settings.counts_dir), letters
        return [sorted(map(repr, r)) for r in rows]

    (plain, plain_settings), (vec, vec_settings) = reports[False], reports[True]
    assert vec.state.counts == plain.state.counts and vec.state.malformed == plain.state.malformed > 0
    assert [b.records for b in vec.batches] == [b.records for b in plain.batches]
    assert outputs(vec_settings) == outputs(plain_settings)


def spark_rows(directory):
    import json

    rows = []
    for root, _, names in os.walk(directory):
        for name in sorted(names):
            if name.endswith(".json"):
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    rows.extend((os.path.basename(root), json.loads(line)) for line in f)
    return rows
