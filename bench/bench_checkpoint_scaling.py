"""Checkpoint cost after a 1 % change, restore and rescale, at growing state sizes.

Two subtasks (p=2, key groups 0-63 and 64-127 of 128) of one backend hold
``N`` keys of ``ValueState[int]`` under string keys; the filesystem storage
writes every checkpoint. Per size, in one process:

- **full**: the first native checkpoint (it writes everything), confirmed;
- **canonical**: the same state written canonically (every checkpoint of a
  backend without deltas, and every savepoint): the baseline of the old cost;
- **1 % change**: 1 % of the keys, drawn at random, get a new value; then
  the next native checkpoint: its uploaded bytes and time, as ratios to the
  full one's (the goal: <= 3 % of the bytes, <= 5 % of the time on heap);
- **restore** at p=2 from that checkpoint, and **rescale** 2 -> 3 (three new
  subtasks, each restoring its key groups), and their ratio; the restore of
  the canonical checkpoint at p=2 is the baseline (what a restore cost before);
- then the p=3 subtasks of a rescale, claiming the checkpoint they restored
  (as a runner does with its own), get another 1 % change and take a native
  checkpoint of their own: its **bytes and time after the rescale**, as ratios
  to the full one's (a delta against the old subtasks' chains, where a backend
  continues them; else everything); then **restore** at p=3 from it and
  **rescale** 3 -> 2, and their ratio (a rescale back, from instances that
  were themselves rescaled).

Times are best of ``--repeats`` where the step can be repeated without
changing what it measures (restores); checkpoints are taken once per round
(the second one's cost depends on the first). Run it twice and report the
load (``uptime``) printed with each table, since the machine is shared.

``--change K`` changes ``K`` keys each time instead of 1 %: with one ``K`` for
every size the checkpoint after the change should cost the same at every
size. The table's columns keep their names; after it, per backend, the growth
exponent of that checkpoint's bytes and time between the smallest and the
largest size (0: flat in the state's size, 1: in proportion to it).

Run: ``python bench/bench_checkpoint_scaling.py [--keys 1000000,4000000] [--backends heap,rocksdb]
[--change 10000]``.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import shutil
import tempfile
import time
from typing import Any

from statekit import ValueStateDescriptor
from statekit.backend_api import KeyedBackendParameters, key_group_for_bytes
from statekit.checkpointing import (
    complete_checkpoint,
    key_group_range_for_operator,
    load_checkpoint,
    write_subtask_state,
)
from statekit.plugins._registry import default_registry
from statekit.serializers import StrSerializer
from statekit_storage import FileSystemCheckpointStorage

DESC = ValueStateDescriptor("count", int, default=0)
MAXP = 128


def backend(factory: Any, p: int, i: int, local: str) -> Any:
    d = tempfile.mkdtemp(dir=local)
    return factory.create_keyed_backend(
        KeyedBackendParameters(
            key_serializer=StrSerializer(),
            key_group_range=key_group_range_for_operator(MAXP, p, i),
            max_parallelism=MAXP,
            local_dir=d,
        )
    )


def checkpoint(storage: Any, cid: int, backends: list[Any], native: bool) -> tuple[str, int, float]:
    """Write a checkpoint of every subtask; its location, keyed bytes uploaded, seconds."""
    t0 = time.perf_counter()
    writer = storage.begin_checkpoint("bench", cid)
    sts = [
        write_subtask_state(writer, "op", i, b, None, native_checkpoint_id=cid if native else None)
        for i, b in enumerate(backends)
    ]
    loc = complete_checkpoint(writer, job_id="bench", checkpoint_id=cid, max_parallelism=MAXP, subtasks=sts)
    secs = time.perf_counter() - t0
    uploaded = sum(int(st.keyed.get("uploaded", st.keyed["size"])) for st in sts if st.keyed)
    return loc, uploaded, secs


def restore(storage: Any, loc: str, factory: Any, p: int, local: str) -> tuple[float, list[Any]]:
    t0 = time.perf_counter()
    cp = load_checkpoint(storage, loc)
    out = []
    for i in range(p):
        b = backend(factory, p, i, local)
        cp.restore_subtask("op", i, p, b, None)
        b.get_state(DESC)  # where restored entries are decoded, on backends that defer it
        out.append(b)
    return time.perf_counter() - t0, out


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


def build(factory: Any, n: int, local: str) -> tuple[list[str], list[bool], list[Any]]:
    """Two subtasks holding ``n`` keys; the keys, whether each is the first subtask's, the subtasks."""
    keys = [f"/api/v1/resource/{i}" for i in range(n)]
    ser = StrSerializer()
    half = MAXP // 2
    low = [key_group_for_bytes(ser.serialize(k), MAXP) < half for k in keys]
    subtasks = [backend(factory, 2, i, local) for i in range(2)]
    for i, b in enumerate(subtasks):
        s = b.get_state(DESC)
        s.update_batch([k for k, lo in zip(keys, low) if lo == (i == 0)], lambda _: 1)
    gc.collect()
    return keys, low, subtasks


def run(name: str, n: int, repeats: int, root: str, change: int = 0) -> dict[str, float]:
    factory = default_registry().create_backend(name, {})
    local = tempfile.mkdtemp(dir=root)
    storage = FileSystemCheckpointStorage(os.path.join(root, f"{name}-{n}"))
    keys, low, subtasks = build(factory, n, local)
    ser = StrSerializer()
    r: dict[str, float] = {}
    _, r["full_bytes"], r["full_s"] = checkpoint(storage, 1, subtasks, native=True)
    for b in subtasks:
        b.notify_checkpoint_complete(1)
    canonical, r["canonical_bytes"], r["canonical_s"] = checkpoint(storage, 2, subtasks, native=False)
    rng = random.Random(11)
    changed = rng.sample(range(n), change or n // 100)
    for i, b in enumerate(subtasks):
        s = b.get_state(DESC)
        s.update_batch([keys[j] for j in changed if low[j] == (i == 0)], lambda v: v + 1)
    gc.collect()
    loc, r["delta_bytes"], r["delta_s"] = checkpoint(storage, 3, subtasks, native=True)
    for b in subtasks:
        b.notify_checkpoint_complete(3)
        b.close()
    del subtasks
    gc.collect()
    for label, at, p in (("canonical_restore", canonical, 2), ("restore", loc, 2), ("rescale", loc, 3)):
        r[f"{label}_s"] = best_restore(storage, at, factory, p, local, repeats, n, label)
    # A checkpoint at p=3 of rescaled subtasks that claimed checkpoint 3, after a 1 % change;
    # then back to p=2.
    _, rescaled = restore(storage, loc, factory, 3, local)
    for b in rescaled:
        b.notify_checkpoint_complete(3)
    again = rng.sample(range(n), change or n // 100)
    for i, b in enumerate(rescaled):
        mine = b.key_group_range
        s = b.get_state(DESC)
        s.update_batch(
            [keys[j] for j in again if key_group_for_bytes(ser.serialize(keys[j]), MAXP) in mine],
            lambda v: v + 1,
        )
    gc.collect()
    loc3, r["rescaled_delta_bytes"], r["rescaled_delta_s"] = checkpoint(storage, 4, rescaled, native=True)
    for b in rescaled:
        b.close()
    del rescaled
    gc.collect()
    for label, p in (("restore3", 3), ("rescale32", 2)):
        r[f"{label}_s"] = best_restore(storage, loc3, factory, p, local, repeats, n, label)
    shutil.rmtree(local, ignore_errors=True)
    return r


def best_restore(
    storage: Any, at: str, factory: Any, p: int, local: str, repeats: int, n: int, label: str
) -> float:
    """The best of ``repeats`` restores of ``at`` at parallelism ``p``; the first must hold ``n`` entries."""
    best = float("inf")
    for attempt in range(repeats):
        secs, bs = restore(storage, at, factory, p, local)
        best = min(best, secs)
        if attempt == 0:
            total = sum(b.num_entries() for b in bs)
            assert total == n, (label, total, n)
        for b in bs:
            b.close()
        del bs
        gc.collect()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--keys", default="1000000,4000000")
    ap.add_argument("--backends", default="heap")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--change",
        type=int,
        default=0,
        help="keys changed between checkpoints (default 0: 1 %% of --keys); a fixed count shows whether a "
        "checkpoint's cost stays flat as the state grows, with the growth exponent over the sizes",
    )
    args = ap.parse_args()
    sizes = [int(x) for x in args.keys.split(",")]
    if args.change < 0 or args.change > min(sizes):
        ap.error(
            f"--change {args.change}: the keys changed between checkpoints must be between 0 (1 % of each "
            f"size) and the smallest --keys ({min(sizes):,}); lower it or leave out the smaller sizes"
        )
    root = tempfile.mkdtemp(prefix="statekit-scaling-")
    try:
        print(
            "| backend | keys | full MB | full s | canonical s | 1% ckpt MB | bytes ratio | 1% ckpt s | "
            "time / full | time / canonical | canonical restore s | restore s | rescale 2->3 s | "
            "rescale/restore | 1% after 2->3: bytes ratio | time / full | restore p=3 s | rescale 3->2 s | "
            "rescale/restore | load before / after |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        seen: dict[str, list[tuple[int, dict[str, float]]]] = {}
        for name in args.backends.split(","):
            for n in sizes:
                before = load()
                r = run(name, n, args.repeats, root, args.change)
                seen.setdefault(name, []).append((n, r))
                print(
                    f"| {name} | {n / 1e6:g}M | {r['full_bytes'] / 1e6:.1f} | {r['full_s']:.2f} | "
                    f"{r['canonical_s']:.2f} | {r['delta_bytes'] / 1e6:.2f} | "
                    f"{r['delta_bytes'] / r['full_bytes']:.1%} | {r['delta_s']:.3f} | "
                    f"{r['delta_s'] / r['full_s']:.1%} | {r['delta_s'] / r['canonical_s']:.1%} | "
                    f"{r['canonical_restore_s']:.2f} | {r['restore_s']:.2f} | {r['rescale_s']:.2f} | "
                    f"{r['rescale_s'] / r['restore_s']:.2f} | "
                    f"{r['rescaled_delta_bytes'] / r['full_bytes']:.1%} | "
                    f"{r['rescaled_delta_s'] / r['full_s']:.1%} | "
                    f"{r['restore3_s']:.2f} | {r['rescale32_s']:.2f} | "
                    f"{r['rescale32_s'] / r['restore3_s']:.2f} | {before} / {load()} |",
                    flush=True,
                )
        for name, sizes in seen.items():  # growth exponents between the smallest and the largest size
            if len(sizes) > 1:
                (n0, a), (n1, b) = sizes[0], sizes[-1]
                span = math.log(n1 / n0)
                print(
                    f"{name}, growth exponent {n0 / 1e6:g}M -> {n1 / 1e6:g}M after the change: "
                    f"bytes {math.log(b['delta_bytes'] / a['delta_bytes']) / span:.2f}, "
                    f"time {math.log(b['delta_s'] / a['delta_s']) / span:.2f} (0: flat in the state's size)"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
