"""Window assigners and the windowed aggregate function."""

from __future__ import annotations

import datetime as _dt
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..runtime._function import KeyedProcessFunction, OnTimerContext, ProcessContext, RuntimeContext
from ..serialization._serializers import TypeSerializer, serializer_for
from ..state._state import AggregateFunction, AggregatingStateDescriptor
from ..timers import parse_duration_ms

__all__ = [
    "Count",
    "SlidingEventTimeWindows",
    "TimeWindow",
    "TumblingEventTimeWindows",
    "WindowAssigner",
    "WindowedAggregate",
]


@dataclass(frozen=True, order=True)
class TimeWindow:
    """The event times ``[start, end)`` in ms."""

    start: int
    end: int

    @property
    def max_timestamp(self) -> int:
        """The last event time in the window: its timer fires when the watermark reaches it."""
        return self.end - 1


class WindowAssigner(ABC):
    """Assigns an event time to the windows that contain it."""

    @abstractmethod
    def assign(self, timestamp: int) -> list[TimeWindow]:
        """The windows containing ``timestamp``."""


def _start(timestamp: int, offset: int, slide: int) -> int:
    return timestamp - (timestamp - offset) % slide


class TumblingEventTimeWindows(WindowAssigner):
    """Back-to-back windows of ``size`` (ms, timedelta or ``"1 minute"``), aligned to ``offset``."""

    def __init__(self, size: int | str | _dt.timedelta, offset: int | str | _dt.timedelta = 0) -> None:
        self.size = parse_duration_ms(size, "window size")
        self.offset = parse_duration_ms(offset, "window offset") % max(self.size, 1)
        if self.size <= 0:
            raise ValueError("a window's size must be positive")

    def assign(self, timestamp: int) -> list[TimeWindow]:
        """The one window containing ``timestamp``."""
        start = _start(timestamp, self.offset, self.size)
        return [TimeWindow(start, start + self.size)]

    def __repr__(self) -> str:
        return f"TumblingEventTimeWindows(size={self.size}, offset={self.offset})"


class SlidingEventTimeWindows(WindowAssigner):
    """Windows of ``size`` starting every ``slide``; an event time is in ``size / slide`` of them."""

    def __init__(
        self,
        size: int | str | _dt.timedelta,
        slide: int | str | _dt.timedelta,
        offset: int | str | _dt.timedelta = 0,
    ) -> None:
        self.size = parse_duration_ms(size, "window size")
        self.slide = parse_duration_ms(slide, "window slide")
        if self.size <= 0 or self.slide <= 0:
            raise ValueError("a window's size and slide must be positive")
        self.offset = parse_duration_ms(offset, "window offset") % self.slide

    def assign(self, timestamp: int) -> list[TimeWindow]:
        """Every window containing ``timestamp``, earliest end first."""
        last = _start(timestamp, self.offset, self.slide)
        out = []
        start = last - self.size + self.slide
        while start <= last:
            if start + self.size > timestamp:
                out.append(TimeWindow(start, start + self.size))
            start += self.slide
        return out

    def __repr__(self) -> str:
        return f"SlidingEventTimeWindows(size={self.size}, slide={self.slide}, offset={self.offset})"


class Count(AggregateFunction[Any, int, int]):
    """Counts the records added (a window's count); values are ignored."""

    def create_accumulator(self) -> int:
        """Nothing counted yet."""
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        """One more."""
        return accumulator + 1

    def get_result(self, accumulator: int) -> int:
        """The count."""
        return accumulator

    def merge(self, a: int, b: int) -> int:
        """Both counts."""
        return a + b


def _default_emit(key: Any, window: TimeWindow, result: Any) -> tuple[Any, int, int, Any]:
    return (key, window.start, window.end, result)


def _identity(record: Any) -> Any:
    return record


class WindowedAggregate(KeyedProcessFunction):
    """An aggregate per key and event-time window, emitted once when the watermark passes the window.

    Each record is added to the accumulator of every window its event time
    falls in (a namespace of one aggregating state) and registers an
    event-time timer at the window's last millisecond; when that fires, the
    result is emitted as ``emit(key, window, result)`` (default
    ``(key, start, end, result)``) and the window's state and timer are gone.
    Records need an event time (the runner's ``event_time=``). Example::

        LocalRunner(
            lambda: WindowedAggregate(TumblingEventTimeWindows("1 minute"), Count()),
            key_selector=lambda r: r["url"],
            event_time=EventTime("ts", "10 seconds"),
        )

    Args:
        assigner: Which windows a record belongs to.
        aggregate: Folds the values of one key and window.
        accumulator_type: The accumulator's type (or pass ``serializer``).
        value: What of the record is added (default: the record).
        emit: Makes the output record of a fired window.
        serializer: The accumulator's serializer, instead of ``accumulator_type``.
        state_name: The aggregating state's name.
    """

    timer_namespace = serializer_for(TimeWindow)

    def __init__(
        self,
        assigner: WindowAssigner,
        aggregate: AggregateFunction[Any, Any, Any],
        accumulator_type: Any = int,
        *,
        value: Callable[[Any], Any] = _identity,
        emit: Callable[[Any, TimeWindow, Any], Any] = _default_emit,
        serializer: TypeSerializer | None = None,
        state_name: str = "window-contents",
    ) -> None:
        self.assigner = assigner
        self.descriptor: AggregatingStateDescriptor[Any, Any, Any] = AggregatingStateDescriptor(
            state_name, aggregate, None if serializer is not None else accumulator_type, serializer=serializer
        )
        self.value = value
        self.emit = emit
        self.dropped_late_windows = 0
        """Window assignments skipped because the window had already fired (``late='process'``)."""

    def open(self, ctx: RuntimeContext) -> None:
        """Gets the aggregating state, namespaced by window."""
        self.acc = ctx.get_state(self.descriptor, namespace_serializer=self.timer_namespace)

    def process(self, record: Any, ctx: ProcessContext) -> Iterable[Any] | None:
        """Adds the record to its windows and registers their ends."""
        ts = ctx.timestamp
        if ts is None:
            raise ValueError(
                "WindowedAggregate needs each record's event time: run it with event_time=EventTime(...) "
                "and records that carry one"
            )
        timers = ctx.timer_service
        watermark = timers.current_watermark()
        value = self.value(record)
        for window in self.assigner.assign(ts):
            if window.max_timestamp <= watermark:
                self.dropped_late_windows += 1
                continue
            self.acc.set_current_namespace(window)
            self.acc.add(value)
            timers.register_event_time_timer(window.max_timestamp, window)
        return None

    def on_timer(self, timestamp: int, ctx: OnTimerContext) -> Iterable[Any] | None:
        """Emits the fired window's result and clears its state."""
        window = ctx.namespace
        if not isinstance(window, TimeWindow):
            return None
        self.acc.set_current_namespace(window)
        result = self.acc.get()
        self.acc.clear()
        if result is None:
            return None
        return (self.emit(ctx.current_key, window, result),)
