"""The Python side of one statekit micro-batch on Spark, without Spark: where a task's time goes.

Runs the real task function (``statekit.spark._task.make_task``) over Arrow
batches shaped as Spark hands them to ``mapInArrow`` (routed rows of one
subtask, 10,000 rows a batch), several micro-batches in a row so the subtask
is reused from the cache as on an executor, and times its phases with
cProfile: converting input rows, the record loop, state access, the user
function, building output rows and Arrow batches, the snapshot.

    python bench/profile_spark_task.py [--records 100000] [--urls 100000] [--batches 3]
        [--no-profile] [--vectorized]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import tempfile
import time
import uuid
from typing import Any

import pyarrow as pa

from statekit import Configuration
from statekit.serialization._keygroups import key_group_for_bytes, operator_index_for_key_group
from statekit.serialization._serializers import StrSerializer
from statekit.spark._plan import TaskPlan
from statekit.spark._routing import MARKER_COLUMN, SUBTASK_COLUMN
from statekit.spark._task import make_task, reset_cache
from statekit_urlcount import CountPerUrl, CountPerUrlVectorized


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
    mine = [
        k
        for k in keys
        if operator_index_for_key_group(128, parallelism, key_group_for_bytes(ser.serialize(k), 128))
        == subtask
    ]
    out = []
    for i in range(0, len(mine), 10_000):
        part = mine[i : i + 10_000]
        out.append(
            pa.RecordBatch.from_pydict(
                {
                    "url": pa.array(part, pa.string()),
                    SUBTASK_COLUMN: pa.array([subtask] * len(part), pa.int32()),
                    MARKER_COLUMN: pa.array([False] * len(part), pa.bool_()),
                }
            )
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000, help="records of one micro-batch (both subtasks)")
    ap.add_argument("--urls", type=int, default=100_000)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--no-profile", action="store_true", help="time only (cProfile slows the loop down)")
    ap.add_argument("--vectorized", action="store_true", help="CountPerUrlVectorized instead of CountPerUrl")
    args = ap.parse_args()
    from pyspark.sql import types as T

    work = tempfile.mkdtemp(prefix="profile-task-")
    config = Configuration.from_mapping(
        {"statekit.checkpoints.dir": f"{work}/ck", "statekit.parallelism": 2, "statekit.backend": "heap"}
    )
    reset_cache()
    run_id = uuid.uuid4().hex
    attempts: dict[int, str] = {}
    prof = cProfile.Profile()
    total = 0.0
    rows = 0
    for b in range(args.batches):
        data = batches_for(args.records, args.urls, 0, 2, seed=b)
        plan = TaskPlan(
            job_id="profile",
            operator_id="process",
            run_id=run_id,
            checkpoint_id=b + 1,
            token=uuid.uuid4().hex,
            restore_location=None,
            restore_token=None,
            restore_attempts=dict(attempts),
            parallelism=2,
            max_parallelism=128,
            config=config,
            function_factory=CountPerUrlVectorized if args.vectorized else CountPerUrl,
            vectorized=args.vectorized,
            key_column="url",
            key_serializer=StrSerializer(),
            input_columns=("url",),
            output_schema=T.StructType(
                [T.StructField("url", T.StringType()), T.StructField("count", T.LongType())]
            ),
            spark_local_dir=work,
        )
        task = make_task(plan, None)
        t0 = time.perf_counter()
        profiled = b and not args.no_profile
        if profiled:
            prof.enable()
        out: list[Any] = list(task(iter(data)))
        if profiled:
            prof.disable()
        if b:
            total += time.perf_counter() - t0
            rows += sum(d.num_rows for d in data)
        handle = out[-1].column("__statekit_handle").to_pylist()[-1]
        import json

        attempts[0] = json.loads(handle)["attempt"]
    print(
        f"{rows:,} rows of subtask 0 over {args.batches - 1} profiled batches: {total:.3f} s, "
        f"{rows / total:,.0f} rows/s"
    )
    if not args.no_profile:
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
