"""One subtask of an operator, as every runner holds it: its backends, its function, contexts and timers.

As Flink's ``StreamTaskStateInitializerImpl`` builds each task's keyed and
operator backends and its timer service whichever deployment runs it, a
:class:`Subtask` is made the same way by the :class:`~statekit.LocalRunner`,
a Spark task and the kit's job harness, all through :meth:`Subtask.make`:
:meth:`Subtask.create` makes the keyed backend from one
:class:`~statekit.state._parameters.KeyedBackendParameters` and the
operator backend from the same :class:`~statekit.StateBackend`;
:meth:`Subtask.bind` gives it the user's function with its runtime context,
timer service and the contexts ``process`` and ``on_timer`` get;
:meth:`Subtask.restore` restores its state from a checkpoint (keyed,
operator and raw state, the completion notice of a claimed checkpoint);
:meth:`Subtask.open` opens the function after a restore (giving it its raw
state first); :meth:`Subtask.restore_done` fires the ``statekit_restore_done``
hook for it; :meth:`Subtask.snapshot_raw` asks
the function for its raw state at a snapshot; :meth:`Subtask.close` closes
everything and removes the subtask's working directory.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from typing import Any, Self

from .._contracts import (
    KeyedStateBackend,
    OperatorStateBackend,
    StateBackend,
    SupportsNativeSnapshot,
    create_keyed_backend,
)
from ..checkpoints._restore import CompletedCheckpoint
from ..plugins._registry import PluginRegistry
from ..serialization._serializers import TypeSerializer
from ..state._keyed import KeyedBackendBase
from ..state._migration import MigrationProgress
from ..state._operator import OperatorSnapshot, OperatorStateBackendImpl
from ..state._parameters import KeyedBackendParameters
from ..state._raw import RawSnapshot
from ..state._ttl import Clock
from ..timers import ProcessingTimeHint
from ..timers._service import TimeDomain, TimerService
from ._function import (
    ColumnsContext,
    KeyedColumnsFunction,
    KeyedProcessFunction,
    OnTimerContext,
    ProcessContext,
    RuntimeContext,
    declares_raw_restore,
    declares_raw_snapshot,
    fire_timers,
    timer_service_for,
)
from ._migration_log import MigrationProgressLog
from ._raw import RawStateRestoreContext, RawStateSnapshotContext

__all__ = ["Subtask"]


class Subtask:
    """Subtask ``index`` of an operator: its keyed and operator state, and once bound its function.

    Attributes:
        index: The subtask's index.
        parameters: What its keyed backend was made from (key groups, serializer, directory).
        keyed: Its keyed backend.
        operator: Its operator backend.
        function: The user's function (after :meth:`bind`).
        ctx: What the function's ``open`` gets (after :meth:`bind`).
        timers: Its timer service (after :meth:`bind`).
        pctx: What ``process`` gets (after :meth:`bind`).
        tctx: What ``on_timer`` gets (after :meth:`bind`).
        opened: Whether the function was opened (and so must be closed).
        raw_restored: The raw state :meth:`open` gives the function, with the
            id of the checkpoint it came from (after :meth:`restore_raw`).
    """

    __slots__ = (
        "ctx",
        "function",
        "index",
        "keyed",
        "opened",
        "operator",
        "parameters",
        "pctx",
        "raw_restored",
        "tctx",
        "timers",
    )

    # Set by bind(); a subtask that only holds state (the kit's) never has them.
    function: KeyedProcessFunction
    ctx: RuntimeContext
    timers: TimerService
    pctx: ProcessContext
    tctx: OnTimerContext

    def __init__(
        self,
        index: int,
        parameters: KeyedBackendParameters,
        keyed: KeyedStateBackend,
        operator: OperatorStateBackend,
    ) -> None:
        self.index = index
        self.parameters = parameters
        self.keyed = keyed
        self.operator = operator
        self.opened = False
        self.raw_restored: tuple[RawSnapshot, int] | None = None

    @classmethod
    def create(
        cls,
        index: int,
        backend: StateBackend,
        parameters: KeyedBackendParameters,
        *,
        operator_backend: StateBackend | None = None,
        operator_id: str | None = None,
        migration_progress: MigrationProgress | None = None,
    ) -> Self:
        """A subtask whose keyed backend ``backend`` makes from ``parameters``, and its operator backend.

        The operator backend comes from ``operator_backend`` if given (the kit
        pairs cheap keyed backends with the backend under test), else from
        ``backend``. The subtask owns ``parameters.local_dir`` from here:
        it is removed when the subtask closes, or now if creating it fails.
        The progress of migrations its restores run is logged at INFO (naming
        ``operator_id`` and the subtask) and goes to ``migration_progress``.
        """
        try:
            keyed = create_keyed_backend(backend, parameters)
            try:
                operator = (operator_backend or backend).create_operator_backend()
            except BaseException:
                keyed.close()
                raise
        except BaseException:
            if parameters.local_dir is not None:
                shutil.rmtree(parameters.local_dir, ignore_errors=True)
            raise
        if isinstance(keyed, KeyedBackendBase):  # the backends that migrate: every one built on the base
            where = f"subtask {index}" if operator_id is None else f"operator {operator_id!r} subtask {index}"
            keyed.on_migration_progress(MigrationProgressLog(where, migration_progress))
        return cls(index, parameters, keyed, operator)

    @classmethod
    def make(
        cls,
        index: int,
        parallelism: int,
        backend: StateBackend,
        *,
        key_serializer: TypeSerializer,
        max_parallelism: int,
        clock: Clock,
        key_cache_size: int,
        local_dir: str,
        exact_entries: bool = True,
        operator_backend: StateBackend | None = None,
        operator_id: str | None = None,
        migration_progress: MigrationProgress | None = None,
        function: Callable[[], KeyedProcessFunction] | None = None,
        job_id: str = "",
        timer_clock: Callable[[], int] | None = None,
        hint: ProcessingTimeHint | None = None,
    ) -> Self:
        """Subtask ``index`` of ``parallelism``: the one factory of the LocalRunner, a Spark task and the kit.

        Its keyed backend owns Flink's key-group range of ``index``
        (:meth:`KeyedBackendParameters.of_subtask`) and works in ``local_dir``
        (owned by the subtask from here, see :meth:`create`). With
        ``function`` (a factory, called here) the subtask is bound to what it
        makes (:meth:`bind`, with ``job_id``, ``timer_clock`` and ``hint``); a
        subtask that only holds state (the kit's) has none. If anything fails,
        nothing is left open.
        """
        parameters = KeyedBackendParameters.of_subtask(
            index,
            parallelism,
            key_serializer=key_serializer,
            max_parallelism=max_parallelism,
            clock=clock,
            key_cache_size=key_cache_size,
            local_dir=local_dir,
            exact_entries=exact_entries,
        )
        st = cls.create(
            index,
            backend,
            parameters,
            operator_backend=operator_backend,
            operator_id=operator_id,
            migration_progress=migration_progress,
        )
        if function is not None:
            try:
                st.bind(
                    function(),
                    job_id=job_id,
                    parallelism=parallelism,
                    clock=clock,
                    timer_clock=timer_clock,
                    hint=hint,
                )
            except BaseException:
                st.discard()
                raise
        return st

    def bind(
        self,
        function: KeyedProcessFunction,
        *,
        job_id: str,
        parallelism: int,
        clock: Clock,
        timer_clock: Callable[[], int] | None = None,
        hint: ProcessingTimeHint | None = None,
    ) -> None:
        """Give the subtask ``function``, with its runtime context, timer service and contexts.

        ``clock`` is the processing time the context answers; ``timer_clock``
        the one processing-time timers fire by (default ``clock``: on Spark it
        is the micro-batch's timestamp); ``hint`` is shared with the runner,
        which learns the earliest processing-time timer from it.
        """
        params = self.parameters
        ctx = RuntimeContext(
            self.keyed,
            self.operator,
            job_id=job_id,
            subtask_index=self.index,
            parallelism=parallelism,
            max_parallelism=params.max_parallelism,
            clock=clock,
        )
        timers = timer_service_for(function, ctx, params.key_serializer, timer_clock or clock, hint)
        self.function, self.ctx, self.timers = function, ctx, timers
        self.pctx = (
            ColumnsContext(ctx, timers)
            if isinstance(function, KeyedColumnsFunction)
            else ProcessContext(ctx, timers)
        )
        self.tctx = OnTimerContext(ctx, timers)

    def restore(
        self,
        cp: CompletedCheckpoint,
        operator_id: str,
        parallelism: int,
        *,
        operator_states: list[OperatorSnapshot] | None = None,
        claimed: bool = False,
    ) -> None:
        """This subtask's state of ``operator_id`` from ``cp``, as every runner restores a subtask.

        Its keyed and operator state (``operator_states``: the operator's
        states of ``cp``, read once for all subtasks, if the caller has them),
        its raw state for :meth:`open` (:meth:`restore_raw`), and, when ``cp``
        is ``claimed`` (a completed checkpoint of this job in this storage,
        never a savepoint), the completion notice to a native keyed backend:
        the instance may keep referencing the files it restored. ``cp`` was
        validated for the run before (``CheckpointCoordinator.validate``).
        """
        cp.restore_subtask(
            operator_id, self.index, parallelism, self.keyed, self.operator, operator_states=operator_states
        )
        self.restore_raw(cp, operator_id, parallelism)
        if claimed and isinstance(self.keyed, SupportsNativeSnapshot):
            self.keyed.notify_checkpoint_complete(cp.checkpoint_id)

    def restore_done(self, registry: PluginRegistry, job_id: str, checkpoint_id: int | None) -> None:
        """Tell ``registry``'s ``statekit_restore_done`` hooks this subtask is restored (None: started empty).

        Every runner calls it once for each subtask it restores or starts afresh (after :meth:`bind`).
        """
        registry.hook.statekit_restore_done(
            job_id=job_id,
            checkpoint_id=checkpoint_id,
            subtask_index=self.index,
            parallelism=self.ctx.parallelism,
        )

    def restore_raw(self, cp: CompletedCheckpoint, operator_id: str, parallelism: int) -> None:
        """Read this subtask's raw state from ``cp`` for :meth:`open`, if the function takes raw state back.

        Every byte is read and checked here, before the function sees any. A
        function without ``restore_raw_state`` reads nothing: the runner
        refused (or was allowed to drop) ``cp``'s raw state before the restore
        (:func:`~._raw.check_raw_state_claimed`).
        """
        if declares_raw_restore(self.function):
            self.raw_restored = (cp.raw_state(operator_id, self.index, parallelism), cp.checkpoint_id)

    def snapshot_raw(self) -> RawSnapshot | None:
        """The raw state the function writes now (its ``snapshot_raw_state``); None if it writes none."""
        if not declares_raw_snapshot(self.function):
            return None
        ctx = RawStateSnapshotContext(self.parameters.key_group_range, self.index, self.ctx.parallelism)
        self.function.snapshot_raw_state(ctx)
        return ctx.snapshot()

    def open(self) -> None:
        """Open the function (its state is restored by now) and load the timers the state holds.

        A subtask restored from a checkpoint gives the function its raw state first (``restore_raw_state``).
        """
        if self.raw_restored is not None:
            (restored, checkpoint_id), self.raw_restored = self.raw_restored, None
            ctx = RawStateRestoreContext(self.parameters.key_group_range, restored, checkpoint_id)
            self.function.restore_raw_state(ctx)
        self.function.open(self.ctx)
        self.opened = True
        self.timers.restore_timers()

    def undeclared_states(self) -> dict[str, list[str]]:
        """Restored states the function did not declare in ``open``, by kind (``keyed``, ``operator``).

        They are kept and carried into every snapshot (a later version of the
        job may declare them again); runners name them, as a state removed from
        the code by mistake is otherwise noticed only when it is missed.
        """
        out: dict[str, list[str]] = {}
        if isinstance(self.keyed, KeyedBackendBase) and self.keyed.undeclared_state_names:
            out["keyed"] = sorted(self.keyed.undeclared_state_names)
        if isinstance(self.operator, OperatorStateBackendImpl) and self.operator.undeclared_state_names:
            out["operator"] = sorted(self.operator.undeclared_state_names)
        return out

    def fire(self, domain: TimeDomain, until: int, outputs: list[Any]) -> None:
        """Call ``on_timer`` for every timer of ``domain`` due at ``until``, collecting outputs."""
        outputs.extend(fire_timers(self.function, self.tctx, domain, until))

    def close(self) -> None:
        """Close the function (if opened), the keyed and operator backends; remove the working directory.

        Every step runs even if one before it fails; the first failure is raised after all of them.
        """
        steps: list[Callable[[], Any]] = []
        if self.opened:
            steps.append(self.function.close)
        steps += [self.keyed.close, self.operator.close]
        self.opened = False
        failure: BaseException | None = None
        for step in steps:
            try:
                step()
            except BaseException as e:  # noqa: BLE001 - raised below, after every step ran
                failure = failure or e
        if self.parameters.local_dir is not None:
            shutil.rmtree(self.parameters.local_dir, ignore_errors=True)
        if failure is not None:
            raise failure

    def discard(self) -> None:
        """:meth:`close`, best effort: for a subtask dropped while another error is on its way."""
        with contextlib.suppress(Exception):
            self.close()
