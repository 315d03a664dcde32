"""The ``sqlite`` keyed state backend.

Each subtask's keyed state is one SQLite file in its ``local_dir``, with one row
per entry: ``(state, key group, key bytes, namespace bytes, value bytes)``,
where the bytes are what the state's serializers make (TTL timestamps
included: core's TTL layer hands this backend ``(value, ts)`` pairs to store).

Snapshots use SQLite itself: the file is in WAL mode, and a snapshot opens a
second connection and starts a read transaction at the snapshot point. Reads
in that transaction see the file as it was then, whatever the task writes
afterwards, until the snapshot is written and released, so a snapshot costs
no copy and can be written from another thread.

Incremental TTL cleanup (``cleanup_incremental_size``) is not implemented:
expired entries are removed when read, and left out of full snapshots when
``cleanup_full_snapshot`` is set.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from statekit import VOID_NAMESPACE
from statekit.backend_api import (
    Clock,
    KeyedBackendBase,
    KeyGroupRange,
    OperatorStateBackendImpl,
    RegisteredState,
    SlotListState,
    SlotMapState,
    SlotState,
    SlotValueState,
    StateEntries,
)
from statekit.serializers import TypeSerializer

__all__ = ["SqliteKeyedStateBackend", "SqliteStateBackend"]

_SCHEMA = """
CREATE TABLE entries (
    state INTEGER NOT NULL,
    kg INTEGER NOT NULL,
    key BLOB NOT NULL,
    ns BLOB NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (state, kg, key, ns)
) WITHOUT ROWID
"""
_GET = "SELECT value FROM entries WHERE state = ? AND kg = ? AND key = ? AND ns = ?"
_PUT = "INSERT OR REPLACE INTO entries (state, kg, key, ns, value) VALUES (?, ?, ?, ?, ?)"
_DELETE = "DELETE FROM entries WHERE state = ? AND kg = ? AND key = ? AND ns = ?"
_VOID = b""  # the void namespace; any other namespace is b"\x01" + its serialized bytes


def _ns_column(reg: RegisteredState, namespace: Any) -> bytes:
    """The ``ns`` column of ``namespace``, which is void or has the state's namespace serializer."""
    if namespace is VOID_NAMESPACE:
        return _VOID
    assert reg.namespace_serializer is not None  # handles and restores refuse namespaces without one
    return b"\x01" + reg.namespace_serializer.serialize(namespace)


class _Handle(SlotState):
    """The row of the current key and namespace; core's slot handles give the semantics."""

    def __init__(self, backend: SqliteKeyedStateBackend, reg: RegisteredState, state_id: int) -> None:
        super().__init__(reg)
        self._b = backend
        self._id = state_id
        self._ser = reg.serializer
        self._ns_bytes = _VOID

    def _namespace_changed(self, namespace: Any) -> None:
        self._ns_bytes = _ns_column(self._reg, namespace)

    def _row(self) -> tuple[int, int, bytes, bytes]:
        kg = self._b.current_key_group  # raises StateAccessError without a current key
        return self._id, kg, self._b.current_key_bytes, self._ns_bytes

    def _get(self) -> Any:
        found = self._b._db.execute(_GET, self._row()).fetchone()
        return None if found is None else self._ser.deserialize(found[0])

    def _put(self, value: Any) -> None:
        row = self._row()
        if value is None:
            self._b._db.execute(_DELETE, row)
        else:
            self._b._db.execute(_PUT, (*row, self._ser.serialize(value)))


class _Value(_Handle, SlotValueState):
    pass


class _List(_Handle, SlotListState):
    pass


class _Map(_Handle, SlotMapState):
    pass


class _SnapshotReader:
    """Reads one state and key group as of the snapshot point, from its own read transaction."""

    def __init__(
        self, conn: sqlite3.Connection, states: dict[str, tuple[int, RegisteredState]], keys: TypeSerializer
    ):
        self.conn = conn
        self._states = states
        self._keys = keys
        self._lock = threading.Lock()

    def __call__(self, name: str, kg: int) -> StateEntries:
        state_id, reg = self._states[name]
        with self._lock:
            rows = self.conn.execute(
                "SELECT key, ns, value FROM entries WHERE state = ? AND kg = ?", (state_id, kg)
            ).fetchall()
        keys = [self._keys.deserialize(k) for k, _, _ in rows]
        ns_ser = reg.namespace_serializer
        nss = [VOID_NAMESPACE if ns == _VOID else ns_ser.deserialize(ns[1:]) for _, ns, _ in rows]  # type: ignore[union-attr]
        values = [reg.serializer.deserialize(v) for _, _, v in rows]
        return keys, nss, values


class SqliteKeyedStateBackend(KeyedBackendBase):
    """Keyed state of one subtask in a SQLite file; see the module docstring.

    Args:
        key_serializer: Serializes keys.
        key_group_range: The key groups this subtask owns.
        max_parallelism: The number of key groups.
        clock: Processing time in ms, for TTL.
        key_cache_size: Entries of core's key-group cache.
        local_dir: Where the file goes; a temporary directory when None.
        synchronous: SQLite's ``PRAGMA synchronous``.
        cache_size: Bytes of SQLite page cache.
    """

    backend_name = "sqlite"

    def __init__(
        self,
        *,
        key_serializer: TypeSerializer,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        clock: Clock | None = None,
        key_cache_size: int = 131072,
        local_dir: str | None = None,
        synchronous: str = "off",
        cache_size: int = 2 << 20,
    ) -> None:
        super().__init__(
            key_serializer=key_serializer,
            key_group_range=key_group_range,
            max_parallelism=max_parallelism,
            clock=clock,
            key_cache_size=key_cache_size,
        )
        self._own_dir = local_dir is None
        directory = tempfile.mkdtemp(prefix="statekit-sqlite-") if local_dir is None else local_dir
        os.makedirs(directory, exist_ok=True)
        name = f"keyed-{key_group_range.start}-{key_group_range.end}-{uuid.uuid4().hex[:8]}.sqlite"
        self.path = os.path.join(directory, name)
        self._directory = directory
        # Autocommit: every write is its own transaction, so a snapshot's read transaction
        # (on another connection) sees exactly the writes made before it started.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        # Durability first, then the schema, then WAL: in this order creating a file costs
        # about a millisecond; switching to WAL first syncs the new file (10x slower).
        self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self._db.execute(f"PRAGMA cache_size=-{max(1, cache_size // 1024)}")
        self._db.execute(_SCHEMA)
        self._db.execute("PRAGMA journal_mode=WAL")
        # Our own attributes are prefixed: KeyedBackendBase keeps _states, _handles, _pending, ...
        self._sqlite_states: dict[str, tuple[int, RegisteredState]] = {}
        self._readers: set[_SnapshotReader] = set()

    def _register(self, reg: RegisteredState) -> int:
        state_id = len(self._sqlite_states)
        self._sqlite_states[reg.name] = (state_id, reg)
        return state_id

    def _create_value(self, reg: RegisteredState) -> Any:
        return _Value(self, reg, self._register(reg))

    def _create_list(self, reg: RegisteredState) -> Any:
        return _List(self, reg, self._register(reg))

    def _create_map(self, reg: RegisteredState) -> Any:
        return _Map(self, reg, self._register(reg))

    def _snapshot_entries(self) -> Callable[[str, int], StateEntries]:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM entries").fetchone()  # the read transaction starts here
        reader = _SnapshotReader(conn, dict(self._sqlite_states), self.key_serializer)
        self._readers.add(reader)
        return reader

    def _release_snapshot(self, reader: Callable[[str, int], StateEntries]) -> None:
        if isinstance(reader, _SnapshotReader):
            self._readers.discard(reader)
            reader.conn.close()

    def _load_entries(
        self, reg: RegisteredState, key_group: int, keys: list[Any], namespaces: list[Any], values: list[Any]
    ) -> None:
        state_id = self._sqlite_states[reg.name][0]
        ks, vs = self.key_serializer, reg.serializer
        rows = [
            (state_id, key_group, ks.serialize(k), _ns_column(reg, ns), vs.serialize(v))
            for k, ns, v in zip(keys, namespaces, values)
        ]
        self._db.execute("BEGIN")
        try:
            self._db.executemany(_PUT, rows)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _state_keys(self, reg: RegisteredState, namespace: Any) -> Iterator[Any]:
        state_id = self._sqlite_states[reg.name][0]
        if namespace is not VOID_NAMESPACE and reg.namespace_serializer is None:
            return iter(())  # a state without namespaces has no entries in any other
        rows = self._db.execute(
            "SELECT key FROM entries WHERE state = ? AND ns = ?", (state_id, _ns_column(reg, namespace))
        ).fetchall()
        return iter([self.key_serializer.deserialize(k) for (k,) in rows])

    def _state_size(self, reg: RegisteredState) -> int:
        (n,) = self._db.execute(
            "SELECT count(*) FROM entries WHERE state = ?", (self._sqlite_states[reg.name][0],)
        ).fetchone()
        return int(n)

    def close(self) -> None:
        """Close the file and delete it: the state that matters lives in checkpoints."""
        super().close()
        for reader in list(self._readers):
            reader.conn.close()
        self._readers.clear()
        self._db.close()
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path + suffix)
        if self._own_dir:
            shutil.rmtree(self._directory, ignore_errors=True)


class SqliteStateBackend:
    """The ``sqlite`` state backend: SQLite keyed backends, core's in-memory operator backends.

    Args:
        options: The declared options, by short name (``synchronous``, ``cache-size``).
    """

    name = "sqlite"

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        opts = dict(options or {})
        self.synchronous = str(opts.get("synchronous", "off"))
        self.cache_size = int(opts.get("cache-size", 2 << 20))

    def create_keyed_backend(
        self,
        *,
        key_serializer: TypeSerializer,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        clock: Callable[[], int] | None = None,
        key_cache_size: int = 131072,
        local_dir: str | None = None,
    ) -> SqliteKeyedStateBackend:
        """A keyed backend for one subtask, its file in ``local_dir`` (or a temporary directory)."""
        return SqliteKeyedStateBackend(
            key_serializer=key_serializer,
            key_group_range=key_group_range,
            max_parallelism=max_parallelism,
            clock=clock,
            key_cache_size=key_cache_size,
            local_dir=local_dir,
            synchronous=self.synchronous,
            cache_size=self.cache_size,
        )

    def create_operator_backend(self) -> OperatorStateBackendImpl:
        """Operator state is small and kept in memory, as in Flink, by core's implementation."""
        return OperatorStateBackendImpl()
