"""TTL on ordered key-value engines: bounded sweeps by timestamp, and what full snapshots leave out.

Engines without a compaction filter (rocksdict exposes none) clean expired
entries here: every ``ttl_sweep_interval`` accesses of a TTL state, a sweep
checks a bounded number of its units by their timestamps, without
deserializing them. A native restore drops what a full snapshot taken at the
same moment would have left out (:meth:`KVTtl.purge_as_of`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._kvcolumn import KVColumn
from ._kvlayout import ttl_timestamp
from ._registered import RegisteredState, full_snapshot_ttl
from ._ttl import Clock

__all__ = ["KVTtl"]


class KVTtl:
    """TTL cleanup of :class:`~statekit.state._kvstate.OrderedKVBackendBase`, its base, which sets these."""

    clock: Clock
    kv_ttl_sweep_interval: int
    restored_ttl_cleanup: dict[str, int]
    _states: dict[str, RegisteredState]

    if TYPE_CHECKING:

        @property
        def stored_state_names(self) -> list[str]:
            """The states whose entries the backend stores (the keyed base's)."""

        def kv_column(self, name: str, create: bool = True) -> KVColumn | None:
            """State ``name``'s column (the ordered base's)."""

        def kv_write_column(self, col: KVColumn) -> None:
            """Write ``col``'s buffer before it is read past (the ordered base's)."""

        def kv_flush(self, columns: Sequence[KVColumn]) -> None:
            """Count, write and clear columns' buffered updates (the ordered base's)."""

    def _ttl_hook(self, reg: RegisteredState) -> Callable[[], None] | None:
        ttl = reg.ttl
        if ttl is None or ttl.cleanup_incremental_size <= 0:
            return None
        interval = self.kv_ttl_sweep_interval
        return _Sweep(self, reg.name, ttl.ttl_ms, interval, ttl.cleanup_incremental_size * interval)

    def sweep_expired(
        self, name: str, ttl_ms: int, start: bytes, budget: int, *, now: int | None = None
    ) -> bytes:
        """Check up to ``budget`` entries of state ``name`` from ``start``; delete the expired ones.

        Returns where the next sweep starts. One lap at most: from ``start`` to
        the end, then from the beginning up to ``start``. Works on every unit
        (a value, a list element, a map entry) by its timestamp, without
        deserializing it. Snapshots already taken are unaffected.
        """
        col = self.kv_column(name, create=False)
        if col is None:
            return b""
        self.kv_write_column(col)
        limit = (self.clock() if now is None else now) - ttl_ms  # expired when ts <= now - ttl
        expired: list[bytes] = []
        checked = 0
        next_start = b""
        for lower, upper in ((start, None), (b"", start or None)):
            for key, raw in col.iterate(lower):
                if upper is not None and key >= upper:
                    break
                if checked >= budget:
                    next_start = key
                    break
                if ttl_timestamp(raw) <= limit:
                    expired.append(key)
                checked += 1
            if next_start or not start:
                break
        if expired:
            col.buffer.update(dict.fromkeys(expired))
            self.kv_flush([col])
        return next_start

    def delete_expired(self, name: str, ttl_ms: int, *, now: int) -> None:
        """Delete every unit of state ``name`` expired at ``now`` (one whole sweep)."""
        self.sweep_expired(name, ttl_ms, b"", 1 << 62, now=now)

    def full_snapshot_ttl(self) -> dict[str, int]:
        """TTL (ms) of every stored state whose expired entries full snapshots leave out."""
        return full_snapshot_ttl(self.stored_state_names, self._states, self.restored_ttl_cleanup)

    def purge_as_of(self, meta: dict[str, Any]) -> None:
        """After a native restore: drop what full-snapshot cleanup would have, as of the snapshot's time."""
        when = int(meta.get("time_ms", 0))
        for name, ttl_ms in (meta.get("ttl_cleanup") or {}).items():
            self.restored_ttl_cleanup[name] = int(ttl_ms)
            self.delete_expired(name, int(ttl_ms), now=when)


class _Sweep:
    """Called on every access of a TTL state; every ``interval`` accesses, sweeps ``budget`` entries."""

    __slots__ = ("_backend", "_budget", "_count", "_cursor", "_interval", "_name", "_ttl_ms")

    def __init__(self, backend: KVTtl, name: str, ttl_ms: int, interval: int, budget: int) -> None:
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
