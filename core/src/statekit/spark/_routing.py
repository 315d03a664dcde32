"""Routing: every record of a micro-batch to the Spark partition of the subtask that owns its key.

Spark's ``repartition(n, col)`` places a row in partition ``pmod(murmur3(col), n)``.
statekit's owner of a key is ``operator_index(murmur(crc32(key bytes)) % max_parallelism)``
(Flink's formulas, see :mod:`statekit._keygroups`). The two meet exactly:

1. each row gets its key group (kept in the row: tasks and savepoint writers use
   it) and subtask index ``i``: a Spark SQL expression for ``str`` and ``int``
   keys (CRC-32 and Flink's 32-bit murmur in 64-bit arithmetic that never
   overflows, so it is exact under ANSI mode), a Python pass otherwise;
2. ``i`` becomes a routing value ``x_i`` chosen once, by asking Spark itself, so
   that ``pmod(hash(x_i), p) == i``; ``repartition(p, x)`` then puts subtask ``i``'s
   rows, and only them, in partition ``i``.

One *marker* row per subtask joins the batch, so that every subtask runs (and
snapshots) even when it receives no record. Tasks never trust the partition id:
they serve every subtask whose rows they receive, and the driver checks that
each subtask reported exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .._keygroups import key_group_for_bytes
from .._serializers import IntSerializer, StrSerializer, TypeSerializer

__all__ = [
    "KEY_GROUP_COLUMN",
    "MARKER_COLUMN",
    "RESERVED_COLUMNS",
    "ROUTE_COLUMN",
    "SUBTASK_COLUMN",
    "key_group_columns",
    "route",
    "routing_values",
    "with_key_group",
    "sql_key_group",
    "supports_sql_routing",
]

KEY_GROUP_COLUMN = "__statekit_kg"
SUBTASK_COLUMN = "__statekit_subtask"
MARKER_COLUMN = "__statekit_marker"
ROUTE_COLUMN = "__statekit_route"
RESERVED_COLUMNS = (KEY_GROUP_COLUMN, SUBTASK_COLUMN, MARKER_COLUMN, ROUTE_COLUMN)

_M32 = 0xFFFFFFFF
_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


def _mul32(c: Column, m: int) -> Column:
    """``(c * m) mod 2**32`` for ``0 <= c < 2**32``, in 16-bit halves: no product reaches 2**49."""
    low = c.bitwiseAND(0xFFFF) * F.lit(m)
    high = F.shiftleft((F.shiftright(c, 16) * F.lit(m)).bitwiseAND(0xFFFF), 16)
    return (low + high).bitwiseAND(_M32)


def _rotl(c: Column, r: int) -> Column:
    return F.shiftleft(c, r).bitwiseAND(_M32).bitwiseOR(F.shiftright(c, 32 - r))


# Flink's MathUtils.murmurHash(int), one step per column so no expression is duplicated.
_MURMUR_STEPS: tuple[Callable[[Column], Column], ...] = (
    lambda c: _mul32(c, 0xCC9E2D51),
    lambda c: _rotl(c, 15),
    lambda c: _mul32(c, 0x1B873593),
    lambda c: _rotl(c, 13),
    lambda c: (c * F.lit(5) + F.lit(0xE6546B64)).bitwiseAND(_M32).bitwiseXOR(F.lit(4)),
    lambda c: c.bitwiseXOR(F.shiftright(c, 16)),
    lambda c: _mul32(c, 0x85EBCA6B),
    lambda c: c.bitwiseXOR(F.shiftright(c, 13)),
    lambda c: _mul32(c, 0xC2B2AE35),
    lambda c: c.bitwiseXOR(F.shiftright(c, 16)),
    # Java's Math.abs of the int; abs(MIN_VALUE) is MIN_VALUE, which Flink maps to 0.
    lambda c: F.when(c >= F.lit(0x80000000), F.lit(0x100000000) - c).otherwise(c).bitwiseAND(0x7FFFFFFF),
)


def supports_sql_routing(serializer: TypeSerializer, data_type: T.DataType) -> bool:
    """Whether the key's canonical bytes can be computed in Spark SQL (``str`` and ``int`` keys)."""
    if type(serializer) is StrSerializer:
        return isinstance(data_type, T.StringType)
    if type(serializer) is IntSerializer:
        return isinstance(data_type, _INTEGRAL)
    return False


def _key_bytes(key: Column, serializer: TypeSerializer) -> Column:
    if type(serializer) is StrSerializer:
        return key.cast("binary")  # Spark strings are UTF-8: the serializer's bytes
    # IntSerializer: 8 bytes, little-endian two's complement. hex() of a negative
    # long is its two's complement; swap the byte pairs of the padded hex.
    h = F.lpad(F.hex(key.cast("bigint")), 16, "0")
    return F.unhex(F.concat(*(F.substring(h, 15 - 2 * i, 2) for i in range(8))))


def key_group_columns(
    key_column: str, serializer: TypeSerializer, max_parallelism: int, out: str
) -> list[Column]:
    """Columns for one ``select`` that end in ``out``, the key group of ``key_column``.

    Each murmur step is a column of its own that the next one names (Spark's
    lateral column aliases), so no expression is duplicated and the whole chain
    is analysed once, in one projection; drop the ``<out>__h<i>`` columns after.
    """
    names = [f"{out}__h{i}" for i in range(len(_MURMUR_STEPS) + 1)]
    cols = [F.crc32(_key_bytes(F.col(key_column), serializer)).alias(names[0])]
    for i, step in enumerate(_MURMUR_STEPS):
        cols.append(step(F.col(names[i])).alias(names[i + 1]))
    cols.append(F.pmod(F.col(names[-1]), F.lit(max_parallelism)).cast("int").alias(out))
    return cols


def sql_key_group(df: DataFrame, key_column: str, serializer: TypeSerializer, max_parallelism: int,
                  out: str) -> DataFrame:  # fmt: skip
    """``df`` with column ``out``: the key group of ``key_column``, computed by Spark."""
    cols = key_group_columns(key_column, serializer, max_parallelism, out)
    return df.select("*", *cols).select(*df.columns, out)


def with_key_group(
    df: DataFrame, key_column: str, serializer: TypeSerializer, max_parallelism: int
) -> DataFrame:
    """``df`` plus :data:`KEY_GROUP_COLUMN`: by Spark SQL for ``str`` and ``int`` keys, else in Python."""
    if supports_sql_routing(serializer, df.schema[key_column].dataType):
        return sql_key_group(df, key_column, serializer, max_parallelism, KEY_GROUP_COLUMN)
    schema = T.StructType([*df.schema.fields, T.StructField(KEY_GROUP_COLUMN, T.IntegerType(), False)])
    return df.mapInArrow(_PythonKeyGroups(key_column, serializer, max_parallelism), schema)


class _PythonKeyGroups:
    """Adds the key-group column in Python, for keys Spark SQL cannot serialize (a module-level class,
    so that tasks unpickle it by reference)."""

    def __init__(self, key_column: str, serializer: TypeSerializer, max_parallelism: int):
        self.key_column = key_column
        self.serializer = serializer
        self.max_parallelism = max_parallelism

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        cache: dict[Any, int] = {}
        maxp = self.max_parallelism
        for batch in batches:
            out = []
            for key in batch.column(self.key_column).to_pylist():
                kg = cache.get(key)
                if kg is None:
                    if key is None:
                        raise ValueError(f"null key in column {self.key_column!r}: every record needs a key")
                    kg = key_group_for_bytes(self.serializer.serialize(key), maxp)
                    if len(cache) > 65536:
                        cache.clear()
                    cache[key] = kg
                out.append(kg)
            yield batch.append_column(KEY_GROUP_COLUMN, pa.array(out, type=pa.int32()))


def routing_values(session: SparkSession, parallelism: int) -> list[int]:
    """``x_i`` for each subtask ``i`` such that Spark's ``pmod(hash(x_i), p) == i``, asked of Spark."""
    found: dict[int, int] = {}
    start, size = 0, max(256, parallelism * 32)
    while len(found) < parallelism:
        rows = session.range(start, start + size, numPartitions=1).select(
            "id", F.pmod(F.hash("id"), F.lit(parallelism)).alias("part")
        )
        for row in rows.collect():
            found.setdefault(int(row["part"]), int(row["id"]))
        start, size = start + size, size * 2
    return [found[i] for i in range(parallelism)]


def route(
    df: DataFrame,
    *,
    key_column: str,
    serializer: TypeSerializer,
    parallelism: int,
    max_parallelism: int,
    route_values: list[int],
    markers: bool = True,
) -> DataFrame:
    """``df`` plus its key group and subtask, partitioned so that partition ``i`` holds subtask ``i``.

    With ``markers``, one marker row per subtask joins (nulls but for the
    subtask), so that every subtask runs even without records. A handful of
    projections, each analysed once: the routing plan costs the driver a few
    milliseconds per micro-batch, not one analysis per step.
    """
    # bigint, as in routing_values: Spark hashes an int and a bigint of one value differently.
    values = F.array(*(F.lit(v).cast("bigint") for v in route_values))
    # Flink's operator index kg * p // maxp, in integer arithmetic.
    index = F.expr(f"CAST(CAST({KEY_GROUP_COLUMN} AS BIGINT) * {parallelism} DIV {max_parallelism} AS INT)")
    rows = with_key_group(df, key_column, serializer, max_parallelism).select(
        "*",
        index.alias(SUBTASK_COLUMN),
        F.lit(False).alias(MARKER_COLUMN),
        F.element_at(values, F.col(SUBTASK_COLUMN) + F.lit(1)).alias(ROUTE_COLUMN),
    )
    if markers:
        marker_rows = df.sparkSession.range(parallelism).select(
            *(F.lit(None).cast(f.dataType).alias(f.name) for f in df.schema.fields),
            F.lit(None).cast("int").alias(KEY_GROUP_COLUMN),
            F.col("id").cast("int").alias(SUBTASK_COLUMN),
            F.lit(True).alias(MARKER_COLUMN),
            F.element_at(values, F.col("id").cast("int") + F.lit(1)).alias(ROUTE_COLUMN),
        )
        rows = rows.union(marker_rows)
    return rows.repartition(parallelism, ROUTE_COLUMN)
