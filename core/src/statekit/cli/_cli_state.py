"""``statekit state list|show|get|export``: a checkpoint's or savepoint's state as data, no job needed.

Every action opens a ``chk-<n>`` or savepoint location (a local path or any
fsspec URL; ``--storage-options`` passes fsspec options), or, with ``--job``,
that job's latest completed checkpoint under a checkpoints directory.

Values leave as JSON the same way everywhere (``show``, ``get``, ``export
--format json``): bytes are base64 strings, timestamps ISO 8601 strings,
structs (tuples, dataclasses) objects, maps objects when their keys are strings
and lists of ``[key, value]`` pairs otherwise. CSV holds flat columns only,
bytes again as base64.

Keys given on the command line (``get KEY``, ``--key``) are parsed as the
state's key serializer says (``str``, ``int``, ``float``, ``bytes`` as base64,
anything else as JSON, arrays becoming tuples); ``--key-type`` overrides that.

This module holds the arguments and the four actions; the steps are modules of
their own: ``_state_keys`` (keys from the command line), ``_state_json``
(Arrow values as JSON), ``_state_render`` (cells, counts, the progress bar)
and ``_state_export`` (the files ``export`` writes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from .._errors import ConfigurationError
from ..checkpoints._metadata import naming_damage
from ..serialization._serializers import describe_serializer
from ..state_processor._info import OperatorInfo
from ..state_processor._reader import SavepointReader
from ..timers._service import TimeDomain
from ._cli import (
    EXIT_OK,
    EXIT_PROBLEM,
    CommandContext,
    command,
    full_location,
    print_table,
    printable,
)
from ._state_export import FORMATS, SUFFIXES, ExportWriter, check_target, publish_export
from ._state_json import dumps, json_converter, json_rows, key_json, same
from ._state_keys import KEY_TYPES, parse_key
from ._state_render import Progressed, cell, print_list, progress_bar, rows_text

__all__: list[str] = []


# --- arguments -------------------------------------------------------------------


def _non_negative(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {n}")
    return n


def _add_location(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "location",
        help="a chk-<n> or savepoint directory (any fsspec URL); with --job, a checkpoints directory",
    )
    p.add_argument("--job", help="read this job's latest completed checkpoint under LOCATION")
    p.add_argument("--storage-options", help="fsspec storage options as a JSON object")


def _add_what(p: argparse.ArgumentParser, *, timers: bool) -> None:
    p.add_argument("--operator", required=True, help="the operator id (statekit state list shows them)")
    if not timers:
        p.add_argument("--state", required=True, help="the keyed state's name")
        return
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--state", help="a keyed state's or operator state's name")
    which.add_argument(
        "--timers", choices=[str(d) for d in TimeDomain], help="the operator's pending timers of this domain"
    )


def _add_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--key-group",
        type=int,
        action="extend",
        nargs="+",
        metavar="G",
        help="read only these key groups (repeatable)",
    )
    p.add_argument("--key", action="extend", nargs="+", metavar="K", help="read only these keys (repeatable)")
    p.add_argument("--include-expired", action="store_true", help="also rows whose TTL has expired")


def _add_key_type(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--key-type",
        choices=KEY_TYPES,
        help="parse keys as this (default: as the state's key serializer says; bytes are base64)",
    )


def _configure_state(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(title="actions", metavar="ACTION", required=True)

    ls = sub.add_parser("list", help="list the operators, keyed states, timers and operator states")
    _add_location(ls)
    ls.add_argument("--json", action="store_true", help="print JSON instead of tables")
    ls.set_defaults(action=_list)

    show = sub.add_parser("show", help="show the first rows of a state as a table")
    _add_location(show)
    _add_what(show, timers=True)
    show.add_argument(
        "--limit", type=_non_negative, default=20, metavar="N", help="rows to show (default 20; 0: all)"
    )
    _add_filters(show)
    _add_key_type(show)
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show.set_defaults(action=_show)

    get = sub.add_parser("get", help="the value of one key (reads one key-group block)")
    _add_location(get)
    _add_what(get, timers=False)
    get.add_argument("key", metavar="KEY")
    _add_key_type(get)
    get.add_argument("--json", action="store_true", help='print {"key", "value", "location", "bytes_read"}')
    get.set_defaults(action=_get)

    exp = sub.add_parser("export", help="write a state to a JSON lines, CSV or Parquet file")
    _add_location(exp)
    _add_what(exp, timers=True)
    exp.add_argument("--output", "-o", required=True, metavar="PATH", help="the file to write (a local path)")
    exp.add_argument(
        "--format",
        choices=FORMATS,
        help="json (JSON lines, bytes as base64), csv (flat columns only) or parquet; "
        "default: from the output's suffix",
    )
    _add_filters(exp)
    _add_key_type(exp)
    exp.add_argument(
        "--overwrite",
        action="store_true",
        help="replace PATH if it exists (else an existing PATH is an error)",
    )
    exp.add_argument("--no-progress", action="store_true", help="do not draw a progress bar")
    exp.set_defaults(action=_export)


@command("state", "read the state in checkpoints and savepoints: list, show, get, export", _configure_state)
def _state(args: argparse.Namespace, ctx: CommandContext) -> int:
    args.location = full_location(args.location)
    action: Callable[[argparse.Namespace, CommandContext], int] = args.action
    return action(args, ctx)


@contextlib.contextmanager
def _open(args: argparse.Namespace, ctx: CommandContext) -> Iterator[SavepointReader]:
    """The reader of ``args.location`` (or of ``args.job``'s latest checkpoint under it).

    Damage found while it reads is reported as ``checkpoint <location>: <file>:
    <what is wrong>``, the form of every corruption error.
    """
    if args.job:
        reader = SavepointReader.latest(
            args.location, args.job, storage_options=args.storage_options, registry=ctx.registry
        )
    else:
        reader = SavepointReader.open(
            args.location, storage_options=args.storage_options, registry=ctx.registry
        )
    with reader, naming_damage(reader.location):
        yield reader


# --- what to read ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    """One state (keyed, operator or timers) of one operator: its schema and its batches."""

    title: str
    schema: pa.Schema
    batches: Callable[[Progressed | None], Iterator[pa.RecordBatch]]
    rows: int | None = None
    """Known without reading (operator state and timers are read whole)."""


def _source(reader: SavepointReader, args: argparse.Namespace) -> _Source:
    op = args.operator
    filtered = args.key or args.key_group
    if args.timers:
        table = reader.read_timers(op, args.timers)
        return _whole(f"{op} {args.timers} timers", table, filtered)
    info = {o.id: o for o in reader.operators()}.get(op)
    name = args.state
    if info is not None and name in info.operator_states and all(s.name != name for s in info.states):
        return _whole(f"{op}/{name} (operator state)", reader.read_operator_state(op, name), filtered)
    state = reader.state(op, name)  # raises, naming the operators or states there are
    keys = None
    if args.key:
        keys = [parse_key(k, args.key_type, state.key_serializer) for k in args.key]
    groups = None
    if args.key_group:
        groups = sorted(set(args.key_group))
        bad = [g for g in groups if not 0 <= g < reader.max_parallelism]
        if bad:
            raise ConfigurationError(
                f"key group {bad[0]} is out of range: {reader.location} has key groups "
                f"0-{reader.max_parallelism - 1}"
            )

    def batches(progress: Progressed | None) -> Iterator[pa.RecordBatch]:
        return reader.read(
            op,
            name,
            key_groups=groups,
            keys=keys,
            include_expired=args.include_expired,
            progress=progress,
        )

    return _Source(f"{op}/{name}", reader.schema(op, name), batches)


def _whole(title: str, table: pa.Table, filtered: bool) -> _Source:
    if filtered:
        raise ConfigurationError(f"--key and --key-group select rows of keyed state; {title} is read whole")
    return _Source(title, table.schema, lambda progress: iter(table.to_batches()), table.num_rows)


# --- statekit state list -------------------------------------------------------------------


def _list(args: argparse.Namespace, ctx: CommandContext) -> int:
    with _open(args, ctx) as reader:
        summary = _list_summary(reader)
    if args.json:
        print(json.dumps(summary, indent=2))
        return EXIT_OK
    print_list(ctx, summary)
    return EXIT_OK


def _list_summary(reader: SavepointReader) -> dict[str, Any]:
    """What ``list`` prints: the checkpoint, then each operator with its states and timers."""
    meta = reader.checkpoint.metadata
    return {
        "location": reader.location,
        "kind": meta.kind,
        "job_id": meta.job_id,
        "checkpoint_id": meta.checkpoint_id,
        "max_parallelism": reader.max_parallelism,
        "watermark": reader.watermark,
        "operators": [_operator_summary(info) for info in reader.operators()],
    }


def _operator_summary(info: OperatorInfo) -> dict[str, Any]:
    key_cfg = info.states[0].key_serializer if info.states else {}
    return {
        "id": info.id,
        "parallelism": info.parallelism,
        "key_type": describe_serializer(key_cfg) if key_cfg else None,
        "entries": info.entries,
        "bytes": info.bytes,
        "formats": list(info.formats),
        "backends": list(info.backends),
        "states": [
            {
                "name": s.name,
                "kind": s.kind,
                "type": s.type_name,
                "serializer": s.serializer,
                "namespace_type": (
                    None if s.namespace_serializer is None else describe_serializer(s.namespace_serializer)
                ),
                "ttl": s.ttl,
                # None (null): the snapshots do not record it (RocksDB's, LMDB's native ones), never 0.
                "entries": s.entries,
                "bytes": s.bytes,
            }
            for s in info.states
            if s.timer_domain is None
        ],
        "timers": [
            {"domain": s.timer_domain, "state": s.name, "entries": s.entries, "bytes": s.bytes}
            for s in info.states
            if s.timer_domain is not None
        ],
        "operator_states": list(info.operator_states),
    }


# --- statekit state show -------------------------------------------------------------------


def _show(args: argparse.Namespace, ctx: CommandContext) -> int:
    limit: int = args.limit
    with _open(args, ctx) as reader:
        src = _source(reader, args)
        rows: list[dict[str, Any]] = []
        more = False
        it = src.batches(None)
        for batch in it:
            if limit and len(rows) + batch.num_rows > limit:
                rows.extend(json_rows(batch.slice(0, limit - len(rows))))
                more = True
                break
            rows.extend(json_rows(batch))
            if limit and len(rows) == limit:
                # One more block says whether there is more; counting it all could read everything.
                more = next(it, None) is not None
                break
        total = src.rows if src.rows is not None else None if more else len(rows)
        location = reader.location
    if args.json:
        out = {
            "location": location,
            "state": src.title,
            "columns": src.schema.names,
            "rows": rows,
            "total": total,
        }
        print(json.dumps(out, indent=2, ensure_ascii=False, default=str))
        return EXIT_OK
    ctx.note(f"{src.title} of {location}")
    print_table(ctx.console, src.schema.names, [[cell(v) for v in row.values()] for row in rows])
    if total is None:
        ctx.note(f"first {rows_text(len(rows))}; there are more (--limit 0 shows and counts all)")
    elif total > len(rows):
        ctx.note(f"{len(rows)} of {rows_text(total)}")
    else:
        ctx.note(rows_text(total))
    return EXIT_OK


# --- statekit state get -------------------------------------------------------------------


def _get(args: argparse.Namespace, ctx: CommandContext) -> int:
    op, name = args.operator, args.state
    with _open(args, ctx) as reader:
        info = reader.state(op, name)
        key = parse_key(args.key, args.key_type, info.key_serializer)
        value = reader.get(op, name, key)
        schema = reader.schema(op, name)
        location, bytes_read = reader.location, reader.bytes_read
    if value is None:
        hint = ""
        if info.namespace_serializer is not None:
            hint = f" (outside any namespace; statekit state show --key {args.key} shows its namespaces)"
        message = f"no value for key {key!r} in state {name!r} of operator {op!r} in {location}{hint}"
        print(f"statekit: {printable(message)}", file=sys.stderr)
        return EXIT_PROBLEM
    conv = json_converter(schema.field("value").type) or same
    if info.kind == "list":
        shown: Any = [conv(v) for v in value]
    elif info.kind == "map":
        uk_type = schema.field("user_key").type
        if pa.types.is_string(uk_type) or pa.types.is_large_string(uk_type):
            shown = {k: conv(v) for k, v in value.items()}
        else:
            kc = json_converter(uk_type) or same
            shown = [[kc(k), conv(v)] for k, v in value.items()]
    else:
        shown = conv(value)
    if args.json:
        out = {"key": key_json(key), "value": shown, "location": location, "bytes_read": bytes_read}
        print(json.dumps(out, indent=2, ensure_ascii=False, default=str))
    else:
        print(dumps(shown))
    return EXIT_OK


# --- statekit state export -------------------------------------------------------------------


def _check_csv(src: _Source) -> None:
    nested = [f for f in src.schema if pa.types.is_nested(f.type)]
    if nested:
        cols = ", ".join(f"{f.name} ({f.type})" for f in nested)
        raise ConfigurationError(
            f"{src.title} has nested columns, which CSV cannot hold: {cols}; "
            "export it with --format json or --format parquet"
        )


def _export(args: argparse.Namespace, ctx: CommandContext) -> int:
    path: str = args.output
    fmt: str | None = args.format or SUFFIXES.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        raise ConfigurationError(
            f"cannot tell the format of {path} from its suffix; pass --format json|csv|parquet"
        )
    check_target(path, args.overwrite)
    rows = 0
    with _open(args, ctx) as reader:
        src = _source(reader, args)
        if fmt == "csv":
            _check_csv(src)
        # Written beside the target and renamed at the end, so a failed export leaves no partial file.
        head, tail = os.path.split(path)
        tmp = os.path.join(head, f".{tail}.{os.getpid()}.partial")
        try:
            try:
                writer = ExportWriter(fmt, tmp, src.schema)
            except OSError as e:
                raise ConfigurationError(f"cannot write {path}: {e.strerror or e}") from None
            try:
                with progress_bar(ctx, src.title, not args.no_progress) as progress:
                    for batch in src.batches(progress):
                        writer.write(batch)
                        rows += batch.num_rows
            finally:
                writer.close()
            publish_export(tmp, path, args.overwrite)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
            raise
    ctx.console.print(printable(f"{rows_text(rows)} written to {path} ({fmt})"), markup=False, soft_wrap=True)
    return EXIT_OK
