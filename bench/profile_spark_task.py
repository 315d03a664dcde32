"""The Python side of one statekit micro-batch on Spark, without Spark: where a task's time goes.

Runs the real task function (``statekit.spark._task.make_task``) over Arrow
batches shaped as Spark hands them to ``mapInArrow`` (routed rows of one
subtask, 10,000 rows a batch), several micro-batches in a row so the subtask
is reused from the cache as on an executor, and times its phases with
cProfile: converting input rows, the record loop, state access, the user
function, building output rows and Arrow batches, the snapshot. Each
micro-batch's checkpoint is completed before the next, as Spark's driver
does, so a backend with deltas writes one per batch (a base every batch,
before 2026-12-03, overstated the snapshot).

    python bench/profile_spark_task.py [--records 100000] [--urls 100000] [--batches 3]
        [--no-profile | --callgrind] [--vectorized | --columns] [--backend heap|rocksdb|lmdb|...]

``--callgrind`` counts instead of timing: the run goes under valgrind's
callgrind with the instrumentation on for the profiled micro-batches alone
(the first, which opens the subtask, and the imports are not counted), and
prints their instructions per row. The machine's load does not change them,
so two trees compare on a busy machine (``PYTHONHASHSEED=0``; a helper built
from valgrind's ``callgrind.h``, ``cc`` needed, as ``bench_count_cost.py``).

``--vectorized`` runs ``CountPerUrlVectorized`` (a call per URL), ``--columns``
``CountPerUrlColumns`` (a call per Arrow batch of a subtask's rows).

``bench_count_cost.py --workload task`` runs this task path under callgrind
(:func:`task_plans`, :func:`run_task`), entry counting on and off.
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import gc
import json
import os
import pstats
import random
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from statekit import Configuration
from statekit.backend_api import SupportsNativeSnapshot
from statekit.serialization._keygroups import key_group_for_bytes, operator_index_for_key_group
from statekit.serialization._serializers import StrSerializer
from statekit.spark import _cache
from statekit.spark._plan import TaskPlan
from statekit.spark._routing import KEY_GROUP_COLUMN, MARKER_COLUMN, SUBTASK_COLUMN
from statekit.spark._task import make_task, reset_cache
from statekit_urlcount import CountPerUrl, CountPerUrlColumns, CountPerUrlVectorized


def batches_for(records: int, urls: int, subtask: int, parallelism: int, seed: int) -> list[pa.RecordBatch]:
    rng = random.Random(seed)
    names = [f"/api/v1/resource/{i}" for i in range(urls)]
    cum = [0.0] * urls
    acc = 0.0
    for i in range(urls):
        acc += 1.0 / (i + 1) ** 1.1
        cum[i] = acc
    keys = rng.choices(names, cum_weights=cum, k=records)
    ser = StrSerializer()
    groups = [(k, key_group_for_bytes(ser.serialize(k), 128)) for k in keys]
    mine = [(k, kg) for k, kg in groups if operator_index_for_key_group(128, parallelism, kg) == subtask]
    out = []
    for i in range(0, len(mine), 10_000):
        part = mine[i : i + 10_000]
        out.append(
            pa.RecordBatch.from_pydict(
                {
                    "url": pa.array([k for k, _ in part], pa.string()),
                    KEY_GROUP_COLUMN: pa.array([kg for _, kg in part], pa.int32()),
                    SUBTASK_COLUMN: pa.array([subtask] * len(part), pa.int32()),
                    MARKER_COLUMN: pa.array([False] * len(part), pa.bool_()),
                }
            )
        )
    return out


def task_plans(
    work: str,
    backend: str,
    vectorized: bool,
    options: Mapping[str, object] | None = None,
    *,
    columns: bool = False,
) -> Callable[[int, dict[int, str]], TaskPlan]:
    """The plan of micro-batch ``b`` (0-based) of one run, subtask 0 of 2: ``backend``, ``options``.

    ``vectorized``: CountPerUrlVectorized; ``columns``: CountPerUrlColumns; else CountPerUrl.
    """
    factory = CountPerUrlColumns if columns else CountPerUrlVectorized if vectorized else CountPerUrl
    from pyspark.sql import types as T

    config = Configuration.from_mapping(
        {
            "statekit.checkpoints.dir": f"{work}/ck",
            "statekit.parallelism": 2,
            "statekit.backend": backend,
            **(options or {}),
        }
    )
    run_id = uuid.uuid4().hex
    tokens: dict[int, str] = {}

    def plan(b: int, attempts: dict[int, str]) -> TaskPlan:
        # The previous batch's token and attempt: the cached subtask holds that state, and is reused
        # (restore_location stays None: nothing is ever restored from the checkpoint itself).
        token = tokens.setdefault(b, uuid.uuid4().hex)
        return TaskPlan(
            job_id="profile",
            operator_id="process",
            run_id=run_id,
            checkpoint_id=b + 1,
            token=token,
            restore_location=None,
            restore_token=tokens.get(b - 1),
            restore_attempts=dict(attempts),
            parallelism=2,
            max_parallelism=128,
            config=config,
            function_factory=factory,
            vectorized=vectorized or columns,
            columns=columns,
            key_column="url",
            key_serializer=StrSerializer(),
            input_columns=("url",),
            output_schema=T.StructType(
                [T.StructField("url", T.StringType()), T.StructField("count", T.LongType())]
            ),
            spark_local_dir=work,
        )

    return plan


def run_task(
    plan: Callable[[int, dict[int, str]], TaskPlan],
    b: int,
    data: list[pa.RecordBatch],
    attempts: dict[int, str],
) -> list[Any]:
    """Micro-batch ``b``: the task over ``data`` as an executor runs it; ``attempts`` gets its snapshot's.

    Its checkpoint is then completed, as on Spark, where the driver completes it
    and the next batch's task learns so when it reuses the subtask
    (``notify_checkpoint_complete``): a backend with deltas writes the next
    snapshot as one, not a base every batch.
    """
    out: list[Any] = list(make_task(plan(b, attempts), None)(iter(data)))
    handle = out[-1].column("__statekit_handle").to_pylist()[-1]
    attempts[0] = json.loads(handle)["attempt"]
    for entry in _cache._CACHE.values():
        keyed = entry.subtask.keyed
        if isinstance(keyed, SupportsNativeSnapshot):
            keyed.notify_checkpoint_complete(b + 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000, help="records of one micro-batch (both subtasks)")
    ap.add_argument("--urls", type=int, default=100_000)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--no-profile", action="store_true", help="time only (cProfile slows the loop down)")
    form = ap.add_mutually_exclusive_group()
    form.add_argument("--vectorized", action="store_true", help="CountPerUrlVectorized, not CountPerUrl")
    form.add_argument("--columns", action="store_true", help="CountPerUrlColumns, not CountPerUrl")
    ap.add_argument("--backend", default="heap", help="statekit.backend (the Spark benchmark's: heap)")
    ap.add_argument("--callgrind", action="store_true", help="instructions per row, under callgrind")
    ap.add_argument("--instrument", default="", help=argparse.SUPPRESS)  # callgrind's run: the helper
    args = ap.parse_args()
    if args.callgrind:
        callgrind(args)
        return
    work = tempfile.mkdtemp(prefix="profile-task-")
    reset_cache()
    plan = task_plans(work, args.backend, args.vectorized, columns=args.columns)
    attempts: dict[int, str] = {}
    prof = cProfile.Profile()
    lib = ctypes.CDLL(args.instrument) if args.instrument else None
    total = 0.0
    rows = 0
    inputs = [batches_for(args.records, args.urls, 0, 2, seed=b) for b in range(args.batches)]
    for b, data in enumerate(inputs):
        t0 = time.perf_counter()
        profiled = b and not args.no_profile and lib is None
        if profiled:
            prof.enable()
        if b == 1 and lib is not None:
            gc.collect()
            lib.start()
        run_task(plan, b, data, attempts)
        if profiled:
            prof.disable()
        if b:
            total += time.perf_counter() - t0
            rows += sum(d.num_rows for d in data)
    if lib is not None:
        lib.stop()
        print(f"rows {rows}")
        return
    print(
        f"{rows:,} rows of subtask 0 over {args.batches - 1} profiled batches: {total:.3f} s, "
        f"{rows / total:,.0f} rows/s"
    )
    if not args.no_profile:
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


def callgrind(args: argparse.Namespace) -> None:
    """This run's profiled micro-batches under callgrind: their instructions, and per row."""
    from bench_count_cost import _instrument_lib

    with tempfile.TemporaryDirectory(prefix="profile-task-callgrind-") as out_dir:
        lib = _instrument_lib(out_dir)
        out = os.path.join(out_dir, "callgrind.out")
        form = ["--vectorized"] if args.vectorized else ["--columns"] if args.columns else []
        cmd = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
            sys.executable, os.path.abspath(__file__), "--instrument", lib, "--records", str(args.records),
            "--urls", str(args.urls), "--batches", str(args.batches), "--backend", args.backend, *form,
        ]  # fmt: skip
        env = dict(os.environ, PYTHONHASHSEED="0")
        done = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
        rows = int(re.findall(r"^rows (\d+)$", done.stdout, re.M)[-1])
        with open(out) as f:  # "totals": what was instrumented ("summary" says 0 when started late)
            total = int(re.findall(r"^totals: (\d+)$", f.read(), re.M)[-1])
    print(
        f"{rows:,} rows of subtask 0 over {args.batches - 1} counted batches: {total:,} instructions, "
        f"{total / rows:,.0f} per row (callgrind)"
    )


if __name__ == "__main__":
    main()
