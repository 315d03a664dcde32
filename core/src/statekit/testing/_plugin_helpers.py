"""Scaffolding for a backend plugin's own tests, besides the kit's test classes.

The kit's classes (:class:`~statekit.testing.StateBackendTests`) hold every
backend to the same contract. A plugin's own tests check what is its engine's:
what it puts on disk, its local directories, its native checkpoints. These
helpers are what such tests of different plugins share, so that each plugin
imports them from here rather than copying them, or reaching into the kit's
private modules::

    def test_a_native_snapshot_restores(make_backend):
        src = make_backend()
        ...
        target = make_backend(KeyGroupRange.of(0, 63))
        target.restore_native([snapshot_handle(src, native=True)])
"""

from __future__ import annotations

from ._job import DecodedEntry, KitNativeOutput, decode_canonical, snapshot_handle

__all__ = [
    "DecodedEntry",
    "KitNativeOutput",
    "decode_canonical",
    "snapshot_handle",
]
