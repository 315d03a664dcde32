"""Log files that rotate, with a model of every well-formed line written: shared by the input-file tests.

:class:`LogDir` writes JSON lines (each unique: a sequence number), rotates
them as logrotate does (``copytruncate``, rename), moves files away, and
keeps the count per URL of every line it wrote. :class:`CountJob` runs the
URL count on a :class:`~statekit.LocalRunner` over a
:class:`~statekit.LogSource`, restoring the latest checkpoint like a job
restarted after a crash, and keeps the latest count of every URL.
"""

from __future__ import annotations

import json
import os
import shutil
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
        url = f"/u{self.seq % URLS}"
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
