"""Value, list and map handles over composite keys in one column family per state.

Layout (``statekit.backend_api.KeyLayout``): ``key group | key | namespace``
for a value; ``... | u64 sequence`` per list element, so ``add`` writes one
entry and never reads the list; ``... | user key`` per map entry, so ``get``,
``contains`` and ``put`` are point operations and iteration is a prefix scan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from statekit import VOID_NAMESPACE, StateAccessError
from statekit.backend_api import KeyLayout, RegisteredState, entry_codec, merge_list_namespaces

from ._write_buffer import StateColumn

if TYPE_CHECKING:
    from ._backend import RocksDBKeyedStateBackend

__all__ = ["ListHandle", "MapHandle", "ValueHandle", "scan"]

_VOID = KeyLayout.namespace_part(None)


def scan(cf: Any, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Every ``(key, value)`` of ``cf`` (a column family or a snapshot of one) starting with ``prefix``."""
    it = cf.iter()
    it.seek(prefix)
    n = len(prefix)
    while it.valid():
        k = it.key()
        if k[:n] != prefix:
            break
        yield k, it.value()
        it.next()


class _Handle:
    """The current key's entry of one state: its composite-key prefix, cached per key and namespace."""

    __slots__ = ("_b", "_col", "_decode", "_encode", "_key", "_ns", "_nsb", "_prefix", "_reg")

    def __init__(self, backend: RocksDBKeyedStateBackend, col: StateColumn, reg: RegisteredState) -> None:
        self._b = backend
        self._col = col
        self._reg = reg
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
        self._prefix = b.rocksdb_key_prefix() + self._nsb
        self._key = key
        return self._prefix

    def _get_raw(self, k: bytes) -> bytes | None:
        v = self._col.buffer.get(k, _MISSING)
        if v is _MISSING:
            return self._col.cf.get(k)  # type: ignore[no-any-return]
        return v  # type: ignore[return-value]

    def _put_raw(self, k: bytes, v: bytes | None) -> None:
        self._col.buffer[k] = v
        wb = self._b._rocksdb_buffer
        wb.pending += 1
        if wb.pending >= wb.limit:
            self._b.rocksdb_write_buffered()

    def _scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        self._b._rocksdb_buffer.write_column(self._col)
        return scan(self._col.cf, prefix)

    def _delete_prefix(self, prefix: bytes) -> None:
        for k, _ in list(self._scan(prefix)):
            self._put_raw(k, None)


_MISSING = object()
_NONE = object()


class ValueHandle(_Handle):
    """Value state: one entry per key and namespace."""

    __slots__ = ()

    def value(self) -> Any:
        raw = self._get_raw(self._entry())
        if raw is None:
            return self._reg.default_value()
        return self._decode(raw)

    def update(self, value: Any) -> None:
        k = self._entry()
        self._put_raw(k, None if value is None else self._encode(value))

    def clear(self) -> None:
        self._put_raw(self._entry(), None)

    def update_batch(self, keys: Iterable[Any], fn: Callable[[Any], Any]) -> list[Any]:
        """For each key in order, store ``fn(value)``; returns the stored values.

        The batched form of ``set_current_key(k); s.update(fn(s.value()))`` in
        one Python frame; leaves the last key current.
        """
        b = self._b
        prefixes = b._rocksdb_prefixes
        buf, get = self._col.buffer, self._col.cf.get
        nsb, dec, enc, default = self._nsb, self._decode, self._encode, self._reg.default_value
        wb = b._rocksdb_buffer
        out: list[Any] = []
        append = out.append
        key: Any = _NONE
        for key in keys:
            p = prefixes.get(key)
            if p is None:
                b.set_current_key(key)  # checks the key group; caches the prefix
                p = b.rocksdb_key_prefix()
            ck = p + nsb
            raw: Any = buf.get(ck, _MISSING)
            if raw is _MISSING:
                raw = get(ck)
            new = fn(default() if raw is None else dec(raw))
            buf[ck] = None if new is None else enc(new)
            append(new)
            wb.pending += 1
            if wb.pending >= wb.limit:
                b.rocksdb_write_buffered()
        if key is not _NONE:
            b.set_current_key(key)
        return out


class ListHandle(_Handle):
    """List state: an entry per element under a sequence suffix; appends never read the list."""

    __slots__ = ()

    def get(self) -> list[Any]:
        dec = self._decode
        return [dec(v) for _, v in self._scan(self._entry())]

    def _append(self, prefix: bytes, values: Sequence[Any]) -> None:
        enc, put, nxt = self._encode, self._put_raw, self._b.rocksdb_next_sequence
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


class MapHandle(_Handle):
    """Map state: an entry per user key; point reads and writes, iteration by prefix."""

    __slots__ = ("_uk",)

    def __init__(self, backend: RocksDBKeyedStateBackend, col: StateColumn, reg: RegisteredState) -> None:
        super().__init__(backend, col, reg)
        uk = entry_codec(reg).user_key
        assert uk is not None
        self._uk = uk

    def get(self, key: Any) -> Any:
        raw = self._get_raw(self._entry() + self._uk.serialize(key))
        return None if raw is None else self._decode(raw)

    def contains(self, key: Any) -> bool:
        return self._get_raw(self._entry() + self._uk.serialize(key)) is not None

    def put(self, key: Any, value: Any) -> None:
        self._put_raw(self._entry() + self._uk.serialize(key), self._encode(value))

    def put_all(self, entries: Any) -> None:
        prefix = self._entry()
        ser, enc = self._uk.serialize, self._encode
        for k, v in dict(entries).items():
            self._put_raw(prefix + ser(k), enc(v))

    def remove(self, key: Any) -> None:
        self._put_raw(self._entry() + self._uk.serialize(key), None)

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
        return next(self._scan(self._entry()), None) is None

    def clear(self) -> None:
        self._delete_prefix(self._entry())
