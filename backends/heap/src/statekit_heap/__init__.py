"""statekit's heap backend: keyed state in memory, the embedded default."""

from __future__ import annotations

from ._backend import HeapKeyedStateBackend, HeapStateBackend

__all__ = ["HeapKeyedStateBackend", "HeapStateBackend"]
