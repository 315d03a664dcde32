"""Namespace churn stays bounded: state after 10,000 one-minute windows against after 100, per backend.

A window is a namespace of keyed state that lives a minute of event time and
is then cleared; a job running for a week opens ten thousand of them per key.
What a backend keeps must follow the windows *open now*, not every window ever
opened. This runs ``WindowedAggregate(TumblingEventTimeWindows("1 minute"),
Count())`` on a ``LocalRunner`` with ``event_time=EventTime(ts, "10 seconds")``
over a fixed set of ``--keys`` keys, one record per key and window, event times
in order (each key's record at its own offset in the minute), through
``--windows`` windows (default 10,000), and measures after 100, 1,000 and
10,000 windows (``--at``), each time while the job runs (open windows still
open, nothing flushed):

- ``num_entries()`` of the subtask's keyed backend (window contents and the
  event-time timers state), and the timers pending in the timer service;
- heap: ``tracemalloc``'s current traced memory after ``gc.collect()`` (traced
  from before the runner is made, so it counts the state and the runner);
- every backend: the process's RSS, and the bytes under the backend's local
  directory (on-disk size; 0 for heap).

It checks that every closed window was emitted once with its count (one per
key and window). The ratio of 10,000 to 100 windows should be about 1 (state
proportional to open windows); the growth per window (bytes per window opened
and closed) should be about 0. Backends: heap, rocksdb, lmdb, and sqlite when
its plugin is installed (the registry lists it); ``--backend`` picks some.

Run: ``python bench/bench_namespace_churn.py [--windows 10000] [--keys 100] [--backend heap]``.
"""

from __future__ import annotations

import argparse
import gc
import operator
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass, field

from statekit import EventTime, LocalRunner, TimeDomain
from statekit.plugins._registry import default_registry
from statekit.timers import TIMER_STATE_NAMES
from statekit.windows import Count, TumblingEventTimeWindows, WindowedAggregate

WINDOW_MS = 60_000
STATE = "window-contents"
TIMERS = TIMER_STATE_NAMES[TimeDomain.EVENT_TIME]


def windowed_count() -> WindowedAggregate:
    return WindowedAggregate(TumblingEventTimeWindows("1 minute"), Count())


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def dir_bytes(path: str) -> int:
    """Bytes allocated to the files under ``path`` (sparse files count what they use)."""
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(d, f)).st_blocks * 512
            except FileNotFoundError:
                pass  # a compaction removed it meanwhile
    return total


@dataclass
class Sample:
    windows: int
    seconds: float
    entries: int
    window_entries: int
    timer_entries: int
    timers_pending: int
    traced: int | None
    rss: int
    disk: int


@dataclass
class Run:
    backend: str
    samples: list[Sample] = field(default_factory=list)
    emitted: int = 0


def run_backend(name: str, *, windows: int, keys: int, at: list[int], parallelism: int, work: str) -> Run:
    """Runs the windowed count through ``windows`` windows, sampling after each of ``at``."""
    local = os.path.join(work, name)
    os.makedirs(local)
    traced = name == "heap"
    gc.collect()
    if traced:
        tracemalloc.start()
    runner = LocalRunner(
        windowed_count,
        key_selector=operator.itemgetter(0),
        config={"statekit.backend": name, "statekit.local-dir": local, "statekit.parallelism": parallelism},
        event_time=EventTime(operator.itemgetter(1), "10 seconds"),
        job_id=f"churn-{name}",
    )
    names = [f"user-{k:05d}" for k in range(keys)]
    offsets = [k * WINDOW_MS // keys for k in range(keys)]
    run = Run(name)
    # What was emitted is checked without keeping it (a set of every window would be churn of its
    # own): per key, window starts must come in increasing order, each with count 1.
    last_start = dict.fromkeys(names, -1)
    todo = sorted(set(at))
    t0 = time.perf_counter()
    try:
        for w in range(windows):
            start = w * WINDOW_MS
            for key, off in zip(names, offsets):
                for k, s, _, n in runner.process((key, start + off)):
                    if s <= last_start[k] or n != 1:
                        raise SystemExit(
                            f"{name}: window ({k}, {s}) emitted twice, out of order or counted {n}"
                        )
                    last_start[k] = s
                    run.emitted += 1
            if todo and w + 1 == todo[0]:
                todo.pop(0)
                seconds = time.perf_counter() - t0
                gc.collect()
                ctxs = runner.subtasks
                timers = [st.timers for st in runner._subtasks]  # the runner's timer services
                run.samples.append(
                    Sample(
                        windows=w + 1,
                        seconds=seconds,
                        entries=sum(c.keyed_backend.num_entries() for c in ctxs),
                        window_entries=sum(c.keyed_backend.num_entries(STATE) for c in ctxs),
                        timer_entries=sum(c.keyed_backend.num_entries(TIMERS) for c in ctxs),
                        timers_pending=sum(t.pending(TimeDomain.EVENT_TIME) for t in timers),
                        traced=tracemalloc.get_traced_memory()[0] if traced else None,
                        rss=rss_bytes(),
                        disk=dir_bytes(local),
                    )
                )
                s = run.samples[-1]
                print(
                    f"  {name:<8} {s.windows:>7,} windows  {s.seconds:7.1f} s  entries {s.entries:>6,}  "
                    f"timers {s.timers_pending:>5,}"
                    + (f"  traced {s.traced / 2**20:7.2f} MiB" if s.traced is not None else "")
                    + f"  RSS {s.rss / 2**20:7.1f} MiB  disk {s.disk / 2**20:7.2f} MiB",
                    flush=True,
                )
        # Every window the watermark has passed was emitted, for every key, and no other.
        closed = sum(1 for w in range(windows) if (w + 1) * WINDOW_MS - 1 <= runner.watermark)
        if run.emitted != closed * keys or any(s != (closed - 1) * WINDOW_MS for s in last_start.values()):
            raise SystemExit(f"{name}: {run.emitted} windows emitted, expected {closed} x {keys} keys")
    finally:
        runner.close()
        if traced:
            tracemalloc.stop()
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, default=10_000, help="one-minute windows to run through")
    ap.add_argument("--keys", type=int, default=20, help="the fixed key set (one record per key and window)")
    ap.add_argument("--at", default="100,1000,10000", help="windows after which to measure")
    ap.add_argument("--parallelism", type=int, default=1, help="LocalRunner subtasks")
    ap.add_argument("--backend", action="append", help="a backend to run (default: every installed one)")
    args = ap.parse_args(argv)
    at = [int(a) for a in args.at.split(",") if int(a) <= args.windows]
    if len(at) < 2:
        ap.error("--at needs two points within --windows")

    installed = default_registry().backends()
    wanted = args.backend or [b for b in ("heap", "rocksdb", "lmdb", "sqlite") if b in installed]
    missing = [b for b in wanted if b not in installed]
    if missing:
        ap.error(f"backends not installed: {missing}; installed: {sorted(installed)}")
    if "sqlite" not in installed:
        print("sqlite: the statekit-sqlite plugin is not installed, left out", flush=True)

    work = tempfile.mkdtemp(prefix="bench-namespace-churn-")
    runs: list[Run] = []
    try:
        print(
            f"{args.keys} keys x {args.windows:,} one-minute windows = {args.keys * args.windows:,} records, "
            f"LocalRunner parallelism {args.parallelism}, watermark delay 10 s",
            flush=True,
        )
        for name in wanted:
            runs.append(
                run_backend(
                    name,
                    windows=args.windows,
                    keys=args.keys,
                    at=at,
                    parallelism=args.parallelism,
                    work=work,
                )
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    lo, hi = at[0], at[-1]
    print()
    print(
        f"State after {lo:,} and after {hi:,} windows ({args.keys} keys; {hi / lo:.0f}x the windows opened "
        "and closed). ratio = after / before; per window = growth / windows between"
    )
    head = f"  {'backend':<8} {'measure':<26}{f'@{lo:,}':>14}{f'@{hi:,}':>14}{'ratio':>8}{'per window':>14}"
    print(head)

    def row(backend: str, what: str, a: float, b: float, unit: str) -> None:
        ratio = b / a if a else float("nan")
        per = (b - a) / (hi - lo)
        fmt = (lambda v: f"{v / 2**20:,.2f} MiB") if unit == "bytes" else (lambda v: f"{v:,.0f}")
        per_s = f"{per:+,.0f} B" if unit == "bytes" else f"{per:+,.3f}"
        print(f"  {backend:<8} {what:<26}{fmt(a):>14}{fmt(b):>14}{ratio:>8.2f}{per_s:>14}")

    for r in runs:
        a, b = r.samples[0], r.samples[-1]
        row(r.backend, "num_entries() (all states)", a.entries, b.entries, "n")
        row(r.backend, "timers pending", a.timers_pending, b.timers_pending, "n")
        if a.traced is not None and b.traced is not None:
            row(r.backend, "tracemalloc current", a.traced, b.traced, "bytes")
        row(r.backend, "process RSS", a.rss, b.rss, "bytes")
        if r.backend != "heap":
            row(r.backend, "on-disk size (local dir)", a.disk, b.disk, "bytes")
        rate = hi * args.keys / b.seconds
        print(f"  {r.backend:<8} {'records/s (whole run)':<26}{rate:>28,.0f}   {r.emitted:,} windows emitted")
    print(
        "  RSS is the whole process's: backends run one after another in it, so later ones start from "
        "the high-water mark of earlier ones; compare a backend's two columns, not backends."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
