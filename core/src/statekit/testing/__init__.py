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
``docs/writing-a-backend.md`` and :class:`statekit.backend_api.SupportsNativeSnapshot`, and
the kit's helpers (:func:`snapshot_handle` with ``native=True``, the state
machines) follow it:

The completion contract follows (``statekit.snapshots._native.COMPLETION_CONTRACT``,
appended at import, so that it is written once).
"""

from __future__ import annotations

from ..snapshots._native import COMPLETION_CONTRACT
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
from ._properties import PROPERTIES, RULES, PropertyViolation
from ._reference import ReferenceCheckpointStorage, ReferenceKeyedStateBackend, ReferenceStateBackend
from ._stateful import MACHINES, ConformanceMachine, ConformanceTarget, MachineConfig, machine_configs
from ._suite import (
    WRITE_BUFFERS,
    CheckpointStorageTests,
    StateBackendTests,
    buffers_writes,
    kit_settings,
    kit_tests,
    run_property,
    with_write_buffer,
)

if __doc__ is not None:  # None under python -OO
    __doc__ += "\n" + COMPLETION_CONTRACT

__all__ = [
    "MACHINES",
    "PROPERTIES",
    "RULES",
    "WRITE_BUFFERS",
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
    "buffers_writes",
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
    "with_write_buffer",
]
