"""The key and value layout every ordered key-value engine shares (RocksDB, LMDB, yours).

A keyed state entry lives in an engine under a *composite key*::

    key group (big-endian, 1 byte when max parallelism <= 128, else 2)
    | varint(len(key)) key
    | namespace: 0x00 for VOID_NAMESPACE, else varint(len(ns) + 1) ns
    [| suffix: a map entry's serialized user key, or a list element's u64 big-endian sequence number]

Every variable-length part before the suffix is length-prefixed, so the
encoding is prefix-free: the bytes up to and including the namespace are a
prefix that exactly one ``(key, namespace)`` has, and a prefix scan over them
returns that entry's map entries or list elements and nothing else. The key
group comes first, so one key group is one contiguous range of keys and a
subtask's key-group range is one range too (for range deletes, clipping and
ingestion on rescale).

With TTL, every stored unit (a value, a list element, a map entry's value)
starts with its last-access timestamp, a signed 64-bit big-endian integer of
milliseconds, so that a background sweep can find expired entries without
deserializing them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._errors import CorruptSnapshotError
from ..serialization._serializers import DictSerializer, ListSerializer, TupleSerializer, TypeSerializer
from ._registered import RegisteredState
from ._state import StateKind

__all__ = [
    "EntryCodec",
    "KeyLayout",
    "decode_varint",
    "encode_varint",
    "entry_codec",
    "prefix_end",
    "ttl_timestamp",
]

_TS = struct.Struct(">q")
_SEQ = struct.Struct(">Q")
VOID_NAMESPACE_BYTES = b"\x00"


def encode_varint(n: int) -> bytes:
    """``n >= 0`` as an unsigned LEB128 varint (7 bits a byte, low bits first)."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def decode_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``data[pos:]`` and the position after it."""
    shift = n = 0
    while True:
        try:
            b = data[pos]
        except IndexError:
            raise CorruptSnapshotError("truncated varint in a composite key") from None
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7
        if shift > 63:
            raise CorruptSnapshotError("varint longer than 64 bits in a composite key")


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no such key)."""
    b = bytearray(prefix)
    while b:
        if b[-1] != 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    return None


@dataclass(frozen=True)
class KeyLayout:
    """Composite keys of a job with ``max_parallelism`` key groups; see the module docstring.

    Example::

        layout = KeyLayout(128)
        prefix = layout.key_prefix(kg, key_bytes) + layout.namespace_part(None)
        value_key = prefix                      # value, reducing, aggregating state
        element_key = prefix + layout.sequence(7)  # a list element
        entry_key = prefix + user_key_bytes        # a map entry
    """

    max_parallelism: int

    @property
    def group_width(self) -> int:
        """Bytes of the key-group prefix: 1 up to max parallelism 128, else 2."""
        return 1 if self.max_parallelism <= 128 else 2

    def group_prefix(self, key_group: int) -> bytes:
        """The first bytes of every composite key of ``key_group``."""
        return key_group.to_bytes(self.group_width, "big")

    def group_range(self, start: int, end: int) -> tuple[bytes, bytes | None]:
        """``[lower, upper)`` bounds of key groups ``start..end`` (upper None: to the end)."""
        lower = self.group_prefix(start)
        upper = self.group_prefix(end + 1) if end + 1 < 1 << (8 * self.group_width) else None
        return lower, upper

    def key_prefix(self, key_group: int, key: bytes) -> bytes:
        """Key group and length-prefixed key: the prefix of every entry of the key, any namespace."""
        return key_group.to_bytes(self.group_width, "big") + encode_varint(len(key)) + key

    @staticmethod
    def namespace_part(namespace: bytes | None) -> bytes:
        """The namespace part: ``None`` is VOID_NAMESPACE (one zero byte)."""
        if namespace is None:
            return VOID_NAMESPACE_BYTES
        return encode_varint(len(namespace) + 1) + namespace

    @staticmethod
    def sequence(n: int) -> bytes:
        """A list element's suffix: its sequence number, so elements sort in append order."""
        return _SEQ.pack(n)

    def key_group_of(self, composite: bytes | memoryview) -> int:
        """The key group a composite key belongs to."""
        return int.from_bytes(composite[: self.group_width], "big")

    def split(self, composite: bytes | memoryview) -> tuple[int, bytes, bytes | None, bytes]:
        """``(key group, key, namespace or None for VOID, suffix)`` of a composite key."""
        w = self.group_width
        if isinstance(composite, bytes):
            # Nearly every key and namespace is shorter than 128 bytes: one-byte lengths, sliced.
            n = composite[w]
            p = w + 1 + n
            if n < 0x80 and p < len(composite) and composite[p] < 0x80:
                m = composite[p]
                kg = int.from_bytes(composite[:w], "big")
                if not m:
                    return kg, composite[w + 1 : p], None, composite[p + 1 :]
                return kg, composite[w + 1 : p], composite[p + 1 : p + m], composite[p + m :]
        mv = memoryview(composite)
        kg = int.from_bytes(mv[:w], "big")
        n, pos = decode_varint(mv, w)
        key = bytes(mv[pos : pos + n])
        pos += n
        if len(key) != n:
            raise CorruptSnapshotError("composite key shorter than its key length says")
        m, pos = decode_varint(mv, pos)
        ns = None
        if m:
            ns = bytes(mv[pos : pos + m - 1])
            pos += m - 1
        return kg, key, ns, bytes(mv[pos:])


def ttl_timestamp(raw: bytes | memoryview) -> int:
    """The last-access timestamp (ms) at the start of a stored TTL unit."""
    return int(_TS.unpack_from(raw, 0)[0])


class EntryCodec:
    """Bytes of one stored unit of a state: a value, a list element, or a map entry's value.

    ``encode`` and ``decode`` take what core hands a backend's handles, unit by
    unit: for a TTL state a ``(value, timestamp)`` pair, stored as the
    timestamp then the value's bytes. ``user_key`` serializes map keys (None
    for value and list state).
    """

    __slots__ = ("decode", "encode", "ttl", "user_key", "value")

    def __init__(self, value: TypeSerializer, ttl: bool, user_key: TypeSerializer | None) -> None:
        self.value = value
        self.ttl = ttl
        self.user_key = user_key
        self.encode: Callable[[Any], bytes]
        self.decode: Callable[[bytes | memoryview], Any]
        if ttl:
            ser, des, pack, unpack = value.serialize, value.deserialize, _TS.pack, _TS.unpack_from

            def encode(unit: Any) -> bytes:
                return pack(unit[1]) + ser(unit[0])

            def decode(raw: bytes | memoryview) -> Any:
                return des(memoryview(raw)[8:]), unpack(raw, 0)[0]

            self.encode, self.decode = encode, decode
        else:
            self.encode, self.decode = value.serialize, value.deserialize


def entry_codec(reg: RegisteredState) -> EntryCodec:
    """The codec of ``reg``'s stored units (per value, per list element, per map entry)."""
    ser = reg.serializer
    ttl = reg.ttl is not None
    user_key = None
    if reg.storage_kind is StateKind.LIST:
        assert isinstance(ser, ListSerializer)
        unit = ser.element
    elif reg.storage_kind is StateKind.MAP:
        assert isinstance(ser, DictSerializer)
        unit, user_key = ser.value, ser.key
    else:
        unit = ser
    if ttl:
        assert isinstance(unit, TupleSerializer)
        unit = unit.fields[0]
    return EntryCodec(unit, ttl, user_key)
