"""The ``storage-options`` of the filesystem storages: JSON objects, secrets merged, ``${env:NAME}`` read."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from statekit.errors import ConfigurationError

__all__ = ["parse_storage_options"]


def parse_storage_options(
    raw: str | Mapping[str, Any] | None, storage: str, secret: str | Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Parses the ``storage-options`` and ``secret-storage-options`` options into fsspec storage options.

    Both are JSON objects; ``secret`` is merged over ``raw`` (nested objects
    merge key by key). A string value ``"${env:NAME}"`` anywhere is replaced by
    the environment variable ``NAME`` of this process (on Spark: of each
    executor), so no credential need appear in the configuration. Messages never
    show the values.

    Raises:
        ConfigurationError: If an option is no JSON object, or a named variable is unset.
    """
    merged: dict[str, Any] = {}
    for name, value in (("storage-options", raw), ("secret-storage-options", secret)):
        _merge(merged, _parse_json_object(value, f"statekit.checkpoint.storage.{storage}.{name}"))
    resolved: dict[str, Any] = _resolve_env(merged, f"statekit.checkpoint.storage.{storage}")
    return resolved


def _parse_json_object(raw: str | Mapping[str, Any] | None, key: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    where: str | None = None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep to decode
        where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
    if where is not None:
        # Raised here, not in the handler: the decoder's error (its .doc is the whole value, secrets
        # included) would stay reachable as __context__ even with "from None".
        raise ConfigurationError(f"invalid value for {key}: not JSON (malformed{where})")
    if not isinstance(value, dict):
        raise ConfigurationError(
            f"invalid value for {key}: expected a JSON object, got {type(value).__name__}"
        )
    return value


def _merge(into: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


_ENV_REFERENCE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


def _resolve_env(value: Any, key: str) -> Any:
    if isinstance(value, dict):
        return {k: _resolve_env(v, key) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_env(v, key) for v in value]
    if isinstance(value, str) and (match := _ENV_REFERENCE.fullmatch(value)):
        resolved = os.environ.get(match[1])
        if resolved is None:
            raise ConfigurationError(
                f"{key} refers to environment variable {match[1]}, which is not set in this process "
                "(on Spark, set it on the executors too: spark.executorEnv." + match[1] + ")"
            )
        return resolved
    return value
