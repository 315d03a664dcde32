"""Arrow values as Python, value by value where a whole batch cannot be converted.

Arrow holds some values Python's types cannot: a timestamp past the year
9999 (or before the year 1), a date out of Python's range, and the like.
``to_pylist()`` then fails for the whole column or batch. The routing pass
and the tasks convert whole columns and batches as before (the fast path)
and only when that fails value by value, where a value that cannot be
converted becomes an :class:`Unconvertible`: in a key column it makes the
row a bad record (``statekit.bad-records.*``), as a null key does.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["Unconvertible", "rows_of", "values_of"]

#: What Arrow's conversion to Python raises for a value Python cannot hold.
_CONVERSION_ERRORS = (ValueError, OverflowError, ArithmeticError, TypeError, pa.ArrowException)


class Unconvertible:
    """A value Arrow holds and Python cannot: how Arrow prints it, and why it cannot be converted."""

    __slots__ = ("error", "text")

    def __init__(self, text: str, error: Exception) -> None:
        self.text = text
        self.error = error

    def __repr__(self) -> str:
        return f"<{self.text}: {type(self.error).__name__}: {self.error}>"

    def describe(self, column: str) -> ValueError:
        """The error of a row whose value of ``column`` this is."""
        return ValueError(
            f"value {self.text} of column {column!r} cannot be converted to Python "
            f"({type(self.error).__name__}: {self.error})"
        )


def values_of(column: Any) -> list[Any]:
    """The Python values of an Arrow array; an :class:`Unconvertible` where one cannot be converted."""
    try:
        return column.to_pylist()  # type: ignore[no-any-return]
    except _CONVERSION_ERRORS:
        return [_value(column, i) for i in range(len(column))]


def rows_of(batch: Any) -> tuple[list[dict[str, Any]], bool]:
    """The rows of an Arrow record batch as dicts, and whether every value converted.

    When one does not, its row holds an :class:`Unconvertible` in its place.
    """
    try:
        if batch.num_columns == 1:  # a dict per row built here: a quarter faster than Arrow's
            name = batch.schema.names[0]
            return [{name: value} for value in batch.column(0).to_pylist()], True
        return batch.to_pylist(), True
    except _CONVERSION_ERRORS:
        names = batch.schema.names
        columns = [values_of(batch.column(i)) for i in range(batch.num_columns)]
        return [dict(zip(names, values)) for values in zip(*columns)], False


def _value(column: Any, i: int) -> Any:
    try:
        return column[i].as_py()
    except _CONVERSION_ERRORS as e:
        return Unconvertible(_text(column, i), e)


def _text(column: Any, i: int) -> str:
    """How a message shows value ``i`` of ``column``: a time by its raw number (Arrow prints it wrong)."""
    value = column.slice(i, 1)
    try:
        if pa.types.is_temporal(value.type):
            return f"{value.cast(pa.int64())[0].as_py()} ({value.type})"
        return f"{value.cast(pa.string())[0].as_py()} ({value.type})"
    except _CONVERSION_ERRORS:
        return f"a {value.type} value"
