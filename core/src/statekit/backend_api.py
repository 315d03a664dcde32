"""What every backend and storage author builds on: contracts, plugin specs, key groups, the keyed base.

Read ``docs/writing-a-backend.md`` first. The contracts a backend or a storage
fulfils are protocols (:class:`StateBackend`, :class:`KeyedStateBackend`,
:class:`OperatorStateBackend`, :class:`CheckpointStorage` and the optional
``Supports*`` abilities); a plugin registers its factories by name with a
:class:`BackendSpec` or :class:`StorageSpec` from a :func:`hookimpl`, and
declares its options as :class:`ConfigOption` objects. Key groups are Flink's
(:class:`KeyGroupRange`, :func:`key_group_for_bytes`).

A backend subclasses :class:`KeyedBackendBase` and stores what it is given
(its handles on :class:`SlotValueState`, :class:`SlotListState`,
:class:`SlotMapState`); core adds the current key, TTL, reducing and
aggregating state and canonical snapshots. Its factory is a
:class:`DeclaredStateBackend` (options declared once, passed with the
runner's :class:`KeyedBackendParameters`). Errors are in :mod:`statekit.errors`.

Two more rooms, for those who need them: :mod:`statekit.ordered_kv`, the
toolkit of ordered key-value engines (``OrderedKVBackendBase``,
``PrefixedKVBackendBase``, key-group native snapshots, the key layout,
instance directories), and :mod:`statekit.snapshot_codec`, the canonical
format's codec and native snapshots' handles. Runners' building blocks are
in :mod:`statekit.checkpointing`. The names this module held before it was
narrowed still import from here until statekit 0.2.0, with a
DeprecationWarning naming their home.
"""

from __future__ import annotations

import importlib
from typing import Any

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
from ._errors import warn_deprecated, warn_moved
from .plugins._config import ConfigOption
from .plugins._registry import BackendSpec, PluginRegistry, StorageSpec, hookimpl
from .plugins._secrets import redact_urls
from .serialization._keygroups import KeyGroupRange, key_group_for_bytes
from .state._declared import DeclaredStateBackend
from .state._delta import DeltaKeyedBackendBase
from .state._keyed import KeyedBackendBase, merge_list_namespaces
from .state._operator import OperatorStateBackendImpl
from .state._parameters import KeyedBackendParameters
from .state._registered import RegisteredState, StateEntries
from .state._slots import SlotListState, SlotMapState, SlotState, SlotValueState
from .state._state import StateKind
from .state._ttl import purge_expired

__all__ = [
    "BackendSpec",
    "CheckpointOutputStream",
    "CheckpointStorage",
    "CheckpointWriter",
    "ConfigOption",
    "DeclaredStateBackend",
    "DeltaKeyedBackendBase",
    "KeyGroupRange",
    "KeyedBackendBase",
    "KeyedBackendParameters",
    "KeyedStateBackend",
    "OperatorStateBackend",
    "OperatorStateBackendImpl",
    "PluginRegistry",
    "RegisteredState",
    "SlotListState",
    "SlotMapState",
    "SlotState",
    "SlotValueState",
    "StateBackend",
    "StateEntries",
    "StateKind",
    "StorageSpec",
    "SupportsBatchUpdate",
    "SupportsJobFiles",
    "SupportsNativeSnapshot",
    "SupportsOrphanCleanup",
    "SupportsRunFencing",
    "hookimpl",
    "key_group_for_bytes",
    "merge_list_namespaces",
    "purge_expired",
    "redact_urls",
]

#: Names this module exported before it was narrowed, and their one home now.
_MOVED = {
    **dict.fromkeys(importlib.import_module("statekit.ordered_kv").__all__, "statekit.ordered_kv"),
    **dict.fromkeys(importlib.import_module("statekit.snapshot_codec").__all__, "statekit.snapshot_codec"),
    **dict.fromkeys(
        (
            "CORE_OPTIONS",
            "BroadcastState",
            "OperatorListState",
            "OperatorStateData",
            "OperatorStateMode",
            "PluginLoadWarning",
            "RegisteredPlugin",
            "compute_default_max_parallelism",
            "decode_operator_snapshot",
            "encode_operator_snapshot",
            "hookspec",
            "key_group_range_for_operator",
            "operator_index_for_key_group",
            "redistribute_operator_state",
        ),
        "statekit.checkpointing",
    ),
}
#: Names this module exported that are core's internals: no public home, removed in 0.2.0.
_INTERNAL = {
    "AggregatingStateImpl": ("statekit.state._keyed", "core builds aggregating state on your value handles"),
    "ReducingStateImpl": ("statekit.state._keyed", "core builds reducing state on your value handles"),
    "Clock": ("statekit.state._ttl", "a clock is any Callable[[], int] of milliseconds"),
    "system_clock": ("statekit.state._ttl", "KeyedBackendParameters.clock None is the system clock"),
    "ttl_serializer": ("statekit.state._ttl", "core wraps TTL values itself"),
}


def __getattr__(name: str) -> Any:
    """The names that moved out of ``statekit.backend_api``: until statekit 0.2.0, with a warning."""
    home = _MOVED.get(name)
    if home is not None:
        warn_moved(__name__, name, home)
        return getattr(importlib.import_module(home), name)
    internal = _INTERNAL.get(name)
    if internal is not None:
        module, instead = internal
        warn_deprecated(f"{__name__}.{name} (core's internals)", f"nothing replaces it: {instead}")
        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
