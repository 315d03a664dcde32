"""The LMDB backend against raw py-lmdb, measured in one run; snapshot and restore against the heap backend.

Two parts, each printing figures and ratios to a baseline run in the same process:

1. ``ValueState`` read-modify-write, 1M operations over 100k string keys drawn
   Zipf-like (s=1.1), switching the current key on every operation:
   - baseline: raw py-lmdb with the backend's settings (``sync=False``,
     ``metasync=False``, no writemap, one named database), the natural way:
     a write transaction per ``--batch`` operations, reading through it
     (``txn.get``) and writing into it, an 8-byte big-endian int per key;
   - raw py-lmdb the way the backend batches: a dict of pending writes read
     first, a read transaction under it, one ``putmulti`` per batch (shown
     for reference; ratios stay against the baseline);
   - statekit per record: ``set_current_key(k); s.update(s.value() + 1)``;
   - statekit batched: ``s.update_batch(keys, fn)`` over batches of 10k keys.
2. Snapshot and restore of ``--keys`` entries of ``ValueState[int]`` under
   string keys through the filesystem storage on local disk (as
   bench_snapshot_restore.py does for the heap): the heap backend's canonical
   checkpoint is the baseline; the LMDB backend writes a canonical checkpoint
   (a pinned read transaction iterated key group by key group) and a native
   one (a compact copy of the pinned view), and restores each into a fresh
   backend, at the same parallelism and rescaled 1 -> 2.

Run: ``python bench/bench_lmdb.py [--ops N] [--keys N] [--parts rmw,snapshot]``.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
from collections.abc import Callable
from typing import Any

import lmdb
from harness import (
    best_of,
    expected_counts,
    rmw_batched,
    rmw_per_record,
    run_parts,
    timed,
    write_checkpoint,
    zipf_keys,
)

from statekit import ValueStateDescriptor
from statekit.backend_api import KeyedBackendParameters, KeyGroupRange, key_group_for_bytes
from statekit.checkpointing import load_checkpoint
from statekit.serializers import StrSerializer
from statekit_heap import HeapKeyedStateBackend
from statekit_lmdb import LMDBKeyedStateBackend, LMDBStateBackend
from statekit_storage import FileSystemCheckpointStorage

DESC = ValueStateDescriptor("count", int, default=0)
RANGE = KeyGroupRange(0, 127)


def rmw(args: argparse.Namespace, scratch: str) -> None:
    ops = zipf_keys(args.ops, args.keys)
    batch_size = args.batch

    def raw_setup() -> object:
        env = lmdb.open(
            tempfile.mkdtemp(dir=scratch), map_size=1 << 30, sync=False, metasync=False, max_dbs=4
        )
        return env, env.open_db(b"state:count")

    def raw_txn(ctx: object) -> object:
        env, db = ctx  # type: ignore[misc]
        txn = env.begin(write=True, db=db)
        get, put = txn.get, txn.put
        n = 0
        for key in ops:
            k = key.encode()
            v = get(k)
            put(k, ((int.from_bytes(v, "big") if v is not None else 0) + 1).to_bytes(8, "big"))
            n += 1
            if n >= batch_size:
                txn.commit()
                txn = env.begin(write=True, db=db)
                get, put = txn.get, txn.put
                n = 0
        txn.commit()
        return env, db

    def raw_buffered(ctx: object) -> object:
        env, db = ctx  # type: ignore[misc]
        reader = env.begin(db=db)
        get = reader.get
        pending: dict[bytes, bytes] = {}
        missing = object()
        n = 0
        for key in ops:
            k = key.encode()
            v: Any = pending.get(k, missing)
            if v is missing:
                v = get(k)
            pending[k] = ((int.from_bytes(v, "big") if v is not None else 0) + 1).to_bytes(8, "big")
            n += 1
            if n >= batch_size:
                reader.abort()
                with env.begin(write=True, db=db) as txn, txn.cursor() as cur:
                    cur.putmulti(pending.items())
                pending.clear()
                n = 0
                reader = env.begin(db=db)
                get = reader.get
        reader.abort()
        with env.begin(write=True, db=db) as txn, txn.cursor() as cur:
            cur.putmulti(pending.items())
        return env, db

    engine = LMDBStateBackend({"write-batch-size": batch_size})

    def backend() -> LMDBKeyedStateBackend:
        return engine.create_keyed_backend(
            KeyedBackendParameters(
                key_serializer=StrSerializer(), key_group_range=RANGE, max_parallelism=128, local_dir=scratch
            )
        )

    def per_record(b: object) -> object:
        return rmw_per_record(b, ops, DESC)

    def batched(b: object) -> object:
        return rmw_batched(b, ops, DESC)

    expected = expected_counts(ops)
    sample = random.Random(1).sample(sorted(expected), 1000)
    rows = []
    for name, fn in (
        ("raw lmdb, write txn (baseline)", raw_txn),
        ("raw lmdb, dict + putmulti", raw_buffered),
    ):
        t, (env, db) = best_of(args.repeats, raw_setup, fn)  # type: ignore[misc]
        with env.begin(db=db) as txn:
            assert all(int.from_bytes(txn.get(k.encode()), "big") == expected[k] for k in sample)
        env.close()
        rows.append((name, t))
    for name, fn in (("statekit per record", per_record), ("statekit update_batch", batched)):
        t, b = best_of(args.repeats, backend, fn)
        assert isinstance(b, LMDBKeyedStateBackend)
        s = b.get_state(DESC)
        for k in sample:
            b.set_current_key(k)
            assert s.value() == expected[k], (name, k)
        assert b.num_entries() == len(expected)
        rows.append((name, t))
        b.close()
    t_raw = rows[0][1]
    print(
        f"\n1. ValueState read-modify-write: {args.ops:,} ops over {len(expected):,} distinct keys "
        f"(Zipf s=1.1), best of {args.repeats}, {batch_size} updates per write transaction, sync off"
    )
    print(f"{'path':<32}{'seconds':>10}{'ops/s':>14}{'x baseline':>12}")
    for name, t in rows:
        print(f"{name:<32}{t:>10.3f}{args.ops / t:>14,.0f}{t / t_raw:>12.2f}")


def snapshot_restore(args: argparse.Namespace, scratch: str) -> None:
    n = args.keys_snapshot
    keys = [f"/api/v1/resource/{i}" for i in range(n)]
    storage = FileSystemCheckpointStorage(os.path.join(scratch, "ckpt"))
    ids = iter(range(1, 10_000))
    engine = LMDBStateBackend({})

    def lmdb_backend(kgr: KeyGroupRange = RANGE) -> LMDBKeyedStateBackend:
        return engine.create_keyed_backend(
            KeyedBackendParameters(
                key_serializer=StrSerializer(), key_group_range=kgr, max_parallelism=128, local_dir=scratch
            )
        )

    def heap_backend(kgr: KeyGroupRange = RANGE) -> HeapKeyedStateBackend:
        return HeapKeyedStateBackend(key_serializer=StrSerializer(), key_group_range=kgr, max_parallelism=128)

    def fill(b: Any) -> Any:
        counts = iter(range(n))
        b.get_state(DESC).update_batch(keys, lambda _: next(counts))
        return b

    def checkpoint(b: Any, native: bool) -> tuple[str, int]:
        return write_checkpoint(storage, next(ids), b, native=native)

    def restore(make: Callable[..., Any], loc: str, p: int = 1) -> list[Any]:
        cp = load_checkpoint(storage, loc)
        out = []
        for i in range(p):
            kgr = RANGE if p == 1 else (KeyGroupRange(0, 63), KeyGroupRange(64, 127))[i]
            b = make(kgr)
            cp.restore_subtask("op", i, p, b, None)
            b.get_state(DESC)  # restored entries are decoded when the state is declared (heap)
            out.append(b)
        return out

    heap = fill(heap_backend())
    lm = fill(lmdb_backend())
    lm.kv_write_buffered()
    rows: list[tuple[str, float, int]] = []
    t, (heap_loc, size) = timed(lambda: checkpoint(heap, False), args.repeats)
    rows.append(("heap snapshot (baseline)", t, size))
    t_heap_snap = t
    t, (canon_loc, size) = timed(lambda: checkpoint(lm, False), args.repeats)
    rows.append(("lmdb canonical snapshot", t, size))
    t, (native_loc, size) = timed(lambda: checkpoint(lm, True), args.repeats)
    rows.append(("lmdb native snapshot", t, size))
    t_take = timed(lambda: lm.native_snapshot(next(ids)).release(), args.repeats)[0]

    restores: list[tuple[str, float]] = []
    for name, make, loc, p in (
        ("heap restore (baseline)", heap_backend, heap_loc, 1),
        ("lmdb restore from canonical", lmdb_backend, canon_loc, 1),
        ("lmdb restore from native", lmdb_backend, native_loc, 1),
        ("heap restore 1 -> 2", heap_backend, heap_loc, 2),
        ("lmdb rescale 1 -> 2, canonical", lmdb_backend, canon_loc, 2),
        ("lmdb rescale 1 -> 2, native", lmdb_backend, native_loc, 2),
    ):
        made: list[Any] = []

        def run(make: Callable[..., Any] = make, loc: str = loc, p: int = p) -> list[Any]:
            for b in made:
                b.close()
            made[:] = restore(make, loc, p)
            return made

        t, backends = timed(run, args.repeats)
        assert sum(b.num_entries() for b in backends) == n, name
        b0 = backends[0]
        s = b0.get_state(DESC)
        for k in keys[:: max(1, n // 200)]:
            if _kg(k) in b0.key_group_range:
                b0.set_current_key(k)
                assert s.value() == int(k.rsplit("/", 1)[1]), (name, k)
        for b in backends:
            b.close()
        restores.append((name, t))
    lm.close()

    print(
        f"\n2. Snapshot and restore: {n:,} entries of ValueState[int] under str keys, filesystem storage "
        f"on local disk, best of {args.repeats}"
    )
    print(f"{'path':<34}{'seconds':>9}{'entries/s':>14}{'MB':>8}{'x heap':>9}")
    for name, t, size in rows:
        print(f"{name:<34}{t:>9.3f}{n / t:>14,.0f}{size / 1e6:>8.1f}{t / t_heap_snap:>9.2f}")
    print(f"{'lmdb native: pinning only (task)':<34}{t_take:>9.4f}")
    base = {1: restores[0][1], 2: restores[3][1]}
    for name, t in restores:
        print(f"{name:<34}{t:>9.3f}{n / t:>14,.0f}{'':>8}{t / base[2 if '2' in name else 1]:>9.2f}")


def _kg(key: str) -> int:
    return key_group_for_bytes(StrSerializer().serialize(key), 128)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--keys-snapshot", type=int, default=1_000_000)
    ap.add_argument("--parts", default="rmw,snapshot")
    run_parts(ap.parse_args(), "bench-lmdb-", {"rmw": rmw, "snapshot": snapshot_restore})


if __name__ == "__main__":
    main()
