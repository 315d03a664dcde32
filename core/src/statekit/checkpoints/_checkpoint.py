"""Checkpoints and savepoints: what subtasks write, what completes them, and restore plans.

A checkpoint of a job with ``p`` subtasks per operator is complete once its
metadata is stored (last, atomically, by the storage). The metadata names,
per operator and subtask, the key-group range, where the keyed snapshot lies
(with the offset of every key group's block) and where the operator state
lies. A restore at any parallelism ``p' <= max parallelism`` gives each new
subtask exactly the blocks of the key groups it now owns, and redistributes
operator state by mode. Every check runs before any state is touched.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import struct
import time
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

from .._contracts import (
    CheckpointStorage,
    CheckpointWriter,
    KeyedStateBackend,
    OperatorStateBackend,
    StateBackend,
    SupportsNativeSnapshot,
    SupportsOrphanCleanup,
)
from .._errors import (
    CheckpointError,
    CorruptCheckpointError,
    CorruptSnapshotError,
    MaxParallelismMismatchError,
    StateError,
    StateMigrationError,
    StateSizeLimitError,
)
from ..serialization._keygroups import KeyGroupRange, key_group_range_for_operator, validate_parallelism
from ..serialization._serializers import serializer_from_config
from ..snapshots._digest import NOT_RECORDED, HashingOutput, parse_sha256, sha256_of
from ..snapshots._native import NativeStateHandle, WriterNativeOutput
from ..snapshots._snapshot import (
    CANONICAL_FORMAT,
    KeyedStateHandle,
    ProgressCallback,
    SnapshotHeader,
    SnapshotWriteResult,
    _where,
    checked_parts,
)
from ..state._keyed import KeyedBackendBase
from ..state._operator import (
    OperatorSnapshot,
    decode_operator_snapshot,
    encode_operator_snapshot,
    redistribute_operator_state,
)

__all__ = [
    "CheckpointMetadata",
    "CompletedCheckpoint",
    "SubtaskState",
    "apply_retention",
    "complete_checkpoint",
    "discard_native_uploads",
    "highest_checkpoint_id",
    "load_checkpoint",
    "metadata_at",
    "naming_damage",
    "write_keyed_file",
    "write_operator_file",
    "write_subtask_state",
]

_MAGIC = b"STKMETA1"
_U32 = struct.Struct("<I")
METADATA_VERSION = 1


@dataclass
class SubtaskState:
    """What one subtask of one operator contributes to a checkpoint (JSON-able)."""

    operator_id: str
    subtask_index: int
    key_group_range: KeyGroupRange
    keyed: dict[str, Any] | None = None
    operator: dict[str, Any] | None = None
    states: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The subtask's entry in the metadata."""
        return {
            "operator_id": self.operator_id,
            "subtask_index": self.subtask_index,
            "key_group_range": [self.key_group_range.start, self.key_group_range.end],
            "keyed": self.keyed,
            "operator": self.operator,
            "states": self.states,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SubtaskState:
        """Parse :meth:`to_json` output."""
        s, e = obj["key_group_range"]
        return cls(
            str(obj["operator_id"]),
            _typed(obj["subtask_index"], int, "subtask_index"),
            KeyGroupRange.of(_typed(s, int, "key group"), _typed(e, int, "key group")),
            obj.get("keyed"),
            obj.get("operator"),
            list(obj.get("states") or []),
        )


def write_subtask_state(
    writer: CheckpointWriter,
    operator_id: str,
    subtask_index: int,
    keyed: KeyedStateBackend | None,
    operator: OperatorStateBackend | None,
    *,
    max_state_size: int | None = None,
    progress: ProgressCallback | None = None,
    native_checkpoint_id: int | None = None,
) -> SubtaskState:
    """Snapshot a subtask's keyed and operator state into ``writer``'s streams.

    With ``native_checkpoint_id``, a keyed backend that has a native format
    (:class:`~statekit.SupportsNativeSnapshot`) writes a native snapshot for
    that checkpoint (uploading only what no completed checkpoint uploaded);
    other backends, and savepoints (None), write the canonical format.

    Raises :class:`StateSizeLimitError` (and writes nothing that stays) when a
    state is larger than ``max_state_size``.
    """
    prefix = f"{operator_id}-{subtask_index}"
    kgr = keyed.key_group_range if keyed is not None else KeyGroupRange.empty()
    result = SubtaskState(operator_id, subtask_index, kgr)
    if keyed is not None and native_checkpoint_id is not None and isinstance(keyed, SupportsNativeSnapshot):
        result.keyed, result.states = _write_native(
            writer, prefix, keyed, native_checkpoint_id, operator_id, subtask_index, max_state_size, progress
        )
    elif keyed is not None:
        snap = keyed.snapshot()
        result.states = list(snap.header.states)
        result.keyed = write_keyed_file(
            writer,
            f"{prefix}.keyed",
            snap.header,
            lambda out: snap.write(out, progress=progress),
            check=lambda r: _check_sizes(r.state_sizes, operator_id, subtask_index, max_state_size),
        )
    if operator is not None:
        ops = operator.snapshot()
        if ops:
            sizes = {n: sum(len(e) for e in d.elements) for n, d in ops.items()}
            _check_sizes(sizes, operator_id, subtask_index, max_state_size)
            result.operator = write_operator_file(writer, f"{prefix}.operator", ops)
    return result


def write_operator_file(writer: CheckpointWriter, name: str, ops: OperatorSnapshot) -> dict[str, Any]:
    """Write one subtask's operator state into stream ``name`` of ``writer``; returns its metadata entry."""
    data = encode_operator_snapshot(ops)
    stream = writer.create_stream(name)
    try:
        stream.write(data)
        oh = stream.close_and_get_handle()
    except BaseException:
        stream.discard()
        raise
    # The digest binds the entry to these bytes: a handle pointing at another subtask's or
    # checkpoint's (valid) file is caught on restore, not silently read. The CRC-32 stays for
    # statekit versions before digests, which read only it.
    return {
        "handle": oh.to_json(),
        "size": len(data),
        "states": sorted(ops),
        "crc32": zlib.crc32(data),
        "sha256": sha256_of(data),
    }


def write_keyed_file(
    writer: CheckpointWriter,
    name: str,
    header: SnapshotHeader,
    write: Callable[[Any], SnapshotWriteResult],
    *,
    check: Callable[[SnapshotWriteResult], None] | None = None,
) -> dict[str, Any]:
    """Write one canonical keyed file into stream ``name`` of ``writer``; returns its metadata entry.

    ``write(stream)`` writes the file (see :func:`~statekit.backend_api.write_canonical`);
    ``check`` may refuse the result, which then leaves nothing behind.

    The entry records the SHA-256 of the whole file (computed as it is written)
    and, from the result of ``write``, of its header and of each key group's
    block: the parts a restore reads alone (``header_sha256``, ``block_sha256``).
    """
    stream = HashingOutput(writer.create_stream(name))
    try:
        r = write(stream)
        if check is not None:
            check(r)
        handle = stream.close_and_get_handle()
    except BaseException:
        stream.discard()
        raise
    entry: dict[str, Any] = {
        "handle": handle.to_json(),
        "format": CANONICAL_FORMAT,
        "backend": header.backend,
        "header_length": r.header_length,
        "offsets": {str(kg): [o, n] for kg, (o, n) in r.offsets.items()},
        "size": r.size,
        "entries": r.entries,
        "state_sizes": r.state_sizes,
        "sha256": stream.sha256,
    }
    if r.header_sha256 is not None:
        entry["header_sha256"] = r.header_sha256
    if r.block_sha256:
        entry["block_sha256"] = {str(kg): d for kg, d in r.block_sha256.items()}
    return entry


def _write_native(
    writer: CheckpointWriter,
    prefix: str,
    keyed: SupportsNativeSnapshot,
    checkpoint_id: int,
    operator_id: str,
    subtask_index: int,
    max_state_size: int | None,
    progress: ProgressCallback | None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    snap = keyed.native_snapshot(checkpoint_id)
    out = WriterNativeOutput(writer, prefix, checkpoint_id)
    try:
        handle = snap.write(out, progress=progress)
        _check_sizes({"(native snapshot)": handle.size}, operator_id, subtask_index, max_state_size)
    except BaseException:
        out.discard()  # this checkpoint's uploads only: referenced files belong to completed ones
        raise
    part = {
        "format": handle.format,
        "backend": handle.backend,
        "native": handle.to_json(),
        "size": handle.size,
        "uploaded": handle.uploaded_size,
        "entries": handle.entries,
        "shared": handle.shared_descriptions(),
    }
    return part, list(handle.states)


def _check_sizes(sizes: Mapping[str, int], op: str, subtask: int, limit: int | None) -> None:
    if limit is None:
        return
    for name, size in sizes.items():
        if size > limit:
            raise StateSizeLimitError(
                f"state {name!r} of operator {op!r} subtask {subtask} is {size:,} bytes, over the "
                f"{limit:,}-byte limit of the checkpoint storage; this checkpoint fails and the "
                "previous one stays. Use statekit.checkpoint.storage=filesystem for large state, "
                "or raise statekit.checkpoint.storage.jobmanager.max-state-size"
            )


@dataclass
class CheckpointMetadata:
    """The ``_metadata`` of a checkpoint or savepoint."""

    job_id: str
    checkpoint_id: int
    max_parallelism: int
    operators: dict[str, list[SubtaskState]]
    kind: str = "checkpoint"
    backend: str = ""
    timestamp_ms: int = 0
    properties: dict[str, Any] = field(default_factory=dict)

    def parallelism(self, operator_id: str) -> int:
        """The number of subtasks ``operator_id`` had."""
        return len(self.operators[operator_id])

    def shared_handles(self) -> list[dict[str, Any]]:
        """Descriptions of the shared files this checkpoint references."""
        out: list[dict[str, Any]] = []
        for subtasks in self.operators.values():
            for st in subtasks:
                for part in (st.keyed, st.operator):
                    shared = part.get("shared") if part else None  # from_bytes checked: a dict or None
                    if isinstance(shared, list):
                        out.extend(d for d in shared if isinstance(d, dict))
        return out

    def to_bytes(self) -> bytes:
        """The metadata file: magic, JSON, CRC-32."""
        body = json.dumps(
            {
                "version": METADATA_VERSION,
                "job_id": self.job_id,
                "checkpoint_id": self.checkpoint_id,
                "kind": self.kind,
                "max_parallelism": self.max_parallelism,
                "backend": self.backend,
                "timestamp_ms": self.timestamp_ms,
                "properties": self.properties,
                "operators": {op: [st.to_json() for st in sts] for op, sts in self.operators.items()},
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode()
        return _MAGIC + body + _U32.pack(zlib.crc32(body))

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "_metadata") -> CheckpointMetadata:
        """Parse and check metadata bytes.

        Everything a restore relies on is checked here, so a damaged or crafted
        file is refused before any state is read: the checksum, the version, the
        JSON's shape, and that each operator's subtasks are ``0..p-1`` owning
        exactly the key groups Flink's formula gives them.

        Raises:
            CorruptSnapshotError: Naming ``where``, if anything is wrong.
        """
        if len(data) < len(_MAGIC) + 4 or data[: len(_MAGIC)] != _MAGIC:
            raise CorruptSnapshotError(f"{where}: not a statekit checkpoint metadata file")
        body = data[len(_MAGIC) : -4]
        if zlib.crc32(body) != _U32.unpack(data[-4:])[0]:
            raise CorruptSnapshotError(f"{where}: checksum mismatch; the metadata file is corrupt")
        try:
            obj = json.loads(body)
            version = obj.get("version")
            if not isinstance(version, int) or not 1 <= version <= METADATA_VERSION:
                raise CorruptSnapshotError(
                    f"metadata version {version!r} is not one this statekit reads "
                    f"(1 to {METADATA_VERSION}); a newer statekit wrote it (upgrade), or the file is corrupt"
                )
            meta = cls(
                job_id=_typed(obj["job_id"], str, "job_id"),
                checkpoint_id=_typed(obj["checkpoint_id"], int, "checkpoint_id"),
                max_parallelism=_typed(obj["max_parallelism"], int, "max_parallelism"),
                operators={
                    _typed(op, str, "operator id"): sorted(
                        (SubtaskState.from_json(_typed(s, dict, "subtask")) for s in _typed(sts, list, op)),
                        key=lambda s: s.subtask_index,
                    )
                    for op, sts in _typed(obj["operators"], dict, "operators").items()
                },
                kind=_typed(obj.get("kind", "checkpoint"), str, "kind"),
                backend=_typed(obj.get("backend", ""), str, "backend"),
                timestamp_ms=_typed(obj.get("timestamp_ms", 0), int, "timestamp_ms"),
                properties=_typed(obj.get("properties") or {}, dict, "properties"),
            )
            meta._check_layout()
        except CorruptSnapshotError as e:  # raised without the file's name: add it
            raise CorruptSnapshotError(f"{where}: {e}") from None
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError) as e:
            # RecursionError: JSON nested too deeply for the parser (a crafted file).
            raise CorruptSnapshotError(
                f"{where}: malformed metadata ({type(e).__name__}: {str(e)[:200]}); the file is corrupt"
            ) from None
        return meta

    def _check_layout(self) -> None:
        """Refuse subtask lists and key-group ranges a runner could not have written."""
        if self.checkpoint_id < 0 or not 1 <= self.max_parallelism <= 32768:
            raise CorruptSnapshotError(
                f"checkpoint id {self.checkpoint_id} or max parallelism {self.max_parallelism} "
                "is out of range"
            )
        for op, sts in self.operators.items():
            p = len(sts)
            if [s.subtask_index for s in sts] != list(range(p)) or p > self.max_parallelism:
                raise CorruptSnapshotError(
                    f"operator {op!r}: subtasks {[s.subtask_index for s in sts]} are not 0..{p - 1}"
                )
            for st in sts:
                for part in (st.keyed, st.operator):
                    if part is not None and not isinstance(part, dict):
                        raise CorruptSnapshotError(
                            f"operator {op!r} subtask {st.subtask_index}: malformed entry"
                        )
                if st.keyed is None:
                    continue
                want = key_group_range_for_operator(self.max_parallelism, p, st.subtask_index)
                if st.key_group_range != want:
                    # A narrower range would silently restore only part of the key groups.
                    raise CorruptSnapshotError(
                        f"operator {op!r} subtask {st.subtask_index} of {p} claims key groups "
                        f"{st.key_group_range}, but owns {want} at max parallelism {self.max_parallelism}"
                    )


def _typed(value: Any, kind: type[Any], what: str) -> Any:
    """``value`` if it is a ``kind`` (a bool is no int here), else a CorruptSnapshotError."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CorruptSnapshotError(f"{what} is {type(value).__name__}, expected {kind.__name__}")
    return value


def complete_checkpoint(
    writer: CheckpointWriter,
    *,
    job_id: str,
    checkpoint_id: int,
    max_parallelism: int,
    subtasks: Iterable[SubtaskState],
    kind: str = "checkpoint",
    properties: Mapping[str, Any] | None = None,
) -> str:
    """Write the metadata of a checkpoint whose subtask states are all written."""
    ops: dict[str, list[SubtaskState]] = {}
    for st in subtasks:
        ops.setdefault(st.operator_id, []).append(st)
    backends = {st.keyed.get("backend", "") for sts in ops.values() for st in sts if st.keyed} - {""}
    for op, sts in ops.items():
        idx = sorted(s.subtask_index for s in sts)
        if idx != list(range(len(sts))):
            raise CheckpointError(f"operator {op!r}: subtask states {idx} are not 0..{len(sts) - 1}")
        sts.sort(key=lambda s: s.subtask_index)
    meta = CheckpointMetadata(
        job_id,
        checkpoint_id,
        max_parallelism,
        ops,
        kind=kind,
        backend=",".join(sorted(backends)),
        timestamp_ms=time.time_ns() // 1_000_000,
        properties=dict(properties or {}),
    )
    return writer.complete(meta.to_bytes())


def discard_native_uploads(
    storage: CheckpointStorage, location: str, subtasks: Iterable[SubtaskState], checkpoint_id: int
) -> None:
    """Delete the shared files checkpoint ``checkpoint_id`` uploaded, after it failed to complete.

    Only its own uploads: files it referenced belong to completed checkpoints.
    Best effort: a file that cannot be deleted stays an orphan, never referenced.
    """
    for st in subtasks:
        native = (st.keyed or {}).get("native")
        for f in (native or {}).get("files", []):
            if f.get("shared") and f.get("checkpoint_id") == checkpoint_id:
                with contextlib.suppress(CheckpointError, OSError):
                    storage.discard_shared(location, f["handle"])


_CHECKPOINT_NAME = re.compile(r"chk-(0|[1-9][0-9]*)/?$")


def highest_checkpoint_id(storage: CheckpointStorage, job_id: str) -> int:
    """The highest id of the completed checkpoints of ``job_id`` (damaged ones included), or 0.

    A new checkpoint must be numbered above it: an id is never used twice, so a
    restore of an older checkpoint never writes into a newer one. The id comes
    from the location's ``chk-<n>`` name where the storage uses it, else from
    the metadata (an unreadable one then counts as nothing: its name told nothing).
    """
    highest = 0
    for location in storage.list_checkpoints(job_id):
        match = _CHECKPOINT_NAME.search(location)
        if match is not None:
            highest = max(highest, int(match[1]))
            continue
        with contextlib.suppress(CorruptSnapshotError, CheckpointError):
            highest = max(highest, load_checkpoint(storage, location).checkpoint_id)
    return highest


def apply_retention(storage: CheckpointStorage, job_id: str, retained: int) -> list[str]:
    """Discard all but the newest ``retained`` checkpoints, unreferenced shared files, and orphans.

    Orphans are what failed checkpoints could not delete (their store was down):
    storages that can (:class:`~statekit.SupportsOrphanCleanup`) delete them here.
    Never raises for a failing store: what cannot be deleted now is warned of
    and tried again after the next checkpoint. Returns the discarded locations.
    Call it when no checkpoint is in flight.
    """
    try:
        locations = storage.list_checkpoints(job_id)
    except StateError as e:
        warnings.warn(f"retention skipped: {e}", RuntimeWarning, stacklevel=2)
        return []
    drop, keep = (locations[:-retained], locations[-retained:]) if retained >= 1 else ([], locations)
    unreadable = False

    def shared_of(loc: str, *, kept: bool = False) -> dict[str, dict[str, Any]]:
        nonlocal unreadable
        try:
            meta = load_checkpoint(storage, loc).metadata
        except StateError as e:
            # Its shared files stay (orphans beat deleting a kept file), and while a kept
            # one is unreadable no file can be told to be an orphan.
            unreadable = unreadable or kept
            if kept:
                warnings.warn(
                    f"retention cannot read a kept checkpoint, so it deletes no orphaned files: {e}",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return {}
        return {json.dumps(d, sort_keys=True): d for d in meta.shared_handles()}

    kept: dict[str, tuple[str, dict[str, Any]]] = {}
    for loc in keep:
        kept.update((key, (loc, d)) for key, d in shared_of(loc, kept=True).items())
    done: set[str] = set(kept)
    for loc in drop:
        for key, desc in shared_of(loc).items():
            if key not in done:
                try:
                    storage.discard_shared(loc, desc)
                except StateError as e:
                    # Refused (a description pointing outside the job's shared files: damaged
                    # or crafted metadata) or the store failed. Never deleted by force.
                    warnings.warn(f"retention left a file alone: {e}", RuntimeWarning, stacklevel=2)
                done.add(key)  # discard once even if several dropped checkpoints share it
        try:
            storage.discard_checkpoint(loc)
        except StateError as e:
            warnings.warn(f"retention could not discard {loc} now: {e}", RuntimeWarning, stacklevel=2)
    # Orphans only when every kept checkpoint's references are known: else a file
    # only an unreadable checkpoint references would look like one.
    if isinstance(storage, SupportsOrphanCleanup) and keep and not unreadable:
        try:
            storage.discard_orphans(job_id, list(kept.values()))
        except StateError as e:
            warnings.warn(f"retention could not delete orphans now: {e}", RuntimeWarning, stacklevel=2)
    return drop


@contextlib.contextmanager
def naming_damage(location: str) -> Iterator[None]:
    """Turn a :class:`CorruptSnapshotError` raised inside into a ``CorruptCheckpointError`` of ``location``.

    So every corruption error of a checkpoint reads ``checkpoint <location>:
    <file>: <what is wrong>``, wherever the damaged bytes were found.
    """
    try:
        yield
    except CorruptCheckpointError:
        raise
    except CorruptSnapshotError as e:
        raise CorruptCheckpointError(location, str(e)) from e


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _names_damage(
    method: Callable[Concatenate[CompletedCheckpoint, _P], _R],
) -> Callable[Concatenate[CompletedCheckpoint, _P], _R]:
    """A method of :class:`CompletedCheckpoint` whose damage errors name it (see :func:`naming_damage`)."""

    def named(self: CompletedCheckpoint, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with naming_damage(self.location):
            return method(self, *args, **kwargs)

    return functools.update_wrapper(named, method)


def metadata_at(location: str, data: bytes) -> CheckpointMetadata:
    """Parse the ``_metadata`` bytes of the checkpoint at ``location``.

    Raises:
        CorruptCheckpointError: Naming ``<location>/_metadata``, if they are damaged.
    """
    with naming_damage(location):
        return CheckpointMetadata.from_bytes(data, f"{location.rstrip('/')}/_metadata")


class CompletedCheckpoint:
    """A loaded checkpoint or savepoint, from which subtasks are restored.

    Every method that reads its files raises :class:`CorruptCheckpointError`
    naming this checkpoint and the damaged file.
    """

    def __init__(self, storage: CheckpointStorage, location: str, metadata: CheckpointMetadata) -> None:
        self.storage = storage
        self.location = location
        self.metadata = metadata

    @property
    def checkpoint_id(self) -> int:
        """The checkpoint's id (savepoints carry the id of the checkpoint they follow)."""
        return self.metadata.checkpoint_id

    @contextlib.contextmanager
    def _parsing(self, operator_id: str, subtask_index: int) -> Iterator[None]:
        """Turn a malformed metadata entry (a crafted or damaged file) into a CorruptSnapshotError."""
        try:
            yield
        except StateError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
            raise CorruptSnapshotError(
                f"{self.location}/_metadata: malformed entry of operator {operator_id!r} subtask "
                f"{subtask_index} ({type(e).__name__}: {str(e)[:200]}); the file is corrupt"
            ) from None

    def validate(
        self,
        *,
        max_parallelism: int,
        operators: Mapping[str, int],
        allow_non_restored_state: bool = False,
    ) -> None:
        """Refuse, before any state is touched, a restore that cannot be exact.

        ``operators`` maps each operator id of the new job to its new parallelism.
        """
        meta = self.metadata
        if meta.max_parallelism != max_parallelism:
            raise MaxParallelismMismatchError(
                f"{self.location} was taken with max parallelism {meta.max_parallelism}; this job "
                f"has {max_parallelism}. Max parallelism cannot change across a restore: set "
                f"statekit.max-parallelism={meta.max_parallelism}"
            )
        for p in operators.values():
            validate_parallelism(p, max_parallelism)
        unclaimed = [op for op, sts in meta.operators.items() if op not in operators and _has_state(sts)]
        if unclaimed and not allow_non_restored_state:
            raise StateMigrationError(
                f"{self.location} holds state of operators {unclaimed} that no operator of this job "
                f"claims (this job has {sorted(operators)}); pass allow_non_restored_state=True "
                "to drop it, as Flink's --allowNonRestoredState"
            )

    def keyed_formats(self, operator_id: str) -> set[str]:
        """The snapshot formats of ``operator_id``'s keyed state (canonical, or a backend's native one)."""
        return {
            str(st.keyed.get("format", CANONICAL_FORMAT))
            for st in self.metadata.operators.get(operator_id, [])
            if st.keyed
        }

    @_names_damage
    def keyed_handles(self, operator_id: str, key_groups: KeyGroupRange) -> list[KeyedStateHandle]:
        """The canonical keyed snapshot handles of ``operator_id`` that hold any of ``key_groups``."""
        out = []
        for st in self.metadata.operators.get(operator_id, []):
            k = st.keyed
            if not k or not len(st.key_group_range.intersection(key_groups)):
                continue
            if k.get("format", CANONICAL_FORMAT) != CANONICAL_FORMAT:
                raise CheckpointError(
                    f"{self.location}: operator {operator_id!r} subtask {st.subtask_index} is a native "
                    f"snapshot of the {k.get('backend')!r} backend (format {k['format']!r}), which only that "
                    f"backend restores: set statekit.backend={k.get('backend')}, or restore a savepoint "
                    "(savepoints are canonical and restore into any backend)"
                )
            with self._parsing(operator_id, st.subtask_index):
                stream = self.storage.resolve_handle(self.location, _typed(k["handle"], dict, "handle"))
                offsets = {
                    int(kg): (_typed(o, int, "offset"), _typed(n, int, "length"))
                    for kg, (o, n) in _typed(k["offsets"], dict, "offsets").items()
                }
                header_length = _typed(k["header_length"], int, "header_length")
                blocks = {
                    int(kg): parse_sha256(d, f"the block of key group {kg}")
                    for kg, d in _typed(k.get("block_sha256") or {}, dict, "block_sha256").items()
                }
                # Absent in checkpoints of a statekit before digests: their blocks' CRC-32s are checked.
                stream = checked_parts(
                    stream,
                    header_length,
                    parse_sha256(k.get("header_sha256"), "the header"),
                    offsets,
                    {kg: d for kg, d in blocks.items() if d is not None},
                )
                h = KeyedStateHandle(
                    stream,
                    st.key_group_range,
                    offsets,
                    header_length,
                    str(k.get("format", CANONICAL_FORMAT)),
                    str(k.get("backend", "")),
                    int(k.get("size", 0)),
                    int(k.get("entries", 0)),
                )
            part = h.intersect(key_groups)
            if part is not None:
                out.append(part)
        return out

    @_names_damage
    def native_handles(self, operator_id: str, key_groups: KeyGroupRange) -> list[NativeStateHandle]:
        """The native keyed snapshot handles of ``operator_id`` that hold any of ``key_groups``."""
        out = []
        for st in self.metadata.operators.get(operator_id, []):
            k = st.keyed
            if not k or not len(st.key_group_range.intersection(key_groups)):
                continue
            if "native" not in k:
                raise CheckpointError(
                    f"{self.location}: operator {operator_id!r} subtask {st.subtask_index} is not native"
                )
            with self._parsing(operator_id, st.subtask_index):
                h = NativeStateHandle.from_json(
                    _typed(k["native"], dict, "native"),
                    lambda d: self.storage.resolve_handle(self.location, _typed(d, dict, "handle")),
                )
            part = h.intersect(key_groups)
            if part is not None:
                out.append(part)
        return out

    @contextlib.contextmanager
    def restored_native(
        self, operator_id: str, subtask: SubtaskState, backend: StateBackend, local_dir: str
    ) -> Iterator[KeyedStateBackend]:
        """A keyed backend of ``backend`` (the one that wrote it) holding one subtask's native snapshot.

        For tools that read a native checkpoint without its job: the backend is
        closed on exit, ``local_dir`` is its working directory.
        """
        handles = self.native_handles(operator_id, subtask.key_group_range)
        keyed = backend.create_keyed_backend(
            key_serializer=serializer_from_config(handles[0].key_serializer),
            key_group_range=subtask.key_group_range,
            max_parallelism=self.metadata.max_parallelism,
            local_dir=local_dir,
        )
        try:
            if not isinstance(keyed, SupportsNativeSnapshot):
                raise CheckpointError(
                    f"{self.location}: operator {operator_id!r} holds native snapshots, which the "
                    f"{type(keyed).__name__} backend cannot restore"
                )
            with naming_damage(self.location):
                keyed.restore_native(handles)
            yield keyed
        finally:
            keyed.close()

    @_names_damage
    def operator_states(self, operator_id: str, new_parallelism: int) -> list[OperatorSnapshot]:
        """Operator state of ``operator_id`` redistributed over ``new_parallelism`` subtasks."""
        old: list[OperatorSnapshot | None] = []
        for st in self.metadata.operators.get(operator_id, []):
            if st.operator:
                with self._parsing(operator_id, st.subtask_index):
                    h = self.storage.resolve_handle(
                        self.location, _typed(st.operator["handle"], dict, "handle")
                    )
                    sha = parse_sha256(st.operator.get("sha256"), "the operator state file")
                data = h.read()
                crc = st.operator.get("crc32")  # absent in checkpoints of statekit before it was added
                if sha is not None:  # absent in checkpoints of statekit before digests: the CRC-32 then
                    if sha256_of(data) != sha:
                        where = f"{_where(h)}: operator {operator_id!r} subtask {st.subtask_index}"
                        raise CorruptSnapshotError(f"{where}: {NOT_RECORDED}")
                elif crc is not None and crc != zlib.crc32(data):
                    raise CorruptSnapshotError(
                        f"{_where(h)}: its CRC-32 is not the one {self.location}/_metadata records for "
                        f"operator {operator_id!r} subtask {st.subtask_index}; the file was replaced or "
                        "the metadata is damaged"
                    )
                old.append(decode_operator_snapshot(data, _where(h)))
            else:
                old.append(None)
        return redistribute_operator_state(old, new_parallelism)

    @_names_damage
    def restore_subtask(
        self,
        operator_id: str,
        subtask_index: int,
        parallelism: int,
        keyed: KeyedStateBackend | None,
        operator: OperatorStateBackend | None,
        *,
        operator_states: Sequence[OperatorSnapshot] | None = None,
    ) -> None:
        """Restore one new subtask's keyed and operator state.

        Raises:
            CorruptCheckpointError: If a file it reads is damaged or missing.
        """
        if keyed is not None:
            expected = key_group_range_for_operator(self.metadata.max_parallelism, parallelism, subtask_index)
            if keyed.key_group_range != expected:
                raise CheckpointError(
                    f"subtask {subtask_index} of {parallelism} must own {expected}, its backend owns "
                    f"{keyed.key_group_range}"
                )
            formats = self.keyed_formats(operator_id) - {CANONICAL_FORMAT}
            if isinstance(keyed, KeyedBackendBase):  # named in the schema history of states it migrates
                keyed.set_restore_origin(self.metadata.kind, self.metadata.checkpoint_id)
            if not formats:
                keyed.restore(self.keyed_handles(operator_id, keyed.key_group_range))
            elif isinstance(keyed, SupportsNativeSnapshot) and formats == {keyed.native_format}:
                keyed.restore_native(self.native_handles(operator_id, keyed.key_group_range))
            else:
                ours = keyed.native_format if isinstance(keyed, SupportsNativeSnapshot) else "canonical only"
                raise CheckpointError(
                    f"{self.location} holds native snapshots in format {sorted(formats)} for operator "
                    f"{operator_id!r}, which this job's backend {type(keyed).__name__} ({ours}) cannot "
                    "restore; run the job with the backend that wrote it, or restore from a savepoint "
                    "(canonical, readable by every backend)"
                )
        if operator is not None:
            states = operator_states or self.operator_states(operator_id, parallelism)
            operator.restore(states[subtask_index])


def _has_state(sts: Sequence[SubtaskState]) -> bool:
    return any(
        (st.keyed and (st.keyed.get("entries") or st.keyed.get("native"))) or st.operator for st in sts
    )


def load_checkpoint(storage: CheckpointStorage, location: str) -> CompletedCheckpoint:
    """Read and check the metadata at ``location``.

    Raises:
        CheckpointNotFoundError: If there is no completed checkpoint or savepoint there.
        CorruptCheckpointError: If its ``_metadata`` is damaged.
    """
    with naming_damage(location):
        data = storage.read_metadata(location)
    return CompletedCheckpoint(storage, location, metadata_at(location, data))
