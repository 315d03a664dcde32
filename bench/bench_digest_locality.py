"""What the SHA-256 digests of checkpoint files cost in Spark's task time: locality benchmark, on vs off.

The growing-state URL count of ``bench_spark_locality.py`` (``--batches``
micro-batches of ``--keys`` new URLs each; locality, local recovery and the
hand-off on), run ``--rounds`` times per backend with digests on and off in
alternation, in one Spark session. Off: every statekit process (the driver,
and each Python worker through a ``sitecustomize`` that ``harness`` writes)
hashes nothing while a flag file exists, so a checkpoint written without
digests is read without them. Reported: the tasks' seconds over the batches
after the first (every subtask-batch snapshots; restores are few, most state
stays open), and the digests' share of it, per round and over all rounds.

Run: ``python bench/bench_digest_locality.py [--master local[2]] [--keys 100000]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench_spark_locality import _config, run_statekit, session, write_batches
from harness import digest_switch_site


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=3, help="standalone workers (ignored with --master)")
    ap.add_argument("--master", default=None, help="e.g. local[2]; default: a standalone cluster")
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--backends", default="heap,rocksdb")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    root = Path(tempfile.mkdtemp(prefix="statekit-digest-bench-"))
    flag = root / "digests-off"
    site = digest_switch_site(root / "site", flag)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    sys.path.insert(0, str(site))
    import sitecustomize  # noqa: F401 - the driver switches with its workers

    try:
        with ExitStack() as stack:
            if args.master:
                master, cores = args.master, int(args.master.strip("local[]*") or 2)
            else:
                from cluster import standalone_cluster

                cluster = stack.enter_context(standalone_cluster(root / "cluster", workers=args.workers))
                master, cores = cluster.master_url, args.workers
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
                for r in range(args.rounds):
                    for digests in ("on", "off"):
                        flag.touch() if digests == "off" else flag.unlink(missing_ok=True)
                        work = root / f"{backend}-{digests}-{r}"
                        infos = run_statekit(
                            spark, logs, work, backend, _config("after"), cores, f"-{digests}-{r}"
                        )
                        flag.unlink(missing_ok=True)
                        tasks = sum(i.phases["tasks"] for i in infos[1:])
                        seconds[digests].append(tasks)
                        shutil.rmtree(work, ignore_errors=True)
                    on, off = seconds["on"][-1], seconds["off"][-1]
                    print(f"{backend} round {r + 1}: tasks {on:.2f} s with digests, {off:.2f} s without: "
                          f"{100 * (on - off) / off:+.1f} %")  # fmt: skip
                on, off = sum(seconds["on"]), sum(seconds["off"])
                print(f"{backend}, all rounds: {100 * (on - off) / off:+.1f} % of task time")
            spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
