"""A state's column in an ordered key-value engine: reads bound by the engine, and a buffer of writes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .._errors import StateAccessError

__all__ = ["KVColumn"]

Get = Callable[[bytes], "bytes | None"]
Iterate = Callable[[bytes], Iterator[tuple[bytes, bytes]]]


def _closed_get(key: bytes) -> bytes | None:
    raise StateAccessError("the backend is closed")


def _closed_iterate(start: bytes) -> Iterator[tuple[bytes, bytes]]:
    raise StateAccessError("the backend is closed")


class KVColumn:
    """One state's entries in the engine, and its buffer of pending writes (``None`` deletes).

    The engine binds ``get(key) -> bytes | None`` and ``iterate(start) ->``
    ``(key, value)`` pairs in key order from ``start`` to the end, both of
    the live data, without the buffer (see :meth:`OrderedKVBackendBase.kv_bind`).
    """

    __slots__ = ("buffer", "engine", "get", "iterate", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.buffer: dict[bytes, bytes | None] = {}
        self.get: Get = _closed_get
        self.iterate: Iterate = _closed_iterate
        self.engine: Any = None  # whatever the engine keeps per column (a handle, a database)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Engine entries whose key starts with ``prefix`` (the buffer is not looked at)."""
        n = len(prefix)
        for k, v in self.iterate(prefix):
            if k[:n] != prefix:
                return
            yield k, v

    def close(self) -> None:
        """Unbind: every later access raises StateAccessError; pending writes are dropped."""
        self.buffer.clear()
        self.get, self.iterate, self.engine = _closed_get, _closed_iterate, None
