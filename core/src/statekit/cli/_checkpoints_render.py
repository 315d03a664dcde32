"""How ``statekit checkpoints`` draws what it found: ``list``'s rows, ``inspect``, counts, a spinner."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape

from ..checkpoints._metadata import CheckpointMetadata
from ..checkpoints._verify import CheckpointProblem
from ..serialization._evolution import describe_schema
from ..state._migration import schema_history
from ._checkpoints_report import COMPLETE, UNREADABLE
from ._cli import Cell, CommandContext, count_cell, not_recorded_note, print_table, printable

__all__ = [
    "LIST_COLUMNS",
    "bytes_cell",
    "entries_cell",
    "list_cells",
    "plural",
    "print_inspection",
    "relative_to",
    "ttl_cell",
    "working",
]


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
            entries_cell(sum(o["entries"] for o in ops), any(o["entries_estimated"] for o in ops)),
            f"{sum(o['bytes'] for o in ops):,}",
        )
    number = "-" if r["checkpoint_id"] is None else str(r["checkpoint_id"])
    return (r["job_id"], number, *known, status, r["location"])


def entries_cell(entries: int, estimated: bool) -> str:
    """``1,234``, or ``~1,234 (estimate)`` where the engine only estimates (RocksDB's native snapshots)."""
    return f"~{entries:,} (estimate)" if estimated else f"{entries:,}"


def bytes_cell(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def ttl_cell(ttl: dict[str, Any] | None) -> str:
    return "-" if not ttl else f"{ttl.get('ttl_ms')} ms, {ttl.get('update_type')}"


def plural(n: int, what: str) -> str:
    return f"{n:,} {what}" if n == 1 else f"{n:,} {what}s"


def print_inspection(
    ctx: CommandContext,
    location: str,
    meta: CheckpointMetadata,
    taken: str,
    problems: Sequence[CheckpointProblem],
    subtasks: list[dict[str, Any]],
    states: dict[str, dict[str, Any]],
) -> None:
    """Draws ``inspect``: the checkpoint's lines, a table of its subtasks and one of its states."""
    c = ctx.console
    c.print(
        f"[bold]{escape(printable(meta.kind))} {meta.checkpoint_id}[/] of job "
        f"[bold]{escape(printable(meta.job_id))}[/]",
        soft_wrap=True,
    )

    def line(label: str, value: str) -> None:
        c.print(f"  {label:<18}{printable(value)}", markup=False, highlight=False, soft_wrap=True)

    line("location", location)
    line("taken", taken)
    line("max parallelism", str(meta.max_parallelism))
    line("backend", meta.backend or "-")
    full = sum(s["bytes"] + s["operator_state_bytes"] for s in subtasks)
    uploads = [s["uploaded_bytes"] for s in subtasks if s["uploaded_bytes"] is not None]
    if uploads:  # native (incremental) snapshots: written now vs referenced from earlier checkpoints
        written = (
            sum(uploads)
            + sum(s["operator_state_bytes"] for s in subtasks)
            + sum(s["bytes"] for s in subtasks if s["uploaded_bytes"] is None)
        )
        line(
            "bytes", f"{full:,} in all: {written:,} written by this checkpoint, {full - written:,} referenced"
        )
    else:
        line("bytes", f"{full:,}, all written by this {meta.kind}")
    if any(s["entries_estimated"] for s in subtasks):
        line(
            "entries",
            "the engine's estimate (RocksDB counts a key once per SST file holding a version of it, LMDB "
            "each list element and map entry; statekit.metrics.exact-entries=true counts exactly)",
        )
    for op in dict.fromkeys(s["operator"] for s in subtasks):
        unknown = [
            n
            for n in ("entries", "bytes")
            if any(s[f"state_{n}"] is None for s in subtasks if s["operator"] == op)
        ]
        if unknown:
            formats = sorted({str(s["format"]) for s in subtasks if s["operator"] == op and s["format"]})
            line("per state", not_recorded_note(f"operator {op}", unknown, formats))
    if meta.properties:
        line("properties", json.dumps(meta.properties))
    if problems:
        line("status", f"{UNREADABLE}: it cannot be restored")
        for p in problems:
            line("", f"{p.file}: {p.problem}")
    else:
        line("status", f"{COMPLETE}: every file is there with its size (verify reads every block)")
    _print_subtasks(c, subtasks)
    _print_states(c, states)


def _print_subtasks(c: Console, subtasks: list[dict[str, Any]]) -> None:
    print_table(
        c,
        (
            "operator",
            "subtask",
            "key groups",
            "entries",
            "bytes",
            "uploaded",
            "referenced",
            "format",
            "stored as",
            "op. state bytes",
            "raw keyed bytes",
            "raw items",
        ),
        [
            (
                s["operator"],
                str(s["subtask"]),
                "-" if s["key_groups"] is None else f"{s['key_groups'][0]}-{s['key_groups'][1]}",
                entries_cell(s["entries"], s["entries_estimated"]),
                f"{s['bytes']:,}",
                bytes_cell(s["uploaded_bytes"]),
                bytes_cell(s["referenced_bytes"]),
                str(s["format"] or "-"),
                str(s["handle"] or "-"),
                f"{s['operator_state_bytes']:,}",
                f"{s['raw_keyed_bytes']:,}",
                f"{s['raw_operator_items']:,}",
            )
            for s in subtasks
        ],
    )


def _print_states(c: Console, states: dict[str, dict[str, Any]]) -> None:
    """The states with their current schema and sizes; the migrated ones then with every version."""
    if not c.is_terminal:
        c.file.write("\n")  # two tab-separated tables: a blank line between them
    print_table(
        c,
        ("operator/state", "kind", "schema", "version", "TTL", "entries", "bytes"),
        [
            (
                name,
                str(s.get("kind")),
                describe_schema(s.get("serializer") or {}),
                str(schema_history(s)[-1].version),
                ttl_cell(s.get("ttl")),
                count_cell(s["entries"]),
                count_cell(s["bytes"]),
            )
            for name, s in states.items()
        ],
    )
    migrated = {name: schema_history(s) for name, s in states.items() if s.get("lineage")}
    if migrated:
        if not c.is_terminal:
            c.file.write("\n")
        print_table(
            c,
            ("operator/state", "version", "schema", "TTL", "until", "changes"),
            [
                (
                    name,
                    str(step.version),
                    step.schema,
                    ttl_cell(step.ttl),
                    step.until,
                    "; ".join(step.changes) or "-",
                )
                for name, steps in migrated.items()
                for step in reversed(steps)
            ],
        )
