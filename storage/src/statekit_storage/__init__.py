"""statekit's checkpoint storages: ``jobmanager`` (in memory) and ``filesystem`` (any fsspec URL).

Jobs select one by name (``statekit.checkpoint.storage``); they can also be made
directly::

    from statekit_storage import FileSystemCheckpointStorage

    storage = FileSystemCheckpointStorage("s3://bucket/checkpoints", savepoints_dir="s3://bucket/savepoints")
    storage.latest_checkpoint("job-1")  # "s3://bucket/checkpoints/job-1/chk-7" or None

The storages (and fsspec) are imported on first use, so listing plugins stays light.
``_filesystem`` and ``_jobmanager`` are the storage classes; each step of the
filesystem storage has a module of its own (``_paths``, ``_options``,
``_files``, ``_streams``, ``_publishing``, ``_writer``, ``_runs``), and
``_handles`` the state handles both return.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._plugin import DEFAULT_INLINE_THRESHOLD, DEFAULT_MAX_STATE_SIZE

if TYPE_CHECKING:
    from ._filesystem import FileSystemCheckpointStorage, find_latest_checkpoint
    from ._handles import FileStreamHandle, InlineStreamHandle
    from ._jobmanager import JobManagerCheckpointStorage
    from ._paths import METADATA_FILE

__all__ = [
    "DEFAULT_INLINE_THRESHOLD",
    "DEFAULT_MAX_STATE_SIZE",
    "METADATA_FILE",
    "FileStreamHandle",
    "FileSystemCheckpointStorage",
    "InlineStreamHandle",
    "JobManagerCheckpointStorage",
    "find_latest_checkpoint",
]

_MODULES = {
    "METADATA_FILE": "._paths",
    "FileSystemCheckpointStorage": "._filesystem",
    "find_latest_checkpoint": "._filesystem",
    "FileStreamHandle": "._handles",
    "InlineStreamHandle": "._handles",
    "JobManagerCheckpointStorage": "._jobmanager",
}


def __getattr__(name: str) -> Any:
    """Imports a storage's module when one of its names is first used."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """Lists the public names, loaded or not."""
    return sorted(set(globals()) | set(__all__))
