"""Snapshots while processing goes on: read transactions pinned at a snapshot point.

LMDB is MVCC: a read transaction sees the database as it was when it began,
whatever commits after, so a snapshot is one ``env.begin()`` at the snapshot
point (after the write buffer was committed) and costs nothing to take. The
snapshot is then read, maybe on another thread (py-lmdb opens environments
with ``MDB_NOTLS``: a read transaction may move between threads, used by one
at a time), while the task keeps committing.

One event breaks a pinned read transaction: growing the map.
``mdb_env_set_mapsize`` replaces the memory map under every transaction of
the process (py-lmdb 3 aborts them all; older versions leave them pointing
into the old mapping). So before the map grows, each pending snapshot is
*frozen*: its view is copied (``env.copy(compact=True, txn=...)``) into a
directory of its own, and from then on the snapshot reads that copy. Each
view has a lock, held by every read of it and by the freeze, so a growth
waits for a read in progress on another thread and no read sees the map
change under it. Growth is rare (the map doubles); freezing costs one compact
copy per pending snapshot.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from typing import Any

import lmdb

from statekit.backend_api import StateKind
from statekit.errors import CheckpointError, StateAccessError
from statekit.ordered_kv import KeyLayout, group_entries

from ._layout import DATA_FILE, db_name, read_range

__all__ = ["PinnedView"]


class PinnedView:
    """The state as it was at one snapshot point: a read transaction, or a frozen copy of it.

    Thread-safe: every method holds the view's lock, so a snapshot thread
    reading it and the task thread freezing it (before the map grows) or
    releasing it never overlap.
    """

    def __init__(self, env: Any, txn: Any, dbs: dict[str, Any], max_dbs: int, directory: str) -> None:
        self._lock = threading.Lock()
        self._env = env
        self._txn: Any = txn
        self._dbs = dbs  # state name -> handle of its database in the live environment
        self._max_dbs = max_dbs
        self.directory = directory  # where a frozen copy goes (created when frozen)
        self.frozen = False
        self.released = False
        self._frozen_env: Any = None
        self._frozen_txn: Any = None
        self._frozen_dbs: dict[str, Any] = {}

    @property
    def data_file(self) -> str:
        """The frozen copy's LMDB data file (once frozen)."""
        return os.path.join(self.directory, DATA_FILE)

    def _check(self) -> None:
        if self.released:
            raise StateAccessError(
                "this snapshot's view is gone: it was written or released, or its backend closed "
                "before it was written"
            )

    def freeze(self) -> bool:
        """Copy the view into :attr:`directory` and read the copy from now on.

        Returns whether it copied: False if already frozen, or released meanwhile.
        """
        with self._lock:
            if self.released or self.frozen:
                return False
            self._freeze()
            return True

    def _freeze(self) -> None:
        self._check()
        if self.frozen:
            return
        os.makedirs(self.directory, exist_ok=True)
        try:
            # Compact: only the pages this view sees, renumbered; it is also a native snapshot's file.
            self._env.copy(self.directory, compact=True, txn=self._txn)
        except BaseException as e:
            shutil.rmtree(self.directory, ignore_errors=True)
            if isinstance(e, lmdb.Error):
                # A full local disk, typically (lmdb.DiskError): the snapshot fails, the live
                # environment is untouched, and the runner goes on without this checkpoint.
                raise CheckpointError(
                    f"cannot copy the LMDB snapshot into {self.directory}: {e}; free space on the disk "
                    "of statekit.local-dir (or statekit.backend.lmdb.local-dir)"
                ) from e
            raise
        txn, self._txn = self._txn, None
        with contextlib.suppress(lmdb.Error):
            txn.abort()
        self.frozen = True

    def _source(self, name: str) -> tuple[Any, Any] | None:
        self._check()
        if not self.frozen:
            db = self._dbs.get(name)
            return None if db is None else (self._txn, db)
        if self._frozen_env is None:
            # Nothing writes the copy: no lock file, no reader table.
            self._frozen_env = lmdb.open(
                self.directory, readonly=True, lock=False, max_dbs=self._max_dbs, readahead=False
            )
            self._frozen_txn = self._frozen_env.begin()
        db = self._frozen_dbs.get(name)
        if db is None:
            try:
                db = self._frozen_env.open_db(db_name(name), txn=self._frozen_txn, create=False)
            except lmdb.NotFoundError:
                return None
            self._frozen_dbs[name] = db
        return self._frozen_txn, db

    def items(self, name: str, lower: bytes, upper: bytes | None) -> list[tuple[bytes, bytes]]:
        """Entries of state ``name`` with keys in ``[lower, upper)``, as at the snapshot point."""
        with self._lock:
            src = self._source(name)
            return [] if src is None else read_range(src[0], src[1], lower, upper)

    def lookup(self, name: str, keys: list[bytes]) -> list[bytes | None]:
        """The value of each of state ``name``'s ``keys`` as at the snapshot point (None: absent)."""
        with self._lock:
            src = self._source(name)
            if src is None:
                return [None] * len(keys)
            txn, db = src
            return [txn.get(k, db=db) for k in keys]

    def count(self, name: str, layout: KeyLayout, kind: StateKind) -> int:
        """The number of (key, namespace) entries of state ``name`` in this view."""
        with self._lock:
            src = self._source(name)
            if src is None:
                return 0
            txn, db = src
            if kind is StateKind.VALUE:
                return int(txn.stat(db)["entries"])
            with txn.cursor(db=db) as cur:
                return sum(1 for _ in group_entries(cur.iternext(), layout, kind))

    def materialize(self) -> str:
        """The view as an LMDB data file, frozen now if it was not: what a native snapshot uploads."""
        with self._lock:
            self._freeze()
            return self.data_file

    def release(self) -> None:
        """End the read transaction, close and delete the frozen copy (idempotent)."""
        with self._lock:
            if self.released:
                return
            self.released = True
            txn, self._txn = self._txn, None
            if txn is not None:
                with contextlib.suppress(lmdb.Error):
                    txn.abort()
            if self._frozen_txn is not None:
                with contextlib.suppress(lmdb.Error):
                    self._frozen_txn.abort()
                self._frozen_txn = None
            if self._frozen_env is not None:
                self._frozen_env.close()
                self._frozen_env = None
            self._frozen_dbs.clear()
            shutil.rmtree(self.directory, ignore_errors=True)
