"""``statekit checkpoints ...`` and ``statekit savepoint ...``: work on stored state, no job needed.

``checkpoints list`` checks each checkpoint quickly (its metadata parses, every
file it names is there with its size: status ``complete``) and marks the others
``unreadable`` with the reason; ``checkpoints verify`` reads every byte and
compares it with the SHA-256 the metadata records (status ``verified``; files
written by a statekit before digests by their CRC-32s, and said so), and exits
1 when anything is damaged or not the recorded file. Problems name the
checkpoint's directory and the file's full path.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import posixpath
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from .._contracts import CheckpointStorage
from .._errors import (
    CheckpointNotFoundError,
    ConfigurationError,
    CorruptCheckpointError,
    CorruptSnapshotError,
    StateError,
)
from ..checkpoints._locations import filesystem_storage, parent_location
from ..checkpoints._metadata import CheckpointMetadata, SubtaskState
from ..checkpoints._restore import CompletedCheckpoint, load_checkpoint
from ..checkpoints._verify import (
    CRC_ONLY,
    CheckpointProblem,
    crc_only_files,
    verify_checkpoint,
    verify_loaded,
)
from ..checkpoints._writing import complete_checkpoint, write_subtask_state
from ..plugins._registry import default_registry
from ..serialization._evolution import describe_schema
from ..snapshots._snapshot import CANONICAL_FORMAT
from ..state._migration import schema_history
from ._cli import (
    EXIT_OK,
    EXIT_PROBLEM,
    Cell,
    CommandContext,
    command,
    full_location,
    print_table,
    printable,
)

__all__: list[str] = []

#: ``status`` of a checkpoint whose metadata parses and whose files are all there, with their sizes.
COMPLETE = "complete"
#: ``status`` of a checkpoint whose every byte was read and every checksum compared.
VERIFIED = "verified"
#: ``status`` of a checkpoint that cannot be restored; its ``problems`` say why.
UNREADABLE = "unreadable"

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


def _unknown_summary(job: str, location: str) -> dict[str, Any]:
    """:func:`_summary`'s fields for a checkpoint whose metadata cannot be read: what its path says."""
    name = posixpath.basename(location.rstrip("/"))
    number = name.removeprefix("chk-")
    return {
        "location": location,
        "job_id": job,
        "checkpoint_id": int(number) if number.isdigit() else None,
        "kind": None,
        "time": None,
        "max_parallelism": None,
        "backend": None,
        "operators": {},
        "properties": {},
    }


def _status(problems: Sequence[CheckpointProblem], good: str) -> dict[str, Any]:
    return {
        "status": UNREADABLE if problems else good,
        "problems": [{"file": p.file, "problem": p.problem} for p in problems],
    }


def _in(location: str, file: str) -> str:
    """``file`` relative to ``location`` when it lies there (a table has the location in a column)."""
    for prefix in (location.rstrip("/") + "/", "file://" + location.rstrip("/") + "/"):
        if file.startswith(prefix):
            return file[len(prefix) :]
    return file


def _local_path(url: str) -> str | None:
    """The local path ``url`` names, or None for a URL of another protocol."""
    if url.startswith("file://"):
        return url[len("file://") :]
    return None if "://" in url else url


def _is_checkpoint(storage: CheckpointStorage, path: str) -> bool:
    """Whether ``path`` holds a ``_metadata`` (a damaged one too): a checkpoint, not a directory of them."""
    try:
        storage.read_metadata(path)
    except CheckpointNotFoundError:
        return False
    except CorruptSnapshotError:
        return True
    return True


def _jobs(
    ctx: CommandContext, storage: CheckpointStorage, args: argparse.Namespace, directory: str
) -> list[str]:
    """The jobs to look at under ``directory``: ``args.job``, or every job with a completed checkpoint.

    Raises:
        CheckpointNotFoundError: If there is nothing to look at: ``directory`` is
            missing or a file, ``args.job`` has no completed checkpoint there, or no job has one.
        ConfigurationError: If the storage cannot list jobs and no ``--job`` is given.
    """
    local = _local_path(directory)
    if local is not None and not os.path.isdir(local):
        what = "it is a file, not a directory" if os.path.exists(local) else "it does not exist"
        raise CheckpointNotFoundError(f"no checkpoints at {directory}: {what}")
    list_jobs = getattr(storage, "list_jobs", None)
    if args.job is None and list_jobs is None:
        raise ConfigurationError("this storage cannot list jobs; pass --job")
    if args.job is not None and storage.list_checkpoints(args.job):
        return [args.job]
    # Listing the jobs reads every job's directory: only when no --job is given, or it has nothing.
    known: list[str] = [] if list_jobs is None else list(list_jobs())
    if args.job is not None:
        others = ""
        if list_jobs is not None:
            others = (
                f"; jobs with checkpoints there: {', '.join(known)}" if known else "; nor has any other job"
            )
        raise CheckpointNotFoundError(
            f"job {args.job!r} has no completed checkpoint under {directory}{others}"
        )
    if not known:
        hint = _not_a_checkpoints_directory(ctx, args, directory)
        raise CheckpointNotFoundError(f"no completed checkpoint under {directory}{hint}")
    return known


def _not_a_checkpoints_directory(ctx: CommandContext, args: argparse.Namespace, directory: str) -> str:
    """What ``directory`` is instead, when it is a checkpoint itself or one job's directory; else ""."""
    parent = _storage(ctx, parent_location(directory), args.storage_options)
    if _is_checkpoint(parent, directory):
        return f"; it is a checkpoint itself: statekit checkpoints inspect (or verify) {directory}"
    name = posixpath.basename(directory.rstrip("/"))
    with contextlib.suppress(StateError):  # a name that is no valid job id is no job's directory
        if parent.list_checkpoints(name):
            return (
                f"; it is the directory of job {name!r}: pass its parent, "
                f"{parent_location(directory)} (with --job {name})"
            )
    return ""


@contextlib.contextmanager
def _working(ctx: CommandContext, what: str) -> Iterator[None]:
    """A spinner saying ``what`` on a terminal's stderr; nothing in a log."""
    if not ctx.err_console.is_terminal:
        yield
        return
    with ctx.err_console.status(escape(printable(what))):
        yield


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


@command("checkpoints", "list, inspect and verify checkpoints and savepoints", _configure_checkpoints)
def _checkpoints(args: argparse.Namespace, ctx: CommandContext) -> int:
    for name in ("path", "directory"):
        if hasattr(args, name):
            setattr(args, name, full_location(getattr(args, name)))
    action: Callable[[argparse.Namespace, CommandContext], int] = args.action
    return action(args, ctx)


def _listed(storage: CheckpointStorage, job: str, location: str) -> dict[str, Any] | None:
    """One row of ``checkpoints list``: the summary and the quick check; None if it is gone meanwhile."""
    try:
        try:
            cp = load_checkpoint(storage, location)
        except CorruptCheckpointError as e:
            problems = verify_checkpoint(storage, location, deep=False) or [
                CheckpointProblem(location, f"{location.rstrip('/')}/_metadata", e.problem)
            ]
            return {**_unknown_summary(job, location), **_status(problems, COMPLETE)}
        problems = verify_loaded(cp, deep=False)
        if problems:
            # Files go missing while retention deletes the checkpoint: then it is gone, not damaged.
            storage.read_metadata(location)
    except CheckpointNotFoundError:
        return None  # deleted after it was listed: retention of a running job
    return {**_summary(location, cp.metadata), **_status(problems, COMPLETE)}


_LIST_COLUMNS = (
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


def _list_cells(r: dict[str, Any]) -> tuple[Cell, ...]:
    status = r["status"]
    if r["problems"]:
        status += ": " + "; ".join(f"{_in(r['location'], p['file'])}: {p['problem']}" for p in r["problems"])
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


def _list(args: argparse.Namespace, ctx: CommandContext) -> int:
    storage = _storage(ctx, args.directory, args.storage_options)
    rows = []
    for job in _jobs(ctx, storage, args, args.directory):
        for location in storage.list_checkpoints(job):
            row = _listed(storage, job, location)
            if row is not None:
                rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    print_table(ctx.console, _LIST_COLUMNS, [_list_cells(r) for r in rows])
    bad = sum(r["status"] == UNREADABLE for r in rows)
    if bad:
        ctx.note(
            f"{bad} of {len(rows)} checkpoints cannot be restored; "
            "statekit checkpoints verify reads every block of the others"
        )
    return EXIT_OK


def _inspect(args: argparse.Namespace, ctx: CommandContext) -> int:
    storage = _storage(ctx, parent_location(args.path), args.storage_options)
    cp = load_checkpoint(storage, args.path)
    meta = cp.metadata
    problems = verify_loaded(cp, deep=False)
    summary = {**_summary(args.path, meta), **_status(problems, COMPLETE)}
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
        return EXIT_OK
    c = ctx.console
    c.print(
        f"[bold]{escape(printable(meta.kind))} {meta.checkpoint_id}[/] of job "
        f"[bold]{escape(printable(meta.job_id))}[/]",
        soft_wrap=True,
    )

    def line(label: str, value: str) -> None:
        c.print(f"  {label:<18}{printable(value)}", markup=False, highlight=False, soft_wrap=True)

    line("location", args.path)
    line("taken", summary["time"])
    line("max parallelism", str(meta.max_parallelism))
    line("backend", meta.backend or "-")
    if meta.properties:
        line("properties", json.dumps(meta.properties))
    if problems:
        line("status", f"{UNREADABLE}: it cannot be restored")
        for p in problems:
            line("", f"{p.file}: {p.problem}")
    else:
        line("status", f"{COMPLETE}: every file is there with its size (verify reads every block)")
    print_table(
        c,
        ("operator", "subtask", "key groups", "entries", "bytes", "format", "stored as", "op. state bytes"),
        [
            (
                s["operator"],
                str(s["subtask"]),
                "-" if s["key_groups"] is None else f"{s['key_groups'][0]}-{s['key_groups'][1]}",
                f"{s['entries']:,}",
                f"{s['bytes']:,}",
                str(s["format"] or "-"),
                str(s["handle"] or "-"),
                f"{s['operator_state_bytes']:,}",
            )
            for s in subtasks
        ],
    )
    if not c.is_terminal:
        c.file.write("\n")  # two tab-separated tables: a blank line between them
    print_table(
        c,
        ("operator/state", "kind", "schema", "version", "TTL"),
        [
            (
                name,
                str(s.get("kind")),
                describe_schema(s.get("serializer") or {}),
                str(schema_history(s)[-1].version),
                _ttl_cell(s.get("ttl")),
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
                    _ttl_cell(step.ttl),
                    step.until,
                    "; ".join(step.changes) or "-",
                )
                for name, steps in migrated.items()
                for step in reversed(steps)
            ],
        )
    return EXIT_OK


def _ttl_cell(ttl: dict[str, Any] | None) -> str:
    return "-" if not ttl else f"{ttl.get('ttl_ms')} ms, {ttl.get('update_type')}"


def _verify_targets(args: argparse.Namespace, ctx: CommandContext) -> tuple[CheckpointStorage, list[str]]:
    """The storage and the checkpoints ``verify`` reads: the one at ``args.path``, or those under it."""
    if args.job is None:
        storage = _storage(ctx, parent_location(args.path), args.storage_options)
        if _is_checkpoint(storage, args.path):
            return storage, [args.path]
    storage = _storage(ctx, args.path, args.storage_options)
    jobs = _jobs(ctx, storage, args, args.path)
    return storage, [location for job in jobs for location in storage.list_checkpoints(job)]


def _verify(args: argparse.Namespace, ctx: CommandContext) -> int:
    storage, locations = _verify_targets(args, ctx)
    results: list[dict[str, Any]] = []
    for location in locations:
        try:
            with _working(ctx, f"verifying {location}"):
                problems, crc_only = _verified(storage, location)
        except CheckpointNotFoundError:
            if len(locations) == 1:
                raise
            ctx.note(f"{location} was deleted while verifying (retention of a running job); skipped")
            continue
        results.append({"location": location, **_status(problems, VERIFIED), "crc_only": crc_only})
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
            if not r["problems"] and not r["crc_only"]:
                rows.append((r["location"], VERIFIED, "-", "-"))
        print_table(ctx.console, ("checkpoint", "status", "file", "problem"), rows)
        files = sum(len(r["problems"]) for r in bad)
        crc = sum(len(r["crc_only"]) for r in results)
        ctx.note(
            f"{_count(len(results), 'checkpoint')}: {len(results) - len(bad)} verified, {len(bad)} unreadable"
            + (f" ({_count(files, 'damaged file')})" if files else "")
            + (f"; {_count(crc, 'file')} checked by {CRC_ONLY}" if crc else "")
        )
    return EXIT_PROBLEM if bad else EXIT_OK


def _verified(storage: CheckpointStorage, location: str) -> tuple[list[CheckpointProblem], list[str]]:
    """Every problem of the checkpoint at ``location`` (read whole), and its files checked by CRC only."""
    try:
        cp = load_checkpoint(storage, location)
    except CorruptCheckpointError:
        return verify_checkpoint(storage, location, deep=True), []
    return verify_loaded(cp, deep=True), crc_only_files(cp)


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}" if n == 1 else f"{n:,} {what}s"


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
    args.checkpoint = full_location(args.checkpoint)
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

    Every file is copied (shared ones too, so the savepoint stands alone).
    Native snapshots (rocksdb's) are restored, subtask by subtask, into the
    backend that wrote them, which must be installed, and written canonically.

    Raises:
        CorruptCheckpointError: Naming every damaged or missing file, found by
            reading all of them through their checksums before anything is written.
    """
    cp = load_checkpoint(storage, checkpoint)
    problems = verify_loaded(cp, deep=True)
    if problems:
        raise CorruptCheckpointError(checkpoint, "; ".join(f"{p.file}: {p.problem}" for p in problems))
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
    # A log gets no bar (rich would leave a blank line in it).
    if args.no_progress or not ctx.err_console.is_terminal:
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
    ctx.console.print(printable(f"savepoint written to {location}"), markup=False, soft_wrap=True)
    return EXIT_OK
