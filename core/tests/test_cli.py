"""Tests of the statekit command line."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import statekit.cli._cli as cli
from statekit._errors import ConfigurationError, install_hint
from statekit.plugins._config import ConfigOption
from statekit.plugins._registry import (
    BackendSpec,
    PluginRegistry,
    StorageSpec,
    hookimpl,
    reset_default_registry,
)


class _FakePlugin:
    @hookimpl
    def statekit_register_backends(self, register: Any) -> None:
        options = (ConfigOption("cache-size", int, 1024, "Bytes of cache."),)
        register(BackendSpec("fakedb", "fake_engine:make", options, "A [fake] backend."))

    @hookimpl
    def statekit_register_storages(self, register: Any) -> None:
        register(StorageSpec("fakestore", dict))


@pytest.fixture
def registry() -> PluginRegistry:
    registry = PluginRegistry()
    registry.register_plugin(_FakePlugin(), "fake-dist", "1.2")
    return registry


def test_plugins_json(registry: PluginRegistry, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plugins", "--json"], registry=registry) == 0
    assert json.loads(capsys.readouterr().out) == [
        {
            "kind": "backend",
            "name": "fakedb",
            "distribution": "fake-dist",
            "version": "1.2",
            "description": "A [fake] backend.",
            "options": [{"name": "cache-size", "type": "int", "default": 1024, "doc": "Bytes of cache."}],
        },
        {
            "kind": "storage",
            "name": "fakestore",
            "distribution": "fake-dist",
            "version": "1.2",
            "description": "",
            "options": [],
        },
    ]


def test_plugins_table_piped_is_tab_separated(
    registry: PluginRegistry, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["plugins"], registry=registry) == 0  # capsys: stdout is no terminal
    assert capsys.readouterr().out.splitlines() == [
        "kind\tname\tdistribution\tversion\toptions\tdescription",
        "backend\tfakedb\tfake-dist\t1.2\tcache-size=1024 (int)\tA [fake] backend.",
        "storage\tfakestore\tfake-dist\t1.2\t\t",
    ]
    assert cli.main(["plugins"], registry=PluginRegistry()) == 0
    captured = capsys.readouterr()  # the note is no data: stdout stays empty for a script
    assert (captured.out, captured.err) == ("", "No statekit plugins are installed.\n")


def test_plugins_table_on_a_terminal(registry: PluginRegistry) -> None:
    buf = io.StringIO()
    terminal = Console(file=buf, force_terminal=True, width=200, color_system=None)
    ctx = cli.CommandContext(registry, console=terminal)
    args = cli.build_parser().parse_args(["plugins"])
    assert args.run(args, ctx) == 0
    out = buf.getvalue()
    assert "┃ kind" in out
    for text in ("fakedb", "fakestore", "fake-dist", "cache-size=1024 (int)", "A [fake] backend."):
        assert text in out


# --- tables and escaping ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x00malformed", "\\u0000malformed"),
        ("a\tb\nc\rd", "a\\tb\\nc\\rd"),
        ("\x1b[31mred\x1b[0m", "\\u001b[31mred\\u001b[0m"),
        ("del\x7f c1\x9b", "del\\u007f c1\\u009b"),
        ("\u202eevil\u2066 \u2028", "\\u202eevil\\u2066 \\u2028"),
        ("/api/ü/€/日本 😀 a b", "/api/ü/€/日本 😀 a b"),  # printable text stays as it is
    ],
)
def test_printable_escapes_control_characters_as_json_does(text: str, shown: str) -> None:
    assert cli.printable(text) == shown
    if text.isascii():
        assert cli.printable(text) == json.dumps(text)[1:-1]  # the escapes --json shows


def test_print_table_piped_is_uncut_tab_separated_and_escaped() -> None:
    buf = io.StringIO()
    long_path = "/data/" + "x" * 300 + "/chk-1"
    cli.print_table(
        Console(file=buf, width=80),  # not a terminal, and narrow: nothing may be cut anyway
        ("key", "value", "where"),
        [("\x00malformed", None, long_path), ("tab\there", ["a", "b"], "-")],
    )
    assert buf.getvalue().splitlines() == [
        "key\tvalue\twhere",
        f"\\u0000malformed\tnull\t{long_path}",
        "tab\\there\ta, b\t-",
    ]


def test_print_table_on_a_terminal_folds_long_cells_and_shows_no_control_character() -> None:
    buf = io.StringIO()
    long_path = "/data/" + "x" * 150 + "/chk-1"
    cli.print_table(
        Console(file=buf, force_terminal=True, width=60, color_system=None),
        ("key", "where"),
        [("\x00m\x1b]0;title\x07", long_path), ("[bold]not markup[/]", "-")],
    )
    out = buf.getvalue()
    assert "…" not in out
    assert not any(ord(c) < 32 and c != "\n" for c in out)
    cells = "".join(line.split("│")[2].strip() for line in out.splitlines() if line.count("│") == 3)
    assert long_path in cells  # folded over several lines, every character there
    assert "\\u0000m\\u001b]0;title\\u0007" in out and "[bold]not markup[/]" in out


def test_a_note_goes_to_stdout_on_a_terminal_and_to_stderr_otherwise() -> None:
    out, err = io.StringIO(), io.StringIO()
    cli.CommandContext(console=Console(file=out), err_console=Console(file=err)).note("3 rows\x00")
    assert (out.getvalue(), err.getvalue()) == ("", "3 rows\\u0000\n")
    out, err = io.StringIO(), io.StringIO()
    terminal = Console(file=out, force_terminal=True, color_system=None)
    cli.CommandContext(console=terminal, err_console=Console(file=err)).note("3 rows")
    assert (out.getvalue(), err.getvalue()) == ("3 rows\n", "")


# --- exit statuses ---------------------------------------------------------------------


def test_exit_statuses_are_the_documented_ones() -> None:
    assert (cli.EXIT_OK, cli.EXIT_PROBLEM, cli.EXIT_ERROR) == (0, 1, 2)
    assert (cli.EXIT_INTERRUPTED, cli.EXIT_BROKEN_PIPE) == (130, 141)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    for status in (0, 1, 2, 130, 141):
        assert f"| {status} |" in doc


@pytest.mark.parametrize(
    ("raised", "status", "err"),
    [
        (KeyboardInterrupt(), 130, "statekit: interrupted\n"),
        (ConfigurationError("key '\x1b[2J' is\tbad"), 2, "statekit: error: key '\\u001b[2J' is bad\n"),
    ],
)
def test_interrupt_and_errors_with_control_characters(
    raised: BaseException,
    status: int,
    err: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(cli, "_COMMANDS", dict(cli._COMMANDS))

    @cli.command("fail", "always fails")
    def _fail(args: argparse.Namespace, ctx: cli.CommandContext) -> int:
        raise raised

    assert cli.main(["fail"]) == status
    assert capsys.readouterr().err == err


def test_a_reader_that_stops_reading_ends_the_command_quietly_with_141() -> None:
    src = Path(cli.__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    code = (
        "import sys\n"
        "from statekit.cli import _cli as cli\n"
        "@cli.command('many', 'prints many rows')\n"
        "def _many(args, ctx):\n"
        "    cli.print_table(ctx.console, ['n'], ([str(i)] for i in range(10**6)))\n"
        "    return 0\n"
        "sys.exit(cli.main(['many']))\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.readline() == b"n\n"
    child.stdout.close()  # as `| head -1` does
    assert child.wait(timeout=60) == 141
    assert child.stderr.read() == b""  # no traceback


def test_state_error_is_one_line_on_stderr_and_status_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_COMMANDS", dict(cli._COMMANDS))

    @cli.command("fail", "always fails")
    def _fail(args: argparse.Namespace, ctx: cli.CommandContext) -> int:
        raise ConfigurationError("bad\nvalue")

    assert cli.main(["fail"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "statekit: error: bad value\n"
    assert captured.out == ""


def test_usage_errors_and_help_return_a_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert cli.main(["no-such-command"]) == 2
    assert cli.main(["--help"]) == 0
    assert "plugins" in capsys.readouterr().out


def test_broken_plugin_in_strict_mode_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cli_broken_plugin.py").write_text("raise ImportError('engine missing')\n")
    info = tmp_path / "cli-broken-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cli-broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[statekit]\nbroken = cli_broken_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reset_default_registry()
    try:
        assert cli.main(["plugins", "--json"]) == 0
        assert "statekit: warning: skipped plugin 'broken'" in capsys.readouterr().err
        reset_default_registry()
        monkeypatch.setenv("STATEKIT_STRICT_PLUGINS", "1")
        assert cli.main(["plugins"]) == 2
        assert capsys.readouterr().err.startswith("statekit: error: cannot load plugin 'broken'")
    finally:
        reset_default_registry()


def test_python_dash_m_statekit() -> None:
    src = Path(cli.__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "statekit", "plugins", "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert isinstance(json.loads(result.stdout), list)


def test_state_without_pyarrow_says_what_to_install_for_the_documented_command(tmp_path: Path) -> None:
    """Issue 33: `statekit state show DIR --job J --operator ...` without pyarrow got argparse's
    "unrecognized arguments" instead of the install hint; the options must reach the hint."""
    blocked = (
        "import sys; sys.modules['pyarrow'] = None\n"  # as if statekit[arrow] were not installed
        "from statekit.cli._cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    argv = ["state", "show", str(tmp_path), "--job", "urlcount", "--operator", "process", "--state", "count"]
    done = subprocess.run(
        [sys.executable, "-c", blocked, *argv, "--limit", "3"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert "unrecognized arguments" not in done.stderr
    assert done.stderr.strip() == (
        "statekit: error: statekit state needs pyarrow, which is not installed. "
        f"Install it with: {install_hint('statekit[arrow]')}"
    )
