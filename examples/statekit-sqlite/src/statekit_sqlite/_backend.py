"""The ``sqlite`` keyed state backend: SQLite as an ordered key-value engine, one file per subtask.

One table, ``kv(state, k, v)``, keyed by ``(state, k)`` without rowid: a B-tree
in key order per state, which is all statekit's ``OrderedKVBackendBase`` asks
of an engine. Keys are statekit's composite keys (key group, key, namespace,
list sequence or map key), values its encoded units (TTL timestamps included);
the base does the handles, the write buffer, TTL sweeps, canonical snapshots
and bulk loads. SQLite has no column families: a state's "column" is its rows,
its name the first part of the primary key, stripped by the queries.

Snapshots: the file is in WAL mode, and a frozen view (``kv_freeze``) is a
second connection holding a read transaction begun at the snapshot point; it
sees the file as it was then, whatever the task writes afterwards, and can be
read from another thread. Native checkpoints are statekit's per-key-group
files (``KeyGroupNativeSnapshots``): SQLite rewrites its one file in place, so
each key group is a file of its own, named by its SHA-256, uploaded only when
it changed.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from statekit.backend_api import (
    DeclaredStateBackend,
    KeyedBackendParameters,
    KeyGroupNativeSnapshots,
    KVColumn,
    OrderedKVBackendBase,
    create_instance_dir,
)

from ._plugin import OPTIONS

__all__ = ["SqliteKeyedStateBackend", "SqliteStateBackend"]


_SCHEMA = "CREATE TABLE kv (state TEXT, k BLOB, v BLOB NOT NULL, PRIMARY KEY (state, k)) WITHOUT ROWID"
_GET = "SELECT v FROM kv WHERE state = ? AND k = ?"
_PAGE = "SELECT k, v FROM kv WHERE state = ? AND k >= ? ORDER BY k LIMIT ?"
_RANGE = "SELECT k, v FROM kv WHERE state = ? AND k >= ? AND (? IS NULL OR k < ?) ORDER BY k"
# A bounded range in its own statement: with ``(? IS NULL OR k < ?)`` SQLite bounds the
# search below only and reads to the end of the state for every key group.
_BETWEEN = "SELECT k, v FROM kv WHERE state = ? AND k >= ? AND k < ? ORDER BY k"
_FROM = "SELECT k, v FROM kv WHERE state = ? AND k >= ? ORDER BY k"
_PUT = "INSERT OR REPLACE INTO kv (state, k, v) VALUES (?, ?, ?)"
_DELETE = "DELETE FROM kv WHERE state = ? AND k = ?"
_PAGE_ROWS = 512  # an iteration reads pages: no statement stays open while the base writes


class _ReadView:
    """The file as it was at a snapshot point: a read transaction on a connection of its own."""

    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False
        )
        self._conn.execute("BEGIN")
        self._conn.execute("SELECT count(*) FROM kv").fetchone()  # the read transaction starts here

    def items(self, name: str, lower: bytes, upper: bytes | None) -> list[tuple[bytes, bytes]]:
        with self._lock:
            if self._conn is None:
                raise sqlite3.ProgrammingError("this snapshot's view was released")
            if upper is None:
                return self._conn.execute(_FROM, (name, lower)).fetchall()
            return self._conn.execute(_BETWEEN, (name, lower, upper)).fetchall()

    def release(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class SqliteKeyedStateBackend(KeyGroupNativeSnapshots, OrderedKVBackendBase):
    """Keyed state of one subtask in ``<local_dir>/sqlite-<random>/state.sqlite`` (see the module)."""

    backend_name = "sqlite"
    native_format = "statekit-sqlite-kg-1"

    def __init__(self, parameters: KeyedBackendParameters, options: Mapping[str, Any]) -> None:
        super().__init__(parameters, options=options)
        # Our own attributes are prefixed: the bases keep _states, layout, sequence, kv_*, ...
        self.sqlite_dir = create_instance_dir(parameters.local_dir, "sqlite-")
        self.path = os.path.join(self.sqlite_dir, "state.sqlite")
        self._sqlite_views: set[_ReadView] = set()
        # Autocommit: each write batch is one explicit transaction, which a view started later sees.
        self._sqlite_db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        # Durability first, then the schema, then WAL: in this order creating a file costs about a
        # millisecond; switching to WAL first syncs the new file (10x slower).
        self._sqlite_db.execute(f"PRAGMA synchronous={str(options['synchronous']).upper()}")
        self._sqlite_db.execute(f"PRAGMA cache_size=-{max(1, int(options['cache-size']) // 1024)}")
        self._sqlite_db.execute(_SCHEMA)
        self._sqlite_db.execute("PRAGMA journal_mode=WAL")

    def kv_bind(self, col: KVColumn, create: bool) -> bool:
        db, name = self._sqlite_db, col.name
        if not create and db.execute("SELECT 1 FROM kv WHERE state = ? LIMIT 1", (name,)).fetchone() is None:
            return False  # no rows: the state has no "column" yet

        def get(k: bytes) -> bytes | None:
            row = db.execute(_GET, (name, k)).fetchone()
            return None if row is None else bytes(row[0])

        def iterate(start: bytes) -> Iterator[tuple[bytes, bytes]]:
            while True:
                rows = db.execute(_PAGE, (name, start, _PAGE_ROWS)).fetchall()
                yield from rows
                if len(rows) < _PAGE_ROWS:
                    return
                start = rows[-1][0] + b"\x00"  # the smallest key after the last one read

        col.get, col.iterate = get, iterate
        return True

    def _sqlite_transaction(
        self, puts: list[tuple[str, bytes, bytes]], deletes: list[tuple[str, bytes]]
    ) -> None:
        db = self._sqlite_db
        db.execute("BEGIN")
        try:
            db.executemany(_DELETE, deletes)
            db.executemany(_PUT, puts)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def kv_write(self, columns: Sequence[KVColumn]) -> None:
        puts = [(c.name, k, v) for c in columns for k, v in c.buffer.items() if v is not None]
        deletes = [(c.name, k) for c in columns for k, v in c.buffer.items() if v is None]
        self._sqlite_transaction(puts, deletes)
        for c in columns:
            c.buffer.clear()

    def kv_load(self, name: str, items: list[tuple[bytes, bytes]]) -> None:
        self._sqlite_transaction([(name, k, v) for k, v in items], [])

    def kv_freeze(self) -> _ReadView:
        view = _ReadView(self.path)
        self._sqlite_views.add(view)
        return view

    def close(self) -> None:
        """Close the file and delete the instance directory: the state that matters is in checkpoints."""
        if self._closed:
            return
        super().close()  # seals every state: later uses raise, naming the state
        for view in self._sqlite_views:
            view.release()
        self._sqlite_views.clear()
        self._sqlite_db.close()
        shutil.rmtree(self.sqlite_dir, ignore_errors=True)


class SqliteStateBackend(DeclaredStateBackend):
    """The ``sqlite`` state backend: options ``synchronous``, ``cache-size``, ``write-batch-size``."""

    name = "sqlite"
    declared_options = OPTIONS
    keyed_backend = SqliteKeyedStateBackend
