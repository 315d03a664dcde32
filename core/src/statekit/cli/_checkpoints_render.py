"""How ``statekit checkpoints`` draws what it found: table rows, counts, a spinner while it reads."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from rich.markup import escape

from ._cli import Cell, CommandContext, printable

__all__ = ["LIST_COLUMNS", "plural", "list_cells", "relative_to", "ttl_cell", "working"]


@contextlib.contextmanager
def working(ctx: CommandContext, what: str) -> Iterator[None]:
    """A spinner saying ``what`` on a terminal's stderr; nothing in a log."""
    if not ctx.err_console.is_terminal:
        yield
        return
    with ctx.err_console.status(escape(printable(what))):
        yield


def relative_to(location: str, file: str) -> str:
    """``file`` relative to ``location`` when it lies there (a table has the location in a column)."""
    for prefix in (location.rstrip("/") + "/", "file://" + location.rstrip("/") + "/"):
        if file.startswith(prefix):
            return file[len(prefix) :]
    return file


LIST_COLUMNS = (
    "job",
    "id",
    "time",
    "backend",
    "operators (parallelism)",
    "entries",
    "bytes",
    "status",
    "location",
)


def list_cells(r: dict[str, Any]) -> tuple[Cell, ...]:
    status = r["status"]
    if r["problems"]:
        status += ": " + "; ".join(
            f"{relative_to(r['location'], p['file'])}: {p['problem']}" for p in r["problems"]
        )
    if r["kind"] is None:  # the metadata could not be read: nothing but the path is known
        known: tuple[Cell, ...] = ("-",) * 5
    else:
        ops = r["operators"].values()
        known = (
            r["time"],
            r["backend"] or "-",
            ", ".join(f"{op} ({o['parallelism']})" for op, o in r["operators"].items()),
            f"{sum(o['entries'] for o in ops):,}",
            f"{sum(o['bytes'] for o in ops):,}",
        )
    number = "-" if r["checkpoint_id"] is None else str(r["checkpoint_id"])
    return (r["job_id"], number, *known, status, r["location"])


def ttl_cell(ttl: dict[str, Any] | None) -> str:
    return "-" if not ttl else f"{ttl.get('ttl_ms')} ms, {ttl.get('update_type')}"


def plural(n: int, what: str) -> str:
    return f"{n:,} {what}" if n == 1 else f"{n:,} {what}s"
