"""Snapshot formats: the canonical keyed-state format and native snapshot handles.

What it holds: ``_snapshot`` (the canonical, backend-independent format: its
header, key-group sections, blocks, checksums, and the state handles that
point at written snapshots), ``_native`` (native snapshot handles: a
backend's own files, uploaded and referenced across checkpoints) and
``_digest`` (the SHA-256 that identifies every checkpoint file: computed as
bytes are written, recorded in ``_metadata``, checked on read).

What it may import: ``serialization`` and ``statekit._errors``. It knows
nothing of backends, checkpoints or runners: ``state`` writes and reads these
formats, ``checkpoints`` stores them.
"""
