"""Registers the ``lmdb`` backend. Kept light: the lmdb binding loads only when a job uses it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from statekit.backend_api import BackendSpec, ConfigOption, hookimpl
from statekit.ordered_kv import KEY_GROUP_NATIVE_OPTIONS, ORDERED_KV_OPTIONS

OPTIONS = (
    ConfigOption(
        "local-dir", str, None,
        "Directory for the LMDB environments; unset: the directory the runner gives each subtask "
        "(statekit.local-dir, or Spark's local directories on Spark).",
    ),
    ConfigOption(
        "initial-map-size", int, 64 << 20,
        "Bytes of address space (LMDB map size) an environment starts with; the map grows by "
        "doubling when full, up to max-map-size. Reserved, not allocated: the file grows with the data.",
        byte_size=True, minimum=1,
    ),
    ConfigOption(
        "max-map-size", int, 1 << 40,
        "Bytes the map of one environment (one subtask's state) may grow to; beyond, writes fail "
        "with an error naming this option.", byte_size=True, minimum=1,
    ),
    ConfigOption(
        "sync", bool, False,
        "fsync the data file at every commit. Off by default: checkpoints are the durability.",
    ),
    ConfigOption(
        "metasync", bool, False,
        "fsync the meta page at every commit (only with sync). Off by default.",
    ),
    ConfigOption(
        "writemap", bool, False,
        "Write through a writable memory map instead of write(2): fewer copies, but the data file "
        "is preallocated (sparse) to the map size and stray writes can corrupt it.",
    ),
    ConfigOption(
        "readahead", bool, True,
        "Let the OS read ahead on the data file; turn off when the state is larger than memory "
        "and reads are random.",
    ),
    ORDERED_KV_OPTIONS[0],  # write-batch-size: one write transaction
    ConfigOption(
        "max-states", int, 256,
        "States (named databases) one environment may hold; LMDB's reader table gets a slot per "
        "state and 126 for pending snapshots.", minimum=1,
    ),
    ConfigOption(
        "native-format", str, "key-groups",
        "What a native checkpoint uploads: 'key-groups', one file per key group named by its SHA-256, "
        "then deltas of the changed keys (max-deltas, max-delta-ratio); 'full', one compact copy of the "
        "environment per checkpoint. Both are restored whatever this says.", choices=("key-groups", "full"),
    ),
    ORDERED_KV_OPTIONS[1],  # ttl-sweep-interval
    *KEY_GROUP_NATIVE_OPTIONS,  # max-deltas, max-delta-ratio: read by KeyGroupNativeSnapshots
)  # fmt: skip


@hookimpl
def statekit_register_backends(register: Callable[[Any], None]) -> None:
    """Register ``lmdb``."""
    register(
        BackendSpec(
            name="lmdb",
            factory="statekit_lmdb._backend:LMDBStateBackend",
            options=OPTIONS,
            description="Keyed state in LMDB on local disk (memory-mapped); incremental native checkpoints.",
        )
    )
