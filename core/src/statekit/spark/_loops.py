"""The loops of a task: per record, per key (vectorized), per batch and subtask (columns), and timers.

The per-record loop is the hot path: every name it uses per row is bound to
a local variable before the loop, and a subtask's state and function once
per run of its rows (rows come grouped by subtask).

Timers fire at the end of each task, after its rows: event-time timers at or
below the batch's watermark (computed by the driver from earlier batches, as
Spark does), processing-time timers at or below the batch's timestamp. Rows at
or below the watermark are late: counted, and handed to the late-records sink
(or to the function, by policy).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from ..runtime._columnar import arrow_group_runs, group_runs, subtask_runs
from ..runtime._function import ColumnsContext, KeyedBatchFunction, KeyedColumnsFunction, fire_timer_results
from ..runtime._subtask import Subtask
from ..state._keyed import KeyedBackendBase
from ..timers import MAX_WATERMARK
from ..timers._eventtime import EventTime
from ..timers._service import TimeDomain
from ._arrow_values import Unconvertible, rows_of, values_of
from ._output import FLUSH_ROWS, TaskOutput
from ._routing import KEY_GROUP_COLUMN, MARKER_COLUMN, PLACE_COLUMN, SUBTASK_COLUMN
from ._run import SubtaskCounts, TaskRun

__all__ = ["event_times", "fire_timers", "process_columns", "process_groups", "process_records"]

_NO_SUBTASK = object()
_Runs = Iterable[tuple[tuple[int, Any], int, int]]  # ((subtask, key), offset, length) per key, in order


def process_records(run: TaskRun, batches: Iterator[Any]) -> Iterator[Any]:
    """The per-record loop: ``process`` per row, in the order rows arrive."""
    plan, out, phases, bad_keys = run.plan, run.out, run.phases, run.bad_keys
    et = plan.event_time
    pending = out.rows
    append, width = pending.append, len(out.names)
    key_column = plan.key_column
    clock = time.perf_counter
    for batch in _arriving(batches, phases):
        t = clock()
        only = _one_subtask(batch) if et is None else None
        if only is not None:
            yield from _records_of_one_subtask(run, batch, only, t)
            continue
        subtasks = batch.column(SUBTASK_COLUMN).to_pylist()
        markers = batch.column(MARKER_COLUMN).to_pylist()
        records, whole = rows_of(batch.select(list(plan.input_columns)))
        if not whole:
            _refuse_unconvertible(records, subtasks)
        times = event_times(batch, et) if et is not None else None
        late_rows: list[int] = []
        places = batch.column(PLACE_COLUMN).to_pylist() if None in subtasks else None
        bad_keys.rows_read += len(subtasks)
        t_loop = clock()
        phases["convert"] += t_loop - t
        restoring = phases["restore"]  # a restore inside the loop is the restore's time
        cur: Any = _NO_SUBTASK
        for row, (index, marker, record) in enumerate(zip(subtasks, markers, records)):
            if index is None:
                assert places is not None
                bad_keys.reject(record, places[row])
                continue
            if index != cur:
                # Rows come grouped by subtask: bind its state and function once per run.
                st = run.subtask(index)
                counts = run.counts[index]
                cur = index
                set_key, pctx, process = st.keyed.set_current_key, st.pctx, st.function.process
            if marker:
                bad_keys.rows_read -= 1
                continue
            ts = None
            if times is not None:
                ts = times[row]
                if ts is not None and run.late(counts, ts, row, late_rows):
                    continue
            key = record[key_column]
            set_key(key)
            pctx.current_key = key
            pctx.timestamp = ts
            counts.records += 1
            result = process(record, pctx)
            if result is not None:
                for o in result:
                    if type(o) is tuple and len(o) == width:  # out.add's common case, inline
                        append(o)
                    else:
                        out.add(o)
                    counts.outputs += 1
                if len(pending) >= FLUSH_ROWS:
                    t = clock()
                    flushed = out.flush()
                    phases["output"] += clock() - t
                    yield flushed
                    t_loop += clock() - t  # the flush and the consumer's turn are not the loop's
        phases["records"] += clock() - t_loop - (phases["restore"] - restoring)
        if late_rows:
            yield out.late(batch, late_rows)


def _one_subtask(batch: Any) -> int | None:
    """The subtask of every row of ``batch`` when they share one and none is a marker, else None.

    The usual batch when the routing is in the query's plan (a partition is its
    subtask, and no marker rows are sent): checked in Arrow, in C.
    """
    n = batch.num_rows
    if not n:
        return None
    subtasks = batch.column(SUBTASK_COLUMN)
    markers = batch.column(MARKER_COLUMN)
    if subtasks.null_count or markers.null_count or markers.true_count:
        return None
    bounds = pc.min_max(subtasks)
    low = bounds["min"].as_py()
    return low if low == bounds["max"].as_py() else None


def _records_of_one_subtask(run: TaskRun, batch: Any, index: int, started: float) -> Iterator[Any]:
    """:func:`process_records` for a batch of records of subtask ``index`` alone, without event time.

    The same calls in the same order as the general loop; what it leaves out
    is what such a batch never needs per row: a subtask, marker and late check.
    Its handling of a result repeats the general loop's on purpose: a helper
    would cost a call per row, which is what this loop exists to save.
    """
    plan, out, phases, bad_keys = run.plan, run.out, run.phases, run.bad_keys
    pending = out.rows
    append, width = pending.append, len(out.names)
    key_column = plan.key_column
    clock = time.perf_counter
    records, whole = rows_of(batch.select(list(plan.input_columns)))
    if not whole:
        _refuse_unconvertible(records, [index] * len(records))
    bad_keys.rows_read += len(records)
    t_loop = clock()
    phases["convert"] += t_loop - started
    restoring = phases["restore"]  # a restore inside the loop is the restore's time
    st = run.subtask(index)
    keys = [record[key_column] for record in records]
    counts = run.counts[index]
    keyed = st.keyed
    pctx, process = st.pctx, st.function.process
    groups = _key_groups_to_backend(st, keys, batch, key_column)
    # Groups come only to a backend on KeyedBackendBase. A branch per row costs less than a
    # wrapper dropping the group (a Python call per row, 67 ns) where none came.
    set_key = keyed.set_current_key
    set_key_in_group: Any = getattr(keyed, "set_current_key_in_group", None)
    # Where the base's own set_current_key_in_group would run, its two writes are made here:
    # a Python call per row is 3 % of a record's instructions (profile_spark_task.py --callgrind).
    inline = (
        keyed
        if isinstance(keyed, KeyedBackendBase)
        and type(keyed).set_current_key_in_group is KeyedBackendBase.set_current_key_in_group
        else None
    )
    pctx.timestamp = None
    outputs = 0
    done = 0
    for record, key, group in zip(records, keys, itertools.repeat(None) if groups is None else groups):
        if group is None:
            set_key(key)
        elif inline is not None:
            inline._key = key
            inline._kg = group
        else:
            set_key_in_group(key, group)
        pctx.current_key = key
        done += 1
        result = process(record, pctx)
        if result is not None:
            for o in result:
                if type(o) is tuple and len(o) == width:  # out.add's common case, inline
                    append(o)
                else:
                    out.add(o)
                outputs += 1
            if len(pending) >= FLUSH_ROWS:
                counts.records += done
                counts.outputs += outputs
                done = outputs = 0
                t = clock()
                flushed = out.flush()
                phases["output"] += clock() - t
                yield flushed
                t_loop += clock() - t  # the flush and the consumer's turn are not the loop's
    counts.records += done
    counts.outputs += outputs
    phases["records"] += clock() - t_loop - (phases["restore"] - restoring)


def _arriving(batches: Iterator[Any], phases: dict[str, float]) -> Iterator[Any]:
    """``batches`` as Spark hands them over, the wait for each counted as the ``input`` phase."""
    clock = time.perf_counter
    it = iter(batches)
    while True:
        t = clock()
        batch = next(it, None)
        phases["input"] += clock() - t
        if batch is None:
            return
        yield batch


def process_groups(run: TaskRun, batches: Iterator[Any]) -> Iterator[Any]:
    """The vectorized loop: every input row first, then ``process_batch`` once per subtask and key."""
    plan, out, phases = run.plan, run.out, run.phases
    clock = time.perf_counter
    t = clock()
    received = [b for b in batches if b.num_rows]
    phases["input"] += clock() - t
    if not received:
        return
    t = clock()
    restoring = phases["restore"]
    batch = pa.Table.from_batches(received).combine_chunks().to_batches()[0]
    runs: _Runs
    late_rows: list[int] = []
    by_arrow = _grouped_by_arrow(run, batch)
    if by_arrow is not None:  # the usual batch: grouped in C
        order, runs = by_arrow
    else:
        subtasks, served, keys, rows, late_rows = _routed(run, batch)
        serialize = plan.key_serializer.serialize
        if len(served) == 1:  # one subtask's rows, among markers or late rows: group on the key alone
            (only,) = served
            listed, key_runs = group_runs(keys, rows, fallback=serialize)
            runs = [((only, key), offset, length) for key, offset, length in key_runs]
        else:
            listed, runs = group_runs(
                list(zip(subtasks, keys)), rows, fallback=lambda sk: (sk[0], serialize(sk[1]))
            )
        order = pa.array(listed, pa.int64())
    grouped = batch.select(list(plan.input_columns)).take(order)
    t_loop = clock()
    phases["convert"] += t_loop - t - (phases["restore"] - restoring)
    cur: Any = _NO_SUBTASK
    for (index, key), offset, length in runs:
        if index != cur:
            st = run.active[index].subtask
            counts = run.counts[index]
            cur = index
            function = st.function
            assert isinstance(function, KeyedBatchFunction)  # plan.vectorized says so
            set_key, pctx, process_batch = st.keyed.set_current_key, st.pctx, function.process_batch
            pctx.timestamp = None
        set_key(key)
        pctx.current_key = key
        counts.records += length
        result = process_batch(grouped.slice(offset, length), pctx)
        if result is not None:
            counts.outputs += out.add_columns(result)
            if out.size >= FLUSH_ROWS:
                t = clock()
                flushed = out.flush()
                phases["output"] += clock() - t
                yield flushed
                t_loop += clock() - t
    phases["records"] += clock() - t_loop
    if late_rows:
        yield out.late(batch, late_rows)


def _grouped_by_arrow(run: TaskRun, batch: Any) -> tuple[Any, _Runs] | None:
    """:func:`process_groups`' order and runs of the usual batch, computed by Arrow; None for any other.

    The usual batch: one subtask's records without a marker (the routing in the
    query's plan), no event time, and a key column Arrow can group as Python
    would (:func:`~statekit.runtime._columnar.arrow_group_runs`). Only the
    distinct keys become Python values, and only their key groups go to the
    backend.
    """
    plan = run.plan
    if plan.event_time is not None:
        return None
    only = _one_subtask(batch)
    if only is None:
        return None
    grouped = arrow_group_runs(batch.column(plan.key_column))
    if grouped is None:
        return None
    order, keys, offsets, lengths = grouped
    run.bad_keys.rows_read += batch.num_rows
    firsts = order.take(pa.array(offsets, pa.int64()))  # each key's first row
    _key_groups_to_backend(run.subtask(only), keys, batch, rows=firsts)
    return order, zip(zip(itertools.repeat(only), keys), offsets, lengths)


def process_columns(run: TaskRun, batches: Iterator[Any]) -> Iterator[Any]:
    """A :class:`~statekit.KeyedColumnsFunction`'s loop: ``process_columns`` per arriving batch and subtask.

    Each Arrow batch Spark hands over (up to
    ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows) is processed as it
    arrives, its rows per subtask in arrival order, so the JVM's shuffle read
    and Arrow conversion of the next batch overlap the Python work on this one.
    """
    plan, out, phases = run.plan, run.out, run.phases
    clock = time.perf_counter
    columns = list(plan.input_columns)
    key_column = plan.key_column
    for batch in _arriving(batches, phases):
        if not batch.num_rows:
            continue
        t = clock()
        restoring = phases["restore"]
        subtasks, served, keys, rows, late_rows = _routed(run, batch)
        calls: list[tuple[int, int, int]] = []  # subtask, offset, length
        order: list[int] | None = None
        chosen = batch.select(columns)
        if len(rows) == batch.num_rows and len(served) == 1:
            calls = [(subtasks[0], 0, len(rows))]  # the usual case: all rows are one subtask's records
        elif rows:
            picked, calls = subtask_runs([subtasks[row] for row in rows])
            order = [rows[j] for j in picked]
            chosen = chosen.take(pa.array(order, pa.int64()))
        t_loop = clock()
        phases["convert"] += t_loop - t - (phases["restore"] - restoring)
        for index, offset, length in calls:
            st = run.active[index].subtask
            function, ctx = st.function, st.pctx
            assert isinstance(function, KeyedColumnsFunction) and isinstance(ctx, ColumnsContext)
            ctx.current_key = None
            ctx.timestamp = None
            run.counts[index].records += length
            some = keys if order is None else [keys[row] for row in order[offset : offset + length]]
            # Kept to see whether the keys come back unchanged as an output column (see _keys_back).
            given = some.copy() if order is None else None
            result = function.process_columns(chosen.slice(offset, length), some, ctx)
            if result is not None:
                if given is not None and type(result) is dict:
                    result = _keys_back(result, some, given, batch, key_column, offset, length)
                run.counts[index].outputs += out.add_columns(result)
        phases["records"] += clock() - t_loop
        if out.size >= FLUSH_ROWS:
            t = clock()
            flushed = out.flush()
            phases["output"] += clock() - t
            yield flushed
        if late_rows:
            yield out.late(batch, late_rows)


def _keys_back(result: dict[str, Any], some: list[Any], given: list[Any], batch: Any, key_column: str,
               offset: int, length: int) -> dict[str, Any]:  # fmt: skip
    """``result`` with the batch's own Arrow key column where a column is the keys list it was given.

    A function that emits each row's key returns the list it got (``{"url":
    keys, ...}``); converting those Python values back to Arrow would cost more
    than anything else in its output. Taken only while the list still equals
    ``given`` (a copy made before the call; the elements are compared by
    identity first, so this costs a pointer comparison per key), and for str
    and int keys, whose values always converted.
    """
    for name, column in result.items():
        if column is some:
            if some != given or not _hashes(batch.schema.field(key_column).type):
                return result
            return {**result, name: batch.column(key_column).slice(offset, length)}
    return result


def _routed(run: TaskRun, batch: Any) -> tuple[list[Any], set[int], list[Any], Sequence[int], list[int]]:
    """What a vectorized loop needs of a routed Arrow batch: subtask per row, subtasks, keys, rows, late rows.

    Rows without a key group go to the bad-records policy; marker rows and
    late rows are left out of the rows to process (late ones listed apart);
    every subtask with a row (a marker's too) is acquired, so it runs and
    snapshots. A batch that Arrow says is one subtask's records without a
    marker (the routing in the query's plan) and a job without event time
    skip the per-row lists (:func:`_routed_rows`).
    """
    plan = run.plan
    only = _one_subtask(batch) if plan.event_time is None else None
    if only is None:
        return _routed_rows(run, batch)
    n = batch.num_rows
    run.bad_keys.rows_read += n
    keys = values_of(batch.column(plan.key_column))
    _key_groups_to_backend(run.subtask(only), keys, batch)
    return [only] * n, {only}, keys, range(n), []


def _key_groups_to_backend(
    st: Subtask, keys: list[Any], batch: Any, key_column: str | None = None, *, rows: Any = None
) -> list[int] | None:
    """Hands the routing's key groups of ``keys`` (one subtask's rows of ``batch``) to its backend.

    The JVM computed them to route the rows here, so the backend hashes no key
    again. With ``key_column`` (the per-record loop) they are handed over where
    the backend takes them
    (:meth:`~statekit.state._keyed.KeyedBackendBase.hand_over_key_groups`) and
    returned: the loop then makes each key current with its group, at no cost
    per row beyond the call. Only str and int keys are handed over (they hash).
    Otherwise they are remembered
    (:meth:`~statekit.state._keyed.KeyedBackendBase.remember_key_groups`, which
    checks they are the subtask's) for ``set_current_key`` to find, and None is
    returned. A backend of its own making, not on the base, computes them
    itself: it gets nothing. ``rows`` (Arrow indices into ``batch``) says which
    rows ``keys`` are the keys of, where they are not all of its rows.
    """
    keyed = st.keyed
    if not isinstance(keyed, KeyedBackendBase) or batch.schema.get_field_index(KEY_GROUP_COLUMN) < 0:
        return None
    column = batch.column(KEY_GROUP_COLUMN)
    groups: list[int] = (column if rows is None else column.take(rows)).to_pylist()
    hashes = key_column is not None and _hashes(batch.schema.field(key_column).type)
    if hashes and keyed.hand_over_key_groups(keys, groups):
        return groups
    keyed.remember_key_groups(keys, groups)
    return None


def _hashes(typ: Any) -> bool:
    """Whether every value of an Arrow column of ``typ`` converts to a hashable Python value."""
    return bool(pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_integer(typ))


def _routed_rows(run: TaskRun, batch: Any) -> tuple[list[Any], set[int], list[Any], Sequence[int], list[int]]:
    """:func:`_routed` row by row: subtask and marker of every row as Python values."""
    plan, bad_keys = run.plan, run.bad_keys
    subtasks = batch.column(SUBTASK_COLUMN).to_pylist()
    markers = batch.column(MARKER_COLUMN).to_pylist()
    keys = values_of(batch.column(plan.key_column))
    marked = sum(markers)
    bad_keys.rows_read += len(markers) - marked
    unrouted = None in subtasks
    if unrouted:  # rows without a key group: bad records, never in a group
        _reject_unrouted(run, batch, subtasks)
    served: set[int] = {index for index in set(subtasks) if index is not None}
    for index in sorted(served):
        run.subtask(index)  # every subtask whose rows (or marker) came here runs and snapshots
    late_rows: list[int] = []
    et = plan.event_time
    rows: Sequence[int]
    if et is None and not marked and not unrouted:
        rows = range(len(subtasks))  # the usual case: every row is a record to process
    elif et is None:
        rows = [
            row
            for row, (index, marker) in enumerate(zip(subtasks, markers))
            if not marker and index is not None
        ]
    else:
        kept: list[int] = []
        times = event_times(batch, et)
        counts_of = run.counts
        for row, (index, marker) in enumerate(zip(subtasks, markers)):
            if marker or index is None:
                continue
            ts = times[row]
            if ts is not None and run.late(counts_of[index], ts, row, late_rows):
                continue
            kept.append(row)
        rows = kept
    return subtasks, served, keys, rows, late_rows


def _reject_unrouted(run: TaskRun, batch: Any, subtasks: list[int | None]) -> None:
    """The rows of ``batch`` routed to no subtask (``subtasks`` says which), to the bad-records policy."""
    bad = pa.array([row for row, index in enumerate(subtasks) if index is None], pa.int64())
    places = batch.column(PLACE_COLUMN).take(bad).to_pylist()
    rejected, _ = rows_of(batch.select(list(run.plan.input_columns)).take(bad))
    for record, place in zip(rejected, places):
        run.bad_keys.reject(record, place)


def _refuse_unconvertible(records: list[dict[str, Any]], subtasks: list[int | None]) -> None:
    """Fail on a row routed to a subtask with a value Python cannot hold (its key has one: it is bad).

    Raises:
        ValueError: Naming the value and its column.
    """
    for record, index in zip(records, subtasks):
        if index is not None:
            for name, value in record.items():
                if isinstance(value, Unconvertible):
                    raise value.describe(name)


def fire_timers(run: TaskRun) -> Iterator[Any]:
    """The batch's time: timers due at its watermark and timestamp fire, in order per subtask."""
    plan, out, clock = run.plan, run.out, time.perf_counter
    t = clock()
    fire_until = MAX_WATERMARK if plan.end_of_input else plan.watermark
    for index, open_st in sorted(run.active.items()):
        st, counts = open_st.subtask, run.counts[index]
        st.timers.set_watermark(fire_until)
        _fire(st, counts, TimeDomain.EVENT_TIME, fire_until, out)
        if plan.end_of_input:
            # The end of time lasts for this firing only (the checkpoint keeps the rows'
            # watermark): a subtask this process keeps for the next batch must not keep it.
            st.timers.end_of_time_passed(plan.watermark)
        _fire(st, counts, TimeDomain.PROCESSING_TIME, plan.batch_timestamp_ms, out)
        if out.size >= FLUSH_ROWS:
            yield out.flush()
    run.phases["timers"] += clock() - t
    if out.size:
        t = clock()
        flushed = out.flush()
        run.phases["output"] += clock() - t
        yield flushed


def _fire(st: Subtask, counts: SubtaskCounts, domain: TimeDomain, until: int, out: TaskOutput) -> None:
    """``on_timer`` for every timer of ``domain`` due at ``until``; its results into ``out``, counted."""
    before = st.timers.fired
    counts.outputs += sum(out.add_result(r) for r in fire_timer_results(st.function, st.tctx, domain, until))
    counts.fired += st.timers.fired - before


def event_times(batch: Any, et: EventTime) -> list[int | None]:
    """The event time of every row of ``batch`` in epoch ms (None where null)."""
    name = et.field
    if not isinstance(name, str):
        raise TypeError("on Spark, EventTime(field=...) names a column")
    col = batch.column(name)
    typ = col.type
    if pa.types.is_timestamp(typ):
        raw = col.cast(pa.int64()).to_pylist()
        unit = typ.unit
        if unit == "ms":
            return raw  # type: ignore[no-any-return]
        if unit == "s":
            return [None if v is None else v * 1000 for v in raw]
        div = 1000 if unit == "us" else 1_000_000
        return [None if v is None else v // div for v in raw]
    if pa.types.is_integer(typ):
        return col.to_pylist()  # type: ignore[no-any-return]
    raise TypeError(
        f"event-time column {name!r} is {typ}: use a timestamp column or epoch milliseconds as a long"
    )
