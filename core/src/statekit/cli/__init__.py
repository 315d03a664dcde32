"""The ``statekit`` command line: the command registry and every command module.

``_cli`` is the registry (:func:`~statekit.cli._cli.command`), the shared
output helpers and ``main``; each command module (``_cli_checkpoints``,
``_cli_savepoint``, ``_cli_state``) imports it and registers its commands.
This package imports every command module, so importing any part of it (the
console script imports ``statekit.cli._cli``) registers them all, and a
command module never needs to be imported by the registry: the registry sits
below the commands. A command's steps are modules named for them, below the
command module: ``_checkpoints_find``, ``_checkpoints_report`` and
``_checkpoints_render`` (``checkpoints``), ``_state_keys``, ``_state_json``, ``_state_render`` and
``_state_export`` (``state``).

May import every core package below it (``state_processor``, ``checkpoints``,
``plugins``, ``serialization``, ...); nothing but ``spark`` may import it, and
``spark`` does not.
"""

from __future__ import annotations

from .._errors import install_hint
from . import _cli_checkpoints as _cli_checkpoints
from . import _cli_savepoint as _cli_savepoint
from ._cli import unavailable_command

try:  # statekit state reads state as Arrow: it needs the optional pyarrow
    from . import _cli_state as _cli_state
except ModuleNotFoundError as _missing:
    if _missing.name != "pyarrow":
        raise
    unavailable_command(
        "state",
        "read state as data",
        "statekit state needs pyarrow, which is not installed. "
        f"Install it with: {install_hint('statekit[arrow]')}",
    )

__all__: list[str] = []
