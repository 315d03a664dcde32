"""Checkpoint locations given as paths or URLs: the ``filesystem`` storage that reaches them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .._contracts import CheckpointStorage
from ..plugins._registry import PluginRegistry, default_registry

__all__ = ["filesystem_storage", "parent_location"]


def parent_location(path: str) -> str:
    """The directory a ``chk-<n>`` or savepoint location lies in."""
    stripped = path.rstrip("/")
    # "/sp" lies in "/", not in "" (which would be no directory at all)
    return (stripped.rsplit("/", 1)[0] or "/") if "/" in stripped else "."


def filesystem_storage(
    directory: str,
    *,
    storage_options: str | Mapping[str, Any] | None = None,
    registry: PluginRegistry | None = None,
) -> CheckpointStorage:
    """The ``filesystem`` storage rooted at ``directory`` (a local path or any fsspec URL).

    ``storage_options`` are fsspec options, as JSON or a mapping.
    """
    raw: dict[str, object] = {"checkpoints-dir": directory}
    if storage_options:
        raw["storage-options"] = (
            storage_options if isinstance(storage_options, str) else json.dumps(dict(storage_options))
        )
    storage: CheckpointStorage = (registry or default_registry()).create_storage("filesystem", raw)
    return storage
