"""The subtasks of the LocalRunner's operator: made, routed to by key, restored, written, closed.

The :class:`~statekit.LocalRunner` runs one operator over ``p`` logical
subtasks in its process. :class:`OperatorSubtasks` keeps them: each a
:class:`~statekit.runtime._subtask.Subtask` with a fresh working directory
below one directory this process owns (removed when they close, when a
runner never closed is collected or the interpreter exits, and by a later
run if this one is killed), the key of a record routed to the subtask that owns its key
group (remembered for ``statekit.key-cache-size`` keys), a checkpoint's
state restored into fresh subtasks before they replace the running ones,
every subtask's state written into a checkpoint, and the backends told when
a native checkpoint completed or never will.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Callable
from typing import Any

from .._contracts import CheckpointWriter, StateBackend, SupportsNativeSnapshot
from .._localdirs import create_instance_dir
from ..checkpoints._metadata import SubtaskState
from ..checkpoints._restore import CompletedCheckpoint
from ..checkpoints._writing import write_subtask_state
from ..plugins._registry import PluginRegistry, default_registry
from ..serialization._keygroups import key_group_for_bytes, operator_index_for_key_group
from ..serialization._serializers import TypeSerializer
from ..state._migration import MigrationProgress
from ..state._ttl import Clock
from ..timers import ProcessingTimeHint
from ._function import KeyedProcessFunction
from ._subtask import Subtask

__all__ = ["OperatorSubtasks"]


def _remove_own_dir(path: str, owner: int) -> None:
    """Remove ``path`` if this is the process that made it (a forked child leaves its parent's alone)."""
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)


class OperatorSubtasks:
    """The ``parallelism`` subtasks of one operator of a :class:`~statekit.LocalRunner`.

    Attributes:
        subtasks: The current subtasks, by index (empty until made).
    """

    def __init__(
        self,
        backend: StateBackend,
        function_factory: Callable[[], KeyedProcessFunction],
        *,
        job_id: str,
        operator_id: str,
        key_serializer: TypeSerializer,
        parallelism: int,
        max_parallelism: int,
        clock: Clock,
        key_cache_size: int,
        local_dir_parent: str | None,
        exact_entries: bool = True,
        hint: ProcessingTimeHint,
        migration_progress: MigrationProgress | None = None,
        registry: PluginRegistry | None = None,
    ) -> None:
        self.backend = backend
        self.function_factory = function_factory
        self.job_id = job_id
        self.operator_id = operator_id
        self.key_serializer = key_serializer
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.clock = clock
        self.key_cache_size = key_cache_size
        self.local_dir_parent = local_dir_parent
        self.exact_entries = exact_entries
        self.hint = hint
        self.migration_progress = migration_progress
        self.registry = registry or default_registry()  # its statekit_restore_done hooks hear of each subtask
        self.subtasks: list[Subtask] = []
        self._route: dict[Any, int] = {}
        self._local_root: str | None = None
        # Removes the local root once: at close, or when a runner never closed is collected.
        self._remove_root: weakref.finalize[Any, Any] | None = None

    # --- making them -----------------------------------------------------------------

    def ensure(self) -> list[Subtask]:
        """The subtasks, made now if there are none yet (each starting empty: the restore hook says so)."""
        if not self.subtasks:
            self.subtasks = self.create()
            self.restore_done(None)
        return self.subtasks

    def restore_done(self, checkpoint_id: int | None) -> None:
        """Each subtask's ``statekit_restore_done`` hook: restored from ``checkpoint_id`` (None: empty)."""
        for st in self.subtasks:
            st.restore_done(self.registry, self.job_id, checkpoint_id)

    def create(self) -> list[Subtask]:
        """``parallelism`` fresh subtasks with the function bound (not installed: see :meth:`replace`)."""
        subtasks: list[Subtask] = []
        try:
            for i in range(self.parallelism):
                subtasks.append(self._create_subtask(i))
        except BaseException:
            for st in subtasks:
                st.discard()
            raise
        return subtasks

    def _create_subtask(self, i: int) -> Subtask:
        return Subtask.make(
            i,
            self.parallelism,
            self.backend,
            key_serializer=self.key_serializer,
            max_parallelism=self.max_parallelism,
            clock=self.clock,
            key_cache_size=self.key_cache_size,
            local_dir=self._local_dir(i),
            exact_entries=self.exact_entries,
            operator_id=self.operator_id,
            migration_progress=self.migration_progress,
            function=self.function_factory,
            job_id=self.job_id,
            hint=self.hint,
        )

    def _local_dir(self, index: int) -> str:
        """A fresh working directory for subtask ``index``'s keyed backend (removed when it closes)."""
        if self._local_root is None:
            # Owned by this process: a later run removes it if this one is killed.
            root = create_instance_dir(self.local_dir_parent, f"statekit-{self.job_id}-")
            self._local_root = root
            # A runner dropped without close() (no ``with``) must not leave its directory, with
            # its backends' files, until the process ends: removed when this is collected.
            self._remove_root = weakref.finalize(self, _remove_own_dir, root, os.getpid())
        return tempfile.mkdtemp(prefix=f"{self.operator_id}-{index}-", dir=self._local_root)

    # --- restoring -------------------------------------------------------------------

    def restored(self, cp: CompletedCheckpoint, *, claimed: bool) -> list[Subtask]:
        """Fresh subtasks holding ``cp``'s state of the operator; nothing changes here if it fails.

        ``cp`` was validated for the run (``CheckpointCoordinator.validate``) before; ``claimed``:
        it is a completed checkpoint of this job, whose files restored native instances may keep
        referencing (the completion contract's claim); never a savepoint.
        """
        fresh = self.create()
        try:
            op_states = cp.operator_states(self.operator_id, self.parallelism)
            for st in fresh:
                st.restore(cp, self.operator_id, self.parallelism, operator_states=op_states, claimed=claimed)
        except BaseException:
            for st in fresh:
                st.discard()
            raise
        return fresh

    def replace(self, fresh: list[Subtask]) -> None:
        """Run ``fresh`` from now on (the subtasks before are closed)."""
        replaced, self.subtasks = self.subtasks, fresh
        for st in replaced:
            st.close()

    # --- running -------------------------------------------------------------------

    def index_of(self, key: Any) -> int:
        """The subtask that owns ``key``'s key group (remembered for the next records of the key)."""
        i = self._route.get(key)
        if i is None:
            kg = key_group_for_bytes(self.key_serializer.serialize(key), self.max_parallelism)
            i = operator_index_for_key_group(self.max_parallelism, self.parallelism, kg)
            if len(self._route) >= self.key_cache_size:
                self._route.clear()
            self._route[key] = i
        return i

    def of_key(self, key: Any) -> Subtask:
        """The subtask that owns ``key``'s key group."""
        return self.subtasks[self.index_of(key)]

    def open(self, watermark: int) -> None:
        """Open every subtask's function, its timers at ``watermark``."""
        for st in self.ensure():
            st.open()
            st.timers.set_watermark(watermark)

    def write(
        self, writer: CheckpointWriter, max_state_size: int | None, native_checkpoint_id: int | None
    ) -> list[SubtaskState]:
        """Every subtask's state into ``writer``; their metadata entries."""
        return [
            write_subtask_state(
                writer,
                self.operator_id,
                i,
                st.keyed,
                st.operator,
                max_state_size=max_state_size,
                native_checkpoint_id=native_checkpoint_id,
                raw=st.snapshot_raw(),
            )
            for i, st in enumerate(self.subtasks)
        ]

    def notify(self, checkpoint_id: int, complete: bool) -> None:
        """Tell every native backend that checkpoint ``checkpoint_id`` completed, or never will."""
        for st in self.subtasks:
            keyed = st.keyed
            if isinstance(keyed, SupportsNativeSnapshot):
                if complete:
                    keyed.notify_checkpoint_complete(checkpoint_id)
                else:
                    keyed.notify_checkpoint_aborted(checkpoint_id)

    def close(self) -> None:
        """Close every subtask and remove the process's directory; the first failure is raised after all."""
        subtasks, self.subtasks = self.subtasks, []
        failure: BaseException | None = None
        for st in subtasks:
            try:
                st.close()
            except BaseException as e:  # noqa: BLE001 - raised below, once every subtask is closed
                failure = failure or e
        if self._remove_root is not None:
            self._remove_root()  # removes the directory, once
            self._remove_root = self._local_root = None
        if failure is not None:
            raise failure
