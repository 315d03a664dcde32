"""Writing a checkpoint: each subtask's files, then the ``_metadata`` that completes it.

Subtasks write their keyed state (canonical or native) and operator state
through a :class:`~statekit.backend_api.CheckpointWriter`; :func:`complete_checkpoint`
writes the metadata last, which is what makes the checkpoint exist. A
checkpoint that fails before that deletes only its own native uploads.
"""

from __future__ import annotations

import contextlib
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .._contracts import (
    CheckpointStorage,
    CheckpointWriter,
    KeyedStateBackend,
    OperatorStateBackend,
    SupportsNativeSnapshot,
)
from .._errors import (
    CheckpointError,
    StateSizeLimitError,
)
from ..serialization._keygroups import KeyGroupRange
from ..snapshots._digest import sha256_of
from ..snapshots._native import WriterNativeOutput
from ..snapshots._snapshot import (
    CANONICAL_FORMAT,
    ProgressCallback,
    SnapshotHeader,
    SnapshotWriteResult,
)
from ..state._operator import (
    OperatorSnapshot,
    encode_operator_snapshot,
)
from ..state._raw import RawSnapshot
from ._metadata import CheckpointMetadata, SubtaskState
from ._raw import write_raw_file

__all__ = [
    "complete_checkpoint",
    "discard_native_uploads",
    "write_keyed_file",
    "write_operator_file",
    "write_subtask_state",
]


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
    raw: RawSnapshot | None = None,
) -> SubtaskState:
    """Snapshot a subtask's keyed and operator state (and ``raw`` state) into ``writer``'s streams.

    With ``native_checkpoint_id``, a keyed backend that has a native format
    (:class:`~statekit.backend_api.SupportsNativeSnapshot`) writes a native snapshot for
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
    if raw:  # the function's own bytes (its snapshot_raw_state hook); no file when it wrote none
        _check_sizes({"(raw state)": raw.size}, operator_id, subtask_index, max_state_size)
        result.raw = write_raw_file(writer, f"{prefix}.raw", raw)
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

    ``write(stream)`` writes the file (see :func:`~statekit.snapshot_codec.write_canonical`);
    ``check`` may refuse the result, which then leaves nothing behind.

    The entry records the SHA-256 of each part of the file, as ``write``
    computed them while writing: the header, each key group's block and the
    index with the trailer (``header_sha256``, ``block_sha256``,
    ``tail_sha256``), which cover every byte once; the file's digest as a whole
    is derived from them (:func:`~statekit.snapshots._digest.recorded_digest`),
    so no byte is hashed twice.
    """
    stream = writer.create_stream(name)
    try:
        r = write(stream)
        if r.header_sha256 is None or r.tail_sha256 is None or set(r.block_sha256) != set(r.offsets):
            raise CheckpointError(
                f"{name}: the {header.backend!r} backend's snapshot did not report the SHA-256 of every "
                "part it wrote (write it with statekit.snapshot_codec.write_canonical, which does)"
            )
        if check is not None:
            check(r)
        handle = stream.close_and_get_handle()
    except BaseException:
        stream.discard()
        raise
    return {
        "handle": handle.to_json(),
        "format": CANONICAL_FORMAT,
        "backend": header.backend,
        "header_length": r.header_length,
        "offsets": {str(kg): [o, n] for kg, (o, n) in r.offsets.items()},
        "size": r.size,
        "entries": r.entries,
        "state_sizes": r.state_sizes,
        "state_entries": r.state_entries,
        "header_sha256": r.header_sha256,
        "block_sha256": {str(kg): d for kg, d in r.block_sha256.items()},
        "tail_sha256": r.tail_sha256,
    }


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
        sizes = handle.meta.get("state_sizes")  # per state where the format knows them (heap's deltas)
        if not isinstance(sizes, dict) or not sizes:
            sizes = {"(native snapshot)": handle.size}
        _check_sizes(sizes, operator_id, subtask_index, max_state_size)
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
