"""The README's Quickstart, extracted and run as written on ``statekit-urlcount generate`` output.

It must print its counts and exit 0 over logs with malformed lines, resume
exactly after the logs grow and rotate, and account for every generated line
(counted or dead-lettered, once, also when it is killed with SIGKILL and run
again). The README's Spark blocks and the docs' commands run in
tests/spark/test_docs_examples.py; which blocks run is marked in the
Markdown (tests/docblocks.py), and every block that shows a command says so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from docblocks import readme_block, unmarked_cli_blocks
from statekit_urlcount import Malformed, parse_line


def quickstart_code() -> str:
    block = readme_block("Quickstart")
    assert block.runnable, f"{block.where}: the Quickstart's block must be marked runnable"
    return block.text


def letters(cwd: Path) -> list[dict[str, Any]]:
    """The published dead letters of the Quickstart's directory."""
    folder = cwd / "state" / "dead-letters"
    return [json.loads(x) for p in sorted(folder.glob("part-*.json")) for x in p.read_text().splitlines()]


def generate(cwd: Path, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "statekit_urlcount", "generate", "--out", "logs", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        timeout=300,
    )


def run_quickstart(cwd: Path) -> str:
    (cwd / "quickstart.py").write_text(quickstart_code(), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "quickstart.py"], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def expected(cwd: Path) -> tuple[Counter[str], int]:
    counts: Counter[str] = Counter()
    malformed = 0
    for path in (cwd / "logs").iterdir():
        for line in path.read_text(encoding="utf-8").split("\n")[:-1]:
            parsed = parse_line(line)
            if isinstance(parsed, Malformed):
                malformed += 1
            else:
                counts[parsed.url] += 1
    return counts, malformed


def test_the_quickstart_counts_generated_logs_and_resumes_after_rotation(tmp_path: Path) -> None:
    generate(tmp_path, "--records", "4000", "--files", "2", "--malformed", "0.01")
    out = run_quickstart(tmp_path)
    counts, malformed = expected(tmp_path)
    assert malformed > 0
    assert f"{sum(counts.values())} lines counted, {malformed} bad records" in out
    top = [line.split() for line in out.splitlines()[1:]]
    assert len(top) == 5
    assert all(int(n) == counts[url] for n, url in top)
    assert [int(n) for n, _ in top] == [n for _, n in counts.most_common(5)]  # the top five, ties aside

    # the logs grow and rotate between runs: a new file, and the newest one renamed away
    newest = sorted(os.listdir(tmp_path / "logs"))[-1]
    generate(tmp_path, "--records", "2000", "--files", "1", "--first-file", "2", "--malformed", "0.01")
    os.rename(tmp_path / "logs" / newest, tmp_path / "logs" / (newest + "-20250102"))
    out = run_quickstart(tmp_path)
    total, total_malformed = expected(tmp_path)
    assert f"{sum(total.values()) - sum(counts.values())} lines counted" in out
    published = letters(tmp_path)
    assert len(published) == total_malformed  # each malformed line dead-lettered once
    assert all(x["stage"] == "parse" for x in published)
    for line in out.splitlines()[1:]:
        n, url = line.split()
        assert int(n) == total[url]


def test_a_typo_in_the_quickstarts_key_stops_it_naming_the_error_and_the_fix_counts_every_line(
    tmp_path: Path,
) -> None:
    """Every record a bad one is a bug, not bad data: the share budget stops the run, names the error."""
    generate(tmp_path, "--records", "3000", "--files", "1", "--malformed", "0.002")
    code = quickstart_code()
    assert code.count('r["url"]') == 1
    (tmp_path / "quickstart.py").write_text(code.replace('r["url"]', 'r["ulr"]'), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "quickstart.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    assert "The commonest" in done.stderr and "stage key, KeyError: 'ulr'" in done.stderr, done.stderr
    assert letters(tmp_path) == []  # no checkpoint completed: nothing published
    out = run_quickstart(tmp_path)  # the code as the README has it
    counts, malformed = expected(tmp_path)
    assert f"{sum(counts.values())} lines counted, {malformed} bad records" in out
    assert len(letters(tmp_path)) == malformed


def test_the_quickstart_killed_with_sigkill_and_run_again_is_exact(tmp_path: Path) -> None:
    """Issue 33: 508 dead letters for 500 malformed lines after a kill -9. Now: counts and letters exact."""
    generate(tmp_path, "--records", "200000", "--files", "4", "--malformed", "0.005")
    (tmp_path / "quickstart.py").write_text(quickstart_code(), encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "quickstart.py"], cwd=tmp_path, stdout=subprocess.DEVNULL)
    checkpoints = tmp_path / "state" / "checkpoints" / "quickstart"
    deadline = time.monotonic() + 240
    # Killed once some checkpoints (and so some published dead letters) exist, mid-run.
    while proc.poll() is None and time.monotonic() < deadline:
        if checkpoints.exists() and len(list(checkpoints.glob("chk-*"))) >= 1 and letters(tmp_path):
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    assert proc.wait(timeout=60) == -signal.SIGKILL, "the Quickstart finished before it could be killed"
    before = letters(tmp_path)
    assert 0 < len(before) < expected(tmp_path)[1]
    out = run_quickstart(tmp_path)
    counts, malformed = expected(tmp_path)
    published = letters(tmp_path)
    assert len(published) == malformed  # not one more: the letters after the checkpoint came once
    assert len({(x["file"], x["offset"]) for x in published}) == malformed
    for line in out.splitlines()[1:]:
        n, url = line.split()
        assert int(n) == counts[url]


def test_every_block_that_shows_a_command_says_whether_it_runs() -> None:
    assert unmarked_cli_blocks() == []
    for section, index in (("Quickstart", 0), ("On Spark", 0), ("On Spark", 1)):
        block = readme_block(section, index)
        assert block.runnable, f"{block.where} must be marked runnable"
