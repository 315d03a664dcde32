"""Raw state in a checkpoint: one file per subtask written, and what a new subtask gets back.

A subtask's raw state (see :mod:`statekit.state._raw`) is written as one file
beside its keyed and operator files, named ``<operator>-<subtask>.raw``, its
``_metadata`` entry under ``raw``. On restore, new subtask ``i`` of ``p``
gets the blocks of exactly the key groups it owns (from every old subtask
whose range overlaps) and its even-split share of the old subtasks' items;
it reads only the files that hold them, and every byte it gets was compared
with the digests the metadata records before the function sees any of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._contracts import CheckpointStorage, CheckpointWriter
from .._errors import CorruptSnapshotError
from ..serialization._keygroups import KeyGroupRange, key_group_range_for_operator
from ..snapshots._snapshot import describe_stream
from ..state._raw import RawSnapshot, decode_raw_file, encode_raw_file, even_split, parse_raw_entry
from ._metadata import SubtaskState, typed

__all__ = ["has_raw_state", "read_raw_state", "write_raw_file"]


def write_raw_file(writer: CheckpointWriter, name: str, snap: RawSnapshot) -> dict[str, Any]:
    """Write one subtask's raw state into stream ``name`` of ``writer``; returns its metadata entry."""
    data, entry = encode_raw_file(snap)
    stream = writer.create_stream(name)
    try:
        stream.write(data)
        handle = stream.close_and_get_handle()
    except BaseException:
        stream.discard()
        raise
    return {"handle": handle.to_json(), **entry}


def has_raw_state(subtasks: Sequence[SubtaskState]) -> bool:
    """Whether any of an operator's subtask states holds raw state."""
    return any(st.raw for st in subtasks)


def read_raw_state(
    storage: CheckpointStorage,
    location: str,
    operator_id: str,
    subtasks: Sequence[SubtaskState],
    max_parallelism: int,
    index: int,
    parallelism: int,
) -> RawSnapshot:
    """The raw state of new subtask ``index`` of ``parallelism`` of ``operator_id``, checked whole.

    Raises:
        CorruptSnapshotError: Naming the file (or ``_metadata``), operator,
            subtask and key group, if a file is missing, damaged or another's.
    """
    key_groups = key_group_range_for_operator(max_parallelism, parallelism, index)
    meta_file = f"{location.rstrip('/')}/_metadata"
    counts: list[int] = []
    wanted_kgs: list[bool] = []
    for st in subtasks:
        where = f"{meta_file}: operator {operator_id!r} subtask {st.subtask_index}"
        if st.raw is None:
            counts.append(0)
            wanted_kgs.append(False)
            continue
        blocks, items, *_ = parse_raw_entry(st.raw, st.key_group_range, where)
        counts.append(len(items))
        wanted_kgs.append(any(kg in key_groups for kg in blocks))
    slices = {old: (s, e) for old, s, e in even_split(counts, parallelism, index)}
    out = RawSnapshot()
    for st, wanted in zip(subtasks, wanted_kgs, strict=True):
        item_slice = slices.get(st.subtask_index, (0, 0))
        if st.raw is None or (not wanted and item_slice == (0, 0)):
            continue
        try:
            handle = storage.resolve_handle(location, typed(st.raw["handle"], dict, "handle"))
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptSnapshotError(
                f"{meta_file}: operator {operator_id!r} subtask {st.subtask_index}: malformed raw state "
                f"handle ({e}); the metadata is corrupt"
            ) from None
        where = f"{describe_stream(handle)}: raw state of operator {operator_id!r} subtask {st.subtask_index}"
        part = decode_raw_file(
            handle.read(),
            st.raw,
            st.key_group_range,
            key_groups=key_groups if wanted else KeyGroupRange.empty(),
            item_slice=item_slice,
            where=where,
        )
        out.keyed.update(part.keyed)
        out.items.extend(part.items)
    return out
