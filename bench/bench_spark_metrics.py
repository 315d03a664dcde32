"""What statekit's metrics cost a Spark query: the per-record URL count with them on and off.

The query is ``bench_spark_urlcount.py``'s statekit run (``CountPerUrl``, heap,
filesystem checkpoints, ``local[2]``, one file per micro-batch). Each round
runs it twice on the same files, once with ``statekit.metrics.enabled=true``
(the metrics source, the job descriptions, the log line at INFO written to a
file) and once with ``false``, in alternating order, in one SparkSession
started and warmed up outside every timing. It prints, per round and as
medians:

- the wall time per micro-batch of each run, and the difference as a share of
  the batch time (noisy on a shared machine: the two runs differ by more than
  the metrics cost);
- what the metrics themselves took on the driver, timed around
  ``QueryMetrics.report`` and ``QueryMetrics.describe`` in the "on" run, as
  a share of that run's batch time (the cost that the wall-time difference
  hides in noise).

Every run's outputs are checked against the generator's counts.

Run: ``python bench/bench_spark_metrics.py [--records N] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from bench_spark_urlcount import _check, run_statekit

from statekit.spark import _metrics
from statekit_urlcount import generate_logs, local_spark_session


class _Timed:
    """Seconds spent in ``QueryMetrics.report`` and ``describe`` (their own work, not the jobs inside)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._report = _metrics.QueryMetrics.report
        self._describe = _metrics.QueryMetrics.describe

    def __enter__(self) -> _Timed:
        timed = self
        report, describe = self._report, self._describe

        def timed_report(qm: Any, info: Any) -> None:
            t = time.perf_counter()
            try:
                report(qm, info)
            finally:
                timed.seconds += time.perf_counter() - t

        @contextlib.contextmanager
        def timed_describe(qm: Any, batch_id: Any, what: str) -> Iterator[None]:
            t = time.perf_counter()
            cm = describe(qm, batch_id, what)
            cm.__enter__()
            timed.seconds += time.perf_counter() - t
            try:
                yield
            finally:
                t = time.perf_counter()
                cm.__exit__(None, None, None)
                timed.seconds += time.perf_counter() - t

        _metrics.QueryMetrics.report = timed_report  # type: ignore[method-assign]
        _metrics.QueryMetrics.describe = timed_describe  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        _metrics.QueryMetrics.report = self._report  # type: ignore[method-assign]
        _metrics.QueryMetrics.describe = self._describe  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000, help="log lines (default 200k)")
    ap.add_argument("--files", type=int, default=10, help="files, one micro-batch each (default 10)")
    ap.add_argument("--urls", type=int, default=10_000, help="URL space (default 10k)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of one run with and one without")
    ap.add_argument("--workdir", help="where logs and checkpoints go (default: a temporary directory)")
    args = ap.parse_args(argv)

    work = args.workdir or tempfile.mkdtemp(prefix="statekit-bench-metrics-")
    logs = os.path.join(work, "logs")
    shutil.rmtree(logs, ignore_errors=True)
    gen = generate_logs(
        logs, records=args.records, files=args.files, n_urls=args.urls, malformed_fraction=0.0, seed=7
    )
    truth = dict(gen.counts)
    # The "on" runs write the log line, as a deployment that logs statekit at INFO does.
    handler = logging.FileHandler(os.path.join(work, "statekit.log"))
    logging.getLogger("statekit").addHandler(handler)
    logging.getLogger("statekit").setLevel(logging.INFO)

    spark = local_spark_session("statekit-bench-metrics", conf={"spark.statekit.parallelism": "2"})
    print(
        f"Spark {spark.version}, {spark.sparkContext.master}; {args.records:,} records in {args.files} "
        f"files (one micro-batch each), {args.urls:,} URLs; {args.rounds} rounds",
        flush=True,
    )

    def run(enabled: bool, tag: str) -> tuple[float, float]:
        """(seconds per batch, seconds in the metrics per batch) of one run."""
        spark.conf.set("spark.statekit.metrics.enabled", str(enabled).lower())
        d = os.path.join(work, tag)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        infos: list[Any] = []
        with _Timed() as timed:
            outcome = run_statekit(spark, logs, d, 1, infos)
        _check(tag, outcome, truth, None)
        shutil.rmtree(d, ignore_errors=True)
        batches = len(infos)
        return outcome.seconds / batches, timed.seconds / batches

    run(True, "warmup-on")
    run(False, "warmup-off")
    on_t: list[float] = []
    off_t: list[float] = []
    own: list[float] = []
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        got = {e: run(e, f"round{r}-{'on' if e else 'off'}") for e in order}
        (t_on, m_on), (t_off, _) = got[True], got[False]
        on_t.append(t_on)
        off_t.append(t_off)
        own.append(m_on / t_on)
        print(
            f"round {r + 1}: on {t_on * 1000:.0f} ms/batch, off {t_off * 1000:.0f} ms/batch "
            f"({(t_on - t_off) / t_off * 100:+.1f} %); the metrics' own work {m_on * 1000:.2f} ms/batch "
            f"({m_on / t_on * 100:.2f} % of the batch)",
            flush=True,
        )
    on_m, off_m = statistics.median(on_t), statistics.median(off_t)
    print(
        f"median: on {on_m * 1000:.0f} ms/batch, off {off_m * 1000:.0f} ms/batch: "
        f"{(on_m - off_m) / off_m * 100:+.1f} % of the batch time; the metrics' own work "
        f"{statistics.median(own) * 100:.2f} % of the batch time",
        flush=True,
    )
    spark.stop()
    logging.getLogger("statekit").removeHandler(handler)
    handler.close()
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
