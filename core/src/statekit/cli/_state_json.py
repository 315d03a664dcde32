"""Arrow values as JSON, the same way everywhere (``show``, ``get``, ``export --format json``).

Bytes are base64 strings, timestamps ISO 8601 strings, structs (tuples,
dataclasses) objects, maps objects when their keys are strings and lists of
``[key, value]`` pairs otherwise.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

__all__ = ["Convert", "dumps", "is_binary", "json_converter", "json_rows", "key_json", "same"]

Convert = Callable[[Any], Any]


def json_converter(typ: pa.DataType) -> Convert | None:
    """Turns a :meth:`pyarrow.Array.to_pylist` value of ``typ`` into JSON; None when it already is."""
    t = pa.types
    if is_binary(typ):
        return lambda v: None if v is None else base64.b64encode(v).decode("ascii")
    if t.is_timestamp(typ) or t.is_date(typ) or t.is_time(typ):
        return lambda v: None if v is None else v.isoformat()
    if t.is_map(typ):
        kc = json_converter(typ.key_type)
        vc = json_converter(typ.item_type)
        k: Convert = kc or same
        v: Convert = vc or same
        if t.is_string(typ.key_type) or t.is_large_string(typ.key_type):
            return lambda m: None if m is None else {key: v(x) for key, x in m}
        return lambda m: None if m is None else [[k(key), v(x)] for key, x in m]
    if t.is_list(typ) or t.is_large_list(typ) or t.is_fixed_size_list(typ):
        ec = json_converter(typ.value_type)
        if ec is None:
            return None
        conv = ec
        return lambda xs: None if xs is None else [conv(x) for x in xs]
    if t.is_struct(typ):
        convs = [(f.name, json_converter(f.type)) for f in typ]
        if all(c is None for _, c in convs):
            return None
        return lambda d: None if d is None else {n: (d[n] if c is None else c(d[n])) for n, c in convs}
    return None


def is_binary(typ: pa.DataType) -> bool:
    t = pa.types
    return bool(t.is_binary(typ) or t.is_large_binary(typ) or t.is_fixed_size_binary(typ))


def same(v: Any) -> Any:
    return v


def json_rows(batch: pa.RecordBatch | pa.Table) -> list[dict[str, Any]]:
    convs = [(f.name, c) for f in batch.schema if (c := json_converter(f.type)) is not None]
    rows: list[dict[str, Any]] = batch.to_pylist()
    for row in rows:
        for name, conv in convs:
            row[name] = conv(row[name])
    return rows


def dumps(value: Any) -> str:
    # default=str: anything Arrow gives that JSON has no type for (decimals, durations) as text
    return json.dumps(value, ensure_ascii=False, default=str)


def key_json(key: Any) -> Any:
    if isinstance(key, bytes):
        return base64.b64encode(key).decode("ascii")
    if isinstance(key, tuple):
        return [key_json(k) for k in key]
    return key
