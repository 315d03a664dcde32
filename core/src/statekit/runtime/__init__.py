"""The embedded runtime: the function API, the subtask every runner holds, the local runner, its helpers.

What it holds: ``_function`` (``KeyedProcessFunction``, its context and the
batch function API every runner shares), ``_subtask`` (``Subtask``: one
subtask's keyed and operator backends, made from one
``KeyedBackendParameters``, its function, contexts and timers; the
LocalRunner, the Spark tasks and the kit's job harness all hold theirs in
it), ``_runner`` (``LocalRunner``: a keyed function over records in one
process, with checkpoints) and the collaborators it hands work to, besides
:mod:`statekit.checkpoints`' ``CheckpointCoordinator``: ``_subtasks``
(``OperatorSubtasks``: its subtasks, made, routed to, restored, written,
closed), ``_sources`` (``SourceReader``: the source position, reading it,
bad records), ``_batches`` (a batch function's micro-batch), ``_letters``
(``JobDeadLetters``: dead letters published with their checkpoint) and
``_time`` (``TimeCoordinator``: the watermark, late records, firing timers);
also ``_configured`` (the backend and storage a configuration names),
``_columnar`` (columnar micro-batch rows for batch functions) and
``_localdirs`` (local directories owned by a process, removed when it is gone).

What it may import: ``sources``, ``checkpoints``, ``timers``, ``_contracts``,
``state``, ``snapshots``, ``serialization``, ``plugins`` and
``statekit._errors``. ``windows``, ``state_processor``, ``testing``, the CLI
and Spark sit above it; nothing below imports it.
"""
