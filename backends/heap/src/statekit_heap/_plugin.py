"""Registers the ``heap`` backend. Kept light: the backend module loads on first use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from statekit.backend_api import BackendSpec, ConfigOption, hookimpl

#: The heap backend's options: none (it keeps everything in the task's memory).
OPTIONS: tuple[ConfigOption, ...] = ()


@hookimpl
def statekit_register_backends(register: Callable[[Any], None]) -> None:
    """Register ``heap``."""
    register(
        BackendSpec(
            name="heap",
            factory="statekit_heap._backend:HeapStateBackend",
            options=OPTIONS,
            description="Keyed state in Python dicts per key group; copy-on-write snapshots.",
        )
    )
