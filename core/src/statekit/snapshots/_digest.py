"""Digests of checkpoint files: the SHA-256 of their bytes, recorded in ``_metadata``, checked on read.

A CRC-32 detects damage, not identity: a file whose sections each end in their
own CRC has the same whole-file CRC as every other file of that layout (the CRC
residue), and another checkpoint's valid file passes every CRC of its own. So
every file a checkpoint names has the SHA-256 of its bytes (lowercase hex,
under the key ``"sha256"``) in the checkpoint's ``_metadata``, which is what a
reader trusts; canonical keyed files also have one per part a restore reads
alone (the header, each key group's block). One scheme for every file, so that
what checks a checkpoint file here also checks a local copy of it, or a file of
a later content-addressed format.

Digests are computed as the bytes are written (:class:`HashingOutput`,
:func:`sha256_later`), never in a second pass over a file, and checked on the
bytes a reader gets (:func:`check_sha256`). Bytes inlined into ``_metadata``
are covered by the metadata's own checksum as well.

Writing hashes off the writer's thread: hashlib lets go of the GIL while it
hashes more than a few KiB, so one thread of this process (:func:`sha256_later`,
:class:`HashingOutput`) hashes on another core while the writer encodes the
next block. On a machine whose cores are all busy it costs what hashing costs
(SHA-256 runs at about 1.8 GB/s here); elsewhere the snapshot hardly waits.

What it may import: ``statekit._errors`` only.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .._errors import CorruptSnapshotError

__all__ = [
    "DIGEST_KEY",
    "NOT_RECORDED",
    "HashingOutput",
    "check_sha256",
    "check_sha256_later",
    "file_sha256",
    "new_sha256",
    "parse_sha256",
    "sha256_later",
    "sha256_of",
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


def sha256_later(data: bytes) -> Future[str]:
    """The SHA-256 of ``data``, computed on this process's hashing thread (``data`` must not change)."""
    return _hasher().submit(sha256_of, data)


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


class HashingOutput:
    """An output stream that computes the SHA-256 of the bytes written through it.

    Wraps a checkpoint storage's stream (or anything with ``write``); what it
    does not define (``close_and_get_handle``, ``discard``, ``tell``,
    ``link_source``) goes to the stream it wraps.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._hash = hashlib.sha256()
        self._pending: Future[None] | None = None
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Write ``data`` to the wrapped stream; it is hashed on the hashing thread, in order."""
        if type(data) is not bytes:
            data = bytes(data)  # the caller may change a bytearray or a view once this returns
        n = self._inner.write(data)
        self.size += len(data)
        self._pending = _hasher().submit(self._hash.update, data)
        return len(data) if n is None else int(n)

    @property
    def sha256(self) -> str:
        """The digest of everything written so far (lowercase hex)."""
        if self._pending is not None:
            self._pending.result()  # the one thread ran every earlier update before this one
            self._pending = None
        return self._hash.hexdigest()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
