"""Heap restores: time to the first record, to the first batch, and the cost after, lazy against eager.

The state of ``bench_checkpoint_scaling.py``: two subtasks (p=2, 128 key
groups) hold ``N`` keys of ``ValueState[int]`` under string keys; a native
checkpoint (a base), then 1 % of the keys changed and the next native
checkpoint (a delta: the heap's default checkpoints), and a canonical
checkpoint of the same state. Per size, alternating the two modes in one
process (two rounds, the order swapped in the second):

- **eager**: what restores did before, every entry decoded before the first
  record (the heap's ``_load_sections`` declines, so core decodes and loads all);
- **lazy**: the heap keeps each key group's checked sections as bytes and
  decodes a key group when a record first touches it;
- **by key**: lazy, and a record's key is first looked up in its key group's
  bytes (``SectionLookup``: Arrow's scan of the key column, then an index of
  it built by numpy), the key group decoded once the lookups took as long as
  its decode would or when it must be. It needs numpy loaded, as in a Spark
  worker: the bench imports pyarrow, its compute module and numpy when
  installed (so every mode splits key columns by Arrow, as there), else this
  mode is left out. ``lazy`` is then run with no key column searchable;
- **handed over**: by key, and the first batch's keys are handed to each
  backend with their key groups before its records run, as Spark's routing
  does per task (``remember_key_groups``): each key group's keys are looked
  up together, one pass over its key column.

Measured per mode: **ready** (load the checkpoint, restore both subtasks,
declare the state: the first record can be processed), **first record** (one
record's read-modify-write), **first batch** (``--batch`` records of random
keys, one by one as a per-record function does; 10k random keys touch every one
of the 128 key groups), **touch all** (every key once, ``update_batch``: for
lazy the rest of the decoding) and **steady** (every key once more: the cost
after, both modes fully in memory). **canonical ready** restores the canonical
checkpoint the same way (eager and lazy), against which a delta checkpoint's
restore compares. Every restore is checked to hold exactly ``N`` entries.

Growth exponents are fitted between the smallest and largest size
(``log(t_large / t_small) / log(n_large / n_small)``). Run it twice and report
both tables with the load printed with each.

Every key is touched only up to ``--touch-max`` keys (4M), and the canonical
checkpoint restored only up to ``--canonical-max`` (4M): at 16M keys on a
shared machine they take longer than the rest together.

Run: ``python bench/bench_heap_restore.py [--keys 1000000,4000000,16000000] [--batch 10000]``.
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
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from bench_checkpoint_scaling import DESC, MAXP, backend, checkpoint, load

from statekit.backend_api import key_group_for_bytes
from statekit.checkpointing import load_checkpoint
from statekit.plugins._registry import default_registry
from statekit.serializers import StrSerializer
from statekit.snapshot_codec import SectionLookup
from statekit_heap import HeapKeyedStateBackend
from statekit_storage import FileSystemCheckpointStorage


@contextmanager
def eager() -> Iterator[None]:
    """Restores as before: the heap declines to hold sections, core decodes every entry."""
    saved = HeapKeyedStateBackend._load_sections
    HeapKeyedStateBackend._load_sections = lambda self, reg, sections: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        HeapKeyedStateBackend._load_sections = saved  # type: ignore[method-assign]


@contextmanager
def decoded_on_first_use() -> Iterator[None]:
    """Lazy restores without reads by key: no key column can be searched undecoded."""
    saved = SectionLookup.__dict__["of"]
    SectionLookup.of = classmethod(lambda cls, *args: None)  # type: ignore[assignment, method-assign]
    try:
        yield
    finally:
        SectionLookup.of = saved  # type: ignore[method-assign]


def arrow_loaded() -> bool:
    """Import pyarrow, its compute module and numpy, as a Spark worker has them; False if not installed."""
    try:
        import numpy  # noqa: F401
        import pyarrow
        import pyarrow.compute  # noqa: F401
    except ImportError:
        return False
    return True


#: Set by the "handed over" mode: the first batch's keys go to each backend before its records.
_HAND_OVER = False


@contextmanager
def handed_over() -> Iterator[None]:
    """By key, the first batch's keys handed over ahead with their key groups (as Spark's routing does)."""
    global _HAND_OVER
    _HAND_OVER = True
    try:
        yield
    finally:
        _HAND_OVER = False


MODES = {"eager": eager, "lazy": decoded_on_first_use, "by key": nullcontext, "handed over": handed_over}


def prepare(n: int, root: str) -> tuple[Any, Any, str, str, list[str], list[bool]]:
    """The state's two checkpoints (a base-and-delta chain, a canonical one), the keys and their subtasks."""
    factory = default_registry().create_backend("heap", {})
    storage = FileSystemCheckpointStorage(os.path.join(root, f"heap-{n}"))
    local = tempfile.mkdtemp(dir=root)
    keys = [f"/api/v1/resource/{i}" for i in range(n)]
    ser = StrSerializer()
    low = [key_group_for_bytes(ser.serialize(k), MAXP) < MAXP // 2 for k in keys]
    subtasks = [backend(factory, 2, i, local) for i in range(2)]
    for i, b in enumerate(subtasks):
        b.get_state(DESC).update_batch([k for k, lo in zip(keys, low) if lo == (i == 0)], lambda _: 1)
    checkpoint(storage, 1, subtasks, native=True)
    for b in subtasks:
        b.notify_checkpoint_complete(1)
    canonical, _, _ = checkpoint(storage, 2, subtasks, native=False)
    changed = random.Random(11).sample(range(n), n // 100)
    for i, b in enumerate(subtasks):
        b.get_state(DESC).update_batch([keys[j] for j in changed if low[j] == (i == 0)], lambda v: v + 1)
    chain, _, _ = checkpoint(storage, 3, subtasks, native=True)
    for b in subtasks:
        b.notify_checkpoint_complete(3)
        b.close()
    shutil.rmtree(local, ignore_errors=True)
    return factory, storage, chain, canonical, keys, low


def restore(factory: Any, storage: Any, at: str, root: str) -> tuple[float, list[Any], list[Any]]:
    local = tempfile.mkdtemp(dir=root)
    t0 = time.perf_counter()
    cp = load_checkpoint(storage, at)
    bs = []
    for i in range(2):
        b = backend(factory, 2, i, local)
        cp.restore_subtask("op", i, 2, b, None)
        bs.append(b)
    states = [b.get_state(DESC) for b in bs]
    return time.perf_counter() - t0, bs, states


def one_mode(
    factory: Any,
    storage: Any,
    at: tuple[str, str],
    keys: list[str],
    low: list[bool],
    batch: int,
    touch: bool,
    root: str,
) -> dict[str, float]:
    chain, canonical = at
    n = len(keys)
    r: dict[str, float] = {}
    if canonical:
        r["canonical_ready"], bs, _ = restore(factory, storage, canonical, root)
        assert sum(b.num_entries() for b in bs) == n
        for b in bs:
            b.close()
        del bs
        gc.collect()
    r["ready"], bs, states = restore(factory, storage, chain, root)
    assert sum(b.num_entries() for b in bs) == n
    rng = random.Random(5)
    picks = [rng.randrange(n) for _ in range(batch + 1)]

    def process(j: int, bs: list[Any], states: list[Any]) -> None:
        i = 0 if low[j] else 1
        b, s = bs[i], states[i]
        b.set_current_key(keys[j])
        s.update(s.value() + 1)

    t0 = time.perf_counter()
    process(picks[0], bs, states)
    r["first_record"] = time.perf_counter() - t0
    handed: list[tuple[list[str], list[int]]] = [([], []), ([], [])]
    if _HAND_OVER:  # the routing computed these key groups (in the JVM): not timed
        ser = StrSerializer()
        for j in picks[1:]:
            ks, gs = handed[0 if low[j] else 1]
            ks.append(keys[j])
            gs.append(key_group_for_bytes(ser.serialize(keys[j]), MAXP))
    t0 = time.perf_counter()
    for b, (ks, gs) in zip(bs, handed):
        if ks:
            b.remember_key_groups(ks, gs)
    for j in picks[1:]:
        process(j, bs, states)
    r["first_batch"] = time.perf_counter() - t0
    for label in ("touch_all", "steady") if touch else ():
        t0 = time.perf_counter()
        for i, (b, s) in enumerate(zip(bs, states)):
            s.update_batch([k for k, lo in zip(keys, low) if lo == (i == 0)], lambda v: v + 1)
        r[label] = time.perf_counter() - t0
    assert sum(b.num_entries() for b in bs) == n
    for b in bs:
        b.close()
    del bs, states
    gc.collect()
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", default="1000000,4000000,16000000")
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--root", default=None)
    ap.add_argument(
        "--canonical-max", type=int, default=4_000_000, help="restore the canonical one up to this size"
    )
    ap.add_argument(
        "--touch-max", type=int, default=4_000_000, help="touch every key (twice) only up to this many keys"
    )
    args = ap.parse_args()
    modes = list(MODES) if arrow_loaded() else ["eager", "lazy"]
    if "by key" not in modes:
        print("pyarrow or numpy not installed: the 'by key' and 'handed over' modes are left out")
    sizes = [int(x) for x in args.keys.split(",")]
    if args.root is not None:
        os.makedirs(args.root, exist_ok=True)
    root = tempfile.mkdtemp(dir=args.root)
    results: dict[int, dict[str, list[dict[str, float]]]] = {}
    try:
        for n in sizes:
            before = load()
            factory, storage, chain, canonical, keys, low = prepare(n, root)
            touch = n <= args.touch_max
            at_canonical = canonical if n <= args.canonical_max else ""
            gc.collect()
            got: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
            for rnd in range(2):
                order = modes if rnd == 0 else modes[::-1]
                for mode in order:
                    with MODES[mode]():
                        at = (chain, at_canonical)
                        got[mode].append(one_mode(factory, storage, at, keys, low, args.batch, touch, root))
            results[n] = got
            del keys, low
            gc.collect()
            print(f"{n:>9} keys done ({before} / {load()})", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    cols = ["canonical_ready", "ready", "first_record", "first_batch", "touch_all", "steady"]
    print(f"\n| keys | mode | {' | '.join(c.replace('_', ' ') + ' s' for c in cols)} | ready+batch s |")
    print("|---" * (len(cols) + 3) + "|")
    for n, got in results.items():
        for mode, runs in got.items():
            cells = [" / ".join(f"{r[c]:.3f}" if c in r else "-" for r in runs) for c in cols]
            rb = " / ".join(f"{r['ready'] + r['first_batch']:.2f}" for r in runs)
            print(f"| {n / 1e6:g}M | {mode} | {' | '.join(cells)} | {rb} |")
    if len(results) > 1:
        small, large = min(results), max(results)
        f = math.log(large / small)
        print(f"\ngrowth exponents {small / 1e6:g}M -> {large / 1e6:g}M (per round):")
        for mode in modes:
            for what in ("ready", "ready+batch", "first_batch", "steady"):
                exps = []
                if what == "steady" and "steady" not in results[large][mode][0]:
                    continue
                for a, b in zip(results[small][mode], results[large][mode]):
                    ta = a["ready"] + a["first_batch"] if what == "ready+batch" else a[what]
                    tb = b["ready"] + b["first_batch"] if what == "ready+batch" else b[what]
                    exps.append(math.log(tb / ta) / f)
                print(f"  {mode:11} {what:12} " + " / ".join(f"{e:.2f}" for e in exps))


if __name__ == "__main__":
    main()
