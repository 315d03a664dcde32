"""``statekit savepoint convert|trigger``: a savepoint of a completed checkpoint, or of a running query.

``convert`` needs no running job; ``trigger`` asks a running query
(``_savepoint_trigger``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from ..checkpoints._convert import convert_to_savepoint
from ..checkpoints._locations import parent_location
from ._checkpoints_find import storage_for
from ._cli import EXIT_OK, CommandContext, command, full_location, printable
from ._savepoint_trigger import add_trigger_action

__all__: list[str] = []


def _configure_savepoint(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(title="actions", metavar="ACTION", required=True)
    conv = sub.add_parser(
        "convert",
        help="make a self-contained, relocatable canonical savepoint from a completed checkpoint",
    )
    conv.add_argument("checkpoint", help="a chk-<n> directory (any fsspec URL)")
    conv.add_argument("--target", required=True, help="the directory to create the savepoint in")
    conv.add_argument("--no-progress", action="store_true", help="do not draw a progress bar")
    conv.add_argument("--storage-options", help="fsspec storage options as a JSON object")
    conv.set_defaults(action=_convert)
    add_trigger_action(sub)


@command(
    "savepoint",
    "make savepoints from checkpoints, or of a running query (and stop it)",
    _configure_savepoint,
)
def _savepoint(args: argparse.Namespace, ctx: CommandContext) -> int:
    if hasattr(args, "checkpoint"):
        args.checkpoint = full_location(args.checkpoint)
    action: Callable[[argparse.Namespace, CommandContext], int] = args.action
    return action(args, ctx)


def _convert(args: argparse.Namespace, ctx: CommandContext) -> int:
    storage = storage_for(ctx, parent_location(args.checkpoint), args.storage_options)
    # A log gets no bar (rich would leave a blank line in it).
    if args.no_progress or not ctx.err_console.is_terminal:
        location = convert_to_savepoint(storage, args.checkpoint, args.target)
    else:
        columns = (TextColumn("copying"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        with Progress(*columns, console=ctx.err_console, transient=True) as bar:
            task = bar.add_task("copy", total=None)
            location = convert_to_savepoint(
                storage,
                args.checkpoint,
                args.target,
                progress=lambda d, t: bar.update(task, completed=d, total=t),
            )
    ctx.console.print(printable(f"savepoint written to {location}"), markup=False, soft_wrap=True)
    return EXIT_OK
