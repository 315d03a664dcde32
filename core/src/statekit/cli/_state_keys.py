"""Keys given on the command line (``get KEY``, ``--key``), parsed as the state's key serializer says.

``str``, ``int``, ``float`` and ``bytes`` (base64) as they are, anything else as
JSON, arrays becoming tuples; ``--key-type`` overrides the serializer.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from .._errors import ConfigurationError
from ..serialization._serializers import describe_serializer
from ..state_processor._arrow import arrow_column

__all__ = ["KEY_TYPES", "parse_key"]

KEY_TYPES = ("str", "int", "float", "bytes", "json")


def parse_key(text: str, key_type: str | None, key_serializer: Mapping[str, Any]) -> Any:
    """The key ``text`` stands for, as a key of ``key_serializer`` (a serializer config).

    ``key_type`` (one of ``str``, ``int``, ``float``, ``bytes``, ``json``)
    overrides what the serializer suggests.

    Raises:
        ConfigurationError: If ``text`` does not parse, or the result is no key of ``key_serializer``.
    """
    ident = str(key_serializer.get("id", "str"))
    kind = key_type or (ident if ident in KEY_TYPES else "json")
    try:
        if kind == "str":
            key: Any = text
        elif kind == "int":
            key = int(text)
        elif kind == "float":
            key = float(text)
        elif kind == "bytes":
            key = base64.b64decode(text, validate=True)
        else:
            key = _coerce(json.loads(text), key_serializer)
    except ValueError as e:  # json's and base64's errors are ValueErrors too
        raise ConfigurationError(f"key {text!r} is not a valid {kind} ({e})") from None
    if key_serializer:
        serializer = arrow_column(dict(key_serializer)).serializer
        try:
            hash(key)
            serializer.serialize(key)
        except Exception as e:  # noqa: BLE001 - any failure means "not a key of this serializer"
            raise ConfigurationError(
                f"key {text!r} read as {type(key).__name__} is no key of the state's key serializer "
                f"{describe_serializer(dict(key_serializer))} ({e}); pass another --key-type"
            ) from None
    return key


def _coerce(value: Any, cfg: Mapping[str, Any]) -> Any:
    """A JSON value as a key of serializer config ``cfg``: arrays become tuples, base64 strings bytes."""
    ident = cfg.get("id")
    args: list[Mapping[str, Any]] = list(cfg.get("args", []))
    if value is None:
        return None
    if ident == "optional":
        return _coerce(value, args[0])
    if ident == "bytes" and isinstance(value, str):
        return base64.b64decode(value, validate=True)
    if ident == "float" and isinstance(value, int):
        return float(value)
    if ident == "dataclass":
        fields = [(str(n), c) for n, c in cfg.get("fields", [])]
        if isinstance(value, dict):
            value = [value.get(n) for n, _ in fields]
        args = [c for _, c in fields]
    if isinstance(value, list):
        if ident in ("tuple", "dataclass") and len(value) == len(args):
            return tuple(_coerce(v, c) for v, c in zip(value, args))
        if ident in ("tuple...", "list") and args:
            return tuple(_coerce(v, args[0]) for v in value)
        return tuple(value)  # a key must be hashable; the serializer check says if it fits
    return value
