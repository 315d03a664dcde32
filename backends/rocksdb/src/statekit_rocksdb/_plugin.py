"""Registers the ``rocksdb`` backend. Kept light: rocksdict loads only when a job uses it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from statekit.backend_api import BackendSpec, ConfigOption, hookimpl
from statekit.ordered_kv import ORDERED_KV_OPTIONS

OPTIONS = (
    ConfigOption(
        "local-dir", str, None,
        "Directory for the RocksDB instances; unset: the directory the runner gives each subtask "
        "(statekit.local-dir, or Spark's local directories on Spark).",
    ),
    ConfigOption(
        "memory-budget", int, None,
        "Bytes that block cache and memtables of all instances of this backend in one process "
        "share (a block cache of this size, memtables charged to it); unset: block-cache-size and "
        "write buffers apply separately.", byte_size=True, minimum=1,
    ),
    ConfigOption("block-cache-size", int, 64 << 20, "Bytes of block cache (without memory-budget).",
                 byte_size=True),
    ConfigOption("write-buffer-size", int, 32 << 20, "Bytes of one memtable of one state.",
                 byte_size=True, minimum=1),
    ConfigOption("write-buffer-count", int, 2, "Memtables per state before writes stall.", minimum=1),
    ConfigOption(
        "compression", str, "lz4", "Block compression.", choices=("none", "lz4", "zstd", "snappy")
    ),
    ConfigOption(
        "compaction-style", str, "universal",
        "RocksDB's compaction: universal (few large rewrites: a checkpoint after a small change uploads "
        "about that change) or level (less space and fewer files to read, but every few checkpoints "
        "rewrite most of the state, which the next checkpoint uploads).",
        choices=("universal", "level"),
    ),
    ConfigOption(
        "wal", bool, False,
        "Write RocksDB's write-ahead log. Off by default: checkpoints are the durability.",
    ),
    *ORDERED_KV_OPTIONS,  # write-batch-size (a RocksDB WriteBatch), ttl-sweep-interval
)  # fmt: skip


@hookimpl
def statekit_register_backends(register: Callable[[Any], None]) -> None:
    """Register ``rocksdb``."""
    register(
        BackendSpec(
            name="rocksdb",
            factory="statekit_rocksdb._backend:RocksDBStateBackend",
            options=OPTIONS,
            description="Keyed state in RocksDB (rocksdict) on local disk; incremental native checkpoints.",
        )
    )
