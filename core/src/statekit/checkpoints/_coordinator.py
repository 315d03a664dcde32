"""The checkpoint coordinator of the embedded runner: which checkpoint, when it exists, what to restore.

As Flink keeps its ``CheckpointCoordinator`` apart from the tasks, the
:class:`~statekit.LocalRunner` keeps its subtasks, sources and timers, and
hands the checkpoints' life to a :class:`CheckpointCoordinator`: the job's run
fence, checkpoint ids that only go up, writing a checkpoint through a callback
of the runner and completing it (``_metadata`` last), the completion
notification of native snapshots, retention, the count of periodic
checkpoints failed in a row, and which checkpoint ``restore="latest"``
restores when the newest is damaged.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from .._contracts import CheckpointStorage, CheckpointWriter
from .._errors import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError, FencedError
from ..plugins._registry import PluginRegistry
from ._fencing import RunFence
from ._metadata import SubtaskState
from ._restore import CompletedCheckpoint, load_checkpoint
from ._retention import apply_retention, highest_checkpoint_id
from ._verify import verify_loaded
from ._writing import complete_checkpoint, discard_native_uploads

__all__ = ["CheckpointCoordinator", "WriteSubtasks"]

#: Writes every subtask's state into a writer: ``(writer, max state size, native checkpoint id or
#: None for canonical)`` to the subtasks' metadata entries.
WriteSubtasks = Callable[[CheckpointWriter, "int | None", "int | None"], list[SubtaskState]]
#: Tells the backends that a checkpoint completed (True) or never will (False).
NotifyNative = Callable[[int, bool], None]


def _problem_of(e: Exception) -> str:
    """What is wrong, without the ``checkpoint <location>:`` a CorruptCheckpointError starts with."""
    return e.problem if isinstance(e, CorruptCheckpointError) else str(e)


class CheckpointCoordinator:
    """The checkpoints of one job run by one :class:`~statekit.LocalRunner`.

    Args:
        storage: Where the checkpoints are.
        job_id: The job.
        max_parallelism: Written into every checkpoint's metadata.
        retained: Completed checkpoints kept (``statekit.checkpoints.retained``).
        native: Whether checkpoints are native where the backend has a format of its own.
        tolerable_failures: Periodic checkpoints that may fail in a row; None: any number.
        fallback: Whether ``restore="latest"`` falls back past damaged checkpoints.
        registry: Whose hooks hear of completed checkpoints and restores.
    """

    def __init__(
        self,
        storage: CheckpointStorage,
        job_id: str,
        *,
        max_parallelism: int,
        retained: int,
        native: bool,
        tolerable_failures: int | None,
        fallback: bool,
        registry: PluginRegistry,
    ) -> None:
        self.storage = storage
        self.job_id = job_id
        self.max_parallelism = max_parallelism
        self.retained = retained
        self.native = native
        self.tolerable_failures = tolerable_failures
        self.fallback = fallback
        self.registry = registry
        # Claimed when the runner first runs or checkpoints, not when it only restores:
        # a runner made to inspect a job's state does not fence the job's running one.
        self.fence = RunFence(storage, job_id, "LocalRunner")
        self.next_id = 1
        self._step_over = False  # the first checkpoint after claiming must skip an id (see claim)
        self._ids_known = False  # whether next_id is above every completed checkpoint
        self.failed_in_a_row = 0  # periodic checkpoints that failed since the last one that completed
        self.last_completed = 0  # the id of the last checkpoint this run completed (0: none)

    # --- ids and fencing ----------------------------------------------------------------

    def claim(self) -> None:
        """Register this run as the job's newest (see statekit.checkpoints._fencing), if not yet done.

        The first claim also numbers this run's checkpoints above every completed
        one of the job, restored or not: an id is never used twice. If the run
        it displaces had not ended, that run may still be writing the checkpoint
        after the latest completed one, under the same file names this run would
        use: this run's checkpoints then start one id further. A store that
        fails here makes the next call try again.
        """
        if self.fence.epoch is None:
            self.fence.claim()
            self._step_over = self.fence.displaced is not None
            self._ids_known = False
        if self._ids_known:
            return
        highest = highest_checkpoint_id(self.storage, self.job_id)
        self.next_id = max(self.next_id, highest + (2 if self._step_over else 1))
        self._ids_known = True
        self._step_over = False

    def restored(self, cp: CompletedCheckpoint, highest: int) -> None:
        """The runner restored ``cp``: new ids go above it and above ``highest``, failures count afresh."""
        # Never an id that exists: chk-<n> of a newer checkpoint than the restored one stays untouched.
        self.next_id = max(self.next_id, cp.checkpoint_id, highest) + 1
        self.failed_in_a_row = 0  # a restored job starts counting afresh, as a restarted Flink job

    def end(self) -> None:
        """The run ended: its fence record says so."""
        self.fence.end()

    def _begin(self) -> tuple[int, CheckpointWriter]:
        """The id and writer of the next checkpoint, in a directory nothing else was written into.

        Files of an earlier attempt at the same id that never completed (a run
        killed mid-checkpoint) are deleted first. An id whose checkpoint is
        complete (one this run could not know of) is never written into: the ids
        move above every completed one and the next is tried.
        """
        for _ in range(2):
            cid = self.next_id
            self.next_id += 1
            try:
                self.storage.begin_checkpoint(self.job_id, cid).abort()
            except CheckpointError:  # complete: move above every completed checkpoint
                highest = highest_checkpoint_id(self.storage, self.job_id)
                self.next_id = max(self.next_id, highest + 1)
                continue
            return cid, self.storage.begin_checkpoint(self.job_id, cid)
        raise CheckpointError(
            f"checkpoint {cid} of job {self.job_id!r} is complete already and the job's checkpoints keep "
            "moving: another run writes them without being fenced (check statekit.checkpoints.dir)"
        )

    # --- taking checkpoints ---------------------------------------------------------------

    def checkpoint(self, write: WriteSubtasks, properties: dict[str, Any], notify: NotifyNative) -> str:
        """Take a checkpoint: ``write`` the subtasks, complete it, notify, apply retention.

        Raises:
            FencedError: If a newer run of the job took over; nothing is written or deleted.
            CheckpointError: If the checkpoint fails; the previous one stays the latest.
        """
        self.claim()  # may move the next id past a checkpoint the displaced run had in flight
        self.fence.check()  # before anything is written: a fenced run writes nothing
        cid, writer = self._begin()
        states: list[SubtaskState] = []
        try:
            states = write(writer, self.storage.max_state_size, cid if self.native else None)
            self.fence.check()  # last, right before _metadata: what makes the checkpoint exist
            location = complete_checkpoint(
                writer,
                job_id=self.job_id,
                checkpoint_id=cid,
                max_parallelism=self.max_parallelism,
                subtasks=states,
                properties=properties,
            )
        except FencedError:
            # The files may be the newer run's by now: delete nothing, its cleanup deletes ours.
            notify(cid, False)
            raise
        except BaseException:
            writer.abort()
            discard_native_uploads(self.storage, writer.location, states, cid)
            notify(cid, False)
            raise
        self.last_completed = cid
        # As Flink's notifyCheckpointComplete: from now on the backends may reference its uploads.
        notify(cid, True)
        self.registry.hook.statekit_checkpoint_completed(
            job_id=self.job_id, checkpoint_id=cid, location=location
        )
        apply_retention(self.storage, self.job_id, self.retained)
        return location

    def periodic(self, take: Callable[[], str], checkpoints: list[str], failures: list[str]) -> None:
        """Take a periodic checkpoint with ``take``; a failure is recorded, and tolerated up to a count.

        Raises:
            FencedError: If a newer run took over (never a tolerated failure).
            CheckpointError: If more checkpoints failed in a row than tolerable.
        """
        try:
            checkpoints.append(take())
        except FencedError:
            raise  # not a failed checkpoint: another run owns the job now, this one must stop
        except CheckpointError as e:
            # As in Flink, a failed checkpoint does not fail the job (the previous one stays),
            # unless more fail in a row than statekit.checkpoint.tolerable-failures.
            failures.append(str(e))
            self.failed_in_a_row += 1
            tolerable = self.tolerable_failures
            if tolerable is not None and self.failed_in_a_row > tolerable:
                raise CheckpointError(
                    f"{self.failed_in_a_row} checkpoints failed in a row, more than "
                    f"statekit.checkpoint.tolerable-failures={tolerable}: the job stops (restart it with "
                    f"restore='latest' once the cause is fixed). The last failure: {e}"
                ) from e
            warnings.warn(f"checkpoint failed, the job goes on: {e}", RuntimeWarning, stacklevel=3)
        else:
            self.failed_in_a_row = 0

    def savepoint(self, write: WriteSubtasks, properties: dict[str, Any], target_dir: str | None) -> str:
        """Take a savepoint: canonical, self-contained, never deleted by statekit."""
        writer = self.storage.begin_savepoint(self.job_id, target_dir)
        try:
            states = write(writer, None, None)
            return complete_checkpoint(
                writer,
                job_id=self.job_id,
                checkpoint_id=self.next_id - 1,
                max_parallelism=self.max_parallelism,
                subtasks=states,
                kind="savepoint",
                properties=properties,
            )
        except BaseException:
            writer.abort()
            raise

    # --- choosing what to restore -----------------------------------------------------------

    def restore_newest(
        self, restore: Callable[[CompletedCheckpoint], None]
    ) -> tuple[str | None, list[tuple[str, str]]]:
        """``restore`` the newest restorable checkpoint; returns its location and what was skipped.

        Newest first, each candidate is checked (its metadata, every file there
        with its size) and handed to ``restore``, which verifies every block as
        it reads and raises without changing anything on damage. A damaged one
        is skipped with a warning and the next older tried, unless the fallback
        is off. Anything but damage (an incompatible restore, a store outage)
        is raised at once.

        Raises:
            CorruptCheckpointError: If the newest is damaged and the fallback is
                off, or every retained checkpoint is damaged; naming each damaged file.
        """
        candidates = self.storage.list_checkpoints(self.job_id)
        skipped: list[tuple[str, str]] = []
        damage: list[str] = []  # what is wrong with each skipped one, for the final error
        for candidate in reversed(candidates):
            try:
                cp = load_checkpoint(self.storage, candidate)
                problems = verify_loaded(cp, deep=False)
                if problems:
                    found = "; ".join(f"{p.file}: {p.problem}" for p in problems)
                    raise CorruptCheckpointError(candidate, found)
                restore(cp)
            except (CorruptCheckpointError, CheckpointNotFoundError) as e:
                skipped.append((candidate, str(e)))
                damage.append(_problem_of(e))
                if not self.fallback:
                    raise CorruptCheckpointError(
                        candidate,
                        f"{_problem_of(e)}. statekit.restore.fallback is off, so no older checkpoint is "
                        "tried: restore one by its location (statekit checkpoints list shows them), or a "
                        "savepoint",
                    ) from e
                older = len(candidates) - len(skipped)
                if older:  # with none older, the error below says it all
                    warnings.warn(
                        f"restore skipped {e}; trying the next older of {older} retained checkpoints",
                        RuntimeWarning,
                        stacklevel=4,
                    )
                continue
            return candidate, skipped
        if not skipped:
            return None, []
        retained = len(candidates)
        raise CorruptCheckpointError(
            skipped[0][0],
            f"{'; '.join(damage)}. No retained checkpoint of job {self.job_id!r} can be restored "
            f"({retained} retained). Ways out: restore a savepoint (run(source, restore='<savepoint>')), "
            "or move the job's checkpoint directory away and start afresh"
            + (
                "; and keep statekit.checkpoints.retained at 2 or more, so a damaged checkpoint has an "
                "older one to fall back to"
                if retained < 2
                else ""
            ),
        )
