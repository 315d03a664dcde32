"""Registers the ``sqlite`` backend. Kept light: the backend module loads when a backend is created."""

from __future__ import annotations

from collections.abc import Callable

from statekit.backend_api import BackendSpec, ConfigOption, hookimpl

__all__ = ["statekit_register_backends"]


@hookimpl
def statekit_register_backends(register: Callable[[BackendSpec], None]) -> None:
    """Registers ``sqlite``."""
    register(
        BackendSpec(
            name="sqlite",
            factory="statekit_sqlite._backend:SqliteStateBackend",
            options=(
                ConfigOption(
                    "synchronous",
                    str,
                    "off",
                    "SQLite's PRAGMA synchronous for the local files. They are a working copy "
                    "(checkpoints are what survives a crash), so 'off' is safe and fastest.",
                    choices=("off", "normal", "full"),
                ),
                ConfigOption(
                    "cache-size", int, 2 << 20, "Bytes of SQLite page cache per subtask.", byte_size=True
                ),
            ),
            description="Keyed state in SQLite files, one per subtask; snapshots are read transactions.",
        )
    )
