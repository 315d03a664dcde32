"""The ``statekit`` command line (also ``python -m statekit``).

This module is the registry of subcommands: each is a function registered with
:func:`command`, in this module or in a command module of this package that
imports it (``statekit.cli`` imports every command module, so importing this one
registers them all); adding one is a decorated function::

    def _configure_inspect(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("path")

    @command("inspect", "show a checkpoint", _configure_inspect)
    def _inspect(args: argparse.Namespace, ctx: CommandContext) -> int:
        ctx.console.print(args.path)
        return 0

A command that raises :class:`~statekit.errors.StateError` prints one line to stderr and
exits with status 2 (:data:`EXIT_ERROR`); the exit statuses are the same for
every command (:data:`EXIT_OK`, :data:`EXIT_PROBLEM`, :data:`EXIT_ERROR`,
:data:`EXIT_INTERRUPTED`, :data:`EXIT_BROKEN_PIPE`; docs/operations.md lists them).

Tables go through :func:`print_table`: drawn on a terminal, tab-separated when
stdout is a pipe or a file, never cut to a width, control characters escaped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from .._errors import ConfigurationError, StateError
from ..plugins._registry import PluginRegistry, RegisteredPlugin, default_registry
from ..snapshots._snapshot import CANONICAL_FORMAT

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_PROBLEM",
    "NOT_RECORDED",
    "Cell",
    "CommandContext",
    "build_parser",
    "command",
    "count_cell",
    "full_location",
    "main",
    "not_recorded_note",
    "print_table",
    "printable",
    "unavailable_command",
]

#: The command did what was asked, and found nothing wrong.
EXIT_OK = 0
#: The command did what was asked, and the answer is "no": ``checkpoints verify``
#: found a damaged checkpoint, ``state get`` found no value for the key.
EXIT_PROBLEM = 1
#: The command could not do what was asked: a usage error, nothing at the location,
#: no such job, an unreadable store, bad options, damaged data in its way, a file
#: it will not overwrite.
EXIT_ERROR = 2
#: Interrupted (Ctrl-C): 128 + SIGINT, as a shell reports it.
EXIT_INTERRUPTED = 130
#: Whoever read stdout stopped reading (``| head``): 128 + SIGPIPE, as for a program SIGPIPE ended.
EXIT_BROKEN_PIPE = 141

# C0 and C1 controls and DEL (a NUL, an escape sequence that recolours or retitles a
# terminal), line and paragraph separators, bidirectional overrides (text that reads
# differently than it is), lone surrogates (which cannot even be encoded).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_SHORT_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def printable(text: str) -> str:
    r"""``text`` with every control character written as its JSON escape.

    What a table shows of data it does not control (keys, values, ids, paths):
    ``"\x00malformed"`` is shown as ``\u0000malformed``, a tab as ``\t``, so no
    byte of the data reaches the terminal as a control and tab-separated output
    keeps its columns. The escapes are those ``--json`` uses.

    Example::

        >>> printable("\x00malformed\tx")
        '\\u0000malformed\\tx'
    """
    return _UNSAFE.sub(lambda m: _SHORT_ESCAPES.get(m[0]) or f"\\u{ord(m[0]):04x}", text)


def full_location(path: str) -> str:
    """``path`` as output names it: a local path made absolute, without a trailing ``/_metadata``.

    So every location a command prints, and every error it reports, is the full
    one whatever directory the command ran in. URLs stay as they are.
    """
    stripped = path.rstrip("/")
    if stripped and not stripped.endswith(":"):  # "/" and "memory://" stay what they are
        path = stripped
    if path.endswith("/_metadata"):
        path = path[: -len("/_metadata")]
    return os.path.abspath(os.path.expanduser(path)) if "://" not in path else path


#: A table cell: text, None (shown as ``null``), or lines (one per line on a terminal,
#: joined with ", " in tab-separated output).
Cell = str | None | Sequence[str]


def _cell_text(cell: Cell, separator: str) -> str:
    if cell is None:
        return "null"
    if isinstance(cell, str):
        return printable(cell)
    return separator.join(printable(line) for line in cell)


#: A table's cell for a number the checkpoint does not record (``--json`` has null), never a 0,
#: which would read as a measurement: RocksDB's and LMDB's native snapshots name no per-state sizes.
NOT_RECORDED = "not recorded"


def count_cell(n: int | None) -> str:
    """``1,234``, or :data:`NOT_RECORDED` for a number the checkpoint does not record (None)."""
    return NOT_RECORDED if n is None else f"{n:,}"


def not_recorded_note(subject: str, numbers: Sequence[str], formats: Sequence[str]) -> str:
    """The line under a table with :data:`NOT_RECORDED` cells: which numbers, where, and the way to them.

    ``numbers`` are "entries" and/or "bytes", ``formats`` the snapshot formats of ``subject``.
    A savepoint records them: ``savepoint convert`` writes native snapshots canonically, but copies
    a canonical one as it is (one written before per-state counts records bytes only).
    """
    where = ", ".join(formats) or "its"
    way_out = (
        "a canonical one written by an older statekit records none"
        if CANONICAL_FORMAT in formats
        else "a savepoint of the checkpoint records them (statekit savepoint convert)"
    )
    return f"{subject}: {' and '.join(numbers)} per state are {NOT_RECORDED} in {where} snapshots; {way_out}"


#: A word longer than this folds inside a drawn table (a path); shorter ones are never broken.
_FOLD_WIDTH = 20


def print_table(console: Console, columns: Sequence[str], rows: Iterable[Sequence[Cell]]) -> None:
    """Prints ``rows`` under ``columns``: a drawn table on a terminal, tab-separated lines elsewhere.

    On a terminal the table is drawn when it fits the terminal's width with
    no word of 20 characters or fewer broken (cells wrap at spaces; numbers,
    dates and names stay whole; longer words, paths, fold onto more lines,
    never cut). When it does not fit, each row is shown as a record, one ``column
    value`` line per column, as ``psql``'s expanded display (``\\x auto``)
    does: a table of 16 columns in 80 would otherwise break every number
    across lines. When stdout is a pipe or a file, one header line and one
    line per row, cells separated by tabs and nothing cut to a width, for
    ``cut -f`` and ``awk -F'\\t'``. Either way every cell goes through
    :func:`printable`, and none is read as rich markup.

    Args:
        console: Where to print; its ``is_terminal`` chooses the form.
        columns: The headings.
        rows: One sequence of cells per row, as many as ``columns``.
    """
    if not console.is_terminal:
        # Written past rich: it would expand the tabs into spaces.
        out = console.file
        out.write("\t".join(printable(c) for c in columns) + "\n")
        for row in rows:
            out.write("\t".join(_cell_text(cell, ", ") for cell in row) + "\n")
        out.flush()
        return
    texts = [[None if c is None else _cell_text(c, "\n") for c in row] for row in rows]
    headers = [printable(c) for c in columns]
    # Per column its longest word: a cell may wrap at spaces, but a number, a
    # date or a name is never broken; a longer word (a path) folds at _FOLD_WIDTH.
    words = [
        max(len(w) for cell in [h, *(r[i] or "null" for r in texts)] for w in [*cell.split(), ""])
        for i, h in enumerate(headers)
    ]
    # rich's box: one border plus a space either side of each cell.
    if sum(min(w, _FOLD_WIDTH) for w in words) + 3 * len(headers) + 1 <= console.width:
        # "fold": a path without spaces would otherwise be cut, ending in "…".
        table = Table(
            *(
                Column(header=Text(h), overflow="fold", min_width=w if w <= _FOLD_WIDTH else None)
                for h, w in zip(headers, words, strict=True)
            )
        )
        for r in texts:
            table.add_row(*(Text("null", style="dim") if c is None else Text(c) for c in r))
        console.print(table)
        return
    for n, r in enumerate(texts, 1):
        console.print(Text(f"-[ {n} of {len(texts)} ]-", style="bold"))
        record = Table.grid(Column(style="bold", no_wrap=True), Column(overflow="fold"), padding=(0, 2))
        for h, c in zip(headers, r, strict=True):
            record.add_row(Text(h), Text("null", style="dim") if c is None else Text(c))
        console.print(record)


@dataclass
class CommandContext:
    """What a command may use: consoles and the plugin registry (loaded on first use)."""

    injected_registry: PluginRegistry | None = None
    console: Console = field(default_factory=Console)
    err_console: Console = field(default_factory=lambda: Console(stderr=True))

    def note(self, text: str) -> None:
        """Prints a line about the output (a title, a row count), not part of it.

        On stdout on a terminal; on stderr when stdout is a pipe or a file, which
        then holds only the data. ``text`` is plain text, not markup.
        """
        console = self.console if self.console.is_terminal else self.err_console
        console.print(printable(text), markup=False, highlight=False, soft_wrap=True)

    @property
    def registry(self) -> PluginRegistry:
        """The plugin registry; plugins that fail to load are reported as warnings."""
        if self.injected_registry is None:
            # A CLI user should see "warning: ..." and not a Python warning's file and line.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self.injected_registry = default_registry()
            for warning in caught:
                self.err_console.print(f"statekit: warning: {warning.message}", markup=False, highlight=False)
        return self.injected_registry


Runner = Callable[[argparse.Namespace, CommandContext], int]


@dataclass(frozen=True)
class _Command:
    name: str
    summary: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Runner


_COMMANDS: dict[str, _Command] = {}


def command(
    name: str, summary: str, configure: Callable[[argparse.ArgumentParser], None] = lambda parser: None
) -> Callable[[Runner], Runner]:
    """Registers a subcommand: ``configure`` adds its arguments, the decorated function runs it.

    Args:
        name: The subcommand's name (``statekit <name>``).
        summary: One line for ``statekit --help``.
        configure: Adds arguments (or nested subparsers) to the subcommand's parser.
    """

    def decorate(run: Runner) -> Runner:
        _COMMANDS[name] = _Command(name, summary, configure, run)
        return run

    return decorate


def build_parser() -> argparse.ArgumentParser:
    """Builds the argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="statekit", description="Pluggable state backends for stream processing."
    )
    try:
        core_version = version("statekit-core")
    except PackageNotFoundError:
        core_version = "unknown (not installed)"
    parser.add_argument("--version", action="version", version=f"statekit-core {core_version}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    for cmd in _COMMANDS.values():
        sub = subparsers.add_parser(cmd.name, help=cmd.summary, description=cmd.summary)
        cmd.configure(sub)
        sub.set_defaults(run=cmd.run)
    return parser


def main(argv: Sequence[str] | None = None, *, registry: PluginRegistry | None = None) -> int:
    """Runs the command line and returns its exit status.

    Args:
        argv: The arguments after the program name; default ``sys.argv[1:]``.
        registry: The plugin registry to use instead of the installed plugins.
    """
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # usage errors and --help: return the status, do not exit
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    run: Runner = args.run
    try:
        return run(args, CommandContext(registry))
    except StateError as exc:
        print(f"statekit: error: {printable(' '.join(str(exc).split()))}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("statekit: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # Python would report the pipe again when it flushes stdout at exit: point it at nothing.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _plugin_record(plugin: RegisteredPlugin) -> dict[str, Any]:
    return {
        "kind": plugin.kind,
        "name": plugin.spec.name,
        "distribution": plugin.distribution,
        "version": plugin.version,
        "description": plugin.spec.description,
        "options": [
            {"name": o.name, "type": o.type_name, "default": o.default, "doc": o.doc}
            for o in plugin.spec.options
        ],
    }


def _configure_plugins(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


@command("plugins", "list the installed state backends and checkpoint storages", _configure_plugins)
def _plugins(args: argparse.Namespace, ctx: CommandContext) -> int:
    plugins = [*ctx.registry.backends().values(), *ctx.registry.storages().values()]
    records = [_plugin_record(plugin) for plugin in plugins]
    if args.json:
        print(json.dumps(records, indent=2, default=str))
        return EXIT_OK
    if not records:
        ctx.note("No statekit plugins are installed.")
        return EXIT_OK
    rows = [
        (
            r["kind"],
            r["name"],
            r["distribution"],
            r["version"],
            [f"{o['name']}={o['default']!r} ({o['type']})" for o in r["options"]],
            r["description"],
        )
        for r in records
    ]
    print_table(ctx.console, ("kind", "name", "distribution", "version", "options", "description"), rows)
    return EXIT_OK


def unavailable_command(name: str, summary: str, hint: str) -> None:
    """Registers ``name`` as a command whose optional dependency is missing.

    It accepts any arguments, options included (``statekit state show DIR
    --job J``), and fails with ``hint`` (what to install), so ``statekit
    --help`` still lists it and every other command works.

    Args:
        name: The subcommand's name.
        summary: What the command would do, for ``statekit --help`` (the hint follows it).
        hint: One sentence saying what is missing and how to install it.
    """

    def any_arguments(parser: argparse.ArgumentParser) -> None:
        # REMAINDER, not "*": options the real command would take must reach the hint, not argparse.
        parser.add_argument("args", nargs=argparse.REMAINDER)

    def fail(args: argparse.Namespace, ctx: CommandContext) -> int:
        raise ConfigurationError(hint)

    command(name, f"{summary} ({hint})", any_arguments)(fail)
