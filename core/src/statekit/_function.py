"""The user's function API, shared by every runner.

A job is written once against these classes and runs unchanged on the
embedded :class:`~statekit.LocalRunner` or on Spark::

    class CountPerUrl(KeyedProcessFunction):
        def open(self, ctx):
            self.count = ctx.get_state(ValueStateDescriptor("count", int, default=0))

        def process(self, record, ctx):
            n = self.count.value() + 1
            self.count.update(n)
            yield (ctx.current_key, n)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

from ._contracts import KeyedStateBackend, OperatorStateBackend
from ._operator import BroadcastState, OperatorListState
from ._serializers import TypeSerializer
from ._state import ListStateDescriptor, MapStateDescriptor, StateDescriptor
from ._ttl import Clock

__all__ = ["KeyedProcessFunction", "ProcessContext", "RuntimeContext"]


class RuntimeContext:
    """What a function's ``open`` gets: its state, and where it runs."""

    def __init__(
        self,
        keyed: KeyedStateBackend,
        operator: OperatorStateBackend,
        *,
        job_id: str,
        subtask_index: int,
        parallelism: int,
        max_parallelism: int,
        clock: Clock,
    ) -> None:
        self.keyed_backend = keyed
        self.operator_backend = operator
        self.job_id = job_id
        self.subtask_index = subtask_index
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self._clock = clock

    def get_state(
        self, descriptor: StateDescriptor, *, namespace_serializer: TypeSerializer | None = None
    ) -> Any:
        """The keyed state of ``descriptor``, bound to the key of the record being processed."""
        return self.keyed_backend.get_state(descriptor, namespace_serializer=namespace_serializer)

    def get_list_state(self, descriptor: ListStateDescriptor[Any]) -> OperatorListState:
        """Operator list state, split evenly over subtasks on rescale."""
        return self.operator_backend.get_list_state(descriptor)

    def get_union_list_state(self, descriptor: ListStateDescriptor[Any]) -> OperatorListState:
        """Operator list state that every subtask receives whole on restore."""
        return self.operator_backend.get_union_list_state(descriptor)

    def get_broadcast_state(self, descriptor: MapStateDescriptor[Any, Any]) -> BroadcastState:
        """Operator map state identical on every subtask."""
        return self.operator_backend.get_broadcast_state(descriptor)

    def processing_time(self) -> int:
        """The current processing time in milliseconds."""
        return self._clock()


class ProcessContext:
    """What ``process`` gets besides the record: the current key and time."""

    __slots__ = ("current_key", "runtime")

    def __init__(self, runtime: RuntimeContext) -> None:
        self.runtime = runtime
        self.current_key: Any = None

    def processing_time(self) -> int:
        """The current processing time in milliseconds."""
        return self.runtime.processing_time()


class KeyedProcessFunction(ABC):
    """A function over a keyed stream, with keyed and operator state.

    ``open`` runs once per subtask after its state is restored; ``process``
    runs per record with that record's key current and returns (or yields)
    output records; ``close`` runs when the subtask stops.
    """

    def open(self, ctx: RuntimeContext) -> None:  # noqa: B027 - optional hook
        """Get state handles here."""

    @abstractmethod
    def process(self, record: Any, ctx: ProcessContext) -> Iterable[Any] | None:
        """Handle one record; return or yield outputs (None for none)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what ``open`` acquired."""
