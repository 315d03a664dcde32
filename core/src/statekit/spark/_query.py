"""The streaming query ``ProcessedStream.start()`` returns: Spark's, and what statekit does at its end.

A statekit query's driver registers its run in the job's run records when it
claims the job (:mod:`statekit.checkpoints._fencing`). Once the query has ended,
the driver (:meth:`~statekit.spark._driver.MicroBatchDriver.query_ended`) waits
for the Python workers' warm-up it started (:func:`._warmup.settle`) and
records the run's end, so that the next query of the job reads that the run
has ended (not that it may still be running) and numbers its checkpoints
right after the latest. The query has ended when:

- ``awaitTermination`` returned that it did, or raised (the query failed; an
  interrupt is not an end);
- ``stop`` returned;
- the savepoint watcher of an idle query found it no longer active (a query
  that failed or was stopped while nobody waited on it).

Whichever comes first does it, once. A driver process that exits while its
query runs (killed, or a script that returns without stopping it) records no
end, which is then the truth: the run may still have been writing.

Not on Spark Connect: there the query's driver is the server's (see
:mod:`._connect`), and the client's query is Spark's own.

What it may import: pyspark.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["StartedQuery"]


class StartedQuery(StreamingQuery):
    """Spark's ``StreamingQuery``; ``awaitTermination`` and ``stop`` call ``on_end`` once it has ended."""

    def __init__(self, query: StreamingQuery, on_end: Callable[[], None]) -> None:
        """``query``, whose end calls ``on_end`` (which must be safe to call more than once)."""
        super().__init__(query._jsq)
        self._on_end = on_end

    def awaitTermination(self, timeout: int | None = None) -> bool | None:
        """Spark's ``awaitTermination``; once the query has ended (also by an error), ``on_end``."""
        try:
            ended = super().awaitTermination(timeout)
        except Exception:  # the query failed: it has ended (an interrupt is not an end)
            self._on_end()
            raise
        if ended is not False:
            self._on_end()
        return ended

    def stop(self) -> None:
        """Spark's ``stop``, then ``on_end``."""
        super().stop()
        self._on_end()
