"""Event-time windows on namespaces and timers.

A window is a namespace of keyed state; its end is an event-time timer in that
namespace. :class:`WindowedAggregate` is the usual job (an aggregate per key
and window, emitted once when the watermark passes the window's end, its state
cleared then); :class:`TumblingEventTimeWindows` and
:class:`SlidingEventTimeWindows` assign records to windows, and can be used in
a function of one's own (see docs/state.md).
"""

from __future__ import annotations

from ._windows import (
    Count,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    WindowAssigner,
    WindowedAggregate,
)

__all__ = [
    "Count",
    "SlidingEventTimeWindows",
    "TimeWindow",
    "TumblingEventTimeWindows",
    "WindowAssigner",
    "WindowedAggregate",
]
