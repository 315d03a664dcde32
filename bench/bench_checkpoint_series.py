"""A stream of checkpoints on the heap: what a base costs the checkpoint that is due for one.

Two subtasks (p=2, key groups 0-63 and 64-127 of 128) hold ``N`` keys of
``ValueState[int]`` under string keys; the filesystem storage writes every
checkpoint. After the first (full) checkpoint, each round changes 1 % of the
keys (drawn at random, one ``update_batch`` per subtask, as a micro-batch's
records would) and takes a native checkpoint, as a Spark job does per
micro-batch, ``--rounds`` times, with ``max-deltas`` 10: about every eleventh
checkpoint is due for a base.

Per mode, the same rounds:

- **sync** (``base-in-background=false``): the checkpoint that is due writes
  the base itself;
- **background** (the default): the due checkpoint writes a delta and the
  base is encoded on a thread of its own; the first checkpoint after it
  finished uploads it.

Reported per mode: the slowest checkpoint, the median and the 95th
percentile, the sum of the checkpoints, and the sum of rounds (the change
plus the checkpoint: the work a batch waits for, in which the background
encoding interleaves), and how many checkpoints uploaded a base. ``--gap``
seconds of idle time after each round stand for the time a Spark batch spends
outside the Python task (the JVM reading and shuffling, the driver
committing); the background encoding runs then. Run it twice; the machine is
shared.

Run: ``python bench/bench_checkpoint_series.py [--keys 4000000] [--rounds 24] [--gap 0.2]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import statistics
import tempfile
import time
from typing import Any

from bench_checkpoint_scaling import DESC, build, checkpoint, load

from statekit.plugins._registry import default_registry
from statekit_storage import FileSystemCheckpointStorage


def run(n: int, rounds: int, gap: float, background: bool, root: str) -> dict[str, Any]:
    factory = default_registry().create_backend("heap", {"base-in-background": background})
    local = tempfile.mkdtemp(dir=root)
    storage = FileSystemCheckpointStorage(os.path.join(root, f"series-{n}-{background}"))
    keys, low, subtasks = build(factory, n, local)
    _, full, _ = checkpoint(storage, 1, subtasks, native=True)
    for b in subtasks:
        b.notify_checkpoint_complete(1)
    rng = random.Random(5)
    ckpt: list[float] = []
    batch: list[float] = []
    bases = 0
    for r in range(rounds):
        cid = r + 2
        changed = rng.sample(range(n), n // 100)
        t0 = time.perf_counter()
        for i, b in enumerate(subtasks):
            b.get_state(DESC).update_batch([keys[j] for j in changed if low[j] == (i == 0)], lambda v: v + 1)
        t1 = time.perf_counter()
        _, uploaded, _ = checkpoint(storage, cid, subtasks, native=True)
        for b in subtasks:
            b.notify_checkpoint_complete(cid)
        t2 = time.perf_counter()
        bases += uploaded > 0.2 * full  # a base (of both subtasks, as a rule) rather than 1 % deltas
        ckpt.append(t2 - t1)
        batch.append(t2 - t0)
        if gap:
            time.sleep(gap)
    for b in subtasks:
        b.close()
    shutil.rmtree(local, ignore_errors=True)
    ordered = sorted(ckpt)
    return {
        "max": ordered[-1],
        "median": statistics.median(ordered),
        "p95": ordered[int(0.95 * (len(ordered) - 1))],
        "sum_ckpt": sum(ckpt),
        "sum_batch": sum(batch),
        "bases": bases,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--keys", default="4000000")
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--gap", type=float, default=0.0)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="statekit-series-")
    try:
        print(
            "| keys | mode | gap s | slowest checkpoint s | median s | p95 s | checkpoints s (sum) | "
            "change + checkpoint s (sum) | bases uploaded | load before / after |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for n in (int(x) for x in args.keys.split(",")):
            for background in (False, True):
                before = load()
                r = run(n, args.rounds, args.gap, background, root)
                print(
                    f"| {n / 1e6:g}M | {'background' if background else 'sync'} | {args.gap:g} | "
                    f"{r['max']:.2f} | {r['median']:.3f} | {r['p95']:.2f} | {r['sum_ckpt']:.2f} | "
                    f"{r['sum_batch']:.2f} | {r['bases']} | {before} / {load()} |",
                    flush=True,
                )
                gc.collect()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
