"""statekit-sqlite: keyed state in SQLite files, one file per subtask.

Select it by name (``statekit.backend=sqlite``) once installed, or create it
directly::

    from statekit_sqlite import SqliteStateBackend

    backend = SqliteStateBackend({"synchronous": "off"})
    keyed = backend.create_keyed_backend(
        KeyedBackendParameters(
            key_serializer=serializer_for(str), key_group_range=KeyGroupRange.of(0, 127),
            max_parallelism=128, local_dir="/tmp/state",
        )
    )
"""

from __future__ import annotations

from ._backend import SqliteKeyedStateBackend, SqliteStateBackend

__all__ = ["SqliteKeyedStateBackend", "SqliteStateBackend"]
