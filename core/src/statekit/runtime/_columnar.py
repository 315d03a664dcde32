"""Columnar rows for :class:`~statekit.KeyedBatchFunction`: a micro-batch grouped by key, and outputs.

Both runners hand a batch function each key's rows of a micro-batch as one
``pyarrow.RecordBatch``: :func:`group_runs` reorders a batch so that every
key's rows are contiguous (keys in order of first appearance, each key's rows
in arrival order, which is all the semantics promise), and the function gets
zero-copy slices of it. What the function returns (an Arrow batch or table, a
pandas DataFrame, or a mapping of column names to sequences) is read by
:func:`output_columns`.

pyarrow is imported lazily: only batch functions need it (``pip install
"statekit[arrow]"``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._errors import install_hint

__all__ = [
    "arrow_group_runs",
    "group_runs",
    "is_columnar",
    "output_columns",
    "output_rows",
    "require_pyarrow",
    "subtask_runs",
]


def require_pyarrow() -> Any:
    """The pyarrow module, or an error naming the extra that installs it."""
    try:
        import pyarrow as pa  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - pyarrow is installed in every test environment
        raise ImportError(
            "a KeyedBatchFunction gets its rows as Arrow record batches and needs pyarrow: "
            + install_hint("statekit[arrow]")
        ) from exc
    return pa


def group_runs(
    keys: Sequence[Any], rows: Sequence[int] | None = None, *, fallback: Callable[[Any], Any] | None = None
) -> tuple[list[int], list[tuple[Any, int, int]]]:
    """Rows grouped by key: ``(order, runs)``.

    ``order`` lists row indices so that each key's rows are contiguous; ``runs``
    holds ``(key, offset, length)`` into ``order``, keys in order of first
    appearance, each key's rows in their original order. ``rows`` restricts the
    grouping to those indices (default: all). ``fallback`` maps an unhashable key
    to a hashable stand-in (its serialized bytes) used only for grouping.
    """
    groups: dict[Any, list[int]] = {}
    firsts: dict[Any, Any] = {}
    indices = range(len(keys)) if rows is None else rows
    for i in indices:
        key = keys[i]
        try:
            group = groups.get(key)
            gkey = key
        except TypeError:
            if fallback is None:
                raise
            gkey = fallback(key)
            group = groups.get(gkey)
        if group is None:
            groups[gkey] = [i]
            firsts[gkey] = key
        else:
            group.append(i)
    order: list[int] = []
    runs: list[tuple[Any, int, int]] = []
    for gkey, group in groups.items():
        runs.append((firsts[gkey], len(order), len(group)))
        order.extend(group)
    return order, runs


def arrow_group_runs(column: Any) -> tuple[Any, list[Any], list[int], list[int]] | None:
    """:func:`group_runs` of an Arrow key column, computed by Arrow: ``(order, keys, offsets, lengths)``.

    ``order`` is an Arrow array of row indices, ``keys`` the distinct keys as
    Python values in order of first appearance, and key ``i``'s rows are
    ``order[offsets[i] : offsets[i] + lengths[i]]``, in arrival order: the same
    grouping as :func:`group_runs` gives over the column's Python values,
    without a Python step per row. Arrow numbers the distinct keys in order of
    first appearance (``dictionary_encode``), sorts the rows by that number
    (``sort_indices`` is stable) and finds where each number's run ends.

    None where Arrow's equality may not be Python's or a value does not
    convert: only a column of strings or ints without nulls is grouped here.
    """
    pa = require_pyarrow()
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    typ = column.type
    if column.null_count or not (
        pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_integer(typ)
    ):
        return None
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    encoded = column.dictionary_encode()
    try:
        keys = encoded.dictionary.to_pylist()
    except (ValueError, OverflowError, ArithmeticError, TypeError, pa.ArrowException):
        return None  # a value Python cannot hold: the caller's Python path names it
    codes = encoded.indices
    order = pc.sort_indices(codes)
    if not keys:
        return order, [], [], []
    # Sorted, the numbers run 0, 1, ... k - 1, each at least once: run i holds key i's rows.
    ends: list[int] = pc.run_end_encode(codes.take(order)).run_ends.to_pylist()
    offsets = [0, *ends[:-1]]
    return order, keys, offsets, [end - offset for offset, end in zip(offsets, ends)]


def subtask_runs(indexes: Sequence[int]) -> tuple[list[int], list[tuple[int, int, int]]]:
    """Rows grouped by subtask: ``(order, runs)`` with runs ``(subtask, offset, length)``, subtasks ascending.

    Each subtask's rows keep their arrival order (a stable sort).
    """
    order = sorted(range(len(indexes)), key=indexes.__getitem__)
    runs: list[tuple[int, int, int]] = []
    for pos, j in enumerate(order):
        index = indexes[j]
        if runs and runs[-1][0] == index:
            last = runs[-1]
            runs[-1] = (index, last[1], last[2] + 1)
        else:
            runs.append((index, pos, 1))
    return order, runs


def is_columnar(result: Any) -> bool:
    """Whether ``result`` is a batch output (Arrow, pandas or a mapping of columns), not records."""
    if isinstance(result, Mapping):
        return True
    pa = sys.modules.get("pyarrow")
    if pa is not None and isinstance(result, (pa.RecordBatch, pa.Table)):
        return True
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(result, pd.DataFrame)


def output_columns(result: Any, names: Sequence[str] | None) -> tuple[dict[str, Any], int]:
    """The columns of a batch function's output and its number of rows.

    ``names`` are the output schema's columns: a missing one, or one given as
    None, is all nulls (None here); a column not among them is an error. None keeps the result's own
    columns. Columns are Arrow arrays (from Arrow or pandas input) or the
    mapping's own values (lists, ranges, numpy arrays...).

    Raises:
        ValueError: On unknown columns or columns of different lengths.
        TypeError: If ``result`` is not a batch output.
    """
    pa = sys.modules.get("pyarrow")
    pd = sys.modules.get("pandas")
    if pd is not None and isinstance(result, pd.DataFrame):
        pa = require_pyarrow()
        result = pa.Table.from_pandas(result, preserve_index=False)
    if pa is not None and isinstance(result, (pa.RecordBatch, pa.Table)):
        columns: dict[str, Any] = dict(zip(result.schema.names, result.columns))
        n = result.num_rows
    elif isinstance(result, Mapping):
        columns = dict(result)
        lengths = {name: len(col) for name, col in columns.items() if col is not None}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"output columns have different lengths: {lengths}")
        n = next(iter(lengths.values()), 0)
    else:
        raise TypeError(
            "a KeyedBatchFunction returns a pyarrow RecordBatch or Table, a pandas DataFrame or a mapping of "
            f"column names to sequences (or None); got {type(result).__name__}"
        )
    if names is None:
        return columns, n
    unknown = [c for c in columns if c not in names]
    if unknown:
        raise ValueError(
            f"output has columns {unknown} that the output schema lacks; it has {', '.join(names)}"
        )
    return {name: columns.get(name) for name in names}, n


def output_rows(result: Any) -> list[dict[str, Any]]:
    """A batch output as records: one dict per row (what the LocalRunner's sink receives)."""
    if result is None:
        return []
    columns, n = output_columns(result, None)
    values = [[None] * n if col is None else _pylist(col) for col in columns.values()]
    names = list(columns)
    return [dict(zip(names, row)) for row in zip(*values)] if values else [{} for _ in range(n)]


def _pylist(column: Any) -> list[Any]:
    if hasattr(column, "to_pylist"):  # Arrow
        return column.to_pylist()  # type: ignore[no-any-return]
    if hasattr(column, "tolist"):  # numpy, pandas
        return column.tolist()  # type: ignore[no-any-return]
    return list(column)
