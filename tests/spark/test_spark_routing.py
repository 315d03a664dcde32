"""Routing on Spark: Spark SQL computes statekit's key groups, and partition i holds subtask i."""

from __future__ import annotations

import random
from typing import Any

import pytest

from statekit.backend_api import key_group_for_bytes
from statekit.checkpointing import operator_index_for_key_group
from statekit.serializers import BytesSerializer, IntSerializer, StrSerializer

STR_KEYS = [
    "",
    "a",
    "/api/1",
    "ünïcødé ✓",
    "😀 emoji",
    "x" * 5000,
    "\u0000nul",
    *(f"k{i}" for i in range(3000)),
]
INT_KEYS = [0, 1, -1, 127, -128, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)]
INT_KEYS += [random.Random(i).randint(-(2**63), 2**63 - 1) for i in range(2000)]


@pytest.mark.parametrize("max_parallelism", [128, 1000, 32768])
def test_spark_sql_key_groups_equal_statekit_key_groups(spark: Any, max_parallelism: int) -> None:
    from statekit.spark._routing import sql_key_group

    cases: list[tuple[list[Any], str, Any]] = [
        (STR_KEYS, "string", StrSerializer()),
        (INT_KEYS, "bigint", IntSerializer()),
        ([k for k in INT_KEYS if -(2**31) <= k < 2**31], "int", IntSerializer()),
        ([k for k in INT_KEYS if -128 <= k < 128], "tinyint", IntSerializer()),
    ]
    for keys, sql_type, serializer in cases:
        df = spark.createDataFrame([(k,) for k in keys], f"k {sql_type}")
        rows = sql_key_group(df, "k", serializer, max_parallelism, "kg").collect()
        got = {r["k"]: r["kg"] for r in rows}
        expected = {k: key_group_for_bytes(serializer.serialize(k), max_parallelism) for k in keys}
        assert got == expected, sql_type


@pytest.mark.parametrize("max_parallelism", [128, 32768])
def test_jvm_key_groups_equal_statekit_key_groups(spark: Any, max_parallelism: int) -> None:
    """The helper's one-call key group (what a classic session routes with) is statekit's, null for null."""
    from pyspark.sql import Column

    from statekit.spark._routing import jvm_key_group

    cases: list[tuple[list[Any], str, Any]] = [
        (STR_KEYS, "string", StrSerializer()),
        (INT_KEYS, "bigint", IntSerializer()),
        ([k for k in INT_KEYS if -(2**31) <= k < 2**31], "int", IntSerializer()),
        ([k for k in INT_KEYS if -128 <= k < 128], "tinyint", IntSerializer()),
    ]
    for keys, sql_type, serializer in cases:
        df = spark.createDataFrame([(k,) for k in [*keys, None]], f"k {sql_type}")
        key_group = jvm_key_group(spark, serializer, df.schema["k"].dataType, max_parallelism)
        assert key_group is not None, "the helper jar did not load: the routing would fall back to SQL"
        rows = df.select("k", Column(key_group(df["k"]._jc)).alias("kg")).collect()
        got = {r["k"]: r["kg"] for r in rows}
        expected = {k: key_group_for_bytes(serializer.serialize(k), max_parallelism) for k in keys}
        assert got == {**expected, None: None}, sql_type


def _partitions_hold_their_subtasks(
    spark: Any, df: Any, serializer: Any, p: int, maxp: int, in_plan: bool = False
) -> None:
    """``in_plan``: routed as in a query's plan, the task adding the subtask column from its partition."""
    import pyarrow as pa
    from pyspark import TaskContext

    from statekit.spark._routing import (
        MARKER_COLUMN,
        SUBTASK_COLUMN,
        Router,
        routes_by_id,
        routing_values,
        with_partition_columns,
    )

    routed = Router(spark, df.schema, key_column="k", serializer=serializer, parallelism=p,
                    max_parallelism=maxp, route_values=routing_values(p), markers=not in_plan,
                    partition_columns=not in_plan).route(df)  # fmt: skip
    carried = {SUBTASK_COLUMN, MARKER_COLUMN} <= set(routed.columns)
    assert carried == (not in_plan or not routes_by_id(spark)), routed.columns

    def check(batches: Any) -> Any:
        part = TaskContext.get().partitionId()
        rows = markers = 0
        ok = True
        if in_plan:
            batches = with_partition_columns(batches, part)
        for b in batches:
            subtasks = b.column(SUBTASK_COLUMN).to_pylist()
            ok = ok and all(s == part for s in subtasks)
            markers += sum(b.column(MARKER_COLUMN).to_pylist())
            rows += b.num_rows
        yield pa.RecordBatch.from_pylist(
            [{"part": part, "ok": ok, "markers": markers, "rows": rows}],
            schema=pa.schema(
                [("part", pa.int32()), ("ok", pa.bool_()), ("markers", pa.int64()), ("rows", pa.int64())]
            ),
        )

    result = sorted(routed.mapInArrow(check, "part int, ok boolean, markers long, rows long").collect())
    assert [r["part"] for r in result] == list(range(p))
    assert all(r["ok"] for r in result) and all(r["markers"] == (0 if in_plan else 1) for r in result)
    assert sum(r["rows"] for r in result) == df.count() + (0 if in_plan else p)
    # Each key's rows went to the owner of its key group.
    owners = {k: operator_index_for_key_group(maxp, p, key_group_for_bytes(serializer.serialize(k), maxp))
              for (k,) in df.collect()}  # fmt: skip
    assert set(owners.values()) <= set(range(p))


@pytest.fixture(params=["by-id", "by-hash"])
def placement(request: Any, spark: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """Rows placed by subtask id (Spark 4.1 and later) or by a routing value's hash (Spark 4.0's way)."""
    from statekit.spark import _routing

    if request.param == "by-id":
        assert _routing.routes_by_id(spark), f"Spark {spark.version} places rows by id from 4.1 on"
    else:
        monkeypatch.setattr(_routing, "routes_by_id", lambda session: False)
    return str(request.param)


@pytest.mark.parametrize("in_plan", [False, True], ids=["per-batch", "in-plan"])
@pytest.mark.parametrize("p", [1, 3, 7])
def test_partition_i_holds_subtask_i_with_sql_routing(
    spark: Any, p: int, placement: str, in_plan: bool
) -> None:
    df = spark.createDataFrame([(k,) for k in STR_KEYS[:500]], "k string")
    _partitions_hold_their_subtasks(spark, df, StrSerializer(), p, 128, in_plan)


@pytest.mark.parametrize("in_plan", [False, True], ids=["per-batch", "in-plan"])
def test_partition_i_holds_subtask_i_with_python_routing(spark: Any, placement: str, in_plan: bool) -> None:
    """Keys Spark SQL cannot serialize (here bytes) take the Python pass."""
    df = spark.createDataFrame([(k.encode(),) for k in STR_KEYS[:500]], "k binary")
    from statekit.spark._routing import supports_sql_routing

    assert not supports_sql_routing(BytesSerializer(), df.schema["k"].dataType)
    _partitions_hold_their_subtasks(spark, df, BytesSerializer(), 3, 128, in_plan)


@pytest.mark.parametrize("in_plan", [False, True], ids=["per-batch", "in-plan"])
def test_rows_without_a_key_group_land_in_one_partition(spark: Any, placement: str, in_plan: bool) -> None:
    """Null keys get no subtask: every such row of a batch goes to one task, the bad-records policy's."""
    from pyspark import TaskContext

    from statekit.spark._routing import (
        KEY_GROUP_COLUMN,
        SUBTASK_COLUMN,
        Router,
        routing_values,
        with_partition_columns,
    )

    df = spark.createDataFrame([(k,) for k in [*STR_KEYS[:200], *([None] * 50)]], "k string")
    routed = Router(spark, df.schema, key_column="k", serializer=StrSerializer(), parallelism=3,
                    max_parallelism=128, route_values=routing_values(3), markers=False,
                    partition_columns=not in_plan).route(df)  # fmt: skip

    def nulls(batches: Any) -> Any:
        import pyarrow as pa

        part = TaskContext.get().partitionId()
        if in_plan:
            batches = with_partition_columns(batches, part)
        n = without = 0
        for b in batches:
            n += b.column(KEY_GROUP_COLUMN).null_count
            without += b.column(SUBTASK_COLUMN).null_count  # what the task hands to the bad-records policy
        yield pa.RecordBatch.from_pylist([{"part": part, "n": n, "without": without}])

    rows = routed.mapInArrow(nulls, "part long, n long, without long").collect()
    got = {r["part"]: (r["n"], r["without"]) for r in rows if r["n"] or r["without"]}
    assert list(got.values()) == [(50, 50)], got


def test_int_keys_count_exactly(spark: Any, tmp_path: Any) -> None:
    from collections import Counter

    from statekit import LocalRunner
    from statekit.spark import keyed

    session = spark.newSession()
    session.conf.set("spark.statekit.checkpoints.dir", str(tmp_path / "statekit"))
    session.conf.set("spark.statekit.parallelism", "3")
    keys = [random.Random(i).choice(INT_KEYS[:40]) for i in range(2000)]
    df = session.createDataFrame(
        [(k, "GET", "/", 1) for k in keys], "url bigint, request string, u string, bytes long"
    )
    from jobs import CountUrls

    info = keyed(df, "url", key_type=int).process(CountUrls, "url bigint, n long", job_id="ints").run()
    assert info.records == len(keys)
    conf = {"statekit.checkpoints.dir": str(tmp_path / "statekit"), "statekit.parallelism": 3}
    runner = LocalRunner(CountUrls, key_selector=lambda r: r["url"], key_type=int, job_id="ints", config=conf)
    runner.restore("latest")
    from jobs import COUNT

    got = {}
    for ctx in runner.subtasks:
        kb = ctx.keyed_backend
        count = kb.get_state(COUNT)
        for key in list(kb.keys("count")):
            kb.set_current_key(key)
            got[key] = count.value()
    assert got == dict(Counter(keys))


def test_routing_hash_is_sparks_hash_of_a_bigint(spark: Any) -> None:
    # routing_values computes Spark's hash() of a bigint in Python: it must be Spark's, bit for bit.
    from pyspark.sql import functions as F

    from statekit.spark._routing import routing_values, spark_hash_long

    values = [0, 1, 2, 3, -1, -2, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32, 2**63 - 1, -(2**63),
              123456789012, -987654321098765, *range(4, 300)]  # fmt: skip
    df = spark.createDataFrame([(v,) for v in values], "x bigint")
    rows = df.select("x", F.hash("x").alias("h")).collect()
    assert {r["x"]: r["h"] for r in rows} == {v: spark_hash_long(v) for v in values}
    for p in (1, 2, 3, 7, 64, 200):
        got = routing_values(p)
        parts = spark.createDataFrame([(v,) for v in got], "x bigint").select(
            F.pmod(F.hash("x"), F.lit(p)).alias("part")
        )
        assert [r["part"] for r in parts.collect()] == list(range(p)), p
