"""The contracts a state backend and a checkpoint storage fulfil.

They are :class:`typing.Protocol` classes: a third-party backend satisfies
them by shape and need not inherit anything (though
:class:`statekit.backend_api.KeyedBackendBase` saves most of the work).
Optional abilities are small protocols of their own.
"""

from __future__ import annotations

import functools
import inspect
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ._errors import warn_deprecated
from .serialization._keygroups import KeyGroupRange
from .serialization._serializers import TypeSerializer
from .snapshots._native import COMPLETION_CONTRACT, NativeSnapshot, NativeStateHandle
from .snapshots._snapshot import KeyedStateHandle, StreamStateHandle
from .state._operator import BroadcastState, OperatorListState, OperatorSnapshot
from .state._parameters import KeyedBackendParameters
from .state._state import ListStateDescriptor, MapStateDescriptor, StateDescriptor

__all__ = [
    "CheckpointOutputStream",
    "CheckpointStorage",
    "CheckpointWriter",
    "KeyedStateBackend",
    "OperatorStateBackend",
    "StateBackend",
    "SupportsBatchUpdate",
    "SupportsJobFiles",
    "SupportsNativeSnapshot",
    "SupportsOrphanCleanup",
    "SupportsRunFencing",
    "create_keyed_backend",
    "readable_native_formats",
]


@runtime_checkable
class KeyedStateBackend(Protocol):
    """Keyed state of one subtask: the key groups of ``key_group_range``.

    Every state handle reads and writes the entry of the *current key*; the
    key is serialized and assigned to its key group once per
    :meth:`set_current_key`.
    """

    key_group_range: KeyGroupRange
    max_parallelism: int
    key_serializer: TypeSerializer

    def set_current_key(self, key: Any) -> None:
        """Make ``key`` current; raises StateAccessError if its key group is not owned here."""

    def get_current_key(self) -> Any:
        """The current key."""

    @property
    def current_key_group(self) -> int:
        """The key group of the current key."""

    def get_state(
        self, descriptor: StateDescriptor, *, namespace_serializer: TypeSerializer | None = None
    ) -> Any:
        """The (created on first use) handle of a state, bound to the current key."""

    def keys(self, state_name: str, namespace: Any = ...) -> Iterator[Any]:
        """The keys that have an entry of ``state_name`` in ``namespace``."""

    def num_entries(self, state_name: str | None = None) -> int:
        """The number of (key, namespace) entries of one state, or of all states."""

    def snapshot(self) -> Any:
        """Freeze the state now; the result's ``write(out)`` writes a canonical snapshot later."""

    def restore(self, handles: Sequence[KeyedStateHandle]) -> None:
        """Restore the owned key groups of ``handles``; all checks pass before anything changes."""

    def close(self) -> None:
        """Release resources."""


@runtime_checkable
class OperatorStateBackend(Protocol):
    """Non-keyed state of one subtask."""

    def get_list_state(self, descriptor: ListStateDescriptor[Any]) -> OperatorListState:
        """A list redistributed by even split on rescale."""

    def get_union_list_state(self, descriptor: ListStateDescriptor[Any]) -> OperatorListState:
        """A list every subtask receives whole on restore."""

    def get_broadcast_state(self, descriptor: MapStateDescriptor[Any, Any]) -> BroadcastState:
        """A map identical on every subtask."""

    def snapshot(self) -> OperatorSnapshot:
        """Serialize the operator state now."""

    def restore(self, snapshot: OperatorSnapshot) -> None:
        """Take redistributed operator state."""

    def close(self) -> None:
        """Release resources."""


@runtime_checkable
class StateBackend(Protocol):
    """A named state backend: a factory of keyed and operator backends.

    A plugin registers a factory ``factory(options) -> StateBackend`` under a name.
    """

    name: str

    def create_keyed_backend(self, parameters: KeyedBackendParameters, /) -> KeyedStateBackend:
        """A keyed backend for one subtask, made from the runner's parameters, whole.

        ``parameters`` (a :class:`~statekit.backend_api.KeyedBackendParameters`)
        holds the key serializer, the subtask's key groups, the max parallelism,
        the clock, the key cache size and ``local_dir`` (where an on-disk
        backend keeps its files). A backend of an earlier release that takes
        them as keyword arguments still works until statekit 0.2.0, with a
        DeprecationWarning (see :func:`create_keyed_backend`).
        """

    def create_operator_backend(self) -> OperatorStateBackend:
        """An operator backend for one subtask."""


@runtime_checkable
class SupportsBatchUpdate(Protocol):
    """A value state handle that updates many keys in one call."""

    def update_batch(self, keys: Iterable[Any], fn: Callable[[Any], Any]) -> list[Any]:
        """For each key in order: store ``fn(value or default)``; return what was stored."""


@runtime_checkable
class SupportsNativeSnapshot(Protocol):
    """A keyed backend that also snapshots in a format of its own, incrementally if it likes.

    A native snapshot is the backend's own files (an engine's, say): faster to
    take and restore, and incremental (a checkpoint uploads only files no
    completed checkpoint uploaded before), but only the same backend restores
    it. The canonical format stays required, and savepoints always use it.
    The guarantees are those of :meth:`KeyedStateBackend.snapshot` and
    :meth:`KeyedStateBackend.restore`: the snapshot is unaffected by writes made
    after it was taken, a restore keeps the owned key groups of handles written
    at any parallelism, and every check passes before anything changes.

    Runners call, for every checkpoint ``n`` they take natively:
    ``native_snapshot(n)`` at the checkpoint point, ``write(out)`` on the
    result (maybe later, maybe on another thread), then at most one of
    ``notify_checkpoint_complete(n)`` (checkpoint ``n`` exists) or
    ``notify_checkpoint_aborted(n)`` (it never will); sometimes neither (a
    driver that died). ``statekit.testing`` exercises all of it.

    The completion contract follows (``snapshots._native.COMPLETION_CONTRACT``,
    appended when this module is imported, so that it is written once).
    """

    native_format: str
    """The name of the format; restores compare it with ``NativeStateHandle.format``.

    A backend that also restores earlier formats of its own (``lmdb`` reads its
    full copies and its key-group files) lists every format it restores in an
    optional attribute ``readable_native_formats`` (see :func:`readable_native_formats`).
    """

    def native_snapshot(self, checkpoint_id: int) -> NativeSnapshot:
        """Freeze the state now for checkpoint ``checkpoint_id``; the result's ``write(out)`` uploads it."""

    def restore_native(self, handles: Sequence[NativeStateHandle]) -> None:
        """Restore the owned key groups of native snapshots (any parallelism); checks first."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: its uploads may be referenced from now on.

        It says nothing about earlier checkpoints this backend was not told
        about: their uploads are never referenced (see the completion contract above).
        """

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never complete: never reference its uploads."""


@runtime_checkable
class CheckpointOutputStream(Protocol):
    """A stream one snapshot file is written into; it becomes a state handle.

    Storages may keep small streams in memory and return an inline handle
    (embedded in the checkpoint's metadata) instead of writing a file.
    """

    def write(self, data: bytes) -> int:
        """Append bytes; returns how many."""

    def tell(self) -> int:
        """Bytes written so far."""

    def close_and_get_handle(self) -> StreamStateHandle:
        """Finish the stream; the handle reads back what was written."""

    def discard(self) -> None:
        """Abandon the stream and delete what was written."""


@runtime_checkable
class CheckpointWriter(Protocol):
    """Writes the files of one checkpoint or savepoint, then completes it.

    A writer holds no state a process must keep: on Spark, executors call
    ``storage.begin_checkpoint(job, n).create_stream(...)`` and the driver later
    calls ``storage.begin_checkpoint(job, n).complete(metadata)``.
    """

    @property
    def location(self) -> str:
        """Where the checkpoint or savepoint lives (``restore`` takes this)."""

    def create_stream(self, name: str, *, shared: bool = False) -> CheckpointOutputStream:
        """A stream for file ``name``; ``shared`` files may be referenced by later checkpoints.

        Raises ``CheckpointError`` if the checkpoint is already complete: a
        completed checkpoint's files are never written again.
        """

    def complete(self, metadata: bytes) -> str:
        """Write the metadata last and atomically; returns :attr:`location`.

        Raises ``CheckpointError`` if the checkpoint is already complete.
        """

    def abort(self) -> None:
        """Delete what this unfinished checkpoint wrote (never shared files).

        Raises ``CheckpointError`` (deleting nothing) if the checkpoint is complete.
        """


@runtime_checkable
class CheckpointStorage(Protocol):
    """Where checkpoints and savepoints of a job are kept.

    A checkpoint exists once its metadata is stored: :meth:`CheckpointWriter.complete`
    writes it last and atomically, so a crash before that leaves no checkpoint
    that could be selected. Handle descriptions in metadata are made by the
    storage (``StreamStateHandle.to_json``) and read back by
    :meth:`resolve_handle`.
    """

    name: str
    max_state_size: int | None
    """The largest snapshot of one state the storage accepts, or None."""

    def begin_checkpoint(self, job_id: str, checkpoint_id: int) -> CheckpointWriter:
        """A writer for checkpoint ``checkpoint_id`` of ``job_id``."""

    def begin_savepoint(self, job_id: str, target_dir: str | None = None) -> CheckpointWriter:
        """A writer for a new self-contained savepoint (in ``target_dir`` or the savepoints dir)."""

    def list_checkpoints(self, job_id: str) -> list[str]:
        """Locations of the completed checkpoints of ``job_id``, oldest first."""

    def latest_checkpoint(self, job_id: str) -> str | None:
        """The location of the newest completed checkpoint of ``job_id``, if any."""

    def read_metadata(self, location: str) -> bytes:
        """The metadata bytes of the checkpoint or savepoint at ``location``."""

    def resolve_handle(self, location: str, description: Mapping[str, Any]) -> StreamStateHandle:
        """The state handle a metadata entry of the checkpoint at ``location`` describes."""

    def discard_checkpoint(self, location: str) -> None:
        """Delete a completed checkpoint's metadata and exclusive files (not shared ones)."""

    def discard_shared(self, location: str, description: Mapping[str, Any]) -> None:
        """Delete a shared file no retained checkpoint references any more."""


@runtime_checkable
class SupportsOrphanCleanup(Protocol):
    """A checkpoint storage that deletes what failed checkpoints left behind.

    A checkpoint that fails while its store is down cannot delete its own
    files. :func:`statekit.checkpointing.apply_retention` calls this after each
    completed checkpoint, when no checkpoint of the job is in flight.
    """

    def discard_orphans(self, job_id: str, referenced: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
        """Delete incomplete checkpoints older than the newest completed one, and shared files
        no ``(checkpoint location, description)`` of ``referenced`` names; return what was deleted."""


@runtime_checkable
class SupportsRunFencing(Protocol):
    """A checkpoint storage that records which run of a job is the newest, so older ones are fenced off.

    Two runners (two Spark drivers, two ``LocalRunner`` processes) started on the
    same job must not both complete its checkpoints. Each run registers when it
    starts and gets an *epoch*, higher than every epoch recorded before (Flink's
    leader epoch, a fencing token); before writing a checkpoint and again before
    its ``_metadata`` the runner asks for the newest run and stops with
    :class:`statekit.errors.FencedError` if it is not itself.

    Registering needs no atomic compare-and-swap: each run's record has a name of
    its own, the newest is the highest ``(epoch, run_id)``, so two runs that
    register at the same moment with the same epoch still agree which is newer.
    A storage without this protocol is not fenced (and the docs of the storage
    should say so).
    """

    def register_run(self, job_id: str, run_id: str, description: Mapping[str, Any]) -> int:
        """Record run ``run_id`` of ``job_id`` with an epoch above every one recorded; return the epoch.

        ``description`` is JSON-able (host, pid, start time, runner); it is
        returned by :meth:`newest_run` to name the run in errors.
        """

    def newest_run(self, job_id: str) -> tuple[int, str, dict[str, Any]] | None:
        """``(epoch, run_id, description)`` of the newest registered run of ``job_id``, if any.

        The newest is the highest ``(epoch, run_id)``.
        """

    def end_run(self, job_id: str, run_id: str) -> None:
        """Mark run ``run_id`` as ended (best effort): a run that takes over after it need not wait for it."""


@runtime_checkable
class SupportsJobFiles(Protocol):
    """A checkpoint storage that keeps a few small files of a job next to its checkpoints.

    The coordinator keeps the job's checkpoint history there, and a running
    Spark query reads savepoint requests from there and answers them there
    (``statekit savepoint trigger``), so a tool in another process reaches
    them through the same storage. Names are short (``[a-z0-9][a-z0-9._-]*``,
    at most 100 characters) and chosen by statekit; files are small (at most
    a few MiB).

    A file is replaced whole: a reader sees the old bytes or the new ones,
    never a mix and never a prefix (a rename where the store has directories,
    one put on an object store), so a writer killed mid-write leaves the old
    file. A storage without this protocol keeps no history and takes no
    savepoint requests (both say so when asked).

    A storage may also offer ``create_job_file(job_id, name, data) -> bool``:
    create the file only if there is none, atomically, and say whether it did
    (statekit's storages do: a hard link on local disks, a conditional put on
    S3). Savepoint requests are created with it, so of two requesters the
    second is refused; without it, a check right before the write stands in.
    """

    def write_job_file(self, job_id: str, name: str, data: bytes) -> None:
        """Replace file ``name`` of ``job_id`` with ``data``, whole or not at all.

        Raises:
            CheckpointError: If the store fails (the old file, if any, stays).
        """

    def read_job_file(self, job_id: str, name: str) -> bytes | None:
        """The bytes of file ``name`` of ``job_id``; None if there is none.

        Raises:
            CheckpointError: If the store fails.
        """

    def delete_job_file(self, job_id: str, name: str) -> None:
        """Delete file ``name`` of ``job_id`` if it is there.

        Raises:
            CheckpointError: If the store fails.
        """


def readable_native_formats(keyed: SupportsNativeSnapshot) -> frozenset[str]:
    """The native formats ``keyed`` restores: its ``native_format`` and its ``readable_native_formats``."""
    return frozenset((keyed.native_format, *getattr(keyed, "readable_native_formats", ())))


def create_keyed_backend(backend: StateBackend, parameters: KeyedBackendParameters) -> KeyedStateBackend:
    """A keyed backend of ``backend`` made from ``parameters``: the one place statekit passes them on.

    Runners, tools and the kit call this, not the method: a backend whose
    ``create_keyed_backend`` still takes the keyword arguments of earlier
    releases (``key_serializer=..., key_group_range=..., ...``) gets them, with
    a DeprecationWarning naming the release that stops (statekit 0.2.0).
    """
    if _takes_parameters(type(backend)):
        return backend.create_keyed_backend(parameters)
    warn_deprecated(
        f"{type(backend).__qualname__}.create_keyed_backend(*, key_serializer, key_group_range, ...), "
        "the keyword form,",
        "take the KeyedBackendParameters whole (def create_keyed_backend(self, parameters, /)); "
        "see docs/writing-a-backend.md",
    )
    legacy: Any = backend.create_keyed_backend
    return legacy(  # type: ignore[no-any-return]
        key_serializer=parameters.key_serializer,
        key_group_range=parameters.key_group_range,
        max_parallelism=parameters.max_parallelism,
        clock=parameters.clock,
        key_cache_size=parameters.key_cache_size,
        local_dir=parameters.local_dir,
    )


@functools.lru_cache(maxsize=256)
def _takes_parameters(cls: type) -> bool:
    """Whether ``cls.create_keyed_backend`` takes a positional argument (the parameters object)."""
    method = getattr(cls, "create_keyed_backend", None)
    if method is None:
        return True  # let the call fail with Python's own message
    try:
        sig = inspect.signature(method)
    except (TypeError, ValueError):
        return True
    positional = [
        p
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    if isinstance(inspect.getattr_static(cls, "create_keyed_backend"), staticmethod):
        return bool(positional)
    return len(positional) > 1 or any(p.kind is p.VAR_POSITIONAL for p in positional)


if SupportsNativeSnapshot.__doc__ is not None:  # None under python -OO
    SupportsNativeSnapshot.__doc__ += "\n" + textwrap.indent(COMPLETION_CONTRACT, "    ")
