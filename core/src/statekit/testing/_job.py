"""The kit's harness: the subtasks of one operator, on one backend, at one parallelism.

A :class:`Job` owns ``p`` keyed and operator backends created by a
:class:`~statekit.StateBackend` (each keyed backend with a fresh ``local_dir``),
routes keys to the subtask owning their key group, snapshots every subtask
(canonically or natively), restores into a new job at any parallelism, directly
or through a :class:`~statekit.CheckpointStorage`, and reads everything back
without side effects: keyed state by decoding canonical snapshots, operator
state through its handles.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._checkpoint import complete_checkpoint, load_checkpoint, write_subtask_state
from .._contracts import (
    CheckpointStorage,
    KeyedStateBackend,
    OperatorStateBackend,
    StateBackend,
    SupportsNativeSnapshot,
)
from .._keygroups import key_group_for_bytes, key_group_range_for_operator, operator_index_for_key_group
from .._operator import OperatorSnapshot, redistribute_operator_state
from .._serializers import StrSerializer, TypeSerializer, serializer_from_config
from .._snapshot import (
    CANONICAL_FORMAT,
    BytesStreamHandle,
    KeyedStateHandle,
    decode_namespaces,
    iter_blocks,
    read_header,
)
from .._state import VOID_NAMESPACE, ListStateDescriptor, MapStateDescriptor
from ._model import NAMESPACE_SERIALIZER, KeyedStateSpec

__all__ = [
    "BROADCAST",
    "OPERATOR_ID",
    "SPLIT",
    "UNION",
    "BackendFactory",
    "DecodedEntry",
    "Job",
    "StorageFactory",
    "Subtask",
    "decode_canonical",
    "new_job_id",
    "snapshot_handle",
    "write_snapshot",
]

BackendFactory = Callable[[], StateBackend]
"""Makes a fresh :class:`~statekit.StateBackend`; called once per example or test."""

StorageFactory = Callable[[], CheckpointStorage]
"""Makes a fresh :class:`~statekit.CheckpointStorage` (savepoints included)."""

OPERATOR_ID = "kit"
SPLIT: ListStateDescriptor[int] = ListStateDescriptor("split", int)
UNION: ListStateDescriptor[int] = ListStateDescriptor("union", int)
BROADCAST: MapStateDescriptor[str, int] = MapStateDescriptor("broadcast", str, int)


@dataclass(frozen=True)
class DecodedEntry:
    """One entry of a canonical snapshot, decoded."""

    key_group: int
    state: str
    key: Any
    namespace: Any
    stored: Any


def decode_canonical(handle: KeyedStateHandle) -> list[DecodedEntry]:
    """Every entry of a canonical snapshot, decoded with the serializers its header names.

    Works for states declared with built-in serializers, which is all the kit declares.
    """
    header, _ = read_header(handle.stream)
    key_ser = serializer_from_config(header.key_serializer)
    out: list[DecodedEntry] = []
    for kg, sections in iter_blocks(handle, header):
        for s in sections:
            meta = next(m for m in header.states if m["name"] == s.state)
            stored = serializer_from_config(meta["stored_serializer"])
            ns_cfg = meta.get("namespace_serializer")
            ns_ser = serializer_from_config(ns_cfg) if ns_cfg else None
            keys = key_ser.decode_column(s.keys, s.count)
            nss = decode_namespaces(s.namespaces, s.count, ns_ser, VOID_NAMESPACE, s.state)
            vals = stored.decode_column(s.values, s.count)
            out.extend(DecodedEntry(kg, s.state, k, ns, v) for k, ns, v in zip(keys, nss, vals))
    return out


def snapshot_handle(keyed: KeyedStateBackend, *, native: bool = False) -> KeyedStateHandle:
    """Snapshot ``keyed`` now and write it into memory; returns the handle a restore takes."""
    if native:
        if not isinstance(keyed, SupportsNativeSnapshot):
            raise TypeError(f"{type(keyed).__name__} has no native snapshot format")
        snap = keyed.native_snapshot()
        fmt = keyed.native_format
    else:
        snap = keyed.snapshot()
        fmt = CANONICAL_FORMAT
    return write_snapshot(snap, keyed, fmt)


def write_snapshot(snap: Any, keyed: KeyedStateBackend, fmt: str = CANONICAL_FORMAT) -> KeyedStateHandle:
    """Write a taken (possibly pending) snapshot of ``keyed`` into memory."""
    buf = io.BytesIO()
    r = snap.write(buf)
    return KeyedStateHandle(
        BytesStreamHandle(buf.getvalue(), f"<{type(keyed).__name__} {keyed.key_group_range}>"),
        keyed.key_group_range,
        dict(r.offsets),
        r.header_length,
        fmt,
        getattr(keyed, "backend_name", ""),
        r.size,
        r.entries,
    )


@dataclass
class Subtask:
    """One subtask of a job: its backends and declared handles."""

    index: int
    keyed: KeyedStateBackend
    operator: OperatorStateBackend
    local_dir: str
    handles: dict[str, Any] = field(default_factory=dict)
    split: Any = None
    union: Any = None
    broadcast: Any = None


class Job:
    """``parallelism`` subtasks of one operator, their state in backends of one kind.

    Args:
        backend: Creates the keyed and operator backends.
        backend_name: How messages name the backend.
        parallelism: The number of subtasks.
        max_parallelism: The number of key groups.
        clock: The processing-time clock every keyed backend reads.
        scratch: Where each keyed backend gets a fresh ``local_dir``.
        key_serializer: Serializes keys (``str`` by default).
        key_cache_size: Passed to ``create_keyed_backend``.
        keyed_backend: Makes the keyed backends instead of ``backend`` (operator state only
            matters, and the cheapest keyed backends will do).
    """

    def __init__(
        self,
        backend: StateBackend,
        *,
        backend_name: str,
        parallelism: int,
        max_parallelism: int,
        clock: Callable[[], int],
        scratch: Path,
        key_serializer: TypeSerializer | None = None,
        key_cache_size: int = 131072,
        keyed_backend: StateBackend | None = None,
    ) -> None:
        self.backend = backend
        self.backend_name = backend_name
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.clock = clock
        self.key_serializer = key_serializer or StrSerializer()
        self.subtasks: list[Subtask] = []
        self._closed = False
        scratch.mkdir(parents=True, exist_ok=True)
        self._dir = tempfile.mkdtemp(prefix=f"{backend_name}-p{parallelism}-", dir=scratch)
        try:
            for i in range(parallelism):
                local_dir = os.path.join(self._dir, f"subtask-{i}")
                os.mkdir(local_dir)
                keyed = (keyed_backend or backend).create_keyed_backend(
                    key_serializer=self.key_serializer,
                    key_group_range=key_group_range_for_operator(max_parallelism, parallelism, i),
                    max_parallelism=max_parallelism,
                    clock=clock,
                    key_cache_size=key_cache_size,
                    local_dir=local_dir,
                )
                self.subtasks.append(Subtask(i, keyed, backend.create_operator_backend(), local_dir))
        except BaseException:
            self.close()
            raise

    # --- routing and declaration --------------------------------------------------------------

    def key_group(self, key: Any) -> int:
        """The key group of ``key``."""
        return key_group_for_bytes(self.key_serializer.serialize(key), self.max_parallelism)

    def owner(self, key: Any) -> Subtask:
        """The subtask owning ``key``'s key group."""
        i = operator_index_for_key_group(self.max_parallelism, self.parallelism, self.key_group(key))
        return self.subtasks[i]

    def at(self, key: Any, ns: Any, name: str) -> Any:
        """The handle of state ``name`` at ``key``'s subtask, with ``key`` and ``ns`` current."""
        st = self.owner(key)
        st.keyed.set_current_key(key)
        h = st.handles[name]
        h.set_current_namespace(ns)
        return h

    def declare_keyed(self, specs: Sequence[KeyedStateSpec]) -> None:
        """Declare every keyed state on every subtask (``get_state``), with int namespaces."""
        for st in self.subtasks:
            for spec in specs:
                st.handles[spec.name] = st.keyed.get_state(
                    spec.descriptor(), namespace_serializer=NAMESPACE_SERIALIZER
                )

    def declare_operator(self) -> None:
        """Declare the even-split and union lists and the broadcast map on every subtask."""
        for st in self.subtasks:
            st.split = st.operator.get_list_state(SPLIT)
            st.union = st.operator.get_union_list_state(UNION)
            st.broadcast = st.operator.get_broadcast_state(BROADCAST)

    # --- reading everything back ----------------------------------------------------------------

    def keyed_handles(self, *, native: bool = False) -> list[KeyedStateHandle]:
        """A snapshot of every subtask's keyed state, written into memory."""
        return [snapshot_handle(st.keyed, native=native) for st in self.subtasks]

    def operator_snapshots(self) -> list[OperatorSnapshot]:
        """Every subtask's operator state, serialized."""
        return [st.operator.snapshot() for st in self.subtasks]

    def decoded(self) -> list[list[DecodedEntry]]:
        """Every subtask's keyed state, decoded from a canonical snapshot taken now."""
        return [decode_canonical(h) for h in self.keyed_handles()]

    def operator_state(self) -> tuple[list[list[int]], list[list[int]], list[dict[str, int]]]:
        """Each subtask's even-split list, union list and broadcast map, through the handles."""
        return (
            [list(st.split.get()) for st in self.subtasks],
            [list(st.union.get()) for st in self.subtasks],
            [dict(st.broadcast.items()) for st in self.subtasks],
        )

    # --- restoring into a new job -----------------------------------------------------------------

    def restore_from(
        self,
        keyed: Sequence[KeyedStateHandle],
        operator: Sequence[OperatorSnapshot],
        specs: Sequence[KeyedStateSpec],
        *,
        declare_first: bool,
        native: bool = False,
    ) -> None:
        """Restore this (new) job from snapshots of an old one; operator state is redistributed here."""
        ops = redistribute_operator_state(list(operator), self.parallelism)
        if declare_first:
            self.declare_keyed(specs)
        for st in self.subtasks:
            if native:
                kb = st.keyed
                assert isinstance(kb, SupportsNativeSnapshot)
                kb.restore_native(list(keyed))
            else:
                st.keyed.restore(list(keyed))
            st.operator.restore(ops[st.index])
        if not declare_first:
            self.declare_keyed(specs)
        self.declare_operator()

    def write_checkpoint(
        self, storage: CheckpointStorage, job_id: str, checkpoint_id: int, *, savepoint: bool
    ) -> str:
        """Write a checkpoint (or savepoint) of every subtask through ``storage``; returns its location."""
        writer = (
            storage.begin_savepoint(job_id) if savepoint else storage.begin_checkpoint(job_id, checkpoint_id)
        )
        try:
            states = [
                write_subtask_state(
                    writer,
                    OPERATOR_ID,
                    st.index,
                    st.keyed,
                    st.operator,
                    max_state_size=None if savepoint else storage.max_state_size,
                )
                for st in self.subtasks
            ]
            return complete_checkpoint(
                writer,
                job_id=job_id,
                checkpoint_id=checkpoint_id,
                max_parallelism=self.max_parallelism,
                subtasks=states,
                kind="savepoint" if savepoint else "checkpoint",
            )
        except BaseException:
            writer.abort()
            raise

    def restore_checkpoint(
        self,
        storage: CheckpointStorage,
        location: str,
        specs: Sequence[KeyedStateSpec],
        *,
        declare_first: bool,
    ) -> None:
        """Restore this (new) job from a checkpoint or savepoint, as a runner does."""
        cp = load_checkpoint(storage, location)
        cp.validate(max_parallelism=self.max_parallelism, operators={OPERATOR_ID: self.parallelism})
        ops = cp.operator_states(OPERATOR_ID, self.parallelism)
        if declare_first:
            self.declare_keyed(specs)
        for st in self.subtasks:
            cp.restore_subtask(
                OPERATOR_ID, st.index, self.parallelism, st.keyed, st.operator, operator_states=ops
            )
        if not declare_first:
            self.declare_keyed(specs)
        self.declare_operator()

    # --- life cycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Close every backend and delete the local directories."""
        if self._closed:
            return
        self._closed = True
        try:
            for st in self.subtasks:
                try:
                    st.keyed.close()
                finally:
                    st.operator.close()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __repr__(self) -> str:
        """Names the backend and the layout."""
        return f"Job({self.backend_name}, p={self.parallelism}, maxp={self.max_parallelism})"


def new_job_id() -> str:
    """A job id no other example uses."""
    return f"kit-{uuid.uuid4().hex[:12]}"
