"""The embedded runtime: the user's function API, the local runner, and backends' working directories.

What it holds: ``_function`` (``KeyedProcessFunction``, its context and the
batch function API every runner shares), ``_runner`` (``LocalRunner``: a keyed
function over records in one process, with checkpoints) and the collaborators
it hands work to (besides :mod:`statekit.checkpoints`' ``CheckpointCoordinator``): ``_sources``
(``SourceReader``: the source position, reading it, bad records) and ``_time``
(``TimeCoordinator``: the watermark, late records, firing timers); also
``_columnar`` (columnar micro-batch rows for batch functions) and
``_localdirs`` (local directories owned by a process, removed when it is gone).

What it may import: ``sources``, ``checkpoints``, ``timers``, ``_contracts``,
``state``, ``snapshots``, ``serialization``, ``plugins`` and
``statekit._errors``. ``windows``, ``state_processor``, ``testing``, the CLI
and Spark sit above it; nothing below imports it.
"""
