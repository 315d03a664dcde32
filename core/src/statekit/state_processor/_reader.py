"""Reading checkpoints and savepoints as Arrow tables, without the job that wrote them.

A canonical snapshot is one file per subtask, ordered by key group, one
checksummed block per key group, with every block's offset in the
checkpoint's ``_metadata``. So a state is read block by block (memory bounded
by one key group), a filter on key groups or keys reads only the blocks it
needs, and a point query reads the file's header and one block.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from .._contracts import CheckpointStorage
from .._errors import CheckpointNotFoundError, CorruptSnapshotError, StateError
from ..checkpoints._history import CheckpointAttempt, read_checkpoint_history
from ..checkpoints._locations import filesystem_storage, parent_location
from ..checkpoints._metadata import SubtaskState
from ..checkpoints._restore import CompletedCheckpoint, load_checkpoint
from ..checkpoints._state_sizes import part_state_sizes, summed_state_sizes
from ..plugins._registry import PluginRegistry
from ..serialization._keygroups import key_group_for_bytes
from ..serialization._serializers import TypeSerializer
from ..snapshots._snapshot import (
    CANONICAL_FORMAT,
    Section,
    decode_namespaces,
)
from ..state._migration import lineage_of, version_of
from ..state._operator import OperatorStateMode
from ..state._raw import RawSnapshot
from ..state._state import VOID_NAMESPACE
from ..timers import TIMER_STATE_NAMES, TIMER_STATE_PREFIX, WATERMARK_PROPERTY
from ..timers._service import TimeDomain, decode_timer
from ._arrow import ArrowColumn, arrow_column, arrow_type
from ._blocks import BlockReading, Part
from ._info import OperatorInfo, StateInfo

__all__ = ["SavepointReader", "checkpoint_history", "open_storage"]

#: Arrow type of the TTL timestamp column.
TTL_TYPE = pa.timestamp("ms", tz="UTC")
_VALUE_KINDS = ("value", "reducing", "aggregating")


def open_storage(
    location: str,
    *,
    storage_options: str | Mapping[str, Any] | None = None,
    registry: PluginRegistry | None = None,
) -> CheckpointStorage:
    """The ``filesystem`` storage for ``location`` (a local path or any fsspec URL).

    It is rooted at the location's parent directory, so handles stay confined
    to the checkpoint's job directory, as on restore.
    """
    return filesystem_storage(parent_location(location), storage_options=storage_options, registry=registry)


def checkpoint_history(
    checkpoints_dir: str,
    job_id: str,
    *,
    storage: CheckpointStorage | None = None,
    storage_options: str | Mapping[str, Any] | None = None,
    registry: PluginRegistry | None = None,
) -> list[CheckpointAttempt]:
    """Job ``job_id``'s checkpoint history under ``checkpoints_dir``: every recorded attempt, oldest first.

    Beyond retention: completed, failed (with the reason), subsumed and
    discarded checkpoints and savepoints, each with its trigger time, duration,
    bytes (all, written, and uploaded vs referenced for incremental ones),
    backend and parallelism; the newest ``statekit.checkpoints.history.max-entries``.
    ``statekit checkpoints history`` prints the same.

    Example::

        from statekit.state_processor import checkpoint_history

        failed = [a for a in checkpoint_history("s3://bucket/ckpt", "url-count") if a.status == "failed"]
        print(failed[-1].failure if failed else "no failed checkpoint")

    Args:
        checkpoints_dir: The job's ``statekit.checkpoints.dir`` (any fsspec URL).
        job_id: The job.
        storage: The storage that holds the job (the ``jobmanager`` one, in its
            process); None: the ``filesystem`` storage at ``checkpoints_dir``.

    Raises:
        CheckpointError: If the store fails or the history is damaged (naming it).
    """
    if storage is None:
        storage = filesystem_storage(checkpoints_dir, storage_options=storage_options, registry=registry)
    return read_checkpoint_history(storage, job_id)


class SavepointReader(BlockReading):
    """A completed checkpoint or savepoint, read as data.

    Open one with :meth:`open` (a location) or :meth:`latest` (a job's latest
    checkpoint). Canonical snapshots are read without any backend; a native
    snapshot (``rocksdb`` incremental checkpoints) is read through the backend
    that wrote it, which must be installed: each of its subtasks is restored
    into a temporary local directory and read canonically. Without that backend
    the error says to install it, or to read a savepoint instead.

    Values are shown as the snapshot's serializer configs describe them; see
    :func:`~statekit.state_processor.arrow_type`. ``serializers`` maps a state
    name to the serializer of a state whose serializer is not built in.

    Why it is over 400 lines: it is the state processor's public reading API, one
    documented method per thing a user reads (about 280 lines of code; the blocks
    a read takes and what a checkpoint holds are modules of their own).
    """

    def __init__(
        self,
        checkpoint: CompletedCheckpoint,
        *,
        serializers: Mapping[str, TypeSerializer] | None = None,
        registry: PluginRegistry | None = None,
    ) -> None:
        self._cp = checkpoint
        self._serializers = dict(serializers or {})
        self._registry = registry
        self._parts: dict[str, dict[int, Part]] = {}
        self._layouts: dict[tuple[str, str], StateLayout] = {}
        self._operators: list[OperatorInfo] | None = None
        self._native_dir: tempfile.TemporaryDirectory[str] | None = None
        #: Bytes read from state files so far (headers, blocks, indexes).
        self.bytes_read = 0

    # --- opening -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        location: str,
        *,
        storage: CheckpointStorage | None = None,
        storage_options: str | Mapping[str, Any] | None = None,
        serializers: Mapping[str, TypeSerializer] | None = None,
        registry: PluginRegistry | None = None,
    ) -> SavepointReader:
        """Open the checkpoint or savepoint at ``location`` (a ``chk-<n>`` or savepoint directory).

        Args:
            location: A local path or fsspec URL (``s3://bucket/ckpts/job/chk-7``),
                or a location of ``storage``.
            storage: The storage that holds it; None: the ``filesystem`` storage.
            storage_options: fsspec options for the ``filesystem`` storage (JSON or a mapping).

        Raises:
            CheckpointNotFoundError: If there is no completed checkpoint there.
            CorruptSnapshotError: If its ``_metadata`` is damaged.
        """
        st = storage or open_storage(location, storage_options=storage_options, registry=registry)
        return cls(load_checkpoint(st, location), serializers=serializers, registry=registry)

    @classmethod
    def latest(
        cls,
        checkpoints_dir: str,
        job_id: str,
        *,
        storage: CheckpointStorage | None = None,
        storage_options: str | Mapping[str, Any] | None = None,
        serializers: Mapping[str, TypeSerializer] | None = None,
        registry: PluginRegistry | None = None,
    ) -> SavepointReader:
        """Open job ``job_id``'s latest completed checkpoint under ``checkpoints_dir``.

        Raises:
            CheckpointNotFoundError: If the job has no completed checkpoint.
        """
        if storage is None:
            storage = filesystem_storage(checkpoints_dir, storage_options=storage_options, registry=registry)
        loc = storage.latest_checkpoint(job_id)
        if loc is None:
            raise CheckpointNotFoundError(
                f"job {job_id!r} has no completed checkpoint under {checkpoints_dir}; check the job id "
                "(statekit checkpoints list <dir> shows the jobs there)"
            )
        return cls(load_checkpoint(storage, loc), serializers=serializers, registry=registry)

    def close(self) -> None:
        """Delete the temporary files of native snapshots read so far."""
        self._parts.clear()
        if self._native_dir is not None:
            self._native_dir.cleanup()
            self._native_dir = None

    def __enter__(self) -> SavepointReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what is there ----------------------------------------------------------

    @property
    def location(self) -> str:
        """Where the checkpoint or savepoint is."""
        return self._cp.location

    @property
    def checkpoint(self) -> CompletedCheckpoint:
        """The loaded checkpoint, with its metadata."""
        return self._cp

    @property
    def max_parallelism(self) -> int:
        """The max parallelism (number of key groups) it was taken with."""
        return self._cp.metadata.max_parallelism

    @property
    def watermark(self) -> int | None:
        """The job's event-time watermark in ms, or None before any event time was seen."""
        w = self._cp.metadata.properties.get(WATERMARK_PROPERTY)
        return None if w is None else int(w)

    def operators(self) -> list[OperatorInfo]:
        """Every operator, with its states, sizes and formats.

        From ``_metadata``, and one file header per operator with keyed state
        (for its key serializer; native snapshots record it in the metadata).
        """
        if self._operators is None:
            self._operators = self._describe_operators()
        return list(self._operators)

    def _describe_operators(self) -> list[OperatorInfo]:
        out = []
        for op, sts in self._cp.metadata.operators.items():
            keyed = [st.keyed for st in sts if st.keyed]
            out.append(
                OperatorInfo(
                    id=op,
                    parallelism=len(sts),
                    entries=sum(int(k.get("entries", 0)) for k in keyed),
                    bytes=sum(int(k.get("size", 0)) for k in keyed),
                    formats=tuple(sorted({str(k.get("format", CANONICAL_FORMAT)) for k in keyed})),
                    backends=tuple(sorted({str(k.get("backend", "")) for k in keyed} - {""})),
                    states=tuple(self._states(op, sts)),
                    operator_states=tuple(
                        sorted({str(n) for st in sts if st.operator for n in st.operator.get("states", [])})
                    ),
                )
            )
        return out

    def _states(self, op: str, sts: Sequence[SubtaskState]) -> Iterator[StateInfo]:
        seen: dict[str, dict[str, Any]] = {}
        key_ser: dict[str, Any] = {}
        for st in sts:
            for meta in st.states:
                seen.setdefault(str(meta["name"]), meta)
        # As the metrics read them: None where a part does not record them (RocksDB's, LMDB's native).
        sizes = summed_state_sizes(part_state_sizes(st.keyed) for st in sts if st.keyed)
        domains = {name: str(d) for d, name in TIMER_STATE_NAMES.items()}
        if seen and not key_ser:
            key_ser = self._key_serializer(op)
        for name, meta in seen.items():
            yield StateInfo(
                operator=op,
                name=name,
                kind=str(meta["kind"]),
                serializer=dict(meta["serializer"]),
                key_serializer=key_ser,
                namespace_serializer=meta.get("namespace_serializer"),
                ttl=meta.get("ttl"),
                bytes=None if sizes.bytes is None else sizes.bytes.get(name, 0),
                entries=None if sizes.entries is None else sizes.entries.get(name, 0),
                timer_domain=domains.get(name),
                schema_version=version_of(meta),
                lineage=lineage_of(meta),
            )

    def _key_serializer(self, op: str) -> dict[str, Any]:
        for st in self._cp.metadata.operators[op]:
            k = st.keyed or {}
            native = k.get("native")
            if isinstance(native, dict) and "key_serializer" in native:
                return dict(native["key_serializer"])
        for part in self._keyed_parts(op):
            return dict(part.read_header().key_serializer)
        return {}

    def state(self, operator: str, name: str) -> StateInfo:
        """The state ``name`` of ``operator``.

        Raises:
            StateError: Naming the operators or states there are, if either is unknown.
        """
        ops = {o.id: o for o in self.operators()}
        if operator not in ops:
            raise StateError(
                f"{self.location} has no operator {operator!r}; its operators: "
                f"{', '.join(sorted(ops)) or 'none'}"
            )
        for s in ops[operator].states:
            if s.name == name:
                return s
        names = [s.name for s in ops[operator].states if not s.name.startswith(TIMER_STATE_PREFIX)]
        raise StateError(
            f"operator {operator!r} of {self.location} has no keyed state {name!r}; its states: "
            f"{', '.join(sorted(names)) or 'none'}"
        )

    # --- reading keyed state ----------------------------------------------------------

    def layout(self, operator: str, state: str) -> StateLayout:
        """How ``state``'s sections decode and become record batches (made once per state)."""
        layout = self._layouts.get((operator, state))
        if layout is None:
            layout = StateLayout.of(self.state(operator, state), self._serializers.get(state))
            self._layouts[(operator, state)] = layout
        return layout

    def schema(self, operator: str, state: str) -> pa.Schema:
        """The Arrow schema :meth:`read` gives for ``state``."""
        return self.layout(operator, state).schema

    def read(
        self,
        operator: str,
        state: str,
        *,
        key_groups: Iterable[int] | None = None,
        keys: Iterable[Any] | None = None,
        include_expired: bool = False,
        now_ms: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """``state`` of ``operator`` as Arrow record batches, one per key group holding it.

        Columns: ``key``; ``namespace`` if the state declares a namespace
        serializer; ``position`` (list state: one row per element) or
        ``user_key`` (map state: one row per entry); ``value``;
        ``last_access`` (TTL states: the timestamp TTL counts from); and
        ``key_group``. Aggregating state shows its accumulator.

        Args:
            key_groups: Read only these key groups' blocks.
            keys: Read only these keys (only their key groups' blocks are read).
            include_expired: Also rows whose TTL has expired (by default they are
                left out, as the job would not see them).
            now_ms: The time TTL is checked against; None: now.
            progress: Called as ``progress(blocks done, blocks total)``.

        Raises:
            CorruptSnapshotError: Naming the file and key group of a damaged block.
        """
        layout = self.layout(operator, state)
        wanted_keys: set[Any] | None = None
        kgs: set[int] | None = None if key_groups is None else {int(g) for g in key_groups}
        if keys is not None:
            wanted_keys = set(keys)
            ks = layout.key.serializer
            by_key = {key_group_for_bytes(ks.serialize(k), self.max_parallelism) for k in wanted_keys}
            kgs = by_key if kgs is None else kgs & by_key
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        total = sum(
            1 for p in self._keyed_parts(operator, kgs) for kg in p.handle.offsets if kgs is None or kg in kgs
        )
        for done, (kg, _, sections, where) in enumerate(self.blocks(operator, kgs, state=state), 1):
            for sec in sections:
                if sec.state == state:
                    batch = layout.batch(sec, kg, include_expired, now, wanted_keys, where)
                    if batch.num_rows:
                        yield batch
            if progress is not None:
                progress(done, total)

    def read_table(self, operator: str, state: str, **kwargs: Any) -> pa.Table:
        """:meth:`read` gathered into one table (the whole state, or what the filters select)."""
        return pa.Table.from_batches(
            list(self.read(operator, state, **kwargs)), schema=self.schema(operator, state)
        )

    def get(self, operator: str, state: str, key: Any, *, namespace: Any = VOID_NAMESPACE) -> Any:
        """The value of ``state`` for one ``key`` (and namespace): None when it has none.

        Reads the header and the one key-group block that holds the key, at
        the offset the metadata gives. A list is a list, a map a dict; TTL
        states give the value the job would see (None once expired).
        """
        ns = None if namespace is VOID_NAMESPACE else namespace
        info = self.state(operator, state)
        for batch in self.read(operator, state, keys=[key]):
            rows = batch.to_pylist()
            rows = [r for r in rows if r.get("namespace") == ns]
            if not rows:
                continue
            if info.kind == "list":
                return [r["value"] for r in sorted(rows, key=lambda r: r["position"])]
            if info.kind == "map":
                return {r["user_key"]: r["value"] for r in rows}
            return rows[0]["value"]
        return None

    def timer_schema(self, operator: str, namespace_serializer: TypeSerializer | None = None) -> pa.Schema:
        """The schema of :meth:`timers`: ``key``, ``timestamp`` (ms), ``namespace``, ``key_group``."""
        ops = {o.id: o for o in self.operators()}
        if operator not in ops:
            self.state(operator, "")  # raises, naming the operators
        key_type = arrow_column(self._key_serializer(operator)).type if ops[operator].states else pa.null()
        ns_type = pa.binary() if namespace_serializer is None else arrow_type(namespace_serializer)
        return pa.schema(
            [
                pa.field("key", key_type),
                pa.field("timestamp", pa.int64()),
                pa.field("namespace", ns_type),
                pa.field("key_group", pa.int32()),
            ]
        )

    def timers(
        self,
        operator: str,
        domain: TimeDomain | str = TimeDomain.EVENT_TIME,
        *,
        key_groups: Iterable[int] | None = None,
        namespace_serializer: TypeSerializer | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """The pending timers of ``operator`` in ``domain``, one record batch per key group.

        Columns as :meth:`timer_schema`. ``namespace`` is null for timers
        without one; otherwise its bytes, or its value when
        ``namespace_serializer`` (the function's ``timer_namespace``) is given.
        """
        name = TIMER_STATE_NAMES[TimeDomain(domain)]
        schema = self.timer_schema(operator, namespace_serializer)
        if not any(s.name == name for o in self.operators() if o.id == operator for s in o.states):
            return
        ns_col = None if namespace_serializer is None else arrow_column(namespace_serializer.config())
        for batch in self.read(operator, name, key_groups=key_groups):
            stamps, namespaces = [], []
            for code in batch.column("user_key").to_pylist():
                ts, nsb = decode_timer(code)
                stamps.append(ts)
                raw = None if nsb[0] == 0 else nsb[1:]
                namespaces.append(
                    raw
                    if raw is None or namespace_serializer is None
                    else namespace_serializer.deserialize(raw)
                )
            yield pa.RecordBatch.from_arrays(
                [
                    batch.column("key"),
                    pa.array(stamps, pa.int64()),
                    pa.array(namespaces, pa.binary()) if ns_col is None else ns_col.array(namespaces),
                    batch.column("key_group"),
                ],
                schema=schema,
            )

    def read_timers(
        self,
        operator: str,
        domain: TimeDomain | str = TimeDomain.EVENT_TIME,
        *,
        namespace_serializer: TypeSerializer | None = None,
    ) -> pa.Table:
        """:meth:`timers` gathered into one table."""
        batches = list(self.timers(operator, domain, namespace_serializer=namespace_serializer))
        return pa.Table.from_batches(batches, schema=self.timer_schema(operator, namespace_serializer))

    # --- operator state -------------------------------------------------------------

    def read_operator_state(self, operator: str, name: str) -> pa.Table:
        """Operator state ``name`` of ``operator``, as a restore at parallelism 1 would see it.

        List and union state: ``position``, ``value`` (every subtask's elements,
        in subtask order); broadcast state: ``key``, ``value``.

        Raises:
            StateError: Naming the operator states there are, if ``name`` is not one.
        """
        info = {o.id: o for o in self.operators()}.get(operator)
        if info is None or name not in info.operator_states:
            there = ", ".join(info.operator_states) if info else "none (no such operator)"
            raise StateError(
                f"operator {operator!r} of {self.location} has no operator state {name!r}; it has: {there}"
            )
        data = self._cp.operator_states(operator, 1)[0][name]
        cols = [arrow_column(c) for c in data.serializers]
        des = [c.serializer.deserialize for c in cols]
        if data.mode is OperatorStateMode.BROADCAST:
            keys = [des[0](e) for e in data.elements[0::2]]
            values = [des[1](e) for e in data.elements[1::2]]
            return pa.table({"key": cols[0].array(keys), "value": cols[1].array(values)})
        values = [des[0](e) for e in data.elements]
        return pa.table(
            {"position": pa.array(range(len(values)), pa.int32()), "value": cols[0].array(values)}
        )

    # --- raw state ------------------------------------------------------------------

    def raw_state(self, operator: str) -> RawSnapshot:
        """The raw state of ``operator`` as bytes, as a restore at parallelism 1 would get it.

        ``keyed`` maps each key group to the bytes the function wrote for it
        (``snapshot_raw_state``'s ``raw_keyed_output``), ``items`` holds the raw
        operator items of every subtask in subtask order. Both are empty when
        the operator wrote none. Every byte is checked against the digests
        ``_metadata`` records.

        Raises:
            StateError: If the checkpoint has no operator ``operator``.
            CorruptCheckpointError: Naming the file and key group, if a raw state file is damaged.
        """
        if operator not in self._cp.metadata.operators:
            raise StateError(
                f"{self.location} has no operator {operator!r}; it has: "
                f"{', '.join(sorted(self._cp.metadata.operators)) or 'none'}"
            )
        return self._cp.raw_state(operator, 0, 1)


@dataclass(frozen=True)
class StateLayout:
    """How one state's sections become record batches."""

    info: StateInfo
    key: ArrowColumn
    namespace: ArrowColumn | None
    stored: ArrowColumn
    user_key: ArrowColumn | None
    value: ArrowColumn
    schema: pa.Schema

    @classmethod
    def of(cls, info: StateInfo, custom: TypeSerializer | None) -> StateLayout:
        key = arrow_column(info.key_serializer)
        ns = None if info.namespace_serializer is None else arrow_column(info.namespace_serializer)
        cfg = info.serializer
        user_key = None
        if info.kind == "list":
            value = arrow_column(cfg["args"][0], custom)
        elif info.kind == "map":
            user_key = arrow_column(cfg["args"][0], custom)
            value = arrow_column(cfg["args"][1], custom)
        else:
            value = arrow_column(cfg, custom)
        stored_cfg = cfg
        if info.ttl is not None:
            stamp = {"id": "int", "v": 1}
            if info.kind == "list":
                stored_cfg = {
                    "id": "list",
                    "v": 1,
                    "args": [{"id": "tuple", "v": 1, "args": [cfg["args"][0], stamp]}],
                }
            elif info.kind == "map":
                stored_cfg = {
                    "id": "dict", "v": 1,
                    "args": [cfg["args"][0], {"id": "tuple", "v": 1, "args": [cfg["args"][1], stamp]}],
                }  # fmt: skip
            else:
                stored_cfg = {"id": "tuple", "v": 1, "args": [cfg, stamp]}
        stored = arrow_column(stored_cfg, custom)
        fields = [key.field("key", nullable=False)]
        if ns is not None:
            fields.append(ns.field("namespace"))
        if info.kind == "list":
            fields.append(pa.field("position", pa.int32(), nullable=False))
        if user_key is not None:
            fields.append(user_key.field("user_key"))
        fields.append(value.field("value"))
        if info.ttl is not None:
            fields.append(pa.field("last_access", TTL_TYPE))
        fields.append(pa.field("key_group", pa.int32(), nullable=False))
        return cls(info, key, ns, stored, user_key, value, pa.schema(fields))

    def decode(
        self, sec: Section, kg: int, where: str, void: Any = None
    ) -> tuple[list[Any], list[Any], list[Any]]:
        """A section's keys, namespaces (``void`` for none) and stored values.

        Raises:
            CorruptSnapshotError: Naming the file and key group, if they do not decode.
        """
        n = sec.count
        try:
            ns = None if self.namespace is None else self.namespace.serializer
            return (
                self.key.serializer.decode_column(sec.keys, n),
                decode_namespaces(sec.namespaces, n, ns, void, sec.state),
                self.stored.serializer.decode_column(sec.values, n),
            )
        except StateError as e:
            raise CorruptSnapshotError(f"{where}: key group {kg}, state {sec.state!r}: {e}") from None
        except (ValueError, IndexError, TypeError, UnicodeDecodeError, OverflowError) as e:
            raise CorruptSnapshotError(
                f"{where}: key group {kg}, state {sec.state!r}: undecodable values ({type(e).__name__}: {e})"
            ) from None

    def batch(
        self, sec: Section, kg: int, include_expired: bool, now: int, keys: set[Any] | None, where: str
    ) -> pa.RecordBatch:
        """The rows of one section."""
        ks, nss, vals = self.decode(sec, kg, where)
        if keys is not None:
            sel = [i for i, k in enumerate(ks) if k in keys]
            ks, nss, vals = [ks[i] for i in sel], [nss[i] for i in sel], [vals[i] for i in sel]
        kind = self.info.kind
        ttl = self.info.ttl
        limit = None if ttl is None or include_expired else now - int(ttl["ttl_ms"])
        rk: list[Any] = []
        rn: list[Any] = []
        rv: list[Any] = []
        rt: list[int] = []
        extra: list[Any] = []
        cols: dict[str, Any] = {}
        if kind in _VALUE_KINDS and ttl is None:
            rk, rn, rv = ks, nss, vals
        elif kind in _VALUE_KINDS:
            for k, ns, (v, ts) in zip(ks, nss, vals):
                if limit is None or ts > limit:
                    rk.append(k)
                    rn.append(ns)
                    rv.append(v)
                    rt.append(ts)
        else:
            for k, ns, v in zip(ks, nss, vals):
                items: Iterable[tuple[Any, Any]] = enumerate(v) if kind == "list" else v.items()
                for pos, item in items:
                    if ttl is not None:
                        item, ts = item
                        if limit is not None and ts <= limit:
                            continue
                        rt.append(ts)
                    rk.append(k)
                    rn.append(ns)
                    extra.append(pos)
                    rv.append(item)
            if kind == "list":
                if limit is not None:
                    extra = _renumber(rk, rn)
                cols["position"] = pa.array(extra, pa.int32())
            else:
                assert self.user_key is not None
                cols["user_key"] = self.user_key.array(extra)
        out: dict[str, Any] = {"key": self.key.array(rk)}
        if self.namespace is not None:
            out["namespace"] = self.namespace.array(rn)
        out.update(cols)
        out["value"] = self.value.array(rv)
        if ttl is not None:
            out["last_access"] = pa.array(rt, pa.int64()).cast(TTL_TYPE)
        out["key_group"] = pa.array([kg] * len(rk), pa.int32())
        return pa.RecordBatch.from_pydict(out, schema=self.schema)


def _renumber(keys: list[Any], nss: list[Any]) -> list[int]:
    """Positions of the live elements of each list, counted again from 0 once expired ones are gone."""
    out = []
    prev: tuple[Any, Any] | None = None
    i = 0
    for k, ns in zip(keys, nss):
        cur = (k, ns)
        i = 0 if cur != prev else i + 1
        out.append(i)
        prev = cur
    return out
