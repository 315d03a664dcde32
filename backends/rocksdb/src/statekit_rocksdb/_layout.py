"""How states are laid out in RocksDB instances, and the native formats that carry them.

The live instances (``_backend``) create the families, and a restore
(``_restore``) finds them in downloaded instances by this prefix; both read it
here, and the formats.
"""

from __future__ import annotations

__all__ = ["CF_PREFIX", "INSTANCES_META", "ROCKSDB_INSTANCES_FORMAT", "ROCKSDB_NATIVE_FORMAT"]

#: Column families of states are named ``state:<state name>``; ``default`` stays empty.
CF_PREFIX = "state:"

#: The native snapshot format of a backend with one instance: a RocksDB checkpoint's files
#: (see docs/backends/rocksdb.md).
ROCKSDB_NATIVE_FORMAT = "statekit-rocksdb-1"

#: The native snapshot format of a backend holding several instances (after a rescale): each
#: instance's checkpoint files, named with the instance's prefix (``0-000012.sst``), and
#: ``meta["instances"]`` listing each prefix and the key groups the instance holds.
ROCKSDB_INSTANCES_FORMAT = "statekit-rocksdb-2"

#: The key of the meta entry that lists the instances of a ``statekit-rocksdb-2`` snapshot.
INSTANCES_META = "instances"
