"""Finding one value in an encoded column without decoding the column.

A backend that keeps restored key groups as their checked column bytes (the
heap) answers a record's lookup here, in C, where decoding the column makes a
Python object per entry. Only the encodings that can be searched exactly are:
strings of an ASCII column (when this process has loaded numpy, as a Spark
worker has: it is never imported for this) and 64-bit ints. Every other column
gets no finder, and its caller decodes it. A value is read alone from a column
of 64-bit ints or floats, and from others by decoding the column once.

A string column is scanned by Arrow's ``index`` kernel while pyarrow's compute
module is loaded too (about 0.46 ms for 125,000 strings) until its scans have
cost about what an index costs, then indexed: a 64-bit signature per string
(its length and its first and last 8 bytes, mixed) sorted by numpy (about
13 ms for 125,000 strings, a third of decoding them), bisected, every
candidate compared byte for byte (about 2.5 µs a lookup). An int column is
searched as packed bytes (about 0.6 ms for 125,000 ints).

Keys known ahead (a task's rows, before its records run) are found together:
one pass of Arrow's ``is_in`` over a string column, or of numpy's over an int
column, for all of them (about what one scan costs), instead of a scan or a
bisection each.
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .._errors import SerializationError
from ._serializers import (
    FloatSerializer,
    IntSerializer,
    StrSerializer,
    TypeSerializer,
    _ascii_offsets,
    _frames,
)

__all__ = ["ColumnFinder", "column_finder", "column_reader"]

_INT64 = struct.Struct("<q").pack
_INT64_AT = struct.Struct("<q").unpack_from
_FLOAT_AT = struct.Struct("<d").unpack_from

#: A scan's fixed cost (the kernel call and the Python around it), in strings compared.
_SCAN_CALL = 12_000
#: Building the index, in strings compared per string (13 ms against a 0.46 ms scan).
_INDEX_BUILD = 25

_M64 = (1 << 64) - 1
_MIX = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9)


class ColumnFinder(Protocol):
    """Positions of values in one encoded column: -1 where the column does not hold the value."""

    def __call__(self, value: Any) -> int:
        """The position of ``value``."""

    def many(self, values: Sequence[Any]) -> list[int]:
        """The position of each of ``values``, found together."""


def column_finder(serializer: TypeSerializer, data: bytes | memoryview, count: int) -> ColumnFinder | None:
    """A finder of the position of a value in the column ``data`` (-1: absent), or None.

    ``data`` holds ``count`` distinct values written by ``serializer``'s
    ``encode_column``; the finder compares as the column's decoded values
    would compare with the value asked (equal values, equal bytes). None when
    the column cannot be searched undecoded.

    Raises:
        SerializationError: If ``data`` is not a column of ``count`` values.
    """
    kind = type(serializer)
    if kind is StrSerializer:
        return _StrFinder.of(data, count)
    if kind is IntSerializer:
        return _IntFinder.of(data, count)
    return None


class _StrFinder:
    """An ASCII string column, indexed by signature at its first lookup."""

    __slots__ = ("_blob", "_count", "_np", "_order", "_scanned", "_signatures", "_starts", "_strings")

    @classmethod
    def of(cls, data: bytes | memoryview, count: int) -> _StrFinder | None:
        np: Any = sys.modules.get("numpy")
        if not hasattr(np, "argsort"):
            return None
        raw_lengths, blob = _frames(data, 2, "str")
        if len(raw_lengths) != 4 * count:
            raise SerializationError(
                f"malformed str column: {len(raw_lengths) // 4} lengths, expected {count}"
            )
        body = np.frombuffer(blob, dtype=np.uint8)
        if len(body) and int(body.max()) >= 0x80:
            return None  # not ASCII: character lengths are not byte offsets
        offsets = _ascii_offsets(np, raw_lengths, len(blob))
        strings: Any = None
        pa: Any = sys.modules.get("pyarrow")
        if pa is not None and sys.modules.get("pyarrow.compute") is not None:
            strings = pa.LargeStringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(blob))
        return cls(count, np, body, offsets, strings)

    def __init__(
        self,
        count: int,
        np: Any,
        body: Any,
        offsets: Any,
        strings: Any = None,
    ) -> None:
        self._count = count
        # The column as an Arrow array, scanned by Arrow, when pyarrow.compute is loaded.
        self._strings = strings
        self._scanned = 0  # strings compared by scans so far
        self._np = np
        self._blob: Any = body  # the strings' bytes: a numpy array, then (indexed) bytes
        self._starts: Any = offsets  # numpy, then (indexed) an array("q") of the n + 1 offsets
        # Once indexed: the strings' signatures, sorted, and the position of each (arrays, whose
        # items are Python ints: bisect and compare them without numpy's scalars).
        self._signatures: array[int] | None = None
        self._order: array[int] | None = None

    def __call__(self, value: Any) -> int:
        # A str with a character beyond ASCII (lone surrogates too) is in no ASCII column.
        if not isinstance(value, str) or not value.isascii():
            return -1
        if self._signatures is None:
            n = self._count
            if self._strings is not None and self._scanned < _INDEX_BUILD * n:  # scans cost less so far
                self._scanned += n + _SCAN_CALL
                pc: Any = sys.modules["pyarrow.compute"]
                return int(pc.index(self._strings, self._arrow([value.encode("ascii")])[0]).as_py())
            self._build()
        raw = value.encode("ascii")
        size = len(raw)
        sig = (
            int.from_bytes(raw[-8:].rjust(8, b"\0"), "little") * _MIX[0]
            + int.from_bytes(raw[:8].ljust(8, b"\0"), "little") * _MIX[1]
            + size * _MIX[2]
        ) & _M64
        signatures, order, blob, offsets = self._signatures, self._order, self._blob, self._starts
        assert signatures is not None and order is not None
        pos = bisect_left(signatures, sig)
        n = self._count
        while pos < n and signatures[pos] == sig:
            i = order[pos]
            start = offsets[i]
            if offsets[i + 1] - start == size and blob[start : start + size] == raw:
                return i
            pos += 1
        return -1

    def many(self, values: Sequence[Any]) -> list[int]:
        """The position of each of ``values``, found together.

        One pass of Arrow's ``is_in`` for all of them, until the passes and scans
        so far have cost what an index costs; then indexed, as :meth:`__call__` decides.
        """
        strings = self._strings
        if self._signatures is None and self._scanned >= _INDEX_BUILD * self._count:
            self._build()  # the passes so far cost what the index costs, as __call__ decides
        if self._signatures is not None or strings is None or len(values) < 2:
            return [self(value) for value in values]
        wanted = [v.encode("ascii") for v in values if isinstance(v, str) and v.isascii()]
        if not wanted:
            return [-1] * len(values)
        pc: Any = sys.modules["pyarrow.compute"]
        at = pc.indices_nonzero(pc.is_in(strings, value_set=self._arrow(wanted)))
        found = dict(zip(strings.take(at).to_pylist(), at.to_pylist()))
        self._scanned += self._count + _SCAN_CALL  # one pass, as one scan
        return [found.get(v, -1) if isinstance(v, str) else -1 for v in values]

    def _arrow(self, raws: list[bytes]) -> Any:
        """ASCII strings asked for, as an Arrow array like the column's.

        Made from buffers: pyarrow converts Python objects (a scalar too) only
        after importing pandas, which a lookup in a Spark worker should not pay.
        """
        np, pa = self._np, sys.modules["pyarrow"]
        offsets = np.zeros(len(raws) + 1, dtype=np.int64)
        np.cumsum([len(raw) for raw in raws], out=offsets[1:])
        return pa.LargeStringArray.from_buffers(
            len(raws), pa.py_buffer(offsets), pa.py_buffer(b"".join(raws))
        )

    def _build(self) -> None:
        np = self._np
        offsets = self._starts
        starts, ends = offsets[:-1], offsets[1:]
        lengths = ends - starts
        pad = np.zeros(len(self._blob) + 16, dtype=np.uint8)  # 8 bytes either side: every window exists
        pad[8 : 8 + len(self._blob)] = self._blob
        windows = np.lib.stride_tricks.sliding_window_view(pad, 8)
        last = np.ascontiguousarray(windows[ends]).view("<u8").ravel()  # the 8 bytes ending each string
        first = np.ascontiguousarray(windows[starts + 8]).view("<u8").ravel()  # the 8 starting it
        short = np.minimum(lengths, 8)
        last &= _last_masks(np)[short]  # bytes before a short string are not its own
        first &= _first_masks(np)[short]  # nor are those after it
        a, b, c = (np.uint64(m) for m in _MIX)
        signatures = last * a + first * b + lengths.astype(np.uint64) * c  # wraps: modulo 2**64
        order = np.argsort(signatures)
        self._signatures = array("Q", signatures[order].astype("=u8").tobytes())
        self._order = array("q", order.astype("=i8").tobytes())
        self._starts = array("q", offsets.astype("=i8").tobytes())
        self._blob = self._blob.tobytes()  # compared byte for byte against candidates


def _last_masks(np: Any) -> Any:
    """Per string length 0..8: the bits of an 8-byte window ending a string that are the string's."""
    return np.array([_M64 ^ ((1 << (8 * (8 - k))) - 1) if k < 8 else _M64 for k in range(9)], dtype=np.uint64)


def _first_masks(np: Any) -> Any:
    """Per string length 0..8: the bits of an 8-byte window starting a string that are the string's."""
    return np.array([(1 << (8 * k)) - 1 if k < 8 else _M64 for k in range(9)], dtype=np.uint64)


class _IntFinder:
    """A column of 64-bit ints, searched as packed bytes."""

    __slots__ = ("_body",)

    @classmethod
    def of(cls, data: bytes | memoryview, count: int) -> _IntFinder | None:
        head = bytes(memoryview(data)[:1])
        if head != b"\x00":
            return None  # ints beyond 64 bits are framed one by one
        body = bytes(memoryview(data)[1:])
        if len(body) != 8 * count:
            raise SerializationError(f"malformed int column: {len(body)} bytes for {count} ints")
        if sys.byteorder != "little":  # pragma: no cover - no big-endian CI
            return None
        return cls(body)

    def __init__(self, body: bytes) -> None:
        self._body = body

    def __call__(self, value: Any) -> int:
        try:
            packed = _INT64(value)  # as the serializer packs it: ints and __index__ objects, never floats
        except (struct.error, TypeError):
            return -1
        locate = self._body.find
        pos = locate(packed)
        while pos > 0 and pos % 8:  # a match across two values: look further
            pos = locate(packed, pos + 1)
        return -1 if pos < 0 else pos // 8

    def many(self, values: Sequence[Any]) -> list[int]:
        """The position of each of ``values``: one pass of numpy's ``isin`` (where loaded) for all."""
        np: Any = sys.modules.get("numpy")
        if not hasattr(np, "isin") or len(values) < 2:
            return [self(value) for value in values]
        packed: list[bytes | None] = []
        for value in values:
            try:
                packed.append(_INT64(value))  # the bytes __call__ would search for
            except (struct.error, TypeError):
                packed.append(None)
        asked = np.frombuffer(b"".join(p for p in packed if p is not None), dtype="<i8")
        column = np.frombuffer(self._body, dtype="<i8")
        at = np.flatnonzero(np.isin(column, asked))
        found = {column[i].tobytes(): i for i in at.tolist()}  # distinct values: one position each
        return [-1 if p is None else found.get(p, -1) for p in packed]


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
