"""The command line's ``run`` on a local Spark: what it prints when the log source reports lost lines."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import warnings
from pathlib import Path

import pytest

from statekit_urlcount import generate_logs
from statekit_urlcount._cli import main


def _append(path: Path, url: str, n: int) -> None:
    with open(path, "a", encoding="utf-8") as f:
        for _ in range(n):
            f.write(json.dumps({"@timestamp": "01/Dec/2026:10:00:00", "remote_addr": "10.0.0.1",
                                "request": "GET", "url": url}) + "\n")  # fmt: skip


def _rotate(log: Path) -> None:
    """logrotate's copytruncate with compress and delaycompress, as its steps run."""
    one = log.with_name(log.name + ".1")
    if one.exists():
        for n in sorted(
            (int(p.name.split(".")[2]) for p in log.parent.glob(log.name + ".*.gz")), reverse=True
        ):
            os.rename(log.with_name(f"{log.name}.{n}.gz"), log.with_name(f"{log.name}.{n + 1}.gz"))
        with open(one, "rb") as src, gzip.open(log.with_name(log.name + ".2.gz"), "wb") as dst:
            shutil.copyfileobj(src, dst)
        one.unlink()
    shutil.copyfile(log, one)
    os.truncate(log, 0)


def test_run_prints_the_lines_the_source_reports_lost(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      local_spark: object) -> None:  # fmt: skip
    """Lines written, rotated and compressed between two runs: the run's summary names the file."""
    logs, state = tmp_path / "logs", tmp_path / "state"
    generate_logs(logs, records=400, files=1, malformed_fraction=0, late_fraction=0)
    args = ["run", "--logs", str(logs), "--state", str(state), "--no-progress"]
    assert main(args) == 0
    log = next(logs.glob("*.log"))
    _rotate(log)  # the copy is known; the truncated log is empty, so not tracked
    assert main(args) == 0
    _append(log, "/lost", 30)
    _rotate(log)
    _append(log, "/read", 5)
    _rotate(log)  # the 30 lines are only in .2.gz now
    capsys.readouterr()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert main(args) == 0
    out = "".join(capsys.readouterr().out.split())  # rich wraps lines at the console's width
    gz = log.with_name(log.name + ".2.gz")
    said = f"run: input lost: {gz} appeared, compressed, since the source last looked"
    assert "".join(said.split()) in out, out
    assert "read5newlines" in out, out
