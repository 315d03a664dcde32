"""The RocksDB keyed state backend: an instance per subtask (a few after a rescale), a family per state.

Every entry is stored under a composite key of the shared layout
(``statekit.ordered_kv.KeyLayout``), values as statekit's serializers encode
them (rocksdict's raw mode: the engine never pickles). Writes wait in a
buffer and reach RocksDB in WriteBatches. Snapshots are
taken while processing goes on: canonical ones iterate RocksDB snapshots,
native ones are RocksDB checkpoints (hard links) uploaded incrementally
(``_incremental``); restores and rescales are in ``_restore``. A rescale may
leave a subtask with several instances, each holding a contiguous part of its
key groups: every read, write, scan and snapshot goes to the instance that
holds the key's key group (:class:`_Instance`). The handles, the
write buffer and what else every ordered key-value engine shares are core's
(``statekit.ordered_kv.OrderedKVBackendBase``).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
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

from statekit.backend_api import DeclaredStateBackend, KeyedBackendParameters, KeyGroupRange, StateEntries
from statekit.errors import StateAccessError
from statekit.ordered_kv import KVColumn, OrderedKVBackendBase, create_instance_dir, local_write_error
from statekit.snapshot_codec import NativeStateHandle

from ._incremental import RocksDBNativeSnapshot, UploadTracker
from ._layout import CF_PREFIX, INSTANCES_META, ROCKSDB_INSTANCES_FORMAT, ROCKSDB_NATIVE_FORMAT
from ._plugin import OPTIONS
from ._restore import restore_instances

__all__ = [
    "ROCKSDB_INSTANCES_FORMAT",
    "ROCKSDB_NATIVE_FORMAT",
    "RocksDBKeyedStateBackend",
    "RocksDBStateBackend",
]
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


class _Instance:
    """One RocksDB database of a subtask and the key groups it holds: from ``start`` to the next one's start.

    A subtask holds one instance, or after a rescale a few (``_restore``): each
    an old subtask's instance clipped to the key groups the new one took from it.
    Old subtasks owned disjoint key groups, so each key group lives in exactly one.
    """

    __slots__ = ("db", "families", "lower", "path", "start")

    def __init__(self, path: str, start: int, lower: bytes) -> None:
        self.path = path
        #: The first key group it holds, and the smallest composite key of that key group.
        self.start = start
        self.lower = lower
        self.db: Any = None
        self.families: set[str] = set()

    def open(self, opts: Callable[[], Options]) -> None:
        """Open (or create) the database; its existing column families too."""
        families = {}
        if os.path.exists(os.path.join(self.path, "CURRENT")):
            families = {name: opts() for name in Rdict.list_cf(self.path) if name != "default"}
        self.db = Rdict(self.path, opts(), column_families=families)
        self.families = {"default", *families}

    def close(self) -> None:
        db, self.db = self.db, None
        if db is not None:
            db.close()


class RocksDBKeyedStateBackend(OrderedKVBackendBase):
    """Keyed state of one subtask in a RocksDB instance (a few after a rescale) under its local directory.

    The instance lives in ``<local dir>/rocksdb-<random>/``: ``db/`` is the live
    database (after a rescale, ``db-1/``, ``db-2/`` ... hold the key groups from
    the next instance's start on), ``chk-*`` are native snapshots waiting to be
    uploaded, ``snap-*`` the sources of pending canonical snapshots and
    ``restore-*`` downloads; all of it is deleted by :meth:`close`. Handles, the
    write buffer, key listing, bulk loads and TTL sweeps are statekit's
    :class:`~statekit.ordered_kv.OrderedKVBackendBase`; this class binds them to
    column families, routing each key to the instance of its key group.
    """

    backend_name = "rocksdb"
    #: ``statekit-rocksdb-1`` with one instance, ``statekit-rocksdb-2`` with several (set by a restore).
    native_format = ROCKSDB_NATIVE_FORMAT
    #: Native formats restored: both.
    readable_native_formats = (ROCKSDB_NATIVE_FORMAT, ROCKSDB_INSTANCES_FORMAT)

    def __init__(self, parameters: KeyedBackendParameters, engine: _Engine | None = None) -> None:
        self._rocksdb_engine = engine or _Engine({o.name: o.default for o in OPTIONS})
        super().__init__(parameters, options=self._rocksdb_engine.options)
        local_dir = parameters.local_dir
        # Owned by this process; instances of killed processes in the same directory are removed.
        self.instance_dir = create_instance_dir(local_dir, "rocksdb-")
        self._rocksdb_frozen: dict[int, _Frozen] = {}  # sources of pending canonical snapshots
        self._rocksdb_tokens: dict[int, object] = {}
        self.uploads = UploadTracker()
        # Opened on first use: a backend that is only restored into (or fails a check) never creates one.
        self._rocksdb_instances = [
            _Instance(os.path.join(self.instance_dir, "db"), self.key_group_range.start, b"")
        ]
        self._rocksdb_bounds: list[bytes] = []  # the lower key of every instance but the first

    # --- the instances ----------------------------------------------------------------------

    @property
    def db_path(self) -> str:
        """The (first) live database's directory."""
        return self._rocksdb_instances[0].path

    @property
    def db(self) -> Any:
        """The (first) live rocksdict database, opened if needed (tests, tools; writes bypass the buffer)."""
        return self._rocksdb_live()[0].db

    @property
    def databases(self) -> list[tuple[KeyGroupRange, Any]]:
        """Every live rocksdict database and the key groups it holds, in key-group order (tests, tools)."""
        insts = self._rocksdb_live()
        ends = [i.start - 1 for i in insts[1:]] + [self.key_group_range.end]
        return [(KeyGroupRange.of(i.start, end), i.db) for i, end in zip(insts, ends)]

    def _rocksdb_live(self) -> list[_Instance]:
        insts = self._rocksdb_instances
        if insts[0].db is None:
            if self._closed:
                raise StateAccessError("the backend is closed")
            self.rocksdb_open([(i.path, i.start) for i in insts])
        return self._rocksdb_instances

    def engine_options(self) -> Options:
        """The rocksdict Options every column family and SST writer of this instance uses."""
        return self._rocksdb_engine.db_options()

    def rocksdb_open(self, instances: Sequence[tuple[str, int]]) -> None:
        """Open (or create) the live databases: ``(directory, first key group)`` each, in key-group order.

        The first starts at the subtask's first key group; each holds the key
        groups up to the next one's start. Existing state columns bind to them.
        """
        group_range = self.layout.group_range
        insts = [_Instance(path, start, group_range(start, start)[0]) for path, start in instances]
        if not insts or insts[0].start != self.key_group_range.start:
            raise StateAccessError(
                f"RocksDB instances {list(instances)} do not start at {self.key_group_range}"
            )
        opened: list[_Instance] = []
        try:
            for inst in insts:
                inst.open(self._rocksdb_engine.db_options)
                opened.append(inst)
        except BaseException:
            for inst in opened:
                inst.close()
            raise
        self._rocksdb_instances = insts
        self._rocksdb_bounds = [i.lower for i in insts[1:]]
        self.native_format = ROCKSDB_INSTANCES_FORMAT if len(insts) > 1 else ROCKSDB_NATIVE_FORMAT
        for col in self.kv_columns:
            self.kv_bind(col, True)

    def rocksdb_close_db(self) -> None:
        """Close the live databases, releasing their files (buffered writes are dropped).

        Every reference to an instance goes (column families, the sources of
        pending canonical snapshots), or RocksDB would keep its files open.
        """
        for frozen in self._rocksdb_frozen.values():
            frozen.close()
        self._rocksdb_frozen.clear()
        for col in self.kv_columns:
            pairs = col.engine or ()
            col.close()
            for cf, _ in pairs:
                cf.close()
        for inst in self._rocksdb_instances:
            inst.close()

    def checkpoint_locally(self, kind: str) -> tuple[str, list[tuple[str, str]]]:
        """Write buffered updates, flush every memtable, hard-link a RocksDB checkpoint of each instance.

        Returns the directory holding them, and each instance's file-name prefix
        in a native snapshot (none with one instance) with its checkpoint's
        directory, in key-group order.
        """
        self.kv_write_buffered()
        insts = self._rocksdb_live()
        directory = os.path.join(self.instance_dir, f"{kind}-{os.urandom(6).hex()}")
        out = []
        with self._rocksdb_writing():
            for col in self.kv_columns:
                for cf, _ in col.engine or ():
                    cf.flush(True)
            os.makedirs(directory)
            for i, inst in enumerate(insts):
                sub = os.path.join(directory, str(i))
                Checkpoint(inst.db).create_checkpoint(sub)
                out.append(("" if len(insts) == 1 else f"{i}-", sub))
        return directory, out

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
        if self._rocksdb_instances[0].db is None and not self._closed:
            # Never opened, so empty: the column reads as empty until the first write opens the
            # instance (backends that are only declared on and restored into never create one).
            if not create:
                return False
            col.engine, col.get, col.iterate = (), _empty_get, _empty_iterate
            return True
        insts = self._rocksdb_live()
        cf_name = CF_PREFIX + col.name
        if not create and not any(cf_name in i.families for i in insts):
            return False
        pairs = []
        for inst in insts:  # a state one old subtask never wrote has no column family in its instance
            if cf_name in inst.families:
                cf = inst.db.get_column_family(cf_name)
            else:
                cf = inst.db.create_column_family(cf_name, self._rocksdb_engine.db_options())
                inst.families.add(cf_name)
            pairs.append((cf, inst.db.get_column_family_handle(cf_name)))
        col.engine = tuple(pairs)
        if len(pairs) == 1:
            col.get = pairs[0][0].get
            col.iterate = functools.partial(_iterate, pairs[0][0])
        else:
            col.get = _routed_get(self._rocksdb_bounds, [cf.get for cf, _ in pairs])
            col.iterate = functools.partial(_iterate_routed, self._rocksdb_bounds, [cf for cf, _ in pairs])
        return True

    def kv_write(self, columns: Sequence[KVColumn]) -> None:
        insts = self._rocksdb_live()  # binds columns that waited for the first write
        bounds = self._rocksdb_bounds
        batches = [WriteBatch(raw_mode=True) for _ in insts]
        for col in columns:
            if not bounds:
                handle = col.engine[0][1]
                put, delete = batches[0].put, batches[0].delete
                for k, v in col.buffer.items():
                    if v is None:
                        delete(k, handle)
                    else:
                        put(k, v, handle)
                continue
            handles = [h for _, h in col.engine]
            route = bisect.bisect_right
            for k, v in col.buffer.items():
                i = route(bounds, k)
                if v is None:
                    batches[i].delete(k, handles[i])
                else:
                    batches[i].put(k, v, handles[i])
        # One batch per instance: each is atomic; a write that fails leaves the buffers to the next
        # attempt, which writes the same entries again.
        with self._rocksdb_writing():
            for inst, batch in zip(insts, batches):
                if not batch.is_empty():
                    inst.db.write(batch, self._rocksdb_engine.write_options)

    def kv_load(self, name: str, items: list[tuple[bytes, bytes]]) -> None:
        """One WriteBatch for a few entries; else an SST file written and ingested (no write path)."""
        insts = self._rocksdb_live()
        col = self.kv_column(name)
        assert col is not None
        bounds = self._rocksdb_bounds
        cuts = [0, *(bisect.bisect_left(items, (b,)) for b in bounds), len(items)]
        for i, inst in enumerate(insts):  # sorted entries: each instance's are a slice
            part = items[cuts[i] : cuts[i + 1]] if bounds else items
            if part:
                self._rocksdb_load(inst, col.engine[i], part)

    def _rocksdb_load(self, inst: _Instance, pair: tuple[Any, Any], items: list[tuple[bytes, bytes]]) -> None:
        cf, handle = pair
        if len(items) < _INGEST_THRESHOLD:
            batch = WriteBatch(raw_mode=True)
            for k, v in items:
                batch.put(k, v, handle)
            with self._rocksdb_writing():
                inst.db.write(batch, self._rocksdb_engine.write_options)
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
            cf = None if frozen is None else frozen.family(name, kg)
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
        readable = set(self.readable_native_formats)
        # Core checks one format; both of this backend's are read (``_restore`` reads their layouts).
        checked = [
            dataclasses.replace(h, format=ROCKSDB_NATIVE_FORMAT) if h.format in readable else h
            for h in handles
        ]
        plan = self.kv_plan_native_restore(checked, ROCKSDB_NATIVE_FORMAT)
        if plan.base is not None:
            restored = restore_instances(self, plan.parts)
            # The kept instances' SST files are the instances' own (same bytes, named as the next
            # snapshot names them; a clip or an ingest adds new files and compacts some away, which
            # `take` forgets): referenced by later checkpoints once the runner claims the restored
            # checkpoint, else uploaded again.
            self.uploads.restored(plan.base.checkpoint_id, restored)
        self.kv_finish_native_restore(plan)

    def native_meta(self) -> dict[str, Any]:
        """What a native snapshot taken now records besides its files (see docs/backends/rocksdb.md)."""
        # Range, list sequence, what a restore drops as a canonical snapshot taken now would, and the
        # exact entry counts the base keeps on write. Without those (restored from an older snapshot)
        # the handle's entries are RocksDB's estimate-num-keys, which counts every version of a key in
        # SST files not yet compacted together: tools label them an estimate (entries_estimated).
        estimated = self.kv_exact_entries() is None
        meta = {**self.kv_native_meta(), "column_family_prefix": CF_PREFIX, "entries_estimated": estimated}
        dbs = self.databases
        if len(dbs) > 1:  # statekit-rocksdb-2: each instance's files (named with its prefix) and key groups
            meta[INSTANCES_META] = [
                {"files": f"{i}-", "range": [r.start, r.end]} for i, (r, _) in enumerate(dbs)
            ]
        return meta

    def estimate_entries(self) -> int:
        """The (key, namespace) entries: exact as the base counts them on write, else RocksDB's estimate."""
        exact = self.kv_exact_entries()
        if exact is not None:
            return exact
        total = 0
        for name in self.stored_state_names:
            col = self.kv_column(name, create=False)
            if col is not None and col.engine:
                for cf, _ in col.engine or ():
                    total += int(cf.property_int_value("rocksdb.estimate-num-keys") or 0)
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


def _routed_get(bounds: list[bytes], gets: list[Callable[[bytes], Any]]) -> Callable[[bytes], Any]:
    """A point read of the instance holding the key: ``gets[i]`` holds keys from ``bounds[i - 1]`` on."""
    route = bisect.bisect_right

    def get(key: bytes) -> Any:
        return gets[route(bounds, key)](key)

    return get


def _iterate_routed(bounds: list[bytes], cfs: list[Any], start: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Entries of a column split over instances, in key order from ``start``.

    Each instance holds only its key groups (a restore clipped the rest away),
    and they follow each other in key order, so their scans are chained.
    """
    for cf in cfs[bisect.bisect_right(bounds, start) :]:
        yield from _iterate(cf, start)


class _Frozen:
    """Hard-link RocksDB checkpoints of the instances, opened read-only: a canonical snapshot's source."""

    def __init__(
        self, directory: str, starts: list[int], dbs: list[Any], families: list[dict[str, Any]]
    ) -> None:
        self.directory = directory
        self.starts = starts
        self.dbs = dbs
        self.families = families

    @classmethod
    def take(cls, backend: RocksDBKeyedStateBackend) -> _Frozen:
        names = backend.stored_state_names
        starts = [i.start for i in backend._rocksdb_live()]
        directory, parts = backend.checkpoint_locally("snap")
        opts = backend.engine_options
        frozen = cls(directory, starts, [], [])
        try:
            for _, sub in parts:
                present = set(Rdict.list_cf(sub))
                db = Rdict(
                    sub,
                    opts(),
                    column_families={n: opts() for n in present if n != "default"},
                    access_type=AccessType.read_only(),
                )
                frozen.dbs.append(db)
                frozen.families.append(
                    {n: db.get_column_family(CF_PREFIX + n) for n in names if CF_PREFIX + n in present}
                )
        except BaseException:
            frozen.close()
            raise
        return frozen

    def family(self, name: str, kg: int) -> Any:
        """The column family of state ``name`` in the instance holding key group ``kg`` (None: no entry)."""
        if not self.families:
            return None
        return self.families[bisect.bisect_right(self.starts, kg) - 1].get(name)

    def close(self) -> None:
        for families in self.families:
            for cf in families.values():
                cf.close()
        self.families = []
        for db in self.dbs:
            db.close()
        self.dbs = []
        shutil.rmtree(self.directory, ignore_errors=True)
