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
:func:`lines_in_files`, every line the files hold. :class:`SteppedLogrotate`
takes logrotate's steps one at a time, and :func:`rotate_inside_reads` runs them
inside a source's listings and opens (:func:`at_contact_points`), where a busy
machine interleaves them.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import subprocess
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

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


def rotated_away_unseen(logs: LogDir, rotate: Logrotate, n: int, *, counted: bool = True) -> tuple[Path, int]:
    """``n`` lines into an empty ``access.log``, rotated twice (``delaycompress``; 10 lines between).

    The ``n`` lines end up only in ``access.log.2.gz``, the 10 in
    ``access.log.1``. Returns the ``.gz`` and its decompressed length.
    """
    logs.write("access.log", n, counted=counted)
    rotate.rotate()
    logs.write("access.log", 10)
    rotate.rotate()
    gz = logs.path("access.log.2.gz")
    with gzip.open(gz, "rb") as z:
        return gz, len(z.read())


_COPY_BLOCK = 8192  # logrotate's sparse_copy reads and writes BUFSIZ bytes at a time


class SteppedLogrotate:
    """logrotate 3.21 (rotate 1000, compress, delaycompress, and ``mode``) over ``access.log``, step by step.

    Its order: compress the previous rotation's ``.1`` (delaycompress) and
    remove it, shift the ``.N.gz`` files up by one, then rotate the log. With
    ``copytruncate``: create ``.1``, copy the log into it in 8 KiB writes,
    truncate the log. With ``create`` (logrotate's default): rename the log to
    ``.1``, create a new empty log, and the server reopens it (postrotate);
    until then its lines go to ``.1``. Lines are written as a server does,
    through one ``O_APPEND`` descriptor (:meth:`write`). :meth:`step` takes the
    next step of a rotation :meth:`start` began; :attr:`window` is true between
    a copy's end and the truncation, where a line written is lost by logrotate
    itself (as its manual says).
    """

    def __init__(self, logs: LogDir, rnd: random.Random, mode: str = "copytruncate") -> None:
        self.logs = logs
        self.rnd = rnd
        self.mode = mode
        self.steps: Iterator[None] | None = None
        self.window = False
        self.fd = os.open(logs.path("access.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def close(self) -> None:
        os.close(self.fd)

    def start(self) -> None:
        self.steps = self._rotate()

    def step(self) -> None:
        if self.steps is not None and next(self.steps, "done") == "done":
            self.steps = None

    def write(self, n: int, *, pad: int = 0) -> None:
        """``n`` lines through the server's descriptor; ``pad`` bytes more each (a copy of many blocks)."""
        for _ in range(n):
            text, _ = self.logs.line()
            if pad:
                text = text[:-1] + ', "pad": "' + "p" * pad + '"}'
            os.write(self.fd, (text + "\n").encode())

    def _rotate(self) -> Iterator[None]:
        d = self.logs.dir
        one = d / "access.log.1"
        if one.exists():
            data = one.read_bytes()
            with open(d / "access.log.1.gz", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb") as z:
                for i in range(0, len(data), 65536):
                    z.write(data[i : i + 65536])
                    z.flush()
                    yield
            yield
            one.unlink()
            yield
        for n in sorted((int(p.name.split(".")[2]) for p in d.glob("access.log.*.gz")), reverse=True):
            os.rename(d / f"access.log.{n}.gz", d / f"access.log.{n + 1}.gz")
            yield
        if self.mode == "create":
            os.rename(d / "access.log", one)
            yield
            os.close(os.open(d / "access.log", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            yield
            os.close(self.fd)  # postrotate: the server reopens its log
            self.fd = os.open(d / "access.log", os.O_WRONLY | os.O_APPEND)
            yield
            return
        log = os.open(d / "access.log", os.O_RDWR)
        copy = os.open(one, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            yield
            while block := os.read(log, _COPY_BLOCK):
                os.write(copy, block)
                if self.rnd.random() < 0.1:
                    yield
            self.window = True
            yield  # logrotate's fsync of the copy
            os.ftruncate(log, 0)
            self.window = False
        finally:
            os.close(copy)
            os.close(log)
        yield

    def busy(self, busy: float) -> Callable[[], None]:
        """What happens at a contact point with probability ``busy``: maybe lines written, the next step."""

        def at_contact() -> None:
            if self.rnd.random() >= busy:
                return
            if not self.window and self.rnd.random() < 0.3:
                self.write(self.rnd.randint(1, 30))
            self.step()

        return at_contact


def drawn_rotations(test: Callable[..., None]) -> Callable[..., None]:
    """``test`` run with drawn ``seed``, ``busy`` and ``mode`` for :func:`rotate_inside_reads` (40 in ci)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    drawn = given(
        seed=st.integers(0, 2**32 - 1),
        busy=st.sampled_from([0.15, 0.4, 0.7]),
        mode=st.sampled_from(["copytruncate", "create"]),
    )(test)
    return settings(
        max_examples=max(40, 2 * settings.default.max_examples),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )(drawn)


def rotate_inside_reads(
    logs: LogDir,
    seed: int,
    busy: float,
    read: Callable[[random.Random], None],
    settle: Callable[[], None] = lambda: None,
    mode: str = "copytruncate",
) -> None:
    """Three rotations (``mode``: ``copytruncate`` or ``create``) with steps inside ``read``'s file accesses.

    ``read`` reads what is new (given the drawn numbers); it is called at drawn
    points between the steps too, and once more after the rotations with the
    files as they stay. ``settle`` runs before each rotation starts and at the end.
    No ``InputLostWarning`` may be raised: nothing is written between a copy's
    end and its truncation, so nothing is lost, and a report would be false.
    """
    from statekit import InputLostWarning

    rnd = random.Random(seed)
    rotate = SteppedLogrotate(logs, rnd, mode)
    at_contact = rotate.busy(busy)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputLostWarning)
        with pytest.MonkeyPatch.context() as monkeypatch:
            at_contact_points(monkeypatch, at_contact)
            for _ in range(3):
                rotate.write(rnd.randint(50, 600), pad=300)
                read(rnd)
                settle()
                rotate.start()
                while rotate.steps is not None:
                    if rnd.random() < 0.5:
                        read(rnd)
                    else:
                        at_contact()
                read(rnd)
        read(rnd)  # the files as they stay
        settle()
    rotate.close()


def assert_every_line_once(logs: LogDir, seqs: Counter[int]) -> None:
    """Every line the files hold was read, none twice."""
    held = lines_in_files(logs.dir)
    twice = sorted(s for s, n in seqs.items() if n > 1)
    assert not twice, f"{len(twice)} lines read twice, the first: {twice[:5]}"
    unread = sorted(set(held) - set(seqs))
    assert not unread, f"{len(unread)} lines in the files never read, the first: {unread[:5]}"


def at_contact_points(monkeypatch: pytest.MonkeyPatch, at_contact: Callable[[], None]) -> None:
    """``at_contact`` runs before a source looks at a listed file and before it opens one.

    Those are the points where another process's rename, copy or truncation
    lands between what the source saw and what it reads next.
    """
    import statekit.sources._files as files
    import statekit.sources._locating as locating
    import statekit.sources._logsource as logsource

    listed, opened = files._listed, files.open_candidate

    def _listed(*args: Any, **kwargs: Any) -> Any:
        at_contact()
        return listed(*args, **kwargs)

    def open_candidate(*args: Any, **kwargs: Any) -> Any:
        at_contact()
        return opened(*args, **kwargs)

    monkeypatch.setattr(files, "_listed", _listed)
    for module in (files, locating, logsource):
        if hasattr(module, "open_candidate"):
            monkeypatch.setattr(module, "open_candidate", open_candidate)
