"""The RocksDB backend against raw rocksdict, measured in one run; incremental checkpoints; rescale.

Three parts, each printing figures and ratios to a baseline run in the same process:

1. ``ValueState`` read-modify-write, 1M operations over 100k string keys drawn
   Zipf-like (s=1.1), switching the current key on every operation:
   - baseline: raw rocksdict with its best settings for this: raw mode, WAL off,
     a WriteBatch per ``--batch`` updates with a dict overlay that serves reads
     of pending writes, an 8-byte big-endian int per key;
   - statekit per record: ``set_current_key(k); s.update(s.value() + 1)``;
   - statekit batched: ``s.update_batch(keys, fn)`` over batches of 10k keys.
2. Native incremental checkpoints: time and bytes of a first checkpoint of
   N keys and of a second one after updating 1 % of them (``--sizes``).
3. Rescale: restoring native checkpoints at the same parallelism (2 -> 2,
   3 -> 3) against rescaling them (2 -> 3, 3 -> 2), all new subtasks restored,
   in rounds alternating the order, ratios in the same round, the load shown
   (``--rescale-keys 1000000,4000000``; ``--canonical`` adds a savepoint's).
4. ``counts``: what exact entry counts (``state/_kvcount``, kept on write) cost
   part 1's per-record read-modify-write: counting off (the baseline) and on,
   alternating run by run, two rounds; the ratio on/off of each round, in the
   main thread's CPU time (what the record loop costs; RocksDB's background
   threads and other processes' load left out) and in wall time.

Run: ``python bench/bench_rocksdb.py [--ops N] [--sizes 1000000,5000000]``;
``--parts counts`` for part 4 alone.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import tempfile
import time
from typing import Any

from harness import (
    COUNTING_HEADER,
    best_of,
    counting_off_on,
    expected_counts,
    rmw_batched,
    rmw_per_record,
    run_parts,
    zipf_keys,
)
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from statekit import KeyedProcessFunction, LocalRunner, ValueStateDescriptor
from statekit.backend_api import KeyedBackendParameters, KeyGroupRange
from statekit.checkpointing import load_checkpoint
from statekit.serializers import StrSerializer
from statekit_rocksdb import RocksDBKeyedStateBackend, RocksDBStateBackend

DESC = ValueStateDescriptor("count", int, default=0)


def rmw(args: argparse.Namespace, scratch: str) -> None:
    ops = zipf_keys(args.ops, args.keys)
    batch_size = args.batch

    def raw_setup() -> object:
        path = tempfile.mkdtemp(dir=scratch)
        o = Options(raw_mode=True)
        o.create_if_missing(True)
        return Rdict(path, o)

    def raw(db_: object) -> object:
        db: Any = db_
        wo = WriteOptions()
        wo.disable_wal = True
        overlay: dict[bytes, bytes] = {}
        wb = WriteBatch(raw_mode=True)
        n = 0
        get = db.get
        for key in ops:
            k = key.encode()
            v = overlay.get(k)
            if v is None:
                v = get(k)
            new = ((int.from_bytes(v, "big") if v is not None else 0) + 1).to_bytes(8, "big")
            overlay[k] = new
            wb.put(k, new)
            n += 1
            if n >= batch_size:
                db.write(wb, wo)
                wb = WriteBatch(raw_mode=True)
                overlay.clear()
                n = 0
        db.write(wb, wo)
        return db

    engine = RocksDBStateBackend({"write-batch-size": batch_size})

    def backend() -> RocksDBKeyedStateBackend:
        return engine.create_keyed_backend(
            KeyedBackendParameters(
                key_serializer=StrSerializer(),
                key_group_range=KeyGroupRange(0, 127),
                max_parallelism=128,
                local_dir=scratch,
            )
        )

    def per_record(b: object) -> object:
        return rmw_per_record(b, ops, DESC)

    def batched(b: object) -> object:
        return rmw_batched(b, ops, DESC)

    t_raw, db = best_of(args.repeats, raw_setup, raw)
    expected = expected_counts(ops)
    rows = [("raw rocksdict (baseline)", t_raw)]
    for name, fn in (("statekit per record", per_record), ("statekit update_batch", batched)):
        t, b = best_of(args.repeats, backend, fn)
        assert isinstance(b, RocksDBKeyedStateBackend)
        s = b.get_state(DESC)
        for k in random.Random(1).sample(sorted(expected), 1000):
            b.set_current_key(k)
            assert s.value() == expected[k], (name, k)
            assert int.from_bytes(db.get(k.encode()), "big") == expected[k]  # type: ignore[attr-defined]
        rows.append((name, t))
        b.close()
    print(
        f"\n1. ValueState read-modify-write: {args.ops:,} ops over {len(expected):,} distinct keys "
        f"(Zipf s=1.1), best of {args.repeats}, write batch {batch_size}"
    )
    print(f"{'path':<28}{'seconds':>10}{'ops/s':>14}{'x baseline':>12}")
    for name, t in rows:
        print(f"{name:<28}{t:>10.3f}{args.ops / t:>14,.0f}{t / t_raw:>12.2f}")


def counts(args: argparse.Namespace, scratch: str) -> None:
    """Part 4: per-record read-modify-write with entry counting off and on, alternating, two rounds."""
    from statekit.backend_api import KeyedBackendParameters

    ops = zipf_keys(args.ops, args.keys)
    engine = RocksDBStateBackend({"write-batch-size": args.batch})

    def backend(exact: bool = True) -> RocksDBKeyedStateBackend:
        # exact_entries: the job's statekit.metrics.exact-entries, per backend instance
        return engine.create_keyed_backend(
            KeyedBackendParameters(
                StrSerializer(), KeyGroupRange(0, 127), 128, local_dir=scratch, exact_entries=exact
            )
        )

    def per_record(b: object) -> object:
        return rmw_per_record(b, ops, DESC)

    expected = len(expected_counts(ops))
    print(
        f"\n4. Exact entry counts on write: per-record read-modify-write, {args.ops:,} ops over "
        f"{expected:,} keys, counting off and on alternating run by run, best of {args.repeats} each"
    )
    print(COUNTING_HEADER)
    warm = backend()
    per_record(warm)  # warm-up, not timed
    warm.close()
    for round_ in (1, 2):
        print(counting_off_on(round_, backend, per_record, expected, args.repeats))


def _dir_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


class _Fill(KeyedProcessFunction):
    """A job whose records set a key's value (``(key, value)`` pairs)."""

    def open(self, ctx: Any) -> None:
        self.v = ctx.get_state(DESC)

    def process(self, record: Any, ctx: Any) -> None:
        self.v.update(record[1])


def incremental(args: argparse.Namespace, scratch: str) -> None:
    print("\n2. Native incremental checkpoints (filesystem storage on local disk, p=1)")
    print(
        f"{'keys':>10}{'1st s':>8}{'1st MB':>9}{'2nd s':>8}{'2nd MB':>9}{'2nd/1st bytes':>15}{'canon s':>9}"
    )
    for n in [int(x) for x in args.sizes.split(",")]:
        chk = tempfile.mkdtemp(dir=scratch)
        runner = LocalRunner(
            _Fill,
            key_selector=lambda r: r[0],
            config={
                "statekit.backend": "rocksdb",
                "statekit.checkpoints.dir": chk,
                "statekit.local-dir": scratch,
                "statekit.checkpoints.retained": 2,
            },
            job_id="bench",
        )
        keys = [f"user-{i:09d}" for i in range(n)]
        runner.run([(k, 1) for k in keys])
        t0 = time.perf_counter()
        first = runner.checkpoint()
        t1 = time.perf_counter() - t0
        meta1 = load_checkpoint(runner.storage, first).metadata.operators["process"][0].keyed
        assert meta1 is not None
        changed = random.Random(7).sample(keys, n // 100)
        for k in changed:  # process() rather than run(): run() goes on from the source's position
            runner.process((k, 2))
        t0 = time.perf_counter()
        second = runner.checkpoint()
        t2 = time.perf_counter() - t0
        meta2 = load_checkpoint(runner.storage, second).metadata.operators["process"][0].keyed
        assert meta2 is not None
        up1, up2 = int(meta1["uploaded"]), int(meta2["uploaded"])
        t0 = time.perf_counter()
        runner.savepoint(os.path.join(chk, "sp"))
        t3 = time.perf_counter() - t0
        print(f"{n:>10,}{t1:>8.2f}{up1 / 1e6:>9.1f}{t2:>8.2f}{up2 / 1e6:>9.1f}{up2 / up1:>15.4f}{t3:>9.2f}")
        runner.close()
        shutil.rmtree(chk, ignore_errors=True)


def _restore_time(conf: dict[str, Any], location: str, parallelism: int, n: int) -> float:
    """Seconds to restore ``location`` into ``parallelism`` new subtasks (all of them), checked whole."""
    r = LocalRunner(
        _Fill,
        key_selector=lambda x: x[0],
        config={**conf, "statekit.parallelism": parallelism},
        job_id="rescale",
    )
    try:
        gc.collect()
        t0 = time.perf_counter()
        r.restore(location)
        t = time.perf_counter() - t0
        got = sum(ctx.keyed_backend.num_entries() for ctx in r.subtasks)
        assert got == n, f"restored {got:,} entries of {n:,}"
        return t
    finally:
        r.close()


def rescale(args: argparse.Namespace, scratch: str) -> None:
    """Same-parallelism restores against rescales 2 -> 3 and 3 -> 2 of the same state, in one run.

    Per size: a job of N keys at p=2 checkpoints natively (A); A restored at
    p=3 checkpoints again (B). Then, in rounds alternating the order, A is
    restored at p=2 (same) and at p=3 (2 -> 3), B at p=3 (same) and at p=2
    (3 -> 2). Each rescale is set against the same-parallelism restore of the
    same checkpoint, measured in the same round. The canonical savepoint's
    2 -> 3 rescale is shown once per size for reference.
    """
    print(f"\n3. Restore at the same parallelism vs rescale, native checkpoints (load: {_load()})")
    print(
        f"{'keys':>10}{'round':>6}{'2->2 s':>8}{'2->3 s':>8}{'2->3/2->2':>10}"
        f"{'3->3 s':>8}{'3->2 s':>8}{'3->2/3->3':>10}"
    )
    for n in [int(x) for x in args.rescale_keys.split(",")]:
        chk = tempfile.mkdtemp(dir=scratch)
        conf = {
            "statekit.backend": "rocksdb",
            "statekit.checkpoints.dir": chk,
            "statekit.checkpoints.retained": 100,  # every restore below reads A or B
            "statekit.local-dir": scratch,
        }
        runner = LocalRunner(
            _Fill, key_selector=lambda r: r[0], config={**conf, "statekit.parallelism": 2}, job_id="rescale"
        )
        runner.run([(f"user-{i:09d}", i) for i in range(n)])
        at2 = runner.checkpoint()
        savepoint = runner.savepoint(os.path.join(chk, "sp")) if args.canonical else None
        runner.close()
        runner = LocalRunner(
            _Fill, key_selector=lambda r: r[0], config={**conf, "statekit.parallelism": 3}, job_id="rescale"
        )
        runner.restore(at2)
        at3 = runner.checkpoint()
        runner.close()
        cases = [("22", at2, 2), ("23", at2, 3), ("33", at3, 3), ("32", at3, 2)]
        for rnd in range(args.rounds):
            order = cases if rnd % 2 == 0 else cases[::-1]
            t = {name: _restore_time(conf, loc, p, n) for name, loc, p in order}
            print(
                f"{n:>10,}{rnd + 1:>6}{t['22']:>8.2f}{t['23']:>8.2f}{t['23'] / t['22']:>10.2f}"
                f"{t['33']:>8.2f}{t['32']:>8.2f}{t['32'] / t['33']:>10.2f}   load {_load()}"
            )
        if savepoint is not None:
            print(f"{'':>10} canonical savepoint 2->3: {_restore_time(conf, savepoint, 3, n):.2f} s")
        shutil.rmtree(chk, ignore_errors=True)


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--sizes", default="1000000,5000000")
    ap.add_argument("--rescale-keys", default="1000000,4000000", help="sizes, comma-separated")
    ap.add_argument("--rounds", type=int, default=2, help="rescale rounds, alternating the order")
    ap.add_argument("--canonical", action="store_true", help="also rescale from a canonical savepoint")
    ap.add_argument("--parts", default="rmw,incremental,rescale,counts")
    parts = {"rmw": rmw, "incremental": incremental, "rescale": rescale, "counts": counts}
    run_parts(ap.parse_args(), "bench-rocksdb-", parts)


if __name__ == "__main__":
    main()
