"""How ``statekit state`` draws what it read: table cells, row counts, a progress bar of key-group blocks."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ._cli import CommandContext
from ._state_json import dumps

__all__ = ["Progressed", "cell", "progress_bar", "rows_text"]

Progressed = Callable[[int, int], None]


@contextlib.contextmanager
def progress_bar(ctx: CommandContext, title: str, enabled: bool) -> Iterator[Progressed | None]:
    if not enabled or not ctx.err_console.is_terminal:  # a log gets no bar (rich would leave a blank line)
        yield None
        return
    columns = (
        TextColumn(f"reading {escape(title)}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("key-group blocks"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=ctx.err_console, transient=True) as bar:
        task = bar.add_task("read", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def rows_text(n: int) -> str:
    return f"{n:,} row" if n == 1 else f"{n:,} rows"


def cell(value: Any) -> str | None:
    """A value as a table shows it: text as it is, anything else as JSON (escaped by print_table)."""
    if value is None:
        return None
    return value if isinstance(value, str) else dumps(value)
