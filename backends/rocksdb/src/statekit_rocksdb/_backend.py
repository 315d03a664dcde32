"""The RocksDB keyed state backend: one RocksDB instance per subtask, one column family per state.

Every entry is stored under a composite key of the shared layout
(``statekit.backend_api.KeyLayout``), values as statekit's serializers encode
them (rocksdict's raw mode: the engine never pickles). Writes wait in a
buffer and reach RocksDB in WriteBatches (``_write_buffer``). Snapshots are
taken while processing goes on: canonical ones iterate RocksDB snapshots,
native ones are RocksDB checkpoints (hard links) uploaded incrementally
(``_incremental``); restores and rescales are in ``_restore``.
"""

from __future__ import annotations

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
    DBCompressionType,
    Options,
    Rdict,
    SstFileWriter,
    WriteBatch,
    WriteBufferManager,
    WriteOptions,
)

from statekit import VOID_NAMESPACE, KeyGroupRange, SnapshotError, StateAccessError, TypeSerializer
from statekit.backend_api import (
    Clock,
    KeyedBackendBase,
    KeyLayout,
    NativeStateHandle,
    OperatorStateBackendImpl,
    RegisteredState,
    StateEntries,
    StateKind,
    create_instance_dir,
    entry_codec,
    ttl_timestamp,
)

from ._handles import ListHandle, MapHandle, ValueHandle, scan
from ._incremental import RocksDBNativeSnapshot, UploadTracker
from ._plugin import OPTIONS
from ._write_buffer import StateColumn, WriteBuffer

__all__ = ["ROCKSDB_NATIVE_FORMAT", "RocksDBKeyedStateBackend", "RocksDBStateBackend"]

#: The native snapshot format: a RocksDB checkpoint's files (see docs/backends/rocksdb.md).
ROCKSDB_NATIVE_FORMAT = "statekit-rocksdb-1"
#: Column families of states are named ``state:<state name>``; ``default`` stays empty.
CF_PREFIX = "state:"
# Entries loaded at once above which a restore writes SST files and ingests them.
_INGEST_THRESHOLD = 20_000
_COMPRESSION = {
    "none": DBCompressionType.none,
    "lz4": DBCompressionType.lz4,
    "zstd": DBCompressionType.zstd,
    "snappy": DBCompressionType.snappy,
}


class _Closed:
    """Stands for the column family of a closed instance."""

    def __getattr__(self, name: str) -> Any:
        raise StateAccessError("the backend is closed")


_CLOSED: Any = _Closed()


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


class RocksDBStateBackend:
    """The ``rocksdb`` state backend: makes a RocksDB keyed backend per subtask.

    Example::

        LocalRunner(CountPerUrl, key_selector=..., config={
            "statekit.backend": "rocksdb",
            "statekit.backend.rocksdb.memory-budget": "256mb",
            "statekit.checkpoints.dir": "s3://bucket/checkpoints",
        })
    """

    name = "rocksdb"

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        """Takes the plugin's options by short name (defaults for those left out)."""
        opts = {o.name: o.default for o in OPTIONS}
        opts.update(options or {})
        self.options = opts
        self._engine: _Engine | None = None
        self._lock = threading.Lock()

    def _shared(self) -> _Engine:
        with self._lock:
            if self._engine is None:
                self._engine = _Engine(self.options)
            return self._engine

    def create_keyed_backend(
        self,
        *,
        key_serializer: TypeSerializer,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        clock: Callable[[], int] | None = None,
        key_cache_size: int = 131072,
        local_dir: str | None = None,
    ) -> RocksDBKeyedStateBackend:
        """A RocksDB instance for one subtask, in ``local-dir``, else ``local_dir``, else a temp dir."""
        return RocksDBKeyedStateBackend(
            key_serializer=key_serializer,
            key_group_range=key_group_range,
            max_parallelism=max_parallelism,
            clock=clock,
            key_cache_size=key_cache_size,
            local_dir=self.options["local-dir"] or local_dir,
            engine=self._shared(),
        )

    def create_operator_backend(self) -> OperatorStateBackendImpl:
        """Operator state is small and kept in memory, as in Flink."""
        return OperatorStateBackendImpl()


class RocksDBKeyedStateBackend(KeyedBackendBase):
    """Keyed state of one subtask in a RocksDB instance under its local directory.

    The instance lives in ``<local dir>/rocksdb-<random>/``: ``db/`` is the live
    database, ``chk-*`` are native snapshots waiting to be uploaded and
    ``restore-*`` downloads; all of it is deleted by :meth:`close`.
    """

    backend_name = "rocksdb"
    native_format = ROCKSDB_NATIVE_FORMAT

    def __init__(
        self,
        *,
        key_serializer: TypeSerializer,
        key_group_range: KeyGroupRange,
        max_parallelism: int,
        clock: Clock | None = None,
        key_cache_size: int = 131072,
        local_dir: str | None = None,
        engine: _Engine | None = None,
    ) -> None:
        super().__init__(
            key_serializer=key_serializer,
            key_group_range=key_group_range,
            max_parallelism=max_parallelism,
            clock=clock,
            key_cache_size=key_cache_size,
        )
        self._rocksdb_engine = engine or _Engine({o.name: o.default for o in OPTIONS})
        # Owned by this process; instances of killed processes in the same directory are removed.
        self.instance_dir = create_instance_dir(local_dir, "rocksdb-")
        self.layout = KeyLayout(max_parallelism)
        self._rocksdb_prefixes: dict[Any, bytes] = {}
        self._rocksdb_seq = 0
        self._rocksdb_columns: dict[str, StateColumn] = {}
        self._rocksdb_readers: dict[int, Any] = {}  # snapshots of pending canonical snapshots
        self._rocksdb_tokens: dict[int, object] = {}
        self._rocksdb_bulk: dict[str, list[tuple[bytes, bytes]]] | None = None
        self.uploads = UploadTracker()
        # States restored natively, not declared yet, whose full snapshots drop expired entries.
        self.restored_ttl_cleanup: dict[str, int] = {}
        self._rocksdb_db: Any = None
        self._rocksdb_families: set[str] = set()
        try:
            self.rocksdb_open(os.path.join(self.instance_dir, "db"))
        except BaseException:
            shutil.rmtree(self.instance_dir, ignore_errors=True)
            raise
        self._rocksdb_buffer = WriteBuffer(
            self._rocksdb_db,
            self._rocksdb_engine.write_options,
            int(self._rocksdb_engine.options["write-batch-size"]),
        )

    # --- the instance -----------------------------------------------------------------------

    @property
    def db_path(self) -> str:
        """The live database's directory."""
        return os.path.join(self.instance_dir, "db")

    def rocksdb_open(self, path: str) -> None:
        """Open (or create) the live database at ``path``; existing state columns bind to it."""
        opts = self._rocksdb_engine.db_options
        families = {}
        if os.path.exists(os.path.join(path, "CURRENT")):
            families = {name: opts() for name in Rdict.list_cf(path) if name != "default"}
        self._rocksdb_db = Rdict(path, opts(), column_families=families)
        self._rocksdb_families = {"default", *families}
        for col in self._rocksdb_columns.values():
            self._rocksdb_bind(col)
        if hasattr(self, "_rocksdb_buffer"):
            self._rocksdb_buffer = WriteBuffer(
                self._rocksdb_db, self._rocksdb_engine.write_options, self._rocksdb_buffer.limit
            )

    def _rocksdb_bind(self, col: StateColumn) -> None:
        db, cf_name = self._rocksdb_db, CF_PREFIX + col.name
        if cf_name in self._rocksdb_families:
            col.cf = db.get_column_family(cf_name)
        else:
            col.cf = db.create_column_family(cf_name, self._rocksdb_engine.db_options())
            self._rocksdb_families.add(cf_name)
        col.handle = db.get_column_family_handle(cf_name)

    def rocksdb_close_db(self) -> None:
        """Close the live database, releasing its files (buffered writes are dropped).

        Every reference to the instance goes (column families, snapshots of
        pending canonical snapshots), or RocksDB would keep its files open.
        """
        for frozen in self._rocksdb_readers.values():
            frozen.close()
        self._rocksdb_readers.clear()
        for col in self._rocksdb_columns.values():
            col.buffer.clear()
            cf, col.cf, col.handle = col.cf, _CLOSED, None
            if cf is not _CLOSED:
                cf.close()
        db, self._rocksdb_db = self._rocksdb_db, None
        if db is not None:
            db.close()

    def column(self, name: str, create: bool = True) -> StateColumn | None:
        """The column family of state ``name`` (created when missing and ``create``)."""
        col = self._rocksdb_columns.get(name)
        if col is None:
            if self._rocksdb_db is None:
                raise StateAccessError("the backend is closed")
            if not create and CF_PREFIX + name not in self._rocksdb_families:
                return None
            col = StateColumn(name, _CLOSED, None)
            self._rocksdb_bind(col)
            self._rocksdb_columns[name] = col
        return col

    def _col(self, name: str) -> StateColumn:
        col = self.column(name)
        assert col is not None
        return col

    def rocksdb_key_prefix(self) -> bytes:
        """Key group and length-prefixed key of the current key (cached per key)."""
        key = self._key
        p = self._rocksdb_prefixes.get(key)
        if p is None:
            if self._kg is None:
                raise StateAccessError("no current key: call set_current_key before using keyed state")
            p = self.layout.key_prefix(self._kg, self.current_key_bytes)
            if len(self._rocksdb_prefixes) >= self._key_cache_size:
                self._rocksdb_prefixes.clear()
            self._rocksdb_prefixes[key] = p
        return p

    def rocksdb_next_sequence(self) -> int:
        """A list element's sequence number: larger than every earlier one of this instance."""
        self._rocksdb_seq += 1
        return self._rocksdb_seq

    @property
    def sequence(self) -> int:
        """The last list sequence number handed out (kept in native snapshots)."""
        return self._rocksdb_seq

    @sequence.setter
    def sequence(self, value: int) -> None:
        self._rocksdb_seq = max(self._rocksdb_seq, value)

    def rocksdb_write_buffered(self) -> None:
        """Write every buffered update to RocksDB."""
        self._rocksdb_buffer.write(self._rocksdb_columns.values())

    def checkpoint_locally(self, kind: str) -> str:
        """Write buffered updates, flush every memtable, hard-link a RocksDB checkpoint; its directory."""
        self.rocksdb_write_buffered()
        for col in self._rocksdb_columns.values():
            col.cf.flush(True)
        directory = os.path.join(self.instance_dir, f"{kind}-{os.urandom(6).hex()}")
        Checkpoint(self._rocksdb_db).create_checkpoint(directory)
        return directory

    def engine_options(self) -> Options:
        """The rocksdict Options every column family and SST writer of this instance uses."""
        return self._rocksdb_engine.db_options()

    @property
    def db(self) -> Any:
        """The live rocksdict database (for tests and tools; writes bypass the buffer)."""
        return self._rocksdb_db

    # --- handles ------------------------------------------------------------------------------

    def _create_value(self, reg: RegisteredState) -> Any:
        return ValueHandle(self, self._col(reg.name), reg)

    def _create_list(self, reg: RegisteredState) -> Any:
        return ListHandle(self, self._col(reg.name), reg)

    def _create_map(self, reg: RegisteredState) -> Any:
        return MapHandle(self, self._col(reg.name), reg)

    # --- reading whole states -------------------------------------------------------------------

    def _entries_of(self, reg: RegisteredState) -> Iterator[tuple[bytes, bytes | None, list[bytes]]]:
        """``(key bytes, namespace bytes, raw units)`` per (key, namespace) of ``reg``, live."""
        col = self.column(reg.name, create=False)
        if col is None:
            return iter(())
        self._rocksdb_buffer.write_column(col)
        return _group(scan(col.cf, b""), self.layout, reg.storage_kind)

    def _state_keys(self, reg: RegisteredState, namespace: Any) -> Iterator[Any]:
        if namespace is VOID_NAMESPACE:
            want = None
        else:
            ser = reg.namespace_serializer
            if ser is None:
                return iter([])
            want = ser.serialize(namespace)
        des = self.key_serializer.deserialize
        return iter([des(k) for k, ns, _ in self._entries_of(reg) if ns == want])

    def _state_size(self, reg: RegisteredState) -> int:
        return sum(1 for _ in self._entries_of(reg))

    # --- canonical snapshots ---------------------------------------------------------------------

    def _snapshot_entries(self) -> Callable[[str, int], StateEntries]:
        # A hard-link checkpoint opened read-only: rocksdict's Snapshot objects serve point reads
        # at the snapshot but iterate the live data, so they cannot freeze a scan.
        frozen = _Frozen.take(self)
        layout, key_des = self.layout, self.key_serializer.deserialize
        readers = self._rocksdb_readers
        token = object()

        def read(name: str, kg: int) -> StateEntries:
            # Looked up each time: closing the backend closes the frozen copy.
            copy = readers.get(id(token))
            reg = self.registered_state(name)
            cf = None if copy is None else copy.families.get(name)
            if cf is None or reg is None:
                return [], [], []
            keys: list[Any] = []
            nss: list[Any] = []
            vals: list[Any] = []
            ns_des = reg.namespace_serializer.deserialize if reg.namespace_serializer else None
            codec = entry_codec(reg)
            dec, uk = codec.decode, codec.user_key
            kind = reg.storage_kind
            for kb, nsb, units in _group(scan(cf, layout.group_prefix(kg)), layout, kind):
                keys.append(key_des(kb))
                if nsb is None:
                    nss.append(VOID_NAMESPACE)
                else:
                    assert ns_des is not None
                    nss.append(ns_des(nsb))
                if kind is StateKind.VALUE:
                    vals.append(dec(units[0]))
                elif kind is StateKind.LIST:
                    vals.append([dec(u) for u in units[1::2]])
                else:
                    assert uk is not None
                    vals.append(
                        {uk.deserialize(units[i]): dec(units[i + 1]) for i in range(0, len(units), 2)}
                    )
            return keys, nss, vals

        readers[id(token)] = frozen
        self._rocksdb_tokens[id(read)] = token
        return read

    def _release_snapshot(self, reader: Callable[[str, int], StateEntries]) -> None:
        token = self._rocksdb_tokens.pop(id(reader), None)
        if token is not None:
            frozen = self._rocksdb_readers.pop(id(token), None)
            if frozen is not None:
                frozen.close()

    # --- restores from canonical snapshots -------------------------------------------------------

    def restore(self, handles: Sequence[Any]) -> None:
        """Restore canonical snapshots in bulk: entries sorted and ingested as SST files."""
        self._rocksdb_bulk = {}
        try:
            super().restore(handles)
            self.load_undeclared_states()  # native snapshots must hold every state
            self._rocksdb_ingest(self._rocksdb_bulk)
        finally:
            self._rocksdb_bulk = None

    def _load_entries(
        self, reg: RegisteredState, key_group: int, keys: list[Any], namespaces: list[Any], values: list[Any]
    ) -> None:
        layout, kser = self.layout, self.key_serializer.serialize
        ns_ser = reg.namespace_serializer
        codec = entry_codec(reg)
        enc, kind = codec.encode, reg.storage_kind
        out: list[tuple[bytes, bytes]] = []
        for k, ns, v in zip(keys, namespaces, values):
            prefix = layout.key_prefix(key_group, kser(k)) + layout.namespace_part(
                None if ns is VOID_NAMESPACE else ns_ser.serialize(ns)  # type: ignore[union-attr]
            )
            if kind is StateKind.VALUE:
                out.append((prefix, enc(v)))
            elif kind is StateKind.LIST:
                for el in v:
                    out.append((prefix + KeyLayout.sequence(self.rocksdb_next_sequence()), enc(el)))
            else:
                assert codec.user_key is not None
                uks = codec.user_key.serialize
                for uk, uv in v.items():
                    out.append((prefix + uks(uk), enc(uv)))
        if self._rocksdb_bulk is not None:
            self._rocksdb_bulk.setdefault(reg.name, []).extend(out)
        else:
            self._rocksdb_ingest({reg.name: out})

    def _rocksdb_ingest(self, entries: Mapping[str, list[tuple[bytes, bytes]]]) -> None:
        """Bulk-load sorted entries: an SST file ingested per state, or one WriteBatch when few."""
        small = WriteBatch(raw_mode=True)
        n_small = 0
        for name, items in entries.items():
            if not items:
                continue
            col = self._col(name)
            self._rocksdb_buffer.write_column(col)
            if len(items) < _INGEST_THRESHOLD:
                for k, v in items:
                    small.put(k, v, col.handle)
                n_small += len(items)
                continue
            items.sort()
            path = os.path.join(self.instance_dir, f"ingest-{os.urandom(6).hex()}.sst")
            writer = SstFileWriter(self._rocksdb_engine.db_options())
            writer.open(path)
            try:
                last = None
                for k, v in items:
                    if k != last:  # a key twice would be refused by the writer; the last one wins below
                        writer[k] = v
                    last = k
                writer.finish()
                col.cf.ingest_external_file([path])
            finally:
                if os.path.exists(path):
                    os.unlink(path)
        if n_small:
            self._rocksdb_db.write(small, self._rocksdb_engine.write_options)

    # --- native snapshots -------------------------------------------------------------------------

    def native_snapshot(self, checkpoint_id: int) -> RocksDBNativeSnapshot:
        """Freeze the instance now: flush and hard-link a RocksDB checkpoint; ``write`` uploads it."""
        if self._rocksdb_db is None:
            raise StateAccessError("the backend is closed")
        if self.undeclared_pending_states:
            raise SnapshotError(
                f"states {self.undeclared_pending_states} were restored with serializers that cannot be "
                "rebuilt from their configs and are not declared; declare them (get_state) before a native "
                "checkpoint, or set statekit.checkpoint.format=canonical"
            )
        return RocksDBNativeSnapshot.take(self, checkpoint_id)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Uploads of checkpoint ``checkpoint_id`` may be referenced from now on."""
        self.uploads.complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Uploads of checkpoint ``checkpoint_id`` are never referenced."""
        self.uploads.abort(checkpoint_id)

    def restore_native(self, handles: Sequence[NativeStateHandle]) -> None:
        """Restore RocksDB checkpoints of any parallelism; see ``_restore``."""
        from ._restore import restore_native

        restore_native(self, handles)

    def snapshot_states(self) -> list[dict[str, Any]]:
        """The snapshot entries of every state this instance holds (declared or restored)."""
        regs = (self.registered_state(n) for n in self.stored_state_names)
        return [r.meta() for r in regs if r is not None]

    def estimate_entries(self) -> int:
        """RocksDB's estimate of the number of entries (not of (key, namespace) pairs)."""
        total = 0
        for name in self.stored_state_names:
            col = self.column(name, create=False)
            if col is not None:
                total += int(col.cf.property_int_value("rocksdb.estimate-num-keys") or 0)
        return total

    # --- TTL: a bounded background sweep -----------------------------------------------------------

    def _ttl_hook(self, reg: RegisteredState) -> Callable[[], None] | None:
        ttl = reg.ttl
        if ttl is None or ttl.cleanup_incremental_size <= 0:
            return None
        interval = max(1, int(self._rocksdb_engine.options["ttl-sweep-interval"]))
        return _Sweep(self, reg.name, ttl.ttl_ms, interval, ttl.cleanup_incremental_size * interval)

    def full_snapshot_ttl(self) -> dict[str, int]:
        """TTL (ms) of every stored state whose expired entries full snapshots leave out."""
        out = {}
        for name in self.stored_state_names:
            reg = self._states.get(name)
            if reg is None:
                if name in self.restored_ttl_cleanup:
                    out[name] = self.restored_ttl_cleanup[name]
            elif reg.ttl is not None and reg.ttl.cleanup_full_snapshot:
                out[name] = reg.ttl.ttl_ms
        return out

    def delete_expired(self, name: str, ttl_ms: int, *, now: int) -> None:
        """Delete every unit of state ``name`` expired at ``now`` (a whole sweep of its column family)."""
        self.sweep_expired(name, ttl_ms, b"", 1 << 62, now=now)

    def sweep_expired(
        self, name: str, ttl_ms: int, start: bytes, budget: int, *, now: int | None = None
    ) -> bytes:
        """Check up to ``budget`` entries of state ``name`` from ``start``; delete the expired ones.

        Returns where the next sweep starts (wrapping around at the end). Works
        on every unit (a value, a list element, a map entry) by its timestamp,
        without deserializing it. RocksDB snapshots and checkpoints already
        taken are unaffected.
        """
        col = self.column(name, create=False)
        if col is None:
            return b""
        self._rocksdb_buffer.write_column(col)
        limit = (self.clock() if now is None else now) - ttl_ms  # expired when ts <= now - ttl
        batch = WriteBatch(raw_mode=True)
        deleted = checked = 0
        next_start = b""
        # From ``start`` to the end, then from the beginning up to ``start``: one lap at most.
        for lower, upper in ((start, None), (b"", start or None)):
            it = col.cf.iter()
            it.seek(lower)
            while it.valid():
                key = it.key()
                if upper is not None and key >= upper:
                    break
                if checked >= budget:
                    next_start = key
                    break
                if ttl_timestamp(it.value()) <= limit:
                    batch.delete(key, col.handle)
                    deleted += 1
                checked += 1
                it.next()
            del it
            if next_start or not start:
                break
        if deleted:
            self._rocksdb_db.write(batch, self._rocksdb_engine.write_options)
        return next_start

    # --- life cycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the instance and delete its directory (live database, snapshots, downloads)."""
        if self._closed and self._rocksdb_db is None:
            return
        super().close()
        try:
            self.rocksdb_close_db()
        finally:
            shutil.rmtree(self.instance_dir, ignore_errors=True)


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


class _Sweep:
    """Called on every access of a TTL state; every ``interval`` accesses, sweeps ``budget`` entries."""

    __slots__ = ("_backend", "_budget", "_count", "_cursor", "_interval", "_name", "_ttl_ms")

    def __init__(
        self, backend: RocksDBKeyedStateBackend, name: str, ttl_ms: int, interval: int, budget: int
    ) -> None:
        self._backend = backend
        self._name = name
        self._ttl_ms = ttl_ms
        self._interval = interval
        self._budget = budget
        self._count = 0
        self._cursor = b""

    def __call__(self) -> None:
        self._count += 1
        if self._count >= self._interval:
            self._count = 0
            self._cursor = self._backend.sweep_expired(self._name, self._ttl_ms, self._cursor, self._budget)


def _group(
    items: Iterator[tuple[bytes, bytes]], layout: KeyLayout, kind: StateKind
) -> Iterator[tuple[bytes, bytes | None, list[bytes]]]:
    """Group composite entries by (key, namespace): value units, or [suffix, unit, ...] pairs."""
    cur: tuple[bytes, bytes | None] | None = None
    units: list[bytes] = []
    split = layout.split
    value = kind is StateKind.VALUE
    for k, v in items:
        _, kb, nsb, suffix = split(k)
        if (kb, nsb) != cur:
            if cur is not None:
                yield cur[0], cur[1], units
            cur, units = (kb, nsb), []
        if value:
            units.append(v)
        else:
            units.append(suffix)
            units.append(v)
    if cur is not None:
        yield cur[0], cur[1], units
