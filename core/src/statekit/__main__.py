"""Runs the statekit command line: ``python -m statekit``."""

from .cli._cli import main

__all__: list[str] = []

raise SystemExit(main())
