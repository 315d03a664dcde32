"""Bytes a native checkpoint uploads after a 1 % change: full copies, key-group files, deltas.

One subtask owns every key group; ``--keys`` keys with a ``--value-bytes``
string each are written and checkpointed (checkpoint 1, confirmed), then 1 %
of the keys get a new value and checkpoint 2 is taken. Printed per backend and
max parallelism: the bytes checkpoint 2 uploads, and how many of the bytes it
references are below the storage's inline threshold (20 KB: such files live in
``_metadata`` and are copied into every checkpoint's, so they save no bytes).

Two kinds of 1 % change:

- ``random``: 1 % of the keys, drawn at random: they hash to key groups all
  over, so with few key groups nearly every key group changes;
- ``clustered``: the same number of keys, all in the first 1 % of the key
  groups (keys that share a key group, as a hot tenant's do).

Backends: lmdb's full copies, the key-group files without deltas
(``max-deltas=0``: each changed key group's whole file) and with them (the
default: one delta of the changed keys), for lmdb and the sqlite example.

Bytes are deterministic (fixed seed, in-memory outputs): one run is the
measurement. Run: ``python bench/bench_incremental_kg.py [--keys N]``.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from typing import Any

from statekit import ValueStateDescriptor
from statekit.backend_api import KeyedBackendParameters, KeyGroupRange, key_group_for_bytes
from statekit.serializers import StrSerializer
from statekit.testing import KitNativeOutput
from statekit_lmdb import LMDBStateBackend
from statekit_sqlite import SqliteStateBackend

INLINE = 20 << 10  # the filesystem storage's default inline threshold
STATE = ValueStateDescriptor("v", str)


def keyed(factory: Any, maxp: int, local_dir: str) -> Any:
    return factory.create_keyed_backend(
        KeyedBackendParameters(
            key_serializer=StrSerializer(),
            key_group_range=KeyGroupRange.of(0, maxp - 1),
            max_parallelism=maxp,
            local_dir=local_dir,
        )
    )


def changed_keys(keys: list[str], maxp: int, kind: str, rng: random.Random) -> list[str]:
    n = max(1, len(keys) // 100)
    if kind == "random":
        return rng.sample(keys, n)
    hot = max(1, maxp // 100)
    ser = StrSerializer()
    pool = [k for k in keys if key_group_for_bytes(ser.serialize(k), maxp) < hot]
    return rng.sample(pool, min(n, len(pool)))


def measure(factory: Any, maxp: int, keys: list[str], value: str, kind: str) -> tuple[int, int, str, int]:
    """Bytes of checkpoint 1, bytes checkpoint 2 uploads, its files new/all, inline bytes it references."""
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as d:
        b = keyed(factory, maxp, d)
        s = b.get_state(STATE)
        for k in keys:
            b.set_current_key(k)
            s.update(value)
        first = b.native_snapshot(1).write(KitNativeOutput(1))
        b.notify_checkpoint_complete(1)
        for k in changed_keys(keys, maxp, kind, rng):
            b.set_current_key(k)
            s.update(value[::-1])
        second = b.native_snapshot(2).write(KitNativeOutput(2))
        b.close()
    new = [f for f in second.files if f.checkpoint_id == 2]
    inline = sum(f.size for f in second.files if f.checkpoint_id != 2 and f.size < INLINE)
    return first.size, second.uploaded_size, f"{len(new)}/{len(second.files)}", inline


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    args = ap.parse_args()
    keys = [f"user-{i:08d}" for i in range(args.keys)]
    value = "x" * (args.value_bytes - 1) + "y"
    backends = {
        "lmdb full": LMDBStateBackend({"native-format": "full"}),
        "lmdb kg, no deltas": LMDBStateBackend({"max-deltas": 0}),
        "lmdb kg + deltas": LMDBStateBackend({}),
        "sqlite kg + deltas": SqliteStateBackend({}),
    }
    print(f"{args.keys:,} keys, {args.value_bytes}-byte values, 1 % of the keys changed")
    print(f"{'backend':<19} {'maxp':>5} {'change':<9} {'checkpoint 1':>13} {'2 uploads':>11} {'%':>6} "
          f"{'files new/all':>14} {'inline refs':>12}")  # fmt: skip
    for maxp in (128, 4096):
        for kind in ("random", "clustered"):
            for name, factory in backends.items():
                full, uploaded, files, inline = measure(factory, maxp, keys, value, kind)
                print(
                    f"{name:<19} {maxp:>5} {kind:<9} {full:>13,} {uploaded:>11,} "
                    f"{100 * uploaded / full:>5.1f}% {files:>14} {inline:>12,}"
                )


if __name__ == "__main__":
    main()
