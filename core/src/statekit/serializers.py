"""Every built-in serializer, for declaring state types explicitly."""

from __future__ import annotations

from .serialization._serializers import (
    BoolSerializer,
    BytesSerializer,
    DataclassSerializer,
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
    serializer_for,
    serializer_from_config,
)

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
    "serializer_for",
    "serializer_from_config",
]
