"""The tasks' reports, carried to the driver by a Spark accumulator, so a batch can be one Spark job.

A task's reports travel in the handle column of its output (:mod:`._output`);
reading them back is a Spark job of its own. On classic Spark the tasks can
instead run inside the first job of the sink, which reads the cached output
anyway: each task also adds its handle rows, tagged with the batch's token,
to an accumulator of the query run, and the driver takes them from there
when that job ends. Spark merges a task's accumulator updates only when the
task succeeds, and the cache makes each partition run once, so exactly one
report per subtask arrives. When that is not what arrived (the sink did not
read every partition, a partition ran twice, a task failed and the sink
swallowed the error) the driver reads the handle column from the cache, as
without the channel, and nothing is taken from the accumulator.

Spark Connect has no accumulators: there the batch stays two jobs.
"""

from __future__ import annotations

from typing import Any

from pyspark.accumulators import AccumulatorParam

__all__ = ["Reports", "ReportsParam", "send_handles"]

#: What the accumulator holds: (batch token, a report's JSON) pairs.
Reports = list[tuple[str, str]]


class ReportsParam(AccumulatorParam[Reports]):
    """Pairs appended in the order tasks finish; the driver sorts them by subtask."""

    def zero(self, value: Reports) -> Reports:
        return []

    def addInPlace(self, value1: Reports, value2: Reports) -> Reports:
        value1.extend(value2)
        return value1


def send_handles(channel: Any, token: str, batch: Any) -> None:
    """Add ``batch``'s handle rows (its last column, where not null) to ``channel``, tagged ``token``."""
    column = batch.column(batch.num_columns - 1)
    if column.null_count == batch.num_rows:
        return
    channel.add([(token, d) for d in column.to_pylist() if d is not None])
