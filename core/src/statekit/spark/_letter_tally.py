"""The dead letters a Spark source's tasks wrote for a micro-batch, counted for that batch's ``BatchInfo``.

:func:`~statekit.spark.read_logs` skips bad lines into dead letters in the
tasks that read the files, before any statekit operator sees a row: the
driver's ``BatchInfo`` (summed from the operator's tasks) would not know of
them. So a reading task that wrote dead letters also writes a tally, one per
range it read, named by the streaming query and micro-batch it ran for (the
``sql.streaming.queryId`` and ``streaming.sql.batchId`` local properties
Spark gives every task of a micro-batch)::

    <dead-letter dir>/.count-<query>-batch-<batch>-<letters file>

holding ``{"file": <letters file>, "letters": <how many>}``. The name is the
letters file's, so a retried task (or the batch run again) replaces its
tally as it replaces its letters. After the batch's tasks ran, the driver
sums the tallies of ``(query, batch)`` from every dead-letter directory a
:func:`read_logs` of this process named (:func:`watch_directory`) and
deletes them with the older ones of the query. The tallies are hidden
files: ``cat dir/part-*.json`` and Spark's readers (``spark.read.json(dir)``)
skip them, so they are never read as letters.

A query that reads with ``read_logs`` and writes with a sink of Spark's own
(no statekit operator) leaves its tallies (``.count-*``): small files, safe
to delete.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading

from ..sources._deadletters import DeadLetterDir, file_part

__all__ = [
    "COUNT_PREFIX",
    "JOB_ID_PROPERTY",
    "batch_job_id",
    "count_source_letters",
    "tally_letters",
    "watch_directory",
]

#: The local property statekit's driver gives the Spark jobs it runs for a micro-batch: its job id.
#: A reading task writes it into its dead letters when ``read_logs`` was given no ``job_id``.
JOB_ID_PROPERTY = "statekit.job.id"

#: How a tally's (hidden) file name in the dead-letter directory begins.
COUNT_PREFIX = ".count-"
_QUERY_KEY = "sql.streaming.queryId"
_BATCH_KEY = "streaming.sql.batchId"
_watched: set[str] = set()
_lock = threading.Lock()


def watch_directory(path: str) -> None:
    """The driver counts the tallies under dead-letter directory ``path`` (called by ``read_logs``)."""
    with _lock:
        _watched.add(os.path.abspath(path))


def batch_job_id() -> str | None:
    """In a task: the statekit job whose micro-batch it runs for (:data:`JOB_ID_PROPERTY`), or None."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    job = None if ctx is None else ctx.getLocalProperty(JOB_ID_PROPERTY)
    return job or None


def tally_letters(directory: str, letters_file: str, count: int) -> None:
    """In a reading task: ``count`` letters were written into ``letters_file`` for this task's micro-batch.

    Nothing is written outside a streaming micro-batch (a batch read has no batch to count them for).
    """
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None or count <= 0:
        return
    query, batch = ctx.getLocalProperty(_QUERY_KEY), ctx.getLocalProperty(_BATCH_KEY)
    if not query or batch is None or not batch.isdigit():
        return
    name = f"{COUNT_PREFIX}{file_part(query)}-batch-{int(batch):012d}-{letters_file}"
    DeadLetterDir(directory).publish(name, [{"file": letters_file, "letters": count}])


def count_source_letters(query: str, batch_id: int) -> int:
    """On the driver: the source-side dead letters of micro-batch ``batch_id`` of ``query``.

    Deletes the tallies it read, and the query's tallies of earlier batches
    (a batch skipped as done, or run without statekit, left them).
    """
    with _lock:
        directories = sorted(_watched)
    pattern = re.compile(re.escape(COUNT_PREFIX + file_part(query)) + r"-batch-(\d{12})-.*")
    total = 0
    for counts in directories:
        try:
            names = os.listdir(counts)
        except FileNotFoundError:
            continue
        for name in names:
            m = pattern.fullmatch(name)
            if m is None or int(m[1]) > batch_id:
                continue
            path = os.path.join(counts, name)
            if int(m[1]) == batch_id:
                with open(path, encoding="utf-8") as f:
                    total += sum(int(json.loads(line)["letters"]) for line in f if line.strip())
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return total
