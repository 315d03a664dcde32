"""statekit's RocksDB backend: keyed state in RocksDB (rocksdict), incremental native checkpoints."""

from __future__ import annotations

from ._backend import (
    ROCKSDB_INSTANCES_FORMAT,
    ROCKSDB_NATIVE_FORMAT,
    RocksDBKeyedStateBackend,
    RocksDBStateBackend,
)

__all__ = [
    "ROCKSDB_INSTANCES_FORMAT",
    "ROCKSDB_NATIVE_FORMAT",
    "RocksDBKeyedStateBackend",
    "RocksDBStateBackend",
]
