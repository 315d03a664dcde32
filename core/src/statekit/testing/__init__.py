"""statekit's conformance kit: the tests every state backend and checkpoint storage must pass.

Install it with ``pip install "statekit-core[testing]"`` (pytest and Hypothesis),
then subclass a test class in your plugin's tests and give it a factory::

    import pytest
    from statekit.testing import StateBackendTests

    class TestMyBackend(StateBackendTests):
        @pytest.fixture
        def backend_factory(self):
            return lambda: MyStateBackend({})

That runs every semantic test of keyed state and TTL against your backend, and
one Hypothesis state machine per named property (:data:`PROPERTIES`), which
drives random operations against a plain Python model and reports a violation
(:class:`PropertyViolation`) with the shortest sequence of steps it found.
:class:`CheckpointStorageTests` does the same for a checkpoint storage. See
``docs/writing-a-backend.md``.

A plugin's own tests (of what is particular to its engine) share scaffolding
from here too: :func:`keyed_backends` (a fixture's factory of keyed
backends), :func:`snapshot_handle` and :func:`decode_canonical` (snapshots
taken, written into memory and read back), :class:`KitNativeOutput` (where
native snapshots upload, in memory), :func:`value_state_contents` and
:func:`keyed_checkpoint_part` (what a :class:`~statekit.LocalRunner` holds
and checkpointed) and :func:`run_killed_job` (a job whose process dies by
SIGKILL, leaving its local directories behind).

Native snapshots are held to the completion contract, the one rule of
``docs/writing-a-backend.md`` and :class:`statekit.SupportsNativeSnapshot`, and
the kit's helpers (:func:`snapshot_handle` with ``native=True``, the state
machines) follow it:

The completion contract. The snapshot of checkpoint n may reference a file (put into its handle a
NativeFile that out.upload returned for an earlier checkpoint, instead of uploading the file again)
only if the checkpoint m that uploaded it, with shared=True, was confirmed to this backend instance
by notify_checkpoint_complete(m) before n's snapshot references it. Nothing else is ever referenced:
not an upload of a checkpoint that was aborted (notify_checkpoint_aborted) or never confirmed, even
once a later checkpoint completes (the completion of m says nothing about the checkpoints before m),
and not a file of a restored snapshot unless the restored checkpoint is confirmed the same way:
restore_native(handles) followed by notify_checkpoint_complete(c), c the checkpoint id of the
handles, lets the instance reference the files of those handles it still holds (Flink's claim of its
own checkpoints; runners confirm only a completed checkpoint of the same job in the storage the
backend checkpoints into, never a savepoint), and without it the first checkpoint after a restore
uploads every file. A backend needs to know nothing more: it keeps each checkpoint's uploads by
checkpoint id (out.checkpoint_id), and a restore's files by the restored checkpoint's id, until that
checkpoint is confirmed or aborted, and one set of referenceable uploads, whatever output or storage
a snapshot writes to. Runners and the kit confirm a checkpoint only where every later checkpoint of
the backend can reach its files: a runner sends all native checkpoints of a backend into one
checkpoint storage, and the kit confirms the native snapshots it writes into memory only while the
backend checkpoints nowhere else (its state machines that also checkpoint through a storage abort
them).
"""

from __future__ import annotations

from ._clock import ManualClock
from ._lifecycle import OnDiskLifecycleTests, instance_dirs
from ._plugin_helpers import (
    DecodedEntry,
    KitNativeOutput,
    decode_canonical,
    keyed_backends,
    keyed_checkpoint_part,
    run_killed_job,
    snapshot_handle,
    value_state_contents,
)
from ._properties import PROPERTIES, PropertyViolation
from ._reference import ReferenceCheckpointStorage, ReferenceKeyedStateBackend, ReferenceStateBackend
from ._stateful import MACHINES, ConformanceMachine, ConformanceTarget, MachineConfig, machine_configs
from ._suite import CheckpointStorageTests, StateBackendTests, kit_settings, kit_tests, run_property

__all__ = [
    "MACHINES",
    "PROPERTIES",
    "CheckpointStorageTests",
    "ConformanceMachine",
    "ConformanceTarget",
    "DecodedEntry",
    "KitNativeOutput",
    "MachineConfig",
    "ManualClock",
    "OnDiskLifecycleTests",
    "PropertyViolation",
    "ReferenceCheckpointStorage",
    "ReferenceKeyedStateBackend",
    "ReferenceStateBackend",
    "StateBackendTests",
    "decode_canonical",
    "instance_dirs",
    "keyed_backends",
    "keyed_checkpoint_part",
    "kit_settings",
    "kit_tests",
    "machine_configs",
    "run_killed_job",
    "run_property",
    "snapshot_handle",
    "value_state_contents",
]
