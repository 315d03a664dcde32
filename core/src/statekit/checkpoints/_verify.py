"""Checking a completed checkpoint's files without restoring it.

Two depths:

- shallow (``deep=False``): the metadata parses, and every file it names exists
  with (at least) the size it records. One small read per file; what
  ``restore="latest"`` checks before it restores a candidate.
- deep (``deep=True``): every byte is read and compared with the SHA-256 the
  metadata records for it: each file's whole bytes, and each canonical keyed
  file's header and key-group blocks (the parts restores read alone), in one
  pass per file; each keyed file's header and index are parsed and the index
  compared with the metadata; each raw state file's blocks and items are
  compared with their digests. A file written by a statekit before digests is
  checked by its CRC-32s instead (:func:`crc_only_files` names them). What
  ``statekit checkpoints verify`` does.

Failures of the store itself (it is down, access is refused) are raised, not
reported as problems: they say nothing about the checkpoint.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .._contracts import CheckpointStorage
from .._errors import CorruptCheckpointError, CorruptSnapshotError
from ..serialization._keygroups import KeyGroupRange
from ..snapshots._digest import NOT_RECORDED, FileDigest, new_sha256, parse_sha256, recorded_digest, sha256_of
from ..snapshots._snapshot import (
    CANONICAL_FORMAT,
    BytesStreamHandle,
    KeyedStateHandle,
    StreamStateHandle,
    describe_stream,
    read_block,
    read_header,
    read_index,
)
from ..state._operator import decode_operator_snapshot
from ..state._raw import decode_raw_file, parse_raw_entry
from ._metadata import typed
from ._restore import CompletedCheckpoint, load_checkpoint

__all__ = [
    "CRC_ONLY",
    "KIND_UNCHECKED",
    "CheckpointProblem",
    "crc_only_files",
    "identity_notes",
    "verify_checkpoint",
    "verify_loaded",
]

#: How verification describes a file without a recorded digest.
CRC_ONLY = "CRC only (written by a statekit before digests)"
#: What verification says of metadata that records no kind (an early 0.1 statekit wrote it).
KIND_UNCHECKED = (
    "identity partly unchecked: the metadata records no kind (an early 0.1 statekit wrote it); its job "
    "and checkpoint id were checked against where it sits, its kind was not"
)
_CHUNK = 4 << 20


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
        key = describe_stream(stream)
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
                        yield _canonical_check(cp, item, keyed, deep), item.stream
                    else:
                        yield _native_check(item, deep), item.stream
            part = st.operator
            if part:
                try:
                    stream = cp.storage.resolve_handle(cp.location, typed(part["handle"], dict, "handle"))
                    sha = parse_sha256(part.get("sha256"), "the operator state file")
                except (CorruptSnapshotError, KeyError, TypeError, ValueError) as e:
                    problems.append(_problem(cp.location, meta_file, f"malformed operator state entry: {e}"))
                    continue
                yield _operator_check(stream, part.get("crc32"), sha, deep), stream
            if st.raw:
                try:
                    stream = cp.storage.resolve_handle(cp.location, typed(st.raw["handle"], dict, "handle"))
                    parse_raw_entry(st.raw, st.key_group_range, meta_file)
                except (CorruptSnapshotError, KeyError, TypeError, ValueError) as e:
                    problems.append(_problem(cp.location, meta_file, f"malformed raw state entry: {e}"))
                    continue
                yield _raw_check(stream, st.raw, st.key_group_range, deep), stream


def _raw_check(stream: StreamStateHandle, entry: Any, kgr: KeyGroupRange, deep: bool) -> Callable[[], None]:
    def check() -> None:
        size = entry["size"]
        if not deep:
            _exists_with_size(stream, size)
            return
        where = describe_stream(stream)
        decode_raw_file(stream.read(), entry, kgr, key_groups=kgr, item_slice=(0, 0), where=where)

    return check


def identity_notes(cp: CompletedCheckpoint) -> list[str]:
    """What of ``cp``'s identity (see ``_metadata.identity_problem``) could not be checked."""
    return [] if cp.metadata.kind_recorded else [KIND_UNCHECKED]


def crc_only_files(cp: CompletedCheckpoint) -> list[str]:
    """The files of ``cp`` whose metadata records no SHA-256: checked by their CRC-32s only.

    Files a statekit before digests wrote (a rocksdb checkpoint may reference
    such files of older checkpoints too). Bytes inline in ``_metadata`` are not
    listed: the metadata's own checksum covers them. Entries that cannot be
    parsed are left to :func:`verify_loaded`, which reports them.
    """
    found: list[str] = []
    for subtasks in cp.metadata.operators.values():
        for st in subtasks:
            entries: list[Any] = [st.operator]
            keyed = st.keyed
            if keyed and keyed.get("format", CANONICAL_FORMAT) == CANONICAL_FORMAT:
                entries.append(keyed)
            elif keyed and isinstance(keyed.get("native"), dict):
                files = keyed["native"].get("files")
                entries.extend(files if isinstance(files, list) else [])
            for entry in entries:
                if not isinstance(entry, dict) or _records_digest(entry):
                    continue
                try:
                    stream = cp.storage.resolve_handle(cp.location, typed(entry["handle"], dict, "handle"))
                except (CorruptSnapshotError, KeyError, TypeError, ValueError):
                    continue
                if not isinstance(stream, BytesStreamHandle):
                    found.append(describe_stream(stream))
    return sorted(set(found))


def _records_digest(entry: dict[str, Any]) -> bool:
    try:
        return recorded_digest(entry) is not None
    except CorruptSnapshotError:
        return True  # malformed: verify_loaded reports it


def _exists_with_size(stream: StreamStateHandle, size: int) -> None:
    """One small read at the end: raises if the file is missing or shorter than ``size``."""
    if stream.size != size:
        raise CorruptSnapshotError(
            f"{describe_stream(stream)}: has {stream.size} bytes, the metadata records {size}; "
            "the file is truncated or was replaced"
        )
    if size:
        stream.read(size - 1, 1)


def _canonical_check(
    cp: CompletedCheckpoint, h: KeyedStateHandle, entry: Any, deep: bool
) -> Callable[[], None]:
    def check() -> None:
        if h.size:
            _exists_with_size(h.stream, h.size)
        else:
            h.stream.read(0, min(1, h.stream.size))
        if not deep:
            return
        verified: set[int] = set()
        digest = recorded_digest(entry, "the keyed state file")
        if digest is not None:
            # One pass over the file's bytes checks every recorded part (and the whole, where
            # the file records the SHA-256 of its whole).
            raw = cp.storage.resolve_handle(cp.location, typed(entry["handle"], dict, "handle"))
            whole = None if digest.parts else digest.name
            verified = _scan(raw, h.size or raw.size, whole, _parts(entry, h, digest))
        header, _ = read_header(h.stream)
        index = read_index(h.stream)
        names = [s["name"] for s in header.states]
        for kg, (off, ln) in sorted(h.offsets.items()):
            if index.get(kg) != (off, ln):
                raise CorruptSnapshotError(
                    f"{describe_stream(h.stream)}: the block of key group {kg} is at {index.get(kg)} in the "
                    f"file's index, at {(off, ln)} in the metadata"
                )
            if kg not in verified:  # its bytes were not compared with a recorded digest: its CRC-32
                read_block(h.stream, kg, off, ln, names)

    return check


def _parts(
    entry: Any, h: KeyedStateHandle, digest: FileDigest
) -> list[tuple[int, int, str, str, int | None]]:
    """The recorded parts of a keyed file: ``(offset, length, sha256, what, key group)``, by offset."""
    if digest.parts:  # they tile the file
        groups = {off: kg for kg, (off, _) in h.offsets.items()}
        return [(off, ln, sha, *_part_name(off, groups, h.header_length)) for off, ln, sha in digest.parts]
    parts: list[tuple[int, int, str, str, int | None]] = []
    header = parse_sha256(entry.get("header_sha256"), "the header")
    if header is not None:
        parts.append((0, h.header_length, header, "the header", None))
    blocks = entry.get("block_sha256") or {}
    for kg, (off, ln) in h.offsets.items():
        sha = parse_sha256(blocks.get(str(kg)) if isinstance(blocks, dict) else None, f"key group {kg}")
        if sha is not None:
            parts.append((off, ln, sha, f"the block of key group {kg}", kg))
    return sorted(parts)


def _part_name(offset: int, groups: Mapping[int, int], header_length: int) -> tuple[str, int | None]:
    if offset == 0 and header_length:
        return "the header", None
    if offset in groups:
        return f"the block of key group {groups[offset]}", groups[offset]
    return "the index and trailer", None


def _scan(
    stream: StreamStateHandle,
    size: int,
    sha256: str | None,
    parts: list[tuple[int, int, str, str, int | None]],
) -> set[int]:
    """Read ``stream`` once, comparing it and each part with their digests; the key groups verified.

    ``sha256`` is the whole file's, for a file that records one (None: its parts cover it).

    Raises:
        CorruptSnapshotError: Naming the part that differs when only one does,
            else the file (replaced by another, or damaged in many places).
    """
    whole = None if sha256 is None else new_sha256()
    hashers = [new_sha256() for _ in parts]
    first = 0  # parts before this one end before the current chunk
    pos = 0
    while pos < size:
        data = stream.read(pos, min(_CHUNK, size - pos))
        if not data:
            break
        end = pos + len(data)
        if whole is not None:
            whole.update(data)
        view = memoryview(data)
        i = first
        while i < len(parts) and parts[i][0] < end:
            start, length = parts[i][0], parts[i][1]
            lo, hi = max(start, pos), min(start + length, end)
            if lo < hi:
                hashers[i].update(view[lo - pos : hi - pos])
            i += 1
        while first < len(parts) and parts[first][0] + parts[first][1] <= end:
            first += 1
        pos = end
    where = describe_stream(stream)
    wrong = [p[3] for p, h in zip(parts, hashers) if h.hexdigest() != p[2]]
    if pos == size and (whole is None or whole.hexdigest() == sha256) and not wrong:
        return {p[4] for p in parts if p[4] is not None}
    if len(wrong) == 1:
        raise CorruptSnapshotError(f"{where}: {wrong[0]}: {NOT_RECORDED}")
    raise CorruptSnapshotError(f"{where}: {NOT_RECORDED}")


def _native_check(f: Any, deep: bool) -> Callable[[], None]:
    def check() -> None:
        if deep:
            for _ in f.chunks():
                pass
        else:
            _exists_with_size(f.stream, f.size)

    return check


def _operator_check(
    stream: StreamStateHandle, crc: object, sha: str | None, deep: bool
) -> Callable[[], None]:
    def check() -> None:
        if not deep:
            if stream.size:
                stream.read(stream.size - 1, 1)
            return
        data = stream.read()
        if sha is not None:
            if sha256_of(data) != sha:
                raise CorruptSnapshotError(f"{describe_stream(stream)}: {NOT_RECORDED}")
        elif isinstance(crc, int) and zlib.crc32(data) != crc:
            raise CorruptSnapshotError(
                f"{describe_stream(stream)}: its CRC-32 is not the one the metadata records; "
                "the file is corrupt"
            )
        decode_operator_snapshot(data, describe_stream(stream))

    return check
