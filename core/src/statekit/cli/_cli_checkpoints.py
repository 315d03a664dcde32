"""``statekit checkpoints list|inspect|verify``: look at stored checkpoints, no job needed.

``checkpoints list`` checks each checkpoint quickly (its metadata parses, every
file it names is there with its size: status ``complete``) and marks the others
``unreadable`` with the reason; ``checkpoints verify`` reads every byte and
compares it with the SHA-256 the metadata records (status ``verified``; files
written by a statekit before digests by their CRC-32s, and said so), and exits
1 when anything is damaged or not the recorded file. Problems name the
checkpoint's directory and the file's full path.

This module holds the arguments and the three actions; the steps are modules
of their own: ``_checkpoints_find`` (which checkpoints a directory holds),
``_checkpoints_report`` (a checkpoint's summary and status) and
``_checkpoints_render`` (rows, counts, the spinner); ``history`` is
``_cli_history``. ``statekit savepoint`` is ``_cli_savepoint``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from typing import Any

from .._errors import CheckpointNotFoundError
from ..checkpoints._locations import parent_location
from ..checkpoints._metadata import CheckpointMetadata
from ..checkpoints._restore import load_checkpoint
from ..checkpoints._state_sizes import StateSizes, part_state_sizes, summed_state_sizes
from ..checkpoints._verify import CRC_ONLY, verify_loaded
from ._checkpoints_find import jobs_under, storage_for, verify_targets
from ._checkpoints_render import LIST_COLUMNS, list_cells, plural, print_inspection, working
from ._checkpoints_report import (
    COMPLETE,
    UNREADABLE,
    VERIFIED,
    checkpoint_summary,
    entries_estimated,
    listed,
    raw_sizes,
    status_fields,
    uploaded_bytes,
    verified,
)
from ._cli import (
    EXIT_OK,
    EXIT_PROBLEM,
    Cell,
    CommandContext,
    command,
    full_location,
    print_table,
)
from ._cli_history import add_history_action

__all__: list[str] = []


# --- statekit checkpoints ---------------------------------------------------------


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--storage-options", help="fsspec storage options as a JSON object")


def _configure_checkpoints(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(title="actions", metavar="ACTION", required=True)
    ls = sub.add_parser(
        "list",
        help="list the completed checkpoints under a checkpoints directory, marking the unreadable ones",
    )
    ls.add_argument("directory", help="the statekit.checkpoints.dir (any fsspec URL)")
    ls.add_argument("--job", help="only this job id")
    _add_common(ls)
    ls.set_defaults(action=_list)
    insp = sub.add_parser(
        "inspect",
        help="show a checkpoint's or savepoint's operators, key groups, and states with their schema history",
    )
    insp.add_argument("path", help="a chk-<n> or savepoint directory (any fsspec URL)")
    _add_common(insp)
    insp.set_defaults(action=_inspect)
    ver = sub.add_parser(
        "verify",
        help="read every block of checkpoints and report each damaged file; exit 1 if any is",
    )
    ver.add_argument(
        "path",
        help="a chk-<n> or savepoint directory, or a checkpoints directory: every checkpoint of "
        "every job (or of --job) under it (any fsspec URL)",
    )
    ver.add_argument("--job", help="with a checkpoints directory: only this job's checkpoints")
    _add_common(ver)
    ver.set_defaults(action=_verify)
    add_history_action(sub)


@command(
    "checkpoints",
    "list, inspect and verify checkpoints and savepoints; a job's checkpoint history",
    _configure_checkpoints,
)
def _checkpoints(args: argparse.Namespace, ctx: CommandContext) -> int:
    for name in ("path", "directory"):
        if hasattr(args, name):
            setattr(args, name, full_location(getattr(args, name)))
    action: Callable[[argparse.Namespace, CommandContext], int] = args.action
    return action(args, ctx)


def _list(args: argparse.Namespace, ctx: CommandContext) -> int:
    storage = storage_for(ctx, args.directory, args.storage_options)
    rows = []
    for job in jobs_under(ctx, storage, args, args.directory):
        for location in storage.list_checkpoints(job):
            row = listed(storage, job, location)
            if row is not None:
                rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    print_table(ctx.console, LIST_COLUMNS, [list_cells(r) for r in rows])
    bad = sum(r["status"] == UNREADABLE for r in rows)
    if bad:
        ctx.note(
            f"{bad} of {len(rows)} checkpoints cannot be restored; "
            "statekit checkpoints verify reads every block of the others"
        )
    return EXIT_OK


def _inspect(args: argparse.Namespace, ctx: CommandContext) -> int:
    storage = storage_for(ctx, parent_location(args.path), args.storage_options)
    cp = load_checkpoint(storage, args.path)
    meta = cp.metadata
    problems = verify_loaded(cp, deep=False)
    summary = {**checkpoint_summary(args.path, meta), **status_fields(problems, COMPLETE)}
    states, subtasks = _states_and_subtasks(meta)
    if args.json:
        print(json.dumps({**summary, "subtasks": subtasks, "states": states}, indent=2))
        return EXIT_OK
    print_inspection(ctx, args.path, meta, summary["time"], problems, subtasks, states)
    return EXIT_OK


def _states_and_subtasks(
    meta: CheckpointMetadata,
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """What ``inspect`` shows of each state (by ``operator/state``) and of each subtask.

    A state's ``entries`` and ``bytes`` (and a subtask's ``state_entries`` and ``state_bytes``) are
    read as the metrics read them; None where the snapshots do not record them (RocksDB's and
    LMDB's native ones), never 0.
    """
    states: dict[str, dict[str, Any]] = {}
    subtasks = []
    for op, sts in meta.operators.items():
        # A subtask without keyed state records that it has none: {} (and counts for no state).
        parts = [part_state_sizes(st.keyed) if st.keyed else StateSizes({}, {}) for st in sts]
        sizes = summed_state_sizes(parts)
        for st, part in zip(sts, parts, strict=True):
            for s in st.states:
                if f"{op}/{s['name']}" not in states:
                    states[f"{op}/{s['name']}"] = {
                        **s,
                        "entries": None if sizes.entries is None else sizes.entries.get(s["name"], 0),
                        "bytes": None if sizes.bytes is None else sizes.bytes.get(s["name"], 0),
                    }
            k = st.keyed or {}
            uploaded = uploaded_bytes(k)
            subtasks.append(
                {
                    "operator": op,
                    "subtask": st.subtask_index,
                    "key_groups": [st.key_group_range.start, st.key_group_range.end] if k else None,
                    "entries": int(k.get("entries", 0)),
                    "entries_estimated": entries_estimated(k),
                    "bytes": int(k.get("size", 0)),
                    # A native snapshot uploads only what no completed checkpoint did, and
                    # references the rest; a canonical one writes all its bytes (None here).
                    "uploaded_bytes": uploaded,
                    "referenced_bytes": None if uploaded is None else int(k.get("size", 0)) - uploaded,
                    "format": k.get("format"),
                    "backend": k.get("backend"),
                    "state_entries": _plain(part.entries),
                    "state_bytes": _plain(part.bytes),
                    "handle": k.get("handle", {}).get("type"),
                    "operator_state_bytes": int((st.operator or {}).get("size", 0)),
                    **raw_sizes(st.raw),
                }
            )
    return states, subtasks


def _plain(counts: Mapping[str, int] | None) -> dict[str, int] | None:
    return None if counts is None else dict(counts)


def _verify(args: argparse.Namespace, ctx: CommandContext) -> int:
    storage, locations = verify_targets(args, ctx)
    results: list[dict[str, Any]] = []
    for location in locations:
        try:
            with working(ctx, f"verifying {location}"):
                problems, crc_only, notes = verified(storage, location)
        except CheckpointNotFoundError:
            if len(locations) == 1:
                raise
            ctx.note(f"{location} was deleted while verifying (retention of a running job); skipped")
            continue
        results.append(
            {"location": location, **status_fields(problems, VERIFIED), "crc_only": crc_only, "notes": notes}
        )
    bad = [r for r in results if r["problems"]]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        rows: list[tuple[Cell, ...]] = []
        for r in results:
            rows.extend((r["location"], UNREADABLE, p["file"], p["problem"]) for p in r["problems"])
            damaged = {p["file"] for p in r["problems"]}
            # A file checked by its CRC-32s only is said so: its identity was not checked.
            rows.extend((r["location"], VERIFIED, f, CRC_ONLY) for f in r["crc_only"] if f not in damaged)
            meta = r["location"].rstrip("/") + "/_metadata"
            rows.extend((r["location"], VERIFIED, meta, note) for note in r["notes"])
            if not r["problems"] and not r["crc_only"] and not r["notes"]:
                rows.append((r["location"], VERIFIED, "-", "-"))
        print_table(ctx.console, ("checkpoint", "status", "file", "problem"), rows)
        files = sum(len(r["problems"]) for r in bad)
        crc = sum(len(r["crc_only"]) for r in results)
        ctx.note(
            f"{plural(len(results), 'checkpoint')}: {len(results) - len(bad)} verified, {len(bad)} unreadable"
            + (f" ({plural(files, 'damaged file')})" if files else "")
            + (f"; {plural(crc, 'file')} checked by {CRC_ONLY}" if crc else "")
        )
    return EXIT_PROBLEM if bad else EXIT_OK
