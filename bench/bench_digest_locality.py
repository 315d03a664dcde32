"""What the SHA-256 digests of checkpoint files cost in Spark's task time: locality benchmark, on vs off.

The growing-state URL count of ``bench_spark_locality.py`` (``--batches``
micro-batches of ``--keys`` new URLs each; locality, local recovery and the
hand-off on), run ``--rounds`` times per backend with digests on and off in
alternation, in one Spark session. Off: every statekit process (the driver,
and each Python worker through a ``sitecustomize`` that ``harness`` writes)
hashes nothing while a flag file exists, so a checkpoint written without
digests is read without them. Reported: the tasks' seconds over the batches
after the first (every subtask-batch snapshots; restores are few, most state
stays open), and the digests' share of it ((with - without) / with), per
round and over all rounds (the sums, and the medians). Task times of a few
seconds move by a quarter from one run to the next on a shared machine: the
rounds alternate which side goes first, and only many rounds tell. So each
process also measures its own hashing (the CPU time of every SHA-256 call, in
the driver and the workers, over all batches, the first too), reported as a
share of the tasks' time with digests: an upper bound of their cost, since
statekit hashes on a thread of its own while the task goes on.

Run: ``python bench/bench_digest_locality.py [--master local[2]] [--keys 100000]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench_spark_locality import _config, master_and_cores, run_statekit, session, write_batches
from harness import digest_switch_site, hashing_seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=3, help="standalone workers (ignored with --master)")
    ap.add_argument("--master", default=None, help="e.g. local[2]; default: a standalone cluster")
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--backends", default="heap,rocksdb")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    root = Path(tempfile.mkdtemp(prefix="statekit-digest-bench-"))
    flag = root / "digests-off"
    timing = root / "hashing"
    site = digest_switch_site(root / "site", flag, timing)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    sys.path.insert(0, str(site))
    import sitecustomize  # noqa: F401 - the driver switches with its workers

    try:
        with ExitStack() as stack:
            master, cores = master_and_cores(stack, args, root)
            logs = root / "logs"
            write_batches(logs, args.batches, args.keys)
            spark = session(master, cores, str(root / "spark-local"))
            write_batches(root / "warm", 2, 1000)
            print(f"{master}, parallelism {cores}, {args.batches} batches x {args.keys} new keys")
            for backend in args.backends.split(","):
                run_statekit(
                    spark, root / "warm", root / f"warm-{backend}", backend, _config("after"), cores, "-w"
                )
                seconds: dict[str, list[float]] = {"on": [], "off": []}
                hashing: list[float] = []
                for r in range(args.rounds):
                    # Alternate which goes first: a session warms up (and a shared machine's load
                    # drifts) over a round.
                    for digests in ("on", "off") if r % 2 == 0 else ("off", "on"):
                        flag.touch() if digests == "off" else flag.unlink(missing_ok=True)
                        work = root / f"{backend}-{digests}-{r}"
                        hashed_before = hashing_seconds(timing)
                        infos = run_statekit(
                            spark, logs, work, backend, _config("after"), cores, f"-{digests}-{r}"
                        )
                        flag.unlink(missing_ok=True)
                        tasks = sum(i.phases["tasks"] for i in infos[1:])
                        seconds[digests].append(tasks)
                        if digests == "on":  # the whole run's, the first batch's too: an upper bound
                            hashing.append(hashing_seconds(timing) - hashed_before)
                        shutil.rmtree(work, ignore_errors=True)
                    on, off = seconds["on"][-1], seconds["off"][-1]
                    print(f"{backend} round {r + 1}: tasks {on:.2f} s with digests, {off:.2f} s without: "
                          f"{100 * (on - off) / on:+.1f} %; hashing {hashing[-1]:.3f} s, "
                          f"{100 * hashing[-1] / on:.1f} % of the tasks with digests")  # fmt: skip
                on, off = sum(seconds["on"]), sum(seconds["off"])
                mid_on, mid_off = statistics.median(seconds["on"]), statistics.median(seconds["off"])
                print(f"{backend}, all {args.rounds} rounds: {on:.2f} s with, {off:.2f} s without: "
                      f"{100 * (on - off) / on:+.1f} % of task time; "
                      f"medians {mid_on:.2f} s / {mid_off:.2f} s: "
                      f"{100 * (mid_on - mid_off) / mid_on:+.1f} %")  # fmt: skip
                print(f"{backend}, hashing CPU time in every process (driver and workers, all batches): "
                      f"{sum(hashing):.3f} s, {100 * sum(hashing) / on:.1f} % of task time")  # fmt: skip
            spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
