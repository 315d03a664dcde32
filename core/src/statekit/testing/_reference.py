"""A reference backend and a reference storage: small, obviously correct, in memory.

They give the conformance kit a partner when the tested plugin is the other
half: :class:`CheckpointStorageTests` restores into the reference backend by
default, :class:`StateBackendTests` writes checkpoints to the reference storage
by default. They are also the smallest complete examples of the two contracts,
and the base of the deliberately broken backends in the kit's own tests.

The reference keyed backend keeps every entry as serialized bytes in dicts per
state and key group, so reads always return fresh copies and a snapshot only
has to copy dicts of immutable bytes.
"""

from __future__ import annotations

import io
import itertools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .._errors import CheckpointError, CheckpointNotFoundError, CorruptSnapshotError
from ..serialization._keygroups import KeyGroupRange
from ..snapshots._native import NativeSnapshotOutput, NativeStateHandle
from ..snapshots._snapshot import BytesStreamHandle, KeyedStateHandle, ProgressCallback, StreamStateHandle
from ..state._declared import DeclaredStateBackend
from ..state._keyed import KeyedBackendBase
from ..state._keyed_snapshots import KeyedSnapshot
from ..state._parameters import KeyedBackendParameters
from ..state._registered import RegisteredState, StateEntries
from ..state._slots import SlotListState, SlotMapState, SlotState, SlotValueState

__all__ = [
    "REFERENCE_NATIVE_FORMAT",
    "ReferenceCheckpointStorage",
    "ReferenceKeyedStateBackend",
    "ReferenceStateBackend",
]

REFERENCE_NATIVE_FORMAT = "reference-native-2"
_NATIVE_MAGIC = b"REFNATV2"
_NATIVE_FILE = "state.bin"

_Slot = tuple[Any, Any]  # (key, namespace)
_Table = dict[int, dict[_Slot, bytes]]  # key group -> (key, namespace) -> stored bytes


class _Handle(SlotState):
    """The slot of the current key and namespace: a dict entry of the state's key group."""

    def __init__(self, backend: ReferenceKeyedStateBackend, reg: RegisteredState) -> None:
        super().__init__(reg)
        self._b = backend
        self._ser = reg.serializer

    def _slot(self) -> tuple[dict[_Slot, bytes], _Slot]:
        kg = self._b.current_key_group  # raises StateAccessError without a current key
        table = self._b._tables[self._reg.name]
        d = table.get(kg)
        if d is None:
            d = table[kg] = {}
        return d, (self._b.get_current_key(), self._ns)

    def _get(self) -> Any:
        d, slot = self._slot()
        raw = d.get(slot)
        return None if raw is None else self._ser.deserialize(raw)

    def _put(self, value: Any) -> None:
        d, slot = self._slot()
        if value is None:
            d.pop(slot, None)
        else:
            d[slot] = self._ser.serialize(value)


class _Value(_Handle, SlotValueState):
    pass


class _List(_Handle, SlotListState):
    pass


class _Map(_Handle, SlotMapState):
    pass


class _NativeSnapshot:
    """A native snapshot of the reference backend: one file, the canonical bytes behind a magic of its own."""

    def __init__(
        self, backend: ReferenceKeyedStateBackend, canonical: KeyedSnapshot, checkpoint_id: int
    ) -> None:
        self._backend = backend
        self._canonical = canonical
        self._checkpoint_id = checkpoint_id

    def write(
        self, out: NativeSnapshotOutput, *, progress: ProgressCallback | None = None
    ) -> NativeStateHandle:
        buf = io.BytesIO()
        buf.write(_NATIVE_MAGIC)
        r = self._canonical.write(buf, progress=progress)
        shift = len(_NATIVE_MAGIC)
        f = out.upload(_NATIVE_FILE, buf.getvalue(), shared=False)
        b, header = self._backend, self._canonical.header
        return b.native_handle(
            self._checkpoint_id,
            (f,),
            states=list(header.states),
            meta={
                "range": [b.key_group_range.start, b.key_group_range.end],
                "header_length": r.header_length + shift,
                "offsets": {str(kg): [o + shift, n] for kg, (o, n) in r.offsets.items()},
            },
            entries=r.entries,
        )

    def release(self) -> None:
        self._canonical.release()


class _Shifted:
    """A stream handle that hides the first ``shift`` bytes of another."""

    def __init__(self, inner: StreamStateHandle, shift: int) -> None:
        self._inner = inner
        self._shift = shift

    @property
    def size(self) -> int:
        return self._inner.size - self._shift

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        return self._inner.read(offset + self._shift, length)

    def discard(self) -> None:
        self._inner.discard()

    def to_json(self) -> dict[str, Any]:
        return self._inner.to_json()


class ReferenceKeyedStateBackend(KeyedBackendBase):
    """Keyed state as serialized bytes in dicts; copies them at the snapshot point.

    Satisfies :class:`statekit.backend_api.SupportsNativeSnapshot` with a trivial native
    format (the canonical bytes behind a magic of its own), so that the kit's
    native-snapshot path always has a backend to run against.
    """

    backend_name = "reference"
    native_format = REFERENCE_NATIVE_FORMAT

    def __init__(
        self,
        parameters: KeyedBackendParameters | None = None,
        options: Mapping[str, Any] | None = None,
        /,
        **keywords: Any,
    ) -> None:
        """An empty backend owning ``parameters.key_group_range`` (no options; keywords as the base)."""
        super().__init__(parameters, **keywords)
        self._tables: dict[str, _Table] = {}

    def _create_value(self, reg: RegisteredState) -> Any:
        self._tables[reg.name] = {}
        return _Value(self, reg)

    def _create_list(self, reg: RegisteredState) -> Any:
        self._tables[reg.name] = {}
        return _List(self, reg)

    def _create_map(self, reg: RegisteredState) -> Any:
        self._tables[reg.name] = {}
        return _Map(self, reg)

    def _snapshot_entries(self) -> Callable[[str, int], StateEntries]:
        frozen = {name: {kg: dict(d) for kg, d in t.items() if d} for name, t in self._tables.items()}
        serializers = {name: self._states[name].serializer for name in frozen}

        def read(name: str, kg: int) -> StateEntries:
            d = frozen[name].get(kg, {})
            des = serializers[name].deserialize
            return [k for k, _ in d], [ns for _, ns in d], [des(v) for v in d.values()]

        return read

    def _load_entries(
        self, reg: RegisteredState, key_group: int, keys: list[Any], namespaces: list[Any], values: list[Any]
    ) -> None:
        d = self._tables[reg.name].setdefault(key_group, {})
        ser = reg.serializer
        for k, ns, v in zip(keys, namespaces, values):
            d[(k, ns)] = ser.serialize(v)

    def _state_keys(self, reg: RegisteredState, namespace: Any) -> Iterator[Any]:
        table = self._tables[reg.name]
        return iter([k for d in table.values() for (k, ns) in d if ns == namespace])

    def _state_size(self, reg: RegisteredState) -> int:
        return sum(len(d) for d in self._tables[reg.name].values())

    # --- the optional native format -------------------------------------------------------

    def native_snapshot(self, checkpoint_id: int) -> _NativeSnapshot:
        """Freezes the state now; ``write(out)`` uploads it as one file, never referencing earlier ones."""
        return _NativeSnapshot(self, self.snapshot(), checkpoint_id)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Nothing to do: every native snapshot uploads all of its bytes."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Nothing to do: no snapshot references another's uploads."""

    def restore_native(self, handles: Sequence[NativeStateHandle]) -> None:
        """Restores the owned key groups of native snapshots of this backend.

        Raises:
            CorruptSnapshotError: If a handle is not in this backend's native format.
        """
        self.check_native_restore(handles, REFERENCE_NATIVE_FORMAT)
        shift = len(_NATIVE_MAGIC)
        canonical = []
        for h in handles:
            data = h.file(_NATIVE_FILE).read()  # checks size and CRC-32
            if data[:shift] != _NATIVE_MAGIC:
                raise CorruptSnapshotError(
                    f"not a snapshot in the {REFERENCE_NATIVE_FORMAT} format (bad magic)"
                )
            offsets = {int(kg): (int(o) - shift, int(n)) for kg, (o, n) in h.meta["offsets"].items()}
            full = KeyedStateHandle(
                _Shifted(BytesStreamHandle(data, _NATIVE_FILE), shift),
                KeyGroupRange.of(*(int(x) for x in h.meta["range"])),
                offsets,
                int(h.meta["header_length"]) - shift,
                backend=h.backend,
                entries=h.entries,
            ).intersect(h.key_group_range)
            if full is not None:
                canonical.append(full)
        self.restore(canonical)


class ReferenceStateBackend(DeclaredStateBackend):
    """The ``reference`` state backend: makes reference keyed backends (``local_dir`` unused, no options)."""

    name = "reference"
    keyed_backend = ReferenceKeyedStateBackend


# --- the reference checkpoint storage ------------------------------------------------------------


class _Stream:
    def __init__(self, storage: ReferenceCheckpointStorage, name: str) -> None:
        self._storage = storage
        self._name = name
        self._buf = bytearray()
        self._closed = False

    def write(self, data: bytes) -> int:
        if self._closed:
            raise CheckpointError(f"stream {self._name!r} is closed")
        self._buf += data
        return len(data)

    def tell(self) -> int:
        return len(self._buf)

    def close_and_get_handle(self) -> StreamStateHandle:
        self._closed = True
        blob = self._storage._put(bytes(self._buf))
        return _BlobHandle(self._storage, blob, self._name)

    def discard(self) -> None:
        self._closed = True
        self._buf.clear()


class _BlobHandle:
    """A stream handle over a blob kept by a :class:`ReferenceCheckpointStorage`."""

    def __init__(self, storage: ReferenceCheckpointStorage, blob: int, name: str) -> None:
        self._storage = storage
        self._blob = blob
        self._name = name

    def _data(self) -> bytes:
        data = self._storage._blobs.get(self._blob)
        if data is None:
            raise CheckpointNotFoundError(f"blob {self._blob} ({self._name}) was discarded")
        return data

    @property
    def size(self) -> int:
        return len(self._data())

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        return BytesStreamHandle(self._data(), self._name).read(offset, length)

    def discard(self) -> None:
        self._storage._blobs.pop(self._blob, None)

    def to_json(self) -> dict[str, Any]:
        return {"type": "blob", "blob": self._blob, "name": self._name}


class _Writer:
    def __init__(
        self, storage: ReferenceCheckpointStorage, location: str, checkpoint: tuple[str, int] | None
    ):
        self._storage = storage
        self._location = location
        self._checkpoint = checkpoint
        self._blobs: list[int] = []

    @property
    def location(self) -> str:
        return self._location

    def _refuse_if_complete(self, what: str) -> None:
        if self._location in self._storage._metadata:
            raise CheckpointError(f"{self._location} is complete: {what} refused, nothing changed")

    def create_stream(self, name: str, *, shared: bool = False) -> _Stream:
        self._refuse_if_complete(f"a stream {name!r}")
        return _Stream(self._storage, name)

    def complete(self, metadata: bytes) -> str:
        with self._storage._lock:
            if self._location in self._storage._metadata:
                raise CheckpointError(f"{self._location} is already complete")
            self._storage._metadata[self._location] = bytes(metadata)
        return self._location

    def abort(self) -> None:
        """Nothing to delete (unreferenced blobs are harmless in a test storage); a completed one refuses."""
        self._refuse_if_complete("abort()")


class ReferenceCheckpointStorage:
    """Checkpoints and savepoints as blobs in this object's memory.

    Locations are ``ref://<job>/chk-<n>`` and ``ref://<job>/savepoint-<n>``;
    nothing is ever written to disk.
    """

    name = "reference"
    max_state_size: int | None = None

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        """Takes no options."""
        self._blobs: dict[int, bytes] = {}
        self._metadata: dict[str, bytes] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def _put(self, data: bytes) -> int:
        with self._lock:
            blob = next(self._ids)
            self._blobs[blob] = data
        return blob

    def begin_checkpoint(self, job_id: str, checkpoint_id: int) -> _Writer:
        """A writer for checkpoint ``checkpoint_id``."""
        return _Writer(self, f"ref://{job_id}/chk-{checkpoint_id}", (job_id, checkpoint_id))

    def begin_savepoint(self, job_id: str, target_dir: str | None = None) -> _Writer:
        """A writer for a new savepoint (``target_dir`` is ignored)."""
        return _Writer(self, f"ref://{job_id}/savepoint-{next(self._ids)}", None)

    def list_checkpoints(self, job_id: str) -> list[str]:
        """Completed checkpoints of ``job_id``, oldest first."""
        prefix = f"ref://{job_id}/chk-"
        found = [loc for loc in self._metadata if loc.startswith(prefix)]
        return sorted(found, key=lambda loc: int(loc[len(prefix) :]))

    def latest_checkpoint(self, job_id: str) -> str | None:
        """The newest completed checkpoint of ``job_id``."""
        done = self.list_checkpoints(job_id)
        return done[-1] if done else None

    def read_metadata(self, location: str) -> bytes:
        """The metadata at ``location``.

        Raises:
            CheckpointNotFoundError: If there is none.
        """
        data = self._metadata.get(location.rstrip("/"))
        if data is None:
            raise CheckpointNotFoundError(f"no checkpoint or savepoint at {location}")
        return data

    def resolve_handle(self, location: str, description: Mapping[str, Any]) -> StreamStateHandle:
        """The blob a metadata entry describes."""
        if description.get("type") != "blob":
            raise CheckpointError(f"{location}: not a reference storage handle: {dict(description)}")
        return _BlobHandle(self, int(description["blob"]), str(description.get("name", "")))

    def discard_checkpoint(self, location: str) -> None:
        """Forgets a checkpoint's metadata (its blobs are dropped with the storage)."""
        if "/chk-" not in location:
            raise CheckpointError(f"refusing to discard {location}: not a checkpoint")
        self._metadata.pop(location, None)

    def discard_shared(self, location: str, description: Mapping[str, Any]) -> None:
        """Drops a shared blob."""
        self._blobs.pop(int(description["blob"]), None)
