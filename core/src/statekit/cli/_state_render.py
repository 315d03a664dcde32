"""How ``statekit state`` draws what it read: ``list``'s tables, cells, row counts, a progress bar."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ._cli import Cell, CommandContext, count_cell, not_recorded_note, print_table
from ._state_json import dumps

__all__ = ["Progressed", "cell", "print_list", "progress_bar", "rows_text"]

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


def print_list(ctx: CommandContext, summary: dict[str, Any]) -> None:
    """Draws ``list``'s summary: a title, then a table of operators and one of their states."""
    c = ctx.console
    operators: list[dict[str, Any]] = summary["operators"]
    # A title, not rows: on a terminal above the tables, in a pipe on stderr (--json has it all).
    ctx.note(f"{summary['kind']} {summary['checkpoint_id']} of job {summary['job_id']}")
    for label, value in (
        ("location", summary["location"]),
        ("max parallelism", str(summary["max_parallelism"])),
        ("watermark", "-" if summary["watermark"] is None else str(summary["watermark"])),
    ):
        ctx.note(f"  {label:<18}{value}")
    op_rows: list[tuple[Cell, ...]] = []
    for o in operators:
        fmt = ", ".join(o["formats"]) or "-"
        if o["backends"]:
            fmt += f" ({', '.join(o['backends'])})"
        op_rows.append(
            (
                o["id"],
                str(o["parallelism"]),
                o["key_type"] or "-",
                f"{o['entries']:,}",
                f"{o['bytes']:,}",
                fmt,
            )
        )
    print_table(c, ("operator", "parallelism", "key", "entries", "bytes", "format"), op_rows)
    state_rows: list[tuple[Cell, ...]] = []
    for o in operators:
        for s in o["states"]:
            ttl = s["ttl"]
            typ = (
                s["type"] if s["namespace_type"] is None else f"{s['type']} (namespace {s['namespace_type']})"
            )
            ttl_text = "-" if not ttl else f"{ttl['ttl_ms']} ms, {ttl['update_type']}"
            state_rows.append((o["id"], s["name"], s["kind"], typ, ttl_text, *_sizes(s)))
        for t in o["timers"]:
            state_rows.append((o["id"], t["state"], "timers", t["domain"], "-", *_sizes(t)))
        for name in o["operator_states"]:
            state_rows.append((o["id"], name, "operator state", "-", "-", "-", "-"))
    if not c.is_terminal:
        c.file.write("\n")  # two tab-separated tables: a blank line between them
    print_table(c, ("operator", "state", "kind", "type", "TTL", "entries", "bytes"), state_rows)
    for o in operators:
        keyed = [*o["states"], *o["timers"]]
        unknown = [n for n in ("entries", "bytes") if any(s[n] is None for s in keyed)]
        if unknown:
            ctx.note(not_recorded_note(f"operator {o['id']}", unknown, o["formats"]))


def _sizes(state: dict[str, Any]) -> tuple[str, str]:
    """A state's entries and bytes cells: ``not recorded`` where the snapshots name none."""
    return count_cell(state["entries"]), count_cell(state["bytes"])
