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

Timers (``ctx.timer_service``) let a function act when time passes: it
registers a timer in ``process`` and the runner calls ``on_timer`` when the
watermark (event time) or the clock (processing time) reaches it.

A :class:`KeyedBatchFunction` is the vectorized form: it gets all of one
key's rows of a micro-batch at once, as a ``pyarrow.RecordBatch``, and returns
columns instead of records. A :class:`KeyedColumnsFunction` gets a subtask's
rows many at a time (on Spark each Arrow batch a task receives), with their
keys as one list, for work that is cheap per record when keys rarely repeat.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

from .._contracts import KeyedStateBackend, OperatorStateBackend
from ..serialization._keygroups import key_group_for_bytes
from ..serialization._serializers import TypeSerializer, serializer_for
from ..state._operator import BroadcastState, OperatorListState
from ..state._state import ListStateDescriptor, MapStateDescriptor, StateDescriptor
from ..state._ttl import Clock
from ..timers import TIMER_STATE_PREFIX, ProcessingTimeHint
from ..timers._service import TimeDomain, TimerService
from ._columnar import is_columnar, output_rows, require_pyarrow
from ._raw import RawStateRestoreContext, RawStateSnapshotContext

__all__ = [
    "ColumnsContext",
    "KeyedBatchFunction",
    "KeyedColumnsFunction",
    "KeyedProcessFunction",
    "OnTimerContext",
    "ProcessContext",
    "RuntimeContext",
    "declares_raw_restore",
    "declares_raw_snapshot",
]


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
        if descriptor.name.startswith(TIMER_STATE_PREFIX):
            raise ValueError(
                f"state name {descriptor.name!r}: names starting with {TIMER_STATE_PREFIX!r} are "
                "statekit's timers; choose another name"
            )
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

    def key_group_of(self, key: Any) -> int:
        """The key group of ``key`` (what raw keyed state is kept by; see ``snapshot_raw_state``)."""
        return key_group_for_bytes(self.keyed_backend.key_serializer.serialize(key), self.max_parallelism)


def timer_service_for(
    function: KeyedProcessFunction,
    ctx: RuntimeContext,
    key_serializer: TypeSerializer,
    processing_time: Callable[[], int] | None = None,
    hint: ProcessingTimeHint | None = None,
) -> TimerService:
    """The timer service of one subtask running ``function`` (runners call this)."""
    ns = function.timer_namespace
    return TimerService(
        ctx.keyed_backend,
        key_serializer,
        namespace_serializer=None if ns is None else serializer_for(ns),
        processing_time=processing_time or ctx.processing_time,
        hint=hint,
    )


class ProcessContext:
    """What ``process`` gets besides the record: the current key, its event time, timers.

    Attributes:
        current_key: The key of the record being processed.
        timestamp: The record's event time in ms (None without event time).
        timer_service: Registers and deletes timers of the current key.
        runtime: The subtask's :class:`RuntimeContext`.
    """

    __slots__ = ("current_key", "runtime", "timer_service", "timestamp")

    def __init__(self, runtime: RuntimeContext, timer_service: TimerService) -> None:
        self.runtime = runtime
        self.current_key: Any = None
        self.timestamp: int | None = None
        self.timer_service = timer_service

    def processing_time(self) -> int:
        """The current processing time in milliseconds."""
        return self.timer_service.current_processing_time()

    def current_watermark(self) -> int:
        """The current event-time watermark in milliseconds."""
        return self.timer_service.current_watermark()


class ColumnsContext(ProcessContext):
    """What ``process_columns`` gets: a :class:`ProcessContext` whose key the function sets.

    ``current_key`` is None when a runner's call starts, since the rows have
    many keys (it is the one key when ``process`` or ``process_batch`` passes
    one key's rows). :meth:`set_current_key` makes a key current for the state
    handles and the timer service, as the runner does before each ``process``.
    """

    __slots__ = ()

    def set_current_key(self, key: Any) -> None:
        """Make ``key`` (one of the call's keys) the key state handles and timers act on."""
        self.runtime.keyed_backend.set_current_key(key)
        self.current_key = key


class OnTimerContext(ProcessContext):
    """What ``on_timer`` gets: the fired timer's key (current), domain, namespace and time.

    Attributes:
        time_domain: :attr:`TimeDomain.EVENT_TIME` or :attr:`TimeDomain.PROCESSING_TIME`.
        namespace: The namespace the timer was registered in (``VOID_NAMESPACE`` by default).
        timestamp: The timer's timestamp.
    """

    __slots__ = ("namespace", "time_domain")

    def __init__(self, runtime: RuntimeContext, timer_service: TimerService) -> None:
        super().__init__(runtime, timer_service)
        self.time_domain = TimeDomain.EVENT_TIME
        self.namespace: Any = None


def fire_timer_results(
    function: KeyedProcessFunction, ctx: OnTimerContext, domain: TimeDomain, until: int
) -> Iterator[Any]:
    """Run ``on_timer`` for every timer of ``domain`` due at ``until``, in order; yield what each returned.

    What both runners do when time passes: each timer is removed from the
    state and its key made current before the callback runs. A result is an
    iterable of records, columns (see :class:`KeyedBatchFunction`) or None.
    """
    ctx.time_domain = domain
    on_timer = function.on_timer
    for ts, key, ns in ctx.timer_service.due(domain, until):
        ctx.current_key = key
        ctx.timestamp = ts
        ctx.namespace = ns
        out = on_timer(ts, ctx)
        if out is not None:
            yield out


def fire_timers(
    function: KeyedProcessFunction, ctx: OnTimerContext, domain: TimeDomain, until: int
) -> Iterator[Any]:
    """:func:`fire_timer_results` as records: columns become one dict per row."""
    for out in fire_timer_results(function, ctx, domain, until):
        yield from as_records(out)


def as_records(result: Any) -> Iterable[Any]:
    """What a function returned, as records: columns (Arrow, pandas, a mapping) become dicts."""
    if result is None:
        return ()
    return output_rows(result) if is_columnar(result) else result


class KeyedProcessFunction(ABC):
    """A function over a keyed stream, with keyed and operator state.

    ``open`` runs once per subtask after its state is restored; ``process``
    runs per record with that record's key current and returns (or yields)
    output records; ``on_timer`` runs when a timer the function registered
    fires; ``close`` runs when the subtask stops.

    Attributes:
        timer_namespace: The type (or :class:`~statekit.serializers.TypeSerializer`) of the
            namespaces timers are registered in; None (the default) allows only
            ``VOID_NAMESPACE``. Kept in checkpoints, so it must not change
            incompatibly between runs.
    """

    timer_namespace: ClassVar[Any] = None

    def open(self, ctx: RuntimeContext) -> None:  # noqa: B027 - optional hook
        """Get state handles here."""

    @abstractmethod
    def process(self, record: Any, ctx: ProcessContext) -> Iterable[Any] | None:
        """Handle one record; return or yield outputs (None for none)."""

    def on_timer(self, timestamp: int, ctx: OnTimerContext) -> Iterable[Any] | None:
        """A timer of ``ctx.current_key`` fired; return or yield outputs (None for none).

        The timer is already removed; state reads and writes apply to its key,
        and new timers may be registered. ``ctx.time_domain`` and
        ``ctx.namespace`` tell which timer it was. The default does nothing.
        """
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what ``open`` acquired."""

    def snapshot_raw_state(self, ctx: RawStateSnapshotContext) -> None:  # noqa: B027 - optional hook
        """Write raw state: bytes per key group this subtask owns, and raw operator items.

        Called at every checkpoint and savepoint, after the last record before
        it. For a structure the function serialises itself; managed state
        (``ctx.get_state`` in ``open``) needs none of this. See
        :class:`~statekit.RawStateSnapshotContext` and ``docs/state.md``.
        """

    def restore_raw_state(self, ctx: RawStateRestoreContext) -> None:  # noqa: B027 - optional hook
        """Take raw state back: called before ``open`` when the subtask starts from a checkpoint.

        ``ctx`` holds the bytes of exactly the key groups this subtask owns now,
        and its even split of the raw operator items (empty when the checkpoint
        holds none). A function that writes raw state must define this hook:
        restoring raw state into a function without it is refused unless
        ``allow_non_restored_state``. See :class:`~statekit.RawStateRestoreContext`.
        """


def declares_raw_snapshot(function: KeyedProcessFunction) -> bool:
    """Whether ``function`` writes raw state (overrides ``snapshot_raw_state``)."""
    return type(function).snapshot_raw_state is not KeyedProcessFunction.snapshot_raw_state


def declares_raw_restore(function: KeyedProcessFunction) -> bool:
    """Whether ``function`` takes raw state back (overrides ``restore_raw_state``)."""
    return type(function).restore_raw_state is not KeyedProcessFunction.restore_raw_state


class KeyedBatchFunction(KeyedProcessFunction):
    """A keyed function that gets all of one key's rows of a micro-batch at once, as Arrow.

    The vectorized form of :class:`KeyedProcessFunction`, for work that is
    cheaper per key than per record (as Spark's ``applyInPandasWithState``).
    For every key with rows in a micro-batch, the runner makes the key current
    and calls ``process_batch(rows, ctx)`` once, with those rows in arrival order
    as one ``pyarrow.RecordBatch`` (a zero-copy slice of the batch Spark hands
    over; ``rows.to_pandas()`` makes it a DataFrame). State, TTL, operator
    state, timers, ``open``/``on_timer``/``close``, checkpoints and rescaling are
    those of :class:`KeyedProcessFunction`. Example::

        class CountPerUrl(KeyedBatchFunction):
            def open(self, ctx):
                self.count = ctx.get_state(ValueStateDescriptor("count", int, default=0))

            def process_batch(self, rows, ctx):
                n, m = self.count.value(), rows.num_rows
                self.count.update(n + m)
                return {"url": [ctx.current_key] * m, "count": range(n + 1, n + m + 1)}

    A micro-batch is a Spark micro-batch (or ``run()``), or on the
    :class:`~statekit.LocalRunner` up to ``statekit.batch-size`` records. With
    event time, late rows are taken out before grouping (unless the late policy
    is ``process``) and ``ctx.timestamp`` is None: the rows carry their times.
    ``on_timer`` returns records, as in :class:`KeyedProcessFunction`, or columns.
    """

    @abstractmethod
    def process_batch(self, rows: Any, ctx: ProcessContext) -> Any:
        """Handle one key's rows (``ctx.current_key``) of a micro-batch; return its output columns.

        Returns:
            A ``pyarrow.RecordBatch`` or ``Table``, a pandas ``DataFrame``, a
            mapping of column names to equally long sequences (lists, ranges,
            numpy or Arrow arrays; None for a column of nulls), or None for no
            output. Columns are matched to the output schema by name; a missing
            one is null.
        """

    def process(self, record: Any, ctx: ProcessContext) -> Iterable[Any] | None:
        """One record, as a batch of one row (what ``LocalRunner.process`` does with a batch function)."""
        pa = require_pyarrow()
        if not isinstance(record, dict):
            raise TypeError(
                f"a KeyedBatchFunction's records are dicts of column values, not {type(record).__name__}"
            )
        return output_rows(self.process_batch(pa.RecordBatch.from_pylist([record]), ctx))


class KeyedColumnsFunction(KeyedBatchFunction):
    """A keyed function that gets a subtask's rows many at a time, as Arrow, with their keys as a list.

    For work that is cheap per record when keys rarely repeat within a batch,
    where :class:`KeyedBatchFunction`'s call per key costs more than the work
    (Spark's ``mapInArrow`` shape, with statekit's state). The runner calls
    ``process_columns(rows, keys, ctx)`` with rows: a ``pyarrow.RecordBatch``
    of the subtask's rows, in arrival order, and keys: a list of their keys
    (``keys[i]`` is row ``i``'s key, as ``ctx.current_key`` would be in
    ``process``). On Spark it calls it once per Arrow batch a task receives
    (at most ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows, as
    ``mapInArrow`` gets them), so the Python work overlaps the JVM's reading
    of the next; on the :class:`~statekit.LocalRunner` once per micro-batch
    (``statekit.batch-size`` records) and subtask. One call need not hold all
    of a micro-batch's rows. Bulk state access does the
    per-key work in one frame: a value state's ``update_batch(keys, fn)``
    (backends with :class:`~statekit.backend_api.SupportsBatchUpdate`: heap,
    rocksdb, lmdb). Any other state or timer access sets the key first with
    ``ctx.set_current_key(key)``. Example::

        class CountPerUrl(KeyedColumnsFunction):
            def open(self, ctx):
                self.count = ctx.get_state(ValueStateDescriptor("count", int, default=0))

            def process_columns(self, rows, keys, ctx):
                counts = self.count.update_batch(keys, lambda n: n + 1)
                return {"url": keys, "count": counts}

    Everything else (late rows taken out first, ``on_timer``, operator state,
    checkpoints, rescaling, what may be returned) is as for
    :class:`KeyedBatchFunction`. It is a :class:`KeyedBatchFunction`:
    ``process_batch`` (one key's rows) calls ``process_columns`` with that key
    for every row.
    """

    @abstractmethod
    def process_columns(self, rows: Any, keys: list[Any], ctx: ColumnsContext) -> Any:
        """Handle some of a subtask's rows, in arrival order, whose keys are ``keys``; return output columns.

        Returns:
            What :meth:`KeyedBatchFunction.process_batch` returns, for all the rows.
        """

    def process_batch(self, rows: Any, ctx: ProcessContext) -> Any:
        """One key's rows: :meth:`process_columns` with ``ctx.current_key`` for each of them."""
        if not isinstance(ctx, ColumnsContext):
            raise TypeError("a KeyedColumnsFunction runs with a ColumnsContext (a runner makes it)")
        key = ctx.current_key
        return self.process_columns(rows, [key] * rows.num_rows, ctx)
