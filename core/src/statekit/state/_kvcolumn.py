"""A state's column in an ordered key-value engine: reads bound by the engine, and a buffer of writes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .._errors import StateAccessError

__all__ = ["KNOWN_LIMIT", "KVColumn", "closed_error"]

#: Engine reads a column notes between writes, at most (a read-only stretch must not grow it).
KNOWN_LIMIT = 1 << 16

Get = Callable[[bytes], "bytes | None"]
Iterate = Callable[[bytes], Iterator[tuple[bytes, bytes]]]


class _ClosedBuffer(dict):  # type: ignore[type-arg]
    """The buffer of a closed column: every read or write raises StateAccessError naming the state."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise closed_error(self.name)

    get = __getitem__ = __setitem__ = __delitem__ = __contains__ = update = setdefault = pop = _refuse


def closed_error(name: str) -> StateAccessError:
    """The error of any access to state ``name`` after its backend closed."""
    return StateAccessError(
        f"state {name!r} is used after its backend was closed; a handle lives only as long as its "
        "backend (get the state again from a live backend)"
    )


class KVColumn:
    """One state's entries in the engine, and its buffer of pending writes (``None`` deletes).

    The engine binds ``get(key) -> bytes | None`` and ``iterate(start) ->``
    ``(key, value)`` pairs in key order from ``start`` to the end, both of
    the live data, without the buffer (see :meth:`OrderedKVBackendBase.kv_bind`).
    """

    __slots__ = ("absent", "buffer", "engine", "get", "grouped", "iterate", "known", "known_limit", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.buffer: dict[bytes, bytes | None] = {}
        #: Whether engine reads found keys, since the last write (see _kvcount: no lookup to count a
        #: write); forgotten (:meth:`forget_presence`) at each write and wherever the engine changes
        #: besides the write path (a read-only stretch, then a load, then blind writes).
        self.known: dict[bytes, bool] = {}
        #: The keys of ``known`` the engine does not hold (an entry appears where one is put).
        self.absent: set[bytes] = set()
        #: How many keys ``known`` notes at most (0: entries are not counted, nothing is noted).
        self.known_limit = KNOWN_LIMIT
        #: False: value entries only; True: lists or maps (groups of records); None: not known yet.
        self.grouped: bool | None = None
        self.get: Get = self._closed_get
        self.iterate: Iterate = self._closed_iterate
        self.engine: Any = None  # whatever the engine keeps per column (a handle, a database)

    def _closed_get(self, key: bytes) -> bytes | None:
        raise closed_error(self.name)

    def _closed_iterate(self, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        raise closed_error(self.name)

    @property
    def sealed(self) -> bool:
        """Whether :meth:`seal` ran: no access reaches the engine any more."""
        return isinstance(self.buffer, _ClosedBuffer)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Engine entries whose key starts with ``prefix`` (the buffer is not looked at)."""
        n = len(prefix)
        for k, v in self.iterate(prefix):
            if k[:n] != prefix:
                return
            yield k, v

    def forget_presence(self) -> None:
        """Forget which keys the engine holds: it changed besides the write path (a load, a restore)."""
        self.known.clear()
        self.absent.clear()

    def close(self) -> None:
        """Unbind from the engine (pending writes dropped) until ``kv_bind`` binds it again.

        Reads raise StateAccessError naming the state meanwhile. An engine that
        closes and reopens its database (a restore) closes its columns and binds
        them again; the backend's own close seals them (:meth:`seal`).
        """
        self.buffer.clear()
        self.forget_presence()
        self.get, self.iterate, self.engine = self._closed_get, self._closed_iterate, None

    def seal(self) -> None:
        """The backend closed: every later read or write raises StateAccessError naming the state.

        ``OrderedKVBackendBase.close`` seals every column before the engine
        releases what it holds, so no handle reaches a closed engine (a crash in
        engines that are C libraries). ``engine`` stays for the engine's own
        close; clearing the buffer stays allowed.
        """
        self.buffer = _ClosedBuffer(self.name)
        self.get, self.iterate = self._closed_get, self._closed_iterate
