"""Serializer configs as Arrow types, and values converted both ways.

A snapshot's serializer configs describe its values, so a state reads as Arrow
without the classes of the job that wrote it: dataclasses are decoded as
tuples of their fields (their column encoding is the same) and become structs
named after the fields; tuples become structs ``f0, f1, ...``; dicts become
maps; ``pickle`` and serializers that are not built in become binary columns
of each value's serialized bytes.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from .._errors import SerializationError
from ..serialization._serializers import (
    BoolSerializer,
    BytesSerializer,
    DictSerializer,
    FloatSerializer,
    IntSerializer,
    ListSerializer,
    NullableSerializer,
    PickleSerializer,
    SerializerConfig,
    StrSerializer,
    TupleSerializer,
    TypeSerializer,
    VarTupleSerializer,
)

__all__ = ["ArrowColumn", "arrow_column", "arrow_type", "custom_for"]

Convert = Callable[[Any], Any] | None
"""A per-value conversion; None when values pass unchanged."""

_PRIMITIVE: dict[str, tuple[pa.DataType, type[TypeSerializer]]] = {
    "int": (pa.int64(), IntSerializer),
    "float": (pa.float64(), FloatSerializer),
    "bool": (pa.bool_(), BoolSerializer),
    "str": (pa.string(), StrSerializer),
    "bytes": (pa.binary(), BytesSerializer),
}

#: Field metadata naming how a binary column's values were serialized.
ENCODING_KEY = b"statekit.encoding"


@dataclass(frozen=True)
class ArrowColumn:
    """How the values of one serializer config are decoded and shown in Arrow.

    ``serializer`` decodes and encodes the snapshot's column bytes (the
    config's own layout); ``to_arrow``/``from_arrow`` turn its values into what
    :func:`pyarrow.array` takes and :meth:`pyarrow.Array.to_pylist` gives back.
    """

    type: pa.DataType
    serializer: TypeSerializer
    to_arrow: Convert
    from_arrow: Convert
    encoding: str | None = None
    """Set for binary columns of serialized values: ``pickle``, or the serializer's id."""

    def array(self, values: Sequence[Any]) -> pa.Array:
        """The values as an Arrow array of :attr:`type`."""
        conv = self.to_arrow
        return pa.array(values if conv is None else [conv(v) for v in values], type=self.type)

    def values(self, column: pa.Array | pa.ChunkedArray) -> list[Any]:
        """Python values, as the serializer takes them, of an Arrow column."""
        conv = self.from_arrow
        py = column.to_pylist()
        return py if conv is None else [conv(v) for v in py]

    def field(self, name: str, nullable: bool = True) -> pa.Field:
        """A schema field of this column."""
        meta = {ENCODING_KEY: self.encoding.encode()} if self.encoding else None
        return pa.field(name, self.type, nullable=nullable, metadata=meta)


def arrow_column(cfg: SerializerConfig, custom: TypeSerializer | None = None) -> ArrowColumn:
    """The :class:`ArrowColumn` of serializer config ``cfg``.

    ``custom`` decodes a serializer that is not built in (its values are shown
    as binary, serialized by it).

    Raises:
        SerializationError: For a serializer that is neither built in nor given.
    """
    ident = str(cfg.get("id"))
    args: list[SerializerConfig] = list(cfg.get("args", []))
    if ident in _PRIMITIVE:
        typ, cls = _PRIMITIVE[ident]
        return ArrowColumn(typ, cls(), None, None)
    if ident == "optional":
        inner = arrow_column(args[0], custom)
        ic, fc = inner.to_arrow, inner.from_arrow
        return ArrowColumn(
            inner.type,
            NullableSerializer(inner.serializer),
            None if ic is None else (lambda v: None if v is None else ic(v)),
            None if fc is None else (lambda v: None if v is None else fc(v)),
            inner.encoding,
        )
    if ident in ("list", "tuple..."):
        el = arrow_column(args[0], custom)
        ec, ef = el.to_arrow, el.from_arrow
        as_tuple = ident == "tuple..."
        seq: TypeSerializer = VarTupleSerializer(el.serializer) if as_tuple else ListSerializer(el.serializer)
        back: Convert
        if ef is None:
            back = tuple if as_tuple else None
        else:
            back = (lambda v: tuple(ef(e) for e in v)) if as_tuple else (lambda v: [ef(e) for e in v])
        return ArrowColumn(
            pa.list_(el.field("element")),
            seq,
            None if ec is None else (lambda v: [ec(e) for e in v]),
            back,
        )
    if ident == "dict":
        k, v = arrow_column(args[0], custom), arrow_column(args[1], custom)
        kc, vc, kf, vf = k.to_arrow, v.to_arrow, k.from_arrow, v.from_arrow
        return ArrowColumn(
            pa.map_(k.type, v.field("value")),
            DictSerializer(k.serializer, v.serializer),
            lambda d: [
                (key if kc is None else kc(key), val if vc is None else vc(val)) for key, val in d.items()
            ],
            lambda pairs: {
                (key if kf is None else kf(key)): (val if vf is None else vf(val)) for key, val in pairs
            },
        )
    if ident in ("tuple", "dataclass"):
        if ident == "tuple":
            names = [f"f{i}" for i in range(len(args))]
            parts = [arrow_column(a, custom) for a in args]
        else:
            names = [str(n) for n, _ in cfg["fields"]]
            parts = [arrow_column(c, custom) for _, c in cfg["fields"]]
        to = [p.to_arrow for p in parts]
        fro = [p.from_arrow for p in parts]
        return ArrowColumn(
            pa.struct([p.field(n) for n, p in zip(names, parts)]),
            # A dataclass's column layout is its fields' tuple: no class is needed to read it.
            TupleSerializer([p.serializer for p in parts]),
            lambda t: {n: (x if c is None else c(x)) for n, c, x in zip(names, to, t)},
            lambda d: tuple(d[n] if c is None else c(d[n]) for n, c in zip(names, fro)),
        )
    if ident == "pickle":
        return ArrowColumn(
            pa.binary(), PickleSerializer(), lambda v: pickle.dumps(v, protocol=5), pickle.loads, "pickle"
        )
    if custom is not None:
        return ArrowColumn(pa.binary(), custom, custom.serialize, custom.deserialize, ident)
    raise SerializationError(
        f"serializer {ident!r} is not built in, so its values cannot be read without it; pass it as "
        f"serializers={{<state name>: <its TypeSerializer>}}"
    )


def custom_for(serializers: Mapping[str, TypeSerializer] | None, name: str) -> TypeSerializer | None:
    """The serializer the caller gave for state ``name``, if any."""
    return None if serializers is None else serializers.get(name)


def arrow_type(serializer: TypeSerializer | SerializerConfig) -> pa.DataType:
    """The Arrow type a value of ``serializer`` (or of a snapshot's serializer config) reads as.

    ``int`` is int64, ``float`` float64, ``str`` string, ``bytes`` binary,
    ``optional<T>`` a nullable ``T``, lists lists, dicts maps, tuples structs
    ``f0, f1, ...``, dataclasses structs of their fields; ``pickle`` (and a
    serializer that is not built in) binary: each value's serialized bytes.
    """
    cfg = serializer.config() if isinstance(serializer, TypeSerializer) else serializer
    custom = serializer if isinstance(serializer, TypeSerializer) else None
    return arrow_column(cfg, custom).type
