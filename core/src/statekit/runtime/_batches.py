"""A micro-batch of records on the LocalRunner for a batch function: bad records out, then the calls.

:meth:`LocalRunner.process_batch <statekit.LocalRunner.process_batch>` (and
a source read in micro-batches) hands a :class:`~statekit.KeyedBatchFunction`
each key's records as one Arrow record batch, as Spark does. Bad records are
found before any state is touched: event times and keys that cannot be
computed, records that are no dicts, and records whose column values clash
with the rows before them in Arrow (found by bisection). Then the kept
records are grouped by subtask and key, in arrival order, and each group is
one call; for a :class:`~statekit.KeyedColumnsFunction`, by subtask alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..sources._badrecords import BadRecord
from ..timers import NO_TIMER
from ._columnar import group_runs, output_rows, require_pyarrow, subtask_runs
from ._function import ColumnsContext, KeyedColumnsFunction
from ._sources import RejectedRecordError
from ._subtasks import OperatorSubtasks
from ._time import TimeCoordinator

__all__ = ["process_as_batch", "process_one_by_one"]

#: Where a bad record goes: ``(its index in the batch, what is wrong)``; None: it raises.
Rejected = Callable[[int, BadRecord], None] | None


def process_as_batch(
    records: Sequence[Any],
    rejected: Rejected,
    *,
    subtasks: OperatorSubtasks,
    time: TimeCoordinator,
    key_selector: Callable[[Any], Any],
) -> list[Any]:
    """``records`` through the batch function of ``subtasks``; their outputs, and those of timers due.

    With event time, records at or below the watermark the batch starts
    with are late, and the watermark moves after the batch (as on Spark).
    """
    pa = require_pyarrow()
    kept, stamps, routes = _kept(records, rejected, subtasks=subtasks, time=time, key_selector=key_selector)
    outputs: list[Any] = []
    serialize = subtasks.key_serializer.serialize
    by_subtask = isinstance(subtasks.subtasks[0].function, KeyedColumnsFunction)
    table: Any = None
    runs: list[tuple[Any, int, int]] = []
    while kept:
        if by_subtask:
            order, runs = subtask_runs([index for index, _ in routes])
        else:
            order, runs = group_runs(routes, fallback=lambda sk: (sk[0], serialize(sk[1])))
        rows = [records[kept[j]] for j in order]
        try:
            table = pa.RecordBatch.from_pylist(rows)
            break
        except pa.ArrowException as e:
            clash = _arrow_culprit(pa, rows)
            if clash is None:
                raise
            j, column = order[clash[0]], clash[1]
            problem = type(e)(f"column {column!r}: {e}")
            _reject(rejected, kept[j], RejectedRecordError.of("arrow", records[kept[j]], problem))
            del kept[j], stamps[j], routes[j]
    max_ts = max((t for t in stamps if t is not None), default=None)
    if kept and table is not None and by_subtask:
        for index, offset, length in runs:
            st = subtasks.subtasks[index]
            pctx = st.pctx
            pctx.current_key = None
            pctx.timestamp = None
            keys = [routes[j][1] for j in order[offset : offset + length]]
            columns_fn = st.function
            assert isinstance(columns_fn, KeyedColumnsFunction) and isinstance(pctx, ColumnsContext)
            outputs.extend(output_rows(columns_fn.process_columns(table.slice(offset, length), keys, pctx)))
    elif kept and table is not None:
        for (index, key), offset, length in runs:
            st = subtasks.subtasks[index]
            st.keyed.set_current_key(key)
            pctx = st.pctx
            pctx.current_key = key
            pctx.timestamp = None
            function: Any = st.function  # a KeyedBatchFunction: the caller checked
            outputs.extend(output_rows(function.process_batch(table.slice(offset, length), pctx)))
    if max_ts is not None:
        time.event_time_seen(max_ts, outputs)
    if time.processing_hint.earliest != NO_TIMER:
        time.fire_processing_time(outputs)
    return outputs


def process_one_by_one(
    records: Sequence[Any], rejected: Rejected, process: Callable[[Any], list[Any]]
) -> list[Any]:
    """``records`` through ``process`` one by one (a per-record function); a bad one goes to ``rejected``."""
    outputs: list[Any] = []
    for i, record in enumerate(records):
        try:
            outputs.extend(process(record))
        except RejectedRecordError as e:
            if rejected is None:
                raise
            rejected(i, e.bad)
    return outputs


def _kept(
    records: Sequence[Any],
    rejected: Rejected,
    *,
    subtasks: OperatorSubtasks,
    time: TimeCoordinator,
    key_selector: Callable[[Any], Any],
) -> tuple[list[int], list[int | None], list[tuple[int, Any]]]:
    """The records that are not bad or late: their indexes, event times and ``(subtask, key)``."""
    event_time_of = time.event_time_of
    kept: list[int] = []  # indexes into records
    stamps: list[int | None] = []
    routes: list[tuple[int, Any]] = []  # (subtask, key) of each kept record
    for i, record in enumerate(records):
        ts = None
        if event_time_of is not None:
            try:
                ts = event_time_of(record)
            except Exception as e:  # noqa: BLE001 - any failure here makes the record bad
                _reject(rejected, i, RejectedRecordError.of("event-time", record, e))
                continue
            if ts is not None and time.left_out_late(record, ts):
                continue
        if not isinstance(record, Mapping):
            problem = TypeError(
                "a KeyedBatchFunction gets its records as Arrow columns, so on the LocalRunner records "
                f"must be dicts of column values, not {type(record).__name__}"
            )
            if rejected is None:
                raise problem
            rejected(i, RejectedRecordError.of("arrow", record, problem).bad)
            continue
        try:
            key = key_selector(record)
            route = (subtasks.index_of(key), key)
        except Exception as e:  # noqa: BLE001 - any failure here makes the record bad
            _reject(rejected, i, RejectedRecordError.of("key", record, e))
            continue
        kept.append(i)
        stamps.append(ts)
        routes.append(route)
    return kept, stamps, routes


def _reject(rejected: Rejected, i: int, error: RejectedRecordError) -> None:
    if rejected is None:
        raise error
    rejected(i, error.bad)


def _arrow_culprit(pa: Any, rows: Sequence[Mapping[str, Any]]) -> tuple[int, str] | None:
    """The first row whose value of some column Arrow cannot put with the rows before it, and the column.

    Columns are the first row's keys, as ``RecordBatch.from_pylist`` infers
    them; a conflict found in a prefix stays in every longer one, so a
    binary search finds the shortest failing prefix.
    """
    for name in rows[0]:
        values = [r.get(name) for r in rows]
        try:
            pa.array(values)
            continue
        except pa.ArrowException:
            pass
        lo, hi = 1, len(values)  # values[:hi] fails
        while lo < hi:
            mid = (lo + hi) // 2
            try:
                pa.array(values[:mid])
                lo = mid + 1
            except pa.ArrowException:
                hi = mid
        return lo - 1, name
    return None
