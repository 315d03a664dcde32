"""Writing canonical savepoints from data, and rewriting existing ones.

A savepoint is written subtask file by subtask file, key group after key
group, in the canonical format every backend restores. States kept unchanged
from a source are copied as their sections' bytes, without decoding; mapped
states, new states and a change of max parallelism (every key is hashed
again) go through the serializers. Every file is read back through its
checksums before the metadata completes the savepoint, and the result never
lands inside its source.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._contracts import CheckpointStorage
from .._errors import ConfigurationError, SerializationError, StateError, StateMigrationError
from ..checkpoints._locations import filesystem_storage
from ..checkpoints._metadata import SubtaskState
from ..checkpoints._raw import write_raw_file
from ..checkpoints._writing import complete_checkpoint, write_keyed_file, write_operator_file
from ..plugins._registry import PluginRegistry
from ..serialization._keygroups import (
    KeyGroupRange,
    key_group_for_bytes,
    key_group_range_for_operator,
    validate_parallelism,
)
from ..serialization._serializers import TypeSerializer, serializer_for, serializer_from_config
from ..snapshots._snapshot import (
    SnapshotHeader,
    SnapshotWriteResult,
    encode_namespaces,
    read_block,
    read_header,
    read_index,
    write_canonical,
)
from ..state._migration import LINEAGE, REWRITTEN, SCHEMA_VERSION, lineage_of, same_schema, version_of
from ..state._operator import OperatorSnapshot
from ..state._raw import RawSnapshot
from ..state._registered import RegisteredState
from ..state._state import VOID_NAMESPACE, StateDescriptor
from ..timers import TIMER_STATE_NAMES, TIMER_STATE_PREFIX
from ._arrow import arrow_column
from ._info import StateInfo
from ._reader import SavepointReader, StateLayout

__all__ = [
    "BOOTSTRAP_BACKEND",
    "SavepointWriter",
    "canonical_writer",
    "encode_section",
    "state_columns",
    "stored_entries",
    "verify_written",
]

BOOTSTRAP_BACKEND = "bootstrap"
_Entry = tuple[Any, Any, Any]
"""(key, namespace, stored value) of one state."""
_SectionBytes = tuple[int, bytes, bytes, bytes]
"""(entries, keys, namespaces, values) of one section."""


@dataclass
class _NewState:
    """A state built from data: its stored entries, by key."""

    meta: dict[str, Any]
    stored: TypeSerializer
    namespace: TypeSerializer | None
    entries: list[_Entry]
    _grouped: tuple[int, dict[int, list[_Entry]]] | None = None

    def by_key_group(self, keys: TypeSerializer, max_parallelism: int) -> dict[int, list[_Entry]]:
        """The entries by key group at ``max_parallelism`` (computed once)."""
        if self._grouped is None or self._grouped[0] != max_parallelism:
            out: dict[int, list[_Entry]] = {}
            for e in self.entries:
                out.setdefault(key_group_for_bytes(keys.serialize(e[0]), max_parallelism), []).append(e)
            self._grouped = (max_parallelism, out)
        return self._grouped[1]


@dataclass
class _KeptState:
    """A state of the source savepoint, maybe renamed, maybe mapped."""

    source_name: str
    meta: dict[str, Any]
    fn: Callable[[Any], Any] | None = None
    new_stored: TypeSerializer | None = None


@dataclass
class _Operator:
    key_serializer: TypeSerializer | None
    key_config: dict[str, Any] | None
    parallelism: int | None
    states: dict[str, _KeptState | _NewState] = field(default_factory=dict)
    from_source: bool = False


class SavepointWriter:
    """Builds a canonical savepoint: from data (bootstrap), or from an existing one (rewrite).

    ::

        w = SavepointWriter.new(max_parallelism=128)
        w.with_state("process", ValueStateDescriptor("count", int), {"/api/a": 3, "/api/b": 1})
        location = w.write("/data/savepoints")      # a new savepoint-<job>-<hex> directory

        w = SavepointWriter.from_existing(location)
        w.rename_state("process", "count", "requests").with_max_parallelism(256)
        w.write("/data/savepoints")

    A job starts from the result with ``restore=<location>`` (LocalRunner or
    Spark), with any backend. Methods return the writer, so calls chain.

    Why it is over 400 lines: it is the state processor's public writing API
    (bootstrap and rewrite), one documented method per operation (about 315 lines
    of code; encoding sections and checking what was written are functions of the
    module).
    """

    def __init__(
        self,
        *,
        max_parallelism: int,
        job_id: str,
        source: SavepointReader | None = None,
    ) -> None:
        validate_parallelism(1, max_parallelism)
        self.max_parallelism = max_parallelism
        self.job_id = job_id
        self._source = source
        self._ops: dict[str, _Operator] = {}
        self._dropped_ops: set[str] = set()
        if source is not None:
            for info in source.operators():
                states: dict[str, _KeptState | _NewState] = {
                    s.name: _KeptState(s.name, _meta_of(source, info.id, s.name)) for s in info.states
                }
                self._ops[info.id] = _Operator(None, None, info.parallelism, states, from_source=True)

    @classmethod
    def new(cls, *, max_parallelism: int = 128, job_id: str = "bootstrap") -> SavepointWriter:
        """An empty savepoint of ``max_parallelism`` key groups; add states with :meth:`with_state`."""
        return cls(max_parallelism=max_parallelism, job_id=job_id)

    @classmethod
    def from_existing(
        cls,
        location: str,
        *,
        storage: CheckpointStorage | None = None,
        storage_options: str | Mapping[str, Any] | None = None,
        registry: PluginRegistry | None = None,
    ) -> SavepointWriter:
        """A rewrite of the checkpoint or savepoint at ``location``: everything is kept until changed."""
        reader = SavepointReader.open(
            location, storage=storage, storage_options=storage_options, registry=registry
        )
        meta = reader.checkpoint.metadata
        return cls(max_parallelism=meta.max_parallelism, job_id=meta.job_id, source=reader)

    # --- what to change -------------------------------------------------------------

    def _op(self, operator: str, *, existing: bool = True) -> _Operator:
        op = self._ops.get(operator)
        if op is None and existing:
            raise StateError(
                f"no operator {operator!r} to change; operators: {', '.join(sorted(self._ops)) or 'none'}"
            )
        if op is None:
            op = self._ops[operator] = _Operator(None, None, None)
            self._dropped_ops.discard(operator)
        return op

    def _state(self, operator: str, name: str) -> _KeptState | _NewState:
        op = self._op(operator)
        st = op.states.get(name)
        if st is None:
            raise StateError(
                f"operator {operator!r} has no state {name!r}; its states: "
                f"{', '.join(sorted(n for n in op.states if not n.startswith(TIMER_STATE_PREFIX))) or 'none'}"
            )
        return st

    def remove_operator(self, operator: str) -> SavepointWriter:
        """Leave ``operator`` (all its keyed and operator state) out."""
        self._op(operator)
        del self._ops[operator]
        self._dropped_ops.add(operator)
        return self

    def remove_state(self, operator: str, name: str) -> SavepointWriter:
        """Leave keyed state ``name`` of ``operator`` out."""
        self._state(operator, name)
        del self._ops[operator].states[name]
        return self

    def rename_state(self, operator: str, old: str, new: str) -> SavepointWriter:
        """Store state ``old`` of ``operator`` under the name ``new`` (its entries unchanged)."""
        st = self._state(operator, old)
        states = self._ops[operator].states
        if new in states:
            raise StateError(f"operator {operator!r} already has a state {new!r}")
        if new.startswith(TIMER_STATE_PREFIX) or old.startswith(TIMER_STATE_PREFIX):
            raise StateError(f"state names starting {TIMER_STATE_PREFIX!r} are reserved for timers")
        st.meta = {**st.meta, "name": new}
        states[new] = states.pop(old)
        return self

    def transform_state(
        self,
        operator: str,
        name: str,
        fn: Callable[[Any], Any],
        *,
        descriptor: StateDescriptor | None = None,
    ) -> SavepointWriter:
        """Map every value of state ``name`` through ``fn`` (None drops the entry).

        ``fn`` gets what the job would read: a value (value, reducing and
        aggregating state: the accumulator), a list, or a dict; TTL timestamps
        stay (a list's or map's new elements take the latest of the entry's).
        ``descriptor`` declares the new type (and may rename the state); it
        must be of the same kind, with the same TTL setting. Without it the
        values must still fit the old serializer.
        """
        st = self._state(operator, name)
        if not isinstance(st, _KeptState):
            raise StateError(f"state {name!r} is built from data here; transform the data instead")
        reg = None
        if descriptor is not None:
            ns_cfg = st.meta.get("namespace_serializer")
            reg = RegisteredState.of(descriptor, None if ns_cfg is None else serializer_from_config(ns_cfg))
            new_meta = reg.meta()
            new_meta["namespace_serializer"] = ns_cfg
            if new_meta["kind"] != st.meta["kind"] or (new_meta["ttl"] is None) != (st.meta["ttl"] is None):
                raise StateMigrationError(
                    f"state {name!r} is {st.meta['kind']} state"
                    f"{' with TTL' if st.meta['ttl'] else ''}; the new descriptor must be of the same kind "
                    "and TTL setting (write a new state with with_state for anything else)"
                )
            if descriptor.name != name:
                self.rename_state(operator, name, descriptor.name)
            new_meta["name"] = descriptor.name
            if not same_schema({**st.meta, "name": descriptor.name}, new_meta):
                # The schema history says where the old schema went: an offline rewrite.
                new_meta[LINEAGE] = [
                    *lineage_of(st.meta),
                    {
                        SCHEMA_VERSION: version_of(st.meta),
                        "serializer": st.meta["serializer"],
                        "ttl": st.meta.get("ttl"),
                        "migration": REWRITTEN,
                        "changes": ["every value rewritten by statekit.state_processor (transform_state)"],
                        "restored_from": None,
                    },
                ]
            elif st.meta.get(LINEAGE):
                new_meta[LINEAGE] = st.meta[LINEAGE]
            st.meta = new_meta
        st.fn = fn
        st.new_stored = None if reg is None else reg.serializer
        return self

    def with_max_parallelism(self, max_parallelism: int) -> SavepointWriter:
        """Write with another max parallelism: every key moves to its key group under the new one."""
        validate_parallelism(1, max_parallelism)
        self.max_parallelism = max_parallelism
        return self

    def with_state(
        self,
        operator: str,
        descriptor: StateDescriptor,
        data: Any,
        *,
        key_serializer: TypeSerializer | None = None,
        namespace_serializer: TypeSerializer | None = None,
        now_ms: int | None = None,
    ) -> SavepointWriter:
        """Add keyed state ``descriptor`` of ``operator``, built from ``data``.

        ``data`` is one of:

        - a mapping ``{key: value}``: value, reducing and aggregating state take
          the value (the accumulator), list state a list, map state a dict;
        - rows in the columns :meth:`SavepointReader.read` gives (``key``,
          ``namespace`` when the state has a namespace serializer, ``position``
          for lists or ``user_key`` for maps, ``value``, ``last_access`` for
          TTL states; ``key_group`` is ignored): an iterable of tuples in that
          order or of dicts, a ``pyarrow.Table``/``RecordBatch`` or a pandas
          ``DataFrame``. So a table read from one savepoint writes into another.

        TTL states take ``last_access`` (epoch ms or a datetime) when given,
        else ``now_ms`` (default: now). ``key_serializer`` defaults to the
        operator's (a source's), else to the serializer of the first key's type.

        Raises:
            StateError: If the operator already has the state, or keys disagree with its key serializer.
            SerializationError: If a value does not fit the descriptor's serializer (nothing is written).
        """
        op = self._op(operator, existing=False)
        if descriptor.name in op.states:
            raise StateError(f"operator {operator!r} already has a state {descriptor.name!r}")
        if descriptor.name.startswith(TIMER_STATE_PREFIX):
            raise StateError(f"state names starting {TIMER_STATE_PREFIX!r} are reserved for timers")
        reg = RegisteredState.of(descriptor, namespace_serializer)
        meta = reg.meta()
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        entries, arrow = stored_entries(meta, data, now)
        stored = reg.serializer
        ns_ser = namespace_serializer
        if arrow:  # Arrow values come as tuples and dicts: encode them with the config's own layout
            stored = arrow_column(meta["stored_serializer"]).serializer
            if namespace_serializer is not None:
                ns_ser = arrow_column(namespace_serializer.config()).serializer
        ks = key_serializer or op.key_serializer
        if ks is None and op.from_source:
            ks = self._source_key_serializer(operator)
        if ks is None:
            if not entries:
                raise StateError(
                    f"state {descriptor.name!r}: pass key_serializer= for a state with no entries"
                )
            ks = serializer_for(type(entries[0][0]))
        if op.key_config is not None and ks.config() != op.key_config:
            raise StateError(
                f"operator {operator!r} has keys of {serializer_from_config(op.key_config).describe()}, "
                f"not {ks.describe()}: one operator has one key type"
            )
        op.key_serializer, op.key_config = ks, ks.config()
        op.states[descriptor.name] = _NewState(meta, stored, ns_ser, entries)
        return self

    def _source_key_serializer(self, operator: str) -> TypeSerializer | None:
        assert self._source is not None
        for info in self._source.operators():
            if info.id == operator and info.states:
                return serializer_from_config(info.states[0].key_serializer)
        return None

    # --- writing --------------------------------------------------------------------

    def write(
        self,
        target_dir: str,
        *,
        storage: CheckpointStorage | None = None,
        storage_options: str | Mapping[str, Any] | None = None,
        parallelism: int | None = None,
        registry: PluginRegistry | None = None,
    ) -> str:
        """Write the savepoint into a new directory under ``target_dir``; returns its location.

        Args:
            target_dir: A local path or fsspec URL (or a directory of ``storage``).
            parallelism: Files per operator (restores work at any parallelism):
                default the source's, else 1.

        Raises:
            ConfigurationError: If ``target_dir`` is inside the source savepoint.
            CorruptSnapshotError: If the source is damaged (nothing is completed).
        """
        if self._source is not None:
            src = self._source.location.rstrip("/")
            if target_dir.rstrip("/") == src or target_dir.startswith(src + "/"):
                raise ConfigurationError(
                    f"target {target_dir} is inside the source {src}; a rewrite never writes into its "
                    "source: choose another directory"
                )
        st = storage or filesystem_storage(target_dir, storage_options=storage_options, registry=registry)
        writer = st.begin_savepoint(self.job_id, target_dir)
        try:
            subtasks: list[SubtaskState] = []
            for op_id, op in self._ops.items():
                p = parallelism or op.parallelism or 1
                validate_parallelism(p, self.max_parallelism)
                op_states = self._operator_states(op_id, p)
                for i in range(p):
                    kgr = key_group_range_for_operator(self.max_parallelism, p, i)
                    sub = SubtaskState(op_id, i, kgr)
                    if op.states:
                        header, blocks = self._subtask(op_id, op, kgr)
                        if blocks:
                            sub.keyed = write_keyed_file(
                                writer,
                                f"{op_id}-{i}.keyed",
                                header,
                                canonical_writer(header, blocks),
                            )
                            sub.states = list(header.states)
                            verify_written(st, writer.location, sub)
                    if op_states is not None and op_states[i]:
                        sub.operator = write_operator_file(writer, f"{op_id}-{i}.operator", op_states[i])
                    raw = self._raw_state(op_id, i, p)
                    if raw:  # the function's own bytes, carried over as they are
                        sub.raw = write_raw_file(writer, f"{op_id}-{i}.raw", raw)
                    subtasks.append(sub)
            meta = self._source.checkpoint.metadata if self._source else None
            props: dict[str, Any] = dict(meta.properties) if meta else {}
            if meta is not None:
                props["rewritten_from"] = self._source.location if self._source else None
            return complete_checkpoint(
                writer,
                job_id=self.job_id,
                checkpoint_id=meta.checkpoint_id if meta else 0,
                max_parallelism=self.max_parallelism,
                subtasks=subtasks,
                kind="savepoint",
                properties=props,
            )
        except BaseException:
            writer.abort()
            raise

    def _raw_state(self, op_id: str, index: int, p: int) -> RawSnapshot | None:
        """The raw state new subtask ``index`` of ``p`` keeps from the source (None without a source)."""
        if self._source is None or not self._source.checkpoint.has_raw_state(op_id):
            return None
        cp = self._source.checkpoint
        if cp.metadata.max_parallelism != self.max_parallelism:
            # Only the key group of each block is known, not the keys inside: it cannot be split.
            raise StateError(
                f"operator {op_id!r} of {cp.location} holds raw state, kept per key group of max "
                f"parallelism {cp.metadata.max_parallelism}; its bytes are the function's own, so "
                f"statekit cannot move them to max parallelism {self.max_parallelism}. Keep the max "
                "parallelism, or leave the operator out (remove_operator)"
            )
        return cp.raw_state(op_id, index, p)

    def _operator_states(self, op_id: str, p: int) -> list[OperatorSnapshot] | None:
        if self._source is None or op_id not in self._source.checkpoint.metadata.operators:
            return None
        return self._source.checkpoint.operator_states(op_id, p)

    def _subtask(
        self, op_id: str, op: _Operator, kgr: KeyGroupRange
    ) -> tuple[SnapshotHeader, dict[int, list[tuple[int, _SectionBytes]]]]:
        """The header and every key group's sections of one new subtask file."""
        names = list(op.states)
        blocks: dict[int, list[tuple[int, _SectionBytes]]] = {}
        key_cfg = op.key_config
        kept = {s.source_name: (i, s) for i, s in enumerate(op.states.values()) if isinstance(s, _KeptState)}
        if kept:
            assert self._source is not None
            same_maxp = self._source.max_parallelism == self.max_parallelism
            wanted = set(kgr) if same_maxp else None
            moved: dict[str, list[tuple[int, _Entry]]] = {}
            ks: TypeSerializer | None = None
            for kg, header, sections, where in self._source.blocks(op_id, wanted):
                key_cfg = header.key_serializer
                for sec in sections:
                    item = kept.get(sec.state)
                    if item is None:
                        continue
                    idx, state = item
                    if same_maxp and state.fn is None:
                        blocks.setdefault(kg, []).append(
                            (idx, (sec.count, sec.keys, sec.namespaces, sec.values))
                        )
                        continue
                    layout = self._source.layout(op_id, sec.state)
                    entries = list(zip(*layout.decode(sec, kg, where, VOID_NAMESPACE)))
                    if state.fn is not None:
                        entries = _mapped(entries, state.fn, layout.info)
                    if same_maxp:
                        blocks.setdefault(kg, []).append((idx, _encode(state, layout, entries)))
                        continue
                    if ks is None:
                        ks = serializer_from_config(header.key_serializer)
                    for e in entries:
                        new_kg = key_group_for_bytes(ks.serialize(e[0]), self.max_parallelism)
                        if new_kg in kgr:
                            moved.setdefault(sec.state, []).append((new_kg, e))
            for name, items in moved.items():
                idx, state = kept[name]
                by_kg: dict[int, list[_Entry]] = {}
                for new_kg, e in items:
                    by_kg.setdefault(new_kg, []).append(e)
                layout = self._source.layout(op_id, state.source_name)
                for kg, entries in by_kg.items():
                    blocks.setdefault(kg, []).append((idx, _encode(state, layout, entries)))
        for idx, new in enumerate(op.states.values()):
            if not isinstance(new, _NewState):
                continue
            ks = op.key_serializer
            assert ks is not None
            key_cfg = op.key_config
            for kg in kgr:
                group = new.by_key_group(ks, self.max_parallelism).get(kg)
                if group:
                    section = encode_section(group, ks, new.namespace, new.stored, new.meta["name"])
                    blocks.setdefault(kg, []).append((idx, section))
        metas = [s.meta for s in op.states.values()]
        timers = {str(d): n for d, n in TIMER_STATE_NAMES.items() if n in names}
        header = SnapshotHeader(
            self.max_parallelism,
            kgr,
            dict(key_cfg or {}),
            metas,
            backend=BOOTSTRAP_BACKEND,
            extra={"timers": timers} if timers else {},
        )
        return header, blocks


def canonical_writer(
    header: SnapshotHeader, blocks: dict[int, list[tuple[int, _SectionBytes]]]
) -> Callable[[Any], SnapshotWriteResult]:
    """What writes ``blocks`` under ``header`` as a canonical snapshot into a stream it is given."""
    return lambda out: write_canonical(out, header, lambda kg: _sections(blocks, kg))


def _sections(
    blocks: dict[int, list[tuple[int, _SectionBytes]]], kg: int
) -> Iterator[tuple[int, int, bytes, bytes, bytes]]:
    for idx, (n, k, ns, v) in sorted(blocks.get(kg, ()), key=lambda x: x[0]):
        yield idx, n, k, ns, v


def _meta_of(reader: SavepointReader, operator: str, name: str) -> dict[str, Any]:
    for st in reader.checkpoint.metadata.operators[operator]:
        for m in st.states:
            if m["name"] == name:
                return dict(m)
    raise StateError(f"state {name!r} of operator {operator!r} is declared by no subtask")


def _mapped(entries: list[_Entry], fn: Callable[[Any], Any], info: StateInfo) -> list[_Entry]:
    """``fn`` applied to what the job reads of each entry, TTL timestamps kept."""
    kind, ttl = info.kind, info.ttl is not None
    out = []
    stored: Any
    for k, ns, v in entries:
        if not ttl:
            nv = fn(v)
            if nv is not None:
                out.append((k, ns, nv))
            continue
        if kind == "list":
            ts = max(t for _, t in v)
            nv = fn([e for e, _ in v])
            stored = None if nv is None else [(e, ts) for e in nv]
        elif kind == "map":
            ts = max(t for _, t in v.values())
            nv = fn({uk: e for uk, (e, _) in v.items()})
            stored = None if nv is None else {uk: (e, ts) for uk, e in nv.items()}
        else:
            nv = fn(v[0])
            stored = None if nv is None else (nv, v[1])
        if stored is not None:
            out.append((k, ns, stored))
    return out


def encode_section(
    entries: Sequence[_Entry],
    keys: TypeSerializer,
    namespaces: TypeSerializer | None,
    stored: TypeSerializer,
    state: str,
) -> _SectionBytes:
    """One state's section of a key group: its entries as the canonical format's columns."""
    try:
        return (
            len(entries),
            keys.encode_column([e[0] for e in entries]),
            encode_namespaces([e[1] for e in entries], namespaces, VOID_NAMESPACE, state),
            stored.encode_column([e[2] for e in entries]),
        )
    except SerializationError as e:
        raise SerializationError(f"state {state!r}: a value does not fit its serializer: {e}") from None


def _encode(state: _KeptState, layout: StateLayout, entries: list[_Entry]) -> _SectionBytes:
    """A kept state's entries encoded with its source's serializers (or its new descriptor's)."""
    ns = None if layout.namespace is None else layout.namespace.serializer
    stored = state.new_stored or layout.stored.serializer
    return encode_section(entries, layout.key.serializer, ns, stored, state.meta["name"])


def verify_written(storage: CheckpointStorage, location: str, sub: SubtaskState) -> None:
    """Read a written file back through its index and every block's checksum."""
    k = sub.keyed
    assert k is not None
    stream = storage.resolve_handle(location, k["handle"])
    header, _ = read_header(stream)
    names = [m["name"] for m in header.states]
    index = read_index(stream)
    if index != {int(kg): tuple(o) for kg, o in k["offsets"].items()}:
        raise StateError(
            f"{location}: the file written for subtask {sub.subtask_index} disagrees with its index"
        )
    for kg, (off, ln) in index.items():
        read_block(stream, kg, off, ln, names)


# --- data in ------------------------------------------------------------------------


def _timestamp(v: Any, now: int) -> int:
    if v is None:
        return now
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=dt.UTC)
        return int(v.timestamp() * 1000)
    return int(v)


def state_columns(meta: dict[str, Any]) -> list[str]:
    """The columns a state's rows have (the statekit-state data source reads the same)."""
    cols = ["key"]
    if meta.get("namespace_serializer") is not None:
        cols.append("namespace")
    if meta["kind"] == "list":
        cols.append("position")
    if meta["kind"] == "map":
        cols.append("user_key")
    cols.append("value")
    if meta.get("ttl") is not None:
        cols.append("last_access")
    return cols


def _rows(meta: dict[str, Any], data: Any) -> tuple[Iterable[Mapping[str, Any]], bool]:
    """Rows as dicts of column values; True when they came from Arrow (so values need from_arrow)."""
    mod = type(data).__module__
    if mod.startswith("pandas"):
        import pyarrow as pa  # type: ignore[import-untyped]

        data = pa.Table.from_pandas(data, preserve_index=False)
        mod = "pyarrow"
    if mod.startswith("pyarrow"):
        cols = state_columns(meta)
        missing = [c for c in cols if c not in data.schema.names and c != "last_access"]
        if missing:
            raise StateError(
                f"state {meta['name']!r}: the table lacks columns {missing}; a {meta['kind']} state takes "
                f"{cols}"
            )
        conv = _arrow_converters(meta)
        py = {c: (conv[c](data.column(c)) if c in conv else data.column(c).to_pylist())
              for c in cols if c in data.schema.names}  # fmt: skip
        n = data.num_rows
        return ({c: py[c][i] for c in py} for i in range(n)), True
    if isinstance(data, Mapping):
        return _from_mapping(meta, data), False
    cols = state_columns(meta)
    return (dict(zip(cols, r)) if not isinstance(r, Mapping) else r for r in data), False


def _arrow_converters(meta: dict[str, Any]) -> dict[str, Callable[[Any], list[Any]]]:
    cfg = meta["serializer"]
    kind = meta["kind"]
    out: dict[str, Callable[[Any], list[Any]]] = {}
    if kind == "list":
        out["value"] = arrow_column(cfg["args"][0]).values
    elif kind == "map":
        out["user_key"] = arrow_column(cfg["args"][0]).values
        out["value"] = arrow_column(cfg["args"][1]).values
    else:
        out["value"] = arrow_column(cfg).values
    if meta.get("namespace_serializer") is not None:
        out["namespace"] = arrow_column(meta["namespace_serializer"]).values
    out["last_access"] = _epoch_ms
    return out


def _epoch_ms(col: Any) -> list[Any]:
    """A ``last_access`` column as epoch ms: timestamps of any unit, or integers taken as ms."""
    import pyarrow as pa

    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.timestamp("ms", tz="UTC"))
    return list(col.cast(pa.int64()).to_pylist())


def _from_mapping(meta: dict[str, Any], data: Mapping[Any, Any]) -> Iterator[dict[str, Any]]:
    kind = meta["kind"]
    for k, v in data.items():
        if kind == "list":
            for i, e in enumerate(v):
                yield {"key": k, "position": i, "value": e}
        elif kind == "map":
            for uk, e in v.items():
                yield {"key": k, "user_key": uk, "value": e}
        else:
            yield {"key": k, "value": v}


def stored_entries(meta: dict[str, Any], data: Any, now: int) -> tuple[list[_Entry], bool]:
    """The stored entries of ``data``: (key, namespace, stored value), one per (key, namespace)."""
    rows, arrow = _rows(meta, data)
    kind, ttl = meta["kind"], meta.get("ttl") is not None
    grouped: dict[tuple[Any, Any], Any] = {}
    for r in rows:
        try:
            key = r["key"]
            ns = r.get("namespace")
            ns = VOID_NAMESPACE if ns is None else ns
            value = r["value"]
        except (KeyError, TypeError) as e:
            raise StateError(f"state {meta['name']!r}: a row without {e}: {r!r}"[:300]) from None
        ts = _timestamp(r.get("last_access"), now)
        item = (value, ts) if ttl else value
        slot = (key, ns)
        if kind == "list":
            grouped.setdefault(slot, []).append((r.get("position", 0), item))
        elif kind == "map":
            grouped.setdefault(slot, {})[r["user_key"]] = item
        else:
            if slot in grouped:
                raise StateError(f"state {meta['name']!r}: key {key!r} appears twice")
            grouped[slot] = item
    out: list[_Entry] = []
    for (key, ns), v in grouped.items():
        if kind == "list":
            v = [e for _, e in sorted(v, key=lambda pe: pe[0])]
        out.append((key, ns, v))
    return out, arrow
