"""State as data on Spark: a checkpoint's or savepoint's keyed state read as a DataFrame.

A Spark Python data source (``spark.read.format("statekit-state")``) over
:class:`~statekit.state_processor.SavepointReader`. A canonical snapshot is one
file per subtask with one checksummed block per key group, and the metadata
holds every block's offset; so a Spark partition is a run of key-group blocks
of one or more subtask files, planned from the metadata alone, and each task
reads only its blocks. Native snapshots (``rocksdb`` incremental checkpoints)
are read through their backend, which restores a whole subtask: their
partitions are whole subtasks.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql import SparkSession
from pyspark.sql import types as T
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from .._errors import ConfigurationError, CorruptSnapshotError, StateError
from ..snapshots._snapshot import CANONICAL_FORMAT
from ..state_processor import SavepointReader
from ..state_processor._arrow import ENCODING_KEY
from ..timers import TIMER_STATE_NAMES
from ..timers._service import TimeDomain

__all__ = ["SOURCE_NAME", "StateDataSource", "StatePartition", "register_state_source"]

#: The data source's short name: ``spark.read.format("statekit-state")``.
SOURCE_NAME = "statekit-state"
#: Default of ``maxKeyGroupsPerPartition``: a subtask file of 128 key groups reads as 4 partitions.
DEFAULT_MAX_KEY_GROUPS_PER_PARTITION = 32
#: Rows per Arrow batch handed to Spark (Spark's own ``arrow.maxRecordsPerBatch`` default).
_MAX_ROWS_PER_BATCH = 10_000
_OPTIONS = (
    "path",
    "checkpointsdir",
    "jobid",
    "operator",
    "state",
    "timers",
    "storageoptions",
    "keygroups",
    "includeexpired",
    "partitions",
    "maxkeygroupsperpartition",
)


def register_state_source(spark: SparkSession) -> None:
    """Register the ``statekit-state`` data source with ``spark``.

    Example::

        from statekit.spark import register_state_source

        register_state_source(spark)
        counts = (
            spark.read.format("statekit-state")
            .option("checkpointsDir", "s3://bucket/statekit").option("jobId", "url-count")
            .option("state", "count")
            .load()
        )                                    # key, value, key_group
    """
    spark.dataSource.register(StateDataSource)


@dataclasses.dataclass(frozen=True)
class _Chunk:
    """Key-group blocks of one subtask file that one partition reads."""

    subtask: int
    key_groups: tuple[int, ...]


class StatePartition(InputPartition):
    """A Spark partition: the checkpoint's location and, per subtask file, the key groups to read."""

    def __init__(self, index: int, location: str, chunks: Sequence[_Chunk]) -> None:
        super().__init__(index)
        self.index = index
        self.location = location
        self.chunks = tuple(chunks)

    def __repr__(self) -> str:
        parts = ", ".join(f"subtask {c.subtask}: {_ranges(c.key_groups)}" for c in self.chunks)
        return f"StatePartition({self.index}, {self.location}, [{parts}])"


@dataclasses.dataclass(frozen=True)
class _Options:
    """The source's options, parsed and checked."""

    path: str | None
    checkpoints_dir: str | None
    job_id: str | None
    operator: str
    state: str | None
    timers: TimeDomain | None
    storage_options: str | None
    key_groups: frozenset[int] | None
    include_expired: bool
    partitions: int | None
    max_key_groups_per_partition: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> _Options:
        opts = {k.lower(): v for k, v in options.items()}
        unknown = sorted(set(opts) - set(_OPTIONS))
        if unknown:
            raise ConfigurationError(
                f"{SOURCE_NAME}: unknown options {unknown}; the options are: path, checkpointsDir, jobId, "
                "operator, state, timers, storageOptions, keyGroups, includeExpired, partitions, "
                "maxKeyGroupsPerPartition"
            )
        path = opts.get("path") or None
        cdir, job = opts.get("checkpointsdir") or None, opts.get("jobid") or None
        if (path is not None and (cdir or job)) or (path is None and (cdir is None or job is None)):
            raise ConfigurationError(
                f"{SOURCE_NAME}: give either path (a chk-<n> or savepoint location, or load(path)) or both "
                "checkpointsDir and jobId (the job's latest completed checkpoint)"
            )
        state, timers = opts.get("state") or None, opts.get("timers") or None
        if (state is None) == (timers is None):
            raise ConfigurationError(
                f"{SOURCE_NAME}: give either state (a keyed state's name) or timers "
                "(event-time or processing-time)"
            )
        domain = None
        if timers is not None:
            try:
                domain = TimeDomain(timers.strip().lower())
            except ValueError:
                raise ConfigurationError(
                    f"{SOURCE_NAME}: timers={timers!r}: give event-time or processing-time"
                ) from None
        storage_options = opts.get("storageoptions") or None
        if storage_options is not None:
            try:
                parsed = json.loads(storage_options)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                # Never shown: it may hold credentials.
                raise ConfigurationError(f"{SOURCE_NAME}: storageOptions is not a JSON object")
        kgs = opts.get("keygroups")
        return cls(
            path=path,
            checkpoints_dir=cdir,
            job_id=job,
            operator=opts.get("operator") or "process",
            state=state,
            timers=domain,
            storage_options=storage_options,
            key_groups=None if kgs is None or not kgs.strip() else _parse_key_groups(kgs),
            include_expired=_parse_bool("includeExpired", opts.get("includeexpired", "false")),
            partitions=_parse_positive("partitions", opts["partitions"]) if "partitions" in opts else None,
            max_key_groups_per_partition=_parse_positive(
                "maxKeyGroupsPerPartition",
                opts.get("maxkeygroupsperpartition", str(DEFAULT_MAX_KEY_GROUPS_PER_PARTITION)),
            ),
        )

    @property
    def state_name(self) -> str:
        """The keyed state read: the user's, or the internal state of the timers' domain."""
        if self.timers is not None:
            return TIMER_STATE_NAMES[self.timers]
        assert self.state is not None
        return self.state

    def open(self) -> SavepointReader:
        """The checkpoint or savepoint to read (for checkpointsDir + jobId: the latest completed one)."""
        if self.path is not None:
            return SavepointReader.open(self.path, storage_options=self.storage_options)
        assert self.checkpoints_dir is not None and self.job_id is not None
        return SavepointReader.latest(self.checkpoints_dir, self.job_id, storage_options=self.storage_options)


class StateDataSource(DataSource):
    """``spark.read.format("statekit-state")``: one keyed state (or the timers) of an operator.

    Register it with :func:`register_state_source`. Options (names are not
    case-sensitive):

    - ``path`` (or ``load(path)``): a ``chk-<n>`` or savepoint location, any
      fsspec URL; or ``checkpointsDir`` and ``jobId``: the job's latest
      completed checkpoint when the read is planned;
    - ``operator`` (default ``process``);
    - ``state``: the keyed state's name; or ``timers``: ``event-time`` or
      ``processing-time``;
    - ``storageOptions``: fsspec options as a JSON object;
    - ``keyGroups``: read only these key groups, e.g. ``0-63,70``;
    - ``includeExpired``: also rows whose TTL has expired (default false; TTL
      is checked against the time the read is planned);
    - ``partitions``: the number of partitions wanted; by default one per
      subtask file, split so that none reads more than
      ``maxKeyGroupsPerPartition`` (default 32) key-group blocks.

    Columns are :meth:`SavepointReader.read`'s (``key``, ``namespace``,
    ``position`` or ``user_key``, ``value``, ``last_access``, ``key_group``)
    or, for timers, ``key``, ``timestamp`` (epoch ms), ``namespace`` (its
    bytes; null without one) and ``key_group``.
    """

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> T.StructType:
        opts = _Options.parse(self.options)
        with opts.open() as reader:
            return spark_schema(_arrow_schema(reader, opts))

    def reader(self, schema: T.StructType) -> DataSourceReader:
        opts = _Options.parse(self.options)
        with opts.open() as reader:
            if opts.timers is None:
                reader.state(opts.operator, opts.state_name)  # unknown operator or state: say which there are
            elif opts.operator not in reader.checkpoint.metadata.operators:
                reader.state(opts.operator, opts.state_name)  # raises, naming the operators
            planned = plan_partitions(reader, opts)
        return _StateReader(opts, schema, planned, time.time_ns() // 1_000_000)


def spark_schema(schema: pa.Schema) -> T.StructType:
    """The Spark schema of an Arrow schema of :meth:`SavepointReader.read`.

    Maps become maps, structs structs, lists arrays, ``timestamp[ms, UTC]``
    timestamps; a binary column of serialized values keeps its encoding
    (``pickle``, or a serializer's id) in the field's metadata under
    ``statekit.encoding``.
    """
    out = from_arrow_schema(schema)
    fields = []
    for f, af in zip(out.fields, schema):
        meta = af.metadata or {}
        if ENCODING_KEY in meta:
            f = T.StructField(
                f.name,
                f.dataType,
                f.nullable,
                {**f.metadata, "statekit.encoding": meta[ENCODING_KEY].decode()},
            )
        fields.append(f)
    return T.StructType(fields)


def _arrow_schema(reader: SavepointReader, opts: _Options) -> pa.Schema:
    if opts.timers is None:
        return reader.schema(opts.operator, opts.state_name)
    schema: pa.Schema = reader.timer_schema(opts.operator)
    return schema


# --- planning -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Unit:
    """What one partition may take whole: a canonical block, or a native subtask."""

    subtask: int
    key_groups: tuple[int, ...]
    weight: int


def plan_partitions(reader: SavepointReader, opts: _Options) -> list[StatePartition]:
    """The partitions that read ``opts``' state of ``reader``'s checkpoint, from its metadata alone.

    Only subtask files that declare the state, and only blocks in ``keyGroups``,
    are read. Without ``partitions``: each subtask file's blocks, split into
    the fewest partitions of at most ``maxKeyGroupsPerPartition`` blocks each.
    With it: the blocks of every file, in key-group order, cut into that many
    runs of about equal bytes (a partition may then span files). A native
    subtask is one unit: its backend restores it whole.
    """
    location = reader.location
    subtasks = reader.checkpoint.metadata.operators.get(opts.operator, [])
    wanted = opts.key_groups
    per_subtask: list[list[_Unit]] = []
    for st in subtasks:
        keyed = st.keyed
        if not keyed or not any(m.get("name") == opts.state_name for m in st.states):
            continue
        if str(keyed.get("format", CANONICAL_FORMAT)) == CANONICAL_FORMAT:
            offsets = {int(kg): int(o[1]) for kg, o in (keyed.get("offsets") or {}).items()}
            units = [
                _Unit(st.subtask_index, (kg,), offsets[kg])
                for kg in sorted(offsets)
                if wanted is None or kg in wanted
            ]
        else:
            kgs = tuple(kg for kg in st.key_group_range if wanted is None or kg in wanted)
            units = [_Unit(st.subtask_index, kgs, int(keyed.get("size", 0)))] if kgs else []
        if units:
            per_subtask.append(units)
    if opts.partitions is None:
        groups: list[list[_Unit]] = []
        cap = opts.max_key_groups_per_partition
        for units in per_subtask:
            # Canonical units are one block each; a native subtask is one unit, never split.
            groups.extend(_split_even(units, math.ceil(len(units) / cap)))
    else:
        groups = _split_by_weight([u for units in per_subtask for u in units], opts.partitions)
    if not groups:
        return [StatePartition(0, location, [])]  # Spark wants one; it reads nothing
    return [StatePartition(i, location, _chunks(g)) for i, g in enumerate(groups)]


def _split_even(units: list[_Unit], n: int) -> list[list[_Unit]]:
    """``units`` in ``n`` contiguous runs whose lengths differ by at most one."""
    n = max(1, min(n, len(units)))
    size, extra = divmod(len(units), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(units[start:end])
        start = end
    return out


def _split_by_weight(units: list[_Unit], n: int) -> list[list[_Unit]]:
    """``units`` in at most ``n`` contiguous runs of about equal weight (bytes), none empty."""
    if not units:
        return []
    if n >= len(units):
        return [[u] for u in units]
    weights = [max(u.weight, 1) for u in units]
    total = sum(weights)
    groups: list[list[_Unit]] = [[] for _ in range(n)]
    before = 0
    for u, w in zip(units, weights):
        # The unit goes where its middle falls: runs of about total/n each.
        groups[min(n - 1, (2 * before + w) * n // (2 * total))].append(u)
        before += w
    return [g for g in groups if g]


def _chunks(units: list[_Unit]) -> list[_Chunk]:
    """Consecutive units of one subtask merged into one chunk."""
    out: list[_Chunk] = []
    for u in units:
        if out and out[-1].subtask == u.subtask:
            out[-1] = _Chunk(u.subtask, out[-1].key_groups + u.key_groups)
        else:
            out.append(_Chunk(u.subtask, u.key_groups))
    return out


# --- reading --------------------------------------------------------------------------------


class _StateReader(DataSourceReader):
    """Pickled to the executors: options, the planned partitions and the time TTL is checked against."""

    def __init__(
        self, opts: _Options, schema: T.StructType, planned: list[StatePartition], now_ms: int
    ) -> None:
        self._opts = opts
        self._schema = schema
        self._planned = planned
        self._now_ms = now_ms

    def partitions(self) -> Sequence[InputPartition]:
        return list(self._planned)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, StatePartition) or not partition.chunks:
            return
        target = to_arrow_schema(self._schema, timezone="UTC")
        opts = self._opts
        # Reading a chunk's key groups restores (for a native snapshot) only the subtask that owns them.
        with SavepointReader.open(partition.location, storage_options=opts.storage_options) as reader:
            for chunk in partition.chunks:
                try:
                    for batch in self._batches(reader, chunk.key_groups):
                        for start in range(0, batch.num_rows, _MAX_ROWS_PER_BATCH):
                            yield _conform(batch.slice(start, _MAX_ROWS_PER_BATCH), target)
                except CorruptSnapshotError as e:
                    # Files are named relative to their checkpoint: say which checkpoint.
                    if partition.location in str(e):
                        raise
                    raise CorruptSnapshotError(f"{partition.location}/{e}") from None

    def _batches(self, reader: SavepointReader, key_groups: tuple[int, ...]) -> Iterator[pa.RecordBatch]:
        opts = self._opts
        if opts.timers is not None:
            yield from reader.timers(opts.operator, opts.timers, key_groups=key_groups)
            return
        yield from reader.read(
            opts.operator,
            opts.state_name,
            key_groups=key_groups,
            include_expired=opts.include_expired,
            now_ms=self._now_ms,
        )


def _conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """``batch`` with Spark's Arrow types (e.g. timestamps in µs), columns by name."""
    try:
        cols = [batch.column(f.name).cast(f.type) for f in target]
    except KeyError as e:
        raise ConfigurationError(
            f"{SOURCE_NAME}: the schema given has column {e}, which the state does not have; its "
            f"columns: {', '.join(batch.schema.names)}"
        ) from None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise StateError(f"{SOURCE_NAME}: a column does not convert to the schema given: {e}") from None
    return pa.RecordBatch.from_arrays(cols, schema=target)


# --- options --------------------------------------------------------------------------------


def _parse_key_groups(text: str) -> frozenset[int]:
    """``0-63,70`` -> {0, ..., 63, 70}."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            lo, sep, hi = part.partition("-")
            start, end = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ConfigurationError(
                f"{SOURCE_NAME}: keyGroups={text!r}: give key groups and ranges, e.g. 0-63,70"
            ) from None
        if start < 0 or end < start:
            raise ConfigurationError(f"{SOURCE_NAME}: keyGroups={text!r}: {part!r} is not a range")
        out.update(range(start, end + 1))
    return frozenset(out)


def _parse_bool(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no", ""):
        return False
    raise ConfigurationError(f"{SOURCE_NAME}: {name}={text!r}: give true or false")


def _parse_positive(name: str, text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigurationError(f"{SOURCE_NAME}: {name}={text!r}: give a positive integer")
    return n


def _ranges(kgs: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    runs: list[list[int]] = []
    for kg in kgs:
        if runs and runs[-1][1] == kg - 1:
            runs[-1][1] = kg
        else:
            runs.append([kg, kg])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
