"""What exact entry counts (``state/_kvcount``) cost the per-record read-modify-write, in instructions.

The workload is ``bench_rocksdb.py``'s part 1 per record: ``set_current_key(k);
s.update(s.value() + 1)`` on a ``ValueState`` of an ordered engine, ``--ops``
operations over ``--keys`` string keys drawn Zipf-like (s=1.1), buffered
writes reaching the engine every ``--batch`` updates. It runs with entry
counting off (``statekit.metrics.exact-entries=false``, the backend's
``KeyedBackendParameters.exact_entries``: no counting and no bookkeeping of
engine reads, the baseline) and on.

Two workloads (``--workload``):

- ``loop`` (the default): the record loop above, on the backend alone;
- ``task``: the per-record throughput benchmark's task path
  (``bench_spark_urlcount.py``'s statekit job without the JVM, as
  ``profile_spark_task.py`` runs it: Arrow batches of subtask 0 of 2 in,
  routing, ``CountPerUrl``, state, output rows, a snapshot per micro-batch) on
  ``--backend``, ``--batches`` micro-batches of ``--records`` records (both
  subtasks) over ``--urls`` URLs, the subtask reused from batch to batch as on
  an executor. Measured: the later micro-batches alone. The first one (it
  opens the subtask and the engine) and the imports run uninstrumented
  (``--instr-atstart=no``); a helper compiled from valgrind's
  ``callgrind.h`` (``cc`` needed) starts the instrumentation after it and
  stops it after the last, so one run per mode gives their instructions.

Two measures:

- ``callgrind`` (the default): each mode runs in a child process under
  valgrind's callgrind, once with ``--ops`` operations and once with none (the
  same setup: imports, the key list drawn, the engine opened, a flush), with
  ``PYTHONHASHSEED=0``; the difference is the record loop's instructions,
  which the machine's load does not change. Printed: the instructions of each
  run, the loop's, per operation, and the ratio on/off, whole process and
  loop alone.
- ``--wall``: in one process, counting off and on alternating run by run,
  ``--repeats`` runs each per round, two rounds; the best wall and main-thread
  CPU time of each and the ratio on/off (the task path: each run from empty
  state, micro-batches 2.. timed). Noisy on a shared machine.

Run: ``python bench/bench_count_cost.py [--workload loop|task] [--backend rocksdb|lmdb] [--ops N] [--wall]``
(valgrind installed for the default).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

from harness import COUNTING_HEADER, counting_off_on, counting_row, expected_counts, rmw_per_record, zipf_keys

from statekit import ValueStateDescriptor
from statekit.backend_api import KeyedBackendParameters, KeyGroupRange
from statekit.serializers import StrSerializer

#: Whether this statekit counts entries (and has the option): one from before them is measured as is
#: (PYTHONPATH=<its core/src>).
COUNTS = "exact_entries" in getattr(KeyedBackendParameters, "__dataclass_fields__", {})

DESC = ValueStateDescriptor("count", int, default=0)


def _engine(name: str, batch: int) -> Any:
    if name == "rocksdb":
        from statekit_rocksdb import RocksDBStateBackend

        return RocksDBStateBackend({"write-batch-size": batch})
    if name == "lmdb":
        from statekit_lmdb import LMDBStateBackend

        return LMDBStateBackend({"write-batch-size": batch})
    raise SystemExit(f"unknown backend {name!r}: rocksdb or lmdb")


def _backend(engine: Any, scratch: str, exact: bool) -> Any:
    counting: dict[str, Any] = {"exact_entries": exact} if COUNTS else {}
    return engine.create_keyed_backend(
        KeyedBackendParameters(
            key_serializer=StrSerializer(),
            key_group_range=KeyGroupRange(0, 127),
            max_parallelism=128,
            local_dir=scratch,
            **counting,
        )
    )


def child(args: argparse.Namespace) -> None:
    """One run, in the process callgrind measures: the setup, then ``--ops`` operations (maybe none)."""
    exact = args.mode == "on"
    keys = zipf_keys(args.ops, args.keys)
    distinct = len(expected_counts(keys))  # in every run: its cost is not the counting's
    ops = [] if args.setup_only else keys
    with tempfile.TemporaryDirectory(prefix="bench-count-cost-") as scratch:
        b = _backend(_engine(args.backend, args.batch), scratch, exact)
        rmw_per_record(b, ops, DESC)
        got = b.kv_exact_entries() if COUNTS else None
        b.close()
    want = (distinct if ops else 0) if COUNTS and exact else None
    if got != want:
        raise SystemExit(f"entries counted {got}, expected {want}")


def _task_input(args: argparse.Namespace) -> list[Any]:
    from profile_spark_task import batches_for

    return [batches_for(args.records, args.urls, 0, 2, seed=b) for b in range(args.batches)]


_INSTRUMENT_C = """#include <valgrind/callgrind.h>
void start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
"""


def _instrument_lib(out_dir: str) -> str:
    """A shared library whose ``start``/``stop`` switch callgrind's instrumentation (client requests)."""
    src, lib = os.path.join(out_dir, "instrument.c"), os.path.join(out_dir, "instrument.so")
    with open(src, "w") as f:
        f.write(_INSTRUMENT_C)
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", lib, src], check=True)
    return lib


def child_task(args: argparse.Namespace) -> None:
    """The task path: micro-batch 0 (the setup), then the others, instrumented when ``--instrument``."""
    from profile_spark_task import run_task, task_plans

    from statekit.spark._cache import _CACHE, reset_cache

    exact = args.mode == "on"
    data = _task_input(args)
    distinct = len({u for batch in data for d in batch for u in d.column("url").to_pylist()})
    lib = ctypes.CDLL(args.instrument) if args.instrument else None
    with tempfile.TemporaryDirectory(prefix="bench-count-cost-") as work:
        reset_cache()
        plan = task_plans(work, args.backend, vectorized=False, options=_options(exact))
        attempts: dict[int, str] = {}
        for b, batch in enumerate(data):
            if b == 1 and lib is not None:
                gc.collect()
                lib.start()
            run_task(plan, b, batch, attempts)
        if lib is not None:
            lib.stop()
        (held,) = _CACHE.values()
        got = held.subtask.keyed.kv_exact_entries() if COUNTS else None
        reset_cache()
    want = distinct if COUNTS and exact else None
    if got != want:
        raise SystemExit(f"entries counted {got}, expected {want}")


def _callgrind(args: argparse.Namespace, mode: str, ops: int, out_dir: str, lib: str = "") -> int:
    out = os.path.join(out_dir, f"callgrind.{args.workload}.{mode}.{ops}")
    cmd = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        *(["--instr-atstart=no"] if lib else []),
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        "--mode",
        mode,
        "--ops",
        str(args.ops),
        *(["--setup-only"] if ops == 0 else []),
        "--keys",
        str(args.keys),
        "--batch",
        str(args.batch),
        "--backend",
        args.backend,
        "--workload",
        args.workload,
        "--records",
        str(args.records),
        "--urls",
        str(args.urls),
        "--batches",
        str(args.batches),
        *(["--instrument", lib] if lib else []),
    ]
    env = dict(os.environ, PYTHONHASHSEED="0")
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:  # "totals": what was instrumented ("summary" says 0 when started late)
        for line in f:
            m = re.match(r"totals: (\d+)", line)
            if m:
                return int(m.group(1))
    raise SystemExit(f"no instruction total in {out}")


def callgrind(args: argparse.Namespace) -> None:
    out_dir = args.keep or tempfile.mkdtemp(prefix="bench-count-cost-")
    os.makedirs(out_dir, exist_ok=True)
    ir: dict[tuple[str, int], int] = {}
    if args.workload == "task":
        lib = _instrument_lib(out_dir)
        loop = {mode: _callgrind(args, mode, args.ops, out_dir, lib) for mode in ("off", "on")}
        rows = sum(d.num_rows for batch in _task_input(args)[1:] for d in batch)
        print(
            f"Exact entry counts, {args.backend}: the url-count task path (CountPerUrl, subtask 0 of 2), "
            f"{args.batches} micro-batches of {args.records:,} records over {args.urls:,} URLs (Zipf s=1.1); "
            f"callgrind instructions of micro-batches 2..{args.batches} ({rows:,} rows), the first one "
            "uninstrumented"
        )
        for mode in ("off", "on"):
            print(f"{mode:<10}{loop[mode]:>16,} instructions{loop[mode] / rows:>9,.0f} per row")
        print(f"on/off: {loop['on'] / loop['off']:.4f} ({(loop['on'] / loop['off'] - 1) * 100:+.2f} %)")
        if args.keep:
            print(f"callgrind files in {out_dir} (callgrind_annotate them)")
        return
    for mode in ("off", "on"):
        for ops in (0, args.ops):
            ir[mode, ops] = _callgrind(args, mode, ops, out_dir)
    print(
        f"Exact entry counts, {args.backend}: per-record read-modify-write of a ValueState, {args.ops:,} "
        f"ops over {args.keys:,} keys (Zipf s=1.1), write batch {args.batch}; callgrind instructions"
    )
    what, per = "record loop", args.ops
    print(f"{'counting':<10}{'setup only':>16}{'whole run':>16}{what:>16}{'per rec':>9}")
    loop = {}
    for mode in ("off", "on"):
        loop[mode] = ir[mode, args.ops] - ir[mode, 0]
        print(
            f"{mode:<10}{ir[mode, 0]:>16,}{ir[mode, args.ops]:>16,}{loop[mode]:>16,}{loop[mode] / per:>9,.0f}"
        )
    whole = ir["on", args.ops] / ir["off", args.ops]
    print(
        f"on/off: whole run {whole:.4f} ({(whole - 1) * 100:+.2f} %), "
        f"{what} {loop['on'] / loop['off']:.4f} ({(loop['on'] / loop['off'] - 1) * 100:+.2f} %)"
    )
    if args.keep:
        print(f"callgrind files in {out_dir} (callgrind_annotate them)")


def _options(exact: bool) -> dict[str, object]:
    """The job's options for counting on or off (none for a statekit without the option)."""
    return {"statekit.metrics.exact-entries": exact} if COUNTS else {}


def _task_seconds(
    args: argparse.Namespace, data: list[Any], work: str, exact: bool = True
) -> tuple[float, float]:
    """One run of the task path from empty: main-thread CPU and wall seconds of micro-batches 2..N."""
    from profile_spark_task import run_task, task_plans

    from statekit.spark._cache import reset_cache

    reset_cache()
    plan = task_plans(work, args.backend, vectorized=False, options=_options(exact))
    attempts: dict[int, str] = {}
    cpu = wall_ = 0.0
    for b, batch in enumerate(data):
        gc.collect()
        c0, w0 = time.thread_time(), time.perf_counter()
        run_task(plan, b, batch, attempts)
        if b:
            cpu += time.thread_time() - c0
            wall_ += time.perf_counter() - w0
    reset_cache()
    return cpu, wall_


def wall_task(args: argparse.Namespace) -> None:
    data = _task_input(args)
    print(
        f"Exact entry counts, {args.backend}: the url-count task path, {args.batches} micro-batches of "
        f"{args.records:,} records (micro-batches 2..{args.batches} timed), counting off and on alternating "
        f"run by run, best of {args.repeats} each; wall-clock, noisy on a shared machine"
    )
    print(COUNTING_HEADER)
    with tempfile.TemporaryDirectory(prefix="bench-count-cost-") as work:
        _task_seconds(args, data, work)  # warm-up, not timed
        for round_ in (1, 2):
            cpu = {False: float("inf"), True: float("inf")}
            wall_ = dict(cpu)
            for _ in range(args.repeats):
                for enabled in (False, True):
                    c, w = _task_seconds(args, data, work, enabled)
                    cpu[enabled] = min(cpu[enabled], c)
                    wall_[enabled] = min(wall_[enabled], w)
            print(counting_row(round_, cpu, wall_))


def wall(args: argparse.Namespace) -> None:
    ops = zipf_keys(args.ops, args.keys)
    expected = len(expected_counts(ops))
    print(
        f"Exact entry counts, {args.backend}: {args.ops:,} per-record read-modify-writes, counting off and "
        f"on alternating run by run, best of {args.repeats} each; wall-clock, noisy on a shared machine"
    )
    print(COUNTING_HEADER)
    with tempfile.TemporaryDirectory(prefix="bench-count-cost-") as scratch:
        engine = _engine(args.backend, args.batch)
        warm = _backend(engine, scratch, True)
        rmw_per_record(warm, ops, DESC)  # warm-up, not timed
        warm.close()
        for round_ in (1, 2):
            print(
                counting_off_on(
                    round_,
                    lambda exact: _backend(engine, scratch, exact),
                    lambda b: rmw_per_record(b, ops, DESC),
                    expected,
                    args.repeats,
                )
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="rocksdb", choices=["rocksdb", "lmdb"])
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--workload", default="loop", choices=["loop", "task"], help="see the module doc")
    ap.add_argument("--records", type=int, default=100_000, help="task: records of a micro-batch")
    ap.add_argument("--urls", type=int, default=100_000, help="task: distinct URLs drawn from")
    ap.add_argument("--batches", type=int, default=3, help="task: micro-batches, the first the setup")
    ap.add_argument("--wall", action="store_true", help="wall-clock ratios, alternating (not callgrind)")
    ap.add_argument("--repeats", type=int, default=3, help="with --wall: runs of each mode per round")
    ap.add_argument("--keep", metavar="DIR", help="keep the callgrind files in DIR")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=["on", "off"], default="on", help=argparse.SUPPRESS)
    ap.add_argument("--setup-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--instrument", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        (child_task if args.workload == "task" else child)(args)
    elif args.wall:
        (wall_task if args.workload == "task" else wall)(args)
    else:
        callgrind(args)


if __name__ == "__main__":
    main()
