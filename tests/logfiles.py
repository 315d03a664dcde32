"""Log files that rotate, with a model of every well-formed line written: shared by the input-file tests.

:class:`LogDir` writes JSON lines (each unique: a sequence number), rotates
them as logrotate does (``copytruncate``, also in its two steps, rename,
compression), moves files away, and keeps the count per URL of every line it
wrote. :class:`CountJob` runs the URL count on a :class:`~statekit.LocalRunner`
over a :class:`~statekit.LogSource`, restoring the latest checkpoint like a
job restarted after a crash, and keeps the latest count of every URL.
:class:`Logrotate` runs Debian's real ``logrotate`` binary over a LogDir and
:class:`Writer` appends to a log from a thread, as a server does, while it
rotates; :class:`SeqJob` then checks line by line against
:func:`lines_in_files`, every line the files hold.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from statekit import (
    KeyedProcessFunction,
    LocalRunner,
    LogSource,
    ProcessContext,
    RunResult,
    RuntimeContext,
    ValueStateDescriptor,
)

COUNT = ValueStateDescriptor("count", int, default=0)
URLS = 7


class CountPerUrl(KeyedProcessFunction):
    """Counts records per key; emits ``(key, count)``."""

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(COUNT)

    def process(self, record: Any, ctx: ProcessContext) -> Iterable[Any]:
        n = self.count.value() + 1
        self.count.update(n)
        yield (ctx.current_key, n)


class CountAndSeq(KeyedProcessFunction):
    """Counts records per key; emits ``(key, count, seq)``, so a test can tell which lines were processed."""

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(COUNT)

    def process(self, record: Any, ctx: ProcessContext) -> Iterable[Any]:
        n = self.count.value() + 1
        self.count.update(n)
        yield (ctx.current_key, n, record["seq"])


def url_of(seq: int) -> str:
    """The URL :meth:`LogDir.line` gives line ``seq``."""
    return f"/u{seq % URLS}"


class LogDir:
    """A directory of log files and the model of what was written to it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / "logs"
        self.away = root / "elsewhere"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.away.mkdir(parents=True, exist_ok=True)
        self.model: Counter[str] = Counter()
        self.seq = 0

    def path(self, name: str) -> Path:
        return self.dir / name

    def line(self) -> tuple[str, str]:
        """A new well-formed line (without newline) and its URL."""
        self.seq += 1
        url = url_of(self.seq)
        return json.dumps({"url": url, "seq": self.seq}), url

    def write(self, name: str, n: int, *, counted: bool = True) -> list[str]:
        """Appends ``n`` lines; ``counted=False`` for lines the test knows will be lost."""
        urls = []
        with open(self.path(name), "a", encoding="utf-8") as f:
            for _ in range(n):
                text, url = self.line()
                f.write(text + "\n")
                urls.append(url)
                if counted:
                    self.model[url] += 1
        return urls

    def write_raw(self, name: str, data: bytes) -> None:
        """Appends bytes as they are (malformed lines, partial lines); the model is the test's business."""
        with open(self.path(name), "ab") as f:
            f.write(data)

    def uncount(self, urls: Iterable[str]) -> None:
        for url in urls:
            self.model[url] -= 1
            if not self.model[url]:
                del self.model[url]

    def copytruncate(self, name: str, to: str | Path) -> None:
        """logrotate's copytruncate: copy the file's content to ``to``, then truncate it in place."""
        target = to if isinstance(to, Path) else self.path(to)
        shutil.copyfile(self.path(name), target)
        with open(self.path(name), "r+b") as f:
            f.truncate(0)

    def copy(self, name: str, to: str) -> None:
        """copytruncate's first step alone: the copy, while the original is still whole."""
        shutil.copyfile(self.path(name), self.path(to))

    def truncate(self, name: str) -> None:
        """copytruncate's second step: the original truncated in place."""
        with open(self.path(name), "r+b") as f:
            f.truncate(0)

    def compress(self, name: str) -> None:
        """logrotate's compress: ``name`` becomes ``name.gz`` and is removed."""
        with open(self.path(name), "rb") as src, gzip.open(self.path(name + ".gz"), "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(self.path(name))

    def rename(self, name: str, to: str) -> None:
        os.rename(self.path(name), self.path(to))

    def move_away(self, name: str) -> None:
        os.rename(self.path(name), self.away / name)


class CountJob:
    """The URL count over a LogDir, run to the end of its input as a restarted job would be."""

    def __init__(self, logs: LogDir, conf: Mapping[str, Any] | None = None, *, interval: int = 7) -> None:
        self.logs = logs
        self.counts: dict[str, int] = {}
        self.conf = {
            "statekit.checkpoints.dir": str(logs.root / "checkpoints"),
            "statekit.parallelism": 2,
            "statekit.checkpoint.interval-records": interval,
            **(conf or {}),
        }

    def sink(self, out: Any) -> None:
        key, n = out
        self.counts[key] = n

    def runner(self) -> LocalRunner:
        return LocalRunner(
            CountPerUrl, key_selector=lambda r: r["url"], config=self.conf, job_id="logs", sink=self.sink
        )

    def source(self, **kw: Any) -> LogSource:
        return LogSource(self.logs.dir, parse=json.loads, **kw)

    def run(self, max_records: int | None = None, **kw: Any) -> RunResult:
        with self.runner() as runner:
            return runner.run(self.source(**kw), restore="latest", max_records=max_records)

    def exact(self) -> bool:
        return self.counts == dict(self.logs.model)


class SeqJob(CountJob):
    """The URL count that also keeps how often each line (by sequence number) was processed.

    Runs that end normally emit each processed record once (no restart
    replays outputs), so :attr:`seqs` is what the state was built from.
    """

    def __init__(self, logs: LogDir, conf: Mapping[str, Any] | None = None, *, interval: int = 997) -> None:
        super().__init__(logs, conf, interval=interval)
        self.seqs: Counter[int] = Counter()

    def sink(self, out: Any) -> None:
        key, n, seq = out
        self.counts[key] = n
        self.seqs[seq] += 1

    def runner(self) -> LocalRunner:
        return LocalRunner(
            CountAndSeq, key_selector=lambda r: r["url"], config=self.conf, job_id="logs", sink=self.sink
        )

    def check(self) -> int:
        """Every line the files hold processed once, none twice, and the state as those lines make it.

        Returns how many lines were processed that no file holds any more:
        read from the original before logrotate's copytruncate truncated them
        away (written after its copy), which only a reader that fast can count.
        """
        held = lines_in_files(self.logs.dir)
        twice = sorted(s for s, n in self.seqs.items() if n > 1)
        assert not twice, f"{len(twice)} lines processed twice, the first: {twice[:5]}"
        missing = sorted(set(held) - set(self.seqs))
        assert not missing, f"{len(missing)} lines in the files never processed, the first: {missing[:5]}"
        assert self.counts == dict(Counter(url_of(s) for s in self.seqs))
        return len(set(self.seqs) - set(held))


def lines_in_files(directory: Path) -> Counter[int]:
    """How often each line (by sequence number) is in the files of ``directory``, compressed ones included."""
    held: Counter[int] = Counter()
    for p in sorted(directory.iterdir()):
        opener: Any = gzip.open if p.name.endswith(".gz") else open
        with opener(p, "rb") as f:
            for raw in f.read().split(b"\n"):
                if raw:
                    held[json.loads(raw)["seq"]] += 1
    return held


class Writer:
    """Appends lines to a log from a thread, through one ``O_APPEND`` descriptor, as a server does.

    After a ``copytruncate`` its writes land at the new end of the truncated
    file. Every line is whole (one ``write``); ``pause`` stops it between lines.
    """

    def __init__(self, logs: LogDir, name: str, *, per_burst: int = 200) -> None:
        self.logs = logs
        self.fd = os.open(logs.path(name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.per_burst = per_burst
        self.running = threading.Event()
        self.running.set()
        self.stopped = threading.Event()
        self.lock = threading.Lock()  # held during a burst
        self.written = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            with self.lock:
                if self.running.is_set():
                    for _ in range(self.per_burst):
                        text, _ = self.logs.line()
                        os.write(self.fd, (text + "\n").encode())
                        self.written += 1
            self.stopped.wait(0.002)

    def pause(self) -> None:
        """Stop writing; returns once no write is under way."""
        self.running.clear()
        with self.lock:
            pass

    def resume(self) -> None:
        self.running.set()

    def stop(self) -> None:
        """Stop writing and close the file (again: nothing)."""
        if not self.stopped.is_set():
            self.stopped.set()
            self.thread.join(10)
            os.close(self.fd)


LOGROTATE = shutil.which("logrotate") or next(
    (p for p in ("/usr/sbin/logrotate", "/sbin/logrotate") if os.path.exists(p)), None
)


class Logrotate:
    """Debian's ``logrotate`` over ``logs/access.log`` with the directives given, forced by :meth:`rotate`."""

    def __init__(self, logs: LogDir, *directives: str, name: str = "access.log") -> None:
        assert LOGROTATE is not None, "logrotate is not installed"
        self.conf = logs.root / "logrotate.conf"
        self.state = logs.root / "logrotate.state"
        body = "\n".join(
            f"    {d}" for d in ("rotate 1000", "missingok", "notifempty", "nomail", *directives)
        )
        self.conf.write_text(f"{logs.path(name)} {{\n{body}\n}}\n")
        self.conf.chmod(0o644)

    def command(self) -> list[str]:
        assert LOGROTATE is not None
        return [LOGROTATE, "-f", "-s", str(self.state), str(self.conf)]

    def rotate(self) -> None:
        done = subprocess.run(self.command(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr

    def start(self) -> subprocess.Popen[str]:
        """A rotation in the background, to read the files while it copies and truncates."""
        return subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
