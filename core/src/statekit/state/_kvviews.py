"""The lifetime of an engine's frozen views: tracked, released before close, safe across threads.

A frozen view (:meth:`OrderedKVBackendBase.kv_freeze`) is read by a snapshot's
``write``, maybe on another thread, while the task goes on; the task's
``close()`` may come while that write is in progress. :class:`TrackedView`
wraps every view the base freezes, so that an engine need not:

- the base keeps every view not yet released, and releases them all in
  ``close()`` before the engine closes (no view outlives its engine);
- ``items()`` returns a list, read under the view's lock, and ``release()``
  takes the same lock: a release waits for an ``items()`` in progress on
  another thread, never frees what it reads;
- ``items()`` after the release raises :class:`~statekit.errors.SnapshotCancelledError`
  (the backend closed under the snapshot), ``release()`` again does nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from .._errors import SnapshotCancelledError

__all__ = ["TrackedView", "lookup"]


class TrackedView:
    """An engine's frozen view, released once, never while another thread reads it."""

    __slots__ = ("__weakref__", "_lock", "_owner", "_view")

    def __init__(self, view: Any, owner: set[TrackedView]) -> None:
        self._lock = threading.Lock()
        self._view: Any = view
        self._owner = owner
        owner.add(self)

    def items(self, name: str, lower: bytes, upper: bytes | None) -> list[tuple[bytes, bytes]]:
        """State ``name``'s entries in ``[lower, upper)`` of the view, in key order (a list)."""
        with self._lock:
            out: Iterable[tuple[bytes, bytes]] = self._live(name).items(name, lower, upper)
            return out if isinstance(out, list) else list(out)

    def lookup(self, name: str, keys: list[bytes]) -> list[bytes | None]:
        """The value of each of state ``name``'s ``keys`` in the view (None: absent), under one lock.

        The view's own ``lookup(name, keys)`` if it has one (point reads), else
        one ``items(name, key, key + b"\\x00")`` per key.
        """
        with self._lock:
            return lookup(self._live(name), name, keys)

    def _live(self, name: str) -> Any:
        """The engine's view, if not released (under the lock)."""
        if self._view is None:
            raise SnapshotCancelledError(
                f"state {name!r} is read from a frozen view that was released: its backend closed "
                "while the snapshot was being written, and close() cancelled it"
            )
        return self._view

    def release(self) -> None:
        """Let the engine reclaim the view: after any ``items()`` in progress; once."""
        with self._lock:
            view, self._view = self._view, None
        if view is not None:
            self._owner.discard(self)
            view.release()


def lookup(view: Any, name: str, keys: list[bytes]) -> list[bytes | None]:
    """Point reads of ``keys`` of state ``name`` in a view: its ``lookup`` if it has one, else ranges."""
    fast = getattr(view, "lookup", None)
    if fast is not None:
        return list(fast(name, keys))
    out: list[bytes | None] = []
    for k in keys:
        got = list(view.items(name, k, k + b"\x00"))
        out.append(got[0][1] if got and got[0][0] == k else None)
    return out
