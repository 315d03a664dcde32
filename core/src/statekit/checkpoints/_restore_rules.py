"""What a run checks of the checkpoint it starts from, before anything is restored, on every runner.

Both runners hand these checks to
:meth:`~statekit.checkpoints._coordinator.CheckpointCoordinator.validate`
with their :class:`RestoreRules`: the max parallelism and the operators the
checkpoint's state must match (:meth:`CompletedCheckpoint.validate
<statekit.checkpoints._restore.CompletedCheckpoint.validate>`), raw state the
function would not take back (:func:`check_raw_state_claimed`), and the
declared states' schemas (the runtime's ``DeclaredStates``, seen here as a
:class:`SchemaCheck`). A checkpoint's identity (its ``_metadata`` names the
job, id and kind of where it sits) is checked when it is loaded.

A checkpoint holding raw state of an operator whose function declares no
``restore_raw_state`` is refused before anything is restored, unless the run
allows non-restored state (then the raw state is dropped, with a warning
naming it), as Flink refuses state no operator claims without
``--allowNonRestoredState``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from .._errors import StateMigrationError
from ._restore import CompletedCheckpoint

__all__ = ["RestoreRules", "SchemaCheck", "check_raw_state_claimed"]

_LOG = logging.getLogger("statekit.state")


class SchemaCheck(Protocol):
    """Refuses a checkpoint whose stored schemas the declared states cannot be restored from."""

    def check(self, cp: CompletedCheckpoint) -> None: ...


@dataclass(frozen=True)
class RestoreRules:
    """What the checkpoint a run starts from must match: the run's operator, its function, its states.

    Attributes:
        operator_id: The function's operator.
        parallelism: Its parallelism in this run.
        function_name: How messages name the function.
        restores_raw_state: Whether the function declares ``restore_raw_state``.
        allow_non_restored_state: Whether state no operator of the run claims is dropped (else refused).
        schemas: Checks the declared states against the checkpoint's stored schemas.
        other_operators: The run's other operators that take state back, with their parallelism
            (the LocalRunner's source).
    """

    operator_id: str
    parallelism: int
    function_name: str
    restores_raw_state: bool
    allow_non_restored_state: bool
    schemas: SchemaCheck
    other_operators: Mapping[str, int] = field(default_factory=dict)


def check_raw_state_claimed(
    cp: CompletedCheckpoint,
    operator_id: str,
    function_name: str,
    *,
    restores: bool,
    allow_non_restored_state: bool,
) -> None:
    """Refuse, before anything is restored, raw state in ``cp`` that the function would not take back.

    ``restores``: whether the function (named ``function_name``) declares
    ``restore_raw_state`` (:func:`~statekit.runtime._function.declares_raw_restore`).

    Raises:
        StateMigrationError: If ``cp`` holds raw state of ``operator_id``, the
            function declares no ``restore_raw_state``, and non-restored state is not allowed.
    """
    if restores or not cp.has_raw_state(operator_id):
        return
    what = (
        f"{cp.location} holds raw state of operator {operator_id!r} (written by snapshot_raw_state), "
        f"but {function_name} declares no restore_raw_state to take it back"
    )
    if not allow_non_restored_state:
        raise StateMigrationError(
            f"{what}; define restore_raw_state, or pass allow_non_restored_state=True to drop it "
            "(as Flink's --allowNonRestoredState)"
        )
    _LOG.warning("%s: dropped, as allow_non_restored_state=True allows", what)
