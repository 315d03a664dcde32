"""Serializers: how keys, namespaces and state values become bytes.

A serializer has a stable identity (its :meth:`~TypeSerializer.config`), written
into every snapshot; restoring with a serializer whose config differs raises
:class:`~statekit.errors.IncompatibleSerializerError` before any state changes.

Besides one value at a time (``serialize``/``deserialize``), every serializer
encodes a whole column of values at once (``encode_column``/``decode_column``).
Snapshots are written column-wise per key group, which lets the primitive
serializers hand the work to C (:mod:`array`, ``str.join``) instead of looping in
Python.
"""

from __future__ import annotations

import dataclasses
import io
import operator
import pickle
import struct
import sys
import types
import typing
from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any, ClassVar

from .._errors import IncompatibleSerializerError, SerializationError

__all__ = [
    "BoolSerializer",
    "BytesSerializer",
    "DataclassSerializer",
    "DictSerializer",
    "FloatSerializer",
    "IntSerializer",
    "ListSerializer",
    "NullableSerializer",
    "PickleSerializer",
    "SerializerConfig",
    "StrSerializer",
    "TupleSerializer",
    "TypeSerializer",
    "VarTupleSerializer",
    "describe_serializer",
    "rebuild_serializer",
    "serializer_for",
    "serializer_from_config",
]

SerializerConfig = dict[str, Any]
"""The JSON-able identity of a serializer, as stored in snapshots."""

_LITTLE = sys.byteorder == "little"
_U32 = struct.Struct("<I")


def _le(arr: array[Any]) -> array[Any]:
    # Snapshots are little-endian whatever the machine.
    if not _LITTLE:
        arr.byteswap()
    return arr


def pack_parts(parts: Sequence[bytes | bytearray | memoryview]) -> bytes:
    """Frame byte strings as ``u32 count, u32 len * count, payloads``."""
    lengths = _le(array("I", [len(p) for p in parts]))
    return b"".join([_U32.pack(len(parts)), lengths.tobytes(), *parts])


def unpack_parts(data: bytes | memoryview) -> list[memoryview]:
    """The inverse of :func:`pack_parts`; slices are zero-copy views."""
    mv = memoryview(data)
    try:
        (n,) = _U32.unpack_from(mv, 0)
        lengths = array("I")
        lengths.frombytes(mv[4 : 4 + 4 * n])
        _le(lengths)
    except (struct.error, ValueError) as e:
        raise SerializationError(f"malformed framed bytes: {e}") from None
    out = []
    pos = 4 + 4 * n
    for length in lengths:
        out.append(mv[pos : pos + length])
        pos += length
    if pos != len(mv):
        raise SerializationError(f"malformed framed bytes: {len(mv) - pos} bytes left over")
    return out


def _frames(data: bytes | memoryview, n: int, what: str) -> list[memoryview]:
    """Exactly ``n`` framed parts, or SerializationError."""
    parts = unpack_parts(data)
    if len(parts) != n:
        raise SerializationError(f"malformed {what} column: {len(parts)} parts, expected {n}")
    return parts


def _array(typecode: str, data: bytes | memoryview, what: str) -> array[Any]:
    """A little-endian array from bytes, or SerializationError."""
    arr = array(typecode)
    try:
        arr.frombytes(data)
    except ValueError as e:
        raise SerializationError(f"malformed {what} column: {e}") from None
    return _le(arr)


#: Columns of at least this many strings are split by Arrow where it is loaded (:func:`_ascii_strings`).
_COLUMNAR_MIN = 256


def _ascii_offsets(np: Any, lengths: Any, size: int) -> Any:
    """The ``len + 1`` int64 offsets (numpy) of an ASCII str column's strings, from their lengths.

    ``lengths`` is the column's little-endian u32 lengths (bytes or an array);
    ``size`` its text's bytes.

    Raises:
        SerializationError: If the lengths do not add up to the text.
    """
    counts = np.frombuffer(lengths, dtype="<u4")
    if int(counts.sum(dtype=np.uint64)) != size:  # exact: a u64 sum of u32s cannot wrap
        raise SerializationError("malformed str column: lengths do not add up to the text")
    offsets = np.empty(len(counts) + 1, dtype=np.int64)
    offsets[0] = 0
    if size < 1 << 32:
        # Every partial sum is at most ``size``, so u32 sums do not wrap; numpy sums in the
        # input's own type about 2.5 times faster than into int64 (a cast per element).
        offsets[1:] = np.cumsum(counts, dtype=np.uint32)
    else:
        np.cumsum(counts, dtype=np.int64, out=offsets[1:])
    return offsets


def _ascii_strings(lengths: array[Any], blob: memoryview, size: int) -> list[str] | None:
    """The strings of an ASCII column (``lengths`` characters each, ``blob`` of ``size`` bytes), split in C.

    By Arrow (a large-string array over ``blob``, offsets summed by numpy) when
    this process has imported both already (a Spark worker has): about 2.5 times
    faster than slicing in Python, which matters to a restore that decodes
    millions of keys. None (the caller slices) when they are not loaded: they
    are never imported for this. ASCII only: there a character is one byte, so
    character lengths are byte offsets.

    Raises:
        SerializationError: If the lengths do not add up to the text.
    """
    pa: Any = sys.modules.get("pyarrow")
    np: Any = sys.modules.get("numpy")
    large = getattr(pa, "LargeStringArray", None)
    if large is None or not hasattr(np, "cumsum"):
        return None
    offsets = _ascii_offsets(np, lengths, size)
    strings: list[str] = large.from_buffers(
        len(lengths), pa.py_buffer(offsets), pa.py_buffer(blob)
    ).to_pylist()
    return strings


class TypeSerializer(ABC):
    """Turns values of one type into bytes and back, one value or a column at a time.

    Subclass it to add a serializer; ``serialize``, ``deserialize`` and ``config``
    are required, the column methods have per-value defaults. Example::

        class PointSerializer(TypeSerializer):
            immutable = True

            def serialize(self, value: Point) -> bytes:
                return struct.pack("<dd", value.x, value.y)

            def deserialize(self, data: bytes) -> Point:
                return Point(*struct.unpack("<dd", data))

            def config(self) -> SerializerConfig:
                return {"id": "myapp.point", "v": 1}
    """

    immutable: ClassVar[bool] = False
    """True when values never change in place, so snapshots may share them."""

    @abstractmethod
    def serialize(self, value: Any) -> bytes:
        """The bytes of one value."""

    @abstractmethod
    def deserialize(self, data: bytes | memoryview) -> Any:
        """The value of bytes made by :meth:`serialize`."""

    @abstractmethod
    def config(self) -> SerializerConfig:
        """The identity written into snapshots: ``{"id": ..., "v": ..., ...}``."""

    def encode_column(self, values: Sequence[Any]) -> bytes:
        """The bytes of many values; the count is stored by the caller."""
        ser = self.serialize
        try:
            return pack_parts([ser(v) for v in values])
        except SerializationError:
            raise
        except Exception as e:
            raise SerializationError(f"{self.describe()} cannot serialize a value: {e}") from e

    def decode_column(self, data: bytes | memoryview, count: int) -> list[Any]:
        """The ``count`` values of bytes made by :meth:`encode_column`."""
        parts = unpack_parts(data)
        if len(parts) != count:
            raise SerializationError(f"expected {count} values, found {len(parts)}")
        des = self.deserialize
        return [des(p) for p in parts]

    def copy(self, value: Any) -> Any:
        """A deep copy of ``value`` (the value itself when immutable)."""
        if self.immutable:
            return value
        return self.deserialize(self.serialize(value))

    def describe(self) -> str:
        """A short human-readable name, e.g. ``list<int>``."""
        return describe_serializer(self.config())

    def check_compatibility(self, stored: SerializerConfig, what: str) -> None:
        """Raise :class:`IncompatibleSerializerError` unless ``stored`` can be read.

        The default accepts exactly the same config. ``what`` names the state or
        key being checked, for the error message.
        """
        if stored != self.config():
            raise IncompatibleSerializerError(
                f"{what} was written with serializer {describe_serializer(stored)} but is declared with "
                f"{self.describe()}; declare the original type, or migrate the state with a "
                "savepoint written by a job that reads the old type"
            )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TypeSerializer) and self.config() == other.config()

    def __hash__(self) -> int:
        return hash(repr(self.config()))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


def describe_serializer(cfg: SerializerConfig) -> str:
    """A serializer config as messages and tables show it: ``tuple<str,int>``, ``dataclass<Point>``."""
    ident = cfg.get("id", "?")
    args = cfg.get("args")
    if ident == "dataclass":
        return f"dataclass<{cfg.get('class')}>"
    if args:
        return f"{ident}<{','.join(describe_serializer(a) for a in args)}>"
    return str(ident)


_INT64 = struct.Struct("<q").pack


class IntSerializer(TypeSerializer):
    """Python ints of any size: 8 bytes little-endian when they fit in 64 bits."""

    immutable = True
    _MIN = -(1 << 63)
    _MAX = (1 << 63) - 1

    def serialize(self, value: Any) -> bytes:
        try:
            return _INT64(value)  # 64-bit ints (and __index__ objects; never floats) in C
        except struct.error:
            pass
        try:
            # operator.index refuses floats: 3.7 must not silently become key 3.
            v = operator.index(value)
            if self._MIN <= v <= self._MAX:
                return v.to_bytes(8, "little", signed=True)
            return v.to_bytes(max(9, (v.bit_length() + 8) // 8), "little", signed=True)
        except (TypeError, ValueError) as e:
            raise SerializationError(f"int serializer cannot serialize {value!r}: {e}") from None

    def deserialize(self, data: bytes | memoryview) -> int:
        return int.from_bytes(data, "little", signed=True)

    def encode_column(self, values: Sequence[Any]) -> bytes:
        try:
            return b"\x00" + _le(array("q", values)).tobytes()
        except OverflowError:
            return b"\x01" + super().encode_column(values)
        except TypeError as e:
            raise SerializationError(f"int serializer cannot serialize a value: {e}") from None

    def decode_column(self, data: bytes | memoryview, count: int) -> list[Any]:
        mv = memoryview(data)
        if mv[:1].tobytes() == b"\x01":
            return super().decode_column(mv[1:], count)
        if mv[:1].tobytes() != b"\x00":
            raise SerializationError("malformed int column: unknown mode byte")
        arr = _array("q", mv[1:], "int")
        if len(arr) != count:
            raise SerializationError(f"expected {count} ints, found {len(arr)}")
        return arr.tolist()

    def config(self) -> SerializerConfig:
        return {"id": "int", "v": 1}


class FloatSerializer(TypeSerializer):
    """Python floats as IEEE-754 doubles."""

    immutable = True
    _D = struct.Struct("<d")

    def serialize(self, value: Any) -> bytes:
        try:
            return self._D.pack(value)
        except struct.error as e:
            raise SerializationError(f"float serializer cannot serialize {value!r}: {e}") from None

    def deserialize(self, data: bytes | memoryview) -> float:
        return float(self._D.unpack(data)[0])

    def encode_column(self, values: Sequence[Any]) -> bytes:
        try:
            return _le(array("d", values)).tobytes()
        except TypeError as e:
            raise SerializationError(f"float serializer cannot serialize a value: {e}") from None

    def decode_column(self, data: bytes | memoryview, count: int) -> list[Any]:
        arr = _array("d", data, "float")
        if len(arr) != count:
            raise SerializationError(f"expected {count} floats, found {len(arr)}")
        return arr.tolist()

    def config(self) -> SerializerConfig:
        return {"id": "float", "v": 1}


class BoolSerializer(TypeSerializer):
    """``True``/``False`` as one byte."""

    immutable = True

    def serialize(self, value: Any) -> bytes:
        return b"\x01" if value else b"\x00"

    def deserialize(self, data: bytes | memoryview) -> bool:
        b = bytes(data)
        if b not in (b"\x00", b"\x01"):
            raise SerializationError(f"malformed bool: {b!r}")
        return b == b"\x01"

    def encode_column(self, values: Sequence[Any]) -> bytes:
        return bytes(1 if v else 0 for v in values)

    def decode_column(self, data: bytes | memoryview, count: int) -> list[Any]:
        if len(data) != count:
            raise SerializationError(f"expected {count} bools, found {len(data)}")
        return [b != 0 for b in bytes(data)]

    def config(self) -> SerializerConfig:
        return {"id": "bool", "v": 1}


class StrSerializer(TypeSerializer):
    """Python strings as UTF-8 (lone surrogates kept via ``surrogatepass``)."""

    immutable = True

    def serialize(self, value: Any) -> bytes:
        try:
            return value.encode("utf-8", "surrogatepass")  # type: ignore[no-any-return]
        except AttributeError:
            raise SerializationError(
                f"str serializer cannot serialize {type(value).__name__} value {value!r}"
            ) from None

    def deserialize(self, data: bytes | memoryview) -> str:
        return str(data, "utf-8", "surrogatepass")

    def encode_column(self, values: Sequence[Any]) -> bytes:
        # Character lengths + one joined UTF-8 blob: both steps run in C.
        try:
            joined = "".join(values)
        except TypeError as e:
            raise SerializationError(f"str serializer cannot serialize a value: {e}") from None
        lengths = _le(array("I", map(len, values)))
        return pack_parts([lengths.tobytes(), joined.encode("utf-8", "surrogatepass")])

    def decode_column(self, data: bytes | memoryview, count: int) -> list[Any]:
        raw_lengths, blob = _frames(data, 2, "str")
        lengths = _array("I", raw_lengths, "str")
        if len(lengths) != count:
            raise SerializationError(f"expected {count} strings, found {len(lengths)}")
        try:
            text = str(blob, "utf-8", "surrogatepass")
        except UnicodeDecodeError as e:
            raise SerializationError(f"malformed str column: {e}") from None
        if count >= _COLUMNAR_MIN and text.isascii():
            strings = _ascii_strings(lengths, blob, len(text))
            if strings is not None:
                return strings
        ends = list(accumulate(lengths))
        if (ends[-1] if ends else 0) != len(text):
            raise SerializationError("malformed str column: lengths do not add up to the text")
        return [text[e - n : e] for e, n in zip(ends, lengths)]

    def config(self) -> SerializerConfig:
        return {"id": "str", "v": 1}


class BytesSerializer(TypeSerializer):
    """``bytes`` as themselves."""

    immutable = True

    def serialize(self, value: Any) -> bytes:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise SerializationError(f"bytes serializer cannot serialize {type(value).__name__}")
        return bytes(value)

    def deserialize(self, data: bytes | memoryview) -> bytes:
        return bytes(data)

    def config(self) -> SerializerConfig:
        return {"id": "bytes", "v": 1}


class NullableSerializer(TypeSerializer):
    """``Optional[T]``: ``None`` or a value of the inner serializer."""

    def __init__(self, inner: TypeSerializer) -> None:
        self.inner = inner
        self.immutable = inner.immutable  # type: ignore[misc]

    def serialize(self, value: Any) -> bytes:
        return b"\x00" if value is None else b"\x01" + self.inner.serialize(value)

    def deserialize(self, data: bytes | memoryview) -> Any:
        mv = memoryview(data)
        flag = mv[:1].tobytes()
        if flag == b"\x00" and len(mv) == 1:
            return None
        if flag != b"\x01":
            raise SerializationError("malformed optional value")
        return self.inner.deserialize(mv[1:])

    def encode_column(self, values: Sequence[Any]) -> bytes:
        mask = bytes(0 if v is None else 1 for v in values)
        present = [v for v in values if v is not None]
        return pack_parts([mask, self.inner.encode_column(present)])

    def decode_column(self, data: bytes | memoryview, count: int) -> list[Any]:
        mask, inner = _frames(data, 2, "optional")
        flags = bytes(mask)
        if len(flags) != count or flags.strip(b"\x00\x01"):
            raise SerializationError(f"malformed optional column: expected {count} mask bytes of 0/1")
        present = iter(self.inner.decode_column(inner, sum(flags)))
        return [next(present) if m else None for m in flags]

    def copy(self, value: Any) -> Any:
        return None if value is None else self.inner.copy(value)

    def config(self) -> SerializerConfig:
        return {"id": "optional", "v": 1, "args": [self.inner.config()]}


def _flatten_column(elem: TypeSerializer, groups: Sequence[Sequence[Any]]) -> bytes:
    counts = _le(array("I", map(len, groups)))
    flat = [x for g in groups for x in g]
    return pack_parts([counts.tobytes(), elem.encode_column(flat)])


def _unflatten_column(
    elem: TypeSerializer, data: bytes | memoryview, count: int
) -> tuple[array[int], list[Any]]:
    raw_counts, payload = _frames(data, 2, "collection")
    counts = _array("I", raw_counts, "collection")
    if len(counts) != count:
        raise SerializationError(f"expected {count} collections, found {len(counts)}")
    return counts, elem.decode_column(payload, sum(counts))


class ListSerializer(TypeSerializer):
    """``list[T]``."""

    immutable = False

    def __init__(self, element: TypeSerializer) -> None:
        self.element = element

    def serialize(self, value: Any) -> bytes:
        return _flatten_column(self.element, [value])

    def deserialize(self, data: bytes | memoryview) -> list[Any]:
        return self.decode_column(data, 1)[0]  # type: ignore[no-any-return]

    def encode_column(self, values: Sequence[Any]) -> bytes:
        return _flatten_column(self.element, values)

    def decode_column(self, data: bytes | memoryview, count: int) -> list[Any]:
        counts, flat = _unflatten_column(self.element, data, count)
        out: list[Any] = []
        pos = 0
        for n in counts:
            out.append(flat[pos : pos + n])
            pos += n
        return out

    def copy(self, value: Any) -> Any:
        if self.element.immutable:
            return list(value)
        c = self.element.copy
        return [c(v) for v in value]

    def config(self) -> SerializerConfig:
        return {"id": "list", "v": 1, "args": [self.element.config()]}


class VarTupleSerializer(ListSerializer):
    """``tuple[T, ...]``: a list serializer that returns tuples."""

    def __init__(self, element: TypeSerializer) -> None:
        super().__init__(element)
        self.immutable = element.immutable  # type: ignore[misc]

    def decode_column(self, data: bytes | memoryview, count: int) -> list[Any]:
        return [tuple(v) for v in super().decode_column(data, count)]

    def copy(self, value: Any) -> Any:
        return value if self.immutable else tuple(super().copy(value))

    def config(self) -> SerializerConfig:
        return {"id": "tuple...", "v": 1, "args": [self.element.config()]}


class DictSerializer(TypeSerializer):
    """``dict[K, V]``; insertion order is kept."""

    immutable = False

    def __init__(self, key: TypeSerializer, value: TypeSerializer) -> None:
        self.key = key
        self.value = value

    def serialize(self, value: Any) -> bytes:
        return self.encode_column([value])

    def deserialize(self, data: bytes | memoryview) -> dict[Any, Any]:
        return self.decode_column(data, 1)[0]  # type: ignore[no-any-return]

    def encode_column(self, values: Sequence[Any]) -> bytes:
        counts = _le(array("I", map(len, values)))
        keys = [k for d in values for k in d]
        vals = [v for d in values for v in d.values()]
        return pack_parts([counts.tobytes(), self.key.encode_column(keys), self.value.encode_column(vals)])

    def decode_column(self, data: bytes | memoryview, count: int) -> list[Any]:
        raw_counts, raw_keys, raw_vals = _frames(data, 3, "dict")
        counts = _array("I", raw_counts, "dict")
        if len(counts) != count:
            raise SerializationError(f"expected {count} dicts, found {len(counts)}")
        total = sum(counts)
        keys = self.key.decode_column(raw_keys, total)
        vals = self.value.decode_column(raw_vals, total)
        out: list[Any] = []
        pos = 0
        for n in counts:
            out.append(dict(zip(keys[pos : pos + n], vals[pos : pos + n])))
            pos += n
        if len(out) != count:
            raise SerializationError(f"expected {count} dicts, found {len(out)}")
        return out

    def copy(self, value: Any) -> Any:
        if self.key.immutable and self.value.immutable:
            return dict(value)
        ck, cv = self.key.copy, self.value.copy
        return {ck(k): cv(v) for k, v in value.items()}

    def config(self) -> SerializerConfig:
        return {"id": "dict", "v": 1, "args": [self.key.config(), self.value.config()]}


class TupleSerializer(TypeSerializer):
    """Fixed-shape ``tuple[A, B, ...]``, stored column per field."""

    def __init__(self, fields: Sequence[TypeSerializer]) -> None:
        self.fields = tuple(fields)
        self.immutable = all(f.immutable for f in self.fields)  # type: ignore[misc]

    def _rows(self, data: bytes | memoryview, count: int) -> list[list[Any]]:
        parts = _frames(data, len(self.fields), "tuple")
        return [f.decode_column(p, count) for f, p in zip(self.fields, parts)]

    def _check(self, v: Any) -> Any:
        if len(v) != len(self.fields):
            raise SerializationError(
                f"{self.describe()} expects {len(self.fields)} fields, got {len(v)}: {v!r}"
            )
        return v

    def serialize(self, value: Any) -> bytes:
        return self.encode_column([value])

    def deserialize(self, data: bytes | memoryview) -> Any:
        return self.decode_column(data, 1)[0]

    def encode_column(self, values: Sequence[Any]) -> bytes:
        rows = [self._check(v) for v in values]
        return pack_parts([f.encode_column([r[i] for r in rows]) for i, f in enumerate(self.fields)])

    def decode_column(self, data: bytes | memoryview, count: int) -> list[Any]:
        rows = self._rows(data, count)
        return list(zip(*rows)) if rows else [()] * count

    def copy(self, value: Any) -> Any:
        return value if self.immutable else tuple(f.copy(v) for f, v in zip(self.fields, value))

    def config(self) -> SerializerConfig:
        return {"id": "tuple", "v": 1, "args": [f.config() for f in self.fields]}


class DataclassSerializer(TypeSerializer):
    """A dataclass, field by field; its identity names the class and each field's type.

    Adding, removing, renaming or retyping a field changes the identity; a
    restore then resolves the old identity against the new class
    (:func:`statekit.serialization._evolution.resolve_schema`): fields are
    matched by name (or by the former names a field declares in its metadata
    under ``"statekit.former_names"``), and the state is migrated or refused
    before anything changes.
    """

    def __init__(self, cls: type[Any]) -> None:
        if not dataclasses.is_dataclass(cls):
            raise SerializationError(f"{cls!r} is not a dataclass")
        hints = typing.get_type_hints(cls)
        self.cls = cls
        self.names = [f.name for f in dataclasses.fields(cls) if f.init]
        self._tuple = TupleSerializer([serializer_for(hints[n]) for n in self.names])
        frozen = bool(cls.__dataclass_params__.frozen)  # type: ignore[attr-defined]
        self.immutable = frozen and self._tuple.immutable  # type: ignore[misc]

    @property
    def field_serializers(self) -> tuple[TypeSerializer, ...]:
        """The serializers of the fields in :attr:`names`, in that order."""
        return self._tuple.fields

    def _row(self, v: Any) -> tuple[Any, ...]:
        if not isinstance(v, self.cls):
            raise SerializationError(f"{self.describe()} cannot serialize {type(v).__name__} value {v!r}")
        return tuple(getattr(v, n) for n in self.names)

    def serialize(self, value: Any) -> bytes:
        return self.encode_column([value])

    def deserialize(self, data: bytes | memoryview) -> Any:
        return self.decode_column(data, 1)[0]

    def encode_column(self, values: Sequence[Any]) -> bytes:
        return self._tuple.encode_column([self._row(v) for v in values])

    def decode_column(self, data: bytes | memoryview, count: int) -> list[Any]:
        cls = self.cls
        return [cls(*row) for row in self._tuple.decode_column(data, count)]

    def copy(self, value: Any) -> Any:
        if self.immutable:
            return value
        return self.cls(*self._tuple.copy(self._row(value)))

    def config(self) -> SerializerConfig:
        cfg: SerializerConfig = {
            "id": "dataclass",
            "v": 1,
            "class": f"{self.cls.__module__}:{self.cls.__qualname__}",
            "fields": [[n, f.config()] for n, f in zip(self.names, self._tuple.fields)],
        }
        # The former names fields declare travel with the stored schema, so a rename can be
        # undone: code rolled back to the old name finds its values (see _evolution). Absent when
        # no field declares any (the config of every dataclass before renames is unchanged).
        formers = {
            f.name: list(names)
            for f in dataclasses.fields(self.cls)
            if f.init and (names := _former_names(f))
        }
        if formers:
            cfg["former_names"] = formers
        return cfg


def _without_former_names(cfg: Any) -> Any:
    """A config without the former names its dataclasses' fields declare."""
    if isinstance(cfg, dict):
        return {
            k: _without_former_names(v)
            for k, v in cfg.items()
            if not (k == "former_names" and cfg.get("id") == "dataclass")
        }
    if isinstance(cfg, list):
        return [_without_former_names(v) for v in cfg]
    return cfg


def _former_names(f: dataclasses.Field[Any]) -> tuple[str, ...]:
    """A field's ``statekit.former_names`` (checked by ``_evolution.former_names`` where they are used)."""
    raw = f.metadata.get("statekit.former_names", ())
    names = (raw,) if isinstance(raw, str) else tuple(raw) if isinstance(raw, (list, tuple)) else ()
    return tuple(n for n in names if isinstance(n, str) and n and n != f.name)


class PickleSerializer(TypeSerializer):
    """Any picklable value, with :mod:`pickle` protocol 5. Only used when asked for.

    Pickled bytes depend on the classes' import paths and on their pickling
    behaviour, so this serializer gives no evolution guarantees; prefer typed
    serializers for long-lived state.
    """

    def serialize(self, value: Any) -> bytes:
        try:
            return pickle.dumps(value, protocol=5)
        except Exception as e:
            raise SerializationError(f"cannot pickle {type(value).__name__}: {e}") from e

    def deserialize(self, data: bytes | memoryview) -> Any:
        buf = io.BytesIO(data)
        try:
            value = pickle.Unpickler(buf).load()
        except Exception as e:  # noqa: BLE001 - unpickling raises many kinds
            raise SerializationError(f"malformed pickle: {e}") from None
        if buf.tell() != len(buf.getbuffer()):
            raise SerializationError("malformed pickle: bytes left after the value")
        return value

    def encode_column(self, values: Sequence[Any]) -> bytes:
        # One pickle of the whole list is far faster than one per value.
        return self.serialize(list(values))

    def decode_column(self, data: bytes | memoryview, count: int) -> list[Any]:
        out = self.deserialize(data)
        if not isinstance(out, list) or len(out) != count:
            raise SerializationError(f"expected a pickled list of {count} values")
        return out

    def copy(self, value: Any) -> Any:
        return pickle.loads(pickle.dumps(value, protocol=5))

    def config(self) -> SerializerConfig:
        return {"id": "pickle", "v": 1}


_PRIMITIVES: dict[Any, type[TypeSerializer]] = {
    int: IntSerializer,
    float: FloatSerializer,
    bool: BoolSerializer,
    str: StrSerializer,
    bytes: BytesSerializer,
}


def serializer_for(tp: Any) -> TypeSerializer:
    """The serializer for a type annotation, or ``tp`` itself if it is a serializer.

    Supported: ``int``, ``float``, ``bool``, ``str``, ``bytes``, ``Optional[T]``
    (``T | None``), ``tuple[A, B]``, ``tuple[T, ...]``, ``list[T]``,
    ``dict[K, V]`` and dataclasses of those. Anything else needs an explicit
    serializer, e.g. ``PickleSerializer()``.

    >>> serializer_for(dict[str, list[int]]).describe()
    'dict<str,list<int>>'
    """
    if isinstance(tp, TypeSerializer):
        return tp
    prim = _PRIMITIVES.get(tp)
    if prim is not None:
        return prim()
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return NullableSerializer(serializer_for(rest[0]))
    elif origin is list and len(args) == 1:
        return ListSerializer(serializer_for(args[0]))
    elif origin is dict and len(args) == 2:
        return DictSerializer(serializer_for(args[0]), serializer_for(args[1]))
    elif origin is tuple and args:
        if len(args) == 2 and args[1] is Ellipsis:
            return VarTupleSerializer(serializer_for(args[0]))
        return TupleSerializer([serializer_for(a) for a in args])
    elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return DataclassSerializer(tp)
    raise SerializationError(
        f"no serializer is chosen for type {tp!r}: use int, float, bool, str, bytes, Optional, "
        "tuple, list, dict or a dataclass of those, or pass serializer=PickleSerializer() "
        "(or your own TypeSerializer) explicitly"
    )


_BY_ID: dict[str, type[TypeSerializer]] = {
    "int": IntSerializer,
    "float": FloatSerializer,
    "bool": BoolSerializer,
    "str": StrSerializer,
    "bytes": BytesSerializer,
    "pickle": PickleSerializer,
}


def rebuild_serializer(
    cfg: SerializerConfig, dataclass: Callable[[SerializerConfig], TypeSerializer]
) -> TypeSerializer:
    """The built-in serializer a config describes, with ``dataclass(cfg)`` for each dataclass in it.

    :func:`serializer_from_config` imports the classes; schema evolution
    passes a builder that reads a dataclass's bytes without its class.

    Raises:
        SerializationError: For an id that is not built in.
    """
    ident = cfg.get("id")
    if ident == "dataclass":
        return dataclass(cfg)
    args = [rebuild_serializer(a, dataclass) for a in cfg.get("args", [])]
    if ident in _BY_ID:
        return _BY_ID[ident]()
    if ident == "optional":
        return NullableSerializer(args[0])
    if ident == "list":
        return ListSerializer(args[0])
    if ident == "tuple...":
        return VarTupleSerializer(args[0])
    if ident == "dict":
        return DictSerializer(args[0], args[1])
    if ident == "tuple":
        return TupleSerializer(args)
    raise SerializationError(
        f"serializer {ident!r} is not built in; it can only be read by the job that declared it"
    )


def _imported_dataclass(cfg: SerializerConfig) -> TypeSerializer:
    import importlib

    mod, _, qual = str(cfg["class"]).partition(":")
    try:
        obj: Any = importlib.import_module(mod)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise SerializationError(
            f"dataclass {cfg['class']} of a snapshot cannot be imported here: {e}"
        ) from None
    ser = DataclassSerializer(obj)
    if _without_former_names(ser.config()) != _without_former_names(cfg):  # former names move no byte
        # The class changed since the snapshot: its fields would read the old bytes wrongly.
        raise SerializationError(
            f"dataclass {cfg['class']} has changed since the snapshot was written: the snapshot's fields are "
            f"{[n for n, _ in cfg.get('fields', [])]}, the class's {ser.names} (or their types differ); "
            "read it through a job that declares the state (its type is migrated on restore), or with "
            "statekit.state_processor, which reads fields without the class"
        )
    return ser


def serializer_from_config(cfg: SerializerConfig) -> TypeSerializer:
    """Rebuild a serializer from a snapshot's config, when it is self-describing.

    Used by tools that read snapshots without the job (the CLI, conversions).
    Dataclasses are rebuilt from their import path; a class that cannot be
    imported, or whose fields are no longer the snapshot's, and unknown ids
    raise :class:`SerializationError`.
    """
    return rebuild_serializer(cfg, _imported_dataclass)
