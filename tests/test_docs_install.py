"""Every install command the docs show works as written on a fresh machine (issue 43).

statekit is not on PyPI: a plain ``pip install "statekit[rocksdb]"`` finds
nothing. Every ``pip install`` of a statekit distribution in README.md and
docs/ must take the wheels ``make wheels`` builds (``--find-links
wheelhouse``); tests/test_wheelhouse.py (nightly) runs each of them, as
written, in a fresh virtualenv next to a built ``wheelhouse/``.
"""

from __future__ import annotations

from docblocks import pip_commands


def test_every_statekit_install_command_names_the_wheelhouse() -> None:
    commands = pip_commands()
    assert len(commands) >= 8, commands  # README, spark.md, urlcount.md, the backends' pages, ...
    # statekit's own names come from the wheelhouse only: --no-index, or pinned by the constraints
    # `make wheels` writes (an index may serve another distribution under the same name, issue 45)
    plain = [
        f"{where}: {command}"
        for where, command in commands
        if "wheelhouse/constraints.txt" not in command and "--no-index --find-links wheelhouse" not in command
    ]
    assert plain == [], "statekit is not on PyPI: say -c wheelhouse/constraints.txt or --no-index"


def test_the_quickstart_names_what_to_install_when_its_example_is_missing() -> None:
    wanted = "pip install --find-links wheelhouse -c wheelhouse/constraints.txt statekit-urlcount"
    assert any(c == wanted and w.startswith("README.md") for w, c in pip_commands())
    readme = (pip_commands.__globals__["ROOT"] / "README.md").read_text(encoding="utf-8")
    quickstart = readme[readme.index("## Quickstart") : readme.index("```python runnable")]
    assert "No module named" in quickstart and "command not found" in quickstart and wanted in quickstart
