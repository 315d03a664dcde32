"""Helpers of the Spark tests: input files, running a stream to its end, checking state and outputs."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from jobs import CountUrls, model_state, state_of_runner
from statekit import LocalRunner

SCHEMA = "`@timestamp` string, remote_addr string, request string, url string, bytes long"
OUTPUT = "url string, n long"


def driver_env() -> dict[str, str]:
    """The environment of a Spark driver the tests start as a process of its own."""
    return {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


def write_inputs(directory: Path, records: list[dict[str, Any]], files: int, *, start: int = 0) -> None:
    """Split ``records`` over ``files`` JSON-lines files named ``part-<start + i>.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    size = -(-len(records) // files)
    # Spark's file source takes files in modification-time order; files written within one
    # millisecond would tie and come in any order, so each gets its own second, in order.
    base = time.time_ns() // 1_000_000_000 * 1_000_000_000
    for i in range(files):
        chunk = records[i * size : (i + 1) * size]
        tmp = directory / f".part-{start + i:04d}.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in chunk))
        stamp = base + (start + i) * 1_000_000_000
        os.utime(tmp, ns=(stamp, stamp))
        os.replace(tmp, directory / f"part-{start + i:04d}.json")  # the file source sees whole files only


def stream_of(session: Any, directory: Path, files_per_trigger: int = 1) -> Any:
    """A streaming DataFrame over the JSON files of ``directory``."""
    return (
        session.readStream.schema(SCHEMA).option("maxFilesPerTrigger", files_per_trigger).json(str(directory))
    )


def run_to_end(processed: Any, checkpoint_location: Path, **kw: Any) -> Any:
    """Start the query with an availableNow trigger and wait until it has read everything."""
    query = processed.start(
        checkpoint_location=str(checkpoint_location), trigger={"availableNow": True}, **kw
    )
    query.awaitTermination()
    return query


def restored_state(
    storage: Any, job_id: str, parallelism: int = 2, location: str = "latest"
) -> dict[str, Any]:
    """The state of the job's latest checkpoint, read back through the embedded runner.

    The runner uses the backend that wrote the checkpoint, which native checkpoints need.
    """
    from statekit.checkpointing import load_checkpoint

    found = storage.latest_checkpoint(job_id) if location == "latest" else location
    assert found is not None, "no checkpoint to restore"
    backend = load_checkpoint(storage, found).metadata.backend or "heap"
    runner = LocalRunner(
        CountUrls,
        key_selector=lambda r: r["url"],
        config={
            "statekit.parallelism": parallelism,
            "statekit.max-parallelism": 128,
            "statekit.backend": backend,
        },
        storage=storage,
        job_id=job_id,
    )
    assert runner.restore(location) is not None, "no checkpoint to restore"
    try:
        return state_of_runner(runner)
    finally:
        runner.close()


def assert_exact_state(storage: Any, job_id: str, records: list[dict[str, Any]]) -> None:
    """The job's state holds every record exactly once: count, list and sum per URL."""
    assert restored_state(storage, job_id) == model_state(records)


def read_outputs(out_dir: Path) -> list[tuple[str, int, int]]:
    """``(url, n, batch id)`` of every output row the file sink wrote."""
    import pyarrow.dataset as ds

    table = ds.dataset(str(out_dir), format="parquet", partitioning="hive").to_table()
    return list(zip(*(table.column(c).to_pylist() for c in ("url", "n", "batch_id"))))


def assert_exact_outputs(out_dir: Path, records: list[dict[str, Any]]) -> None:
    """Every record produced exactly one output: per URL the running counts are exactly 1..count."""
    seen: dict[str, list[int]] = defaultdict(list)
    for url, n, _ in read_outputs(out_dir):
        seen[url].append(n)
    counts = Counter(r["url"] for r in records)
    assert {u: sorted(ns) for u, ns in seen.items()} == {u: list(range(1, c + 1)) for u, c in counts.items()}


def wait_until(condition: Any, what: str, timeout: float = 300) -> None:
    """Wait for ``condition()`` to hold, for at most ``timeout`` seconds (a generous bound: CI
    machines run at load 10); fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def latest_batch(checkpoints: Path, job_id: str) -> int:
    """The Spark micro-batch whose state the job's newest checkpoint holds (-1: none yet).

    Not the checkpoint id less one: a driver that took over from one that never
    recorded its end (a killed one) numbers its checkpoints one further. Read
    while the job runs, as its restore reads it (a retention that removes the
    listed newest before the read gives way to the newer one).
    """
    from statekit.checkpoints._coordinator import newest_checkpoint
    from statekit.spark._driver import BATCH_PROPERTY
    from statekit_storage import FileSystemCheckpointStorage

    newest = newest_checkpoint(FileSystemCheckpointStorage(str(checkpoints)), job_id)
    return -1 if newest is None else int(newest.metadata.properties[BATCH_PROPERTY])
