"""Registers the ``sqlite`` backend and declares its options, once (the backend takes them from here)."""

from __future__ import annotations

from collections.abc import Callable

from statekit.backend_api import BackendSpec, ConfigOption, hookimpl
from statekit.ordered_kv import KEY_GROUP_NATIVE_OPTIONS, ORDERED_KV_OPTIONS

__all__ = ["OPTIONS", "statekit_register_backends"]

OPTIONS = (
    ConfigOption(
        "synchronous", str, "off",
        "SQLite's PRAGMA synchronous for the local files. They are a working copy (checkpoints are "
        "what survives a crash), so 'off' is safe and fastest.", choices=("off", "normal", "full"),
    ),
    ConfigOption("cache-size", int, 2 << 20, "Bytes of SQLite page cache per subtask.", byte_size=True),
    *ORDERED_KV_OPTIONS,  # write-batch-size, ttl-sweep-interval: read by the ordered base
    *KEY_GROUP_NATIVE_OPTIONS,  # max-deltas, max-delta-ratio: read by KeyGroupNativeSnapshots
)  # fmt: skip


@hookimpl
def statekit_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Registers ``sqlite``."""
    register(
        BackendSpec(
            name="sqlite",
            factory="statekit_sqlite._backend:SqliteStateBackend",  # imported when a job uses it
            options=OPTIONS,
            description="Keyed state in SQLite files, one per subtask; incremental native checkpoints.",
        )
    )
