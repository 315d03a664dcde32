"""A completed checkpoint converted into a self-contained canonical savepoint (``savepoint convert``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._contracts import CheckpointStorage
from .._errors import CorruptCheckpointError
from ..plugins._registry import default_registry
from ..snapshots._snapshot import CANONICAL_FORMAT, StreamStateHandle
from ._metadata import CheckpointMetadata, SubtaskState
from ._restore import CompletedCheckpoint, load_checkpoint
from ._source_position import POSITION_PROPERTY, PositionUnavailable, SparkPosition, position_of
from ._verify import verify_loaded
from ._writing import complete_checkpoint, write_subtask_state

__all__ = ["convert_to_savepoint"]

_CHUNK = 4 << 20


def convert_to_savepoint(
    storage: CheckpointStorage,
    checkpoint: str,
    target_dir: str,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> str:
    """Copy a completed checkpoint into a new self-contained canonical savepoint; returns its location.

    Every file is copied (shared ones too, so the savepoint stands alone).
    Native snapshots (rocksdb's) are restored, subtask by subtask, into the
    backend that wrote them, which must be installed, and written canonically.
    A Spark query's checkpoint also gets its source position (see
    :mod:`._source_position`), copied from the query's checkpoint location if
    it is still there; if not, the savepoint's properties say why it carries
    none, and a query restoring it must be told where its input begins.

    Raises:
        CorruptCheckpointError: Naming every damaged or missing file, found by
            reading all of them through their checksums before anything is written.
    """
    cp = load_checkpoint(storage, checkpoint)
    problems = verify_loaded(cp, deep=True)
    if problems:
        raise CorruptCheckpointError(checkpoint, "; ".join(f"{p.file}: {p.problem}" for p in problems))
    meta = cp.metadata
    native = {
        (st.operator_id, st.subtask_index)
        for sts in meta.operators.values()
        for st in sts
        if (st.keyed or {}).get("format", CANONICAL_FORMAT) != CANONICAL_FORMAT
    }
    backend = None
    if native:
        # Fails here, naming the backend and its pip extra, if it is not installed.
        backend = default_registry().create_backend(meta.backend, {})
    handles = _copied_handles(storage, checkpoint, meta, native)
    total = sum(h.size for h in handles.values())
    done = 0
    writer = storage.begin_savepoint(meta.job_id, target_dir)
    try:
        new_states = []
        for sts in meta.operators.values():
            for st in sts:
                copy = SubtaskState(
                    st.operator_id, st.subtask_index, st.key_group_range, None, None, st.states
                )
                if (st.operator_id, st.subtask_index) in native:
                    copy.keyed, copy.states = _native_to_canonical(cp, st, backend, writer)
                for part in ("keyed", "operator", "raw"):
                    info = getattr(st, part)
                    if not info or (part == "keyed" and (st.operator_id, st.subtask_index) in native):
                        continue
                    h = handles[(st.operator_id, st.subtask_index, part)]
                    out = writer.create_stream(f"{st.operator_id}-{st.subtask_index}.{part}")
                    for off in range(0, h.size, _CHUNK):
                        out.write(h.read(off, min(_CHUNK, h.size - off)))
                        done += min(_CHUNK, h.size - off)
                        if progress is not None:
                            progress(done, total)
                    setattr(copy, part, {**info, "handle": out.close_and_get_handle().to_json()})
                new_states.append(copy)
        properties = {**meta.properties, "converted_from": checkpoint}
        position = _spark_position(storage, checkpoint, meta)
        if isinstance(position, SparkPosition):
            out = writer.create_stream("spark-position")
            out.write(position.to_bytes())
            properties[POSITION_PROPERTY] = {
                "handle": out.close_and_get_handle().to_json(), "query": position.query,
                "batch": position.batch, "location": position.location,
            }  # fmt: skip
        elif position is not None:
            properties[POSITION_PROPERTY] = {"missing": position}
        return complete_checkpoint(
            writer,
            job_id=meta.job_id,
            checkpoint_id=meta.checkpoint_id,
            max_parallelism=meta.max_parallelism,
            subtasks=new_states,
            kind="savepoint",
            properties=properties,
        )
    except BaseException:
        writer.abort()
        raise


def _spark_position(
    storage: CheckpointStorage, checkpoint: str, meta: CheckpointMetadata
) -> SparkPosition | str | None:
    """The source position a Spark query's checkpoint stands for, why there is none, or None (no Spark)."""
    query = meta.properties.get("spark_query_id")
    if query is None or query == "static":
        return None
    try:
        return position_of(storage, checkpoint, meta.properties)
    except Exception as e:  # noqa: BLE001 - recorded: a restore of the savepoint then refuses, saying why
        return str(e) if isinstance(e, PositionUnavailable) else f"{type(e).__name__}: {e}"


def _copied_handles(
    storage: CheckpointStorage, checkpoint: str, meta: CheckpointMetadata, native: set[tuple[str, int]]
) -> dict[tuple[str, int, str], StreamStateHandle]:
    """The files copied as they are: operator and raw state, and the keyed state of canonical subtasks."""
    parts = [
        (st, part)
        for sts in meta.operators.values()
        for st in sts
        for part in ("keyed", "operator", "raw")
        if (st.operator_id, st.subtask_index) not in native or part != "keyed"
    ]
    return {
        (st.operator_id, st.subtask_index, part): storage.resolve_handle(
            checkpoint, getattr(st, part)["handle"]
        )
        for st, part in parts
        if getattr(st, part)
    }


def _native_to_canonical(
    cp: CompletedCheckpoint, st: SubtaskState, backend: Any, writer: Any
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Restore one subtask's native snapshot into its backend and write it canonically."""
    import tempfile

    with (
        tempfile.TemporaryDirectory(prefix="statekit-convert-") as local_dir,
        cp.restored_native(st.operator_id, st, backend, local_dir) as keyed,
    ):
        state = write_subtask_state(writer, st.operator_id, st.subtask_index, keyed, None)
    return state.keyed, state.states
