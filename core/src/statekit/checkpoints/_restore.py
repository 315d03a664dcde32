"""Restoring from a completed checkpoint: which subtask reads which state (the restore plan).

A restore at any parallelism ``p' <= max parallelism`` gives each new subtask
exactly the blocks of the key groups it now owns, and redistributes operator
state by mode (Flink's ``StateAssignmentOperation``). Every check runs before
any state is touched, and every damage error names the checkpoint and file.
"""

from __future__ import annotations

import contextlib
import functools
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Concatenate, ParamSpec, TypeVar

from .._contracts import (
    CheckpointStorage,
    KeyedStateBackend,
    OperatorStateBackend,
    StateBackend,
    SupportsNativeSnapshot,
    create_keyed_backend,
    readable_native_formats,
)
from .._errors import (
    CheckpointError,
    CorruptSnapshotError,
    MaxParallelismMismatchError,
    StateError,
    StateMigrationError,
)
from ..serialization._keygroups import KeyGroupRange, key_group_range_for_operator, validate_parallelism
from ..serialization._serializers import serializer_from_config
from ..snapshots._digest import NOT_RECORDED, parse_sha256, sha256_of
from ..snapshots._native import NativeStateHandle
from ..snapshots._snapshot import (
    CANONICAL_FORMAT,
    KeyedStateHandle,
    StreamStateHandle,
    checked_parts,
    describe_stream,
)
from ..state._keyed import KeyedBackendBase
from ..state._operator import (
    OperatorSnapshot,
    decode_operator_snapshot,
    redistribute_operator_state,
)
from ..state._parameters import KeyedBackendParameters
from ..state._raw import RawSnapshot
from ._metadata import CheckpointMetadata, SubtaskState, metadata_at, naming_damage, typed
from ._raw import has_raw_state, read_raw_state

__all__ = ["CompletedCheckpoint", "load_checkpoint"]

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
                stream = self.storage.resolve_handle(self.location, typed(k["handle"], dict, "handle"))
                offsets = {
                    int(kg): (typed(o, int, "offset"), typed(n, int, "length"))
                    for kg, (o, n) in typed(k["offsets"], dict, "offsets").items()
                }
                header_length = typed(k["header_length"], int, "header_length")
                blocks = {
                    int(kg): parse_sha256(d, f"the block of key group {kg}")
                    for kg, d in typed(k.get("block_sha256") or {}, dict, "block_sha256").items()
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
                    typed(k["native"], dict, "native"),
                    lambda d: self.storage.resolve_handle(self.location, typed(d, dict, "handle")),
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
        parameters = KeyedBackendParameters(
            serializer_from_config(handles[0].key_serializer),
            subtask.key_group_range,
            self.metadata.max_parallelism,
            local_dir=local_dir,
        )
        keyed = create_keyed_backend(backend, parameters)
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
                        self.location, typed(st.operator["handle"], dict, "handle")
                    )
                    sha = parse_sha256(st.operator.get("sha256"), "the operator state file")
                # A local copy checked whole against the digest gives its bytes checked already.
                verified = getattr(h, "read_verified", None)
                data = None if verified is None else verified()
                if data is None:
                    data = h.read()
                    self._check_operator_file(
                        h, data, sha, st.operator.get("crc32"), operator_id, st.subtask_index
                    )
                old.append(decode_operator_snapshot(data, describe_stream(h)))
            else:
                old.append(None)
        return redistribute_operator_state(old, new_parallelism)

    def _check_operator_file(
        self, h: StreamStateHandle, data: bytes, sha: str | None, crc: object, operator_id: str, subtask: int
    ) -> None:
        if sha is not None:  # absent in checkpoints of statekit before digests: the CRC-32 then
            if sha256_of(data) != sha:
                where = f"{describe_stream(h)}: operator {operator_id!r} subtask {subtask}"
                raise CorruptSnapshotError(f"{where}: {NOT_RECORDED}")
        elif isinstance(crc, int) and crc != zlib.crc32(data):  # absent before it was added
            raise CorruptSnapshotError(
                f"{describe_stream(h)}: its CRC-32 is not the one {self.location}/_metadata records for "
                f"operator {operator_id!r} subtask {subtask}; the file was replaced or the metadata is "
                "damaged"
            )

    def has_raw_state(self, operator_id: str) -> bool:
        """Whether any subtask of ``operator_id`` wrote raw state into this checkpoint."""
        return has_raw_state(self.metadata.operators.get(operator_id, []))

    @_names_damage
    def raw_state(self, operator_id: str, subtask_index: int, parallelism: int) -> RawSnapshot:
        """The raw state new subtask ``subtask_index`` of ``parallelism`` restores, every byte checked.

        The blocks of the key groups it owns (at any parallelism) and its even
        split of the raw operator items; empty where the checkpoint holds none.
        """
        validate_parallelism(parallelism, self.metadata.max_parallelism)
        return read_raw_state(
            self.storage,
            self.location,
            operator_id,
            self.metadata.operators.get(operator_id, []),
            self.metadata.max_parallelism,
            subtask_index,
            parallelism,
        )

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
            elif isinstance(keyed, SupportsNativeSnapshot) and formats <= readable_native_formats(keyed):
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
        (st.keyed and (st.keyed.get("entries") or st.keyed.get("native"))) or st.operator or st.raw
        for st in sts
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
