"""The statekit error hierarchy.

Every error statekit raises derives from :class:`StateError`. Where a builtin
exception fits, the error also inherits it, so callers may catch either::

    StateError
    ├── ConfigurationError (ValueError)
    │   └── UnknownPluginError (LookupError)
    ├── BackendIOError (OSError)
    ├── PluginError
    │   └── PluginConflictError
    ├── SerializationError (ValueError)
    ├── StateMigrationError
    │   ├── IncompatibleSerializerError
    │   └── MaxParallelismMismatchError
    ├── SnapshotError
    │   └── CorruptSnapshotError
    ├── CheckpointError
    │   ├── CheckpointNotFoundError (FileNotFoundError)
    │   ├── FencedError
    │   └── StateSizeLimitError
    └── StateAccessError (RuntimeError)
"""

from __future__ import annotations

__all__ = [
    "BackendIOError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "ConfigurationError",
    "CorruptSnapshotError",
    "FencedError",
    "IncompatibleSerializerError",
    "MaxParallelismMismatchError",
    "PluginConflictError",
    "PluginError",
    "SerializationError",
    "SnapshotError",
    "StateAccessError",
    "StateError",
    "StateMigrationError",
    "StateSizeLimitError",
    "UnknownPluginError",
]


class StateError(Exception):
    """Root of every error statekit raises."""


class ConfigurationError(StateError, ValueError):
    """A configuration key or value is unknown, ill-typed or inconsistent."""


class UnknownPluginError(ConfigurationError, LookupError):
    """A backend or storage name is not provided by any installed plugin."""


class BackendIOError(StateError, OSError):
    """A backend's engine cannot write (or read) its files in its local directory: a full disk, an I/O error.

    Names the directory and the space left on its disk; the engine's own error
    is the cause. The local files are a working copy: restore the job from its
    latest checkpoint once there is room.
    """


class PluginError(StateError):
    """A plugin could not be loaded or registered."""


class PluginConflictError(PluginError):
    """Two plugins claim the same backend or storage name."""


class SerializationError(StateError, ValueError):
    """A value cannot be serialized or deserialized with the chosen serializer."""


class StateMigrationError(StateError):
    """State in a snapshot cannot be restored with the current declarations.

    Raised before any state is changed.
    """


class IncompatibleSerializerError(StateMigrationError):
    """A state's (or the key's) serializer differs from the one in the snapshot."""


class MaxParallelismMismatchError(StateMigrationError):
    """A snapshot was taken with another max parallelism than the restoring job's."""


class SnapshotError(StateError):
    """A snapshot could not be written or read."""


class CorruptSnapshotError(SnapshotError):
    """Snapshot bytes fail their checksum or are malformed. Nothing was restored."""


class CheckpointError(StateError):
    """A checkpoint or savepoint could not be taken, completed or loaded."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No completed checkpoint or savepoint exists at the given place."""


class FencedError(CheckpointError):
    """A newer run of the same job took over its checkpoints: this run completes no more.

    Raised before a checkpoint's files or ``_metadata`` are written, naming the
    newer run. Unlike other checkpoint failures it stops the job (a periodic
    checkpoint does not swallow it), and the fenced run deletes nothing.
    """


class StateSizeLimitError(CheckpointError):
    """A state exceeds the size limit of the checkpoint storage."""


class StateAccessError(StateError, RuntimeError):
    """State was used wrongly: no current key, a closed backend, a wrong kind."""
