"""Heap ValueState read-modify-write vs a raw dict, measured in one run.

1M operations over 100k string keys drawn Zipf-like (s=1.1), switching the
current key on every operation, as a keyed stream does. Three paths:

- baseline: ``d[k] = d.get(k, 0) + 1`` on a plain dict;
- statekit per record: ``set_current_key(k); s.update(s.value() + 1)``;
- statekit batched: ``s.update_batch(keys, fn)`` over batches of 10k keys.

Each is timed best-of-N (machines here are noisy) and reported as a ratio to
the baseline. Run: ``python bench/bench_heap_value_state.py [--ops N]``.
"""

from __future__ import annotations

import argparse
import random

from harness import best_of, rmw_batched, rmw_per_record, zipf_keys

from statekit import ValueStateDescriptor
from statekit.backend_api import KeyGroupRange
from statekit.serializers import StrSerializer
from statekit_heap import HeapKeyedStateBackend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ops", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=10_000)
    args = ap.parse_args()
    ops = zipf_keys(args.ops, args.keys)
    desc = ValueStateDescriptor("count", int, default=0)

    def raw_dict(_: object) -> object:
        d: dict[str, int] = {}
        get = d.get
        for k in ops:
            d[k] = get(k, 0) + 1
        return d

    def backend() -> HeapKeyedStateBackend:
        return HeapKeyedStateBackend(
            key_serializer=StrSerializer(), key_group_range=KeyGroupRange(0, 127), max_parallelism=128
        )

    def per_record(b: object) -> object:
        return rmw_per_record(b, ops, desc)

    def batched(b: object) -> object:
        return rmw_batched(b, ops, desc, args.batch)

    t_dict, expected = best_of(args.repeats, lambda: None, raw_dict)
    assert isinstance(expected, dict)
    rows = [("raw dict (baseline)", t_dict)]
    for name, fn in (("statekit per record", per_record), ("statekit update_batch", batched)):
        t, b = best_of(args.repeats, backend, fn)
        assert isinstance(b, HeapKeyedStateBackend)
        s = b.get_state(desc)
        for k in random.Random(1).sample(sorted(expected), 1000):  # same results as the baseline
            b.set_current_key(k)
            assert s.value() == expected[k], (name, k)
        assert b.num_entries() == len(expected)
        rows.append((name, t))

    print(
        f"{args.ops:,} read-modify-write ops over {len(expected):,} distinct keys "
        f"(Zipf s=1.1, key space {args.keys:,}), best of {args.repeats}"
    )
    print(f"{'path':<24}{'seconds':>10}{'ops/s':>14}{'x baseline':>12}")
    for name, t in rows:
        print(f"{name:<24}{t:>10.3f}{args.ops / t:>14,.0f}{t / t_dict:>12.2f}")


if __name__ == "__main__":
    main()
