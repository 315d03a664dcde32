"""``statekit checkpoints ...`` and ``statekit savepoint ...``: work on stored state, no job needed."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Callable
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from ._checkpoint import (
    CheckpointMetadata,
    CompletedCheckpoint,
    SubtaskState,
    complete_checkpoint,
    write_subtask_state,
)
from ._cli import CommandContext, command
from ._contracts import CheckpointStorage
from ._errors import ConfigurationError
from ._locations import filesystem_storage, parent_location
from ._operator import decode_operator_snapshot
from ._registry import default_registry
from ._serializers import _describe
from ._snapshot import CANONICAL_FORMAT, read_block, read_header, read_index

__all__: list[str] = []

_CHUNK = 4 << 20


def _storage(ctx: CommandContext, directory: str, options: str | None) -> CheckpointStorage:
    return filesystem_storage(directory, storage_options=options, registry=ctx.registry)


def _when(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if ms else "-"


def _summary(location: str, meta: CheckpointMetadata) -> dict[str, Any]:
    operators = {}
    for op, sts in meta.operators.items():
        keyed = [st.keyed for st in sts if st.keyed]
        operators[op] = {
            "parallelism": len(sts),
            "entries": sum(int(k.get("entries", 0)) for k in keyed),
            "bytes": sum(int(k.get("size", 0)) for k in keyed)
            + sum(int(st.operator.get("size", 0)) for st in sts if st.operator),
            "formats": sorted({k.get("format", CANONICAL_FORMAT) for k in keyed}),
            "operator_states": sorted(
                {n for st in sts if st.operator for n in st.operator.get("states", [])}
            ),
        }
    return {
        "location": location,
        "job_id": meta.job_id,
        "checkpoint_id": meta.checkpoint_id,
        "kind": meta.kind,
        "time": _when(meta.timestamp_ms),
        "max_parallelism": meta.max_parallelism,
        "backend": meta.backend,
        "operators": operators,
        "properties": meta.properties,
    }


# --- statekit checkpoints ---------------------------------------------------------


def _configure_checkpoints(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(title="actions", metavar="ACTION", required=True)
    ls = sub.add_parser("list", help="list the completed checkpoints under a checkpoints directory")
    ls.add_argument("directory", help="the statekit.checkpoints.dir (any fsspec URL)")
    ls.add_argument("--job", help="only this job id")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.add_argument("--storage-options", help="fsspec storage options as a JSON object")
    ls.set_defaults(action=_list)
    insp = sub.add_parser(
        "inspect", help="show a checkpoint's or savepoint's operators, states and key groups"
    )
    insp.add_argument("path", help="a chk-<n> or savepoint directory (any fsspec URL)")
    insp.add_argument("--json", action="store_true", help="print JSON instead of tables")
    insp.add_argument("--storage-options", help="fsspec storage options as a JSON object")
    insp.set_defaults(action=_inspect)


@command("checkpoints", "list and inspect checkpoints and savepoints", _configure_checkpoints)
def _checkpoints(args: argparse.Namespace, ctx: CommandContext) -> int:
    action: Callable[[argparse.Namespace, CommandContext], int] = args.action
    return action(args, ctx)


def _list(args: argparse.Namespace, ctx: CommandContext) -> int:
    storage = _storage(ctx, args.directory, args.storage_options)
    list_jobs = getattr(storage, "list_jobs", None)
    if args.job:
        jobs = [args.job]
    elif list_jobs is not None:
        jobs = list(list_jobs())
    else:
        raise ConfigurationError("this storage cannot list jobs; pass --job")
    rows = []
    for job in jobs:
        for loc in storage.list_checkpoints(job):
            rows.append(_summary(loc, CheckpointMetadata.from_bytes(storage.read_metadata(loc), loc)))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        ctx.console.print(f"No completed checkpoints under {escape(args.directory)}.")
        return 0
    table = Table("job", "id", "time", "backend", "operators (parallelism)", "entries", "bytes", "location")
    for r in rows:
        ops = ", ".join(f"{op} ({o['parallelism']})" for op, o in r["operators"].items())
        entries = sum(o["entries"] for o in r["operators"].values())
        size = sum(o["bytes"] for o in r["operators"].values())
        cells = (
            r["job_id"],
            str(r["checkpoint_id"]),
            r["time"],
            r["backend"],
            ops,
            f"{entries:,}",
            f"{size:,}",
        )
        table.add_row(*map(escape, cells), escape(r["location"]))
    ctx.console.print(table)
    return 0


def _inspect(args: argparse.Namespace, ctx: CommandContext) -> int:
    storage = _storage(ctx, parent_location(args.path), args.storage_options)
    meta = CheckpointMetadata.from_bytes(storage.read_metadata(args.path), args.path)
    summary = _summary(args.path, meta)
    states: dict[str, dict[str, Any]] = {}
    subtasks = []
    for op, sts in meta.operators.items():
        for st in sts:
            for s in st.states:
                states.setdefault(f"{op}/{s['name']}", s)
            k = st.keyed or {}
            subtasks.append(
                {
                    "operator": op,
                    "subtask": st.subtask_index,
                    "key_groups": [st.key_group_range.start, st.key_group_range.end] if k else None,
                    "entries": int(k.get("entries", 0)),
                    "bytes": int(k.get("size", 0)),
                    "format": k.get("format"),
                    "backend": k.get("backend"),
                    "state_bytes": k.get("state_sizes", {}),
                    "handle": k.get("handle", {}).get("type"),
                    "operator_state_bytes": int((st.operator or {}).get("size", 0)),
                }
            )
    if args.json:
        print(json.dumps({**summary, "subtasks": subtasks, "states": states}, indent=2))
        return 0
    c = ctx.console
    c.print(f"[bold]{escape(meta.kind)} {meta.checkpoint_id}[/] of job [bold]{escape(meta.job_id)}[/]")
    c.print(f"  location          {escape(args.path)}")
    c.print(f"  taken             {summary['time']}")
    c.print(f"  max parallelism   {meta.max_parallelism}")
    c.print(f"  backend           {escape(meta.backend or '-')}")
    if meta.properties:
        c.print(f"  properties        {escape(json.dumps(meta.properties))}")
    table = Table(
        "operator", "subtask", "key groups", "entries", "bytes", "format", "stored as", "op. state bytes"
    )
    for s in subtasks:
        kg = "-" if s["key_groups"] is None else f"{s['key_groups'][0]}-{s['key_groups'][1]}"
        table.add_row(
            escape(s["operator"]),
            str(s["subtask"]),
            kg,
            f"{s['entries']:,}",
            f"{s['bytes']:,}",
            escape(str(s["format"] or "-")),
            escape(str(s["handle"] or "-")),
            f"{s['operator_state_bytes']:,}",
        )
    c.print(table)
    st_table = Table("operator/state", "kind", "serializer", "TTL")
    for name, s in states.items():
        ttl = s.get("ttl")
        st_table.add_row(
            escape(name),
            escape(str(s.get("kind"))),
            escape(_describe(s.get("serializer") or {})),
            "-" if not ttl else f"{ttl['ttl_ms']} ms, {ttl['update_type']}",
        )
    c.print(st_table)
    return 0


# --- statekit savepoint -----------------------------------------------------------


def _configure_savepoint(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(title="actions", metavar="ACTION", required=True)
    conv = sub.add_parser(
        "convert",
        help="make a self-contained, relocatable canonical savepoint from a completed checkpoint",
    )
    conv.add_argument("checkpoint", help="a chk-<n> directory (any fsspec URL)")
    conv.add_argument("--target", required=True, help="the directory to create the savepoint in")
    conv.add_argument("--no-progress", action="store_true", help="do not draw a progress bar")
    conv.add_argument("--storage-options", help="fsspec storage options as a JSON object")
    conv.set_defaults(action=_convert)


@command("savepoint", "make savepoints from checkpoints, without a running job", _configure_savepoint)
def _savepoint(args: argparse.Namespace, ctx: CommandContext) -> int:
    action: Callable[[argparse.Namespace, CommandContext], int] = args.action
    return action(args, ctx)


def convert_to_savepoint(
    storage: CheckpointStorage,
    checkpoint: str,
    target_dir: str,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> str:
    """Copy a completed checkpoint into a new self-contained canonical savepoint; returns its location.

    Every file is copied (shared ones too, so the savepoint stands alone) and
    read back through its checksums on the way: a corrupt checkpoint fails here.
    Native snapshots (rocksdb's) are restored, subtask by subtask, into the
    backend that wrote them, which must be installed, and written canonically.
    """
    cp = CompletedCheckpoint(
        storage, checkpoint, CheckpointMetadata.from_bytes(storage.read_metadata(checkpoint))
    )
    meta = cp.metadata
    native = {
        (st.operator_id, st.subtask_index)
        for sts in meta.operators.values()
        for st in sts
        if (st.keyed or {}).get("format", CANONICAL_FORMAT) != CANONICAL_FORMAT
    }
    backend = None
    if native:
        # Fails here, naming the backend and its pip extra, if it is not installed.
        backend = default_registry().create_backend(meta.backend, {})
    parts = [
        (st, part)
        for sts in meta.operators.values()
        for st in sts
        for part in ("keyed", "operator")
        if (st.operator_id, st.subtask_index) not in native or part == "operator"
    ]
    handles = {
        (st.operator_id, st.subtask_index, part): storage.resolve_handle(
            checkpoint, getattr(st, part)["handle"]
        )
        for st, part in parts
        if getattr(st, part)
    }
    total = sum(h.size for h in handles.values())
    done = 0
    writer = storage.begin_savepoint(meta.job_id, target_dir)
    try:
        # Verify before copying: keyed snapshots by every checksum, operator state whole.
        for (_, _, part), h in handles.items():
            if part == "keyed":
                header, _ = read_header(h)
                names = [st["name"] for st in header.states]
                for kg, (off, ln) in read_index(h).items():
                    read_block(h, kg, off, ln, names)
            else:
                decode_operator_snapshot(h.read(), str(h.to_json().get("path", "operator state")))
        new_states = []
        for sts in meta.operators.values():
            for st in sts:
                copy = SubtaskState(
                    st.operator_id, st.subtask_index, st.key_group_range, None, None, st.states
                )
                if (st.operator_id, st.subtask_index) in native:
                    copy.keyed, copy.states = _native_to_canonical(cp, st, backend, writer)
                for part in ("keyed", "operator"):
                    info = getattr(st, part)
                    if not info or (part == "keyed" and (st.operator_id, st.subtask_index) in native):
                        continue
                    h = handles[(st.operator_id, st.subtask_index, part)]
                    out = writer.create_stream(f"{st.operator_id}-{st.subtask_index}.{part}")
                    for off in range(0, h.size, _CHUNK):
                        out.write(h.read(off, min(_CHUNK, h.size - off)))
                        done += min(_CHUNK, h.size - off)
                        if progress is not None:
                            progress(done, total)
                    setattr(copy, part, {**info, "handle": out.close_and_get_handle().to_json()})
                new_states.append(copy)
        return complete_checkpoint(
            writer,
            job_id=meta.job_id,
            checkpoint_id=meta.checkpoint_id,
            max_parallelism=meta.max_parallelism,
            subtasks=new_states,
            kind="savepoint",
            properties={**meta.properties, "converted_from": checkpoint},
        )
    except BaseException:
        writer.abort()
        raise


def _native_to_canonical(
    cp: CompletedCheckpoint, st: SubtaskState, backend: Any, writer: Any
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Restore one subtask's native snapshot into its backend and write it canonically."""
    import tempfile

    with (
        tempfile.TemporaryDirectory(prefix="statekit-convert-") as local_dir,
        cp.restored_native(st.operator_id, st, backend, local_dir) as keyed,
    ):
        state = write_subtask_state(writer, st.operator_id, st.subtask_index, keyed, None)
    return state.keyed, state.states


def _convert(args: argparse.Namespace, ctx: CommandContext) -> int:
    storage = _storage(ctx, parent_location(args.checkpoint), args.storage_options)
    if args.no_progress:
        location = convert_to_savepoint(storage, args.checkpoint, args.target)
    else:
        columns = (TextColumn("copying"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        with Progress(*columns, console=ctx.err_console, transient=True) as bar:
            task = bar.add_task("copy", total=None)
            location = convert_to_savepoint(
                storage,
                args.checkpoint,
                args.target,
                progress=lambda d, t: bar.update(task, completed=d, total=t),
            )
    ctx.console.print(f"savepoint written to {escape(location)}", soft_wrap=True)
    return 0
