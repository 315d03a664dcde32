"""One key's entry in a restored section, found without decoding the section."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..serialization._lookup import column_finder, column_reader
from ..serialization._serializers import TypeSerializer
from ._snapshot import Section

__all__ = ["SectionLookup"]

#: Sections of at most this many keys are looked up in a dict of their decoded keys (a
#: delta's, mostly): cheaper than an index, and for keys of any type.
_DECODED_KEYS_MAX = 1024


class SectionLookup:
    """Finds the entry of one key in a void-namespace :class:`Section` without decoding its keys.

    For a backend that keeps restored key groups as their checked bytes and
    decodes one only when it must (the heap): a str key column is scanned by
    Arrow (about 0.46 ms for 125,000 keys) until an index pays, then indexed
    (about 13 ms, then 2.5 µs a lookup), an int column scanned in C (about
    0.6 ms), where decoding the key group costs a Python object and a dict
    insertion per entry (about 0.3 µs each). A value is read alone
    (64-bit ints and floats) or with the rest of its column, decoded on the
    first read. Keys known ahead are found together (:meth:`index_many`). Made by :meth:`of`.
    """

    __slots__ = ("_find", "_find_many", "_read", "_section", "_value_serializer")

    def __init__(
        self,
        section: Section,
        find: Callable[[Any], int],
        value_serializer: TypeSerializer,
        find_many: Callable[[Sequence[Any]], list[int]] | None = None,
    ) -> None:
        self._section = section
        self._find = find
        self._find_many = find_many
        self._value_serializer = value_serializer
        self._read: Callable[[int], Any] | None = None

    @classmethod
    def of(
        cls, section: Section, key_serializer: TypeSerializer, value_serializer: TypeSerializer
    ) -> SectionLookup | None:
        """A lookup over ``section``, or None when its keys cannot be searched undecoded.

        A section of at most 1,024 keys is looked up in a dict of its decoded
        keys (of any type). None for sections with namespaces other than the
        void one, and for larger key columns
        :func:`~statekit.serialization._lookup.column_finder` cannot search
        (keys that are not str or int; strings beyond ASCII, or numpy not
        loaded in this process; ints beyond 64 bits).

        Raises:
            SerializationError: If the key column is malformed.
        """
        if not section.in_void_namespace:
            return None
        if section.count <= _DECODED_KEYS_MAX:
            keys = key_serializer.decode_column(section.keys, section.count)
            positions = dict(zip(keys, range(len(keys))))
            return cls(section, lambda key: positions.get(key, -1), value_serializer)
        find = column_finder(key_serializer, section.keys, section.count)
        if find is None:
            return None
        return cls(section, find, value_serializer, find.many)

    @property
    def removal(self) -> bool:
        """True for a delta's removals: a key found here is gone."""
        return self._section.removal

    def index(self, key: Any) -> int:
        """The position of ``key`` in the section, -1 when it holds no entry of it."""
        return self._find(key)

    def index_many(self, keys: Sequence[Any]) -> list[int]:
        """:meth:`index` of each of ``keys``, found together (one pass over a large section's keys)."""
        many = self._find_many
        if many is None:
            find = self._find
            return [find(key) for key in keys]
        return many(keys)

    def value(self, i: int) -> Any:
        """The value at position ``i`` (of :meth:`index`); not for removal sections.

        Raises:
            SerializationError: If the value column cannot be decoded.
        """
        read = self._read
        if read is None:
            sec = self._section
            read = self._read = column_reader(self._value_serializer, sec.values, sec.count)
        return read(i)
