"""Tests of the statekit command line."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import statekit._cli as cli
from statekit._config import ConfigOption
from statekit._errors import ConfigurationError
from statekit._registry import BackendSpec, PluginRegistry, StorageSpec, hookimpl, reset_default_registry


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


def test_plugins_table(
    registry: PluginRegistry, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps cells to the terminal width
    assert cli.main(["plugins"], registry=registry) == 0
    out = capsys.readouterr().out
    for text in ("fakedb", "fakestore", "fake-dist", "cache-size=1024 (int)", "A [fake] backend."):
        assert text in out
    assert cli.main(["plugins"], registry=PluginRegistry()) == 0
    assert "No statekit plugins are installed." in capsys.readouterr().out


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
    src = Path(cli.__file__).resolve().parents[1]
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
