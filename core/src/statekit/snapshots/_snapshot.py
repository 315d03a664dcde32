"""The canonical keyed-state snapshot format (version 2; version 1 is still read).

One backend-independent format, which every backend writes and reads, so a
snapshot taken on one backend restores into any other. The byte layout is
documented in ``docs/snapshot-format.md``; in short::

    header  = "STKCANON" u16:version u32:len json:header u32:crc32
    block*  = u32:key_group u32:sections section* u32:crc32   (ascending key group)
    section = u16:state u32:entries u32:len keys u32:len namespaces u32:len values
    index   = u32:blocks (u32:key_group u64:offset u64:length)* u32:crc32
    trailer = u64:index_offset "STKINDEX"

All integers are little-endian. A restore of some key groups reads the header
and those key groups' blocks only, at offsets the state handle carries.

Writing a snapshot also gives the SHA-256 of its header and of each block
(:class:`SnapshotWriteResult`), which checkpoints record in ``_metadata``; a
stream made by :func:`checked_parts` checks every header or block read against
them, so a reader of some key groups verifies exactly what it reads.

Version 2 added timers: the header's ``timers`` object names, per time domain,
the internal map state holding that domain's timers (whose user keys are
encoded by :func:`statekit.timers.encode_timer`). Version 1 snapshots have no
timers and restore unchanged.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol, runtime_checkable

from .._errors import CorruptSnapshotError, SnapshotError
from ..serialization._keygroups import KeyGroupRange
from ..serialization._serializers import TypeSerializer
from ._digest import check_sha256, check_sha256_soon, sha256_of, sha256_soon

__all__ = [
    "CANONICAL_FORMAT",
    "FORMAT_VERSION",
    "READABLE_VERSIONS",
    "BytesStreamHandle",
    "KeyedStateHandle",
    "Section",
    "SnapshotHeader",
    "SnapshotWriteResult",
    "StreamStateHandle",
    "checked_parts",
    "describe_stream",
    "iter_blocks",
    "read_block",
    "read_header",
    "read_index",
    "write_canonical",
]

CANONICAL_FORMAT = "statekit-canonical"
FORMAT_VERSION = 2
#: The versions this statekit reads (1: before timers).
READABLE_VERSIONS = (1, 2)
_MAGIC = b"STKCANON"
_INDEX_MAGIC = b"STKINDEX"
_HDR = struct.Struct("<8sHI")
_U32 = struct.Struct("<I")
_BLOCK_HEAD = struct.Struct("<II")
_SECTION_HEAD = struct.Struct("<HI")
_INDEX_ENTRY = struct.Struct("<IQQ")
_TRAILER = struct.Struct("<Q8s")
# Headers hold state declarations, a few KiB; a larger length field is corruption,
# refused before anything that large is read.
_MAX_HEADER_LENGTH = 64 << 20

ProgressCallback = Callable[[int, int], None]
"""Called as ``progress(done, total)`` while long work runs."""


@runtime_checkable
class StreamStateHandle(Protocol):
    """Bytes written by a checkpoint storage, readable by range.

    Storages return their own handles; :class:`BytesStreamHandle` keeps the
    bytes in memory.
    """

    @property
    def size(self) -> int:
        """The number of bytes."""

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        """``length`` bytes from ``offset`` (to the end when None)."""

    def discard(self) -> None:
        """Delete the bytes; a no-op where they are not owned."""

    def to_json(self) -> dict[str, Any]:
        """What a storage needs to find these bytes again."""


@dataclass(frozen=True, eq=False)
class BytesStreamHandle:
    """A :class:`StreamStateHandle` over bytes held in memory.

    ``digest_checked``: the bytes matched a SHA-256 recorded over all of them
    (a native file as :meth:`NativeFile.read` returns it), so each is what was
    written: :func:`read_block` then parses a block where it lies, without
    copying it first or computing its CRC-32 again.
    """

    data: bytes
    name: str = "<memory>"
    digest_checked: bool = False

    @property
    def size(self) -> int:
        """The number of bytes."""
        return len(self.data)

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        """A slice of the bytes."""
        return self.data[offset : self._end(offset, length)]

    def view(self, offset: int, length: int) -> memoryview:
        """:meth:`read`'s range as a view of the bytes, not a copy."""
        return memoryview(self.data)[offset : self._end(offset, length)]

    def _end(self, offset: int, length: int | None) -> int:
        """The end of ``offset``, ``length`` (None: to the last byte), checked to lie in the bytes."""
        end = len(self.data) if length is None else offset + length
        if offset < 0 or end > len(self.data):
            raise CorruptSnapshotError(
                f"{self.name}: range [{offset}, {end}) is outside its {len(self.data)} bytes"
            )
        return end

    def discard(self) -> None:
        """Nothing to delete."""

    def to_json(self) -> dict[str, Any]:
        """Inline bytes are described by the storage that embeds them."""
        return {"type": "bytes", "name": self.name, "size": len(self.data)}


@dataclass(frozen=True)
class KeyedStateHandle:
    """Where one subtask's snapshot of keyed state lives, and where each key group starts.

    ``offsets`` maps a key group to ``(offset, length)`` of its block in
    ``stream``; key groups without state have no block.
    """

    stream: StreamStateHandle
    key_group_range: KeyGroupRange
    offsets: Mapping[int, tuple[int, int]]
    header_length: int
    format: str = CANONICAL_FORMAT
    backend: str = ""
    size: int = 0
    entries: int = 0

    def intersect(self, key_groups: KeyGroupRange) -> KeyedStateHandle | None:
        """The same handle limited to ``key_groups``; None if they share none."""
        r = self.key_group_range.intersection(key_groups)
        if not len(r):
            return None
        offs = {kg: o for kg, o in self.offsets.items() if kg in r}
        return KeyedStateHandle(
            self.stream, r, offs, self.header_length, self.format, self.backend, self.size, self.entries
        )


#: The namespace column of entries all in the void namespace: its mode byte alone.
_VOID_NAMESPACES = b"\x00"


@dataclass
class Section:
    """One state's entries in one key group, still as column bytes."""

    state: str
    count: int
    keys: bytes
    namespaces: bytes
    values: bytes
    removal: bool = False
    """True for the removals of a delta (heap's native format): the keys and namespaces whose entries
    are gone; ``values`` is empty. Canonical files never hold such sections."""

    @classmethod
    def void(cls, state: str, count: int, keys: bytes, values: bytes) -> Section:
        """The section of ``count`` entries of ``state`` all in the void namespace (encoded columns)."""
        return cls(state, count, keys, _VOID_NAMESPACES, values)

    @property
    def in_void_namespace(self) -> bool:
        """Whether every entry is in the void namespace (its namespace column is the one byte)."""
        return memoryview(self.namespaces) == _VOID_NAMESPACES


@dataclass
class SnapshotHeader:
    """The header of a canonical snapshot."""

    max_parallelism: int
    key_group_range: KeyGroupRange
    key_serializer: dict[str, Any]
    states: list[dict[str, Any]]
    backend: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION
    """The format version read (or to be written)."""

    @property
    def timers(self) -> dict[str, str]:
        """Per time domain (``"event-time"``, ``"processing-time"``), the state holding its timers."""
        t = self.extra.get("timers")
        return dict(t) if isinstance(t, dict) else {}

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored in the snapshot."""
        return {
            "max_parallelism": self.max_parallelism,
            "key_group_range": [self.key_group_range.start, self.key_group_range.end],
            "key_serializer": self.key_serializer,
            "states": self.states,
            "backend": self.backend,
            **self.extra,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> SnapshotHeader:
        """Parse the JSON object stored in a snapshot."""
        obj = dict(obj)
        start, end = obj.pop("key_group_range")
        return cls(
            max_parallelism=int(obj.pop("max_parallelism")),
            key_group_range=KeyGroupRange.of(int(start), int(end)),
            key_serializer=obj.pop("key_serializer"),
            states=list(obj.pop("states")),
            backend=str(obj.pop("backend", "")),
            extra=obj,
        )


# --- namespace column: one byte of mode, then the encoded namespaces ------------


def encode_namespaces(
    namespaces: Sequence[Any], serializer: TypeSerializer | None, void: Any, state: str
) -> bytes:
    """Encode a namespace column; all-void columns take one byte."""
    if all(ns is void for ns in namespaces):
        return _VOID_NAMESPACES
    if serializer is None:
        raise SnapshotError(
            f"state {state!r} holds namespaces other than VOID_NAMESPACE but declares no "
            "namespace serializer; pass namespace_serializer= to get_state"
        )
    mask = bytes(0 if ns is void else 1 for ns in namespaces)
    body = serializer.encode_column([ns for ns in namespaces if ns is not void])
    return b"\x01" + _U32.pack(len(mask)) + mask + body


def decode_namespaces(
    data: bytes | memoryview, count: int, serializer: TypeSerializer | None, void: Any, state: str
) -> list[Any]:
    """Decode a namespace column."""
    mv = memoryview(data)
    if mv[:1].tobytes() == b"\x00":
        return [void] * count
    if serializer is None:
        raise SnapshotError(f"state {state!r} was written with namespaces; declare its namespace_serializer")
    (n,) = _U32.unpack_from(mv, 1)
    mask = bytes(mv[5 : 5 + n])
    present = iter(serializer.decode_column(mv[5 + n :], sum(mask)))
    return [next(present) if m else void for m in mask]


# --- writing ---------------------------------------------------------------------

BlockSource = Callable[[int], Iterable[tuple[int, int, bytes, bytes, bytes]]]
"""For a key group: ``(state index, count, keys, namespaces, values)`` per non-empty state."""


@dataclass
class SnapshotWriteResult:
    """What writing a canonical snapshot produced."""

    offsets: dict[int, tuple[int, int]]
    """``(offset, length)`` of each non-empty key group's block."""
    header_length: int
    entries: int
    size: int
    state_sizes: dict[str, int]
    """Bytes of each state's sections, for storages that limit state size."""
    header_sha256: str | None = None
    """The SHA-256 of the header (its first ``header_length`` bytes), lowercase hex."""
    block_sha256: dict[int, str] = field(default_factory=dict)
    """The SHA-256 of each non-empty key group's block (the bytes at its ``offsets`` entry)."""
    state_entries: dict[str, int] = field(default_factory=dict)
    """(key, namespace) entries of each state (they add up to ``entries``)."""
    tail_sha256: str | None = None
    """The SHA-256 of the index and trailer (the bytes after the last block): with the header's
    and the blocks', every byte of the file has exactly one recorded digest."""


def write_canonical(
    out: BinaryIO,
    header: SnapshotHeader,
    blocks: BlockSource,
    *,
    progress: ProgressCallback | None = None,
) -> SnapshotWriteResult:
    """Write a canonical snapshot to ``out``, key group after key group."""
    hjson = json.dumps(header.to_json(), separators=(",", ":"), sort_keys=True).encode()
    head = _HDR.pack(_MAGIC, FORMAT_VERSION, len(hjson)) + hjson
    head += _U32.pack(zlib.crc32(head))
    out.write(head)
    pos = len(head)
    offsets: dict[int, tuple[int, int]] = {}
    # Each block's SHA-256: a long block's computed on the hashing thread while the next is encoded,
    # a short one's at once (handing it over would cost more than hashing it).
    hashing: dict[int, Future[str] | str] = {}
    entries = 0
    names = [st["name"] for st in header.states]
    state_sizes = dict.fromkeys(names, 0)
    state_entries = dict.fromkeys(names, 0)
    kgr = header.key_group_range
    total = len(kgr)
    for i, kg in enumerate(kgr):
        sections = list(blocks(kg))
        if sections:
            parts = [_BLOCK_HEAD.pack(kg, len(sections))]
            for idx, count, keys, nss, vals in sections:
                entries += count
                state_sizes[names[idx]] += len(keys) + len(nss) + len(vals)
                state_entries[names[idx]] += count
                parts.append(_SECTION_HEAD.pack(idx, count))
                for col in (keys, nss, vals):
                    parts.append(_U32.pack(len(col)))
                    parts.append(col)
            crc = 0
            for part in parts:  # the block's CRC-32 without joining it twice
                crc = zlib.crc32(part, crc)
            parts.append(_U32.pack(crc))
            block = b"".join(parts)
            out.write(block)
            offsets[kg] = (pos, len(block))
            hashing[kg] = sha256_soon(block)
            pos += len(block)
        if progress is not None:
            progress(i + 1, total)
    index = [_U32.pack(len(offsets))]
    index += [_INDEX_ENTRY.pack(kg, off, ln) for kg, (off, ln) in offsets.items()]
    ib = b"".join(index)
    tail = ib + _U32.pack(zlib.crc32(ib)) + _TRAILER.pack(pos, _INDEX_MAGIC)
    out.write(tail)
    digests = {kg: f if isinstance(f, str) else f.result() for kg, f in hashing.items()}
    return SnapshotWriteResult(
        offsets,
        len(head),
        entries,
        pos + len(tail),
        state_sizes,
        sha256_of(head),
        digests,
        state_entries,
        sha256_of(tail),
    )


# --- reading ---------------------------------------------------------------------


def describe_stream(stream: StreamStateHandle) -> str:
    """The stream as messages name it: its full URL where the handle knows one."""
    url = getattr(stream, "url", None)
    if isinstance(url, str) and url:
        return url
    try:
        j = stream.to_json()
        if j.get("type") == "inline":
            return f"{j.get('name')} (inline in _metadata)"
        return str(j.get("path") or j.get("name") or stream)
    except Exception:  # noqa: BLE001 - only for the message
        return repr(stream)


class _CheckedParts:
    """A canonical keyed file whose header and blocks are checked against their recorded SHA-256.

    The header's bytes are read whole and checked before any of them is
    returned (its length field is in the file, so a reader cannot be trusted to
    ask for exactly the recorded range); a read of exactly a block's recorded
    range is checked. Other reads (the index, the trailer) pass unchecked:
    readers compare the index with the recorded offsets.

    Bytes the wrapped handle vouches for are not hashed again: a local copy
    whose whole was checked against the recorded digest before its first read
    returns them from ``read_verified`` (None when it cannot, and the bytes are
    then read and checked as any others).
    """

    def __init__(
        self,
        inner: StreamStateHandle,
        header_length: int,
        header_sha256: str | None,
        blocks: Mapping[tuple[int, int], tuple[int, str]],
    ) -> None:
        self._inner = inner
        self._header_length = header_length
        self._header_sha256 = header_sha256
        self._blocks = blocks
        self._head: bytes | None = None

    @property
    def size(self) -> int:
        """The number of bytes."""
        return self._inner.size

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        """``length`` bytes from ``offset``; a header or block checked against its digest first."""
        hl = self._header_length
        if self._header_sha256 is None or not 0 <= offset < hl or (length is not None and length < 0):
            return self._read(offset, length)
        head = self._header()
        end = self.size if length is None else offset + length
        if end <= hl:
            return head[offset:end]
        return head[offset:] + self._read(hl, None if length is None else end - hl)

    def _verified(self, offset: int, length: int | None) -> bytes | None:
        read_verified = getattr(self._inner, "read_verified", None)
        return None if read_verified is None else read_verified(offset, length)

    def _header(self) -> bytes:
        if self._head is None:
            assert self._header_sha256 is not None
            data = self._verified(0, self._header_length)
            if data is None:
                data = self._inner.read(0, self._header_length)
                check_sha256(data, self._header_sha256, describe_stream(self._inner), "the header")
            self._head = data
        return self._head

    def _read(self, offset: int, length: int | None) -> bytes:
        data = self._verified(offset, length)
        if data is not None:
            return data
        data = self._inner.read(offset, length)
        block = self._blocks.get((offset, length)) if length is not None else None
        if block is not None:
            check_sha256(data, block[1], describe_stream(self._inner), f"the block of key group {block[0]}")
        return data

    def read_later(self, offset: int, length: int) -> tuple[bytes, Future[None] | None]:
        """A block's bytes now, and its digest check running on the hashing thread (see :func:`iter_blocks`).

        The check's ``result()`` raises :class:`CorruptSnapshotError` if the bytes
        are not the recorded ones; None when nothing is recorded for this range,
        or when a short block was checked at once (a mismatch then raises here).
        """
        if self._header_sha256 is not None and offset < self._header_length:
            return self.read(offset, length), None
        data = self._verified(offset, length)
        if data is not None:
            return data, None
        data = self._inner.read(offset, length)
        block = self._blocks.get((offset, length))
        if block is None:
            return data, None
        return data, check_sha256_soon(
            data, block[1], describe_stream(self._inner), f"the block of key group {block[0]}"
        )

    def discard(self) -> None:
        """Delete the bytes (the wrapped handle does)."""
        self._inner.discard()

    def to_json(self) -> dict[str, Any]:
        """The wrapped handle's description."""
        return self._inner.to_json()

    def __getattr__(self, name: str) -> Any:  # what a storage's handle offers beyond the protocol (url)
        return getattr(self._inner, name)


def checked_parts(
    stream: StreamStateHandle,
    header_length: int,
    header_sha256: str | None,
    offsets: Mapping[int, tuple[int, int]],
    block_sha256: Mapping[int, str],
) -> StreamStateHandle:
    """``stream`` with its header and each key group's block checked against the recorded SHA-256.

    Every reader of a :class:`KeyedStateHandle` over the returned stream
    (restores, the state processor, verification) reads through the check;
    ``stream`` itself when nothing is recorded (a snapshot written before digests).
    """
    blocks = {offsets[kg]: (kg, sha) for kg, sha in block_sha256.items() if kg in offsets}
    if header_sha256 is None and not blocks:
        return stream
    return _CheckedParts(stream, header_length, header_sha256, blocks)


def read_header(stream: StreamStateHandle) -> tuple[SnapshotHeader, int]:
    """Read and check the header; returns it and its length in bytes."""
    where = describe_stream(stream)
    raw = stream.read(0, _HDR.size)
    try:
        magic, version, hlen = _HDR.unpack(raw)
    except struct.error:
        raise CorruptSnapshotError(f"{where}: too short to be a statekit snapshot") from None
    if magic != _MAGIC:
        raise CorruptSnapshotError(f"{where}: not a canonical statekit snapshot (bad magic)")
    if hlen > stream.size - _HDR.size - 4 or hlen > _MAX_HEADER_LENGTH:
        raise CorruptSnapshotError(
            f"{where}: header length {hlen} exceeds the file or the {_MAX_HEADER_LENGTH}-byte "
            "limit; the file is corrupt"
        )
    body = stream.read(0, _HDR.size + hlen + 4)
    (crc,) = _U32.unpack_from(body, _HDR.size + hlen)
    # The checksum first: a flipped version byte is corruption, not a new version.
    if zlib.crc32(body[: _HDR.size + hlen]) != crc:
        raise CorruptSnapshotError(f"{where}: header checksum mismatch; the file is corrupt")
    if version not in READABLE_VERSIONS:
        raise CorruptSnapshotError(
            f"{where}: canonical format version {version} is not one this statekit reads "
            f"({', '.join(map(str, READABLE_VERSIONS))}); a newer statekit wrote it (upgrade), or the "
            "file is corrupt"
        )
    try:
        obj = json.loads(body[_HDR.size : _HDR.size + hlen])
        header = SnapshotHeader.from_json(obj)
        header.version = version
        return header, len(body)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        # RecursionError: a deeply nested header; AttributeError: JSON that is no object.
        raise CorruptSnapshotError(f"{where}: malformed header: {type(e).__name__}: {e}"[:500]) from None


def read_index(stream: StreamStateHandle) -> dict[int, tuple[int, int]]:
    """Read the block index from the end of a snapshot file."""
    where = describe_stream(stream)
    size = stream.size
    if size < _TRAILER.size:
        raise CorruptSnapshotError(f"{where}: truncated (no index)")
    ioff, magic = _TRAILER.unpack(stream.read(size - _TRAILER.size, _TRAILER.size))
    if magic != _INDEX_MAGIC or ioff > size - _TRAILER.size - 8:
        raise CorruptSnapshotError(f"{where}: truncated or corrupt index")
    ib = stream.read(ioff, size - _TRAILER.size - ioff)
    body, (crc,) = ib[:-4], _U32.unpack(ib[-4:])
    if zlib.crc32(body) != crc:
        raise CorruptSnapshotError(f"{where}: index checksum mismatch; the file is corrupt")
    (n,) = _U32.unpack_from(body, 0) if len(body) >= 4 else (-1,)
    if len(body) != 4 + n * _INDEX_ENTRY.size:
        raise CorruptSnapshotError(f"{where}: the index's entry count disagrees with its length")
    out = {}
    for i in range(n):
        kg, off, ln = _INDEX_ENTRY.unpack_from(body, 4 + i * _INDEX_ENTRY.size)
        out[kg] = (off, ln)
    return out


def read_block(
    stream: StreamStateHandle,
    key_group: int,
    offset: int,
    length: int,
    state_names: Sequence[str],
) -> list[Section]:
    """Read and check one key group's block; returns its sections.

    Bytes already checked against a digest over all of them (a
    :class:`BytesStreamHandle` with ``digest_checked``) are parsed in place,
    their CRC-32 not computed again: every byte is the one written.
    """
    in_place = stream if isinstance(stream, BytesStreamHandle) and stream.digest_checked else None
    raw = stream.read(offset, length) if in_place is None else in_place.view(offset, length)
    where = describe_stream(stream)
    return _parse_block(raw, where, key_group, offset, length, state_names, crc=in_place is None)


def _parse_block(
    raw: bytes | memoryview,
    where: str,
    key_group: int,
    offset: int,
    length: int,
    state_names: Sequence[str],
    *,
    crc: bool = True,
) -> list[Section]:
    """The sections of one key group's block ``raw``, its layout checked, and its CRC unless ``crc`` is False.

    Each column is a copy of its bytes (``bytes``, whatever ``raw`` is).
    """
    if len(raw) != length or length < _BLOCK_HEAD.size + 4:
        raise CorruptSnapshotError(f"{where}: key group {key_group} block is truncated")
    if crc:
        (recorded,) = _U32.unpack_from(raw, length - 4)
        if zlib.crc32(memoryview(raw)[:-4]) != recorded:
            raise CorruptSnapshotError(
                f"{where}: checksum mismatch in the block of key group {key_group}; the file is corrupt"
            )
    try:
        kg, nsec = _BLOCK_HEAD.unpack_from(raw, 0)
        if kg != key_group:
            raise CorruptSnapshotError(
                f"{where}: block at offset {offset} holds key group {kg}, expected {key_group}"
            )
        pos = _BLOCK_HEAD.size
        out = []
        for _ in range(nsec):
            idx, count = _SECTION_HEAD.unpack_from(raw, pos)
            pos += _SECTION_HEAD.size
            cols = []
            for _c in range(3):
                (ln,) = _U32.unpack_from(raw, pos)
                pos += 4
                if pos + ln > length - 4:
                    raise IndexError(f"a column of {ln} bytes overruns the block")
                cols.append(bytes(raw[pos : pos + ln]))  # bytes: no copy; a view: its one copy
                pos += ln
            out.append(Section(state_names[idx], count, cols[0], cols[1], cols[2]))
        if pos != length - 4:
            raise IndexError(f"{length - 4 - pos} bytes after the last section")
    except (struct.error, IndexError) as e:
        raise CorruptSnapshotError(f"{where}: malformed block of key group {key_group}: {e}") from None
    return out


def iter_blocks(handle: KeyedStateHandle, header: SnapshotHeader) -> Iterable[tuple[int, list[Section]]]:
    """Each key group of ``handle`` with its sections, in key-group order, each block checked first.

    Where the checkpoint records each block's digest, the next block is read and
    hashed on the hashing thread while the caller loads this one, so a restore
    hardly waits for the digests; no block is parsed or handed out before its
    digest matched.
    """
    names = [s["name"] for s in header.states]
    stream = handle.stream
    read_later = getattr(stream, "read_later", None)
    wanted = [kg for kg in sorted(handle.offsets) if kg in handle.key_group_range]
    if read_later is None:
        for kg in wanted:
            off, ln = handle.offsets[kg]
            yield kg, read_block(stream, kg, off, ln, names)
        return
    where = describe_stream(stream)
    ahead: tuple[int, bytes, Future[None] | None] | None = None
    for following in [*wanted, None]:
        current = ahead
        if following is not None:
            off, ln = handle.offsets[following]
            ahead = (following, *read_later(off, ln))
        if current is not None:
            ckg, raw, check = current
            if check is not None:
                check.result()  # raises, naming the block, if its bytes are not the recorded ones
            off, ln = handle.offsets[ckg]
            yield ckg, _parse_block(raw, where, ckg, off, ln, names)
