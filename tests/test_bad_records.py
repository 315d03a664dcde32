"""Bad records on real files: named where they are, failing the job or dead-lettered, never silent.

The cases of issue 22: a malformed JSON line, a key that cannot be computed
or has the wrong type, columns of mixed types in one Arrow batch, a byte that
is not UTF-8, and the budgets after which dead-lettering stops the job.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from logfiles import CountJob, CountPerUrl, LogDir
from statekit import (
    BadRecord,
    KeyedBatchFunction,
    LocalRunner,
    LogSource,
    ProcessContext,
    RecordSource,
    RuntimeContext,
    ValueStateDescriptor,
)
from statekit.errors import BadRecordError

COUNT = ValueStateDescriptor("count", int, default=0)


@pytest.fixture
def logs(tmp_path: Path) -> LogDir:
    return LogDir(tmp_path)


def dead_letter_conf(logs: LogDir, **extra: Any) -> dict[str, Any]:
    return {
        "statekit.bad-records.policy": "dead-letter",
        "statekit.bad-records.dead-letter-path": str(logs.root / "dead"),
        **extra,
    }


def letters(logs: LogDir) -> list[dict[str, Any]]:
    """The published dead letters, in the order of the checkpoints that published them."""
    folder = logs.root / "dead"
    if not folder.exists():
        return []
    return [json.loads(x) for p in sorted(folder.glob("part-*.json")) for x in p.read_text().splitlines()]


def test_a_malformed_line_fails_naming_its_place_and_every_restart_says_so(logs: LogDir) -> None:
    logs.write("access.log", 100)
    bad = b'{"url": "/a"'
    logs.write_raw("access.log", bad + b"\n")
    logs.write("access.log", 30)
    job = CountJob(logs, interval=10)
    offset = logs.path("access.log").read_bytes().index(bad)
    for _ in range(2):
        with pytest.raises(BadRecordError) as info:
            job.run()
        message = str(info.value)
        assert str(logs.path("access.log")) in message
        assert f"byte {offset}" in message and "line 101" in message
        assert '\'{"url": "/a"\'' in message and "JSONDecodeError" in message
        assert "statekit.bad-records.policy=dead-letter" in message
        assert isinstance(info.value.bad, BadRecord) and info.value.bad.stage == "parse"
    # the lines before it were counted, once
    assert sum(job.counts.values()) == 100


def test_dead_letters_skip_the_line_and_count_the_rest(logs: LogDir) -> None:
    logs.write("access.log", 100)
    logs.write_raw("access.log", b'{"url": "/a"\n')
    logs.write("access.log", 30)
    job = CountJob(logs, dead_letter_conf(logs), interval=10)
    result = job.run()
    assert job.exact()
    assert result.bad_records == 1 and result.records == 130
    # Counted where written, per checkpoint as in the total (issue 43).
    assert sum(i.bad_records for i in result.checkpoint_infos) == 1
    (letter,) = letters(logs)
    assert letter["stage"] == "parse" and letter["line"] == 101 and letter["raw"] == '{"url": "/a"'
    assert letter["file"] == str(logs.path("access.log")) and letter["job_id"] == "logs"
    logs.write("access.log", 5)
    job.run()  # the position is past the bad line: it is not dead-lettered again
    assert job.exact() and len(letters(logs)) == 1


def test_a_bad_last_line_is_not_dead_lettered_on_every_run(logs: LogDir) -> None:
    logs.write("access.log", 10)
    logs.write_raw("access.log", b"not json\n")
    job = CountJob(logs, dead_letter_conf(logs), interval=4)
    job.run()
    job.run()
    assert job.exact() and len(letters(logs)) == 1


def test_dead_letters_to_a_callback(logs: LogDir) -> None:
    logs.write("a.log", 5)
    logs.write_raw("a.log", b"[1, 2\n")
    got: list[BadRecord] = []
    job = CountJob(logs, {"statekit.bad-records.policy": "dead-letter"})
    runner = job.runner()
    runner.dead_letter_sink = got.append
    with runner:
        runner.run(job.source(), restore="latest")
    assert [(b.stage, b.line, b.raw) for b in got] == [("parse", 6, "[1, 2")]
    assert job.exact()


def test_dead_letter_policy_needs_somewhere_to_put_them(logs: LogDir) -> None:
    logs.write("a.log", 1)
    with pytest.raises(ValueError, match="dead-letter-path"):
        CountJob(logs, {"statekit.bad-records.policy": "dead-letter"}).run()


def test_the_count_budget_stops_the_job(logs: LogDir) -> None:
    for _ in range(3):
        logs.write("a.log", 10)
        logs.write_raw("a.log", b"oops\n")
    job = CountJob(logs, dead_letter_conf(logs, **{"statekit.bad-records.max": 2}))
    budget = r"line 33: .*'oops'\. 3 bad records .*statekit\.bad-records\.max=2"
    with pytest.raises(BadRecordError, match=budget):
        job.run()
    assert len(letters(logs)) == 2


def test_the_ratio_budget_stops_the_job(logs: LogDir) -> None:
    logs.write("a.log", 18)
    logs.write_raw("a.log", b"oops\n" * 2)
    ok = CountJob(logs, dead_letter_conf(logs, **{"statekit.bad-records.max-ratio": 0.1}), interval=1000)
    ok.run()  # 2 of 20: exactly the ratio
    logs.write_raw("a.log", b"oops\n")
    logs.write("a.log", 1)
    with pytest.raises(BadRecordError, match=r"1 bad records of 2 .*max-ratio=0\.1"):
        ok.run()


class TypoJob(CountJob):
    """The URL count with a typo in its key selector: every record is a bad record of stage key."""

    def runner(self) -> LocalRunner:
        return LocalRunner(
            CountPerUrl, key_selector=lambda r: r["ulr"], config=self.conf, job_id="logs", sink=self.sink
        )


def test_the_ratio_budget_names_the_commonest_bad_record_so_a_code_typo_is_found(logs: LogDir) -> None:
    logs.write("a.log", 120)
    logs.write_raw("a.log", b"oops\n")  # 1 of 121: under 1 %
    conf = dead_letter_conf(logs, **{"statekit.bad-records.max-ratio": 0.01})
    commonest = (
        r"121 bad records of 121 read .*max-ratio=0\.01: the job stops \(the bad records that a completed "
        r"checkpoint covers are in the dead letters; the run that goes on from that checkpoint reads the "
        r"others again\)\. The commonest \(120 of them\): stage key, "
        r"KeyError: 'ulr', the first at .*a\.log, byte 0, line 1\. .*job's code .* fix it and run again"
    )
    with pytest.raises(BadRecordError, match=commonest):
        TypoJob(logs, conf, interval=1000).run()
    assert letters(logs) == []  # the run completed no checkpoint: nothing published, nothing read past
    job = CountJob(logs, conf, interval=1000)  # the typo fixed: the run starts before them
    job.run()
    assert job.exact()
    assert [x["raw"] for x in letters(logs)] == ["oops"]


def test_a_key_that_cannot_be_computed_names_the_line(logs: LogDir) -> None:
    logs.write("a.log", 3)
    logs.write_raw("a.log", b'{"path": "/x"}\n')
    logs.write("a.log", 3)
    with pytest.raises(BadRecordError, match=r"\(key\) at .*a\.log, byte \d+, line 4: KeyError: 'url'"):
        CountJob(logs).run()
    job = CountJob(logs, dead_letter_conf(logs))
    job.run()
    assert job.exact()
    (letter,) = letters(logs)
    assert letter["raw"] == '{"path": "/x"}' and letter["line"] == 4 and letter["stage"] == "key"


def test_a_key_of_the_wrong_type_is_a_bad_record(logs: LogDir) -> None:
    logs.write("a.log", 3)
    logs.write_raw("a.log", b'{"url": 5}\n')
    wrong_type = r"line 4: SerializationError: str serializer cannot serialize int"
    with pytest.raises(BadRecordError, match=wrong_type):
        CountJob(logs).run()


def test_invalid_utf8_is_a_bad_record_not_a_merged_key(logs: LogDir) -> None:
    logs.write_raw("a.log", b'{"url": "/caf\xe9"}\n{"url": "/caf\xc3\xa9"}\n{"url": "/caf\xff"}\n')
    logs.model["/café"] += 1
    with pytest.raises(BadRecordError, match=r"\(decode\) at .*line 1: UnicodeDecodeError"):
        CountJob(logs).run()
    job = CountJob(logs, dead_letter_conf(logs))
    job.run()
    assert job.exact()
    raws = [x["raw"].encode("utf-8", "surrogateescape") for x in letters(logs)]
    assert raws == [b'{"url": "/caf\xe9"}', b'{"url": "/caf\xff"}']  # the bytes, kept apart


class CountBatch(KeyedBatchFunction):
    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(COUNT)

    def process_batch(self, rows: Any, ctx: ProcessContext) -> Any:
        n = self.count.value() + rows.num_rows
        self.count.update(n)
        return {"url": [ctx.current_key], "n": [n]}


def batch_job(logs: LogDir, conf: dict[str, Any] | None = None) -> tuple[LocalRunner, dict[str, int]]:
    counts: dict[str, int] = {}
    runner = LocalRunner(
        CountBatch,
        key_selector=lambda r: r["url"],
        config={
            "statekit.checkpoints.dir": str(logs.root / "checkpoints"),
            "statekit.checkpoint.interval-records": 50,
            **(conf or {}),
        },
        job_id="batch",
        sink=lambda o: counts.__setitem__(o["url"], o["n"]),
    )
    return runner, counts


def test_mixed_types_in_one_arrow_batch_name_the_column_and_the_line(logs: LogDir) -> None:
    with open(logs.path("a.log"), "w") as f:
        for i in range(40):
            f.write(json.dumps({"url": f"/u{i % 3}", "bytes": 12}) + "\n")
        f.write(json.dumps({"url": "/u1", "bytes": "12"}) + "\n")
        for i in range(9):
            f.write(json.dumps({"url": f"/u{i % 3}", "bytes": 7}) + "\n")
    runner, _ = batch_job(logs)
    with runner, pytest.raises(BadRecordError) as info:
        runner.run(LogSource(logs.dir, parse=json.loads), restore="latest")
    message = str(info.value)
    assert "(arrow)" in message and "column 'bytes'" in message and "line 41" in message
    assert '"bytes": "12"' in message
    runner, counts = batch_job(logs, dead_letter_conf(logs))
    with runner:
        result = runner.run(LogSource(logs.dir, parse=json.loads), restore="latest")
    assert counts == {"/u0": 17, "/u1": 16, "/u2": 16} and result.bad_records == 1
    assert [x["line"] for x in letters(logs)] == [41]


def test_batch_key_errors_are_bad_records(logs: LogDir) -> None:
    logs.write("a.log", 20)
    logs.write_raw("a.log", b'{"nourl": 1}\n[1]\n')
    logs.write("a.log", 20)
    runner, counts = batch_job(logs, dead_letter_conf(logs))
    with runner:
        result = runner.run(LogSource(logs.dir, parse=json.loads), restore="latest")
    assert counts == dict(logs.model) and result.bad_records == 2 and result.records == 40
    assert [(x["stage"], x["line"]) for x in letters(logs)] == [("key", 21), ("arrow", 22)]


def test_records_without_files_name_their_position() -> None:
    runner = LocalRunner(lambda: CountBatch(), key_selector=lambda r: r["url"])
    with pytest.raises(BadRecordError, match=r"\{'x': 1\} \(position 2\)"):
        runner.run(RecordSource([{"url": "/a"}, {"x": 1}]))
