"""Registers the ``jobmanager`` and ``filesystem`` checkpoint storages.

Kept light: it imports neither fsspec nor the storage modules, which load when a
storage is created. Each storage has its own plugin object, named by its own
entry point (pluggy registers an object once only).
"""

from __future__ import annotations

from collections.abc import Callable

from statekit.backend_api import ConfigOption, StorageSpec, hookimpl

__all__ = [
    "DEFAULT_INLINE_THRESHOLD",
    "DEFAULT_MAX_STATE_SIZE",
    "FILESYSTEM",
    "JOBMANAGER",
    "filesystem",
    "jobmanager",
]

#: Streams of at most this many bytes are inlined into ``_metadata``.
DEFAULT_INLINE_THRESHOLD = 20 * 1024
#: The jobmanager storage's default limit on the snapshot of one state.
DEFAULT_MAX_STATE_SIZE = 5 * 1024 * 1024

_SAVEPOINTS_DIR = ConfigOption(
    "savepoints-dir", str, None, "Default URL or path for savepoints (set by statekit.savepoints.dir)."
)
_STORAGE_OPTIONS = ConfigOption(
    "storage-options",
    str,
    None,
    'fsspec storage options as a JSON object, e.g. {"client_kwargs": {"endpoint_url": "http://host:9000"}}; '
    'applied to URLs of the protocol of the configured directories. A string value "${env:NAME}" is '
    "read from environment variable NAME in each process. No credentials here: see secret-storage-options.",
)
_SECRET_STORAGE_OPTIONS = ConfigOption(
    "secret-storage-options",
    str,
    None,
    "Like storage-options (merged over it), for credentials: its key matches Spark's spark.redaction.regex, "
    "so Spark hides it on its UI and in event logs, and statekit never shows it. Better still, leave "
    "credentials to the environment or the fsspec/boto credential chain.",
)
_LOCAL_PERMISSIONS = ConfigOption(
    "local-permissions",
    str,
    "private",
    "How checkpoint and savepoint files on local disks (plain paths, file://) are created: private (the "
    "default) makes every directory statekit creates 0700 and every file 0600, whatever the umask, so no "
    "other local user reads the state; umask shares them as the process's umask makes them (e.g. 0755/0644), "
    "for a group or another user that must read them. Other filesystems keep their own access control.",
    choices=("private", "umask"),
)

FILESYSTEM = StorageSpec(
    name="filesystem",
    factory="statekit_storage._filesystem:FileSystemCheckpointStorage.from_options",
    options=(
        ConfigOption(
            "checkpoints-dir", str, None,
            "URL or path under which checkpoints are written (set by statekit.checkpoints.dir); required.",
        ),
        _SAVEPOINTS_DIR,
        ConfigOption(
            "inline-threshold", int, DEFAULT_INLINE_THRESHOLD,
            "Streams of at most this many bytes are stored inside _metadata instead of as files.",
            byte_size=True,
        ),
        _STORAGE_OPTIONS,
        _SECRET_STORAGE_OPTIONS,
        _LOCAL_PERMISSIONS,
    ),
    description="Checkpoints as files under any fsspec URL: local, file://, memory://, s3://, hdfs://.",
)  # fmt: skip

JOBMANAGER = StorageSpec(
    name="jobmanager",
    factory="statekit_storage._jobmanager:JobManagerCheckpointStorage.from_options",
    options=(
        ConfigOption(
            "max-state-size", int, DEFAULT_MAX_STATE_SIZE,
            "Largest snapshot of one state, in bytes; a larger one fails the checkpoint.",
            byte_size=True, minimum=1,
        ),
        _SAVEPOINTS_DIR,
        _STORAGE_OPTIONS,
        _SECRET_STORAGE_OPTIONS,
        _LOCAL_PERMISSIONS,
    ),
    description="Checkpoints in the memory of the coordinating process (tests, small state); "
    "savepoints as files.",
)  # fmt: skip


class _StoragePlugin:
    """A pluggy plugin that registers one storage spec."""

    def __init__(self, spec: StorageSpec) -> None:
        self._spec = spec

    @hookimpl
    def statekit_register_storages(self, register: Callable[[StorageSpec], None]) -> None:
        """Registers this plugin's storage."""
        register(self._spec)


#: The plugin objects the entry points name.
filesystem = _StoragePlugin(FILESYSTEM)
jobmanager = _StoragePlugin(JOBMANAGER)
