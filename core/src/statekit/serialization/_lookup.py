"""Finding one value in an encoded column without decoding the column.

A backend that keeps restored key groups as their checked column bytes (the
heap) answers a record's lookup here: a scan in C of the key column, where
decoding the column makes a Python object per entry. Only the encodings that
can be searched exactly are: strings of an ASCII column (by Arrow's ``index``
kernel, when this process has loaded pyarrow's compute module and numpy, as a
Spark worker has: they are never imported for this) and 64-bit ints. Every
other column gets no finder, and its caller decodes it. A value is read alone
from a column of 64-bit ints or floats, and from others by decoding the column
once.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from typing import Any

from .._errors import SerializationError
from ._serializers import FloatSerializer, IntSerializer, StrSerializer, TypeSerializer, _frames

__all__ = ["column_finder", "column_reader"]

_INT64 = struct.Struct("<q").pack
_INT64_AT = struct.Struct("<q").unpack_from
_FLOAT_AT = struct.Struct("<d").unpack_from


def column_finder(
    serializer: TypeSerializer, data: bytes | memoryview, count: int
) -> Callable[[Any], int] | None:
    """A function giving the index of a value in the column ``data`` (-1: absent), or None.

    ``data`` holds ``count`` distinct values written by ``serializer``'s
    ``encode_column``; the function compares as the column's decoded values
    would compare with the value asked (equal values, equal bytes). None when
    the column cannot be searched without decoding it.

    Raises:
        SerializationError: If ``data`` is not a column of ``count`` values.
    """
    kind = type(serializer)
    if kind is StrSerializer:
        return _str_finder(data, count)
    if kind is IntSerializer:
        return _int_finder(data, count)
    return None


def _str_finder(data: bytes | memoryview, count: int) -> Callable[[Any], int] | None:
    pa: Any = sys.modules.get("pyarrow")
    pc: Any = sys.modules.get("pyarrow.compute")
    np: Any = sys.modules.get("numpy")
    if pa is None or pc is None or not hasattr(np, "cumsum"):
        return None
    raw_lengths, blob = _frames(data, 2, "str")
    if len(raw_lengths) != 4 * count:
        raise SerializationError(f"malformed str column: {len(raw_lengths) // 4} lengths, expected {count}")
    body = np.frombuffer(blob, dtype=np.uint8)
    if len(body) and int(body.max()) >= 0x80:
        return None  # not ASCII: character lengths are not byte offsets
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(np.frombuffer(raw_lengths, dtype="<u4"), out=offsets[1:])
    if int(offsets[-1]) != len(blob):
        raise SerializationError("malformed str column: lengths do not add up to the text")
    strings = pa.LargeStringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(blob))
    index = pc.index
    scalar = pa.scalar
    large = pa.large_string()

    def find(value: Any) -> int:
        # A str with a character beyond ASCII (lone surrogates too) is in no ASCII column.
        if not isinstance(value, str) or not value.isascii():
            return -1
        return int(index(strings, scalar(value, large)).as_py())

    return find


def _int_finder(data: bytes | memoryview, count: int) -> Callable[[Any], int] | None:
    head = bytes(memoryview(data)[:1])
    if head != b"\x00":
        return None  # ints beyond 64 bits are framed one by one
    body = bytes(memoryview(data)[1:])
    if len(body) != 8 * count:
        raise SerializationError(f"malformed int column: {len(body)} bytes for {count} ints")
    if sys.byteorder != "little":  # pragma: no cover - no big-endian CI
        return None
    locate = body.find

    def find(value: Any) -> int:
        try:
            packed = _INT64(value)  # as the serializer packs it: ints and __index__ objects, never floats
        except (struct.error, TypeError):
            return -1
        pos = locate(packed)
        while pos > 0 and pos % 8:  # a match across two values: look further
            pos = locate(packed, pos + 1)
        return -1 if pos < 0 else pos // 8

    return find


def column_reader(serializer: TypeSerializer, data: bytes | memoryview, count: int) -> Callable[[int], Any]:
    """A function giving the value at a position of the column ``data`` of ``count`` values.

    64-bit ints and floats are read alone; other columns are decoded whole on
    the first read, and kept.

    Raises:
        SerializationError: If ``data`` is not a column of ``count`` values (when read, for
            columns decoded whole).
    """
    kind = type(serializer)
    mv = memoryview(data)
    if kind is IntSerializer and bytes(mv[:1]) == b"\x00":
        if len(mv) != 1 + 8 * count:
            raise SerializationError(f"malformed int column: {len(mv) - 1} bytes for {count} ints")
        body = bytes(mv)
        return lambda i: _INT64_AT(body, 1 + 8 * i)[0]
    if kind is FloatSerializer:
        if len(mv) != 8 * count:
            raise SerializationError(f"malformed float column: {len(mv)} bytes for {count} floats")
        body = bytes(mv)
        return lambda i: _FLOAT_AT(body, 8 * i)[0]
    decoded: list[list[Any]] = []

    def read(i: int) -> Any:
        if not decoded:
            decoded.append(serializer.decode_column(data, count))
        return decoded[0][i]

    return read
