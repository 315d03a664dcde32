"""Routing: every record of a micro-batch to the Spark partition of the subtask that owns its key.

Spark's ``repartition(n, col)`` places a row in partition ``pmod(murmur3(col), n)``.
statekit's owner of a key is ``operator_index(murmur(crc32(key bytes)) % max_parallelism)``
(Flink's formulas, see :mod:`statekit.serialization._keygroups`). The two meet exactly:

1. each row gets its key group (kept in the row: tasks and savepoint writers use
   it) and subtask index ``i``: a Spark SQL expression for ``str`` and ``int``
   keys (CRC-32 and Flink's 32-bit murmur in 64-bit arithmetic that never
   overflows, so it is exact under ANSI mode), a Python pass otherwise;
2. ``repartitionById(p, i)`` (Spark 4.1 and later) puts subtask ``i``'s rows, and
   only them, in partition ``i``. On Spark 4.0, ``i`` becomes a routing value
   ``x_i`` chosen once, computed as Spark computes ``hash``
   (:func:`spark_hash_long`), so that ``pmod(hash(x_i), p) == i``, and
   ``repartition(p, x)`` does the same, with one more column in every shuffled
   row to hash (a 40k-row batch's routing: 117-127 ms against 112-114 ms by id).

Every subtask runs (and snapshots) even when it receives no record. Where the
routing is part of the streaming query's plan (see ``MicroBatchDriver.streamed``),
the task of partition ``i`` serves subtask ``i`` with or without rows (Spark runs
a task per shuffle partition, empty ones included). Where each micro-batch is
routed on its own, one *marker* row per subtask joins it instead and the tasks
do not rely on the partition id. Either way a task serves every subtask whose
rows it receives, and the driver checks that each subtask reported exactly once.

A row without a key group (its key is null, a value Arrow cannot convert to
Python, or a Python key its serializer refuses) gets no subtask (and a null
routing value), so every such row of a micro-batch lands in one partition
(Spark sends every null id to partition 0, and hashes every null alike),
whose task hands it to the bad-records
policy (``statekit.bad-records.*``) with its place: the file
``input_file_name()`` names for a file source, read before the shuffle, in
:data:`PLACE_COLUMN`, and the micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from ..serialization._keygroups import _rotl as _rotl_int
from ..serialization._keygroups import key_group_for_bytes
from ..serialization._serializers import IntSerializer, StrSerializer, TypeSerializer
from ._arrow_values import Unconvertible, values_of
from ._sparkconf import is_connect

__all__ = [
    "KEY_GROUP_COLUMN",
    "MARKER_COLUMN",
    "PLACE_COLUMN",
    "RESERVED_COLUMNS",
    "ROUTE_COLUMN",
    "SUBTASK_COLUMN",
    "Router",
    "jvm_seq",
    "key_group_exprs",
    "quote",
    "routes_by_id",
    "routing_values",
    "spark_hash_long",
    "sql_key_group",
    "supports_sql_routing",
    "with_key_group",
    "with_partition_columns",
]

KEY_GROUP_COLUMN = "__statekit_kg"
SUBTASK_COLUMN = "__statekit_subtask"
MARKER_COLUMN = "__statekit_marker"
ROUTE_COLUMN = "__statekit_route"
#: Where a row without a key group came from (the input file, if Spark knows it); null on the others.
PLACE_COLUMN = "__statekit_place"
RESERVED_COLUMNS = (KEY_GROUP_COLUMN, SUBTASK_COLUMN, MARKER_COLUMN, ROUTE_COLUMN, PLACE_COLUMN)

_FILE_COLUMN = "__statekit_file"  # the input file of every row, before the Python key-group pass
_M32 = 0xFFFFFFFF
_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


def _mul32(c: str, m: int) -> str:
    """``(c * m) mod 2**32`` for ``0 <= c < 2**32``, in 16-bit halves: no product reaches 2**49."""
    return f"((({c} & 65535) * {m}) + shiftleft((shiftright({c}, 16) * {m}) & 65535, 16)) & {_M32}"


def _rotl(c: str, r: int) -> str:
    return f"(shiftleft({c}, {r}) & {_M32}) | shiftright({c}, {32 - r})"


# Flink's MathUtils.murmurHash(int) as Spark SQL, one step per column so no expression is duplicated.
_MURMUR_STEPS: tuple[Callable[[str], str], ...] = (
    lambda c: _mul32(c, 0xCC9E2D51),
    lambda c: _rotl(c, 15),
    lambda c: _mul32(c, 0x1B873593),
    lambda c: _rotl(c, 13),
    lambda c: f"(({c} * 5 + {0xE6546B64}) & {_M32}) ^ 4",
    lambda c: f"{c} ^ shiftright({c}, 16)",
    lambda c: _mul32(c, 0x85EBCA6B),
    lambda c: f"{c} ^ shiftright({c}, 13)",
    lambda c: _mul32(c, 0xC2B2AE35),
    lambda c: f"{c} ^ shiftright({c}, 16)",
    # Java's Math.abs of the int; abs(MIN_VALUE) is MIN_VALUE, which Flink maps to 0.
    lambda c: f"(CASE WHEN {c} >= {0x80000000} THEN {0x100000000} - {c} ELSE {c} END) & {0x7FFFFFFF}",
)


def quote(name: str) -> str:
    """A column name as a Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def routes_by_id(session: SparkSession) -> bool:
    """Whether ``session``'s Spark places rows by a partition id (``repartitionById``: Spark 4.1 and later).

    The version is the JVM's (a Connect server's for a Connect session); the
    client must have the method too.
    """
    try:
        major, minor = (int(part) for part in session.version.split(".")[:2])
    except ValueError:  # a version Spark never gave: take the way every version has
        return False
    return (major, minor) >= (4, 1) and hasattr(DataFrame, "repartitionById")


def supports_sql_routing(serializer: TypeSerializer, data_type: T.DataType) -> bool:
    """Whether the key's canonical bytes can be computed in Spark SQL (``str`` and ``int`` keys)."""
    if type(serializer) is StrSerializer:
        return isinstance(data_type, T.StringType)
    if type(serializer) is IntSerializer:
        return isinstance(data_type, _INTEGRAL)
    return False


def key_group_exprs(key_column: str, serializer: TypeSerializer, max_parallelism: int, out: str) -> list[str]:
    """SQL expressions for one ``selectExpr`` that end in ``out``, the key group of ``key_column``.

    Each murmur step is a column of its own that the next one names (Spark's
    lateral column aliases), so no expression is duplicated. They are text:
    the JVM parses and analyses them in one call, instead of the thousand Py4J
    calls that building the same expressions as Columns costs. Drop the
    ``<out>__*`` columns after.
    """
    names = [f"{out}__h{i}" for i in range(len(_MURMUR_STEPS) + 1)]
    key = quote(key_column)
    exprs = []
    if type(serializer) is StrSerializer:
        key_bytes = f"CAST({key} AS BINARY)"  # Spark strings are UTF-8: the serializer's bytes
    else:
        # IntSerializer: 8 bytes, little-endian two's complement. hex() of a negative
        # long is its two's complement; swap the byte pairs of the padded hex.
        exprs.append(f"lpad(hex(CAST({key} AS BIGINT)), 16, '0') AS {out}__hex")
        key_bytes = f"unhex(concat({', '.join(f'substring({out}__hex, {15 - 2 * i}, 2)' for i in range(8))}))"
    exprs.append(f"crc32({key_bytes}) AS {names[0]}")
    for i, step in enumerate(_MURMUR_STEPS):
        exprs.append(f"{step(names[i])} AS {names[i + 1]}")
    exprs.append(f"CAST(pmod({names[-1]}, {max_parallelism}) AS INT) AS {out}")
    return exprs


def sql_key_group(df: DataFrame, key_column: str, serializer: TypeSerializer, max_parallelism: int,
                  out: str) -> DataFrame:  # fmt: skip
    """``df`` with column ``out``: the key group of ``key_column``, computed by Spark."""
    exprs = key_group_exprs(key_column, serializer, max_parallelism, out)
    return df.selectExpr("*", *exprs).select(*df.columns, out)


def with_key_group(
    df: DataFrame, key_column: str, serializer: TypeSerializer, max_parallelism: int
) -> DataFrame:
    """``df`` plus :data:`KEY_GROUP_COLUMN`: by Spark SQL for ``str`` and ``int`` keys, else in Python.

    The key group is null where the key is null or (in Python) its serializer refuses it.
    """
    if supports_sql_routing(serializer, df.schema[key_column].dataType):
        return sql_key_group(df, key_column, serializer, max_parallelism, KEY_GROUP_COLUMN)
    schema = T.StructType([*df.schema.fields, T.StructField(KEY_GROUP_COLUMN, T.IntegerType(), True)])
    return df.mapInArrow(_PythonKeyGroups(key_column, serializer, max_parallelism), schema)


class _PythonKeyGroups:
    """Adds the key-group column in Python, for keys Spark SQL cannot serialize (a module-level class,
    so that tasks unpickle it by reference). A null key, one Python cannot hold (a timestamp past the
    year 9999) or one the serializer refuses gets a null key group: the task that receives the row
    applies the bad-records policy to it."""

    def __init__(self, key_column: str, serializer: TypeSerializer, max_parallelism: int):
        self.key_column = key_column
        self.serializer = serializer
        self.max_parallelism = max_parallelism

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        cache: dict[Any, int] = {}
        maxp = self.max_parallelism
        for batch in batches:
            out: list[int | None] = []
            for key in values_of(batch.column(self.key_column)):
                if isinstance(key, Unconvertible):  # Python has no such value: no key group
                    out.append(None)
                    continue
                try:
                    kg = cache.get(key)
                except TypeError:  # unhashable (a dict for a dataclass key): no key the serializer takes
                    out.append(None)
                    continue
                if kg is None and key is not None:
                    try:
                        kg = key_group_for_bytes(self.serializer.serialize(key), maxp)
                    except Exception:  # noqa: BLE001 - the task names the error in the bad record
                        out.append(None)
                        continue
                    if len(cache) > 65536:
                        cache.clear()
                    cache[key] = kg
                out.append(kg)
            yield batch.append_column(KEY_GROUP_COLUMN, pa.array(out, type=pa.int32()))


def _mix_k1(k1: int) -> int:
    return (_rotl_int((k1 * 0xCC9E2D51) & _M32, 15) * 0x1B873593) & _M32


def _mix_h1(h1: int, k1: int) -> int:
    return (_rotl_int(h1 ^ k1, 13) * 5 + 0xE6546B64) & _M32


def spark_hash_long(value: int, seed: int = 42) -> int:
    """Spark's ``hash`` of a ``bigint`` (``Murmur3Hash``, seed 42): ``Murmur3_x86_32.hashLong``, signed.

    ``repartition(p, col)`` places a row in partition ``pmod(hash(col), p)``; Spark
    keeps this hash fixed (bucketed tables depend on it). Routing tests check it
    against Spark's own ``hash`` and partition ids.
    """
    v = value & 0xFFFFFFFFFFFFFFFF
    h1 = _mix_h1(seed & _M32, _mix_k1(v & _M32))
    h1 = _mix_h1(h1, _mix_k1(v >> 32)) ^ 8
    h1 = ((h1 ^ (h1 >> 16)) * 0x85EBCA6B) & _M32
    h1 = ((h1 ^ (h1 >> 13)) * 0xC2B2AE35) & _M32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def routing_values(parallelism: int) -> list[int]:
    """``x_i`` for each subtask ``i`` such that Spark's ``pmod(hash(x_i), p) == i`` (``x_i`` a bigint).

    The smallest such non-negative ``x_i``, computed as Spark computes ``hash``
    (:func:`spark_hash_long`): no Spark job, where asking Spark cost every query
    start one (a third of a second on an idle machine).
    """
    found: dict[int, int] = {}
    x = 0
    while len(found) < parallelism:
        found.setdefault(spark_hash_long(x) % parallelism, x)  # Python's % of a positive p is pmod
        x += 1
    return [found[i] for i in range(parallelism)]


def jvm_key_group(session: SparkSession, serializer: TypeSerializer, data_type: T.DataType,
                  max_parallelism: int) -> Callable[[Any], Any] | None:  # fmt: skip
    """The key group as one JVM call (statekit's helper jar), for keys SQL routing takes; None without it.

    Returns a function from a JVM ``Column`` (the key) to the JVM ``Column`` of
    its key group. The SQL expression (:func:`key_group_exprs`) computes the
    same value, exactly, in a dozen steps whose analysis costs the driver tens
    of milliseconds every micro-batch; without the helper (a Connect session,
    an installation without its jar) the routing uses that.
    """
    from ._jvm import LocalityUnavailable, load_helper_class

    if is_connect(session) or not supports_sql_routing(serializer, data_type):
        return None
    try:
        cls = load_helper_class(session, "KeyGroups")
    except LocalityUnavailable:
        return None
    name = "ofString" if isinstance(data_type, T.StringType) else "ofLong"
    method = next(m for m in cls.getMethods() if m.getName() == name)
    gateway: Any = session.sparkContext._gateway
    jvm: Any = session.sparkContext._jvm

    def key_group(key: Any) -> Any:
        params = gateway.new_array(jvm.java.lang.Object, 2)
        params[0] = key
        params[1] = max_parallelism
        return method.invoke(None, params)

    return key_group


class Router:
    """Routes the micro-batches of one query run: everything that does not depend on the rows, made once.

    The routing expressions and the marker rows are built for the input's
    schema when the router is made, as JVM columns ready to project, so that
    routing a batch costs three Py4J calls (a ``select``, a ``union`` and a
    ``repartition``) on a classic session, not the parsing and analysis of
    freshly written expressions. The key group is one call into statekit's
    JVM helper (:func:`jvm_key_group`) where it is loaded, else Spark SQL.

    ``partition_columns=False`` (without ``markers``) is for a routing in the
    query's plan, where partition ``i`` is subtask ``i``: on a Spark that places
    rows by id, the shuffle places them by the subtask's expression and the rows
    do not carry the subtask and marker columns through it; the task adds both
    from its partition id (:func:`with_partition_columns`): two columns fewer in
    every shuffled and converted row (measured in docs/spark.md, "Where the
    JVM's extra goes").
    """

    def __init__(
        self,
        session: SparkSession,
        schema: T.StructType,
        *,
        key_column: str,
        serializer: TypeSerializer,
        parallelism: int,
        max_parallelism: int,
        route_values: list[int],
        markers: bool = True,
        partition_columns: bool = True,
    ) -> None:
        self.key_column = key_column
        self.serializer = serializer
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.columns = [quote(n) for n in schema.names]
        self.sql = supports_sql_routing(serializer, schema[key_column].dataType)
        self.key_group = (
            key_group_exprs(key_column, serializer, max_parallelism, KEY_GROUP_COLUMN) if self.sql else []
        )
        #: Rows placed by their subtask index itself (no routing value: see the module doc).
        self.by_id = routes_by_id(session)
        if not partition_columns and markers:
            raise ValueError("a routing without partition columns has no marker rows")
        #: The rows carry their subtask and marker columns (else the task adds them: by id only).
        self.partition_columns = partition_columns or not self.by_id
        # bigint, as in routing_values: Spark hashes an int and a bigint of one value differently.
        values = ", ".join(f"CAST({v} AS BIGINT)" for v in route_values)
        # Flink's operator index kg * p // maxp, in integer arithmetic.
        index = f"CAST(CAST({KEY_GROUP_COLUMN} AS BIGINT) * {parallelism} DIV {max_parallelism} AS INT)"
        # Read before the shuffle, where the scan still knows its file; only for rows without a key.
        place = f"CASE WHEN {KEY_GROUP_COLUMN} IS NULL THEN {{file}} END AS {PLACE_COLUMN}"
        route = [] if self.by_id else [f"element_at(array({values}), {SUBTASK_COLUMN} + 1) AS {ROUTE_COLUMN}"]
        #: The subtask of a row, an expression of its key group (Flink's operator index).
        self.index = index
        partition = (
            [f"{index} AS {SUBTASK_COLUMN}", f"false AS {MARKER_COLUMN}"] if self.partition_columns else []
        )
        self.tail = [
            *partition,
            *route,
            place.format(file="nullif(input_file_name(), '')" if self.sql else _FILE_COLUMN),
        ]
        self.keep = [
            *self.columns,
            KEY_GROUP_COLUMN,
            *([SUBTASK_COLUMN, MARKER_COLUMN] if self.partition_columns else []),
            *([] if self.by_id else [ROUTE_COLUMN]),
            PLACE_COLUMN,
        ]
        self.marker_rows: DataFrame | None = None
        # A classic session's batches are routed by JVM calls on prepared column lists (see route).
        self._select: Any = None
        self._keep: Any = None
        self._route: Any = None
        if self.sql and not is_connect(session):
            self._prepare_jvm(session, schema, key_column, serializer, max_parallelism)
        if markers:
            # One partition: one small task in the scan stage, not one per subtask.
            self.marker_rows = session.range(0, parallelism, 1, 1).selectExpr(
                *(f"CAST(NULL AS {f.dataType.simpleString()}) AS {quote(f.name)}" for f in schema.fields),
                f"CAST(NULL AS INT) AS {KEY_GROUP_COLUMN}",
                f"CAST(id AS INT) AS {SUBTASK_COLUMN}",
                f"true AS {MARKER_COLUMN}",
                *(
                    []
                    if self.by_id
                    else [f"element_at(array({values}), CAST(id AS INT) + 1) AS {ROUTE_COLUMN}"]
                ),
                f"CAST(NULL AS STRING) AS {PLACE_COLUMN}",
            )

    def _prepare_jvm(self, session: SparkSession, schema: T.StructType, key_column: str,
                     serializer: TypeSerializer, max_parallelism: int) -> None:  # fmt: skip
        """The JVM columns :meth:`route` projects: made (parsed) once, reused by every batch."""
        sc = session.sparkContext
        functions: Any = sc._jvm.org.apache.spark.sql.functions  # type: ignore[union-attr]
        key_group = jvm_key_group(session, serializer, schema[key_column].dataType, max_parallelism)
        if key_group is not None:
            # The columns, the key group (one call), then the tail naming it (a lateral alias).
            head = [functions.col(c) for c in self.columns]
            head.append(key_group(functions.col(quote(key_column))).alias(KEY_GROUP_COLUMN))
            self._select = jvm_seq(sc, head + [functions.expr(e) for e in self.tail])
        else:
            exprs = ["*", *self.key_group, *self.tail]
            self._select = jvm_seq(sc, [functions.expr(e) for e in exprs])
            self._keep = jvm_seq(sc, [functions.col(c) for c in self.keep])
        self._route = (
            (functions.col(SUBTASK_COLUMN) if self.partition_columns else functions.expr(self.index))
            if self.by_id
            else jvm_seq(sc, [functions.col(ROUTE_COLUMN)])
        )

    def route(self, df: DataFrame) -> DataFrame:
        """``df`` (of the router's schema) plus key group and subtask; partition ``i`` holds subtask ``i``."""
        if self._select is not None and hasattr(df, "_jdf"):
            jdf: Any = df._jdf.select(self._select)
            if self._keep is not None:
                jdf = jdf.select(self._keep)
            if self.marker_rows is not None:
                jdf = jdf.union(self.marker_rows._jdf)
            if self.by_id:
                return DataFrame(jdf.repartitionById(self.parallelism, self._route), df.sparkSession)
            return DataFrame(jdf.repartition(self.parallelism, self._route), df.sparkSession)
        if self.sql:
            rows = df.selectExpr("*", *self.key_group, *self.tail).select(*self.keep)
        else:
            # The Python pass runs apart from the scan: the file is read before it, for every row.
            named = df.selectExpr("*", f"nullif(input_file_name(), '') AS {_FILE_COLUMN}")
            keyed = with_key_group(named, self.key_column, self.serializer, self.max_parallelism)
            rows = keyed.selectExpr("*", *self.tail).select(*self.keep)
        if self.marker_rows is not None:
            rows = rows.union(self.marker_rows)
        if self.by_id:
            from pyspark.sql import functions as F  # the driver's: tasks import this module too

            by = SUBTASK_COLUMN if self.partition_columns else F.expr(self.index)
            return rows.repartitionById(self.parallelism, by)
        return rows.repartition(self.parallelism, ROUTE_COLUMN)


def with_partition_columns(batches: Iterator[Any], partition: int) -> Iterator[Any]:
    """The rows of partition ``partition`` of a routing in the query's plan, with subtask and marker columns.

    A routing without partition columns (see :class:`Router`) leaves them to the
    task: a row's subtask is its partition, or null where it has no key group
    (every such row lands in partition 0, see the module doc), and no row is a
    marker. Batches that carry them already pass as they are.
    """
    subtask = pa.scalar(partition, pa.int32())
    for batch in batches:
        if batch.schema.get_field_index(SUBTASK_COLUMN) >= 0:
            yield batch
            continue
        n = batch.num_rows
        groups = batch.column(KEY_GROUP_COLUMN)
        subtasks = (
            pa.repeat(subtask, n)
            if not groups.null_count
            else pc.if_else(pc.is_valid(groups), subtask, pa.scalar(None, pa.int32()))
        )
        yield batch.append_column(SUBTASK_COLUMN, subtasks).append_column(
            MARKER_COLUMN, pa.repeat(pa.scalar(False), n)
        )


def jvm_seq(sc: Any, columns: list[Any]) -> Any:
    """A JVM Scala ``Seq`` of JVM columns (converted once: every element costs a Py4J call)."""
    from pyspark.sql.classic.column import _to_seq

    return _to_seq(sc, columns)
