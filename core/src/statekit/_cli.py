"""The ``statekit`` command line (also ``python -m statekit``).

Each subcommand is a function registered with :func:`command`; adding one is a
decorated function in this module (or a module this one imports)::

    def _configure_inspect(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("path")

    @command("inspect", "show a checkpoint", _configure_inspect)
    def _inspect(args: argparse.Namespace, ctx: CommandContext) -> int:
        ctx.console.print(args.path)
        return 0

A command that raises :class:`~statekit.StateError` prints one line to stderr and
exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ._errors import StateError
from ._registry import PluginRegistry, RegisteredPlugin, default_registry

__all__ = ["CommandContext", "build_parser", "command", "main"]


@dataclass
class CommandContext:
    """What a command may use: consoles and the plugin registry (loaded on first use)."""

    injected_registry: PluginRegistry | None = None
    console: Console = field(default_factory=Console)
    err_console: Console = field(default_factory=lambda: Console(stderr=True))

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
        print(f"statekit: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


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
        return 0
    if not records:
        ctx.console.print("No statekit plugins are installed.")
        return 0
    table = Table("kind", "name", "distribution", "version", "options", "description")
    for r in records:
        options = "\n".join(f"{o['name']}={o['default']!r} ({o['type']})" for o in r["options"])
        cells = (r["kind"], r["name"], r["distribution"], r["version"], options, r["description"])
        table.add_row(*map(escape, cells))  # "statekit[rocksdb]" is no markup
    ctx.console.print(table)
    return 0


# Commands that work on stored checkpoints live in their own module; importing it registers them.
from . import _cli_checkpoints as _cli_checkpoints  # noqa: E402

try:  # statekit state reads state as Arrow: it needs the optional pyarrow
    from .state_processor import _cli as _cli_state  # noqa: F401
except ModuleNotFoundError as _missing:
    if _missing.name != "pyarrow":
        raise
    _HINT = (
        'statekit state needs pyarrow, which is not installed. Install it with: pip install "statekit[arrow]"'
    )

    def _any_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("args", nargs="*")

    @command("state", f"read state as data ({_HINT})", _any_arguments)
    def _state_unavailable(args: argparse.Namespace, ctx: CommandContext) -> int:
        from ._errors import ConfigurationError

        raise ConfigurationError(_HINT)
