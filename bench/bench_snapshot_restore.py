"""Heap full snapshot and restore to a local directory vs pickle, in one run.

1M entries of ``ValueState[int]`` under string keys. statekit writes a
checkpoint through the filesystem storage (canonical format, checksums,
metadata) and restores it into a fresh backend (restore + declaring the state,
which is when restored entries are decoded). The baseline, measured in the same
run: ``pickle.dumps`` of an equal plain dict written to a file, and
``pickle.loads`` of it. Best of N; ratios are statekit time / pickle time.

The cost of the checkpoint files' SHA-256 digests (recorded as the bytes are
written, checked on every read) is measured in the same run too: the same
snapshot and restore with hashing replaced by a no-op (``harness.digests_off``).

Run: ``python bench/bench_snapshot_restore.py [--keys N]``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import tempfile

from harness import digests_off, timed, write_checkpoint

from statekit import ValueStateDescriptor
from statekit.backend_api import KeyGroupRange
from statekit.checkpointing import load_checkpoint
from statekit.serializers import StrSerializer
from statekit_heap import HeapKeyedStateBackend
from statekit_storage import FileSystemCheckpointStorage

DESC = ValueStateDescriptor("count", int, default=0)
RANGE = KeyGroupRange(0, 127)


def new_backend() -> HeapKeyedStateBackend:
    return HeapKeyedStateBackend(key_serializer=StrSerializer(), key_group_range=RANGE, max_parallelism=128)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    keys = [f"/api/v1/resource/{i}" for i in range(args.keys)]
    plain = {k: i for i, k in enumerate(keys)}
    backend = new_backend()
    counts = iter(range(args.keys))
    backend.get_state(DESC).update_batch(keys, lambda _: next(counts))
    assert backend.num_entries() == args.keys
    root = tempfile.mkdtemp(prefix="statekit-bench-")
    try:
        pkl = os.path.join(root, "state.pkl")

        def pickle_write() -> int:
            with open(pkl, "wb") as f:
                f.write(data := pickle.dumps(plain, protocol=pickle.HIGHEST_PROTOCOL))
            return len(data)

        def pickle_read() -> dict[str, int]:
            with open(pkl, "rb") as f:
                return pickle.loads(f.read())  # type: ignore[no-any-return]

        storage = FileSystemCheckpointStorage(os.path.join(root, "ckpt"))
        ids = iter(range(1, 1000))
        locations: list[str] = []

        def statekit_write() -> int:
            loc, size = write_checkpoint(storage, next(ids), backend)
            locations.append(loc)
            return size

        def statekit_read() -> HeapKeyedStateBackend:
            b = new_backend()
            cp = load_checkpoint(storage, locations[-1])
            cp.restore_subtask("op", 0, 1, b, None)
            b.get_state(DESC)  # restored entries are decoded when the state is declared
            return b

        t_pw, psize = timed(pickle_write, args.repeats)
        t_pr, restored_plain = timed(pickle_read, args.repeats)
        # With and without the digests, interleaved round by round so that load on a shared
        # machine falls on both alike; best of the rounds.
        t_sw = t_sr = t_sw0 = t_sr0 = float("inf")
        for _ in range(args.repeats):
            t, ssize = timed(statekit_write, 1)
            t_sw = min(t_sw, t)
            t, restored = timed(statekit_read, 1)
            t_sr = min(t_sr, t)
            with digests_off():
                t_sw0 = min(t_sw0, timed(statekit_write, 1)[0])
                t_sr0 = min(t_sr0, timed(statekit_read, 1)[0])
        assert restored_plain == plain
        s = restored.get_state(DESC)
        for k in keys[:: max(1, args.keys // 1000)]:
            restored.set_current_key(k)
            assert s.value() == plain[k]
        assert restored.num_entries() == args.keys
    finally:
        shutil.rmtree(root, ignore_errors=True)

    n = args.keys
    print(f"{n:,} entries of ValueState[int] under str keys, local directory, best of {args.repeats}")
    print(f"{'path':<28}{'seconds':>9}{'entries/s':>14}{'MB/s':>9}{'MB':>8}{'x pickle':>10}")
    for name, t, size, base in (
        ("pickle.dumps + write", t_pw, psize, t_pw),
        ("statekit snapshot", t_sw, ssize, t_pw),
        ("read + pickle.loads", t_pr, psize, t_pr),
        ("statekit restore", t_sr, ssize, t_pr),
    ):
        print(f"{name:<28}{t:>9.3f}{n / t:>14,.0f}{size / t / 1e6:>9.1f}{size / 1e6:>8.1f}{t / base:>10.2f}")
    print("the SHA-256 digests' share of statekit's time (same run, hashing off as the baseline):")
    for name, on, off in (("snapshot", t_sw, t_sw0), ("restore", t_sr, t_sr0)):
        print(f"  {name:<10} {on:.3f} s with, {off:.3f} s without: {100 * (on - off) / on:+.1f} %")


if __name__ == "__main__":
    main()
