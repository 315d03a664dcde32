"""Snapshot formats: the canonical keyed-state format and native snapshot handles.

What it holds: ``_snapshot`` (the canonical, backend-independent format: its
header, key-group sections, blocks, checksums, and the state handles that
point at written snapshots) and ``_native`` (native snapshot handles: a
backend's own files, uploaded and referenced across checkpoints).

What it may import: ``serialization`` and ``statekit._errors``. It knows
nothing of backends, checkpoints or runners: ``state`` writes and reads these
formats, ``checkpoints`` stores them.
"""
