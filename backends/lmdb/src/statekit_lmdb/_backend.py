"""The LMDB keyed state backend: one LMDB environment per subtask, one named database per state.

The handles, the write buffer, key listing, canonical decoding, bulk loads
and TTL sweeps are core's (``statekit.ordered_kv.OrderedKVBackendBase``);
this module binds them to LMDB. Buffered writes are committed in one write
transaction per batch; a full map grows and the transaction is written again
(``_writes``: :meth:`LMDBWrites.lmdb_commit`). Reads go through a read
transaction per state, renewed by every commit. Snapshots are taken while
processing goes on: both kinds read a read transaction pinned at the snapshot
point (``_views``, the base's ``kv_freeze``); canonical ones iterate it, native
ones are core's per-key-group files (``KeyGroupNativeSnapshots``: one
content-addressed file per key group, then deltas of the changed keys) or, with ``native-format=full``, a
compact copy of it (``_full_snapshot``). Restores of the full copies, and
rescales of them, are in ``_restore``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import struct
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import lmdb

from statekit.backend_api import DeclaredStateBackend, KeyedBackendParameters, RegisteredState, StateKind
from statekit.errors import ConfigurationError, SnapshotError, StateAccessError
from statekit.ordered_kv import KeyGroupNativeSnapshots, KVColumn, OrderedKVBackendBase, create_instance_dir
from statekit.snapshot_codec import NativeStateHandle

from ._full_snapshot import LMDBNativeSnapshot
from ._layout import BULK_CHUNK, DATA_FILE, DB_PREFIX, MAX_KEY_SIZE, db_name, iterate
from ._plugin import OPTIONS
from ._restore import restore_instance
from ._views import PinnedView
from ._writes import LMDBWrites, MapSizeLimitError, round_up

__all__ = [
    "LMDB_KEY_GROUP_FORMAT",
    "LMDB_KEY_GROUP_FORMAT_1",
    "LMDB_NATIVE_FORMAT",
    "LMDBKeyedStateBackend",
    "LMDBStateBackend",
]

#: The full native format: a compact copy of the environment (see docs/backends/lmdb.md).
LMDB_NATIVE_FORMAT = "statekit-lmdb-1"
#: The incremental native format (the default): a content-addressed file per key group, and deltas.
LMDB_KEY_GROUP_FORMAT = "statekit-lmdb-kg-2"
#: The same before deltas (one file per key group only): still restored.
LMDB_KEY_GROUP_FORMAT_1 = "statekit-lmdb-kg-1"
# Reader slots for pinned snapshots, besides one per state for the task's reads.
_SNAPSHOT_READERS = 126


class LMDBStateBackend(DeclaredStateBackend):
    """The ``lmdb`` state backend: makes an LMDB keyed backend (one environment) per subtask.

    Example::

        LocalRunner(CountPerUrl, key_selector=..., config={
            "statekit.backend": "lmdb",
            "statekit.backend.lmdb.max-map-size": "64gb",
            "statekit.checkpoints.dir": "s3://bucket/checkpoints",
        })
    """

    name = "lmdb"
    declared_options = OPTIONS

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        """Takes the plugin's options by short name (defaults for those left out).

        Raises:
            ConfigurationError: If sizes or counts are out of range, or ``native-format`` is neither
                ``key-groups`` nor ``full``.
        """
        super().__init__(options)
        opts = self.options
        if opts["native-format"] not in ("key-groups", "full"):  # a typo must not pick the other format
            raise ConfigurationError(
                f"statekit.backend.lmdb.native-format must be 'key-groups' or 'full', got "
                f"{opts['native-format']!r}"
            )
        for name in (
            "initial-map-size",
            "max-map-size",
            "write-batch-size",
            "max-states",
            "ttl-sweep-interval",
        ):
            if int(opts[name]) < 1:
                raise ConfigurationError(f"statekit.backend.lmdb.{name} must be at least 1, got {opts[name]}")
        if int(opts["initial-map-size"]) > int(opts["max-map-size"]):
            raise ConfigurationError(
                f"statekit.backend.lmdb.initial-map-size ({opts['initial-map-size']}) is larger than "
                f"statekit.backend.lmdb.max-map-size ({opts['max-map-size']})"
            )

    @staticmethod
    def keyed_backend(
        parameters: KeyedBackendParameters, options: Mapping[str, Any]
    ) -> LMDBKeyedStateBackend:
        """An LMDB environment for one subtask, in ``local-dir``, else ``local_dir``, else a temp dir."""
        return LMDBKeyedStateBackend(parameters, options)


class _Binding:
    """What a column holds of LMDB: its named database, and the read transaction its reads use.

    A read transaction per state, begun with the state's database as its
    default, makes ``col.get`` py-lmdb's own ``Transaction.get``: no Python
    frame between a handle and LMDB on a point read. Keys longer than LMDB
    stores never reach it: core's handles check ``kv_max_key_size``.
    """

    __slots__ = ("db", "reader")

    def __init__(self, db: Any) -> None:
        self.db = db
        self.reader: Any = None


class LMDBKeyedStateBackend(KeyGroupNativeSnapshots, LMDBWrites, OrderedKVBackendBase):
    """Keyed state of one subtask in an LMDB environment under its local directory.

    The instance lives in ``<local dir>/lmdb-<random>/``: ``db/`` is the live
    environment, ``snap-*`` and ``chk-*`` frozen copies of pending snapshots,
    ``restore-*`` downloads; all of it is deleted by :meth:`close`. Handles, the
    write buffer, key listing, bulk loads and TTL sweeps are statekit's
    :class:`~statekit.ordered_kv.OrderedKVBackendBase`; this class binds them to
    named databases.
    """

    backend_name = "lmdb"
    native_format = LMDB_KEY_GROUP_FORMAT
    key_group_format = LMDB_KEY_GROUP_FORMAT  # restored also when native-format=full
    key_group_older_formats = (LMDB_KEY_GROUP_FORMAT_1,)
    #: Native formats restored besides ``native_format``: every one this backend writes or wrote.
    readable_native_formats = (LMDB_KEY_GROUP_FORMAT, LMDB_KEY_GROUP_FORMAT_1, LMDB_NATIVE_FORMAT)

    def __init__(self, parameters: KeyedBackendParameters, options: Mapping[str, Any] | None = None) -> None:
        opts = {o.name: o.default for o in OPTIONS}
        opts.update(options or {})
        super().__init__(parameters, options=opts)
        local_dir = parameters.local_dir
        self._lmdb_options = opts
        if opts["native-format"] == "full":
            self.native_format = LMDB_NATIVE_FORMAT
        self._lmdb_max_map = round_up(int(opts["max-map-size"]))
        self._lmdb_views: dict[int, PinnedView] = {}
        self._lmdb_env: Any = None
        self._lmdb_reading = False  # whether the columns' read transactions are open
        #: LMDB's key size limit (``env.max_key_size()``); core's handles refuse longer keys.
        self.kv_max_key_size = MAX_KEY_SIZE
        #: How often the map grew, and how many pending snapshots were frozen for it (observability).
        self.map_growths = 0
        self.frozen_views = 0
        # Owned by this process; environments of killed processes in the same directory are removed.
        self.instance_dir = create_instance_dir(local_dir, "lmdb-")
        try:
            os.makedirs(self.db_path)
            self.lmdb_open(int(opts["initial-map-size"]))
        except BaseException:
            shutil.rmtree(self.instance_dir, ignore_errors=True)
            raise

    # --- the environment ----------------------------------------------------------------------

    @property
    def db_path(self) -> str:
        """The live environment's directory."""
        return os.path.join(self.instance_dir, "db")

    @property
    def env(self) -> Any:
        """The live ``lmdb.Environment`` (for tests and tools; writes bypass the buffer)."""
        return self._lmdb_env

    @property
    def lmdb_options(self) -> Mapping[str, Any]:
        """The plugin's options this backend runs with, by short name."""
        return self._lmdb_options

    def lmdb_open(self, map_size: int) -> None:
        """Open (or create) the live environment in :attr:`db_path`; existing columns bind to it."""
        o = self._lmdb_options
        self._lmdb_env = lmdb.open(
            self.db_path,
            map_size=min(self._lmdb_max_map, round_up(map_size)),
            subdir=True,
            max_dbs=int(o["max-states"]),
            max_readers=int(o["max-states"]) + _SNAPSHOT_READERS,
            sync=bool(o["sync"]),
            metasync=bool(o["metasync"]),
            writemap=bool(o["writemap"]),
            readahead=bool(o["readahead"]),
            lock=True,  # the reader table: what keeps the pages of pinned snapshots from being reused
        )
        self.kv_max_key_size = int(self._lmdb_env.max_key_size())
        self._lmdb_reading = True
        for col in self.kv_columns:
            self.kv_bind(col, True)

    def lmdb_close_env(self) -> None:
        """Close the live environment (pending snapshots are released, buffered writes dropped)."""
        for view in list(self._lmdb_views.values()):
            view.release()
        self._lmdb_views.clear()
        self._lmdb_end_reads()
        for col in self.kv_columns:
            col.buffer.clear()
            col.forget_presence()  # what the reopened (or replaced) environment holds is read afresh
        self.kv_pending = 0
        env, self._lmdb_env = self._lmdb_env, None
        if env is not None:
            env.close()

    def _lmdb_live(self) -> Any:
        env = self._lmdb_env
        if env is None:
            raise StateAccessError("the backend is closed")
        return env

    def _lmdb_open_db(self, name: str, create: bool) -> Any:
        """The handle of state ``name``'s database (None if absent and not ``create``)."""
        env = self._lmdb_live()
        key = db_name(name)
        while True:
            try:
                return env.open_db(key, create=create)
            except lmdb.NotFoundError:
                return None
            except lmdb.MapFullError:
                self._lmdb_grow()
            except lmdb.DbsFullError:
                raise StateAccessError(
                    f"cannot create state {name!r}: this LMDB environment holds at most "
                    f"{self._lmdb_options['max-states']} states; raise statekit.backend.lmdb.max-states"
                ) from None

    def _lmdb_begin_read(self, col: KVColumn) -> None:
        binding: _Binding = col.engine
        txn = self._lmdb_env.begin(db=binding.db)
        binding.reader = txn
        col.get = txn.get
        col.iterate = functools.partial(iterate, txn)

    def _lmdb_end_reads(self) -> None:
        """End every column's read transaction (before a commit, a growth, a close)."""
        self._lmdb_reading = False
        for col in self.kv_columns:
            binding: _Binding | None = col.engine
            if binding is not None and binding.reader is not None:
                with contextlib.suppress(lmdb.Error):
                    binding.reader.abort()
                binding.reader = None

    def _lmdb_begin_reads(self) -> None:
        for col in self.kv_columns:
            self._lmdb_begin_read(col)
        self._lmdb_reading = True

    def lmdb_reader(self, name: str) -> Any:
        """The read transaction of state ``name`` (its database is the default): the last commit's view."""
        col = self.kv_column(name, create=False)
        if col is None:
            raise StateAccessError(f"this environment has no state {name!r}")
        return col.engine.reader

    # --- the engine under OrderedKVBackendBase ------------------------------------------------------

    def kv_bind(self, col: KVColumn, create: bool) -> bool:
        db = self._lmdb_open_db(col.name, create)
        if db is None:
            return False
        old: _Binding | None = col.engine
        if old is not None and old.reader is not None:
            with contextlib.suppress(lmdb.Error):
                old.reader.abort()
        col.engine = _Binding(db)
        if self._lmdb_reading:
            self._lmdb_begin_read(col)
        return True

    def kv_write(self, columns: Sequence[KVColumn]) -> None:
        """Commit the columns' buffers in one write transaction (see :meth:`lmdb_commit`)."""
        self.lmdb_commit(columns)

    def kv_load(self, name: str, items: list[tuple[bytes, bytes]]) -> None:
        """Append sorted, distinct entries to state ``name``, in transactions of bounded size."""
        if not items:
            return
        col = self.kv_column(name)
        assert col is not None
        db = col.engine.db  # core checked every key against kv_max_key_size
        for start in range(0, len(items), BULK_CHUNK):
            chunk = items[start : start + BULK_CHUNK]

            def work(txn: Any, chunk: list[tuple[bytes, bytes]] = chunk) -> None:
                with txn.cursor(db=db) as cur:
                    # Appends (no tree search) when the chunk sorts after everything stored.
                    append = not cur.last() or cur.key() < chunk[0][0]
                    _, added = cur.putmulti(chunk, append=append)
                    if append and added != len(chunk):  # an append refused: write normally instead
                        cur.putmulti(chunk)

            self.lmdb_commit((), work)

    # --- entry counts ------------------------------------------------------------------------------

    def _state_size(self, reg: RegisteredState) -> int:
        if reg.storage_kind is not StateKind.VALUE:
            return super()._state_size(reg)
        # An entry per (key, namespace): LMDB counts them.
        col = self.kv_column(reg.name, create=False)
        if col is None:
            return 0
        self.kv_write_column(col)
        return int(col.engine.reader.stat(col.engine.db)["entries"])

    def kv_estimated_entries(self) -> int | None:
        """LMDB's records of every stored state: exact for values, every list element or map entry else."""
        total = 0
        for name in self.stored_state_names:
            col = self.kv_column(name, create=False)
            if col is not None:
                self.kv_write_column(col)
                total += int(col.engine.reader.stat(col.engine.db)["entries"])
        return total

    # --- snapshots --------------------------------------------------------------------------------

    def lmdb_pin(self, kind: str) -> PinnedView:
        """Commit every buffer and pin a read transaction: the state at this point, for a snapshot."""
        self._lmdb_live()
        self.kv_write_buffered()
        for name in self.stored_state_names:
            self.kv_column(name, create=False)  # every stored state's database in the view
        if not self._lmdb_views and self.map_used * 4 > self.map_size * 3:
            # Grow now, while nothing is pinned, rather than freeze this snapshot later.
            with contextlib.suppress(MapSizeLimitError):
                self._lmdb_grow()
        try:
            txn = self._lmdb_env.begin()
        except lmdb.ReadersFullError:
            raise SnapshotError(
                f"{len(self._lmdb_views)} snapshots of this subtask are pending, as many as LMDB's reader "
                "table allows; write or release some first"
            ) from None
        view = PinnedView(
            self._lmdb_env,
            txn,
            {col.name: col.engine.db for col in self.kv_columns},
            int(self._lmdb_options["max-states"]),
            os.path.join(self.instance_dir, f"{kind}-{os.urandom(6).hex()}"),
        )
        self._lmdb_views[id(view)] = view
        return view

    def lmdb_unpin(self, view: PinnedView) -> None:
        """The snapshot of ``view`` is written or given up: end its transaction, delete its copy."""
        self._lmdb_views.pop(id(view), None)
        view.release()

    def kv_freeze(self) -> _PinnedFrozen:
        """A read transaction pinned now: canonical and key-group snapshots read it."""
        return _PinnedFrozen(self, self.lmdb_pin("snap"))

    # --- native snapshots -------------------------------------------------------------------------

    def native_snapshot(self, checkpoint_id: int) -> Any:
        """Pin the state now (a read transaction); ``write`` uploads the key groups that changed.

        With ``native-format=full``: a compact copy of the whole environment instead.
        """
        self._lmdb_live()
        if self.native_format == LMDB_NATIVE_FORMAT:
            self.check_native_snapshot()
            return self.track_snapshot(LMDBNativeSnapshot.take(self, checkpoint_id))
        return super().native_snapshot(checkpoint_id)

    @property
    def checkpoint_bytes_follow_change(self) -> bool:
        """True with the key-group format and deltas on: a checkpoint writes about what changed."""
        return self.native_format == LMDB_KEY_GROUP_FORMAT and super().checkpoint_bytes_follow_change

    def restore_native(self, handles: Sequence[NativeStateHandle]) -> None:
        """Restore native snapshots of any parallelism, of either format (full copies: ``_restore``)."""
        formats = {h.format for h in handles}
        if formats != {LMDB_NATIVE_FORMAT}:
            if LMDB_NATIVE_FORMAT in formats:
                raise SnapshotError(
                    f"the native LMDB snapshots to restore are in formats {sorted(formats)}, which one "
                    "restore cannot mix; restore from a savepoint (canonical) instead"
                )
            super().restore_native(handles)
            return
        plan = self.kv_plan_native_restore(handles, LMDB_NATIVE_FORMAT)
        if plan.base is not None:
            restore_instance(self, plan.parts, plan.ranges, plan.base)
        self.kv_finish_native_restore(plan)
        self.native_uploads.restored()  # a full copy holds no file a later snapshot references

    def native_meta(self) -> dict[str, Any]:
        """What a native snapshot taken now records besides its file (see docs/backends/lmdb.md)."""
        return {
            **self.kv_native_meta(),
            "database_prefix": DB_PREFIX.decode(),
            # LMDB data files hold native integers and pointers: only the same kind of machine reads them.
            "lmdb_version": list(lmdb.version()),
            "byteorder": sys.byteorder,
            "pointer_bits": 8 * struct.calcsize("P"),
        }

    def lmdb_replace_env(self, data_file: str) -> None:
        """Make the LMDB data file ``data_file`` (moved, not copied) the live environment.

        Raises:
            MapSizeLimitError: Before anything changes, if the file is larger than ``max-map-size``.
        """
        size = os.path.getsize(data_file)
        if size > self._lmdb_max_map:
            raise MapSizeLimitError(
                f"the native snapshot's LMDB data file is {size:,} bytes, more than "
                f"statekit.backend.lmdb.max-map-size ({self._lmdb_options['max-map-size']}); raise it"
            )
        self.lmdb_close_env()
        shutil.rmtree(self.db_path, ignore_errors=True)
        os.makedirs(self.db_path)
        os.replace(data_file, os.path.join(self.db_path, DATA_FILE))
        self.lmdb_open(max(int(self._lmdb_options["initial-map-size"]), 2 * size))

    def delete_range(self, name: str, lower: bytes, upper: bytes | None) -> None:
        """Delete every entry of state ``name`` with a key in ``[lower, upper)`` (upper None: to the end)."""
        col = self.kv_column(name, create=False)
        if col is None:
            return
        self.kv_write_column(col)
        start = lower
        while True:
            keys: list[bytes] = []
            for k, _ in col.iterate(start):
                if (upper is not None and k >= upper) or len(keys) >= BULK_CHUNK:
                    break
                keys.append(k)
            if keys:
                col.buffer.update(dict.fromkeys(keys))
                self.kv_flush([col])
            if len(keys) < BULK_CHUNK:
                return
            start = keys[-1]  # deleted now: the next read starts after it

    # --- life cycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the environment and delete the instance directory (live data, snapshots, downloads)."""
        if self._closed and self._lmdb_env is None:
            return
        super().close()
        try:
            self.lmdb_close_env()
            for col in self.kv_columns:
                col.close()
        finally:
            shutil.rmtree(self.instance_dir, ignore_errors=True)


class _PinnedFrozen:
    """A pinned read transaction as the base's frozen view: released by unpinning it."""

    __slots__ = ("backend", "view")

    def __init__(self, backend: LMDBKeyedStateBackend, view: PinnedView) -> None:
        self.backend = backend
        self.view = view

    def items(self, name: str, lower: bytes, upper: bytes | None) -> list[tuple[bytes, bytes]]:
        return self.view.items(name, lower, upper)

    def lookup(self, name: str, keys: list[bytes]) -> list[bytes | None]:
        return self.view.lookup(name, keys)

    def release(self) -> None:
        self.backend.lmdb_unpin(self.view)
