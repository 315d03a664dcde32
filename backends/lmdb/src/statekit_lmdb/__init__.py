"""statekit's LMDB backend: keyed state in LMDB environments, MVCC snapshots, full native checkpoints."""

from __future__ import annotations

from ._backend import LMDB_NATIVE_FORMAT, LMDBKeyedStateBackend, LMDBStateBackend
from ._writes import MapSizeLimitError

__all__ = ["LMDB_NATIVE_FORMAT", "LMDBKeyedStateBackend", "LMDBStateBackend", "MapSizeLimitError"]
