"""Every error statekit raises: :class:`StateError` and its subclasses.

Catch :class:`StateError` for any of them. Where a builtin exception fits,
an error also inherits it, so callers may catch either::

    StateError
    ├── ConfigurationError (ValueError)
    │   └── UnknownPluginError (LookupError)
    ├── BackendIOError (OSError)
    ├── BadRecordError (ValueError)
    ├── SourceError
    ├── PluginError
    │   └── PluginConflictError
    ├── SerializationError (ValueError)
    ├── StateMigrationError
    │   ├── IncompatibleSerializerError
    │   └── MaxParallelismMismatchError
    ├── SnapshotError
    │   ├── CorruptSnapshotError
    │   │   └── CorruptCheckpointError (also a CheckpointError)
    │   └── SnapshotCancelledError
    ├── CheckpointError
    │   ├── CheckpointNotFoundError (FileNotFoundError)
    │   ├── FencedError
    │   └── StateSizeLimitError
    ├── StateAccessError (RuntimeError)
    └── UnsafeLocalPathError (PermissionError)
"""

from __future__ import annotations

from ._errors import (
    BackendIOError,
    BadRecordError,
    CheckpointError,
    CheckpointNotFoundError,
    ConfigurationError,
    CorruptCheckpointError,
    CorruptSnapshotError,
    FencedError,
    IncompatibleSerializerError,
    MaxParallelismMismatchError,
    PluginConflictError,
    PluginError,
    SerializationError,
    SnapshotCancelledError,
    SnapshotError,
    SourceError,
    StateAccessError,
    StateError,
    StateMigrationError,
    StateSizeLimitError,
    UnknownPluginError,
    UnsafeLocalPathError,
)

__all__ = [
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
    "SnapshotCancelledError",
    "SnapshotError",
    "SourceError",
    "StateAccessError",
    "StateError",
    "StateMigrationError",
    "StateSizeLimitError",
    "UnknownPluginError",
    "UnsafeLocalPathError",
]
