"""Registers the ``heap`` backend. Kept light: the backend module loads on first use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from statekit.backend_api import BackendSpec, ConfigOption, hookimpl

#: The heap backend's options: how its checkpoints alternate deltas and bases.
OPTIONS: tuple[ConfigOption, ...] = (
    ConfigOption(
        "max-deltas",
        int,
        10,
        "Checkpoints that write only their change (a delta) after each full one (a base); "
        "a restore replays at most this many deltas.",
        minimum=1,
    ),
    ConfigOption(
        "max-delta-ratio",
        float,
        0.5,
        "A checkpoint writes a new base once the deltas since the last one pass this share of its bytes.",
        minimum=0.0,
    ),
    ConfigOption(
        "base-in-background",
        bool,
        True,
        "Encode a due base on a thread of its own while checkpoints go on writing deltas; the first "
        "checkpoint after it is encoded uploads it (a restore then replays at most twice max-deltas "
        "deltas). false: the checkpoint that is due writes it.",
    ),
)


@hookimpl
def statekit_register_backends(register: Callable[[Any], None]) -> None:
    """Register ``heap``."""
    register(
        BackendSpec(
            name="heap",
            factory="statekit_heap._backend:HeapStateBackend",
            options=OPTIONS,
            description="Keyed state in Python dicts per key group; checkpoints write the change since the "
            "last one (a delta), and everything now and then.",
        )
    )
