"""The checkpoint coordinator's building blocks, for runner authors.

A runner snapshots each subtask with :func:`write_subtask_state` into the
streams of a :class:`~statekit.backend_api.CheckpointWriter`, completes the checkpoint
with :func:`complete_checkpoint` once every subtask (and the sink) is done,
and trims old checkpoints with :func:`apply_retention`. To restore, it loads
a :class:`CompletedCheckpoint` and calls its ``validate`` and
``restore_subtask``. :class:`statekit.LocalRunner` is the reference runner.
:func:`read_checkpoint_history` reads a job's checkpoint history (every
attempt, beyond retention) as :class:`CheckpointAttempt` records.

What a runner does between checkpoints is here too: which subtask owns which
key groups (:func:`key_group_range_for_operator`,
:func:`operator_index_for_key_group`, :func:`compute_default_max_parallelism`),
operator state and its redistribution on rescale
(:func:`redistribute_operator_state`, :func:`encode_operator_snapshot`), and the
plugin registry's core options and hook specs (:data:`CORE_OPTIONS`,
:func:`hookspec`).
"""

from __future__ import annotations

from .checkpoints._history import AttemptSizes, CheckpointAttempt, read_checkpoint_history
from .checkpoints._metadata import CheckpointMetadata, SubtaskState
from .checkpoints._restore import CompletedCheckpoint, load_checkpoint
from .checkpoints._retention import apply_retention
from .checkpoints._writing import complete_checkpoint, discard_native_uploads, write_subtask_state
from .plugins._config import CORE_OPTIONS
from .plugins._registry import PluginLoadWarning, RegisteredPlugin, hookspec
from .runtime._metrics import CheckpointStats, StateSize, checkpoint_stats
from .serialization._keygroups import (
    compute_default_max_parallelism,
    key_group_range_for_operator,
    operator_index_for_key_group,
)
from .state._operator import (
    BroadcastState,
    OperatorListState,
    OperatorStateData,
    OperatorStateMode,
    decode_operator_snapshot,
    encode_operator_snapshot,
    redistribute_operator_state,
)

__all__ = [
    "CORE_OPTIONS",
    "AttemptSizes",
    "BroadcastState",
    "CheckpointAttempt",
    "CheckpointMetadata",
    "CheckpointStats",
    "CompletedCheckpoint",
    "OperatorListState",
    "OperatorStateData",
    "OperatorStateMode",
    "PluginLoadWarning",
    "RegisteredPlugin",
    "StateSize",
    "SubtaskState",
    "apply_retention",
    "checkpoint_stats",
    "complete_checkpoint",
    "compute_default_max_parallelism",
    "decode_operator_snapshot",
    "discard_native_uploads",
    "encode_operator_snapshot",
    "hookspec",
    "key_group_range_for_operator",
    "load_checkpoint",
    "operator_index_for_key_group",
    "read_checkpoint_history",
    "redistribute_operator_state",
    "write_subtask_state",
]
