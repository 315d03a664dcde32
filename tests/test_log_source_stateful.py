"""A Hypothesis state machine over log files and a job that gets SIGKILLed: counts exact after every restart.

Rules append lines (some malformed), rotate by rename and by copytruncate,
move fully read files away, add files whose names sort first, and run the
URL count in a child process that kills itself with SIGKILL after a drawn
number of outputs, or runs to the end. After every run to the end the state
must hold exactly the model's count of every well-formed line written, and
the published dead letters every malformed line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from logfiles import LogDir

CHILD = Path(__file__).with_name("logsource_child.py")


class LogRotationMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="logsource-sm-"))
        self.logs = LogDir(self.root)
        self.dirty: set[str] = set()  # files with lines no run to the end has read yet
        self.malformed: set[str] = set()
        self.k = 0

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def names(self) -> list[str]:
        return sorted(p.name for p in self.logs.dir.iterdir())

    def next_k(self) -> int:
        self.k += 1
        return self.k

    @rule(name=st.sampled_from(["access.log", "b.log"]), n=st.integers(1, 25))
    def append(self, name: str, n: int) -> None:
        self.logs.write(name, n)
        self.dirty.add(name)

    @rule(name=st.sampled_from(["access.log", "b.log"]))
    def malformed_line(self, name: str) -> None:
        text, _ = self.logs.line()
        raw = text[: len(text) // 2]  # cut short, as a crashed writer leaves it; unique by its seq
        self.logs.write_raw(name, raw.encode() + b"\n")
        self.malformed.add(raw)
        self.dirty.add(name)

    @precondition(lambda self: self.logs.path("access.log").exists())
    @rule()
    def rename_rotation(self) -> None:
        to = f"access.log.{self.next_k()}"
        self.logs.rename("access.log", to)
        if "access.log" in self.dirty:
            self.dirty.discard("access.log")
            self.dirty.add(to)

    @precondition(
        lambda self: self.logs.path("access.log").exists() and self.logs.path("access.log").stat().st_size
    )
    @rule()
    def copytruncate(self) -> None:
        to = f"access.log-2025{self.next_k():04d}"
        self.logs.copytruncate("access.log", to)
        if "access.log" in self.dirty:
            self.dirty.discard("access.log")
            self.dirty.add(to)

    @rule(n=st.integers(1, 20))
    def new_file_sorting_first(self, n: int) -> None:
        name = f"a{1000 - self.next_k():04d}.log"
        self.logs.write(name, n)
        self.dirty.add(name)

    @precondition(lambda self: any(n not in self.dirty for n in self.names()))
    @rule(data=st.data())
    def move_away_a_read_file(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from([n for n in self.names() if n not in self.dirty]))
        self.logs.move_away(name)

    @rule(kill_at=st.integers(1, 120))
    def run_killed(self, kill_at: int) -> None:
        done = self.run_child("--kill-at", str(kill_at))
        if done.returncode == 0:  # fewer outputs than kill_at: it ran to the end
            self.check()
        else:
            assert done.returncode == -9, done.stderr

    @rule()
    def run_to_the_end(self) -> None:
        done = self.run_child()
        assert done.returncode == 0, done.stderr
        self.check()

    def run_child(self, *args: str) -> subprocess.CompletedProcess[str]:
        result = self.root / "result.json"
        result.unlink(missing_ok=True)
        return subprocess.run(
            [sys.executable, str(CHILD), str(self.root), *args], capture_output=True, text=True, timeout=120
        )

    def check(self) -> None:
        out = json.loads((self.root / "result.json").read_text())
        assert out["counts"] == dict(self.logs.model)
        letters = sorted((self.root / "dead-letters").glob("part-*.json"))
        raws = {json.loads(x)["raw"] for p in letters for x in p.read_text().splitlines()}
        assert raws == self.malformed
        self.dirty.clear()


TestLogRotation = LogRotationMachine.TestCase
TestLogRotation.settings = settings(
    settings.default, max_examples=max(3, settings.default.max_examples // 4), stateful_step_count=12
)
