"""The kit's harness: the subtasks of one operator, on one backend, at one parallelism.

A :class:`Job` owns ``p`` subtasks, each the runtime's
:class:`~statekit.runtime._subtask.Subtask` (keyed and operator backends
created by a :class:`~statekit.backend_api.StateBackend`, as the runners create theirs;
each keyed backend with a fresh ``local_dir``),
routes keys to the subtask owning their key group, snapshots every subtask
(canonically or natively), restores into a new job at any parallelism, directly
or through a :class:`~statekit.backend_api.CheckpointStorage`, and reads everything back
without side effects: keyed state by decoding canonical snapshots, operator
state through its handles.
"""

from __future__ import annotations

import io
import itertools
import os
import shutil
import tempfile
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._contracts import (
    CheckpointStorage,
    KeyedStateBackend,
    OperatorStateBackend,
    StateBackend,
    SupportsNativeSnapshot,
)
from .._errors import CorruptSnapshotError
from ..checkpoints._restore import load_checkpoint
from ..checkpoints._writing import complete_checkpoint, write_subtask_state
from ..runtime._subtask import Subtask
from ..serialization._keygroups import (
    key_group_for_bytes,
    operator_index_for_key_group,
)
from ..serialization._serializers import StrSerializer, TypeSerializer, serializer_from_config
from ..snapshots._digest import sha256_of
from ..snapshots._native import NativeFile, NativeStateHandle
from ..snapshots._snapshot import (
    CANONICAL_FORMAT,
    BytesStreamHandle,
    KeyedStateHandle,
    decode_namespaces,
    iter_blocks,
    read_header,
)
from ..state._operator import OperatorSnapshot, redistribute_operator_state
from ..state._parameters import DEFAULT_KEY_CACHE_SIZE, KeyedBackendParameters
from ..state._state import VOID_NAMESPACE, ListStateDescriptor, MapStateDescriptor
from ._model import NAMESPACE_SERIALIZER, KeyedStateSpec
from ._violation import NATIVE_REFERENCES_COMPLETED, PropertyViolation

__all__ = [
    "BROADCAST",
    "OPERATOR_ID",
    "SPLIT",
    "UNION",
    "BackendFactory",
    "DeclaredSubtask",
    "DecodedEntry",
    "Job",
    "KitNativeOutput",
    "NativeCheckpoints",
    "StorageFactory",
    "check_native_references",
    "decode_canonical",
    "new_job_id",
    "snapshot_handle",
    "write_snapshot",
]

BackendFactory = Callable[[], StateBackend]
"""Makes a fresh :class:`~statekit.backend_api.StateBackend`; called once per example or test."""

StorageFactory = Callable[[], CheckpointStorage]
"""Makes a fresh :class:`~statekit.backend_api.CheckpointStorage` (savepoints included)."""

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


class KitNativeStream:
    """A file of a native snapshot kept in memory by the kit; deleting it makes later reads fail."""

    def __init__(self, data: bytes, name: str, checkpoint_id: int) -> None:
        self.data = data
        self.name = name
        self.checkpoint_id = checkpoint_id
        self.deleted = False

    @property
    def size(self) -> int:
        """The number of bytes."""
        return len(self.data)

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        """A slice of the bytes; fails once the file was deleted."""
        if self.deleted:
            raise CorruptSnapshotError(
                f"{self.name}: deleted with its checkpoint {self.checkpoint_id}, which never completed"
            )
        end = len(self.data) if length is None else offset + length
        return self.data[offset:end]

    def discard(self) -> None:
        """Delete the file."""
        self.deleted = True

    def to_json(self) -> dict[str, Any]:
        """Kit streams are never written into a storage's metadata."""
        return {"type": "kit-native", "name": self.name, "size": len(self.data)}


class KitNativeOutput:
    """Where the kit's native snapshots upload their files: memory, each file tagged with its checkpoint."""

    def __init__(self, checkpoint_id: int) -> None:
        self._checkpoint_id = checkpoint_id
        self.uploaded: list[KitNativeStream] = []

    @property
    def checkpoint_id(self) -> int:
        """The checkpoint being written."""
        return self._checkpoint_id

    def upload(self, name: str, source: str | os.PathLike[str] | bytes, *, shared: bool = True) -> NativeFile:
        """Keep ``source`` (a path or bytes) in memory as file ``name`` of this checkpoint."""
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
        else:
            with open(source, "rb") as f:
                data = f.read()
        stream = KitNativeStream(data, f"<kit native chk {self._checkpoint_id}: {name}>", self._checkpoint_id)
        self.uploaded.append(stream)
        return NativeFile(
            name, stream, len(data), zlib.crc32(data), shared, self._checkpoint_id, sha256_of(data)
        )

    def delete_all(self) -> None:
        """Delete every upload, as a storage may do with an aborted checkpoint's files at any time."""
        for stream in self.uploaded:
            stream.discard()


@dataclass
class NativeCheckpoints:
    """Checkpoint ids for native snapshots of one job lineage, and which of them completed."""

    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    completed: set[int] = field(default_factory=set)
    stored: set[int] = field(default_factory=set)
    """The completed checkpoints written through the storage."""
    confirm_in_memory: bool = True
    """Whether native snapshots the kit writes into memory are confirmed (notify_checkpoint_complete).

    The completion contract lets a backend reference every upload of a checkpoint it
    was told completed, so the kit confirms a checkpoint only where the backend's
    later checkpoints can reach its files: a lineage that also checkpoints through a
    storage has its in-memory snapshots aborted instead (notify_checkpoint_aborted).
    """

    def next_id(self) -> int:
        """A new checkpoint id, larger than every earlier one."""
        return next(self.ids)


def check_native_references(handle: NativeStateHandle, completed: set[int], context: str) -> None:
    """Raise :class:`PropertyViolation` if ``handle`` references an upload of an uncompleted checkpoint."""
    for f in handle.files:
        stream = f.stream
        uploaded_by = stream.checkpoint_id if isinstance(stream, KitNativeStream) else f.checkpoint_id
        if uploaded_by != f.checkpoint_id:
            raise PropertyViolation(
                NATIVE_REFERENCES_COMPLETED,
                f"{context}: file {f.name!r} says checkpoint {f.checkpoint_id} uploaded it, "
                f"but checkpoint {uploaded_by} did",
            )
        if uploaded_by != handle.checkpoint_id and uploaded_by not in completed:
            raise PropertyViolation(
                NATIVE_REFERENCES_COMPLETED,
                f"{context}: the native snapshot of checkpoint {handle.checkpoint_id} references file "
                f"{f.name!r}, uploaded by checkpoint {uploaded_by}, which never completed "
                f"(completed: {sorted(completed) or 'none'}); an upload may be referenced only after "
                "notify_checkpoint_complete",
            )
    if handle.checkpoint_id in completed:
        raise PropertyViolation(
            NATIVE_REFERENCES_COMPLETED, f"{context}: checkpoint id {handle.checkpoint_id} was used twice"
        )


def native_snapshot_handle(
    keyed: KeyedStateBackend,
    checkpoints: NativeCheckpoints | None = None,
    *,
    outcome: str = "complete",
) -> tuple[NativeStateHandle, KitNativeOutput]:
    """Take and write a native snapshot of ``keyed``, check its references, then settle its checkpoint.

    ``outcome``: ``complete`` (notify_checkpoint_complete), ``abort``
    (notify_checkpoint_aborted, and the uploads are deleted) or ``lost`` (the
    checkpoint failed and the backend is never told; its uploads are deleted).
    """
    if not isinstance(keyed, SupportsNativeSnapshot):
        raise TypeError(f"{type(keyed).__name__} has no native snapshot format")
    cps = checkpoints or _DEFAULT_CHECKPOINTS
    cid = cps.next_id()
    out = KitNativeOutput(cid)
    handle = keyed.native_snapshot(cid).write(out)
    check_native_references(handle, cps.completed, f"{type(keyed).__name__} {keyed.key_group_range}")
    if outcome == "complete":
        cps.completed.add(cid)
        keyed.notify_checkpoint_complete(cid)
    else:
        if outcome == "abort":
            keyed.notify_checkpoint_aborted(cid)
        out.delete_all()
    return handle, out


_DEFAULT_CHECKPOINTS = NativeCheckpoints()


def snapshot_handle(keyed: KeyedStateBackend, *, native: bool = False) -> Any:
    """Snapshot ``keyed`` now and write it into memory; returns the handle a restore takes.

    Canonical: a :class:`KeyedStateHandle`. Native: a :class:`NativeStateHandle`
    of a checkpoint of its own (ids go up across every call) that then completes:
    ``keyed`` is told ``notify_checkpoint_complete``, so under the completion
    contract its later native snapshots may reference these in-memory uploads.
    Use it on a backend whose native snapshots all go through this helper (a
    plugin's own tests), not on one that also checkpoints through a storage.
    """
    if native:
        return native_snapshot_handle(keyed)[0]
    return write_snapshot(keyed.snapshot(), keyed, CANONICAL_FORMAT)


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


class DeclaredSubtask(Subtask):
    """One subtask of a kit job: the runtime's :class:`Subtask` (its backends), and the handles declared.

    Attributes:
        handles: The keyed states' handles by name (:meth:`Job.declare_keyed`).
        split: The even-split operator list (:meth:`Job.declare_operator`).
        union: The union operator list.
        broadcast: The broadcast operator map.
    """

    def __init__(
        self,
        index: int,
        parameters: KeyedBackendParameters,
        keyed: KeyedStateBackend,
        operator: OperatorStateBackend,
    ) -> None:
        super().__init__(index, parameters, keyed, operator)
        self.handles: dict[str, Any] = {}
        self.split: Any = None
        self.union: Any = None
        self.broadcast: Any = None

    @property
    def local_dir(self) -> str:
        """The keyed backend's working directory."""
        assert self.parameters.local_dir is not None  # the job gives every subtask one
        return self.parameters.local_dir


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
        key_cache_size: int = DEFAULT_KEY_CACHE_SIZE,
        keyed_backend: StateBackend | None = None,
    ) -> None:
        self.backend = backend
        self.backend_name = backend_name
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.clock = clock
        self.key_serializer = key_serializer or StrSerializer()
        self.subtasks: list[DeclaredSubtask] = []
        self.native_checkpoints = NativeCheckpoints()
        # Per subtask that took keys from hand_over: its key switch with a group, and those keys' groups.
        self._handed: dict[int, tuple[Callable[[Any, int], None], dict[Any, int]]] = {}
        self._closed = False
        scratch.mkdir(parents=True, exist_ok=True)
        self._dir = tempfile.mkdtemp(prefix=f"{backend_name}-p{parallelism}-", dir=scratch)
        try:
            for i in range(parallelism):
                local_dir = os.path.join(self._dir, f"subtask-{i}")
                os.mkdir(local_dir)
                self.subtasks.append(
                    DeclaredSubtask.make(
                        i,
                        parallelism,
                        keyed_backend or backend,
                        key_serializer=self.key_serializer,
                        max_parallelism=max_parallelism,
                        clock=clock,
                        key_cache_size=key_cache_size,
                        local_dir=local_dir,
                        operator_backend=backend,
                    )
                )
        except BaseException:
            self.close()
            raise

    # --- routing and declaration --------------------------------------------------------------

    def key_group(self, key: Any) -> int:
        """The key group of ``key``."""
        return key_group_for_bytes(self.key_serializer.serialize(key), self.max_parallelism)

    def owner(self, key: Any) -> DeclaredSubtask:
        """The subtask owning ``key``'s key group."""
        return self.subtasks[self._index(self.key_group(key))]

    def _index(self, key_group: int) -> int:
        """The index of the subtask owning ``key_group``."""
        return operator_index_for_key_group(self.max_parallelism, self.parallelism, key_group)

    def hand_over(self, keys: Sequence[Any]) -> None:
        """Hand each subtask its keys, with their key groups, before reading them (as Spark's routing does).

        ``hand_over_key_groups`` of a backend on ``KeyedBackendBase``, which passes them to its
        ``_keys_ahead``: a backend that looks keys up together then serves the reads that follow.
        Where it takes them, :meth:`at` makes those keys current as the Spark runner's per-record
        loop does (``set_current_key_in_group``); where not, they are remembered for
        ``set_current_key`` (``remember_key_groups``).
        """
        mine: dict[int, tuple[list[Any], list[int]]] = {}
        for key in keys:
            kg = self.key_group(key)
            ks, gs = mine.setdefault(self._index(kg), ([], []))
            ks.append(key)
            gs.append(kg)
        self._handed = {}
        for i, (ks, gs) in mine.items():
            keyed = self.subtasks[i].keyed
            hand = getattr(keyed, "hand_over_key_groups", None)
            if hand is not None and hand(ks, gs):
                self._handed[i] = (keyed.set_current_key_in_group, dict(zip(ks, gs)))  # type: ignore[attr-defined]
                continue
            remember = getattr(keyed, "remember_key_groups", None)
            if remember is not None:
                remember(ks, gs)

    def at(self, key: Any, ns: Any, name: str) -> Any:
        """The handle of state ``name`` at ``key``'s subtask, with ``key`` and ``ns`` current.

        A key the subtask took from :meth:`hand_over` is made current with its key group.
        """
        kg = self.key_group(key)
        index = self._index(kg)
        st = self.subtasks[index]
        handed = self._handed.get(index)
        if handed is not None and key in handed[1]:
            handed[0](key, kg)
        else:
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

    def keyed_handles(self, *, native: bool = False) -> list[Any]:
        """A snapshot of every subtask's keyed state in memory (native ones form a completed checkpoint)."""
        if not native:
            return [snapshot_handle(st.keyed) for st in self.subtasks]
        cps = self.native_checkpoints
        handles, outputs = [], []
        cid = cps.next_id()
        for st in self.subtasks:
            keyed = st.keyed
            assert isinstance(keyed, SupportsNativeSnapshot)
            out = KitNativeOutput(cid)
            h = keyed.native_snapshot(cid).write(out)
            check_native_references(h, cps.completed, f"{self} subtask {st.index}")
            handles.append(h)
            outputs.append(out)
        self.settle_native(cid, "complete" if cps.confirm_in_memory else "abort")
        return handles

    def settle_native(self, checkpoint_id: int, outcome: str) -> None:
        """Tell every subtask that native checkpoint ``checkpoint_id`` completed, or aborted; or nothing."""
        if outcome == "complete":
            self.native_checkpoints.completed.add(checkpoint_id)
        for st in self.subtasks:
            keyed = st.keyed
            if not isinstance(keyed, SupportsNativeSnapshot):
                continue
            if outcome == "complete":
                keyed.notify_checkpoint_complete(checkpoint_id)
            elif outcome == "abort":
                keyed.notify_checkpoint_aborted(checkpoint_id)

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
        keyed: Sequence[Any],
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
        """Write a checkpoint (or savepoint) of every subtask through ``storage``; returns its location.

        Checkpoints are native where the backend has a native format (as runners
        write them), and complete with notify_checkpoint_complete; savepoints are canonical.
        """
        writer = (
            storage.begin_savepoint(job_id) if savepoint else storage.begin_checkpoint(job_id, checkpoint_id)
        )
        native = None if savepoint else checkpoint_id
        try:
            states = [
                write_subtask_state(
                    writer,
                    OPERATOR_ID,
                    st.index,
                    st.keyed,
                    st.operator,
                    max_state_size=None if savepoint else storage.max_state_size,
                    native_checkpoint_id=native,
                )
                for st in self.subtasks
            ]
            for state in states:
                if state.keyed and "native" in state.keyed:
                    handle = NativeStateHandle.from_json(state.keyed["native"], _unresolved)
                    check_native_references(
                        handle, self.native_checkpoints.completed, f"{self} subtask {state.subtask_index}"
                    )
            location = complete_checkpoint(
                writer,
                job_id=job_id,
                checkpoint_id=checkpoint_id,
                max_parallelism=self.max_parallelism,
                subtasks=states,
                kind="savepoint" if savepoint else "checkpoint",
            )
        except BaseException:
            writer.abort()
            if native is not None:
                self.settle_native(native, "abort")
            raise
        if native is not None:
            self.native_checkpoints.stored.add(native)
            self.settle_native(native, "complete")
        return location

    @property
    def native(self) -> bool:
        """Whether this job's keyed backends have a native format (checkpoints are then native)."""
        return bool(self.subtasks) and isinstance(self.subtasks[0].keyed, SupportsNativeSnapshot)

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
        failure: BaseException | None = None
        try:
            for st in self.subtasks:
                try:
                    st.close()
                except BaseException as e:  # noqa: BLE001 - raised below, once every subtask is closed
                    failure = failure or e
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
        if failure is not None:
            raise failure

    def __repr__(self) -> str:
        """Names the backend and the layout."""
        return f"Job({self.backend_name}, p={self.parallelism}, maxp={self.max_parallelism})"


def _unresolved(description: Any) -> Any:
    """Stands for a stream only the references check reads (not its bytes)."""
    return BytesStreamHandle(b"", str(description))


def new_job_id() -> str:
    """A job id no other example uses."""
    return f"kit-{uuid.uuid4().hex[:12]}"
