"""A restore that migrates every entry against one that does not, in one run: heap and RocksDB.

1M entries of ``ValueState[Visit]`` under string keys, written as ``Visit{count: int,
first_seen: int}``. The baseline restores the checkpoint and declares the same type
(nothing to migrate); the measured run declares ``Visit{count: float, first_seen: int,
region: str = "?"}`` (an int widened, a field added), so every entry is migrated on
restore. Heap: a canonical checkpoint, migrated as its sections are decoded. RocksDB: a
native checkpoint, migrated by a pass over the column family after the files are
restored. Best of N; the ratio is migrating restore time / plain restore time.

Run: ``python bench/bench_state_migration.py [--keys N] [--parts heap,rocksdb]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from harness import best_of, run_parts, write_checkpoint

from statekit import ValueStateDescriptor
from statekit.backend_api import KeyedBackendParameters, KeyGroupRange
from statekit.checkpointing import load_checkpoint
from statekit.serializers import StrSerializer
from statekit_heap import HeapKeyedStateBackend
from statekit_rocksdb import RocksDBStateBackend
from statekit_storage import FileSystemCheckpointStorage

RANGE = KeyGroupRange(0, 127)


@dataclasses.dataclass(frozen=True)
class Visit:
    """The type the checkpoint is written with."""

    count: int
    first_seen: int


@dataclasses.dataclass(frozen=True)
class _VisitV2:
    """The type the migrating restore declares: the same class, a run later."""

    count: float
    first_seen: int
    region: str = "?"


_VisitV2.__qualname__ = _VisitV2.__name__ = "Visit"

OLD = ValueStateDescriptor("visits", Visit)
NEW = ValueStateDescriptor("visits", _VisitV2)


def _fill(b: Any, keys: list[str]) -> None:
    s = b.get_state(OLD)
    for i, k in enumerate(keys):
        b.set_current_key(k)
        s.update(Visit(i, i % 24))
    flush = getattr(b, "kv_write_buffered", None)
    if flush is not None:
        flush()


def _compare(
    name: str, n: int, repeats: int, new_backend: Any, location: str, storage: Any, check: list[str]
) -> None:
    def restore(descriptor: ValueStateDescriptor[Any]) -> Any:
        def run(b: Any) -> Any:
            load_checkpoint(storage, location).restore_subtask("op", 0, 1, b, None)
            b.get_state(descriptor)  # the migration (if any) happens when the state is declared
            return b

        return run

    made: list[Any] = []

    def setup() -> Any:
        b = new_backend()
        made.append(b)
        return b

    t_plain, _ = best_of(repeats, setup, restore(OLD))
    t_migrate, migrated = best_of(repeats, setup, restore(NEW))
    s = migrated.get_state(NEW)
    for i, k in check:
        migrated.set_current_key(k)
        assert s.value() == _VisitV2(float(i), i % 24), s.value()
    assert migrated.num_entries("visits") == n
    for b in made:
        b.close()
    print(f"{name}: {n:,} entries of ValueState[Visit], best of {repeats}")
    print(f"{'restore':<34}{'seconds':>9}{'entries/s':>14}{'x plain':>9}")
    for what, t in (("plain (same type)", t_plain), ("migrating (int → float, +field)", t_migrate)):
        print(f"{what:<34}{t:>9.3f}{n / t:>14,.0f}{t / t_plain:>9.2f}")
    print(f"ratio migrating / plain: {t_migrate / t_plain:.2f}")


def heap(args: argparse.Namespace, scratch: str) -> None:
    keys = [f"/api/v1/resource/{i}" for i in range(args.keys)]

    def new_backend() -> HeapKeyedStateBackend:
        return HeapKeyedStateBackend(
            key_serializer=StrSerializer(), key_group_range=RANGE, max_parallelism=128
        )

    src = new_backend()
    _fill(src, keys)
    storage = FileSystemCheckpointStorage(os.path.join(scratch, "heap"))
    location, _ = write_checkpoint(storage, 1, src)
    src.close()
    check = [(i, keys[i]) for i in range(0, args.keys, max(1, args.keys // 1000))]
    _compare("heap, canonical checkpoint", args.keys, args.repeats, new_backend, location, storage, check)


def rocksdb(args: argparse.Namespace, scratch: str) -> None:
    keys = [f"/api/v1/resource/{i}" for i in range(args.keys)]
    engine = RocksDBStateBackend({})
    local = os.path.join(scratch, "rocksdb-local")
    os.makedirs(local)

    def new_backend() -> Any:
        return engine.create_keyed_backend(
            KeyedBackendParameters(
                key_serializer=StrSerializer(), key_group_range=RANGE, max_parallelism=128, local_dir=local
            )
        )

    src = new_backend()
    _fill(src, keys)
    storage = FileSystemCheckpointStorage(os.path.join(scratch, "rocksdb"))
    location, _ = write_checkpoint(storage, 1, src, native=True)
    src.close()
    check = [(i, keys[i]) for i in range(0, args.keys, max(1, args.keys // 1000))]
    _compare("rocksdb, native checkpoint", args.keys, args.repeats, new_backend, location, storage, check)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parts", default="heap,rocksdb", help="comma-separated: heap, rocksdb")
    args = ap.parse_args()
    run_parts(args, "statekit-bench-migration-", {"heap": heap, "rocksdb": rocksdb})


if __name__ == "__main__":
    main()
