"""Digests of checkpoint files: the SHA-256 of their bytes, recorded in ``_metadata``, checked on read.

A CRC-32 detects damage, not identity: a file whose sections each end in their
own CRC has the same whole-file CRC as every other file of that layout (the CRC
residue), and another checkpoint's valid file passes every CRC of its own. So
every file a checkpoint names has the SHA-256 of its bytes (lowercase hex,
under the key ``"sha256"``) in the checkpoint's ``_metadata``, which is what a
reader trusts. One scheme for every file, so that what checks a checkpoint
file here also checks a local copy of it, or a file of a later
content-addressed format (:class:`FileDigest`).

A canonical keyed file is read in parts (a restore reads the header and only
the key groups it owns), so it records the SHA-256 of each part instead: its
header (``header_sha256``), each key group's block (``block_sha256``) and the
index with the trailer (``tail_sha256``), which together cover every byte of
the file once. Its digest as a whole is the SHA-256 of that list
(:func:`parts_digest`: the size, and each part's offset, length and digest),
derived from the metadata by every reader rather than recorded, so it can never
disagree with the parts. Each byte is hashed once when written and once when
read. Keyed files written by earlier statekit 0.1 builds record the SHA-256 of
the whole file as well (and no ``tail_sha256``); they are checked by that one.

Digests are computed as the bytes are written (:func:`sha256_later`), never in
a second pass over a file, and checked on the bytes a reader gets
(:func:`check_sha256`). Bytes inlined into ``_metadata`` are covered by the
metadata's own checksum as well.

Writing hashes off the writer's thread: hashlib lets go of the GIL while it
hashes more than a few KiB, so one thread of this process (:func:`sha256_later`)
hashes on another core while the writer encodes the
next block. On a machine whose cores are all busy it costs what hashing costs
(SHA-256 runs at about 1.8 GB/s here); elsewhere the snapshot hardly waits.
Handing bytes to that thread costs the writer about 25-35 µs (a lock and the
GIL passed back and forth), which is what hashing 48-64 KiB costs: smaller
parts (a micro-batch's changes spread over 64 key groups are a few KiB each)
are hashed and checked on the caller's thread (:func:`sha256_soon`,
:func:`check_sha256_soon`, :data:`INLINE_BELOW`).

What it may import: ``statekit._errors`` only.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from .._errors import CorruptSnapshotError

__all__ = [
    "DIGEST_KEY",
    "INLINE_BELOW",
    "NOT_RECORDED",
    "FileDigest",
    "check_sha256",
    "check_sha256_later",
    "check_sha256_soon",
    "fd_has_digest",
    "file_sha256",
    "new_sha256",
    "parse_sha256",
    "parts_digest",
    "recorded_digest",
    "sha256_later",
    "sha256_of",
    "sha256_soon",
]

#: The key of a file's digest in its ``_metadata`` entry (and of a block's, in ``block_sha256``).
DIGEST_KEY = "sha256"
#: What a mismatch means, in every message that reports one.
NOT_RECORDED = (
    "the bytes are not the ones this checkpoint recorded: the file was replaced (another checkpoint's "
    "or subtask's file?) or damaged"
)
_CHUNK = 4 << 20
_HEX = re.compile(r"[0-9a-f]{64}")


def new_sha256() -> hashlib._Hash:
    """A SHA-256 hash object to feed as bytes pass (``update``), read with ``hexdigest``."""
    return hashlib.sha256()


def sha256_of(data: bytes | bytearray | memoryview) -> str:
    """The lowercase hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


_HASHER: ThreadPoolExecutor | None = None
_HASHER_LOCK = threading.Lock()


def _hasher() -> ThreadPoolExecutor:
    """This process's hashing thread: one, so that the updates of one hash run in their order."""
    global _HASHER
    with _HASHER_LOCK:
        if _HASHER is None:
            _HASHER = ThreadPoolExecutor(1, thread_name_prefix="statekit-sha256")
        return _HASHER


def _forget_hasher() -> None:
    # A forked child (Spark's daemon forks its Python workers) has no thread of its parent's.
    global _HASHER
    _HASHER = None


os.register_at_fork(after_in_child=_forget_hasher)


#: Bytes shorter than this are hashed at once, on the caller's thread: passing them to the hashing
#: thread would cost the caller more than hashing them (measured: 25-35 µs against 37 µs for 64 KiB).
INLINE_BELOW = 64 << 10


def sha256_later(data: bytes) -> Future[str]:
    """The SHA-256 of ``data``, computed on this process's hashing thread (``data`` must not change)."""
    return _hasher().submit(sha256_of, data)


def sha256_soon(data: bytes) -> str | Future[str]:
    """The SHA-256 of ``data``: at once under :data:`INLINE_BELOW` bytes, else :func:`sha256_later`'s."""
    return sha256_of(data) if len(data) < INLINE_BELOW else sha256_later(data)


def file_sha256(path: str | os.PathLike[str] | int, *, chunk_size: int = _CHUNK) -> str:
    """The lowercase hex SHA-256 of a local file (a path, or an open descriptor read from its start).

    Raises:
        OSError: If the file cannot be read.
    """
    h = hashlib.sha256()
    if isinstance(path, int):
        offset = 0
        while data := os.pread(path, chunk_size, offset):
            h.update(data)
            offset += len(data)
        return h.hexdigest()
    with open(path, "rb") as f:
        while data := f.read(chunk_size):
            h.update(data)
    return h.hexdigest()


def parse_sha256(value: object, what: str) -> str | None:
    """A digest as ``_metadata`` holds it: None when absent (a file written before digests).

    Raises:
        CorruptSnapshotError: If ``value`` is present but not 64 lowercase hex digits.
    """
    if value is None:
        return None
    if isinstance(value, str) and _HEX.fullmatch(value):
        return value
    raise CorruptSnapshotError(
        f"malformed SHA-256 of {what} ({str(value)[:80]!r}): the metadata is damaged or was crafted"
    )


def check_sha256(data: bytes | bytearray | memoryview, expected: str, where: str, what: str = "") -> None:
    """Raise unless ``data`` has the SHA-256 ``expected`` (the one ``_metadata`` records).

    Args:
        data: The bytes read.
        expected: Their recorded digest.
        where: The file, as messages name it.
        what: The part of the file (``"the block of key group 78"``), empty for the whole.

    Raises:
        CorruptSnapshotError: ``<where>: [<what>: ]the bytes are not the ones this checkpoint recorded …``.
    """
    if hashlib.sha256(data).hexdigest() != expected:
        raise CorruptSnapshotError(f"{where}: {what + ': ' if what else ''}{NOT_RECORDED}")


def check_sha256_later(data: bytes, expected: str, where: str, what: str = "") -> Future[None]:
    """:func:`check_sha256` on the hashing thread; the future's ``result()`` raises on a mismatch."""
    return _hasher().submit(check_sha256, data, expected, where, what)


def check_sha256_soon(data: bytes, expected: str, where: str, what: str = "") -> Future[None] | None:
    """:func:`check_sha256` at once under :data:`INLINE_BELOW` bytes (None, or it raises), else later.

    Longer ``data`` is checked by :func:`check_sha256_later`, whose future is returned.
    """
    if len(data) < INLINE_BELOW:
        check_sha256(data, expected, where, what)
        return None
    return check_sha256_later(data, expected, where, what)


_PARTS_MAGIC = b"statekit-parts-sha256\n"
_PART = struct.Struct(">QQ")


def parts_digest(size: int, parts: tuple[tuple[int, int, str], ...]) -> str:
    """The digest of a file recorded in parts: the SHA-256 of its size and each ``(offset, length, sha256)``.

    Two files have the same parts digest only if they have the same parts with
    the same bytes; since the parts tile the file (:func:`recorded_digest`
    refuses any that do not), only if they have the same bytes.
    """
    h = hashlib.sha256(_PARTS_MAGIC + _PART.pack(size, len(parts)))
    for offset, length, sha in parts:
        h.update(_PART.pack(offset, length) + bytes.fromhex(sha))
    return h.hexdigest()


@dataclass(frozen=True)
class FileDigest:
    """What a checkpoint records of one file's bytes (see :func:`recorded_digest`).

    Attributes:
        name: The SHA-256 of the whole file, or its :func:`parts_digest`: the
            name its local copy is kept under.
        size: The file's size in bytes when recorded in parts, else None.
        parts: ``(offset, length, sha256)`` of each part, in file order, tiling
            ``[0, size)``; empty when the whole file has one SHA-256.
    """

    name: str
    size: int | None = None
    parts: tuple[tuple[int, int, str], ...] = ()


def recorded_digest(entry: Mapping[str, object], what: str = "a file") -> FileDigest | None:
    """The digest a file's ``_metadata`` entry records; None for a file written before digests.

    The SHA-256 of the whole file where the entry has one (``"sha256"``); else,
    for a canonical keyed file, its parts (``header_sha256``, ``block_sha256``,
    ``tail_sha256`` at ``header_length`` and ``offsets``), which must tile the
    file's ``size``.

    Raises:
        CorruptSnapshotError: If a digest is malformed, or the parts do not
            cover the file exactly once (a damaged or crafted metadata).
    """
    whole = parse_sha256(entry.get(DIGEST_KEY), what)
    if whole is not None:
        return FileDigest(whole)
    tail = parse_sha256(entry.get("tail_sha256"), f"the index of {what}")
    if tail is None:
        return None
    try:
        size, hl = entry["size"], entry["header_length"]
        offsets, blocks = entry["offsets"], entry["block_sha256"]
        assert isinstance(size, int) and isinstance(hl, int)
        assert isinstance(offsets, dict) and isinstance(blocks, dict) and set(offsets) == set(blocks)
        header = parse_sha256(entry.get("header_sha256"), f"the header of {what}")
        assert header is not None
        parts = [(0, hl, header)]
        for kg, (offset, length) in sorted(offsets.items(), key=lambda item: int(item[1][0])):
            sha = parse_sha256(blocks[kg], f"the block of key group {kg} of {what}")
            assert sha is not None and isinstance(offset, int) and isinstance(length, int)
            parts.append((offset, length, sha))
        end = parts[-1][0] + parts[-1][1]
        parts.append((end, size - end, tail))
    except (AssertionError, KeyError, TypeError, ValueError):
        raise CorruptSnapshotError(f"the recorded parts of {what} are incomplete or malformed") from None
    pos = 0
    for offset, length, _ in parts:
        if offset != pos or length < 0:
            raise CorruptSnapshotError(
                f"the recorded parts of {what} do not cover it exactly once (a part at byte {offset}, "
                f"expected one at {pos}): the metadata is damaged or was crafted"
            )
        pos += length
    fixed = tuple(parts)
    return FileDigest(parts_digest(size, fixed), size, fixed)


def fd_has_digest(fd: int, digest: FileDigest, *, chunk_size: int = _CHUNK) -> bool:
    """Whether the bytes of the open local file ``fd`` (read from its start) have ``digest``: one pass."""
    if not digest.parts:
        return file_sha256(fd, chunk_size=chunk_size) == digest.name
    if os.fstat(fd).st_size != digest.size:
        return False
    for offset, length, sha in digest.parts:
        h = hashlib.sha256()
        pos, end = offset, offset + length
        while pos < end:
            data = os.pread(fd, min(chunk_size, end - pos), pos)
            if not data:
                return False
            h.update(data)
            pos += len(data)
        if h.hexdigest() != sha:
            return False
    return True
