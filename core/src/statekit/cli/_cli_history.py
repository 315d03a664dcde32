"""``statekit checkpoints history``: every recorded checkpoint attempt of a job, beyond retention.

Reads the job's checkpoint history (:mod:`statekit.checkpoints._history`):
completed, failed (with the reason), subsumed and discarded checkpoints and
savepoints, oldest first, with their trigger time, duration and sizes. A table
on a terminal, tab-separated lines in a pipe, ``--json`` for every field.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .._errors import CheckpointNotFoundError
from ..checkpoints._history import FAILED, CheckpointAttempt, read_checkpoint_history
from ._checkpoints_find import storage_for
from ._checkpoints_render import bytes_cell
from ._checkpoints_report import when
from ._cli import EXIT_OK, Cell, CommandContext, print_table

__all__ = ["HISTORY_COLUMNS", "add_history_action", "history_cells"]

HISTORY_COLUMNS = (
    "id",
    "kind",
    "status",
    "triggered",
    "duration ms",
    "snapshot ms",
    "upload ms",
    "metadata ms",
    "bytes",
    "written",
    "uploaded",
    "referenced",
    "backend",
    "parallelism",
    "batch",
    "location or failure",
)


def add_history_action(sub: Any) -> None:
    """Adds ``history`` to the ``checkpoints`` command's actions (``sub``: its subparsers)."""
    hist = sub.add_parser(
        "history",
        help="every recorded checkpoint attempt of a job (completed, failed and why, subsumed, discarded), "
        "beyond retention",
    )
    hist.add_argument("directory", help="the statekit.checkpoints.dir (any fsspec URL)")
    hist.add_argument("--job", required=True, help="the job id")
    hist.add_argument("--json", action="store_true", help="print JSON instead of a table")
    hist.add_argument("--storage-options", help="fsspec storage options as a JSON object")
    hist.set_defaults(action=_history)


def history_cells(a: CheckpointAttempt) -> tuple[Cell, ...]:
    """One row of the table: an attempt."""
    s = a.sizes
    return (
        str(a.checkpoint_id),
        a.kind,
        a.status,
        when(a.trigger_ms),
        f"{a.duration_ms:,}",
        _ms(a.snapshot_ms),
        _ms(a.upload_ms),
        _ms(a.metadata_ms),
        f"{s.full:,}",
        f"{s.written:,}",
        bytes_cell(s.uploaded),
        bytes_cell(s.referenced),
        s.backend or "-",
        str(s.parallelism) if s.parallelism else "-",  # a failed attempt records none: not 0 subtasks
        "-" if a.batch_id is None else str(a.batch_id),
        a.failure if a.status == FAILED and a.failure else a.location,
    )


def _ms(value: int | None) -> str:
    """A phase's milliseconds; ``-`` where not measured (a failed attempt, an older history)."""
    return "-" if value is None else f"{value:,}"


def _history(args: argparse.Namespace, ctx: CommandContext) -> int:
    storage = storage_for(ctx, args.directory, args.storage_options)
    attempts = read_checkpoint_history(storage, args.job)
    if not attempts:
        retained = storage.list_checkpoints(args.job)
        raise CheckpointNotFoundError(
            f"job {args.job!r} has no checkpoint history under {args.directory}"
            + (
                f" ({len(retained)} retained checkpoints: written by a statekit before histories, or with "
                "statekit.checkpoints.history.max-entries=0; statekit checkpoints list shows them)"
                if retained
                else "; check the directory and the job id (statekit checkpoints list <dir> shows the jobs)"
            )
        )
    if args.json:
        print(json.dumps([a.to_json() for a in attempts], indent=2))
        return EXIT_OK
    print_table(ctx.console, HISTORY_COLUMNS, [history_cells(a) for a in attempts])
    failed = sum(a.status == FAILED for a in attempts)
    ctx.note(
        f"{len(attempts)} attempts of job {args.job}: "
        f"{len(attempts) - failed} completed (subsumed and discarded included), {failed} failed"
    )
    return EXIT_OK
