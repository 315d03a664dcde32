"""The job's keyed functions: a count per URL, and the same with a dead-letter path.

Both run unchanged on the embedded :class:`~statekit.LocalRunner` and on Spark
through :mod:`statekit.spark`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from statekit import KeyedProcessFunction, ProcessContext, RuntimeContext, ValueStateDescriptor

from ._parse import MALFORMED_KEY

__all__ = [
    "COUNT_STATE",
    "JOB_OUTPUT_SCHEMA",
    "OUTPUT_SCHEMA",
    "CountPerUrl",
    "CountPerUrlWithDeadLetters",
]

#: The keyed state both functions keep: requests so far, per key.
COUNT_STATE: ValueStateDescriptor[int] = ValueStateDescriptor("count", int, default=0)

#: What :class:`CountPerUrl` emits, as a Spark DDL schema.
OUTPUT_SCHEMA = "url string, count long"

#: What :class:`CountPerUrlWithDeadLetters` emits, as a Spark DDL schema.
JOB_OUTPUT_SCHEMA = "url string, count long, reason string, line string"


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
