"""What backend and storage authors build on: the contracts, plugin specs, key groups, base classes.

Read ``docs/writing-a-backend.md`` first. The contracts a backend or a storage
fulfils are protocols (:class:`StateBackend`, :class:`KeyedStateBackend`,
:class:`OperatorStateBackend`, :class:`CheckpointStorage` and the optional
``Supports*`` abilities); a plugin registers its factories by name with a
:class:`BackendSpec` or :class:`StorageSpec` from a :func:`hookimpl`, and
declares its options as :class:`ConfigOption` objects. Key groups are Flink's
arithmetic (:class:`KeyGroupRange`, :func:`key_group_for_bytes`, ...).

A minimal backend subclasses :class:`KeyedBackendBase` and stores what it is
given; core adds the current key, TTL, reducing and aggregating state and
canonical snapshots. Its factory is a :class:`DeclaredStateBackend` (options
declared once, passed with the runner's :class:`KeyedBackendParameters`). A
backend on an ordered key-value engine subclasses :class:`OrderedKVBackendBase`
(with :class:`KeyGroupNativeSnapshots` for incremental native snapshots from
a frozen view, :class:`KVFrozenView`, and bulk loads); its own native restores are planned by
``kv_plan_native_restore`` (a :class:`KVNativeRestore`) and finished by
``kv_finish_native_restore``, in an instance directory made by
:func:`create_instance_dir`. Errors are in :mod:`statekit.errors`.
"""

from __future__ import annotations

from ._contracts import (
    CheckpointOutputStream,
    CheckpointStorage,
    CheckpointWriter,
    KeyedStateBackend,
    OperatorStateBackend,
    StateBackend,
    SupportsBatchUpdate,
    SupportsJobFiles,
    SupportsNativeSnapshot,
    SupportsOrphanCleanup,
    SupportsRunFencing,
)
from .plugins._config import CORE_OPTIONS, ConfigOption
from .plugins._registry import (
    BackendSpec,
    PluginLoadWarning,
    PluginRegistry,
    RegisteredPlugin,
    StorageSpec,
    hookimpl,
    hookspec,
)
from .runtime._localdirs import OWNER_FILE, create_instance_dir, local_write_error, remove_stale_instance_dirs
from .serialization._keygroups import (
    KeyGroupRange,
    compute_default_max_parallelism,
    key_group_for_bytes,
    key_group_range_for_operator,
    operator_index_for_key_group,
)
from .snapshots._native import (
    NativeFile,
    NativeSnapshot,
    NativeSnapshotOutput,
    NativeStateHandle,
    WriterNativeOutput,
    upload_native_file,
)
from .snapshots._snapshot import (
    CANONICAL_FORMAT,
    BytesStreamHandle,
    KeyedStateHandle,
    ProgressCallback,
    Section,
    SnapshotHeader,
    SnapshotWriteResult,
    StreamStateHandle,
    iter_blocks,
    read_block,
    read_header,
    read_index,
    write_canonical,
)
from .state._declared import DeclaredStateBackend
from .state._delta import DeltaChanges, DeltaKeyedBackendBase
from .state._keyed import (
    AggregatingStateImpl,
    KeyedBackendBase,
    ReducingStateImpl,
    merge_list_namespaces,
)
from .state._keyed_snapshots import REMOVED, KeyedSnapshot
from .state._kvcolumn import KVColumn
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
from .state._kvstate import (
    KVListState,
    KVMapState,
    KVNativeRestore,
    KVValueState,
    OrderedKVBackendBase,
    group_entries,
)
from .state._migration import DROP, MigrationProgress, StateMigrationPlan
from .state._operator import (
    BroadcastState,
    OperatorListState,
    OperatorStateBackendImpl,
    OperatorStateData,
    OperatorStateMode,
    decode_operator_snapshot,
    encode_operator_snapshot,
    redistribute_operator_state,
)
from .state._parameters import KeyedBackendParameters
from .state._registered import RegisteredState, StateEntries
from .state._slots import SlotListState, SlotMapState, SlotState, SlotValueState
from .state._state import StateKind
from .state._ttl import Clock, purge_expired, system_clock, ttl_serializer
from .state._uploads import UploadTracker

__all__ = [
    "CANONICAL_FORMAT",
    "CORE_OPTIONS",
    "DROP",
    "KEY_GROUP_FILE_MAGIC",
    "OWNER_FILE",
    "REMOVED",
    "AggregatingStateImpl",
    "BackendSpec",
    "BroadcastState",
    "BytesStreamHandle",
    "CheckpointOutputStream",
    "CheckpointStorage",
    "CheckpointWriter",
    "Clock",
    "ConfigOption",
    "DeclaredStateBackend",
    "DeltaChanges",
    "DeltaKeyedBackendBase",
    "EntryCodec",
    "KVColumn",
    "KVFrozenView",
    "KVListState",
    "KVMapState",
    "KVNativeRestore",
    "KVValueState",
    "KeyGroupNativeSnapshots",
    "KeyGroupRange",
    "KeyGroupSnapshot",
    "KeyLayout",
    "KeyedBackendBase",
    "KeyedBackendParameters",
    "KeyedSnapshot",
    "KeyedStateBackend",
    "KeyedStateHandle",
    "MigrationProgress",
    "NativeFile",
    "NativeSnapshot",
    "NativeSnapshotOutput",
    "NativeStateHandle",
    "OperatorListState",
    "OperatorStateBackend",
    "OperatorStateBackendImpl",
    "OperatorStateData",
    "OperatorStateMode",
    "OrderedKVBackendBase",
    "PluginLoadWarning",
    "PluginRegistry",
    "ProgressCallback",
    "ReducingStateImpl",
    "RegisteredPlugin",
    "RegisteredState",
    "Section",
    "SlotListState",
    "SlotMapState",
    "SlotState",
    "SlotValueState",
    "SnapshotHeader",
    "SnapshotWriteResult",
    "StateBackend",
    "StateEntries",
    "StateKind",
    "StateMigrationPlan",
    "StorageSpec",
    "StreamStateHandle",
    "SupportsBatchUpdate",
    "SupportsJobFiles",
    "SupportsNativeSnapshot",
    "SupportsOrphanCleanup",
    "SupportsRunFencing",
    "UploadTracker",
    "WriterNativeOutput",
    "compute_default_max_parallelism",
    "create_instance_dir",
    "decode_operator_snapshot",
    "decode_varint",
    "encode_operator_snapshot",
    "encode_varint",
    "entry_codec",
    "group_entries",
    "hookimpl",
    "hookspec",
    "iter_blocks",
    "key_group_for_bytes",
    "key_group_range_for_operator",
    "local_write_error",
    "merge_list_namespaces",
    "operator_index_for_key_group",
    "prefix_end",
    "purge_expired",
    "read_block",
    "read_header",
    "read_index",
    "redistribute_operator_state",
    "remove_stale_instance_dirs",
    "system_clock",
    "ttl_serializer",
    "ttl_timestamp",
    "upload_native_file",
    "write_canonical",
]
