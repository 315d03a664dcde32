"""Keyed state on an ordered key-value engine: handles, buffered writes, scans, bulk loads, TTL sweeps.

Every ordered engine (RocksDB, LMDB, yours) stores state the same way, in the
layout of :mod:`statekit.state._kvlayout`: a value per key and namespace, a list
element per entry under a sequence suffix, a map entry per user key. What
differs is how bytes are read, written and frozen. :class:`OrderedKVBackendBase`
does the rest once:

- handles for value, list and map state on that layout; list appends never
  read the list, map operations are point operations, scans are prefix scans;
- a write buffer per state (reads see it), written to the engine every
  ``write_batch_size`` updates, before a scan of the state and at snapshots;
- key listing and entry counts, decoding a key group's entries for canonical
  snapshots, bulk loads of restored entries (sorted, per state);
- TTL: a bounded sweep over a state's entries by their timestamps (for
  engines without a compaction filter), and the purge a native restore needs
  to drop what full-snapshot cleanup would have (in ``_kvttl``, a base of
  :class:`OrderedKVBackendBase`).

An engine implements :meth:`OrderedKVBackendBase.kv_bind` (make a
:class:`KVColumn` read its column, table or database), :meth:`~OrderedKVBackendBase.kv_write`
(write columns' buffered updates in one batch or transaction) and
:meth:`~OrderedKVBackendBase.kv_load` (bulk-load sorted entries), plus
``_snapshot_entries`` over a frozen view (with :meth:`~OrderedKVBackendBase.kv_read_group`).
"""

from __future__ import annotations

import itertools
import shutil
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from .._errors import CorruptSnapshotError, StateAccessError
from .._localdirs import create_instance_dir
from ..serialization._keygroups import KeyGroupRange
from ..serialization._serializers import TypeSerializer
from ..snapshots._native import NativeStateHandle
from ._keyed import KeyedBackendBase, merge_list_namespaces
from ._kvcolumn import KVColumn, closed_error
from ._kvcount import ENTRY_COUNTS, EntryCounts
from ._kvlayout import KeyLayout, encode_varint, entry_codec, ttl_timestamp
from ._kvnative import KVFrozenView
from ._kvttl import KVTtl
from ._kvviews import TrackedView
from ._migration import DROP, StateMigrationPlan
from ._parameters import DEFAULT_KEY_CACHE_SIZE, KeyedBackendParameters
from ._registered import RegisteredState, StateEntries
from ._state import VOID_NAMESPACE, StateKind
from ._ttl import Clock

__all__ = [
    "KVListState",
    "KVMapState",
    "KVNativeRestore",
    "KVValueState",
    "OrderedKVBackendBase",
    "group_entries",
]

#: What a subclass of OrderedKVBackendBase must not define (besides the kv_* and _kv_* names).
KV_RESERVED = frozenset({"layout", "sequence"})

_VOID = KeyLayout.namespace_part(None)
_MISSING: Any = object()
_NONE: Any = object()


def group_entries(
    items: Iterable[tuple[bytes, bytes]], layout: KeyLayout, kind: StateKind
) -> Iterator[tuple[bytes, bytes | None, list[bytes]]]:
    """Group composite entries by (key, namespace): value units, or ``[suffix, unit, ...]`` pairs."""
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


class _Handle:
    """The current key's entry of one state: its composite-key prefix, cached per key and namespace."""

    __slots__ = ("_b", "_col", "_decode", "_encode", "_key", "_ns", "_nsb", "_prefix", "_reg", "_room")

    #: Bytes an entry adds after the namespace: a list element's sequence number.
    _suffix = 0

    def __init__(self, backend: OrderedKVBackendBase, col: KVColumn, reg: RegisteredState) -> None:
        self._b = backend
        self._col = col
        self._reg = reg
        self._room = self._suffix
        codec = entry_codec(reg)
        self._encode = codec.encode
        self._decode = codec.decode
        self._ns: Any = VOID_NAMESPACE
        self._nsb = _VOID
        self._key: Any = _NONE
        self._prefix = b""

    @property
    def current_namespace(self) -> Any:
        return self._ns

    def set_current_namespace(self, namespace: Any) -> None:
        if namespace is VOID_NAMESPACE:
            self._nsb = _VOID
        else:
            ser = self._reg.namespace_serializer
            if ser is None:
                raise StateAccessError(
                    f"state {self._reg.name!r} has no namespace serializer; pass namespace_serializer= "
                    "to get_state to use namespaces"
                )
            self._nsb = KeyLayout.namespace_part(ser.serialize(namespace))
        self._ns = namespace
        self._key = _NONE

    def _entry(self) -> bytes:
        """The composite key of the current key and namespace (without suffix)."""
        b = self._b
        key = b._key
        if key is self._key and key is not None:
            return self._prefix
        p = b.kv_key_prefix() + self._nsb
        limit = b.kv_max_key_size
        if limit is not None and len(p) + self._room > limit:
            raise b.kv_key_too_long(self._reg.name, len(p) + self._room)
        self._prefix = p
        self._key = key
        return p

    def _get_raw(self, k: bytes) -> bytes | None:
        v = self._col.buffer.get(k, _MISSING)
        if v is _MISSING:
            return self._col.get(k)
        return v  # type: ignore[no-any-return]

    def _put_raw(self, k: bytes, v: bytes | None) -> None:
        self._col.buffer[k] = v
        b = self._b
        b.kv_pending += 1
        if b.kv_pending >= b.kv_batch_size:
            b.kv_write_buffered()

    def _scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        self._b.kv_write_column(self._col)
        return self._col.scan(prefix)

    def _delete_prefix(self, prefix: bytes) -> None:
        for k, _ in list(self._scan(prefix)):
            self._put_raw(k, None)


class KVValueState(_Handle):
    """Value state: one entry per key and namespace."""

    __slots__ = ()

    # value() and update() are the hot path of a keyed stream (a key switch on every record):
    # the handle's cached entry, else the backend's cache of each key's entry in VOID_NAMESPACE.

    def value(self) -> Any:
        key = self._b._key
        k: bytes | None
        if key is self._key and key is not None:
            k = self._prefix
        else:
            k = self._b._kv_void.get(key) if self._nsb is _VOID else None
            if k is None:
                k = self._entry()
            else:
                self._key, self._prefix = key, k
        col = self._col
        raw = col.buffer.get(k, _MISSING)
        if raw is _MISSING:
            raw = col.get(k)
            known = col.known
            if len(known) < col.known_limit:  # the entry count's write needs no lookup (_kvcount)
                if raw is None:
                    known[k] = False
                    col.absent.add(k)
                else:
                    known[k] = True
        if raw is None:
            return self._reg.default_value()
        return self._decode(raw)

    def update(self, value: Any) -> None:
        b = self._b
        key = b._key
        k = self._prefix if key is self._key and key is not None else self._entry()
        self._col.buffer[k] = None if value is None else self._encode(value)
        b.kv_pending += 1
        if b.kv_pending >= b.kv_batch_size:
            b.kv_write_buffered()

    def clear(self) -> None:
        self._put_raw(self._entry(), None)

    def update_batch(self, keys: Iterable[Any], fn: Callable[[Any], Any]) -> list[Any]:
        """For each key in order, store ``fn(value)``; returns the stored values.

        The batched form of ``set_current_key(k); s.update(fn(s.value()))`` in
        one Python frame; leaves the last key current.
        """
        b = self._b
        prefixes = b._kv_prefixes
        col = self._col
        if col.sealed:
            raise closed_error(col.name)
        buf, known, absent, limit = col.buffer, col.known, col.absent, col.known_limit
        nsb, dec, enc, default = self._nsb, self._decode, self._encode, self._reg.default_value
        out: list[Any] = []
        append = out.append
        key: Any = _NONE
        for key in keys:
            p = prefixes.get(key)
            if p is None:
                b.set_current_key(key)  # checks the key group; caches the prefix
                p = b.kv_key_prefix()
            ck = p + nsb
            raw: Any = buf.get(ck, _MISSING)
            if raw is _MISSING:
                raw = col.get(ck)  # looked up each time: a write (by fn, too) may rebind it
                if len(known) < limit:
                    if raw is None:
                        known[ck] = False
                        absent.add(ck)
                    else:
                        known[ck] = True
            new = fn(default() if raw is None else dec(raw))
            buf[ck] = None if new is None else enc(new)
            append(new)
            b.kv_pending += 1
            if b.kv_pending >= b.kv_batch_size:
                b.kv_write_buffered()
        if key is not _NONE:
            b.set_current_key(key)
        return out


class KVListState(_Handle):
    """List state: an entry per element under a sequence suffix; appends never read the list."""

    __slots__ = ()
    _suffix = 8

    def get(self) -> list[Any]:
        dec = self._decode
        return [dec(v) for _, v in self._scan(self._entry())]

    def _append(self, prefix: bytes, values: Sequence[Any]) -> None:
        enc, put, nxt = self._encode, self._put_raw, self._b.kv_next_sequence
        for v in values:
            put(prefix + KeyLayout.sequence(nxt()), enc(v))

    @staticmethod
    def _checked(values: Iterable[Any], what: str) -> list[Any]:
        if values is None:
            raise ValueError(f"ListState.{what}(None): pass a list")
        out = list(values)
        if any(v is None for v in out):
            raise ValueError(f"ListState.{what}: elements cannot be None")
        return out

    def add(self, value: Any) -> None:
        if value is None:
            raise ValueError("ListState.add(None): cannot add None")
        self._append(self._entry(), (value,))

    def add_all(self, values: Iterable[Any]) -> None:
        checked = self._checked(values, "add_all")
        if checked:
            self._append(self._entry(), checked)

    def update(self, values: Iterable[Any]) -> None:
        checked = self._checked(values, "update")
        prefix = self._entry()
        self._delete_prefix(prefix)
        self._append(prefix, checked)

    def clear(self) -> None:
        self._delete_prefix(self._entry())

    def merge_namespaces(self, target: Any, sources: Sequence[Any]) -> None:
        merge_list_namespaces(self, target, sources)


class KVMapState(_Handle):
    """Map state: an entry per user key; point reads and writes, iteration by prefix."""

    __slots__ = ("_uk",)

    def __init__(self, backend: OrderedKVBackendBase, col: KVColumn, reg: RegisteredState) -> None:
        super().__init__(backend, col, reg)
        uk = entry_codec(reg).user_key
        assert uk is not None
        self._uk = uk

    def _fits(self, k: bytes) -> bool:
        limit = self._b.kv_max_key_size
        return limit is None or len(k) <= limit

    def _writable(self, k: bytes) -> bytes:
        if not self._fits(k):
            raise self._b.kv_key_too_long(self._reg.name, len(k))
        return k

    def get(self, key: Any) -> Any:
        k = self._entry() + self._uk.serialize(key)
        raw = self._get_raw(k) if self._fits(k) else None  # a key too long is never stored
        return None if raw is None else self._decode(raw)

    def contains(self, key: Any) -> bool:
        k = self._entry() + self._uk.serialize(key)
        return self._fits(k) and self._get_raw(k) is not None

    def put(self, key: Any, value: Any) -> None:
        self._put_raw(self._writable(self._entry() + self._uk.serialize(key)), self._encode(value))

    def put_all(self, entries: Any) -> None:
        prefix = self._entry()
        ser, enc = self._uk.serialize, self._encode
        encoded = [(self._writable(prefix + ser(k)), enc(v)) for k, v in dict(entries).items()]
        for k, v in encoded:  # every key checked before anything is written
            self._put_raw(k, v)

    def remove(self, key: Any) -> None:
        k = self._entry() + self._uk.serialize(key)
        if self._fits(k):
            self._put_raw(k, None)

    def _entries(self) -> list[tuple[Any, Any]]:
        prefix = self._entry()
        n = len(prefix)
        des, dec = self._uk.deserialize, self._decode
        return [(des(memoryview(k)[n:]), dec(v)) for k, v in self._scan(prefix)]

    def items(self) -> Iterator[tuple[Any, Any]]:
        return iter(self._entries())

    def keys(self) -> Iterator[Any]:
        return iter([k for k, _ in self._entries()])

    def values(self) -> Iterator[Any]:
        return iter([v for _, v in self._entries()])

    def is_empty(self) -> bool:
        return next(iter(self._scan(self._entry())), None) is None

    def clear(self) -> None:
        self._delete_prefix(self._entry())


@dataclass
class KVNativeRestore:
    """A checked native restore of an ordered key-value backend: what to load, and the best base.

    Made by :meth:`OrderedKVBackendBase.kv_plan_native_restore`, after every
    check and before any change; the engine loads ``parts`` (all overlap the
    backend's key groups) keeping only its own key groups
    (``layout.group_range(own.start, own.end)``), then calls
    :meth:`OrderedKVBackendBase.kv_finish_native_restore`, which also runs when
    there are no parts. Example (``restore_native`` of an engine)::

        plan = self.kv_plan_native_restore(handles, self.native_format)
        if plan.base is not None:
            own = self.key_group_range
            lower, upper = self.layout.group_range(own.start, own.end)
            for part in plan.parts:   # plan.base first, if the engine adopts it whole
                ...                   # download part.files (copy_to checks them), load [lower, upper)
        self.kv_finish_native_restore(plan)   # sequence, restored states, TTL as of the snapshots
        # and forget every referenceable upload: the next checkpoint uploads everything

    ``docs/writing-a-backend.md`` (native snapshots on an ordered engine) has the whole path.

    Attributes:
        metas: Each restored state's descriptor entry.
        parts: The snapshots holding key groups this backend owns.
        ranges: Each part's key groups, by ``id(part)``.
        base: The part sharing the most key groups with this backend (ties: the
            lowest start): the one worth adopting whole and clipping.
    """

    metas: dict[str, dict[str, Any]]
    parts: list[NativeStateHandle]
    ranges: dict[int, KeyGroupRange]
    base: NativeStateHandle | None

    def overlap(self, part: NativeStateHandle, own: KeyGroupRange) -> int:
        """How many of ``own``'s key groups ``part`` holds."""
        return len(self.ranges[id(part)].intersection(own))


class OrderedKVBackendBase(KVTtl, KeyedBackendBase):
    """A keyed backend on an ordered key-value engine (``docs/writing-a-backend.md``, ordered engines).

    Subclasses implement :meth:`kv_bind`, :meth:`kv_write`, :meth:`kv_load`,
    ``_snapshot_entries`` (use :meth:`kv_read_group` over a frozen view) and,
    for native snapshots, the :class:`~statekit.backend_api.SupportsNativeSnapshot`
    methods. Their own attributes take a prefix of their own (``_mydb_...``);
    the base's are ``kv_*`` and ``_kv_*``.

    Why it is over 400 lines: it is the documented base every ordered engine's
    author reads and subclasses; its docstrings are that documentation (about 325
    lines of code; TTL sweeps, columns, the layout and native key-group files are
    modules of their own).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse, when a backend class is defined, the ordered base's names ``layout`` and ``sequence``."""
        super().__init_subclass__(**kwargs)
        clash = sorted(name for name in vars(cls) if name in KV_RESERVED)
        if clash:
            raise TypeError(
                f"{cls.__qualname__} defines {', '.join(clash)}, which OrderedKVBackendBase uses (the "
                "composite key layout; the list sequence number that native restores set); rename yours with "
                "a prefix "
                f"of your backend's own (e.g. {(cls.backend_name or cls.__name__).lower()}_{clash[0]})"
            )

    def __init__(
        self,
        parameters: KeyedBackendParameters | None = None,
        /,
        *,
        options: Mapping[str, Any] | None = None,
        key_serializer: TypeSerializer | None = None,
        key_group_range: KeyGroupRange | None = None,
        max_parallelism: int | None = None,
        clock: Clock | None = None,
        key_cache_size: int = DEFAULT_KEY_CACHE_SIZE,
        write_batch_size: int | None = None,
        ttl_sweep_interval: int | None = None,
    ) -> None:
        """Take ``parameters`` (see KeyedBackendBase) and the base's options.

        ``options`` are the plugin's parsed options by short name: the base reads
        ``write-batch-size`` (updates buffered before ``kv_write``, default 1024)
        and ``ttl-sweep-interval`` (default 1000) when declared there; the
        keyword arguments of the same names win.
        """
        super().__init__(
            parameters,
            key_serializer=key_serializer,
            key_group_range=key_group_range,
            max_parallelism=max_parallelism,
            clock=clock,
            key_cache_size=key_cache_size,
        )
        opts = options or {}
        #: The plugin's options by short name, as given (what mixins such as KeyGroupNativeSnapshots read).
        self.kv_options: dict[str, Any] = dict(opts)
        #: Composite keys each state's buffered writes touched since the last native snapshot, or None
        #: while nothing asks (:class:`~statekit.ordered_kv.KeyGroupNativeSnapshots` sets a dict).
        self.kv_changes: dict[str, set[bytes]] | None = None
        if write_batch_size is None:
            write_batch_size = int(opts.get("write-batch-size", 1024))
        if ttl_sweep_interval is None:
            ttl_sweep_interval = int(opts.get("ttl-sweep-interval", 1000))
        self.layout = KeyLayout(self.max_parallelism)
        self.kv_batch_size = max(1, write_batch_size)
        self.kv_pending = 0  # updates buffered since the last write
        self.kv_ttl_sweep_interval = max(1, ttl_sweep_interval)
        #: States restored natively, not declared yet, whose full snapshots drop expired entries.
        self.restored_ttl_cleanup: dict[str, int] = {}
        self._kv_prefixes: dict[Any, bytes] = {}
        self._kv_void: dict[Any, bytes] = {}  # key -> its entry's key in VOID_NAMESPACE
        self._kv_seq = 0
        self._kv_columns: dict[str, KVColumn] = {}
        self._kv_bulk: dict[str, list[tuple[bytes, bytes]]] | None = None
        self._kv_views: set[TrackedView] = set()
        #: Exact (key, namespace) entries per state and key group, kept on write (_kvcount), unless
        #: the parameters turn counting off for this instance (``statekit.metrics.exact-entries``).
        self.kv_counts = EntryCounts(self.layout, enabled=self.parameters.exact_entries)
        #: The instance directory the base made (``kv_dir_prefix``) and ``close`` removes; else None.
        self.kv_dir: str | None = None
        if self.kv_dir_prefix:
            self.kv_dir = create_instance_dir(self.parameters.local_dir, self.kv_dir_prefix)

    #: Set it (``"mydb-"``) and the base makes the instance directory, ``<local_dir>/mydb-<random>``,
    #: as :attr:`kv_dir` before your ``__init__`` goes on, and removes it in ``close``
    #: (``create_instance_dir``: private, owned by this process, removed after a killed one).
    kv_dir_prefix: ClassVar[str] = ""

    # --- what the engine implements ----------------------------------------------------------------

    @abstractmethod
    def kv_bind(self, col: KVColumn, create: bool) -> bool:
        """Point ``col.get`` and ``col.iterate`` at the live data of state ``col.name``.

        Create its column (column family, named database) when missing and
        ``create``; return False when it is missing and not created.
        """

    @abstractmethod
    def kv_write(self, columns: Sequence[KVColumn]) -> None:
        """Write the buffered updates of ``columns`` (None deletes) in one batch (the base clears them)."""

    @abstractmethod
    def kv_load(self, name: str, items: list[tuple[bytes, bytes]]) -> None:
        """Bulk-load ``items`` (sorted, distinct keys) into state ``name``'s column (created if missing)."""

    def kv_freeze(self) -> KVFrozenView:
        """The engine's state now, as a view later writes do not change (the buffer is already written).

        Optional: implement it and the base snapshots canonically from it
        (``_snapshot_entries``), and :class:`~statekit.ordered_kv.KeyGroupNativeSnapshots`
        natively. ``items(name, lower, upper)`` returns state ``name``'s entries
        in ``[lower, upper)`` in key order, maybe from another thread (one at a
        time); ``release()`` ends the view. An engine snapshot, a read
        transaction, or a copy. Engines that implement ``_snapshot_entries``
        themselves need not.
        """
        raise NotImplementedError(
            f"{type(self).__name__} implements neither kv_freeze (a frozen view of the engine) nor "
            "_snapshot_entries; implement kv_freeze (docs/writing-a-backend.md, ordered engines)"
        )

    def _snapshot_entries(self) -> Callable[[str, int], StateEntries]:
        """A canonical snapshot's reader over :meth:`kv_freeze`'s view (taken now, buffer written first)."""
        self.kv_write_buffered()
        return _FrozenReader(self, self.kv_frozen())

    def _release_snapshot(self, reader: Callable[[str, int], StateEntries]) -> None:
        if isinstance(reader, _FrozenReader):
            reader.view.release()

    # --- columns, the current key, writes ----------------------------------------------------------

    @property
    def kv_columns(self) -> list[KVColumn]:
        """Every column opened so far."""
        return list(self._kv_columns.values())

    def kv_column(self, name: str, create: bool = True) -> KVColumn | None:
        """The column of state ``name`` (None if it has none and ``create`` is False)."""
        col = self._kv_columns.get(name)
        if col is None:
            if self._closed:
                raise closed_error(name)
            col = KVColumn(name)
            if not self.kv_counts.enabled:
                col.known_limit = 0  # nothing counted: reads note nothing either
            if not self.kv_bind(col, create):
                return None
            self._kv_columns[name] = col
        return col

    def _kv_col(self, name: str) -> KVColumn:
        col = self.kv_column(name)
        assert col is not None
        return col

    #: The longest key the engine stores (LMDB: 511 bytes); None: no limit. Handles refuse
    #: writes of longer keys with a clear error before anything is buffered.
    kv_max_key_size: int | None = None

    def kv_key_too_long(self, state: str, size: int) -> StateAccessError:
        """The error for an entry of ``state`` whose key would take ``size`` bytes."""
        return StateAccessError(
            f"an entry of state {state!r} needs a key of {size} bytes (key group, key, namespace and map "
            f"key together), but the {self.backend_name or 'this'} backend stores keys of at most "
            f"{self.kv_max_key_size} bytes; use shorter keys, namespaces or map keys, or a backend "
            "without this limit"
        )

    def kv_key_prefix(self) -> bytes:
        """Key group and length-prefixed key of the current key (cached per key)."""
        key = self._key
        p = self._kv_prefixes.get(key)
        if p is None:
            if self._kg is None:
                raise StateAccessError("no current key: call set_current_key before using keyed state")
            p = self.layout.key_prefix(self._kg, self.current_key_bytes)
            limit = self.kv_max_key_size
            if limit is not None and len(p) + 1 > limit:  # every entry adds a namespace byte at least
                raise StateAccessError(
                    f"key {key!r} takes {len(p) + 1} bytes with its key group and namespace, but the "
                    f"{self.backend_name or 'this'} backend stores keys of at most {limit} bytes; use "
                    "shorter keys, or a backend without this limit"
                )
            if len(self._kv_prefixes) >= self._key_cache_size:
                self._kv_prefixes.clear()
                self._kv_void.clear()
            self._kv_prefixes[key] = p
            self._kv_void[key] = p + _VOID
        return p

    def kv_next_sequence(self) -> int:
        """A list element's sequence number: larger than every earlier one of this instance."""
        self._kv_seq += 1
        return self._kv_seq

    @property
    def sequence(self) -> int:
        """The last list sequence number handed out (native snapshots keep it)."""
        return self._kv_seq

    @sequence.setter
    def sequence(self, value: int) -> None:
        self._kv_seq = max(self._kv_seq, value)

    def close(self) -> None:
        """Seal every column, release every frozen view, close the engine, remove the instance directory.

        In this order: pending snapshots are cancelled (the keyed base) and every
        column sealed, so a handle used afterwards raises StateAccessError naming
        its state, whatever it had buffered; every frozen view still held is
        released (after a read in progress on another thread); then
        :meth:`kv_close` closes the engine and :attr:`kv_dir`, if the base made
        it, is removed. Idempotent. An engine that overrides ``close`` instead
        calls this first (``super().close()``).
        """
        first = not self._closed
        super().close()
        for col in self._kv_columns.values():
            col.seal()
        self.kv_pending = 0
        self._kv_prefixes.clear()
        self._kv_void.clear()
        for view in list(self._kv_views):
            view.release()
        if first:
            try:
                self.kv_close()
            finally:
                if self.kv_dir is not None:
                    shutil.rmtree(self.kv_dir, ignore_errors=True)

    def kv_close(self) -> None:
        """Close the engine (optional): ``close`` calls it once, after sealing and releasing everything."""

    def kv_frozen(self) -> TrackedView:
        """:meth:`kv_freeze`'s view, tracked until released (``close`` releases what is left)."""
        return TrackedView(self.kv_freeze(), self._kv_views)

    def kv_write_buffered(self) -> None:
        """Write every buffered update to the engine (at snapshot points, and when the buffer is full)."""
        cols = [c for c in self._kv_columns.values() if c.buffer]
        if cols:
            self.kv_flush(cols)
        self.kv_pending = 0

    def kv_write_column(self, col: KVColumn) -> None:
        """Write one state's buffered updates (before a scan of it)."""
        if col.buffer:
            n = len(col.buffer)
            self.kv_flush([col])
            self.kv_pending = max(0, self.kv_pending - n)

    def kv_flush(self, columns: Sequence[KVColumn]) -> None:
        """Count what buffers change (:attr:`kv_counts`), note keys (:attr:`kv_changes`), write, clear.

        Every write of buffered updates the base makes goes through here; an
        engine that writes a buffer itself calls this, not ``kv_write``.
        """
        counts = self.kv_counts
        for col in columns:
            counts.before_write(col)
        changes = self.kv_changes
        if changes is not None:  # recorded before the write: one that raises is recorded again, harmlessly
            for col in columns:
                seen = changes.get(col.name)
                if seen is None:
                    changes[col.name] = set(col.buffer)
                else:
                    seen.update(col.buffer)
        self.kv_write(columns)
        for col in columns:  # the base clears them: a write that raised leaves them for the next attempt
            col.buffer.clear()

    # --- handles, keys, sizes ----------------------------------------------------------------------

    def _create_value(self, reg: RegisteredState) -> Any:
        col = self._kv_col(reg.name)
        col.grouped = False
        return KVValueState(self, col, reg)

    def _create_list(self, reg: RegisteredState) -> Any:
        col = self._kv_col(reg.name)
        col.grouped = True
        return KVListState(self, col, reg)

    def _create_map(self, reg: RegisteredState) -> Any:
        col = self._kv_col(reg.name)
        col.grouped = True
        return KVMapState(self, col, reg)

    def _kv_grouped(self, reg: RegisteredState) -> Iterator[tuple[bytes, bytes | None, list[bytes]]]:
        col = self.kv_column(reg.name, create=False)
        if col is None:
            return iter(())
        self.kv_write_column(col)
        return group_entries(col.iterate(b""), self.layout, reg.storage_kind)

    def _state_keys(self, reg: RegisteredState, namespace: Any) -> Iterator[Any]:
        if namespace is VOID_NAMESPACE:
            want = None
        else:
            ser = reg.namespace_serializer
            if ser is None:
                return iter([])
            want = ser.serialize(namespace)
        des = self.key_serializer.deserialize
        return iter([des(k) for k, ns, _ in self._kv_grouped(reg) if ns == want])

    def _state_size(self, reg: RegisteredState) -> int:
        return sum(1 for _ in self._kv_grouped(reg))

    def kv_read_group(self, name: str, items: Iterable[tuple[bytes, bytes]]) -> StateEntries:
        """Decode one key group's entries of state ``name`` (from a frozen view) for a canonical snapshot."""
        reg = self.registered_state(name)
        if reg is None:
            return [], [], []
        key_des = self.key_serializer.deserialize
        keys: list[Any] = []
        nss: list[Any] = []
        vals: list[Any] = []
        ns_des = reg.namespace_serializer.deserialize if reg.namespace_serializer else None
        codec = entry_codec(reg)
        dec, uk = codec.decode, codec.user_key
        kind = reg.storage_kind
        for kb, nsb, units in group_entries(items, self.layout, kind):
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
                vals.append({uk.deserialize(units[i]): dec(units[i + 1]) for i in range(0, len(units), 2)})
        return keys, nss, vals

    # --- restores from canonical snapshots: bulk loads ----------------------------------------------

    def restore(self, handles: Sequence[Any]) -> None:
        """Restore canonical snapshots in bulk: each state's entries sorted and loaded at once."""
        self._kv_bulk = {}
        try:
            super().restore(handles)
            self.load_undeclared_states()  # native snapshots must hold every state
            bulk, self._kv_bulk = self._kv_bulk, None
            for name, items in bulk.items():
                self._kv_load_sorted(name, items)
        finally:
            self._kv_bulk = None

    def _kv_load_sorted(self, name: str, items: list[tuple[bytes, bytes]]) -> None:
        if not items:
            return
        col = self._kv_col(name)
        self.kv_write_column(col)
        items.sort()
        # A key twice (a snapshot that held it twice) keeps the last occurrence.
        dedup = [kv for i, kv in enumerate(items) if i + 1 == len(items) or items[i + 1][0] != kv[0]]
        self.kv_counts.loaded(name, dedup)
        self.kv_load(name, dedup)
        col.forget_presence()  # loaded besides the write path

    def _load_entries(
        self, reg: RegisteredState, key_group: int, keys: list[Any], namespaces: list[Any], values: list[Any]
    ) -> None:
        layout = self.layout
        ns_ser = reg.namespace_serializer
        codec = entry_codec(reg)
        enc, kind = codec.encode, reg.storage_kind
        group = layout.group_prefix(key_group)
        nsp = [
            _VOID if ns is VOID_NAMESPACE else layout.namespace_part(ns_ser.serialize(ns))  # type: ignore[union-attr]
            for ns in namespaces
        ]
        prefixes = [
            group + encode_varint(len(kb)) + kb + n
            for kb, n in zip(map(self.key_serializer.serialize, keys), nsp)
        ]
        out: list[tuple[bytes, bytes]]
        if kind is StateKind.VALUE:
            out = list(zip(prefixes, map(enc, values)))
        elif kind is StateKind.LIST:
            nxt, seq = self.kv_next_sequence, KeyLayout.sequence
            out = [(p + seq(nxt()), enc(el)) for p, v in zip(prefixes, values) for el in v]
        else:
            assert codec.user_key is not None
            uks = codec.user_key.serialize
            out = [(p + uks(uk), enc(uv)) for p, v in zip(prefixes, values) for uk, uv in v.items()]
        limit = self.kv_max_key_size
        if limit is not None and out:
            longest = max(len(k) for k, _ in out)
            if longest > limit:
                raise self.kv_key_too_long(reg.name, longest)
        if self._kv_bulk is not None:
            self._kv_bulk.setdefault(reg.name, []).extend(out)
        else:
            self._kv_load_sorted(reg.name, out)

    # --- migrations of restored states ----------------------------------------------------------------

    #: Units rewritten per batch when a restored state is migrated in place.
    kv_migration_batch = 4096

    def _migrate_restored(
        self, restored: RegisteredState, reg: RegisteredState, plan: StateMigrationPlan
    ) -> None:
        """Rewrite every unit of a restored state in its new schema, in one pass over its column.

        Units keep their keys (map keys never change type), so each batch of
        units is read, converted and written back under the same keys; a unit
        the migration removes is deleted. Reads start after the last key of the
        previous batch, so no iterator lives across a write.
        """
        col = self.kv_column(reg.name, create=False)
        if col is None:
            return
        self.kv_write_column(col)
        dec = plan.unit_decoder.deserialize
        old_ttl = plan.old_ttl
        encode = entry_codec(reg).encode
        convert = plan.unit(self.clock())
        # No pass to count the entries first (it would read the whole column once more):
        # the total is known at the end.
        self._report_migration(reg.name, 0, None)
        done = 0
        start = b""
        batch = max(1, self.kv_migration_batch)
        while True:
            chunk = list(itertools.islice(col.iterate(start), batch))
            if not chunk:
                break
            buf = col.buffer
            for k, raw in chunk:
                try:
                    unit = (dec(memoryview(raw)[8:]), ttl_timestamp(raw)) if old_ttl else dec(raw)
                    new = convert(unit)
                    buf[k] = None if new is DROP else encode(new)
                except Exception as e:
                    buf.clear()
                    raise plan.failure(
                        self._kv_describe_entry(restored, k), e, "the state is partly rewritten"
                    ) from e
            self.kv_flush([col])
            done += len(chunk)
            if len(chunk) < batch:
                break
            self._report_migration(reg.name, done, None)
            start = chunk[-1][0] + b"\x00"  # the smallest key after the last one read
        self._report_migration(reg.name, done, done)

    def _kv_describe_entry(self, reg: RegisteredState, composite: bytes) -> str:
        """``key ..., namespace ...`` of a composite key, for messages (the bytes if they do not decode)."""
        try:
            kg, kb, nsb, _ = self.layout.split(composite)
            key = self.key_serializer.deserialize(kb)
            ns = ""
            if nsb is not None:
                ns = f", namespace {nsb!r}"
                if reg.namespace_serializer is not None:
                    ns = f", namespace {reg.namespace_serializer.deserialize(nsb)!r}"
            return f"key {key!r} (key group {kg}){ns}"
        except Exception:  # noqa: BLE001 - only a message is at stake
            return f"composite key {composite!r}"

    @staticmethod
    def kv_snapshot_range(handle: NativeStateHandle) -> KeyGroupRange:
        """The key groups the instance that took ``handle`` owned (``meta["range"]``, see kv_native_meta)."""
        try:
            start, end = handle.meta["range"]
            return KeyGroupRange.of(int(start), int(end))
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptSnapshotError(
                f"native {handle.backend} snapshot without a valid key-group range: {e}"
            ) from None

    def kv_plan_native_restore(
        self, handles: Sequence[NativeStateHandle], native_format: str
    ) -> KVNativeRestore:
        """Check a native restore (:meth:`check_native_restore`) and plan it; nothing is changed.

        When no part overlaps, the plan has no parts: call
        :meth:`kv_finish_native_restore` right away (it records the states).
        """
        metas = self.check_native_restore(handles, native_format)
        own = self.key_group_range
        parts = [h for h in handles if len(h.key_group_range.intersection(own))]
        ranges = {id(h): self.kv_snapshot_range(h) for h in parts}
        plan = KVNativeRestore(metas, parts, ranges, None)
        if parts:
            plan.base = max(parts, key=lambda h: (plan.overlap(h, own), -ranges[id(h)].start))
        return plan

    def kv_finish_native_restore(self, plan: KVNativeRestore) -> None:
        """After the engine loaded ``plan.parts``: sequence, states, and TTL as of the snapshots' time.

        Sets :attr:`sequence` above every part's, records the restored states
        (:meth:`adopt_native_states`: undeclared ones become known, their
        serializers rebuilt from their configs) and deletes what full-snapshot
        TTL cleanup would have left out at each snapshot's time (:meth:`purge_as_of`).
        It does not call :meth:`load_undeclared_states` (a native restore has
        nothing pending); the canonical :meth:`restore` does.
        """
        if plan.parts:
            self.sequence = max(int(h.meta.get("sequence", 0)) for h in plan.parts)
        # The entry counts of the owned key groups, before the purge below counts what it deletes.
        own = self.key_group_range
        names = {str(s["name"]) for h in plan.parts for s in h.states if isinstance(s, dict) and "name" in s}
        self.kv_counts.restored([h.meta for h in plan.parts], range(own.start, own.end + 1), names)
        for col in self._kv_columns.values():
            col.forget_presence()  # the engine loaded (and maybe clipped) the parts besides the write path
        # As a canonical snapshot taken at that moment would: no entry expired at snapshot time is restored.
        # First: a declared state whose TTL is turned off loses the timestamps the purge reads.
        for h in plan.parts:
            self.purge_as_of(h.meta)
        self.adopt_native_states(plan.metas)

    def kv_native_meta(self) -> dict[str, Any]:
        """What a native snapshot's meta needs from the base: sequence, snapshot time, TTL cleanup, range."""
        kgr = self.key_group_range
        meta: dict[str, Any] = {
            "range": [kgr.start, kgr.end],
            "sequence": self.sequence,
            "time_ms": self.clock(),
            "ttl_cleanup": self.full_snapshot_ttl(),
        }
        counts = self.kv_counts.meta(self.stored_state_names)
        if counts is not None:
            meta[ENTRY_COUNTS] = counts  # exact (key, namespace) entries per state and key group
        else:  # not counted (statekit.metrics.exact-entries=false, or unknown): tools label an estimate
            meta["entries_estimated"] = True
        return meta

    def kv_estimated_entries(self) -> int | None:
        """The engine's own cheap estimate of every stored state's entries, or None if it has none.

        Optional: what an instance that keeps no exact counts (``statekit.metrics.exact-entries``
        false) records in a key-group delta snapshot, labelled an estimate (no ``entry_counts``
        in its meta). None (the default) makes such an instance write whole key-group files,
        which count their entries as they go.
        """
        return None

    def kv_exact_entries(self) -> int | None:
        """Every stored state's (key, namespace) entries, exactly (buffered writes included); None if unknown.

        Kept on write (:mod:`._kvcount`), as Spark's RocksDB state store keeps
        ``numRowsTotal``; unknown after a native restore of a snapshot that
        recorded no counts (an older statekit's).
        """
        self.kv_write_buffered()
        exact = self.kv_counts.exact(self.stored_state_names)
        return None if exact is None else sum(exact.values())


class _FrozenReader:
    """The reader of a canonical snapshot: one key group of one state at a time, from a frozen view."""

    __slots__ = ("backend", "view")

    def __init__(self, backend: OrderedKVBackendBase, view: KVFrozenView) -> None:
        self.backend = backend
        self.view = view

    def __call__(self, name: str, kg: int) -> StateEntries:
        b = self.backend
        lower, upper = b.layout.group_range(kg, kg)
        return b.kv_read_group(name, self.view.items(name, lower, upper))
