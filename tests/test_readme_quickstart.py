"""The README's Quickstart, extracted and run as written on ``statekit-urlcount generate`` output.

It must print its counts and exit 0 over logs with malformed lines, resume
exactly after the logs grow and rotate, and account for every generated line
(counted or dead-lettered).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from statekit_urlcount import Malformed, parse_line

README = Path(__file__).resolve().parents[1] / "README.md"


def quickstart_code() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Quickstart\n") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None
    return match.group(1)


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
    assert f"{sum(counts.values())} lines counted, {malformed} malformed" in out
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
    letters = (tmp_path / "state" / "dead-letters.jsonl").read_text().splitlines()
    assert len(letters) == total_malformed  # each malformed line dead-lettered once
    assert all(json.loads(x)["stage"] == "parse" for x in letters)
    for line in out.splitlines()[1:]:
        n, url = line.split()
        assert int(n) == total[url]
