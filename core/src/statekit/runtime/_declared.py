"""The states a function declares, checked against a checkpoint's stored schemas before anything runs.

A restore migrates or refuses each state when the function declares it
(``get_state`` in ``open``, see :mod:`statekit.state._migration`). On the
LocalRunner that is before the first record; on Spark it would be in every
task, at the first input: each task fails and is retried, and an idle query
holds a state that can never be restored. So the Spark driver opens the
function once against a :class:`RuntimeContext` that only records what is
declared (:func:`declared_states`: no backend, no state read), and checks each
declared keyed state against the schemas the checkpoint's ``_metadata``
records (:class:`DeclaredStates`), before its first micro-batch, with the
message the restore itself would give. The LocalRunner does the same when
it restores, before it opens its subtasks. Both learn there what a restore
drops of the values a checkpoint holds (a field the code no longer has),
which they report where operators look (see ``_migration_log``).

States declared lazily (in ``process``) are checked where they are declared,
as before; an ``open`` that reads its state (or fails on the driver) stops
the recording there and the states declared before are checked.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, cast

from .._contracts import KeyedStateBackend, OperatorStateBackend
from ..checkpoints._restore import CompletedCheckpoint
from ..serialization._serializers import TypeSerializer
from ..state._registered import RegisteredState
from ..state._state import StateDescriptor
from ..timers import TIMER_STATE_PREFIX
from ._function import KeyedProcessFunction, RuntimeContext
from ._migration_log import dropping_changes

__all__ = ["DeclaredStates", "declared_states"]


class _StopRecording(Exception):
    """``open`` used a state it declared: nothing more can be recorded without a backend."""


class _Unusable:
    """The handle a recorded state gets: any use stops the recording."""

    def __getattr__(self, name: str) -> Any:
        raise _StopRecording(name)


class _Recorder:
    """Stands for the keyed and operator backends of a subtask: records what ``open`` declares."""

    def __init__(self) -> None:
        self.keyed: list[tuple[StateDescriptor, TypeSerializer | None]] = []

    def get_state(
        self, descriptor: StateDescriptor, *, namespace_serializer: TypeSerializer | None = None
    ) -> Any:
        self.keyed.append((descriptor, namespace_serializer))
        return _Unusable()

    def get_list_state(self, descriptor: Any) -> Any:
        return _Unusable()

    def get_union_list_state(self, descriptor: Any) -> Any:
        return _Unusable()

    def get_broadcast_state(self, descriptor: Any) -> Any:
        return _Unusable()

    def __getattr__(self, name: str) -> Any:
        raise _StopRecording(name)


def declared_states(
    function: KeyedProcessFunction, *, job_id: str, parallelism: int, max_parallelism: int
) -> list[tuple[StateDescriptor, TypeSerializer | None]]:
    """The keyed states ``function.open`` declares (with their namespace serializers), in order.

    ``open`` runs against a recording context (subtask 0): no state exists and
    none is read. Whatever it raises ends the recording (the tasks report it).
    """
    recorder = _Recorder()
    ctx = RuntimeContext(
        cast(KeyedStateBackend, recorder),
        cast(OperatorStateBackend, recorder),
        job_id=job_id,
        subtask_index=0,
        parallelism=parallelism,
        max_parallelism=max_parallelism,
        clock=lambda: 0,
    )
    with contextlib.suppress(Exception):
        function.open(ctx)
    with contextlib.suppress(Exception):
        function.close()
    return list(recorder.keyed)


class DeclaredStates:
    """A function's declared keyed states, checked against each checkpoint a run starts from (once each).

    Args:
        operator_id: The operator whose stored states are compared.
        declared: What :func:`declared_states` recorded.
    """

    def __init__(
        self, operator_id: str, declared: list[tuple[StateDescriptor, TypeSerializer | None]]
    ) -> None:
        self.operator_id = operator_id
        self.declared = declared
        self._checked: set[str] = set()
        self._dropped: dict[str, dict[str, list[str]]] = {}

    def dropped(self, cp: CompletedCheckpoint | None) -> dict[str, list[str]]:
        """What a restore of ``cp`` drops of values it holds: state name to the changes that drop them.

        Known once :meth:`check` saw ``cp``; empty for None or a checkpoint of the declared schemas.
        """
        return {} if cp is None else self._dropped.get(cp.location, {})

    def check(self, cp: CompletedCheckpoint) -> None:
        """Refuse ``cp`` if a declared state cannot be restored from it, as the restore would.

        Every subtask's stored schema of each declared state is planned (a
        state only some subtasks migrated is checked in each form it has).

        Raises:
            StateMigrationError, IncompatibleSerializerError: Naming the state and both schemas.
        """
        if cp.location in self._checked or not self.declared:
            return
        stored: dict[str, dict[str, dict[str, Any]]] = {}
        for st in cp.metadata.operators.get(self.operator_id, []):
            for meta in st.states:
                name = meta.get("name") if isinstance(meta, dict) else None
                if isinstance(name, str) and not name.startswith(TIMER_STATE_PREFIX):
                    stored.setdefault(name, {})[json.dumps(meta, sort_keys=True, default=str)] = meta
        dropped: dict[str, list[str]] = {}
        for descriptor, namespaces in self.declared:
            for meta in stored.get(descriptor.name, {}).values():
                plan = RegisteredState.of(descriptor, namespaces).plan_from(dict(meta))
                for change in dropping_changes(plan.changes if plan is not None else ()):
                    if change not in dropped.setdefault(descriptor.name, []):
                        dropped[descriptor.name].append(change)
        self._dropped[cp.location] = {k: v for k, v in dropped.items() if v}
        self._checked.add(cp.location)
