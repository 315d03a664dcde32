"""The jobs' keyed functions: a count per URL (plain, and with a dead-letter path), and
requests per URL per event-time window.

All run unchanged on the embedded :class:`~statekit.LocalRunner` and on Spark
through :mod:`statekit.spark`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from statekit import (
    ColumnsContext,
    KeyedBatchFunction,
    KeyedColumnsFunction,
    KeyedProcessFunction,
    ProcessContext,
    RuntimeContext,
    ValueStateDescriptor,
)
from statekit.backend_api import SupportsBatchUpdate
from statekit.windows import Count, TimeWindow, TumblingEventTimeWindows, WindowedAggregate

from ._parse import MALFORMED_KEY

__all__ = [
    "COUNT_STATE",
    "JOB_OUTPUT_SCHEMA",
    "OUTPUT_SCHEMA",
    "WINDOWED_OUTPUT_SCHEMA",
    "CountPerUrl",
    "CountPerUrlColumns",
    "CountPerUrlVectorized",
    "CountPerUrlWithDeadLetters",
    "CountPerUrlWithDeadLettersVectorized",
    "RequestsPerUrlPerWindow",
]

#: The keyed state both functions keep: requests so far, per key.
COUNT_STATE: ValueStateDescriptor[int] = ValueStateDescriptor("count", int, default=0)

#: What :class:`CountPerUrl` emits, as a Spark DDL schema.
OUTPUT_SCHEMA = "url string, count long"

#: What :class:`CountPerUrlWithDeadLetters` emits, as a Spark DDL schema.
JOB_OUTPUT_SCHEMA = "url string, count long, reason string, line string"

#: What :class:`RequestsPerUrlPerWindow` emits, as a Spark DDL schema (times in epoch ms, UTC).
WINDOWED_OUTPUT_SCHEMA = (
    "url string, window_start long, window_end long, requests long, reason string, line string"
)


class CountPerUrl(KeyedProcessFunction):
    """For every request, its URL and how many requests that URL has had so far.

    The seed example's job: the same input record gives a different output
    each time, because the output depends on the state (the count before it).
    Records are keyed by URL; the record itself is not read.
    """

    def open(self, ctx: RuntimeContext) -> None:
        """Gets the per-URL count."""
        self.count = ctx.get_state(COUNT_STATE)

    def process(self, record: Any, ctx: ProcessContext) -> Iterable[tuple[str, int]]:
        """Adds one to the current URL's count and emits ``(url, count)``."""
        n = self.count.value() + 1
        self.count.update(n)
        return ((ctx.current_key, n),)


class CountPerUrlVectorized(KeyedBatchFunction):
    """:class:`CountPerUrl` written with the vectorized API: the same output, one call per URL and batch.

    It gets all of a URL's requests of a micro-batch at once (an Arrow record
    batch; only its length is read), adds them to the count in one state
    update, and emits the same ``(url, count)`` per request as
    :class:`CountPerUrl`, as two columns.
    """

    def open(self, ctx: RuntimeContext) -> None:
        """Gets the per-URL count (the same state as :class:`CountPerUrl`'s)."""
        self.count = ctx.get_state(COUNT_STATE)

    def process_batch(self, rows: Any, ctx: ProcessContext) -> dict[str, Any]:
        """Adds the URL's requests of this batch to its count; one output row per request."""
        n, m = self.count.value(), rows.num_rows
        self.count.update(n + m)
        return {"url": [ctx.current_key] * m, "count": range(n + 1, n + m + 1)}


class CountPerUrlColumns(KeyedColumnsFunction):
    """:class:`CountPerUrl` with one call for many requests (a KeyedColumnsFunction): the same output.

    It gets its subtask's requests many at a time, as Arrow columns with the
    URLs as one list, and counts them in arrival order
    with one bulk update of the count (``update_batch``), so it pays per
    request, not per URL: the form for logs where URLs rarely repeat within a
    batch. A backend without bulk updates gets the same counts key by key.
    """

    def open(self, ctx: RuntimeContext) -> None:
        """Gets the per-URL count (the same state as :class:`CountPerUrl`'s)."""
        self.count = ctx.get_state(COUNT_STATE)

    def process_columns(self, rows: Any, keys: list[Any], ctx: ColumnsContext) -> dict[str, Any]:
        """Adds one to each request's URL count, in order; emits ``url`` and ``count`` columns."""
        count = self.count
        if isinstance(count, SupportsBatchUpdate):
            return {"url": keys, "count": count.update_batch(keys, _plus_one)}
        counts = []
        for key in keys:
            ctx.set_current_key(key)
            n = count.value() + 1
            count.update(n)
            counts.append(n)
        return {"url": keys, "count": counts}


def _plus_one(n: int) -> int:
    return n + 1


def _field(record: Any, name: str) -> Any:
    if isinstance(record, Mapping):
        return record.get(name)
    return getattr(record, name, None)


class CountPerUrlWithDeadLetters(KeyedProcessFunction):
    """:class:`CountPerUrl` over parsed lines, malformed ones included.

    Input records carry ``url``, ``reason`` and ``line`` (see
    :func:`~statekit_urlcount.parse_line`); malformed lines arrive under the
    reserved key :data:`~statekit_urlcount.MALFORMED_KEY`, so their running
    total is keyed state like any URL's count, checkpointed and restored with
    it. Outputs have :data:`JOB_OUTPUT_SCHEMA`: ``(url, count, None, None)``
    for a request, ``(None, malformed so far, reason, line)`` for a malformed
    line (the dead letter).
    """

    def open(self, ctx: RuntimeContext) -> None:
        """Gets the per-key count (a URL's requests, or the malformed lines)."""
        self.count = ctx.get_state(COUNT_STATE)

    def process(
        self, record: Any, ctx: ProcessContext
    ) -> Iterable[tuple[str | None, int, str | None, str | None]]:
        """Counts the record under its key; a malformed one is also emitted as a dead letter."""
        n = self.count.value() + 1
        self.count.update(n)
        key = ctx.current_key
        if key == MALFORMED_KEY:
            return ((None, n, _field(record, "reason"), _field(record, "line")),)
        return ((key, n, None, None),)


class CountPerUrlWithDeadLettersVectorized(KeyedBatchFunction):
    """:class:`CountPerUrlWithDeadLetters` with the vectorized API: the same outputs, one call per key.

    A URL's requests of a micro-batch give ``(url, count, null, null)`` rows
    with the counts that follow the stored one; the malformed lines' key gives
    one dead letter per line, its ``reason`` and ``line`` columns passed on as
    Arrow arrays.
    """

    def open(self, ctx: RuntimeContext) -> None:
        """Gets the per-key count (a URL's requests, or the malformed lines)."""
        self.count = ctx.get_state(COUNT_STATE)

    def process_batch(self, rows: Any, ctx: ProcessContext) -> dict[str, Any]:
        """Adds the key's rows to its count; one output row per input row."""
        n, m = self.count.value(), rows.num_rows
        self.count.update(n + m)
        counts = range(n + 1, n + m + 1)
        if ctx.current_key == MALFORMED_KEY:
            return {
                "url": None,
                "count": counts,
                "reason": rows.column("reason"),
                "line": rows.column("line"),
            }
        return {"url": [ctx.current_key] * m, "count": counts}


def _window_row(key: Any, window: TimeWindow, requests: int) -> tuple[Any, int, int, int, None, None]:
    return (key, window.start, window.end, requests, None, None)


class RequestsPerUrlPerWindow(WindowedAggregate):
    """Requests per URL per tumbling event-time window (a minute by default), with a dead-letter path.

    Input records carry ``url``, ``time_ms``, ``reason`` and ``line`` (see
    :func:`~statekit_urlcount.parse_timed_line`) and run with
    ``event_time=EventTime("time_ms", delay)``. Each URL's window is a
    namespace of one counting state; it is emitted once, as ``(url,
    window_start, window_end, requests, None, None)``, when the watermark
    passes its end, and its state is cleared then. Lines at or below the
    watermark are late: the runner counts them and hands them to its late
    sink, so they never reach this function.

    Malformed lines arrive under :data:`~statekit_urlcount.MALFORMED_KEY`
    without an event time (so they are never late and never move the
    watermark); they are counted in keyed state and emitted at once as
    ``(None, None, None, malformed so far, reason, line)``, as in
    :class:`CountPerUrlWithDeadLetters`. Outputs have :data:`WINDOWED_OUTPUT_SCHEMA`.

    Args:
        window: The window size: ms, a ``timedelta`` or ``"1 minute"``.
    """

    def __init__(self, window: int | str | dt.timedelta = "1 minute") -> None:
        super().__init__(TumblingEventTimeWindows(window), Count(), int, emit=_window_row)

    def open(self, ctx: RuntimeContext) -> None:
        """Gets the windows' counts and the malformed lines' count."""
        super().open(ctx)
        self.malformed = ctx.get_state(COUNT_STATE)

    def process(self, record: Any, ctx: ProcessContext) -> Iterable[Any] | None:
        """Counts a request in its URL's window; a malformed line is counted and dead-lettered."""
        if ctx.current_key == MALFORMED_KEY:
            n = self.malformed.value() + 1
            self.malformed.update(n)
            return ((None, None, None, n, _field(record, "reason"), _field(record, "line")),)
        return super().process(record, ctx)
