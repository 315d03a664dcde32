"""Writing to LMDB: one write transaction per batch; a full map grows and the batch is written again.

A buffer is cleared only once the transaction that wrote it committed. The
map doubles up to ``max-map-size``; pending snapshots are frozen first (their
pinned pages would otherwise move, see ``_views``). :class:`LMDBWrites` is
the part of :class:`~statekit_lmdb.LMDBKeyedStateBackend` that does it.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import lmdb

from statekit.backend_api import KeyGroupRange
from statekit.errors import StateAccessError
from statekit.ordered_kv import KVColumn, local_write_error

from ._views import PinnedView

__all__ = ["LMDBWrites", "MapSizeLimitError", "round_up"]

_PAGE = mmap.PAGESIZE


class MapSizeLimitError(StateAccessError):
    """The LMDB map of one subtask reached ``statekit.backend.lmdb.max-map-size``.

    The writes that did not fit stay in the backend's write buffer (nothing is
    lost in memory), but no more can be committed, nor snapshots taken.
    """


def round_up(n: int) -> int:
    return -(-n // _PAGE) * _PAGE


class LMDBWrites:
    """Commits and map growth of the LMDB keyed backend, its subclass, which sets these."""

    key_group_range: KeyGroupRange
    instance_dir: str
    map_growths: int
    frozen_views: int
    _lmdb_env: Any
    _lmdb_max_map: int
    _lmdb_options: Mapping[str, Any]
    _lmdb_reading: bool
    _lmdb_views: dict[int, PinnedView]

    if TYPE_CHECKING:

        def _lmdb_live(self) -> Any:
            """The live environment, or StateAccessError (the backend's)."""

        def _lmdb_end_reads(self) -> None:
            """End every column's read transaction (the backend's)."""

        def _lmdb_begin_reads(self) -> None:
            """Begin every column's read transaction (the backend's)."""

    def lmdb_commit(self, columns: Sequence[KVColumn], work: Callable[[Any], None] | None = None) -> None:
        """Commit the buffers of ``columns``, and ``work(txn)`` after them, in one write transaction.

        A buffer is cleared only once the transaction that wrote it
        committed: on ``MapFullError`` the transaction is aborted, the map
        grows (:meth:`_lmdb_grow`) and the same buffers and ``work`` are
        written again (``work`` must do the same when called again). No write
        transaction outlives the call (LMDB ties one to its thread). Every
        column's read transaction is renewed, so reads see the commit.

        Raises:
            MapSizeLimitError: If the map is at ``max-map-size`` and still too small.
            BackendIOError: If LMDB cannot write its files (a full disk); names the directory.
        """
        env = self._lmdb_live()
        # Ended first: an open read transaction keeps the pages the commit frees from reuse.
        self._lmdb_end_reads()
        try:
            while True:
                txn = env.begin(write=True)
                try:
                    for col in columns:
                        _write_buffer(txn, col)
                    if work is not None:
                        work(txn)
                    txn.commit()
                except lmdb.MapFullError:
                    with contextlib.suppress(lmdb.Error):
                        txn.abort()
                    self._lmdb_grow()
                    continue
                except lmdb.Error as e:
                    with contextlib.suppress(lmdb.Error):
                        txn.abort()
                    if _is_io_error(e):
                        raise local_write_error("lmdb", self.instance_dir, e) from e
                    raise
                except BaseException:
                    with contextlib.suppress(lmdb.Error):
                        txn.abort()
                    raise
                break
        finally:
            if self._lmdb_env is not None:
                self._lmdb_begin_reads()

    def _lmdb_grow(self) -> None:
        """Double the map (up to ``max-map-size``), freezing pending snapshots first (see ``_views``)."""
        size = self.map_size
        if size >= self._lmdb_max_map:
            raise MapSizeLimitError(
                f"the LMDB map of this subtask's state ({self.key_group_range}) is full at "
                f"{size:,} bytes, the maximum; raise statekit.backend.lmdb.max-map-size (now "
                f"{self._lmdb_options['max-map-size']}) or spread the state over more subtasks"
            )
        self._lmdb_remap(min(self._lmdb_max_map, round_up(size * 2)))

    def _lmdb_remap(self, size: int) -> None:
        for view in list(self._lmdb_views.values()):
            if view.freeze():  # waits for a read of it in progress on another thread
                self.frozen_views += 1
        reading = self._lmdb_reading
        self._lmdb_end_reads()
        self._lmdb_env.set_mapsize(size)
        self.map_growths += 1
        if reading:
            self._lmdb_begin_reads()

    @property
    def map_size(self) -> int:
        """The current map size of the live environment."""
        return int(self._lmdb_live().info()["map_size"])

    @property
    def map_used(self) -> int:
        """Bytes of the map in use (pages up to the last one written)."""
        env = self._lmdb_live()
        return (int(env.info()["last_pgno"]) + 1) * int(env.stat()["psize"])


def _is_io_error(e: Exception) -> bool:
    """Whether LMDB failed to write its files: no space (``DiskError``), ``EIO`` from the OS, or a
    panic after such a failure (LMDB then refuses every write transaction)."""
    text = str(e)
    return isinstance(e, (lmdb.DiskError, lmdb.PanicError)) or any(
        s in text for s in ("Input/output error", "No space left on device")
    )


def _write_buffer(txn: Any, col: KVColumn) -> None:
    """Put one column's buffered updates (None deletes) into the write transaction ``txn``."""
    buf = col.buffer
    if not buf:
        return
    db = col.engine.db
    puts = [(k, v) for k, v in buf.items() if v is not None]
    if len(puts) != len(buf):
        delete = txn.delete
        for k, v in buf.items():
            if v is None:
                delete(k, db=db)
    if puts:
        with txn.cursor(db=db) as cur:
            cur.putmulti(puts)
