"""The ordered key-value toolkit: what an engine with ordered keys builds on, beyond ``backend_api``.

Read ``docs/writing-a-backend.md`` (ordered key-value engines). An engine with
column families or named databases subclasses :class:`OrderedKVBackendBase`
(``kv_bind``, ``kv_write``, ``kv_load``, ``kv_freeze``); an engine with one key
space subclasses :class:`PrefixedKVBackendBase` (``kv_get``, ``kv_scan``,
``kv_apply``, ``kv_reader``). Either adds :class:`KeyGroupNativeSnapshots` for
native checkpoints in proportion to the change (the key-group files and deltas
of ``docs/snapshot-format.md``; options :data:`KEY_GROUP_NATIVE_OPTIONS`) and
declares :data:`ORDERED_KV_OPTIONS`. The
composite-key layout (:class:`KeyLayout`, :func:`entry_codec`, varints), the
native restore's plan (:class:`KVNativeRestore`, :class:`KVRestoreTarget`),
the instance directories of on-disk engines (:func:`create_instance_dir`,
:func:`local_write_error`) and in-place migrations (:class:`StateMigrationPlan`)
are here too. The contracts and the keyed base are in :mod:`statekit.backend_api`.
"""

from __future__ import annotations

from ._localdirs import OWNER_FILE, create_instance_dir, local_write_error, remove_stale_instance_dirs
from .state._kvcolumn import KVColumn
from .state._kvdelta import DELTA_FILE_MAGIC, KEY_GROUP_NATIVE_OPTIONS
from .state._kvlayout import (
    EntryCodec,
    KeyLayout,
    decode_varint,
    encode_varint,
    entry_codec,
    prefix_end,
    ttl_timestamp,
)
from .state._kvnative import KEY_GROUP_FILE_MAGIC, KeyGroupNativeSnapshots, KeyGroupSnapshot, KVFrozenView
from .state._kvprefixed import ORDERED_KV_OPTIONS, KVReader, PrefixedKVBackendBase, column_prefix
from .state._kvrestore import KVRestoreTarget
from .state._kvstate import (
    KVListState,
    KVMapState,
    KVNativeRestore,
    KVValueState,
    OrderedKVBackendBase,
    group_entries,
)
from .state._migration import DROP, MigrationProgress, StateMigrationPlan

__all__ = [
    "DELTA_FILE_MAGIC",
    "DROP",
    "KEY_GROUP_FILE_MAGIC",
    "KEY_GROUP_NATIVE_OPTIONS",
    "ORDERED_KV_OPTIONS",
    "OWNER_FILE",
    "EntryCodec",
    "KVColumn",
    "KVFrozenView",
    "KVListState",
    "KVMapState",
    "KVNativeRestore",
    "KVReader",
    "KVRestoreTarget",
    "KVValueState",
    "KeyGroupNativeSnapshots",
    "KeyGroupSnapshot",
    "KeyLayout",
    "MigrationProgress",
    "OrderedKVBackendBase",
    "PrefixedKVBackendBase",
    "StateMigrationPlan",
    "column_prefix",
    "create_instance_dir",
    "decode_varint",
    "encode_varint",
    "entry_codec",
    "group_entries",
    "local_write_error",
    "prefix_end",
    "remove_stale_instance_dirs",
    "ttl_timestamp",
]
