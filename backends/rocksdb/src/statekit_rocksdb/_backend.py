"""The RocksDB keyed state backend: one RocksDB instance per subtask, one column family per state.

Every entry is stored under a composite key of the shared layout
(``statekit.ordered_kv.KeyLayout``), values as statekit's serializers encode
them (rocksdict's raw mode: the engine never pickles). Writes wait in a
buffer and reach RocksDB in WriteBatches. Snapshots are
taken while processing goes on: canonical ones iterate RocksDB snapshots,
native ones are RocksDB checkpoints (hard links) uploaded incrementally
(``_incremental``); restores and rescales are in ``_restore``. The handles, the
write buffer and what else every ordered key-value engine shares are core's
(``statekit.ordered_kv.OrderedKVBackendBase``).
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Cache,
    Checkpoint,
    DBCompactionStyle,
    DBCompressionType,
    Options,
    Rdict,
    SstFileWriter,
    WriteBatch,
    WriteBufferManager,
    WriteOptions,
)

from statekit.backend_api import DeclaredStateBackend, KeyedBackendParameters, StateEntries
from statekit.errors import StateAccessError
from statekit.ordered_kv import KVColumn, OrderedKVBackendBase, create_instance_dir, local_write_error
from statekit.snapshot_codec import NativeStateHandle

from ._incremental import RocksDBNativeSnapshot, UploadTracker
from ._layout import CF_PREFIX
from ._plugin import OPTIONS
from ._restore import restore_instance

__all__ = ["ROCKSDB_NATIVE_FORMAT", "RocksDBKeyedStateBackend", "RocksDBStateBackend"]

#: The native snapshot format: a RocksDB checkpoint's files (see docs/backends/rocksdb.md).
ROCKSDB_NATIVE_FORMAT = "statekit-rocksdb-1"
# Entries loaded at once above which a restore writes SST files and ingests them.
_INGEST_THRESHOLD = 20_000
# Entries (RocksDB's estimate) up to which a canonical snapshot copies the state into memory.
_COPY_THRESHOLD = 20_000
_COMPRESSION = {
    "none": DBCompressionType.none,
    "lz4": DBCompressionType.lz4,
    "zstd": DBCompressionType.zstd,
    "snappy": DBCompressionType.snappy,
}
# Sorted runs (memtable flushes and merged runs) of a state before universal compaction merges some.
_UNIVERSAL_RUNS = 8


class _Engine:
    """RocksDB settings shared by every instance one :class:`RocksDBStateBackend` makes.

    With ``memory-budget``, one block cache of that size is shared by all
    instances in the process, and a write buffer manager charges their
    memtables to it, so block cache and memtables together stay within the
    budget (RocksDB's "cost memtables to block cache").
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = dict(options)
        budget = options["memory-budget"]
        self.cache = Cache(int(budget if budget else options["block-cache-size"]))
        self.write_buffer_manager: WriteBufferManager | None = None
        write_buffer = int(options["write-buffer-size"])
        if budget:
            # Memtables may take half the budget, charged to the cache; one memtable at most
            # an eighth, so that flushes start well before the limit.
            self.write_buffer_manager = WriteBufferManager.new_write_buffer_manager_with_cache(
                int(budget) // 2, False, self.cache
            )
            write_buffer = min(write_buffer, max(1 << 20, int(budget) // 8))
        self.write_buffer_size = write_buffer
        self.write_options = WriteOptions()
        # A property at run time; rocksdict's stubs declare a method.
        self.write_options.disable_wal = not options["wal"]  # type: ignore[method-assign,assignment]

    def db_options(self) -> Options:
        """Options of an instance and of each of its column families."""
        o = Options(raw_mode=True)
        o.create_if_missing(True)
        o.create_missing_column_families(True)
        o.set_compression_type(_COMPRESSION[self.options["compression"]]())
        o.set_write_buffer_size(self.write_buffer_size)
        o.set_max_write_buffer_number(int(self.options["write-buffer-count"]))
        o.set_max_background_jobs(2)
        o.set_keep_log_file_num(2)
        if self.options["compaction-style"] == "universal":
            # See docs/backends/rocksdb.md, "Compaction": every checkpoint flushes a sorted run;
            # runs of similar size merge (size ratio) once there are this many, the whole state is
            # rewritten only when the newer runs outweigh the oldest twice (size amplification
            # 200 %, RocksDB's default), so a checkpoint uploads about what changed.
            o.set_compaction_style(DBCompactionStyle.universal())
            o.set_level_zero_file_num_compaction_trigger(_UNIVERSAL_RUNS)
            o.set_level_zero_slowdown_writes_trigger(3 * _UNIVERSAL_RUNS)
            o.set_level_zero_stop_writes_trigger(4 * _UNIVERSAL_RUNS)
        table = BlockBasedOptions()
        table.set_block_cache(self.cache)
        table.set_bloom_filter(10, False)
        if self.write_buffer_manager is not None:
            # Index and filter blocks count against the budget too.
            table.set_cache_index_and_filter_blocks(True)
            table.set_pin_l0_filter_and_index_blocks_in_cache(True)
            o.set_write_buffer_manager(self.write_buffer_manager)
        o.set_block_based_table_factory(table)
        return o


class RocksDBStateBackend(DeclaredStateBackend):
    """The ``rocksdb`` state backend: makes a RocksDB keyed backend per subtask.

    Example::

        LocalRunner(CountPerUrl, key_selector=..., config={
            "statekit.backend": "rocksdb",
            "statekit.backend.rocksdb.memory-budget": "256mb",
            "statekit.checkpoints.dir": "s3://bucket/checkpoints",
        })
    """

    name = "rocksdb"
    declared_options = OPTIONS

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        """Takes the plugin's options by short name (defaults for those left out)."""
        super().__init__(options)
        self._engine: _Engine | None = None
        self._lock = threading.Lock()

    def _shared(self) -> _Engine:
        with self._lock:
            if self._engine is None:
                self._engine = _Engine(self.options)
            return self._engine

    def keyed_backend(self, parameters: KeyedBackendParameters, options: Mapping[str, Any]) -> Any:
        """A RocksDB instance for one subtask, in ``local-dir``, else ``local_dir``, else a temp dir.

        Every instance of this backend shares its engine settings (one block cache with ``memory-budget``).
        """
        return RocksDBKeyedStateBackend(parameters, engine=self._shared())


class RocksDBKeyedStateBackend(OrderedKVBackendBase):
    """Keyed state of one subtask in a RocksDB instance under its local directory.

    The instance lives in ``<local dir>/rocksdb-<random>/``: ``db/`` is the live
    database, ``chk-*`` are native snapshots waiting to be uploaded,
    ``snap-*`` the sources of pending canonical snapshots and ``restore-*``
    downloads; all of it is deleted by :meth:`close`. Handles, the write buffer,
    key listing, bulk loads and TTL sweeps are statekit's
    :class:`~statekit.ordered_kv.OrderedKVBackendBase`; this class binds them to
    column families.
    """

    backend_name = "rocksdb"
    native_format = ROCKSDB_NATIVE_FORMAT

    def __init__(self, parameters: KeyedBackendParameters, engine: _Engine | None = None) -> None:
        self._rocksdb_engine = engine or _Engine({o.name: o.default for o in OPTIONS})
        super().__init__(parameters, options=self._rocksdb_engine.options)
        local_dir = parameters.local_dir
        # Owned by this process; instances of killed processes in the same directory are removed.
        self.instance_dir = create_instance_dir(local_dir, "rocksdb-")
        self._rocksdb_frozen: dict[int, _Frozen] = {}  # sources of pending canonical snapshots
        self._rocksdb_tokens: dict[int, object] = {}
        self.uploads = UploadTracker()
        self._rocksdb_db: Any = None  # opened on first use: a backend that is only restored into
        self._rocksdb_families: set[str] = set()  # (or fails a check) never creates an empty one

    # --- the instance -----------------------------------------------------------------------

    @property
    def db_path(self) -> str:
        """The live database's directory."""
        return os.path.join(self.instance_dir, "db")

    @property
    def db(self) -> Any:
        """The live rocksdict database, opened if needed (for tests and tools; writes bypass the buffer)."""
        return self._rocksdb_live()

    def _rocksdb_live(self) -> Any:
        db = self._rocksdb_db
        if db is None:
            if self._closed:
                raise StateAccessError("the backend is closed")
            self.rocksdb_open(self.db_path)
            db = self._rocksdb_db
        return db

    def engine_options(self) -> Options:
        """The rocksdict Options every column family and SST writer of this instance uses."""
        return self._rocksdb_engine.db_options()

    def rocksdb_open(self, path: str) -> None:
        """Open (or create) the live database at ``path``; existing state columns bind to it."""
        opts = self._rocksdb_engine.db_options
        families = {}
        if os.path.exists(os.path.join(path, "CURRENT")):
            families = {name: opts() for name in Rdict.list_cf(path) if name != "default"}
        self._rocksdb_db = Rdict(path, opts(), column_families=families)
        self._rocksdb_families = {"default", *families}
        for col in self.kv_columns:
            self.kv_bind(col, True)

    def rocksdb_close_db(self) -> None:
        """Close the live database, releasing its files (buffered writes are dropped).

        Every reference to the instance goes (column families, the sources of
        pending canonical snapshots), or RocksDB would keep its files open.
        """
        for frozen in self._rocksdb_frozen.values():
            frozen.close()
        self._rocksdb_frozen.clear()
        for col in self.kv_columns:
            cf = col.engine[0] if col.engine else None
            col.close()
            if cf is not None:
                cf.close()
        db, self._rocksdb_db = self._rocksdb_db, None
        if db is not None:
            db.close()

    def checkpoint_locally(self, kind: str) -> str:
        """Write buffered updates, flush every memtable, hard-link a RocksDB checkpoint; its directory."""
        self.kv_write_buffered()
        db = self._rocksdb_live()
        directory = os.path.join(self.instance_dir, f"{kind}-{os.urandom(6).hex()}")
        with self._rocksdb_writing():
            for col in self.kv_columns:
                col.engine[0].flush(True)
            Checkpoint(db).create_checkpoint(directory)
        return directory

    @contextlib.contextmanager
    def _rocksdb_writing(self) -> Iterator[None]:
        """RocksDB's I/O errors (a full disk) become statekit's BackendIOError naming the directory."""
        try:
            yield
        except Exception as e:
            # rocksdict raises plain Exceptions carrying RocksDB's status text. After a failed
            # background flush RocksDB refuses every write with that same "IO error".
            text = str(e)
            if text.startswith("IO error") or "No space left on device" in text:
                raise local_write_error("rocksdb", self.instance_dir, e) from e
            raise

    # --- the engine under OrderedKVBackendBase ------------------------------------------------------

    def kv_bind(self, col: KVColumn, create: bool) -> bool:
        if self._rocksdb_db is None and not self._closed:
            # Never opened, so empty: the column reads as empty until the first write opens the
            # instance (backends that are only declared on and restored into never create one).
            if not create:
                return False
            col.engine, col.get, col.iterate = None, _empty_get, _empty_iterate
            return True
        db = self._rocksdb_live()
        cf_name = CF_PREFIX + col.name
        if cf_name in self._rocksdb_families:
            cf = db.get_column_family(cf_name)
        elif create:
            cf = db.create_column_family(cf_name, self._rocksdb_engine.db_options())
            self._rocksdb_families.add(cf_name)
        else:
            return False
        col.engine = (cf, db.get_column_family_handle(cf_name))
        col.get = cf.get
        col.iterate = functools.partial(_iterate, cf)
        return True

    def kv_write(self, columns: Sequence[KVColumn]) -> None:
        db = self._rocksdb_live()  # binds columns that waited for the first write
        batch = WriteBatch(raw_mode=True)
        for col in columns:
            handle = col.engine[1]
            put, delete = batch.put, batch.delete
            for k, v in col.buffer.items():
                if v is None:
                    delete(k, handle)
                else:
                    put(k, v, handle)
        with self._rocksdb_writing():
            db.write(batch, self._rocksdb_engine.write_options)

    def kv_load(self, name: str, items: list[tuple[bytes, bytes]]) -> None:
        """One WriteBatch for a few entries; else an SST file written and ingested (no write path)."""
        db = self._rocksdb_live()
        col = self.kv_column(name)
        assert col is not None
        cf, handle = col.engine
        if len(items) < _INGEST_THRESHOLD:
            batch = WriteBatch(raw_mode=True)
            for k, v in items:
                batch.put(k, v, handle)
            with self._rocksdb_writing():
                db.write(batch, self._rocksdb_engine.write_options)
            return
        path = os.path.join(self.instance_dir, f"ingest-{os.urandom(6).hex()}.sst")
        writer = SstFileWriter(self._rocksdb_engine.db_options())
        try:
            with self._rocksdb_writing():
                writer.open(path)
                for k, v in items:
                    writer[k] = v
                writer.finish()
                cf.ingest_external_file([path])
        finally:
            if os.path.exists(path):
                os.unlink(path)

    # --- canonical snapshots ---------------------------------------------------------------------

    def _snapshot_entries(self) -> Callable[[str, int], StateEntries]:
        self.kv_write_buffered()
        if self.estimate_entries() <= _COPY_THRESHOLD:
            return self._rocksdb_copy_entries()
        # A hard-link checkpoint opened read-only: rocksdict's Snapshot objects serve point reads
        # at the snapshot but iterate the live data, so they cannot freeze a scan.
        frozen_by_token = self._rocksdb_frozen
        token = object()
        frozen_by_token[id(token)] = _Frozen.take(self)
        group_prefix = self.layout.group_prefix

        def read(name: str, kg: int) -> StateEntries:
            # Looked up each time: closing the backend closes the frozen copy.
            frozen = frozen_by_token.get(id(token))
            cf = None if frozen is None else frozen.families.get(name)
            if cf is None:
                return [], [], []
            prefix = group_prefix(kg)
            n = len(prefix)
            return self.kv_read_group(
                name, itertools.takewhile(lambda kv: kv[0][:n] == prefix, _iterate(cf, prefix))
            )

        self._rocksdb_tokens[id(read)] = token
        return read

    def _rocksdb_copy_entries(self) -> Callable[[str, int], StateEntries]:
        """Small state: copied now (cheaper than a checkpoint opened read-only)."""
        copies: dict[str, tuple[list[bytes], list[tuple[bytes, bytes]]]] = {}
        for name in self.stored_state_names:
            col = self.kv_column(name, create=False)
            if col is not None:
                items = list(col.iterate(b""))
                copies[name] = ([k for k, _ in items], items)
        layout = self.layout

        def read(name: str, kg: int) -> StateEntries:
            keys, items = copies.get(name, ([], []))
            lower, upper = layout.group_range(kg, kg)
            lo = bisect.bisect_left(keys, lower)
            hi = len(keys) if upper is None else bisect.bisect_left(keys, upper, lo)
            return self.kv_read_group(name, items[lo:hi])

        return read

    def _release_snapshot(self, reader: Callable[[str, int], StateEntries]) -> None:
        token = self._rocksdb_tokens.pop(id(reader), None)
        if token is not None:
            frozen = self._rocksdb_frozen.pop(id(token), None)
            if frozen is not None:
                frozen.close()

    # --- native snapshots -------------------------------------------------------------------------

    def native_snapshot(self, checkpoint_id: int) -> RocksDBNativeSnapshot:
        """Freeze the instance now: flush and hard-link a RocksDB checkpoint; ``write`` uploads it."""
        self.check_native_snapshot()
        return self.track_snapshot(RocksDBNativeSnapshot.take(self, checkpoint_id))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Uploads of checkpoint ``checkpoint_id`` may be referenced from now on."""
        self.uploads.complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Uploads of checkpoint ``checkpoint_id`` are never referenced."""
        self.uploads.abort(checkpoint_id)

    def restore_native(self, handles: Sequence[NativeStateHandle]) -> None:
        """Restore RocksDB checkpoints of any parallelism; see ``_restore``."""
        plan = self.kv_plan_native_restore(handles, self.native_format)
        if plan.base is not None:
            restore_instance(self, plan.base, plan.parts, plan.ranges[id(plan.base)])
            # The base's SST files are the instance's own (same names, same bytes; a clip or an
            # ingest adds new files and compacts some away, which `take` forgets): referenced by
            # later checkpoints once the runner claims the restored checkpoint, else uploaded again.
            restored = {f.name: f for f in plan.base.files if f.shared and f.name.endswith(".sst")}
            self.uploads.restored(plan.base.checkpoint_id, restored)
        self.kv_finish_native_restore(plan)

    def native_meta(self) -> dict[str, Any]:
        """What a native snapshot taken now records besides its files (see docs/backends/rocksdb.md)."""
        # Range, list sequence, what a restore drops as a canonical snapshot taken now would, and the
        # exact entry counts the base keeps on write. Without those (restored from an older snapshot)
        # the handle's entries are RocksDB's estimate-num-keys, which counts every version of a key in
        # SST files not yet compacted together: tools label them an estimate (entries_estimated).
        estimated = self.kv_exact_entries() is None
        return {**self.kv_native_meta(), "column_family_prefix": CF_PREFIX, "entries_estimated": estimated}

    def estimate_entries(self) -> int:
        """The (key, namespace) entries: exact as the base counts them on write, else RocksDB's estimate."""
        exact = self.kv_exact_entries()
        if exact is not None:
            return exact
        total = 0
        for name in self.stored_state_names:
            col = self.kv_column(name, create=False)
            if col is not None and col.engine is not None:
                total += int(col.engine[0].property_int_value("rocksdb.estimate-num-keys") or 0)
        return total

    # --- life cycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the instance and delete its directory (live database, snapshots, downloads)."""
        if self._closed and not os.path.exists(self.instance_dir):
            return
        super().close()
        try:
            self.rocksdb_close_db()
        finally:
            shutil.rmtree(self.instance_dir, ignore_errors=True)


def _empty_get(key: bytes) -> bytes | None:
    return None


def _empty_iterate(start: bytes) -> Iterator[tuple[bytes, bytes]]:
    return iter(())


def _iterate(cf: Any, start: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Entries of a column family (or a read-only one) in key order from ``start``."""
    it = cf.iter()
    it.seek(start)
    while it.valid():
        yield it.key(), it.value()
        it.next()


class _Frozen:
    """A hard-link RocksDB checkpoint of the instance, opened read-only: a canonical snapshot's source."""

    def __init__(self, directory: str, db: Any, families: dict[str, Any]) -> None:
        self.directory = directory
        self.db = db
        self.families = families

    @classmethod
    def take(cls, backend: RocksDBKeyedStateBackend) -> _Frozen:
        names = backend.stored_state_names
        directory = backend.checkpoint_locally("snap")
        opts = backend.engine_options
        present = set(Rdict.list_cf(directory))
        cf_names = [CF_PREFIX + n for n in names if CF_PREFIX + n in present]
        db = Rdict(
            directory,
            opts(),
            column_families={n: opts() for n in present if n != "default"},
            access_type=AccessType.read_only(),
        )
        return cls(directory, db, {n[len(CF_PREFIX) :]: db.get_column_family(n) for n in cf_names})

    def close(self) -> None:
        for cf in self.families.values():
            cf.close()
        self.families.clear()
        if self.db is not None:
            self.db.close()
            self.db = None
        shutil.rmtree(self.directory, ignore_errors=True)
