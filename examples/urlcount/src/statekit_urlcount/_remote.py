"""The URL-count job from a Spark Connect client: ``statekit-urlcount demo --remote sc://host:port``.

From a Connect client, the query's sink and statekit's per-batch reports run
on the server (Connect runs ``foreachBatch`` functions in a server-side
Python process), so the live display cannot be called from there. The sink
appends each batch's :class:`BatchStats` to a JSON-lines file in the state
directory instead, and the client reads the new lines while it polls the
query. Paths are the server's: the demo assumes the client sees the same
files (a server on this machine, or a shared file system), as it reads the
counts back from statekit's checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._job import BatchStats, JobSettings, RunReport, Sink, build_stream, run_stream

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["BatchLog", "remote_spark_session", "run_job_remote"]


def remote_spark_session(url: str) -> SparkSession:
    """A Spark Connect session to the server at ``url`` (``sc://host:port``)."""
    from pyspark.sql import SparkSession

    try:
        return SparkSession.builder.remote(url).getOrCreate()
    except ImportError as exc:  # grpcio and friends are the connect extra's
        raise SystemExit(
            f"statekit-urlcount: a Spark Connect client needs {exc.name or 'grpcio'}: "
            'pip install "statekit[spark-connect]"'
        ) from exc


class BatchLog:
    """Appends each batch's stats to a JSON-lines file: how a sink on a Connect server reports them.

    Picklable (a path), so it travels to the server inside the sink.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, stats: BatchStats) -> None:
        """Record one batch (on the server)."""
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(dataclasses.asdict(stats)) + "\n")

    def size(self) -> int:
        """Where the next run's lines start."""
        return os.path.getsize(self.path) if os.path.exists(self.path) else 0

    def read_from(self, offset: int) -> tuple[list[BatchStats], int]:
        """The whole lines written after ``offset``, and the offset after them."""
        if not os.path.exists(self.path):
            return [], offset
        with open(self.path, "rb") as f:
            f.seek(offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        lines = data[:end].decode("utf-8").splitlines()
        return [BatchStats(**json.loads(line)) for line in lines if line], offset + end


def run_job_remote(
    spark: SparkSession,
    settings: JobSettings,
    *,
    on_batch: Callable[[BatchStats], None] = lambda stats: None,
    on_poll: Callable[[Any], None] = lambda query: None,
    poll_seconds: int = 1,
) -> RunReport:
    """:func:`~statekit_urlcount.run_job` from a Spark Connect client: the same query and outputs.

    ``on_batch`` is called on the client, when it polls the query, for each
    batch the server-side sink reported since.
    """
    os.makedirs(settings.state_dir, exist_ok=True)
    log = BatchLog(os.path.abspath(os.path.join(settings.state_dir, "connect-batches.jsonl")))
    offset = log.size()
    seen: list[BatchStats] = []

    def take_new() -> None:
        nonlocal offset
        new, offset = log.read_from(offset)
        for stats in new:
            seen.append(stats)
            on_batch(stats)

    def poll(query: Any) -> None:
        take_new()
        on_poll(query)

    report = run_stream(
        spark,
        settings,
        lambda absolute, _guarded: Sink(absolute, log),
        build_stream,
        on_batch=lambda stats: None,
        on_poll=poll,
        poll_seconds=poll_seconds,
    )
    take_new()
    report.batches = seen
    return report
