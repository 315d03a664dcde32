"""State larger than memory: 10M keys in the RocksDB backend under ``memory-budget=256MiB``.

Writes ``--keys`` keys (``ValueState[int]``, 10-byte values keyed by 14-byte
strings) through a ``LocalRunner`` with one subtask, takes a native checkpoint,
restores it into a new runner and checks the state (the count of entries,
and every 1000th key's value). Reports the process's peak RSS against the
budget, and the RSS of the interpreter with everything imported, before any
state, as the baseline. Not a CI test: it takes minutes.

Run: ``python bench/bench_rocksdb_memory.py [--keys 10000000] [--budget 256mb]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from typing import Any

from statekit import KeyedProcessFunction, LocalRunner, ValueStateDescriptor

VALUE = ValueStateDescriptor("value", int)


class Put(KeyedProcessFunction):
    """Records are (key, value)."""

    def open(self, ctx: Any) -> None:
        self.v = ctx.get_state(VALUE)

    def process(self, record: Any, ctx: Any) -> None:
        self.v.update(record[1])


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--keys", type=int, default=10_000_000)
    ap.add_argument("--budget", default="256mb")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-rocksdb-memory-")
    conf = {
        "statekit.backend": "rocksdb",
        "statekit.backend.rocksdb.memory-budget": args.budget,
        "statekit.checkpoints.dir": os.path.join(work, "chk"),
        "statekit.local-dir": os.path.join(work, "local"),
    }
    try:
        r = LocalRunner(Put, key_selector=lambda x: x[0], config=conf, job_id="memory")
        budget_mib = int(r.backend.options["memory-budget"]) / (1 << 20)  # type: ignore[attr-defined]
        r.subtasks
        base = rss_mib()
        t0 = time.perf_counter()
        samples = []
        for i in range(args.keys):
            r.process((f"user-{i:09d}", i))
            if i % 1_000_000 == 0:
                samples.append((i, rss_mib()))
        t_load = time.perf_counter() - t0
        t0 = time.perf_counter()
        location = r.checkpoint()
        t_chk = time.perf_counter() - t0
        disk = sum(
            os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(work, "chk")) for f in fs
        )
        r.close()
        t0 = time.perf_counter()
        again = LocalRunner(Put, key_selector=lambda x: x[0], config=conf, job_id="memory")
        assert again.restore("latest") == location
        kb = again.subtasks[0].keyed_backend
        t_restore = time.perf_counter() - t0
        v = kb.get_state(VALUE)
        for i in range(0, args.keys, 1000):
            kb.set_current_key(f"user-{i:09d}")
            assert v.value() == i, i
        t0 = time.perf_counter()
        n = kb.num_entries("value")
        t_count = time.perf_counter() - t0
        assert n == args.keys, (n, args.keys)
        again.close()
        peak = peak_mib()
        print(f"{args.keys:,} keys, memory-budget {budget_mib:.0f} MiB")
        print(
            f"load {t_load:.1f} s ({args.keys / t_load:,.0f} keys/s), native checkpoint {t_chk:.1f} s "
            f"({disk / 2**20:.0f} MiB on disk), restore {t_restore:.1f} s, count by scan {t_count:.1f} s"
        )
        print("RSS while loading (MiB): " + ", ".join(f"{i // 1_000_000}M: {m:.0f}" for i, m in samples))
        print(
            f"baseline RSS {base:.0f} MiB; peak RSS {peak:.0f} MiB = {peak / budget_mib:.2f} x the budget "
            f"({(peak - base) / budget_mib:.2f} x above the baseline)"
        )
        print(f"restore reproduced the state: {n:,} entries, every 1000th value checked")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
