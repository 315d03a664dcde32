"""statekit: pluggable keyed and operator state for Python stream processing.

This module is what a job author uses: state descriptors and handles, TTL,
the function API, the embedded runner and its sources, timers, and the job's
configuration. Everything else has one public home of its own:

- :mod:`statekit.errors`: every error statekit raises (``StateError`` and its subclasses);
- :mod:`statekit.serializers`: the built-in serializers;
- :mod:`statekit.checkpointing`: checkpoints and savepoints for runner authors;
- :mod:`statekit.backend_api`: what backend and storage authors build on: the
  contracts (``StateBackend``, ``CheckpointStorage``, ``Supports*``), plugin
  specs and hooks, key groups, and the base classes;
- :mod:`statekit.testing`, :mod:`statekit.spark`, :mod:`statekit.state_processor`,
  :mod:`statekit.windows`, :mod:`statekit.timers` and :mod:`statekit.sources`.

Names that lived here before (``statekit.CheckpointStorage``, ``statekit.StateError``,
...) are still found for one release, with a :class:`DeprecationWarning`
naming their home.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._errors import warn_moved
from .plugins._config import Configuration
from .plugins._registry import default_registry
from .runtime._function import (
    ColumnsContext,
    KeyedBatchFunction,
    KeyedColumnsFunction,
    KeyedProcessFunction,
    OnTimerContext,
    ProcessContext,
    RuntimeContext,
)
from .runtime._metrics import CheckpointInfo
from .runtime._raw import RawStateRestoreContext, RawStateSnapshotContext
from .runtime._runner import FileSource, LocalRunner, RecordSource, ReplayableSource, RunResult
from .sources._badrecords import BadRecord, BadRecordPolicy
from .sources._locating import InputLostWarning, LostInput
from .sources._logsource import LogSource
from .state._state import (
    VOID_NAMESPACE,
    AggregateFunction,
    AggregatingState,
    AggregatingStateDescriptor,
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    Migration,
    ReducingState,
    ReducingStateDescriptor,
    State,
    StateDescriptor,
    StateTtlConfig,
    TtlUpdateType,
    TtlVisibility,
    ValueState,
    ValueStateDescriptor,
)
from .timers._eventtime import EventTime
from .timers._service import TimeDomain, TimerService

__version__ = "0.1.0"

__all__ = [
    "VOID_NAMESPACE",
    "AggregateFunction",
    "AggregatingState",
    "AggregatingStateDescriptor",
    "BadRecord",
    "BadRecordPolicy",
    "CheckpointInfo",
    "ColumnsContext",
    "Configuration",
    "EventTime",
    "FileSource",
    "InputLostWarning",
    "KeyedBatchFunction",
    "KeyedColumnsFunction",
    "KeyedProcessFunction",
    "ListState",
    "ListStateDescriptor",
    "LocalRunner",
    "LogSource",
    "LostInput",
    "MapState",
    "MapStateDescriptor",
    "Migration",
    "OnTimerContext",
    "ProcessContext",
    "RawStateRestoreContext",
    "RawStateSnapshotContext",
    "RecordSource",
    "ReducingState",
    "ReducingStateDescriptor",
    "ReplayableSource",
    "RunResult",
    "RuntimeContext",
    "State",
    "StateDescriptor",
    "StateTtlConfig",
    "TimeDomain",
    "TimerService",
    "TtlUpdateType",
    "TtlVisibility",
    "ValueState",
    "ValueStateDescriptor",
    "__version__",
    "default_registry",
]

#: Names that ``statekit`` exported before each had one home, and that home.
_MOVED = {
    **dict.fromkeys(
        (
            "BackendIOError",
            "BadRecordError",
            "CheckpointError",
            "CheckpointNotFoundError",
            "ConfigurationError",
            "CorruptCheckpointError",
            "CorruptSnapshotError",
            "FencedError",
            "IncompatibleSerializerError",
            "MaxParallelismMismatchError",
            "PluginConflictError",
            "PluginError",
            "SerializationError",
            "SnapshotError",
            "SourceError",
            "StateAccessError",
            "StateError",
            "StateMigrationError",
            "StateSizeLimitError",
            "UnknownPluginError",
            "UnsafeLocalPathError",
        ),
        "statekit.errors",
    ),
    **dict.fromkeys(
        (
            "CORE_OPTIONS",
            "PluginLoadWarning",
            "RegisteredPlugin",
            "compute_default_max_parallelism",
            "hookspec",
            "key_group_range_for_operator",
            "operator_index_for_key_group",
        ),
        "statekit.checkpointing",
    ),
    **dict.fromkeys(
        (
            "BackendSpec",
            "CheckpointOutputStream",
            "CheckpointStorage",
            "CheckpointWriter",
            "ConfigOption",
            "KeyGroupRange",
            "KeyedStateBackend",
            "OperatorStateBackend",
            "PluginRegistry",
            "StateBackend",
            "StorageSpec",
            "SupportsBatchUpdate",
            "SupportsNativeSnapshot",
            "SupportsOrphanCleanup",
            "SupportsRunFencing",
            "hookimpl",
            "key_group_for_bytes",
        ),
        "statekit.backend_api",
    ),
    **dict.fromkeys(
        ("CheckpointMetadata", "CompletedCheckpoint", "load_checkpoint"), "statekit.checkpointing"
    ),
    **dict.fromkeys(("PickleSerializer", "TypeSerializer", "serializer_for"), "statekit.serializers"),
}


def __getattr__(name: str) -> Any:
    """The names that moved out of ``statekit``, for one release, with a DeprecationWarning."""
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warn_moved(__name__, name, home)
    return getattr(importlib.import_module(home), name)
