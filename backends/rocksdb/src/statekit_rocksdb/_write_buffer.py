"""Buffered writes: updates wait in a dict per state and go to RocksDB in one WriteBatch.

Reads see the pending writes (a handle looks in its state's buffer before it
asks RocksDB), repeated updates of one key cost one engine write, and the
buffer is written out when it holds ``write-batch-size`` updates, before any
scan of its state (list reads, map iteration, key listing) and at every
snapshot point, so a snapshot sees every update made before it.
"""

from __future__ import annotations

from typing import Any

from rocksdict import WriteBatch, WriteOptions

__all__ = ["StateColumn", "WriteBuffer"]


class StateColumn:
    """One state's column family and its buffer of pending writes (``None`` deletes)."""

    __slots__ = ("buffer", "cf", "handle", "name")

    def __init__(self, name: str, cf: Any, handle: Any | None) -> None:
        self.name = name
        self.cf = cf  # the column family's Rdict: get, iter, snapshot, flush
        self.handle = handle  # its ColumnFamily handle: what WriteBatch takes
        self.buffer: dict[bytes, bytes | None] = {}


class WriteBuffer:
    """The pending writes of every state of one instance; see the module docstring."""

    __slots__ = ("_db", "_options", "limit", "pending")

    def __init__(self, db: Any, options: WriteOptions, limit: int) -> None:
        self._db = db
        self._options = options
        self.limit = max(1, limit)
        self.pending = 0  # updates buffered since the last write

    def write(self, columns: Any) -> None:
        """Write every buffered update of ``columns`` in one WriteBatch."""
        batch = None
        for col in columns:
            buf = col.buffer
            if not buf:
                continue
            if batch is None:
                batch = WriteBatch(raw_mode=True)
            h = col.handle
            put, delete = batch.put, batch.delete
            for k, v in buf.items():
                if v is None:
                    delete(k, h)
                else:
                    put(k, v, h)
            buf.clear()
        if batch is not None:
            self._db.write(batch, self._options)
        self.pending = 0

    def write_column(self, col: StateColumn) -> None:
        """Write one state's buffered updates (before a scan of it)."""
        if col.buffer:
            pending = self.pending - len(col.buffer)
            self.write((col,))
            self.pending = max(0, pending)
