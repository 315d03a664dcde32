"""What a runner tells of a restore: its migrations' progress, and the states the function no longer declares.

A restore that migrates a large state (a declared :class:`~statekit.Migration`,
a widened type, TTL turned on) rewrites every entry, which takes minutes for
hundreds of millions. The keyed backend reports its progress
(``on_migration_progress``); a :class:`MigrationProgressLog` turns the
reports of one subtask into INFO lines of the ``statekit.state`` logger: when
a state's migration starts, every ``every`` entries or ``seconds`` seconds,
and when it ends. Every report also goes to the callback the job gave
(``LocalRunner(on_migration_progress=...)``).

A restored state the new function does not declare (removed from the code)
is kept and carried into every checkpoint, keyed and operator state alike;
:func:`warn_of_undeclared` names each at WARNING, and the runners put them in
their results (``RunResult.undeclared_states``, ``BatchInfo.undeclared_states``).

A restore that drops values the checkpoint holds (a dataclass field the
declared type no longer has: its values are gone after the next checkpoint)
is said where operators look, not only in ``statekit checkpoints inspect``:
:func:`warn_of_dropped` names each state and field at WARNING, the runners
put them in their results (``RunResult.dropped_fields``,
``BatchInfo.dropped_fields``), and the first checkpoint after the restore
records them in its properties (:data:`DROPPED_PROPERTY`), which the job's
checkpoint history shows (``statekit checkpoints history``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from ..state._migration import MigrationProgress

__all__ = [
    "DROPPED_PROPERTY",
    "MigrationProgressLog",
    "dropping_changes",
    "merge_undeclared",
    "warn_of_dropped",
    "warn_of_undeclared",
]

#: The checkpoint property naming what the restore before it dropped (state to changes).
DROPPED_PROPERTY = "restore_dropped_fields"
_DROPS = "(its values are dropped)"

_LOG = logging.getLogger("statekit.state")


class MigrationProgressLog:
    """A keyed backend's migration progress callback that logs at INFO, throttled, and forwards every report.

    Args:
        where: Who migrates, as the lines name it (``"operator 'process' subtask 2"``).
        callback: Also called with every report ``(state, done, total)``.
        every: A line at least every this many entries.
        seconds: A line at least every this many seconds (if entries were migrated since the last).
        clock: Seconds, monotonic (tests pass their own).
    """

    def __init__(
        self,
        where: str,
        callback: MigrationProgress | None = None,
        *,
        every: int = 1_000_000,
        seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.where = where
        self.callback = callback
        self.every = every
        self.seconds = seconds
        self.clock = clock
        self._started: dict[str, float] = {}
        self._last: dict[str, tuple[int, float]] = {}

    def __call__(self, state: str, done: int, total: int | None) -> None:
        """One report: ``done`` of ``total`` entries of ``state`` migrated (``total`` None: not known yet)."""
        now = self.clock()
        of = "" if total is None else f" of {total:,}"
        if state not in self._started:
            self._started[state] = now
            self._last[state] = (done, now)
            counted = "entries counted as it goes" if total is None else f"{total:,} entries"
            _LOG.info("%s: migrating state %r: %s", self.where, state, counted)
        last_done, last_time = self._last[state]
        if total is not None and done >= total:
            started = self._started.pop(state)
            del self._last[state]
            _LOG.info(
                "%s: migrated state %r: %s entries in %.1f s", self.where, state, f"{done:,}", now - started
            )
        elif done - last_done >= self.every or (done > last_done and now - last_time >= self.seconds):
            self._last[state] = (done, now)
            _LOG.info("%s: migrating state %r: %s%s entries", self.where, state, f"{done:,}", of)
        if self.callback is not None:
            self.callback(state, done, total)


def merge_undeclared(reports: Iterable[Mapping[str, Sequence[str]]]) -> dict[str, list[str]]:
    """The undeclared states of every subtask (``Subtask.undeclared_states``), by kind, each name once."""
    out: dict[str, set[str]] = {}
    for report in reports:
        for kind, names in report.items():
            out.setdefault(str(kind), set()).update(str(n) for n in names)
    return {kind: sorted(names) for kind, names in sorted(out.items())}


def warn_of_undeclared(where: str, restored_from: str | None, states: Mapping[str, Sequence[str]]) -> None:
    """One WARNING naming every restored state the function does not declare, by kind; none if none."""
    if not states:
        return
    named = "; ".join(f"{kind} state {', '.join(map(repr, names))}" for kind, names in states.items())
    _LOG.warning(
        "%s: %s holds %s, which the function does not declare (by the end of open). Kept and "
        "carried into every checkpoint: declare it again to use it, or drop it from a savepoint "
        "with the state processor (SavepointWriter.remove_state)",
        where,
        restored_from or "the restored checkpoint",
        named,
    )


def dropping_changes(changes: Iterable[str]) -> list[str]:
    """The changes of a migration plan that drop stored values (a removed dataclass field)."""
    return [c for c in changes if _DROPS in c]


def warn_of_dropped(where: str, restored_from: str | None, dropped: Mapping[str, Sequence[str]]) -> None:
    """One WARNING naming every state whose restore dropped stored values, and what; none if none."""
    if not dropped:
        return
    named = "; ".join(f"state {name!r}: {', '.join(changes)}" for name, changes in dropped.items())
    _LOG.warning(
        "%s: the restore of %s drops values it holds: %s. They are gone from the next checkpoint on; "
        "to keep them, restore that checkpoint with code that declares the fields (or a Migration)",
        where,
        restored_from or "the restored checkpoint",
        named,
    )
