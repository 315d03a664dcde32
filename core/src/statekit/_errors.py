"""The statekit error hierarchy.

Every error statekit raises derives from :class:`StateError`. Where a builtin
exception fits, the error also inherits it, so callers may catch either::

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

import warnings

__all__ = [
    "REMOVED_IN",
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
    "install_hint",
    "warn_deprecated",
    "warn_moved",
]

#: The release that removes every name and form deprecated in this one: the next minor version
#: (core's version is 0.1.0). A DeprecationWarning names it, so a user knows the deadline.
REMOVED_IN = "0.2.0"


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


class BadRecordError(StateError, ValueError):
    """An input record cannot be processed: its line does not parse, it has no usable key, its columns clash.

    The message names the place (file, byte offset, line number) and the raw
    text, cut short; ``bad`` holds them all (a :class:`statekit.BadRecord`).
    Raised under ``statekit.bad-records.policy=fail`` and when a dead-letter
    budget is spent (see docs/operations.md#input-files).

    Attributes:
        bad: The record and where it came from.
    """

    def __init__(self, message: str, bad: object = None) -> None:
        super().__init__(message)
        self.bad = bad

    def __reduce__(self) -> tuple[type[BadRecordError], tuple[str, object]]:
        """Pickles with its fields (Spark sends task errors to the driver)."""
        return (BadRecordError, (str(self), self.bad))


class SourceError(StateError):
    """A source cannot read its input as promised; the message names the file and the reason.

    Raised when a watched path does not exist (naming the first missing part,
    and a near name), or holds what a log source may not read (a symlink out of
    the watched files, a FIFO, a socket, a device, a directory); when a
    checkpointed position (on Spark: the offset in Spark's offset log) is not
    one of the source's, or names files that changed since, so they cannot be
    matched again; and when input is lost (a file moved away, truncated or
    compressed before it was read to its end) under ``on_lost="fail"``.
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
    """Snapshot bytes fail their checksum or recorded digest, or are malformed. Nothing was restored.

    A recorded digest (SHA-256) fails when the bytes are damaged or are not the
    file the checkpoint wrote (another checkpoint's or subtask's file).
    """


class SnapshotCancelledError(SnapshotError):
    """A snapshot still pending (taken, not written) when its backend closed, written afterwards.

    ``close()`` cancels every pending snapshot, canonical or native: it releases
    what the snapshot held (a frozen view, a local checkpoint) before the engine
    closes. Writing it later raises this error, naming the snapshot; write
    snapshots before closing their backend. ``release()`` stays allowed.
    """


class CheckpointError(StateError):
    """A checkpoint or savepoint could not be taken, completed or loaded."""


class CorruptCheckpointError(CorruptSnapshotError, CheckpointError):
    """A completed checkpoint or savepoint cannot be restored: a file it names is damaged or missing.

    The message has one form everywhere, ``checkpoint <location>: <file>: <what is
    wrong>``, where ``<file>`` is the full path or URL of the bad file (or
    ``<location>/_metadata``). Raised before anything is restored; a runner that
    restores ``"latest"`` may fall back to an older checkpoint (see
    docs/operations.md).

    Attributes:
        location: The checkpoint's or savepoint's directory.
        problem: ``<file>: <what is wrong>``.
    """

    def __init__(self, location: str, problem: str) -> None:
        super().__init__(f"checkpoint {location}: {problem}")
        self.location = location
        self.problem = problem

    def __reduce__(self) -> tuple[type[CorruptCheckpointError], tuple[str, str]]:
        """Pickles with its fields (Spark sends task errors to the driver)."""
        return (CorruptCheckpointError, (self.location, self.problem))


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


class UnsafeLocalPathError(StateError, PermissionError):
    """A local path statekit would write is not private to the running user.

    It is a symlink statekit did not make, belongs to another user, or can be
    written by the group or by others. The message names the path and the way
    out (``chmod go-w``, another directory, removing the symlink).

    Attributes:
        path: The offending path.
    """

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[type[UnsafeLocalPathError], tuple[str, str]]:
        """Pickles with its fields (Spark sends task errors to the driver)."""
        return (UnsafeLocalPathError, (str(self), self.path))


def install_hint(requirement: str) -> str:
    """How to install ``requirement`` (a statekit distribution, extras included), for error messages.

    statekit is not on PyPI: its distributions install from a wheelhouse that
    ``make wheels`` builds in a statekit checkout (see the README).
    """
    return (
        f'pip install --find-links wheelhouse -c wheelhouse/constraints.txt "{requirement}" (statekit '
        "is not on PyPI: `make wheels` in a statekit checkout builds the wheelhouse, see its README)"
    )


def warn_moved(module: str, name: str, home: str) -> None:
    """Warn (DeprecationWarning) that ``module.name`` moved to ``home``; for a module's ``__getattr__``.

    Old import paths keep working until statekit :data:`REMOVED_IN`: the
    module's ``__getattr__`` calls this and returns the name from its home. The
    message names both places and the version that removes the old one
    (``statekit.StateError moved to statekit.errors: ...; removed in statekit 0.2.0``).
    """
    warnings.warn(
        f"{module}.{name} moved to {home}: import it from there (from {home} import {name}); "
        f"{module}.{name} is removed in statekit {REMOVED_IN}",
        DeprecationWarning,
        stacklevel=3,
    )


def warn_deprecated(what: str, instead: str, *, stacklevel: int = 3) -> None:
    """Warn (DeprecationWarning) that ``what`` is deprecated, what to do ``instead``, and when it goes."""
    warnings.warn(
        f"{what} is deprecated and removed in statekit {REMOVED_IN}: {instead}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
