"""The rotation-safe log source on Spark: a streaming Python data source over a LogSource's files.

Spark's own file stream source reads a file once, when it first appears, so a
growing ``access.log`` loses every line appended after that (see
docs/spark.md#reading-log-files). This source follows files as the
:class:`~statekit.LogSource` does, by device, inode and fingerprint, and keeps
its position where any Spark source keeps it: in the query's offset log.

An offset is JSON::

    {"v": 1, "next": 3, "files": [[id, [path, dev, ino, fp_len, fp, offset, line, flags]], ...],
     "lost": ["<file> (read to byte …) is no longer among the watched files …"]}

``files`` lists every watched file the source knows, each with an id given
when it was found and where reading got to (the
:class:`~statekit.sources._files.Tracked` form); ``lost`` names the files the
planning of this offset found gone. A micro-batch ``[start, end)`` is one
range of bytes per file whose offset grew, ``[start offset, end offset)``,
and a task re-reads exactly those bytes from what the end offset records:
the file is opened by its path if that still holds the same inode and
content, else found among the watched files by inode, else by fingerprint
(the copy ``copytruncate`` left). So a batch Spark runs again after a failure
reads the same lines, also when the file was rotated in between.

Planning (``latestOffset``) runs on the driver and reads the new bytes once to
count their lines, so offsets end at line ends and carry line numbers for
bad records; tasks read and parse them on the executors.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from .._errors import ConfigurationError, SourceError
from ..sources import BadRecord, BadRecordPolicy, LogSource
from ..sources._deadletters import DeadLetterDir
from ..sources._files import (
    PARTIAL_END,
    Candidate,
    Tracked,
    Watch,
    find_copy,
    list_candidates,
    matches,
    watches_for,
)

__all__ = ["LOG_SOURCE_NAME", "LogDataSource", "LogRange", "read_logs", "register_log_source"]

#: The data source's short name: ``spark.readStream.format("statekit-logs")`` (lines as ``value``).
LOG_SOURCE_NAME = "statekit-logs"

_VERSION = 1
_BLOCK = 1 << 20  # bytes read at once, when planning and when reading
_ROWS_PER_BATCH = 10_000  # rows per Arrow batch handed to Spark
_OPTIONS = (
    "path",
    "paths",
    "pattern",
    "inactiveafter",
    "onlost",
    "maxlinespertrigger",
    "jobid",
    "key",
    "badrecordspolicy",
    "deadletterpath",
    "maxbadrecords",
    "maxbadratio",
)
_BAD_RECORD_KEYS = {
    "statekit.bad-records.policy": "badRecordsPolicy",
    "statekit.bad-records.dead-letter-path": "deadLetterPath",
    "statekit.bad-records.max": "maxBadRecords",
    "statekit.bad-records.max-ratio": "maxBadRatio",
}


def read_logs(
    spark: SparkSession,
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    parse: Callable[[str], Any] | None = None,
    schema: str | T.StructType = "value string",
    pattern: str = "*",
    inactive_after: float = 300.0,
    on_lost: str = "warn",
    max_lines_per_trigger: int | None = None,
    job_id: str | None = None,
    key: str | None = None,
    config: Mapping[str, object] | None = None,
) -> DataFrame:
    """A streaming DataFrame of the lines of log files that rotate, read exactly once.

    ``paths`` are watched as by :class:`~statekit.LogSource`: a directory (its
    files), a file (it and its rotations, ``access.log.1``,
    ``access.log-20250102``), or several. Every executor must see them at the
    same paths (a local file system in local mode, a shared one otherwise).
    ``parse`` turns a line (strict UTF-8, without its newline) into a record:
    a dict (columns by name; missing ones are null), a tuple (by position), or,
    for a one-column ``schema``, the value. Without it, each line is the
    ``value`` column. Example::

        from statekit.spark import keyed, read_logs

        requests = read_logs(spark, "/var/log/nginx/access.log", parse=json.loads,
                             schema="url string, status int")
        keyed(requests, "url").process(CountPerUrl, "url string, count long", job_id="url-count")

    Bad records (a line that is not UTF-8, that ``parse`` rejects, or whose
    values do not fit ``schema``) follow ``statekit.bad-records.*``, read from
    ``config`` (keys with or without ``spark.``) or else from the session's
    ``spark.statekit.bad-records.*``: ``fail`` (the default) fails the task
    with a :class:`~statekit.BadRecordError` naming the file, byte offset,
    line and text; ``dead-letter`` skips them into JSON-lines files under
    ``dead-letter-path`` (a directory every executor reaches), one file per
    range of a file that held bad lines, replaced if Spark reads the range
    again: each bad line is written once. ``max`` and ``max-ratio`` count the
    bad lines of one such range (one task), not of a whole run.

    Args:
        spark: The session.
        paths: What to watch.
        parse: Line to record; None keeps the line.
        schema: The records' schema (DDL or ``StructType``).
        pattern: A glob file names must match.
        inactive_after: Seconds without modification after which a file's
            last line is read even without a newline.
        on_lost: ``"warn"`` or ``"fail"`` when a file the source had not
            finished is gone (see docs/operations.md#input-files).
        max_lines_per_trigger: Lines per micro-batch at most (None: all there are).
        job_id: Written into dead letters.
        key: The column ``keyed(...)`` will key by: a record whose value of it is
            null is a bad record of stage ``key`` here, where its file, byte
            offset and line are known (past this source, a row carries only
            its values).
        config: ``statekit.bad-records.*`` keys overriding the session's.

    Raises:
        ConfigurationError: If an option is invalid (``dead-letter`` without a path, ...).
    """
    given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    options: dict[str, str] = {
        "paths": json.dumps([os.path.abspath(os.fspath(p)) for p in given]),
        "pattern": pattern,
        "inactiveAfter": str(float(inactive_after)),
        "onLost": on_lost,
    }
    if max_lines_per_trigger is not None:
        options["maxLinesPerTrigger"] = str(max_lines_per_trigger)
    if job_id is not None:
        options["jobId"] = job_id
    key_column = key  # (the loop below reuses the name)
    if key_column is not None:
        options["key"] = key_column
    overrides = {k.removeprefix("spark."): v for k, v in (config or {}).items()}
    for key, option in _BAD_RECORD_KEYS.items():
        value = overrides.get(key)
        if value is None:
            value = spark.conf.get(f"spark.{key}", None)
        if value is not None:
            # Executors write the dead letters: a relative path is the driver's, made absolute here.
            options[option] = os.path.abspath(str(value)) if option == "deadLetterPath" else str(value)
    _Options.parse(options)  # fail here, on the caller's thread, rather than in the query
    struct = schema if isinstance(schema, T.StructType) else T._parse_datatype_string(schema)
    if not isinstance(struct, T.StructType):
        raise ConfigurationError(f"read_logs: schema must be a struct, not {schema!r}")
    if key_column is not None and key_column not in struct.names:
        raise ConfigurationError(
            f"read_logs: key {key_column!r} is not a column of the schema: {struct.names}"
        )
    source = _source_class(parse, struct)
    spark.dataSource.register(source)
    return spark.readStream.format(source.name()).options(**options).load()


def register_log_source(spark: SparkSession) -> None:
    """Register the ``statekit-logs`` data source: each line as a ``value`` string.

    Example::

        register_log_source(spark)
        lines = spark.readStream.format("statekit-logs").load("/var/log/nginx/access.log")
    """
    spark.dataSource.register(LogDataSource)


def _source_class(parse: Callable[[str], Any] | None, schema: T.StructType) -> type[LogDataSource]:
    """A data source class of its own for ``parse`` and ``schema``, registered under a name of its own.

    Spark instantiates a data source from its class and string options only,
    so the parse function travels as a class attribute (Spark pickles the
    class, by value since it is made here, with the function by reference
    when it can be imported).
    """
    if parse is None and schema == LogDataSource.output_schema:
        return LogDataSource
    ident = (
        f"{getattr(parse, '__module__', '')}.{getattr(parse, '__qualname__', repr(parse))}|{schema.json()}"
    )
    name = f"{LOG_SOURCE_NAME}-{hashlib.blake2b(ident.encode(), digest_size=6).hexdigest()}"
    attrs = {"source_name": name, "parse": staticmethod(parse) if parse else None, "output_schema": schema}
    return type("LogDataSourceOf", (LogDataSource,), attrs)


class LogDataSource(DataSource):
    """The ``statekit-logs`` streaming data source; see :func:`read_logs` for what it reads.

    Options (not case-sensitive): ``path`` (or ``load(path)``) or ``paths`` (a
    JSON list), ``pattern``, ``inactiveAfter`` (seconds), ``onLost`` (``warn``
    or ``fail``), ``maxLinesPerTrigger``, ``jobId``, and the bad-records
    policy: ``badRecordsPolicy`` (``fail`` or ``dead-letter``),
    ``deadLetterPath``, ``maxBadRecords``, ``maxBadRatio``.
    """

    source_name: ClassVar[str] = LOG_SOURCE_NAME
    parse: ClassVar[Callable[[str], Any] | None] = None
    output_schema: ClassVar[T.StructType] = T.StructType([T.StructField("value", T.StringType())])

    @classmethod
    def name(cls) -> str:
        """The name ``spark.readStream.format`` takes."""
        return cls.source_name

    def schema(self) -> T.StructType:
        """The records' schema."""
        return self.output_schema

    def streamReader(self, schema: T.StructType) -> DataSourceStreamReader:
        """The reader of one streaming query."""
        return LogStreamReader(_Options.parse(self.options), schema, type(self).parse)


@dataclass(frozen=True)
class _Options:
    """The source's options, parsed and checked."""

    paths: tuple[str, ...]
    pattern: str
    inactive_after: float
    on_lost: str
    max_lines: int | None
    job_id: str | None
    policy: str
    dead_letter_path: str | None
    max_bad: int | None
    max_ratio: float | None
    key: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> _Options:
        opts = {k.lower(): v for k, v in options.items()}
        unknown = sorted(set(opts) - set(_OPTIONS))
        if unknown:
            raise ConfigurationError(
                f"{LOG_SOURCE_NAME}: unknown options {unknown}; the options are: path, paths, pattern, "
                "inactiveAfter, onLost, maxLinesPerTrigger, jobId, key, badRecordsPolicy, deadLetterPath, "
                "maxBadRecords, maxBadRatio"
            )
        if opts.get("paths"):
            paths = json.loads(opts["paths"])
            if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths) or not paths:
                raise ConfigurationError(f"{LOG_SOURCE_NAME}: paths must be a JSON list of paths")
        elif opts.get("path"):
            paths = [opts["path"]]
        else:
            raise ConfigurationError(f"{LOG_SOURCE_NAME}: give the files to read: load(path) or paths")
        try:
            inactive = float(opts.get("inactiveafter", "300"))
            max_lines = int(opts["maxlinespertrigger"]) if opts.get("maxlinespertrigger") else None
            max_bad = int(opts["maxbadrecords"]) if opts.get("maxbadrecords") else None
            max_ratio = float(opts["maxbadratio"]) if opts.get("maxbadratio") else None
        except ValueError as e:
            raise ConfigurationError(f"{LOG_SOURCE_NAME}: {e}") from e
        if max_lines is not None and max_lines < 1:
            raise ConfigurationError(f"{LOG_SOURCE_NAME}: maxLinesPerTrigger must be at least 1")
        on_lost = opts.get("onlost", "warn")
        if on_lost not in ("warn", "fail"):
            raise ConfigurationError(f"{LOG_SOURCE_NAME}: onLost must be warn or fail, not {on_lost!r}")
        parsed = cls(
            tuple(os.path.abspath(p) for p in paths),
            opts.get("pattern", "*"),
            inactive,
            on_lost,
            max_lines,
            opts.get("jobid"),
            opts.get("badrecordspolicy", "fail"),
            opts.get("deadletterpath") or None,
            max_bad,
            max_ratio,
            opts.get("key") or None,
        )
        parsed.policy_for(lambda bad: None)  # checks the policy now, not in the first task
        return parsed

    def policy_for(self, sink: Callable[[BadRecord], None]) -> BadRecordPolicy:
        """The bad-records policy of one task: dead letters go to ``sink``.

        Raises:
            ConfigurationError: If the policy is invalid or has nowhere to put dead letters.
        """
        if self.policy == "dead-letter" and self.dead_letter_path is None:
            raise ConfigurationError(
                "statekit.bad-records.policy=dead-letter needs somewhere to put them on Spark: set "
                "statekit.bad-records.dead-letter-path to a directory every executor reaches"
            )
        return BadRecordPolicy(
            policy=self.policy, sink=sink, max_bad=self.max_bad, max_ratio=self.max_ratio, job_id=self.job_id
        )

    def watches(self) -> list[Watch]:
        """What the options watch."""
        return watches_for(self.paths, self.pattern)


class LogRange(InputPartition):
    """One Spark partition: the bytes ``[start, end)`` of one file, as the end offset records the file.

    Attributes:
        entry: The file at the end of the range, in :class:`Tracked`'s JSON form
            (``offset``, ``line``: where the range ends).
        start: The byte offset the range starts at.
        start_line: Lines of the file before ``start``.
    """

    def __init__(self, entry: list[Any], start: int, start_line: int) -> None:
        super().__init__(None)
        self.entry = entry
        self.start = start
        self.start_line = start_line

    def __repr__(self) -> str:
        return f"LogRange({self.entry[0]}, bytes {self.start}-{self.entry[5]})"


@dataclass
class _File:
    """A file of an offset: its id and where reading got to."""

    id: int
    tracked: Tracked


def _load(offset: Mapping[str, Any]) -> tuple[list[_File], int]:
    """The files of an offset and the next id.

    Raises:
        SourceError: If ``offset`` is not this source's.
    """
    try:
        if offset.get("v") != _VERSION:
            raise ValueError(f"version {offset.get('v')!r}")
        files = [_File(int(i), Tracked.from_json(e)) for i, e in offset["files"]]
        return files, int(offset["next"])
    except (KeyError, TypeError, ValueError) as e:
        raise SourceError(
            f"{LOG_SOURCE_NAME}: the offset in Spark's offset log is not one of this source's ({e}): "
            f"{json.dumps(offset)[:200]}; was the checkpoint location used with another source?"
        ) from e


def _dump(files: Sequence[_File], next_id: int, lost: Sequence[str] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {
        "v": _VERSION,
        "next": next_id,
        "files": [[f.id, f.tracked.to_json()] for f in files],
    }
    if lost:
        out["lost"] = list(lost)
    return out


class LogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches over the watched files (on the driver) and reads their ranges (on executors).

    Args:
        options: The source's options.
        schema: The records' schema.
        parse: Line to record; None keeps the line.
        clock: Seconds since the epoch, for the inactivity rule.
    """

    def __init__(
        self,
        options: _Options,
        schema: T.StructType,
        parse: Callable[[str], Any] | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.options = options
        self.schema = schema
        self.parse = parse
        self.clock = clock
        self._target: dict[tuple[int, int], int] | None = None

    # --- the driver: offsets and partitions ----------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        """No file read yet."""
        return _dump([], 0)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxLinesPerTrigger`` lines, or all there are."""
        if self.options.max_lines is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_lines)

    def prepareForTriggerAvailableNow(self) -> None:
        """Remember how long every watched file is now: an ``availableNow`` query reads no further."""
        self._target = {(c.dev, c.ino): c.size for c in list_candidates(self.options.watches())}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Where the files end now (at a line end), ``start`` itself when nothing is new.

        Files are taken in the order the LogSource takes them (known ones by
        identity, rotations finished first, then new ones), each up to its
        last complete line, and up to ``limit``'s lines in all.

        Raises:
            SourceError: If a file is lost under ``onLost=fail``.
        """
        if isinstance(limit, ReadMaxRows):
            budget: int | None = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            budget = None
        else:
            raise SourceError(f"{LOG_SOURCE_NAME}: read limit {limit!r} is not supported")
        files, next_id = _load(start)
        by_tracked = {id(f.tracked): f for f in files}
        source = LogSource(
            list(self.options.paths),
            pattern=self.options.pattern,
            inactive_after=self.options.inactive_after,
            on_lost=self.options.on_lost,
            clock=self.clock,
        )
        plan = source.locate_files([f.tracked for f in files])
        moved = False
        out: list[_File] = []
        for t, c in plan:
            known = by_tracked.get(id(t))
            if known is None:
                if self._target is not None and (c.dev, c.ino) not in self._target:
                    continue  # appeared after an availableNow query started: the next query reads it
                known = _File(next_id, t)
                next_id += 1
            out.append(known)
            size = c.size
            if self._target is not None:
                size = min(size, self._target.get((c.dev, c.ino), size))
            if budget == 0 or size <= t.offset:
                continue
            got = _advance(c, t, size, budget, self.clock() - c.mtime_ns / 1e9 >= self.options.inactive_after)
            if got:
                moved = True
                if budget is not None:
                    budget -= got
        lost = [str(x) for x in source.lost]
        if not moved and not lost:
            return start  # nothing new: Spark runs no batch
        return _dump(out, next_id, lost)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """One partition per file whose offset grew from ``start`` to ``end``."""
        before = {f.id: f.tracked for f in _load(start)[0]}
        parts: list[InputPartition] = []
        for f in _load(end)[0]:
            was = before.get(f.id)
            offset, line = (was.offset, was.line) if was is not None else (0, 0)
            if f.tracked.offset > offset:
                parts.append(LogRange(f.tracked.to_json(), offset, line))
        return parts

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the position is the offset Spark keeps."""

    # --- executors: reading a range ----------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The records of one range, as Arrow batches; bad lines go by the bad-records policy.

        Raises:
            BadRecordError: Under the ``fail`` policy, or when the range's budget is exceeded.
            SourceError: If the file cannot be found any more, under ``onLost=fail``.
        """
        assert isinstance(partition, LogRange)
        letters: list[BadRecord] = []
        policy = self.options.policy_for(letters.append)
        arrow_schema = to_arrow_schema(self.schema)
        t = Tracked.from_json(partition.entry)
        opened = _open_by_identity(t, self.options.watches())
        if opened is None:
            lost = (
                f"{t.path} (bytes {partition.start}-{t.offset}, after line {partition.start_line}) could "
                "not be found by inode or fingerprint when its micro-batch ran: it was moved out of the "
                "watched files or deleted after the batch was planned; its lines of this range were not read"
            )
            if self.options.on_lost == "fail":
                raise SourceError(f"input lost: {lost}")
            warnings.warn(f"input lost: {lost}", RuntimeWarning, stacklevel=2)
            if self.options.dead_letter_path is not None:
                letters.append(BadRecord("lost", lost, t.path, partition.start, partition.start_line, ""))
                self._write_letters(partition, letters)
            return
        f, path = opened
        key = self.options.key
        rows: list[Any] = []
        places: list[tuple[int, int, bytes]] = []
        lines = 0
        with f:
            for start, line, raw in _lines(f, partition.start, partition.start_line, t.offset):
                lines += 1
                try:
                    text = raw.decode()
                    record = text if self.parse is None else self.parse(text)
                except Exception as exc:  # noqa: BLE001 - invalid UTF-8, or any parse failure: a bad record
                    stage = "decode" if isinstance(exc, UnicodeDecodeError) else "parse"
                    policy.handle(BadRecord.from_line(stage, exc, path, start, line, raw))
                    continue
                if key is not None and _key_of(record, self.schema.names, key) is None:
                    # Here the line's place is known; keyed() past the shuffle would know only the row.
                    null = ValueError(f"null key in column {key!r}: every record needs a key")
                    policy.handle(BadRecord.from_line("key", null, path, start, line, raw))
                    continue
                rows.append(record)
                places.append((start, line, raw))
                if len(rows) >= _ROWS_PER_BATCH:
                    yield from _to_arrow(rows, places, arrow_schema, policy, path)
                    rows, places = [], []
        if rows:
            yield from _to_arrow(rows, places, arrow_schema, policy, path)
        policy.check_ratio(lines)
        if letters:
            self._write_letters(partition, letters)

    def _write_letters(self, partition: LogRange, letters: Sequence[BadRecord]) -> None:
        """The range's dead letters, in a file named by the range: a retried task replaces it.

        Written exclusively under a hidden name and renamed (see DeadLetterDir), in a private directory.
        """
        directory = self.options.dead_letter_path
        assert directory is not None
        e = partition.entry
        name = f"part-{e[4]}-{e[1]}-{e[2]}-{partition.start:012d}-{e[5]:012d}.json"
        now = time.time()
        ordered = sorted(letters, key=lambda b: b.offset or 0)  # in file order, whatever found them
        DeadLetterDir(directory).publish(
            name, ({"job_id": self.options.job_id, "time": now, **bad.to_json()} for bad in ordered)
        )


def _advance(c: Candidate, t: Tracked, size: int, budget: int | None, idle: bool) -> int:
    """Moves ``t`` past the complete lines of ``c`` up to ``size`` (at most ``budget``); the lines taken.

    A last line without a newline is taken once the file is ``idle``, as the
    LogSource does; its offset then carries :data:`PARTIAL_END`.
    """
    try:
        f = open(c.path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return 0  # gone since it was listed: the next plan finds it by identity
    with f:
        st = os.fstat(f.fileno())
        if (st.st_dev, st.st_ino) != (c.dev, c.ino):
            return 0
        pos = t.offset
        f.seek(pos)
        end, taken = pos, 0
        while pos < size and (budget is None or taken < budget):
            block = f.read(min(_BLOCK, size - pos))
            if not block:
                break
            n = block.count(b"\n")
            if budget is not None and taken + n > budget:
                cut = -1
                for _ in range(budget - taken):
                    cut = block.index(b"\n", cut + 1)
                taken, end = budget, pos + cut + 1
                break
            if n:
                taken += n
                end = pos + block.rindex(b"\n") + 1
            pos += len(block)
        partial = end < size and pos >= size and idle and (budget is None or taken < budget)
    if partial:
        taken += 1
        end = size
    if taken:
        t.offset, t.line = end, t.line + taken
        t.flags = t.flags | PARTIAL_END if partial else t.flags & ~PARTIAL_END
    return taken


def _open_by_identity(t: Tracked, watches: Sequence[Watch]) -> tuple[Any, str] | None:
    """The file that holds ``t`` up to its offset, open, and its path now; None if it cannot be found.

    Its path, if that is still the same inode with the same content; else the
    watched file with its inode (renamed); else a copy of its content under
    another inode (``copytruncate``'s).
    """
    for _ in range(3):  # a rotation between finding the file and opening it: look again
        c = _stat(t.path)
        if c is None or (c.dev, c.ino) != (t.dev, t.ino) or not matches(c, t, extend_to=t.fp_len):
            cands = list_candidates(watches)
            same = [
                x for x in cands if (x.dev, x.ino) == (t.dev, t.ino) and matches(x, t, extend_to=t.fp_len)
            ]
            c = same[0] if same else find_copy(t, cands, {(t.dev, t.ino)})
            if c is None:
                return None
        try:
            f = open(c.path, "rb")  # noqa: SIM115 - the caller closes it
        except FileNotFoundError:
            continue
        st = os.fstat(f.fileno())
        if (st.st_dev, st.st_ino) == (c.dev, c.ino) and st.st_size >= t.offset:
            return f, c.path
        f.close()
    return None


def _stat(path: str) -> Candidate | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return Candidate(path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _lines(f: Any, start: int, line: int, end: int) -> Iterator[tuple[int, int, bytes]]:
    """``(offset, line number, bytes without newline)`` of each line in ``[start, end)`` of ``f``.

    A last piece without a newline is a line: the offset ends there only when
    the file's last line was taken without one.
    """
    f.seek(start)
    pos, pending = start, b""
    while pos < end:
        block = f.read(min(_BLOCK, end - pos))
        if not block:
            raise SourceError(f"{f.name}: ended at byte {pos}, before byte {end} its micro-batch reads")
        pos += len(block)
        data = pending + block
        base = pos - len(data)
        pieces = data.split(b"\n")
        pending = pieces.pop()
        for raw in pieces:
            line += 1
            yield base, line, raw
            base += len(raw) + 1
    if pending:
        yield pos - len(pending), line + 1, pending


def _to_arrow(
    rows: list[Any],
    places: list[tuple[int, int, bytes]],
    schema: pa.Schema,
    policy: BadRecordPolicy,
    path: str,
) -> Iterator[pa.RecordBatch]:
    """Rows as one Arrow batch of ``schema``; a row whose values do not fit is a bad record (``arrow``)."""
    names = schema.names
    try:
        yield _batch([_fields(r, names) for r in rows], schema)
        return
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        pass  # find the rows that do not fit, one by one: rare, so the common case stays one call
    good = []
    for record, (start, line, raw) in zip(rows, places, strict=True):
        try:
            values = _fields(record, names)
            _batch([values], schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            policy.handle(BadRecord.from_line("arrow", exc, path, start, line, raw))
            continue
        good.append(values)
    if good:
        yield _batch(good, schema)


def _key_of(record: Any, names: Sequence[str], key: str) -> Any:
    """The value of column ``key`` in a parsed record (a dict, a tuple, or the one column's value).

    A record whose shape does not fit the schema gives a non-null answer: the
    Arrow conversion names that problem (stage ``arrow``).
    """
    if isinstance(record, Mapping):
        return record.get(key)
    if isinstance(record, (tuple, list)):
        return record[names.index(key)] if len(record) == len(names) else ()
    return record if len(names) == 1 else ()


def _fields(record: Any, names: Sequence[str]) -> tuple[Any, ...]:
    if isinstance(record, Mapping):
        return tuple(record.get(n) for n in names)
    if isinstance(record, (tuple, list)):
        if len(record) != len(names):
            raise ValueError(f"a record of {len(record)} values for {len(names)} columns")
        return tuple(record)
    if len(names) == 1:
        return (record,)
    raise TypeError(
        f"a record must be a dict or a tuple for {len(names)} columns, not {type(record).__name__}"
    )


def _batch(rows: list[tuple[Any, ...]], schema: pa.Schema) -> pa.RecordBatch:
    columns = [pa.array([r[i] for r in rows], type=field.type) for i, field in enumerate(schema)]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
