"""What backend authors build on: the keyed backend base and its helpers.

Read ``docs/writing-a-backend.md`` first. A minimal backend subclasses
:class:`KeyedBackendBase` and stores what it is given; core adds the current
key, TTL, reducing and aggregating state and canonical snapshots. A backend
on an ordered key-value engine subclasses :class:`OrderedKVBackendBase`; its
native restores are planned by ``kv_plan_native_restore`` (a
:class:`KVNativeRestore`) and finished by ``kv_finish_native_restore``, in an
instance directory made by :func:`create_instance_dir`.
"""

from __future__ import annotations

from .runtime._localdirs import OWNER_FILE, create_instance_dir, local_write_error, remove_stale_instance_dirs
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
from .state._keyed import (
    AggregatingStateImpl,
    KeyedBackendBase,
    ReducingStateImpl,
    merge_list_namespaces,
)
from .state._keyed_snapshots import KeyedSnapshot
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
from .state._registered import RegisteredState, StateEntries
from .state._slots import SlotListState, SlotMapState, SlotState, SlotValueState
from .state._state import StateKind
from .state._ttl import Clock, purge_expired, system_clock, ttl_serializer

__all__ = [
    "CANONICAL_FORMAT",
    "DROP",
    "OWNER_FILE",
    "AggregatingStateImpl",
    "BroadcastState",
    "BytesStreamHandle",
    "Clock",
    "EntryCodec",
    "KVColumn",
    "KVListState",
    "KVMapState",
    "KVNativeRestore",
    "KVValueState",
    "KeyLayout",
    "KeyedBackendBase",
    "KeyedSnapshot",
    "KeyedStateHandle",
    "MigrationProgress",
    "NativeFile",
    "NativeSnapshot",
    "NativeSnapshotOutput",
    "NativeStateHandle",
    "OperatorListState",
    "OperatorStateBackendImpl",
    "OperatorStateData",
    "OperatorStateMode",
    "OrderedKVBackendBase",
    "ProgressCallback",
    "ReducingStateImpl",
    "RegisteredState",
    "Section",
    "SlotListState",
    "SlotMapState",
    "SlotState",
    "SlotValueState",
    "SnapshotHeader",
    "SnapshotWriteResult",
    "StateEntries",
    "StateKind",
    "StateMigrationPlan",
    "StreamStateHandle",
    "WriterNativeOutput",
    "create_instance_dir",
    "local_write_error",
    "decode_operator_snapshot",
    "decode_varint",
    "encode_varint",
    "entry_codec",
    "group_entries",
    "encode_operator_snapshot",
    "iter_blocks",
    "merge_list_namespaces",
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
