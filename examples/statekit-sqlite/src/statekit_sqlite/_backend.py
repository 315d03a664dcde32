"""The ``sqlite`` keyed state backend: SQLite as an ordered key-value engine, one file per subtask.

One table, ``kv(k, v)``, keyed by ``k`` without rowid: a B-tree in key order,
one key space, which is all statekit's ``PrefixedKVBackendBase`` asks of an
engine (point reads, range scans with a limit, atomic batches, and a view that
later writes do not change). The base keeps each state's entries apart by a
prefix of its name in front of statekit's composite keys, and does the
handles, the write buffer, TTL sweeps, canonical snapshots, bulk loads, the
instance directory and the frozen views' lifetime.

Snapshots: the file is in WAL mode, and a frozen view (``kv_reader``) is a
second connection holding a read transaction begun at the snapshot point; it
sees the file as it was then, whatever the task writes afterwards, and can be
read from another thread. Native checkpoints are statekit's per-key-group
files (``KeyGroupNativeSnapshots``): SQLite rewrites its one file in place, so
each key group is a file of its own, named by its SHA-256, and later
checkpoints upload one delta of the keys that changed (the base records every
key its writes touch; the options ``max-deltas`` and ``max-delta-ratio`` say
when key groups are written whole again).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Mapping
from typing import Any

from statekit.backend_api import DeclaredStateBackend, KeyedBackendParameters
from statekit.ordered_kv import KeyGroupNativeSnapshots, PrefixedKVBackendBase

from ._plugin import OPTIONS

__all__ = ["SqliteKeyedStateBackend", "SqliteStateBackend"]

_SCHEMA = "CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID"
# A bounded range and an open one in statements of their own: with ``(? IS NULL OR k < ?)``
# SQLite bounds the search below only and reads on to the end of the table.
_BETWEEN = "SELECT k, v FROM kv WHERE k >= ? AND k < ? ORDER BY k LIMIT ?"
_FROM = "SELECT k, v FROM kv WHERE k >= ? ORDER BY k LIMIT ?"


def _scan(db: sqlite3.Connection, lower: bytes, upper: bytes | None, limit: int) -> list[Any]:
    if upper is None:
        return db.execute(_FROM, (lower, limit)).fetchall()
    return db.execute(_BETWEEN, (lower, upper, limit)).fetchall()


class _ReadView:
    """The file as it was at a snapshot point: a read transaction on a connection of its own."""

    def __init__(self, path: str) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.execute("BEGIN")
        # The read transaction starts at its first read: one row, not a count of the table (O(state)).
        self._conn.execute("SELECT k FROM kv LIMIT 1").fetchone()

    def scan(self, lower: bytes, upper: bytes | None, limit: int) -> list[Any]:
        return _scan(self._conn, lower, upper, limit)

    def release(self) -> None:
        self._conn.close()


class SqliteKeyedStateBackend(KeyGroupNativeSnapshots, PrefixedKVBackendBase):
    """Keyed state of one subtask in ``<local_dir>/sqlite-<random>/state.sqlite`` (see the module)."""

    backend_name = "sqlite"
    native_format = "statekit-sqlite-kg-2"  # key-group files, then deltas of the changed keys
    key_group_older_formats = ("statekit-sqlite-kg-1",)  # before deltas: still restored
    readable_native_formats = key_group_older_formats
    kv_dir_prefix = "sqlite-"  # the base makes self.kv_dir, and removes it when the backend closes

    def __init__(self, parameters: KeyedBackendParameters, options: Mapping[str, Any]) -> None:
        super().__init__(parameters, options=options)
        assert self.kv_dir is not None
        self.path = os.path.join(self.kv_dir, "state.sqlite")
        # Autocommit: each write batch is one explicit transaction, which a view started later sees.
        db = self._sqlite_db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        # Durability first, then the schema, then WAL: in this order creating a file costs about a
        # millisecond; switching to WAL first syncs the new file (10x slower).
        db.execute(f"PRAGMA synchronous={str(options['synchronous']).upper()}")
        db.execute(f"PRAGMA cache_size=-{max(1, int(options['cache-size']) // 1024)}")
        db.execute(_SCHEMA)
        db.execute("PRAGMA journal_mode=WAL")

    def kv_get(self, key: bytes) -> bytes | None:
        row = self._sqlite_db.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def kv_scan(self, lower: bytes, upper: bytes | None, limit: int) -> list[Any]:
        return _scan(self._sqlite_db, lower, upper, limit)

    def kv_apply(self, ops: list[tuple[bytes, bytes | None]]) -> None:
        db = self._sqlite_db
        db.execute("BEGIN")
        try:
            db.executemany("DELETE FROM kv WHERE k = ?", [(k,) for k, v in ops if v is None])
            db.executemany("INSERT OR REPLACE INTO kv VALUES (?, ?)", [o for o in ops if o[1] is not None])
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def kv_reader(self) -> _ReadView:
        return _ReadView(self.path)

    def kv_close(self) -> None:
        """Close the file; the base then deletes the instance directory (checkpoints hold the state)."""
        self._sqlite_db.close()


class SqliteStateBackend(DeclaredStateBackend):
    """The ``sqlite`` state backend: options ``synchronous``, ``cache-size``, and the ordered engines' own."""

    name = "sqlite"
    declared_options = OPTIONS
    keyed_backend = SqliteKeyedStateBackend
