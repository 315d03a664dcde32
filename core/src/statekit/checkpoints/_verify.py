"""Checking a completed checkpoint's files without restoring it.

Two depths:

- shallow (``deep=False``): the metadata parses, and every file it names exists
  with (at least) the size it records. One small read per file; what
  ``restore="latest"`` checks before it restores a candidate.
- deep (``deep=True``): every byte is read and every checksum compared: each
  canonical keyed file's header, index and key-group blocks, each native file's
  CRC-32, each operator state file's CRC-32. What ``statekit checkpoints verify``
  does.

Failures of the store itself (it is down, access is refused) are raised, not
reported as problems: they say nothing about the checkpoint.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .._contracts import CheckpointStorage
from .._errors import CorruptCheckpointError, CorruptSnapshotError
from ..snapshots._snapshot import (
    CANONICAL_FORMAT,
    StreamStateHandle,
    _where,
    read_block,
    read_header,
    read_index,
)
from ..state._operator import decode_operator_snapshot
from ._checkpoint import CompletedCheckpoint, _typed, load_checkpoint

__all__ = ["CheckpointProblem", "verify_checkpoint", "verify_loaded"]


@dataclass(frozen=True)
class CheckpointProblem:
    """One damaged or missing file of a checkpoint.

    Attributes:
        location: The checkpoint's or savepoint's directory.
        file: The full path or URL of the bad file (``<location>/_metadata`` for the metadata).
        problem: What is wrong, in a sentence.
    """

    location: str
    file: str
    problem: str

    def __str__(self) -> str:
        """``checkpoint <location>: <file>: <problem>``, the form every corruption error has."""
        return f"checkpoint {self.location}: {self.file}: {self.problem}"


def verify_checkpoint(
    storage: CheckpointStorage, location: str, *, deep: bool = True
) -> list[CheckpointProblem]:
    """The problems of the checkpoint or savepoint at ``location``; empty if it can be restored.

    Args:
        storage: The storage that holds it.
        location: Its directory (as ``list_checkpoints`` gives it).
        deep: Read every byte and compare every checksum; else only check that
            every file exists with its recorded size.

    Raises:
        CheckpointNotFoundError: If there is no completed checkpoint at ``location``.
        CheckpointError: If the store fails while reading.
    """
    try:
        cp = load_checkpoint(storage, location)
    except CorruptCheckpointError as e:
        return [_problem(location, f"{location.rstrip('/')}/_metadata", e.problem)]
    return verify_loaded(cp, deep=deep)


def verify_loaded(cp: CompletedCheckpoint, *, deep: bool) -> list[CheckpointProblem]:
    """:func:`verify_checkpoint` for a checkpoint whose metadata is already loaded."""
    problems: list[CheckpointProblem] = []
    seen: set[str] = set()  # a shared file several subtasks reference is read once
    for check, stream in _checks(cp, deep, problems):
        key = _where(stream)
        if key in seen:
            continue
        seen.add(key)
        try:
            check()
        except CorruptSnapshotError as e:
            text = e.problem if isinstance(e, CorruptCheckpointError) else str(e)
            problems.append(_problem(cp.location, key, text))
    return problems


def _problem(location: str, file: str, message: str) -> CheckpointProblem:
    # The inner message usually starts with the file's own name: say it once.
    text = message.removeprefix(f"{file}: ").removeprefix(f"checkpoint {location}: ")
    text = text.removeprefix(f"{file}: ")
    return CheckpointProblem(location, file, text)


def _checks(
    cp: CompletedCheckpoint, deep: bool, problems: list[CheckpointProblem]
) -> Iterator[tuple[Callable[[], None], StreamStateHandle]]:
    """Each file of ``cp`` with the check of its bytes; entries that cannot be parsed become problems."""
    meta_file = f"{cp.location.rstrip('/')}/_metadata"
    for op, subtasks in cp.metadata.operators.items():
        for st in subtasks:
            keyed = st.keyed
            if keyed:
                try:
                    if keyed.get("format", CANONICAL_FORMAT) == CANONICAL_FORMAT:
                        canonical = cp.keyed_handles(op, st.key_group_range)
                        streams: list[Any] = [(h, "canonical") for h in canonical]
                    else:
                        native = cp.native_handles(op, st.key_group_range)
                        streams = [(f, "native") for h in native for f in h.files]
                except CorruptSnapshotError as e:
                    text = e.problem if isinstance(e, CorruptCheckpointError) else str(e)
                    problems.append(_problem(cp.location, meta_file, text))
                    streams = []
                for item, kind in streams:
                    if kind == "canonical":
                        yield _canonical_check(item, deep), item.stream
                    else:
                        yield _native_check(item, deep), item.stream
            part = st.operator
            if part:
                try:
                    stream = cp.storage.resolve_handle(cp.location, _typed(part["handle"], dict, "handle"))
                except (CorruptSnapshotError, KeyError, TypeError, ValueError) as e:
                    problems.append(_problem(cp.location, meta_file, f"malformed operator state entry: {e}"))
                    continue
                yield _operator_check(stream, part.get("crc32"), deep), stream


def _exists_with_size(stream: StreamStateHandle, size: int) -> None:
    """One small read at the end: raises if the file is missing or shorter than ``size``."""
    if stream.size != size:
        raise CorruptSnapshotError(
            f"{_where(stream)}: has {stream.size} bytes, the metadata records {size}; "
            "the file is truncated or was replaced"
        )
    if size:
        stream.read(size - 1, 1)


def _canonical_check(h: Any, deep: bool) -> Callable[[], None]:
    def check() -> None:
        if h.size:
            _exists_with_size(h.stream, h.size)
        else:
            h.stream.read(0, min(1, h.stream.size))
        if not deep:
            return
        header, _ = read_header(h.stream)
        index = read_index(h.stream)
        names = [s["name"] for s in header.states]
        for kg, (off, ln) in sorted(h.offsets.items()):
            if index.get(kg) != (off, ln):
                raise CorruptSnapshotError(
                    f"{_where(h.stream)}: the block of key group {kg} is at {index.get(kg)} in the file's "
                    f"index, at {(off, ln)} in the metadata"
                )
            read_block(h.stream, kg, off, ln, names)

    return check


def _native_check(f: Any, deep: bool) -> Callable[[], None]:
    def check() -> None:
        if deep:
            for _ in f.chunks():
                pass
        else:
            _exists_with_size(f.stream, f.size)

    return check


def _operator_check(stream: StreamStateHandle, crc: object, deep: bool) -> Callable[[], None]:
    def check() -> None:
        if not deep:
            if stream.size:
                stream.read(stream.size - 1, 1)
            return
        data = stream.read()
        if isinstance(crc, int) and zlib.crc32(data) != crc:
            raise CorruptSnapshotError(
                f"{_where(stream)}: its CRC-32 is not the one the metadata records; the file is corrupt"
            )
        decode_operator_snapshot(data, _where(stream))

    return check
