"""Checkpoints and savepoints: what subtasks write, what completes them, and how they are found again.

What it holds: ``_metadata`` (the ``_metadata`` file and each subtask's
entry), ``_writing`` (subtasks' files, then ``_metadata`` last),
``_retention`` (checkpoint ids, which checkpoints stay), ``_restore``
(which subtask restores which state: restore plans), ``_fencing`` (of two runs of one job, only the
newest completes checkpoints), ``_locations`` (paths and URLs to the
``filesystem`` storage that reaches them), ``_verify`` (checking a
checkpoint's files without restoring it), ``_local_recovery`` (local copies
of the files a process wrote, read before the storage: task-local recovery)
and ``_coordinator`` (``CheckpointCoordinator``: the checkpoints of one run of
a job, for the LocalRunner and the Spark driver alike: ids, fencing,
completion, native completion notifications, aborting, retention, which
checkpoint ``restore="latest"`` takes, what a checkpoint to restore must
match; a ``CheckpointPolicy`` holds what differs between the runners),
``_restore_rules`` (those checks: ``RestoreRules``, raw state claimed by the
function), ``_convert`` (a completed checkpoint turned into a
self-contained canonical savepoint: ``savepoint convert`` and a running Spark
query's savepoints), ``_history`` (every checkpoint attempt of a job, beyond
retention), ``_state_sizes`` (each state's entries and bytes as a subtask's entry
records them, for every channel that shows them), ``_savepoint_requests``
(savepoints asked of a running job), ``_honour``
(a running job honouring them after a checkpoint, for both runners) and
``_raw`` (raw state files).

What it may import: ``timers``, ``_contracts``, ``state``, ``snapshots``,
``serialization``, ``plugins`` (a location names its storage plugin) and
``statekit._errors``; never a runner, the CLI or Spark, which all use it.
The public names are re-exported by :mod:`statekit.checkpointing`.
"""
