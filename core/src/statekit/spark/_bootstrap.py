"""Bootstrapping a savepoint from Spark DataFrames, written in parallel by key group.

Two Spark stages, no collect of state to the driver:

1. per state, rows are routed to the partition of the subtask that owns their
   key (the key group computed by Spark SQL for ``str`` and ``int`` keys, as
   the runner routes records) and sorted by key group; each task turns its
   key groups' rows into the canonical format's sections;
2. the sections of every state are routed by subtask again and each task
   writes its subtask's file through the savepoint's writer (shipped to the
   task), checks it back, and returns its metadata entry.

The driver writes ``_metadata`` last, so a failed job leaves no savepoint.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .._contracts import CheckpointStorage, CheckpointWriter
from .._errors import ConfigurationError, StateError
from ..checkpoints._locations import filesystem_storage
from ..checkpoints._metadata import SubtaskState
from ..checkpoints._writing import complete_checkpoint, write_keyed_file
from ..serialization._keygroups import (
    KeyGroupRange,
    key_group_range_for_operator,
    validate_parallelism,
)
from ..serialization._serializers import IntSerializer, StrSerializer, TypeSerializer
from ..snapshots._snapshot import SnapshotHeader
from ..state._registered import RegisteredState
from ..state._state import StateDescriptor
from ..state_processor._arrow import arrow_column
from ..state_processor._writer import (
    BOOTSTRAP_BACKEND,
    canonical_writer,
    encode_section,
    state_columns,
    stored_entries,
    verify_written,
)
from ._routing import KEY_GROUP_COLUMN, RESERVED_COLUMNS, ROUTE_COLUMN, Router, routing_values
from ._sparkconf import default_parallelism

__all__ = ["write_savepoint"]

_SECTIONS = T.StructType(
    [
        T.StructField("subtask", T.IntegerType(), False),
        T.StructField("key_group", T.IntegerType(), False),
        T.StructField("state", T.IntegerType(), False),
        T.StructField("entries", T.LongType(), False),
        T.StructField("keys", T.BinaryType(), False),
        T.StructField("namespaces", T.BinaryType(), False),
        T.StructField("values", T.BinaryType(), False),
    ]
)
_FILES = T.StructType(
    [T.StructField("subtask", T.IntegerType(), False), T.StructField("keyed", T.StringType())]
)


def write_savepoint(
    target_dir: str,
    states: Mapping[StateDescriptor, DataFrame],
    *,
    operator: str = "process",
    max_parallelism: int = 128,
    parallelism: int | None = None,
    key_serializer: TypeSerializer | None = None,
    namespace_serializers: Mapping[str, TypeSerializer] | None = None,
    job_id: str = "bootstrap",
    storage: CheckpointStorage | None = None,
    storage_options: str | Mapping[str, Any] | None = None,
    now_ms: int | None = None,
) -> str:
    """Write a canonical savepoint of ``operator``'s keyed states from DataFrames; returns its location.

    Each DataFrame has the columns :meth:`statekit.state_processor.SavepointReader.read`
    gives for its state (``key``, ``value``, and ``namespace``, ``position``,
    ``user_key``, ``last_access`` where they apply), so a state read with the
    ``statekit-state`` data source can be written back. A job starts from the
    result with ``restore=<location>``, on any backend.

    From a Spark Connect client the savepoint is opened and completed by the
    client, so ``target_dir`` must be reachable from the client as well as
    from the executors.

    Args:
        target_dir: The directory (any fsspec URL the executors can reach) to
            create ``savepoint-<job>-<hex>`` in.
        states: Each state's descriptor and its rows.
        parallelism: Files (and Spark tasks) per stage; default Spark's default
            parallelism, at most ``max_parallelism``.
        key_serializer: The keys' serializer; default ``str`` for string keys,
            ``int`` for integral ones.
        namespace_serializers: Per state name, for states with namespaces.

    Raises:
        ConfigurationError: On a storage the executors cannot write to, or a bad parallelism.
        StateError: On missing columns or duplicate keys (nothing is completed).
    """
    if not states:
        raise ConfigurationError("write_savepoint needs at least one state")
    frames = list(states.items())
    session = frames[0][1].sparkSession
    p = parallelism or min(max_parallelism, default_parallelism(session))
    validate_parallelism(p, max_parallelism)
    metas = _metas(frames, dict(namespace_serializers or {}))
    ks = key_serializer or _default_key_serializer(frames[0][1].schema["key"].dataType)
    store = storage or filesystem_storage(target_dir, storage_options=storage_options)
    if type(store).__name__ == "JobManagerCheckpointStorage":
        raise ConfigurationError(
            "write_savepoint writes from Spark's executors; the jobmanager storage lives in one process: "
            "give a filesystem location (any fsspec URL the executors reach)"
        )
    writer = store.begin_savepoint(job_id, target_dir)
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    try:
        route_values = routing_values(p)
        sections = _sections(frames, metas, ks, now, p, max_parallelism, route_values)
        return _write_files(
            sections, store, writer, job_id, operator, ks, metas, max_parallelism, route_values
        )
    except BaseException:
        writer.abort()
        raise


def _write_files(
    sections: DataFrame,
    store: CheckpointStorage,
    writer: CheckpointWriter,
    job_id: str,
    operator: str,
    ks: TypeSerializer,
    metas: list[Any],
    max_parallelism: int,
    route_values: list[int],
) -> str:
    """Stage 2: every subtask's sections into its file, then ``_metadata``; the savepoint's location."""
    p = len(route_values)
    values = F.array(*(F.lit(v).cast("bigint") for v in route_values))
    files = (
        sections.withColumn(ROUTE_COLUMN, F.element_at(values, F.col("subtask") + F.lit(1)))
        .repartition(p, ROUTE_COLUMN)
        .drop(ROUTE_COLUMN)
        .mapInArrow(_WriteFiles(store, writer, operator, ks.config(), metas, max_parallelism, p), _FILES)
    )
    written = {int(r["subtask"]): json.loads(r["keyed"]) for r in files.collect()}
    subtasks = []
    for i in range(p):
        sub = SubtaskState(operator, i, key_group_range_for_operator(max_parallelism, p, i))
        if i in written:
            sub.keyed, sub.states = written[i], list(metas)
        subtasks.append(sub)
    return complete_checkpoint(
        writer,
        job_id=job_id,
        checkpoint_id=0,
        max_parallelism=max_parallelism,
        subtasks=subtasks,
        kind="savepoint",
        properties={"bootstrapped_by": "statekit.spark.write_savepoint"},
    )


def _metas(frames: list[tuple[StateDescriptor, DataFrame]], ns_sers: dict[str, TypeSerializer]) -> list[Any]:
    """Each state's metadata, once its DataFrame is known to have the columns its kind needs.

    Raises:
        StateError: Naming the state and the columns it lacks.
    """
    metas = []
    for desc, df in frames:
        meta = RegisteredState.of(desc, ns_sers.get(desc.name)).meta()
        missing = [c for c in state_columns(meta) if c not in df.columns and c != "last_access"]
        if missing:
            raise StateError(
                f"state {desc.name!r}: the DataFrame lacks columns {missing}; a {meta['kind']} state takes "
                f"{state_columns(meta)}, as the statekit-state data source reads it"
            )
        metas.append(meta)
    return metas


def _sections(
    frames: list[tuple[StateDescriptor, DataFrame]],
    metas: list[Any],
    ks: TypeSerializer,
    now: int,
    p: int,
    max_parallelism: int,
    route_values: list[int],
) -> DataFrame:
    """Stage 1 of every state: its rows routed to their subtask, sorted by key group, made sections."""
    session = frames[0][1].sparkSession
    sections = None
    for idx, ((_, df), meta) in enumerate(zip(frames, metas)):
        router = Router(
            session, df.schema, key_column="key", serializer=ks, parallelism=p,
            max_parallelism=max_parallelism, route_values=route_values, markers=False,
        )  # fmt: skip
        encoded = (
            router.route(df)
            .sortWithinPartitions(KEY_GROUP_COLUMN)
            .mapInArrow(_EncodeSections(idx, meta, ks.config(), now, p, max_parallelism), _SECTIONS)
        )
        sections = encoded if sections is None else sections.unionByName(encoded)
    assert sections is not None
    return sections


def _default_key_serializer(key_type: T.DataType) -> TypeSerializer:
    if isinstance(key_type, T.StringType):
        return StrSerializer()
    if isinstance(key_type, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
        return IntSerializer()
    raise ConfigurationError(
        f"keys of Spark type {key_type}: pass key_serializer= (string keys default to str, integral "
        "ones to int)"
    )


class _EncodeSections:
    """Stage 1: one state's rows of a subtask, sorted by key group, into sections."""

    def __init__(
        self, index: int, meta: dict[str, Any], key_config: dict[str, Any], now: int, p: int, maxp: int
    ) -> None:
        self.index, self.meta, self.key_config, self.now, self.p, self.maxp = (
            index,
            meta,
            key_config,
            now,
            p,
            maxp,
        )

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        got = list(batches)
        if not got:
            return
        table = pa.Table.from_batches(got)
        if table.num_rows == 0:
            return
        keys = arrow_column(self.key_config).serializer
        ns_cfg = self.meta.get("namespace_serializer")
        ns = None if ns_cfg is None else arrow_column(ns_cfg).serializer
        stored = arrow_column(self.meta["stored_serializer"]).serializer
        kgs = table.column(KEY_GROUP_COLUMN).to_pylist()
        data = table.drop_columns([c for c in RESERVED_COLUMNS if c in table.column_names])
        out: dict[str, list[Any]] = {f.name: [] for f in _SECTIONS.fields}
        start = 0
        for end in range(1, len(kgs) + 1):
            if end < len(kgs) and kgs[end] == kgs[start]:
                continue
            kg = kgs[start]
            entries, _ = stored_entries(self.meta, data.slice(start, end - start), self.now)
            n, k, s, v = encode_section(entries, keys, ns, stored, self.meta["name"])
            for name, value in zip(
                out, ((kg * self.p) // self.maxp, kg, self.index, n, k, s, v), strict=True
            ):
                out[name].append(value)
            start = end
        yield pa.RecordBatch.from_pydict(out, schema=_arrow_schema(_SECTIONS))


class _WriteFiles:
    """Stage 2: every state's sections of a subtask into its canonical file."""

    def __init__(
        self,
        storage: CheckpointStorage,
        writer: CheckpointWriter,
        operator: str,
        key_config: dict[str, Any],
        metas: list[dict[str, Any]],
        maxp: int,
        p: int,
    ) -> None:
        self.storage, self.writer, self.operator = storage, writer, operator
        self.key_config, self.metas, self.maxp, self.p = key_config, metas, maxp, p

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        blocks: dict[int, dict[int, list[tuple[int, tuple[int, bytes, bytes, bytes]]]]] = {}
        for batch in batches:
            cols = [batch.column(f.name).to_pylist() for f in _SECTIONS.fields]
            for sub, kg, idx, n, k, s, v in zip(*cols, strict=True):
                blocks.setdefault(sub, {}).setdefault(kg, []).append((idx, (n, k, s, v)))
        out: dict[str, list[Any]] = {"subtask": [], "keyed": []}
        for sub, by_kg in blocks.items():
            kgr: KeyGroupRange = key_group_range_for_operator(self.maxp, self.p, sub)
            header = SnapshotHeader(self.maxp, kgr, self.key_config, self.metas, backend=BOOTSTRAP_BACKEND)
            keyed = write_keyed_file(
                self.writer, f"{self.operator}-{sub}.keyed", header, canonical_writer(header, by_kg)
            )
            state = SubtaskState(self.operator, sub, kgr, keyed, None, list(self.metas))
            verify_written(self.storage, self.writer.location, state)
            out["subtask"].append(sub)
            out["keyed"].append(json.dumps(keyed))
        if out["subtask"]:
            yield pa.RecordBatch.from_pydict(out, schema=_arrow_schema(_FILES))


def _arrow_schema(schema: T.StructType) -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema)
