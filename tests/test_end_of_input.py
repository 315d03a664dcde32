"""A finished run keeps its state: the end of the input takes a final checkpoint (issue 33).

A LocalRunner with ``statekit.checkpoints.dir`` and no
``statekit.checkpoint.interval-records``, run twice over growing log files,
returned ``checkpoints=[]`` both times, and the second run started from
empty state. As Flink does when a bounded job finishes, reaching the end of
the input now takes a checkpoint when anything was read since the last one.
"""

from __future__ import annotations

import json
from pathlib import Path

from logfiles import CountPerUrl, LogDir
from statekit import LocalRunner, LogSource


def runner(logs: LogDir, counts: dict[str, int]) -> LocalRunner:
    return LocalRunner(
        CountPerUrl,
        key_selector=lambda r: r["url"],
        job_id="finished",
        sink=lambda out: counts.__setitem__(*out),
        config={"statekit.checkpoints.dir": str(logs.root / "checkpoints"), "statekit.parallelism": 2},
    )


def test_a_run_without_periodic_checkpoints_keeps_its_state_for_the_next(tmp_path: Path) -> None:
    logs = LogDir(tmp_path)
    logs.write("access.log", 40)
    counts: dict[str, int] = {}
    with runner(logs, counts) as first:
        done = first.run(LogSource(logs.dir, parse=json.loads), restore="latest")
    assert done.records == 40 and [Path(c).name for c in done.checkpoints] == ["chk-1"]

    logs.write("access.log", 15)
    with runner(logs, counts) as second:
        again = second.run(LogSource(logs.dir, parse=json.loads), restore="latest")
    assert again.restored_from == done.checkpoints[0]
    assert again.records == 15  # only the new lines
    assert counts == dict(logs.model)  # and every count goes on from the first run's

    with runner(logs, counts) as third:
        idle = third.run(LogSource(logs.dir, parse=json.loads), restore="latest")
    assert idle.records == 0 and idle.checkpoints == []  # nothing read: nothing new to keep
