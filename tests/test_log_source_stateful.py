"""A Hypothesis state machine over log files and a job that gets SIGKILLed: counts exact after every restart.

Rules append lines (some malformed, some longer than the job's limit),
rotate by rename and by copytruncate (also in its two steps, with runs in the
window between the copy and the truncation), move fully read files away or
compress them, add files whose names sort first, and run the URL count in a
child process that kills itself with SIGKILL after a drawn number of outputs,
or runs to the end. After every run to the end the state must hold exactly
the model's count of every well-formed line written, the published dead
letters every malformed and every long line, and no input is reported lost.
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
LONG = 2048  # logsource_child.LONG: the job's statekit.source.max-line-bytes


class LogRotationMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="logsource-sm-"))
        self.logs = LogDir(self.root)
        self.dirty: set[str] = set()  # files with lines no run to the end has read yet
        self.malformed: set[str] = set()
        self.copied: str | None = None  # a copy made whose original is not truncated yet
        self.k = 0

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def names(self) -> list[str]:
        return sorted(p.name for p in self.logs.dir.iterdir())

    def next_k(self) -> int:
        self.k += 1
        return self.k

    def writable(self, name: str) -> str:
        # Between copytruncate's copy and its truncation nothing is written to the original:
        # logrotate loses such lines (documented), and the model would have to as well.
        return "b.log" if name == "access.log" and self.copied else name

    @rule(name=st.sampled_from(["access.log", "b.log"]), n=st.integers(1, 25))
    def append(self, name: str, n: int) -> None:
        name = self.writable(name)
        self.logs.write(name, n)
        self.dirty.add(name)

    @rule(name=st.sampled_from(["access.log", "b.log"]), extra=st.integers(1, 3 * LONG))
    def long_line(self, name: str, extra: int) -> None:
        name = self.writable(name)
        text, _ = self.logs.line()
        raw = (text + "x" * (LONG + extra)).encode()  # unique by its seq; a dead letter keeps its start
        self.logs.write_raw(name, raw + b"\n")
        self.malformed.add(raw[:LONG].decode())
        self.dirty.add(name)

    @rule(name=st.sampled_from(["access.log", "b.log"]))
    def malformed_line(self, name: str) -> None:
        name = self.writable(name)
        text, _ = self.logs.line()
        raw = text[: len(text) // 2]  # cut short, as a crashed writer leaves it; unique by its seq
        self.logs.write_raw(name, raw.encode() + b"\n")
        self.malformed.add(raw)
        self.dirty.add(name)

    @precondition(lambda self: self.logs.path("access.log").exists() and not self.copied)
    @rule()
    def rename_rotation(self) -> None:
        to = f"access.log.{self.next_k()}"
        self.logs.rename("access.log", to)
        if "access.log" in self.dirty:
            self.dirty.discard("access.log")
            self.dirty.add(to)

    @precondition(
        lambda self: (
            self.logs.path("access.log").exists()
            and self.logs.path("access.log").stat().st_size
            and not self.copied
        )
    )
    @rule(in_two_steps=st.booleans())
    def copytruncate(self, in_two_steps: bool) -> None:
        to = f"access.log-2025{self.next_k():04d}"
        if in_two_steps:  # runs may come in the window: the copy must not be read again
            self.logs.copy("access.log", to)
            self.copied = to
        else:
            self.logs.copytruncate("access.log", to)
            self.moved("access.log", to)

    @precondition(lambda self: self.copied)
    @rule()
    def truncate_after_copy(self) -> None:
        assert self.copied is not None
        self.logs.truncate("access.log")
        self.moved("access.log", self.copied)
        self.copied = None

    def moved(self, name: str, to: str) -> None:
        if name in self.dirty:
            self.dirty.discard(name)
            self.dirty.add(to)

    @rule(n=st.integers(1, 20))
    def new_file_sorting_first(self, n: int) -> None:
        name = f"a{1000 - self.next_k():04d}.log"
        self.logs.write(name, n)
        self.dirty.add(name)

    def read_files(self) -> list[str]:
        """Files every line of which a run to the end read (and no copy is pending on)."""
        if self.copied:
            return []
        return [n for n in self.names() if n not in self.dirty and not n.endswith(".gz")]

    @precondition(lambda self: self.read_files())
    @rule(data=st.data())
    def move_away_a_read_file(self, data: st.DataObject) -> None:
        self.logs.move_away(data.draw(st.sampled_from(self.read_files())))

    @precondition(lambda self: self.read_files())
    @rule(data=st.data())
    def compress_a_read_file(self, data: st.DataObject) -> None:
        """logrotate's compress: the file becomes name.gz, which is never read; nothing is lost."""
        name = data.draw(st.sampled_from(self.read_files()))
        if self.logs.path(name + ".gz").exists():
            return
        self.logs.compress(name)

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
        raws = [json.loads(x)["raw"] for p in letters for x in p.read_text().splitlines()]
        assert sorted(raws) == sorted(self.malformed)  # each exactly once: every raw line is unique
        assert out["lost"] == []  # every file that went was read to its end first
        self.dirty.clear()


TestLogRotation = LogRotationMachine.TestCase
TestLogRotation.settings = settings(
    settings.default, max_examples=max(3, settings.default.max_examples // 4), stateful_step_count=12
)
