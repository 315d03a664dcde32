"""The checkpoint coordinator of one run of a job, for every runner: which checkpoint, when it exists.

As Flink has one ``CheckpointCoordinator`` whichever deployment runs a job,
the :class:`~statekit.LocalRunner` and the Spark driver hand the life of
their checkpoints to one :class:`CheckpointCoordinator`: the job's run
fence, checkpoint ids that only go up (above every completed checkpoint,
and one further when the run it displaced may still be writing), beginning
a checkpoint in a directory nothing else wrote into, completing it
(``_metadata`` last, right after the fence is checked again), the completion
notification of native snapshots (after completion only), cleaning up after
a failed one, retention, the count of periodic checkpoints failed in a row,
the job's checkpoint history (every attempt, beyond retention: ``_history``),
which checkpoint a run starts from (:func:`start_point`: a location, or
``"latest"`` with the runner's fallback policy), and what the checkpoint a run
starts from must match before anything is restored (:meth:`CheckpointCoordinator.validate`,
with the run's :class:`~._restore_rules.RestoreRules`).

What differs between the runners is policy they pass in
(:class:`CheckpointPolicy`), and who writes the subtasks' files: the
LocalRunner writes them through :meth:`CheckpointCoordinator.checkpoint`;
on Spark the tasks write them into the checkpoint the driver began, and the
driver completes it (:meth:`~CheckpointCoordinator.begin`,
:meth:`~CheckpointCoordinator.complete`, :meth:`~CheckpointCoordinator.abort`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._contracts import CheckpointStorage, CheckpointWriter
from .._errors import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError, FencedError
from ..plugins._registry import PluginRegistry
from ._fencing import RunFence
from ._history import CheckpointHistory
from ._metadata import SubtaskState
from ._restore import CompletedCheckpoint, load_checkpoint
from ._restore_rules import RestoreRules, check_raw_state_claimed
from ._retention import apply_retention, highest_checkpoint_id, named_checkpoint_id
from ._timing import CheckpointTiming, TimedWriter
from ._verify import verify_loaded
from ._writing import complete_checkpoint, discard_native_uploads

__all__ = [
    "CheckpointCoordinator",
    "CheckpointPolicy",
    "NotifyNative",
    "PendingCheckpoint",
    "StartPoint",
    "WriteSubtasks",
    "newest_checkpoint",
    "start_point",
]

#: Writes every subtask's state into a writer: ``(writer, max state size, native checkpoint id or
#: None for canonical)`` to the subtasks' metadata entries.
WriteSubtasks = Callable[[CheckpointWriter, "int | None", "int | None"], list[SubtaskState]]
#: Tells the backends that a checkpoint completed (True) or never will (False).
NotifyNative = Callable[[int, bool], None]


def _notify_nobody(checkpoint_id: int, complete: bool) -> None:
    """For runners whose backends learn of completion themselves (Spark's, at their next batch)."""


@dataclass(frozen=True)
class CheckpointPolicy:
    """What differs between the runners and both read; everything else the coordinator decides alike.

    Whether ``restore="latest"`` falls back past a damaged checkpoint and how
    many periodic checkpoints may fail in a row are the LocalRunner's alone
    (its configuration, given to :func:`start_point`
    and :meth:`CheckpointCoordinator.periodic`): a Spark query never falls
    back (its offset log must match the checkpoint it continues from) and
    tolerates no failed checkpoint (a micro-batch is committed with its
    checkpoint or not at all), so it passes ``fallback=False`` and never
    checkpoints periodically.

    Attributes:
        runner: How the run's fence record and the checkpoint history name it
            (``LocalRunner``, a Spark application).
        ways_out: Appended to the problem of a damaged checkpoint the
            coordinator does not fall back past: what the user can do.
    """

    runner: str
    ways_out: str


@dataclass(frozen=True)
class PendingCheckpoint:
    """A checkpoint begun and not yet complete: its id, the writer of its directory, when it began."""

    checkpoint_id: int
    writer: CheckpointWriter
    trigger_ms: int = field(default_factory=lambda: time.time_ns() // 1_000_000)

    @property
    def location(self) -> str:
        """Where it is being written."""
        return self.writer.location


def newest_checkpoint(
    storage: CheckpointStorage, job_id: str, ways_out: str = ""
) -> CompletedCheckpoint | None:
    """The newest completed checkpoint of ``job_id`` (its metadata read), if any.

    Read while the job runs (a driver's restore beside a still-running one, a
    client's ``restore="latest"``), the listed newest can be removed by the
    job's retention before its metadata is read: then a newer one is listed,
    and that one is read. A listed checkpoint that cannot be found, with no
    newer one listed, is an error.

    Raises:
        CheckpointNotFoundError: If the listed newest is gone and no newer one is listed.
        CorruptCheckpointError: If its metadata is damaged, with ``ways_out`` appended.
    """
    location = storage.latest_checkpoint(job_id)
    while location is not None:
        try:
            return load_checkpoint(storage, location)
        except CorruptCheckpointError as e:
            raise CorruptCheckpointError(e.location, e.problem + ways_out) from e
        except CheckpointNotFoundError:
            listed = storage.latest_checkpoint(job_id)
            if listed is None or not _newer(listed, location):
                raise  # not retention, which removes only what a newer one replaced
            location = listed
    return None


def _newer(listed: str, than: str) -> bool:
    """Whether ``listed`` is a newer checkpoint than ``than``, by their ``chk-<n>`` names."""
    new, old = named_checkpoint_id(listed), named_checkpoint_id(than)
    return new is not None and old is not None and new > old


def _problem_of(e: Exception) -> str:
    """What is wrong, without the ``checkpoint <location>:`` a CorruptCheckpointError starts with."""
    return e.problem if isinstance(e, CorruptCheckpointError) else str(e)


class CheckpointCoordinator:
    """The checkpoints of one run of one job.

    Args:
        storage: Where the checkpoints are.
        job_id: The job.
        max_parallelism: Written into every checkpoint's metadata.
        retained: Completed checkpoints kept (``statekit.checkpoints.retained``).
        native: Whether checkpoints are native where the backend has a format of its own.
        policy: What the runner decides for itself.
        registry: Whose hooks hear of completed checkpoints.
        history_entries: Attempts the job's checkpoint history keeps
            (``statekit.checkpoints.history.max-entries``; 0: none).
    """

    def __init__(
        self,
        storage: CheckpointStorage,
        job_id: str,
        *,
        max_parallelism: int,
        retained: int,
        native: bool,
        policy: CheckpointPolicy,
        registry: PluginRegistry,
        history_entries: int = 0,
    ) -> None:
        self.storage = storage
        self.job_id = job_id
        self.max_parallelism = max_parallelism
        self.retained = retained
        self.native = native
        self.policy = policy
        self.registry = registry
        # Claimed when the run first checkpoints (or is sure to), not when it only restores or
        # inspects: a runner made to look at a job's state does not fence the job's running one.
        self.fence = RunFence(storage, job_id, policy.runner)
        self.next_id = 1
        self._step_over = False  # the first checkpoint after claiming must skip an id (see claim)
        self._ids_known = False  # whether next_id is above every completed checkpoint
        self._checked: set[str] = set()  # checkpoints whose files were found there (see check)
        self._claimed: dict[str, bool] = {}  # checkpoint -> whether it is this job's, in this storage
        self.failed_in_a_row = 0  # periodic checkpoints that failed since the last one that completed
        self.last_completed = 0  # the id of the last checkpoint this run completed (0: none)
        self.last_timing = CheckpointTiming()  # the phases of that checkpoint (see _timing)
        self.history = CheckpointHistory(storage, job_id, history_entries, policy.runner)

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

    # --- taking checkpoints ---------------------------------------------------------------

    def begin(self) -> PendingCheckpoint:
        """The next checkpoint, in a directory nothing else was written into.

        Claims the job first (which may move the next id past a checkpoint a
        displaced run had in flight) and checks the fence: a fenced run writes
        nothing. Files of an earlier attempt at the same id that never
        completed (a run killed mid-checkpoint) are deleted. An id whose
        checkpoint is complete (one this run could not know of) is never
        written into: the ids move above every completed one and the next is tried.

        Raises:
            FencedError: If a newer run of the job took over; nothing is written or deleted.
            CheckpointError: If the store fails, or the job's checkpoints keep moving.
        """
        self.claim()
        self.fence.check()
        for _ in range(2):
            cid = self.next_id
            self.next_id += 1
            try:
                self.storage.begin_checkpoint(self.job_id, cid).abort()
            except CheckpointError:  # complete: move above every completed checkpoint
                highest = highest_checkpoint_id(self.storage, self.job_id)
                self.next_id = max(self.next_id, highest + 1)
                continue
            return PendingCheckpoint(cid, self.storage.begin_checkpoint(self.job_id, cid))
        raise CheckpointError(
            f"checkpoint {cid} of job {self.job_id!r} is complete already and the job's checkpoints keep "
            "moving: another run writes them without being fenced (check statekit.checkpoints.dir)"
        )

    def complete(
        self,
        pending: PendingCheckpoint,
        subtasks: Sequence[SubtaskState],
        properties: dict[str, Any],
        notify: NotifyNative = _notify_nobody,
        *,
        snapshot: float = 0.0,
        upload: float = 0.0,
    ) -> str:
        """Complete ``pending`` with the subtasks' entries (``_metadata`` last), then tell the backends.

        ``snapshot`` and ``upload`` are the seconds the subtasks' snapshots
        took (see :mod:`._timing`); with the time ``_metadata`` takes here and
        the time since the trigger they make :attr:`last_timing`, which the
        history records.

        The fence is checked right before ``_metadata`` (what makes the
        checkpoint exist). Native snapshots learn of the completion only after
        it (``notify``), as Flink's ``notifyCheckpointComplete``; then the
        ``statekit_checkpoint_completed`` hook. Returns the checkpoint's
        location. On an error nothing is cleaned up here: the caller aborts
        (see :meth:`abort`).

        Raises:
            FencedError: If a newer run took over.
            CheckpointError: If the metadata cannot be written.
        """
        cid = pending.checkpoint_id
        self.fence.check()
        t = time.perf_counter()
        location = complete_checkpoint(
            pending.writer,
            job_id=self.job_id,
            checkpoint_id=cid,
            max_parallelism=self.max_parallelism,
            subtasks=list(subtasks),
            properties=properties,
        )
        metadata = time.perf_counter() - t
        self.last_completed = cid
        self.last_timing = CheckpointTiming(
            snapshot, upload, metadata, max(0.0, time.time() - pending.trigger_ms / 1000)
        )
        # Written by retain(), which follows every completed checkpoint: one write holds the
        # attempt and what retention subsumed (flushed here if a hook fails before that).
        self.history.record(
            checkpoint_id=cid,
            kind="checkpoint",
            trigger_ms=pending.trigger_ms,
            location=location,
            subtasks=subtasks,
            properties=properties,
            write=False,
            timing=self.last_timing,
        )
        try:
            notify(cid, True)
            self.registry.hook.statekit_checkpoint_completed(
                job_id=self.job_id, checkpoint_id=cid, location=location
            )
        except BaseException:
            self.history.flush()
            raise
        return location

    def retain(self) -> None:
        """Retention after a completed checkpoint: the newest ``retained`` stay, with the files they share.

        Never raises for a failing store (what cannot be deleted now is warned
        of and tried again after the next checkpoint). Writes the checkpoint
        history: the completed attempt and what retention subsumed, in one write.
        """
        gone: list[str] = []
        try:
            gone = list(apply_retention(self.storage, self.job_id, self.retained))
        finally:
            self.history.subsumed(gone)

    def abort(
        self,
        pending: PendingCheckpoint,
        subtasks: Sequence[SubtaskState],
        error: BaseException,
        notify: NotifyNative = _notify_nobody,
    ) -> None:
        """``pending`` failed with ``error``: it never completes; delete what it wrote, unless fenced.

        A fenced run deletes nothing (the files may be the newer run's by now:
        its cleanup deletes ours); otherwise the checkpoint's directory and the
        native uploads of ``subtasks`` (the entries known when it failed) are
        deleted. A store that fails here (often why the checkpoint failed) leaves
        them to the cleanup after the next completed checkpoint, and ``error``
        says so in a note: it stays the error the caller raises. Either way the
        backends hear that the checkpoint never completes.
        """
        cid = pending.checkpoint_id
        if not isinstance(error, FencedError):  # a fenced run records nothing: the job is another's
            self.history.record(
                checkpoint_id=cid,
                kind="checkpoint",
                trigger_ms=pending.trigger_ms,
                location=pending.location,
                subtasks=subtasks,
                error=error,
            )
            try:
                pending.writer.abort()
                discard_native_uploads(self.storage, pending.location, list(subtasks), cid)
            except Exception as e:  # noqa: BLE001 - the checkpoint's own error is the one to raise
                error.add_note(
                    f"statekit could not delete what checkpoint {pending.location} wrote ({e}); "
                    "the cleanup after the next completed checkpoint deletes it"
                )
        notify(cid, False)

    def checkpoint(self, write: WriteSubtasks, properties: dict[str, Any], notify: NotifyNative) -> str:
        """Take a checkpoint in this process: begin it, ``write`` the subtasks, complete it.

        Raises:
            FencedError: If a newer run of the job took over; nothing is written or deleted.
            CheckpointError: If the checkpoint fails; the previous one stays the latest.
        """
        pending = self.begin()
        states: list[SubtaskState] = []
        try:
            timed = TimedWriter(pending.writer)
            t = time.perf_counter()
            states = write(timed, self.storage.max_state_size, pending.checkpoint_id if self.native else None)
            took = time.perf_counter() - t
            location = self.complete(
                pending, states, properties, notify,
                snapshot=max(0.0, took - timed.upload_seconds), upload=timed.upload_seconds,
            )  # fmt: skip
        except BaseException as e:
            if self.last_completed != pending.checkpoint_id:  # a failing hook or retention: it exists
                self.abort(pending, states, e, notify)
            raise
        self.retain()
        return location

    def periodic(
        self, take: Callable[[], str], checkpoints: list[str], failures: list[str], *, tolerable: int | None
    ) -> None:
        """Take a periodic checkpoint with ``take``; a failure is recorded, and tolerated up to a count.

        ``tolerable``: periodic checkpoints that may fail in a row (None: any number;
        ``statekit.checkpoint.tolerable-failures``).

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
        trigger_ms = time.time_ns() // 1_000_000
        states: list[SubtaskState] = []
        try:
            states = write(writer, None, None)
            location = complete_checkpoint(
                writer,
                job_id=self.job_id,
                checkpoint_id=self.next_id - 1,
                max_parallelism=self.max_parallelism,
                subtasks=states,
                kind="savepoint",
                properties=properties,
            )
        except BaseException as e:
            self.history.record(
                checkpoint_id=self.next_id - 1,
                kind="savepoint",
                trigger_ms=trigger_ms,
                location=writer.location,
                subtasks=states,
                error=e,
            )
            writer.abort()
            raise
        self.history.record(
            checkpoint_id=self.next_id - 1,
            kind="savepoint",
            trigger_ms=trigger_ms,
            location=location,
            subtasks=states,
            properties=properties,
        )
        return location

    # --- choosing what to restore -----------------------------------------------------------

    def validate(self, cp: CompletedCheckpoint, rules: RestoreRules) -> None:
        """Refuse ``cp``, before any state is touched, if the run of ``rules`` cannot restore it exactly.

        Its max parallelism must be the run's, every operator holding state
        must be one of the run's (unless non-restored state is allowed), raw
        state must have a function that takes it back (or be allowed to be
        dropped), and every declared state must be restorable from the schemas
        ``cp`` records; on both runners, before the first record or micro-batch.

        Raises:
            MaxParallelismMismatchError, StateMigrationError, IncompatibleSerializerError: Naming
                the checkpoint or state, and the way out.
        """
        cp.validate(
            max_parallelism=self.max_parallelism,
            operators={rules.operator_id: rules.parallelism, **rules.other_operators},
            allow_non_restored_state=rules.allow_non_restored_state,
        )
        check_raw_state_claimed(
            cp,
            rules.operator_id,
            rules.function_name,
            restores=rules.restores_raw_state,
            allow_non_restored_state=rules.allow_non_restored_state,
        )
        rules.schemas.check(cp)

    def newest(self) -> CompletedCheckpoint | None:
        """The job's newest completed checkpoint (its metadata read), if any.

        Raises:
            CorruptCheckpointError: If its metadata is damaged, with the policy's ways out.
        """
        return newest_checkpoint(self.storage, self.job_id, self.policy.ways_out)

    def check(self, cp: CompletedCheckpoint, *, found: bool = False) -> None:
        """Once per checkpoint: every file ``cp`` names is there with its size, before anything reads it.

        ``found``: the caller's :func:`start_point` already found them (it does
        for ``"latest"``, :attr:`StartPoint.files_found`): recorded, not looked at again.

        Raises:
            CorruptCheckpointError: Naming each damaged file, with the policy's ways out.
        """
        if cp.location in self._checked:
            return
        if found:
            self._checked.add(cp.location)
            return
        try:
            _checked(cp)
        except CorruptCheckpointError as e:
            raise CorruptCheckpointError(cp.location, e.problem + self.policy.ways_out) from e
        self._checked.add(cp.location)

    def claims(self, cp: CompletedCheckpoint | None, newest: CompletedCheckpoint | None = None) -> bool:
        """Whether ``cp`` is a completed checkpoint of this job in this storage (not a savepoint).

        Then a restored native instance may keep referencing its files (the
        completion contract's claim); a savepoint or another job's checkpoint
        is never claimed. ``newest``, the job's newest checkpoint if the caller
        knows it, spares a listing.
        """
        if cp is None or cp.metadata.kind != "checkpoint" or cp.metadata.job_id != self.job_id:
            return False
        if newest is not None and cp.location == newest.location:
            return True
        if cp.location not in self._claimed:
            self._claimed[cp.location] = cp.location in self.storage.list_checkpoints(self.job_id)
        return self._claimed[cp.location]


# --- choosing the checkpoint a run starts from ---------------------------------------------------


@dataclass(frozen=True)
class StartPoint:
    """The checkpoint a run starts from, chosen by :func:`start_point`.

    Attributes:
        checkpoint: What was taken (None: the job has no completed checkpoint, start empty).
        explicit: Whether the user named it (``restore=<location>``, Flink's ``run -s``)
            rather than ``"latest"``.
        skipped: ``(location, why)`` of each damaged newer checkpoint a fallback stepped past.
    """

    checkpoint: CompletedCheckpoint | None
    explicit: bool
    skipped: list[tuple[str, str]]

    @property
    def files_found(self) -> bool:
        """Whether :func:`start_point` found every file of the checkpoint with its size.

        It does for ``"latest"`` (so that a fallback can skip a damaged one); a
        named location goes to the restore as loaded, which names the operator
        and subtask of a damaged file.
        """
        return self.checkpoint is not None and not self.explicit


def start_point(
    storage: CheckpointStorage,
    job_id: str,
    restore: str,
    take: Callable[[CompletedCheckpoint], None] | None = None,
    *,
    fallback: bool,
    ways_out: str,
) -> StartPoint:
    """Choose the checkpoint a run of ``job_id`` starts from and hand it to ``take``: both runners' one path.

    ``restore`` is a checkpoint's or savepoint's location, or ``"latest"``:
    the job's newest completed checkpoint. Each candidate's metadata is read
    (its identity checked against where it sits); with ``"latest"`` every file
    it names is checked for presence and size too before ``take`` gets it (a
    fallback skips it then), while a named location goes to ``take`` as
    loaded, whose restore names the operator and subtask of what it finds
    damaged; ``take``, if given (the
    LocalRunner restores there, verifying every block as it reads; the Spark
    driver passes none and sizes the run from what was chosen, validating it
    before any task restores) raises without changing anything on damage. With ``"latest"``
    and ``fallback`` (the LocalRunner's ``statekit.restore.fallback``) a
    damaged candidate is skipped with a warning and the next older tried; a
    Spark query never falls back (its offset log must match the checkpoint it
    continues from). Anything but damage (an incompatible restore, a store
    outage) is raised at once.

    Raises:
        CorruptCheckpointError: If the location, or with ``"latest"`` the
            newest (every retained one, with fallback) is damaged; naming each
            damaged file, with ``ways_out`` (the runner's) where nothing is tried after it.
        CheckpointNotFoundError: If an explicit location holds no checkpoint.
    """
    if restore != "latest":
        try:
            cp = load_checkpoint(storage, restore)
        except CorruptCheckpointError as e:
            raise CorruptCheckpointError(e.location, e.problem + ways_out) from e
        if take is not None:
            take(cp)
        return StartPoint(cp, True, [])
    candidates = storage.list_checkpoints(job_id)
    skipped: list[tuple[str, str]] = []
    damage: list[str] = []  # what is wrong with each skipped one, for the final error
    queue = list(candidates)  # newest last
    while queue:
        candidate = queue.pop()
        try:
            cp = _checked(load_checkpoint(storage, candidate))
            if take is not None:
                take(cp)
        except (CorruptCheckpointError, CheckpointNotFoundError) as e:
            listed = storage.list_checkpoints(job_id)
            if candidate not in listed and listed and _newer(listed[-1], candidate):
                # Not damage: the job still runs, completed a newer one, and its retention removed
                # this one while it was read. Start again from the newest (as newest_checkpoint).
                tried = {location for location, _ in skipped}
                candidates, queue = listed, [c for c in listed if c not in tried]
                continue
            skipped.append((candidate, str(e)))
            damage.append(_problem_of(e))
            if not fallback:
                raise CorruptCheckpointError(candidate, _problem_of(e) + ways_out) from e
            older = len(queue)
            if older:  # with none older, the error below says it all
                warnings.warn(
                    f"restore skipped {e}; trying the next older of {older} retained checkpoints",
                    RuntimeWarning,
                    stacklevel=4,
                )
            continue
        return StartPoint(cp, False, skipped)
    if not skipped:
        return StartPoint(None, False, [])
    retained = len(candidates)
    raise CorruptCheckpointError(
        skipped[0][0],
        f"{'; '.join(damage)}. No retained checkpoint of job {job_id!r} can be restored "
        f"({retained} retained). Ways out: restore a savepoint (run(source, restore='<savepoint>')), "
        "or move the job's checkpoint directory away and start afresh"
        + (
            "; and keep statekit.checkpoints.retained at 2 or more, so a damaged checkpoint has an "
            "older one to fall back to"
            if retained < 2
            else ""
        ),
    )


def _checked(cp: CompletedCheckpoint) -> CompletedCheckpoint:
    """``cp``, once every file it names is found there with its size."""
    problems = verify_loaded(cp, deep=False)
    if problems:
        raise CorruptCheckpointError(cp.location, "; ".join(f"{p.file}: {p.problem}" for p in problems))
    return cp
