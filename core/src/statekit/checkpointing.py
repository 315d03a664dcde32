"""The checkpoint coordinator's building blocks, for runner authors.

A runner snapshots each subtask with :func:`write_subtask_state` into the
streams of a :class:`~statekit.backend_api.CheckpointWriter`, completes the checkpoint
with :func:`complete_checkpoint` once every subtask (and the sink) is done,
and trims old checkpoints with :func:`apply_retention`. To restore, it loads
a :class:`CompletedCheckpoint` and calls its ``validate`` and
``restore_subtask``. :class:`statekit.LocalRunner` is the reference runner.
:func:`read_checkpoint_history` reads a job's checkpoint history (every
attempt, beyond retention) as :class:`CheckpointAttempt` records.
"""

from __future__ import annotations

from .checkpoints._history import AttemptSizes, CheckpointAttempt, read_checkpoint_history
from .checkpoints._metadata import CheckpointMetadata, SubtaskState
from .checkpoints._restore import CompletedCheckpoint, load_checkpoint
from .checkpoints._retention import apply_retention
from .checkpoints._writing import complete_checkpoint, discard_native_uploads, write_subtask_state
from .runtime._metrics import CheckpointStats, StateSize, checkpoint_stats

__all__ = [
    "AttemptSizes",
    "CheckpointAttempt",
    "CheckpointMetadata",
    "CheckpointStats",
    "CompletedCheckpoint",
    "StateSize",
    "SubtaskState",
    "apply_retention",
    "checkpoint_stats",
    "complete_checkpoint",
    "discard_native_uploads",
    "load_checkpoint",
    "read_checkpoint_history",
    "write_subtask_state",
]
