"""A deterministic generator of nginx access logs as JSON lines.

Each line is one request, as in the seed example::

    {"@timestamp": "18/Apr/2019:00:00:00", "remote_addr": "127.0.0.1", "request": "GET", "url": "/api/a"}

URLs follow a Zipf-like law (a few are hot, most are rare). A fixed fraction of
the lines is malformed in one of several ways (see :data:`MALFORMED_KINDS`), so
the job's dead-letter path always has something to do.

Each file is one hour of traffic (file ``i`` is hour ``i`` of 18 April 2019,
UTC), its ``@timestamp`` s mostly increasing, as nginx writes them: every line
is up to :data:`JITTER_SECONDS` behind the line's place in the hour (requests
finish out of order), and a fraction (``late_fraction``) is 1 to 5 minutes
behind, as a slow request or a buffering log shipper leaves it. So the windowed
job always meets some late lines. No line is stamped before the log's first
second.

Every file is generated from ``(seed, file index)`` alone, so the output is
byte-for-byte reproducible, and generating files 0-3 and later files 4-5 gives
the same files as generating 0-5 at once (the demo relies on it to append new
logs to a directory a job has already read).
"""

from __future__ import annotations

import itertools
import os
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

__all__ = [
    "JITTER_SECONDS",
    "LATE_SECONDS",
    "MALFORMED_KINDS",
    "GenerateResult",
    "file_name",
    "generate_logs",
    "url_names",
]

#: The ways a generated line can be malformed, each a function of a valid line.
MALFORMED_KINDS: tuple[str, ...] = (
    "truncated",  # a JSON line cut short, as a crashed writer leaves it
    "plain-text",  # nginx's default "combined" format instead of JSON
    "missing-url",  # valid JSON without the url field
    "null-url",  # "url": null
    "number-url",  # "url": 404
    "empty-url",  # "url": ""
    "not-an-object",  # a JSON array
    "blank",  # an empty line
)

#: Every line's ``@timestamp`` is up to this many seconds before its place in the file.
JITTER_SECONDS = 3
#: A late line's ``@timestamp`` is this many seconds (inclusive range) before its place.
LATE_SECONDS = (60, 300)

_BASE_TIME = datetime(2019, 4, 18)
# nginx's month names, whatever the locale (strftime's %b is not).
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_METHODS = ("GET",) * 16 + ("POST",) * 3 + ("PUT", "DELETE")
_RESOURCES = ("users", "orders", "items", "search", "cart", "login", "static", "reviews", "images", "pay")


def file_name(index: int) -> str:
    """The name of generated file ``index``; names sort in index order."""
    return f"access-{index:05d}.log"


def url_names(n_urls: int, seed: int) -> list[str]:
    """The ``n_urls`` distinct URLs, most popular first (rank order depends on ``seed``)."""
    rng = random.Random(f"urls:{seed}")
    names = [f"/api/{_RESOURCES[i % len(_RESOURCES)]}/{i // len(_RESOURCES)}" for i in range(n_urls)]
    rng.shuffle(names)
    return names


@dataclass
class GenerateResult:
    """What :func:`generate_logs` wrote, with the ground truth a job must find.

    Attributes:
        paths: The files written, in index order.
        lines: Lines written (valid plus malformed).
        counts: Valid requests per URL.
        malformed: Malformed lines per kind (see :data:`MALFORMED_KINDS`).
        delayed: Lines stamped 1 to 5 minutes before their place (``late_fraction``).
    """

    paths: list[str] = field(default_factory=list)
    lines: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    malformed: Counter[str] = field(default_factory=Counter)
    delayed: int = 0

    @property
    def valid(self) -> int:
        """The number of valid lines."""
        return self.lines - self.malformed_total

    @property
    def malformed_total(self) -> int:
        """The number of malformed lines."""
        return sum(self.malformed.values())

    def merge(self, other: GenerateResult) -> GenerateResult:
        """The result of both generations together (e.g. a first batch of files and a later one)."""
        return GenerateResult(
            paths=[*self.paths, *other.paths],
            lines=self.lines + other.lines,
            counts=self.counts + other.counts,
            malformed=self.malformed + other.malformed,
            delayed=self.delayed + other.delayed,
        )


def _records_per_file(records: int, files: int) -> list[int]:
    base, extra = divmod(records, files)
    return [base + (1 if i < extra else 0) for i in range(files)]


def _malform(kind: str, ts: str, addr: str, method: str, url: str, rng: random.Random) -> str:
    valid = _line(ts, addr, method, url)
    if kind == "truncated":
        return valid[: rng.randrange(1, len(valid) - 1)]
    if kind == "plain-text":
        return (
            f'{addr} - - [{ts} +0000] "{method} {url} HTTP/1.1" 200 {rng.randrange(100, 9000)} "-" "curl/8.5"'
        )
    if kind == "missing-url":
        return f'{{"@timestamp": "{ts}", "remote_addr": "{addr}", "request": "{method}"}}'
    if kind == "null-url":
        return f'{{"@timestamp": "{ts}", "remote_addr": "{addr}", "request": "{method}", "url": null}}'
    if kind == "number-url":
        return f'{{"@timestamp": "{ts}", "remote_addr": "{addr}", "request": "{method}", "url": 404}}'
    if kind == "empty-url":
        return _line(ts, addr, method, "")
    if kind == "not-an-object":
        return f'["{ts}", "{addr}", "{method}", "{url}"]'
    if kind == "blank":
        return ""
    raise ValueError(f"unknown malformed kind {kind!r}")


def _line(ts: str, addr: str, method: str, url: str) -> str:
    # URLs and the other fields never contain quotes or backslashes: formatting is valid JSON.
    return f'{{"@timestamp": "{ts}", "remote_addr": "{addr}", "request": "{method}", "url": "{url}"}}'


def generate_logs(
    out_dir: str | os.PathLike[str],
    *,
    records: int,
    files: int = 4,
    first_file: int = 0,
    n_urls: int = 1000,
    zipf_s: float = 1.1,
    malformed_fraction: float = 0.001,
    late_fraction: float = 0.01,
    seed: int = 42,
) -> GenerateResult:
    """Writes ``records`` log lines over ``files`` files into ``out_dir``.

    Args:
        out_dir: The directory to write into (created if missing).
        records: Lines to write in all, malformed ones included.
        files: How many files to spread them over (as evenly as possible).
        first_file: The index of the first file; later generations into the
            same directory continue with fresh names (and fresh content).
        n_urls: Distinct URLs.
        zipf_s: The Zipf exponent: URL of rank ``r`` has weight ``1 / r**s``.
        malformed_fraction: The fraction of lines that are malformed, exactly
            ``round(fraction * lines)`` per file, spread over the kinds in turn.
        late_fraction: The fraction of lines stamped 1 to 5 minutes before their
            place in the file, exactly ``round(fraction * lines)`` per file.
        seed: Everything is a function of the seed and the file index.

    Returns:
        The files written and the ground truth: per-URL counts of the valid
        lines and per-kind counts of the malformed ones.

    Files are written under a temporary name and renamed, so a streaming
    reader never sees half a file.
    """
    if records < 0 or files < 1 or first_file < 0 or n_urls < 1:
        raise ValueError("records >= 0, files >= 1, first_file >= 0 and n_urls >= 1 are required")
    if not 0.0 <= malformed_fraction <= 1.0 or not 0.0 <= late_fraction <= 1.0:
        raise ValueError("malformed_fraction and late_fraction must be between 0 and 1")
    os.makedirs(out_dir, exist_ok=True)
    names = url_names(n_urls, seed)
    cum_weights = list(itertools.accumulate(1.0 / (r**zipf_s) for r in range(1, n_urls + 1)))
    result = GenerateResult()
    for offset, n in enumerate(_records_per_file(records, files)):
        index = first_file + offset
        path = os.path.join(os.fspath(out_dir), file_name(index))
        stamps = _stamps(index, n, late_fraction, seed, result)
        lines = _file_lines(index, n, names, cum_weights, malformed_fraction, stamps, seed, result)
        tmp = os.path.join(os.fspath(out_dir), f".{file_name(index)}.tmp")
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write("\n".join(lines))
            if lines:
                f.write("\n")
        os.replace(tmp, path)
        result.paths.append(path)
        result.lines += n
    return result


def _time_local(t: datetime) -> str:
    return f"{t.day:02d}/{_MONTHS[t.month - 1]}/{t.year}:{t.hour:02d}:{t.minute:02d}:{t.second:02d}"


def _stamps(index: int, n: int, late_fraction: float, seed: int, result: GenerateResult) -> list[str]:
    """The ``@timestamp`` of each of file ``index``'s ``n`` lines."""
    # A random stream of its own: the URLs, methods and malformed lines stay what they were.
    rng = random.Random(f"time:{seed}:{index}")
    late = set(rng.sample(range(n), round(late_fraction * n)))
    result.delayed += len(late)
    lo, hi = LATE_SECONDS
    first = index * 3600
    stamps = []
    for i in range(n):
        behind = rng.randint(lo, hi) if i in late else rng.randint(0, JITTER_SECONDS)
        second = max(0, first + (i * 3600) // n - behind)
        stamps.append(_time_local(_BASE_TIME + timedelta(seconds=second)))
    return stamps


def _file_lines(
    index: int,
    n: int,
    names: Sequence[str],
    cum_weights: Sequence[float],
    malformed_fraction: float,
    stamps: Sequence[str],
    seed: int,
    result: GenerateResult,
) -> list[str]:
    rng = random.Random(f"file:{seed}:{index}")
    urls = rng.choices(names, cum_weights=cum_weights, k=n)
    methods = rng.choices(_METHODS, k=n)
    n_bad = round(malformed_fraction * n)
    bad = dict(zip(sorted(rng.sample(range(n), n_bad)), itertools.cycle(MALFORMED_KINDS)))
    lines = []
    for i in range(n):
        ts = stamps[i]
        addr = f"10.{rng.randrange(4)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        kind = bad.get(i)
        if kind is None:
            lines.append(_line(ts, addr, methods[i], urls[i]))
            result.counts[urls[i]] += 1
        else:
            lines.append(_malform(kind, ts, addr, methods[i], urls[i], rng))
            result.malformed[kind] += 1
    return lines
