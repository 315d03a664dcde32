"""An ordered engine with one key space: columns by name prefix over ``get``, ``scan`` and ``apply``.

Engines without column families or tables (LevelDB, an LSM file, Berkeley DB's
one B-tree, one SQLite table) keep each state's entries apart by a prefix in
front of every key: ``varint(len(name)) name`` (the UTF-8 name, length-first,
so no state's prefix starts another's). :class:`PrefixedKVBackendBase` does
that once, over four methods of the engine:

- ``kv_get(key)``: the value of ``key``, or None;
- ``kv_scan(lower, upper, limit)``: at most ``limit`` entries with
  ``lower <= key < upper`` (``upper`` None: to the end), in key order, as a list
  (the base reads in pages, so no cursor stays open while it writes);
- ``kv_apply(ops)``: ``(key, value)`` pairs, a None value deleting, in one
  atomic batch or transaction;
- ``kv_reader()``: the whole key space as it is now, unchanged by later
  ``kv_apply`` calls: an object with the same ``scan(lower, upper, limit)``
  and ``release()`` (an engine snapshot, an MVCC read transaction).

The base binds every column to them (prefixing keys in, stripping them out),
writes the buffer and bulk loads through ``kv_apply``, and makes the frozen
views snapshots read from ``kv_reader()``. Everything else is
:class:`~statekit.state._kvstate.OrderedKVBackendBase`'s: handles, the write
buffer, TTL sweeps, snapshots, restores, the instance directory
(``kv_dir_prefix``) and ``close`` (``kv_close`` closes the engine).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Protocol

from ..plugins._config import ConfigOption
from ._kvcolumn import KVColumn
from ._kvlayout import encode_varint, prefix_end
from ._kvstate import OrderedKVBackendBase

__all__ = ["ORDERED_KV_OPTIONS", "KVReader", "PrefixedKVBackendBase", "column_prefix"]

#: The options every ordered engine has, read by :class:`OrderedKVBackendBase`: declare them in
#: your plugin's options (``OPTIONS = (*ORDERED_KV_OPTIONS, ...your own)``), so users and the kit
#: can set them (``statekit.backend.<name>.write-batch-size``).
ORDERED_KV_OPTIONS: tuple[ConfigOption, ...] = (
    ConfigOption(
        "write-batch-size", int, 1024,
        "Updates kept in the backend's write buffer (read back from it) before they are written to "
        "the engine in one batch; also written at every snapshot and before a scan of the state.",
        minimum=1,
    ),
    ConfigOption(
        "ttl-sweep-interval", int, 1000,
        "Accesses of a TTL state between two background sweeps of its entries; each sweep checks "
        "cleanup_incremental_size x this many entries and deletes the expired ones.", minimum=1,
    ),
)  # fmt: skip

Scan = Callable[[bytes, "bytes | None", int], Sequence[tuple[bytes, bytes]]]


class KVReader(Protocol):
    """The engine's whole key space at one moment (``kv_reader``): what a frozen view reads."""

    def scan(self, lower: bytes, upper: bytes | None, limit: int) -> Sequence[tuple[bytes, bytes]]:
        """At most ``limit`` entries with ``lower <= key < upper`` (upper None: to the end), in key order."""

    def release(self) -> None:
        """The view is no longer read: end the engine snapshot or read transaction."""


def column_prefix(name: str) -> bytes:
    """The prefix of every key of state ``name``: ``varint(len(name)) name`` (UTF-8)."""
    raw = name.encode()
    return encode_varint(len(raw)) + raw


def _paged(
    scan: Scan, lower: bytes, upper: bytes | None, strip: int, page: int
) -> Iterator[tuple[bytes, bytes]]:
    """Entries in ``[lower, upper)`` in key order, ``page`` at a time, ``strip`` bytes cut off each key."""
    while True:
        rows = scan(lower, upper, page)
        for k, v in rows:
            yield k[strip:], v
        if len(rows) < page:
            return
        lower = rows[-1][0] + b"\x00"  # the smallest key after the last one read


class _PrefixedView:
    """A frozen view of states in one key space: each state's entries, its prefix stripped."""

    def __init__(self, reader: KVReader, page: int) -> None:
        self._reader = reader
        self._page = page

    def items(self, name: str, lower: bytes, upper: bytes | None) -> list[tuple[bytes, bytes]]:
        p = column_prefix(name)
        hi = prefix_end(p) if upper is None else p + upper
        return list(_paged(self._reader.scan, p + lower, hi, len(p), self._page))

    def release(self) -> None:
        self._reader.release()


class PrefixedKVBackendBase(OrderedKVBackendBase):
    """An ordered engine with one key space; implement ``kv_get``, ``kv_scan``, ``kv_apply``, ``kv_reader``.

    See the module docstring (and ``docs/writing-a-backend.md``, one key space)::

        class MyKeyedBackend(KeyGroupNativeSnapshots, PrefixedKVBackendBase):
            backend_name = "mydb"
            native_format = "mydb-kg-2"
            kv_dir_prefix = "mydb-"          # the base makes self.kv_dir and removes it at close

            def __init__(self, parameters, options):
                super().__init__(parameters, options=options)
                self._mydb = mydb.open(os.path.join(self.kv_dir, "db"))

            def kv_get(self, key): ...
            def kv_scan(self, lower, upper, limit): ...
            def kv_apply(self, ops): ...
            def kv_reader(self): ...
            def kv_close(self): self._mydb.close()
    """

    #: Entries read per ``kv_scan`` call when the base iterates.
    kv_page_size: ClassVar[int] = 512

    @abstractmethod
    def kv_get(self, key: bytes) -> bytes | None:
        """The value stored under ``key`` (a whole key: prefix included), or None."""

    @abstractmethod
    def kv_scan(self, lower: bytes, upper: bytes | None, limit: int) -> Sequence[tuple[bytes, bytes]]:
        """At most ``limit`` entries with ``lower <= key < upper`` (upper None: to the end), in key order."""

    @abstractmethod
    def kv_apply(self, ops: list[tuple[bytes, bytes | None]]) -> None:
        """Write ``(key, value)`` pairs, None deleting, in one atomic batch (keys are distinct)."""

    @abstractmethod
    def kv_reader(self) -> KVReader:
        """The key space now, whatever later writes do: ``scan(lower, upper, limit)`` and ``release()``."""

    def kv_bind(self, col: KVColumn, create: bool) -> bool:
        p = column_prefix(col.name)
        end = prefix_end(p)
        if not create and not self.kv_scan(p, end, 1):
            return False  # no entry: the state has no "column" yet
        get, scan, page, n = self.kv_get, self.kv_scan, self.kv_page_size, len(p)

        def read(key: bytes) -> bytes | None:
            return get(p + key)

        def iterate(start: bytes) -> Iterator[tuple[bytes, bytes]]:
            return _paged(scan, p + start, end, n, page)

        col.get, col.iterate = read, iterate
        return True

    def kv_write(self, columns: Sequence[KVColumn]) -> None:
        ops: list[tuple[bytes, Any]] = []
        for col in columns:
            p = column_prefix(col.name)
            ops.extend((p + k, v) for k, v in col.buffer.items())
        self.kv_apply(ops)

    def kv_load(self, name: str, items: list[tuple[bytes, bytes]]) -> None:
        p = column_prefix(name)
        self.kv_apply([(p + k, v) for k, v in items])

    def kv_freeze(self) -> _PrefixedView:
        return _PrefixedView(self.kv_reader(), self.kv_page_size)
