"""``statekit savepoint trigger``: a savepoint of a running query, and stop-with-savepoint.

Writes a request into the job's files next to its checkpoints; the running
query honours it after its next micro-batch and answers (see
:mod:`statekit.checkpoints._savepoint_requests`). The command waits for the
answer and prints the savepoint's location, or fails with the reason.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .._errors import CheckpointError, CheckpointNotFoundError
from ..checkpoints._savepoint_requests import COMPLETED, describe, request_savepoint
from ._checkpoints_find import storage_for
from ._checkpoints_render import working
from ._cli import EXIT_OK, CommandContext, full_location, printable

__all__ = ["add_trigger_action"]


def add_trigger_action(sub: Any) -> None:
    """Adds ``trigger`` to the ``savepoint`` command's actions (``sub``: its subparsers)."""
    trig = sub.add_parser(
        "trigger",
        help="take a savepoint of a running query after its next micro-batch (--stop: then stop it)",
    )
    trig.add_argument("directory", help="the job's statekit.checkpoints.dir (any fsspec URL)")
    trig.add_argument("--job", required=True, help="the job id")
    trig.add_argument(
        "--target",
        help="the directory to create the savepoint in (default: the query's statekit.savepoints.dir)",
    )
    trig.add_argument(
        "--stop",
        action="store_true",
        help="stop the query after that micro-batch: nothing is processed after it",
    )
    trig.add_argument(
        "--timeout", type=float, default=600.0, help="seconds to wait for the next micro-batch (default 600)"
    )
    trig.add_argument("--json", action="store_true", help="print the answer as JSON")
    trig.add_argument("--storage-options", help="fsspec storage options as a JSON object")
    trig.set_defaults(action=_trigger)


def _trigger(args: argparse.Namespace, ctx: CommandContext) -> int:
    directory = full_location(args.directory)
    target = None if args.target is None else full_location(args.target)
    if args.timeout <= 0:
        raise CheckpointError(f"--timeout must be positive, not {args.timeout:g}")
    storage = storage_for(ctx, directory, args.storage_options)
    if not storage.list_checkpoints(args.job):
        # Before writing anything: a mistyped directory or job id gets no request files.
        raise CheckpointNotFoundError(
            f"job {args.job!r} has no completed checkpoint under {directory}: no query of it has run a "
            "micro-batch with this checkpoints directory (statekit checkpoints list <dir> shows the jobs)"
        )
    what = "a savepoint, then a stop," if args.stop else "a savepoint"
    with working(ctx, f"waiting for the next micro-batch of job {args.job} to take {what}"):
        response = request_savepoint(storage, args.job, target, stop=args.stop, timeout=args.timeout)
    if args.json:
        # The answer whatever it says: a script reads "status" and "failure" (a failure also
        # gets its one line on stderr and exit status 2 below).
        print(json.dumps(describe(response), indent=2), flush=True)
    if response.status != COMPLETED or response.location is None:
        raise CheckpointError(
            f"the savepoint of job {args.job!r} after micro-batch {response.batch_id} {response.status}: "
            f"{response.failure or 'the request came after its deadline'}"
            + (" (the query is stopped all the same)" if response.stopped else " (the query goes on)")
        )
    if args.json:
        return EXIT_OK
    done = "savepoint written to " + response.location
    ctx.console.print(printable(done), markup=False, soft_wrap=True)
    ctx.note(
        f"taken after micro-batch {response.batch_id} (checkpoint {response.checkpoint_id})"
        + ("; the query stops after it" if response.stopped else "; the query goes on")
    )
    return EXIT_OK
