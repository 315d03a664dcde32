"""The rotation-safe log source on Spark: a streaming Python data source over a LogSource's files.

Spark's own file stream source reads a file once, when it first appears, so a
growing ``access.log`` loses every line appended after that (see
docs/spark.md#reading-log-files). This source follows files as the
:class:`~statekit.LogSource` does, by device, inode and fingerprint, and keeps
its position where any Spark source keeps it: in the query's offset log.

An offset is JSON::

    {"v": 1, "next": 3, "files": [[id, [path, dev, ino, fp_len, fp, offset, line, flags, size]], ...],
     "gz": [[dev, ino, mtime_ns], ...],
     "lost": ["<file> (planned to byte …) is no longer among the watched files …"]}

``files`` lists every watched file the source knows, each with an id given
when it was found and how far it is planned (the
:class:`~statekit.sources._files.Tracked` form: offsets are what micro-batches
were given to read, not what a task has read); ``gz`` the compressed files
the planning of this offset listed, so that the next can tell one that
appeared since (absent from an offset of a statekit before it); ``lost``
names the files the planning of this offset found gone with bytes never
planned, and compressed files that appeared holding lines never planned. A micro-batch ``[start, end)`` is one
range of bytes per file whose offset grew, ``[start offset, end offset)``,
and a task re-reads exactly those bytes from what the end offset records:
the file is opened by its path if that still holds the same inode and
content, else found among the watched files by inode, else by fingerprint
(the copy ``copytruncate`` left). So a batch Spark runs again after a failure
reads the same lines, also when the file was rotated in between.

Planning (``latestOffset``) runs on the driver and reads the new bytes once to
count their lines, so offsets end at line ends (or inside a line longer than
the limit, which the task reports as a bad record) and carry line numbers for
bad records; tasks read and parse them on the executors.

:func:`read_logs` is longer than the rest of this package's functions only by
its docstring, the reference of a public function (its code is a dozen lines).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, ClassVar

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
from ..plugins._config import Configuration
from ..sources import FOLLOW_SYMLINKS_KEY, MAX_LINE_BYTES_KEY
from ..sources._badrecords import BadRecord, BadRecordPolicy
from ..sources._deadletters import DeadLetterDir, file_part
from ..sources._files import (
    IN_LONG_LINE,
    PARTIAL_END,
    Candidate,
    LineReader,
    LongLine,
    Tracked,
    Watch,
    check_watches,
    compressed_identities,
    find_compressed,
    find_copy,
    find_prefix_copy,
    list_candidates,
    matches,
    open_candidate,
    watches_for,
)
from ..sources._locating import InputLostWarning
from ..sources._logsource import LogSource
from ._input_lost import note_log_source
from ._letter_tally import batch_job_id, tally_letters, watch_directory

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
    "maxlinebytes",
    "followsymlinks",
)
_CONFIG_KEYS = {
    "statekit.bad-records.policy": "badRecordsPolicy",
    "statekit.bad-records.dead-letter-path": "deadLetterPath",
    "statekit.bad-records.max": "maxBadRecords",
    "statekit.bad-records.max-ratio": "maxBadRatio",
    MAX_LINE_BYTES_KEY: "maxLineBytes",
    FOLLOW_SYMLINKS_KEY: "followSymlinks",
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
    max_line_bytes: int | None = None,
    follow_symlinks: bool | None = None,
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
    with a :class:`~statekit.errors.BadRecordError` naming the file, byte offset,
    line and text; a line longer than ``max_line_bytes`` is a bad record too
    (stage ``too-long``, its first 64 KiB kept, the rest skipped by the task
    without holding it in memory); ``dead-letter`` skips them into JSON-lines files under
    ``dead-letter-path`` (a directory every executor reaches), one file per
    range of a file that held bad lines, replaced if Spark reads the range
    again: each bad line is written once. ``max`` and ``max-ratio`` count the
    bad lines of one such range (one task), not of a whole run.

    As :class:`~statekit.LogSource`, it reads only what it was pointed at: a
    watched path that does not exist (a directory: already here), a symlink
    that leaves the watched files (unless ``follow_symlinks``), a FIFO, socket,
    device or directory among the watched names fails the query with a
    :class:`~statekit.errors.SourceError` naming it.

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
        config: ``statekit.bad-records.*`` and ``statekit.source.*`` keys overriding the session's.
        max_line_bytes: The longest line read as a record (bytes); None:
            ``statekit.source.max-line-bytes`` (default 4 MiB).
        follow_symlinks: Read what symlinks among the watched names point to;
            None: ``statekit.source.follow-symlinks`` (default false).

    Raises:
        ConfigurationError: If an option is invalid (``dead-letter`` without a path, ...).
        SourceError: If a watched directory does not exist.
    """
    given = [os.fspath(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
    options = _reader_options(
        spark, given, pattern=pattern, inactive_after=inactive_after, on_lost=on_lost,
        max_lines_per_trigger=max_lines_per_trigger, job_id=job_id, key=key, config=config,
        max_line_bytes=max_line_bytes, follow_symlinks=follow_symlinks,
    )  # fmt: skip
    # Fail here, on the caller's thread, rather than in the query (naming the paths as given).
    check_watches(watches_for(given, _Options.parse(options).pattern), None)
    struct = schema if isinstance(schema, T.StructType) else T._parse_datatype_string(schema)
    if not isinstance(struct, T.StructType):
        raise ConfigurationError(f"read_logs: schema must be a struct, not {schema!r}")
    if key is not None and key not in struct.names:
        raise ConfigurationError(f"read_logs: key {key!r} is not a column of the schema: {struct.names}")
    source = _register(spark, _source_class(parse, struct))
    note_log_source()  # this process's drivers read what the source planned as lost (_input_lost)
    return spark.readStream.format(source.name()).options(**options).load()


def _reader_options(
    spark: SparkSession,
    given: list[str],
    *,
    pattern: str,
    inactive_after: float,
    on_lost: str,
    max_lines_per_trigger: int | None,
    job_id: str | None,
    key: str | None,
    config: Mapping[str, object] | None,
    max_line_bytes: int | None,
    follow_symlinks: bool | None,
) -> dict[str, str]:
    """The options of :func:`read_logs`' data source: its arguments, then ``config``, then the session's."""
    options: dict[str, str] = {
        "paths": json.dumps([_absolute(p) for p in given]),
        "pattern": pattern,
        "inactiveAfter": str(float(inactive_after)),
        "onLost": on_lost,
    }
    if max_lines_per_trigger is not None:
        options["maxLinesPerTrigger"] = str(max_lines_per_trigger)
    if job_id is not None:
        options["jobId"] = job_id
    if key is not None:
        options["key"] = key
    overrides = {k.removeprefix("spark."): v for k, v in (config or {}).items()}
    for name, option in _CONFIG_KEYS.items():
        value = overrides.get(name)
        if value is None:
            value = spark.conf.get(f"spark.{name}", None)
        if value is not None:
            # Executors write the dead letters: a relative path is the driver's, made absolute here.
            options[option] = os.path.abspath(str(value)) if option == "deadLetterPath" else str(value)
            if option == "deadLetterPath":
                watch_directory(options[option])  # the driver counts its letters per batch
    if max_line_bytes is not None:
        options["maxLineBytes"] = str(max_line_bytes)
    if follow_symlinks is not None:
        options["followSymlinks"] = str(bool(follow_symlinks)).lower()
    return options


def _absolute(path: str) -> str:
    """``path`` made absolute, keeping a trailing separator (a directory, whether it exists or not)."""
    return os.path.abspath(path) + (os.sep if path.endswith(("/", os.sep)) else "")


def register_log_source(spark: SparkSession) -> None:
    """Register the ``statekit-logs`` data source: each line as a ``value`` string.

    Example::

        register_log_source(spark)
        lines = spark.readStream.format("statekit-logs").load("/var/log/nginx/access.log")
    """
    spark.dataSource.register(LogDataSource)


def _register(spark: SparkSession, source: type[LogDataSource]) -> type[LogDataSource]:
    """``source`` registered in ``spark``; under a name of its own if another session holds its name.

    A session replaces a data source it registered itself, but Spark refuses
    a name that a session sharing its SparkContext registered before
    (``DATA_SOURCE_ALREADY_EXISTS``), as ``SparkSession.newSession()`` and a
    second application built on the same context do. That registration may
    carry another ``parse`` of the same name (a function redefined in a
    notebook), so it is not reused: this session's source gets a name of its own.
    """
    from pyspark.errors import AnalysisException

    try:
        spark.dataSource.register(source)
        return source
    except AnalysisException as e:
        if e.getCondition() != "DATA_SOURCE_ALREADY_EXISTS":
            raise
    unique = f"{source.source_name}-{uuid.uuid4().hex[:12]}"
    again = type("LogDataSourceOf", (source,), {"source_name": unique})
    spark.dataSource.register(again)
    return again


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
    or ``fail``), ``maxLinesPerTrigger``, ``jobId``, ``maxLineBytes`` (a size:
    ``4mb``), ``followSymlinks`` (``true`` or ``false``), and the bad-records
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
    max_line: int
    follow_symlinks: bool
    key: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> _Options:
        opts = {k.lower(): v for k, v in options.items()}
        unknown = sorted(set(opts) - set(_OPTIONS))
        if unknown:
            raise ConfigurationError(
                f"{LOG_SOURCE_NAME}: unknown options {unknown}; the options are: path, paths, pattern, "
                "inactiveAfter, onLost, maxLinesPerTrigger, jobId, key, badRecordsPolicy, deadLetterPath, "
                "maxBadRecords, maxBadRatio, maxLineBytes, followSymlinks"
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
        source_keys = {MAX_LINE_BYTES_KEY: "maxlinebytes", FOLLOW_SYMLINKS_KEY: "followsymlinks"}
        try:
            conf = Configuration({k: opts[o] for k, o in source_keys.items() if opts.get(o)})
            max_line, follow = int(conf.get(MAX_LINE_BYTES_KEY)), bool(conf.get(FOLLOW_SYMLINKS_KEY))
        except ConfigurationError as e:
            raise ConfigurationError(f"{LOG_SOURCE_NAME}: {e}") from e
        on_lost = opts.get("onlost", "warn")
        if on_lost not in ("warn", "fail"):
            raise ConfigurationError(f"{LOG_SOURCE_NAME}: onLost must be warn or fail, not {on_lost!r}")
        parsed = cls(
            tuple(_absolute(p) for p in paths),
            opts.get("pattern", "*"),
            inactive,
            on_lost,
            max_lines,
            opts.get("jobid"),
            opts.get("badrecordspolicy", "fail"),
            opts.get("deadletterpath") or None,
            max_bad,
            max_ratio,
            max_line,
            follow,
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
        skip: ``start`` is inside a line longer than the limit, reported by an
            earlier range: the range begins after that line's newline.
    """

    def __init__(self, entry: list[Any], start: int, start_line: int, skip: bool = False) -> None:
        super().__init__(None)
        self.entry = entry
        self.start = start
        self.start_line = start_line
        self.skip = skip

    def __repr__(self) -> str:
        return f"LogRange({self.entry[0]}, bytes {self.start}-{self.entry[5]})"


@dataclass
class _File:
    """A file of an offset: its id and where reading got to."""

    id: int
    tracked: Tracked


def _load(offset: Mapping[str, Any]) -> tuple[list[_File], int, set[tuple[int, int, int]] | None]:
    """The files of an offset, the next id, and the compressed files listed (None: not recorded).

    Raises:
        SourceError: If ``offset`` is not this source's.
    """
    try:
        if offset.get("v") != _VERSION:
            raise ValueError(f"version {offset.get('v')!r}")
        files = [_File(int(i), Tracked.from_json(e)) for i, e in offset["files"]]
        gz = offset.get("gz")
        return files, int(offset["next"]), None if gz is None else compressed_identities(gz)
    except (KeyError, TypeError, ValueError) as e:
        raise SourceError(
            f"{LOG_SOURCE_NAME}: the offset in Spark's offset log is not one of this source's ({e}): "
            f"{json.dumps(offset)[:200]}; was the checkpoint location used with another source?"
        ) from e


def _dump(
    files: Sequence[_File],
    next_id: int,
    lost: Sequence[str] = (),
    compressed: Sequence[tuple[int, int, int]] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "v": _VERSION,
        "next": next_id,
        "files": [[f.id, f.tracked.to_json()] for f in files],
    }
    if compressed is not None:
        out["gz"] = [list(c) for c in compressed]
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
        # Compressed files an earlier plan of this reader listed and looked into: a plan that
        # moves nothing keeps its start offset (and its list), and need not look into them again.
        self._compressed_listed: set[tuple[int, int, int]] = set()

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
        cands = list_candidates(self.options.watches(), follow_symlinks=self.options.follow_symlinks)
        self._target = {(c.dev, c.ino): c.size for c in cands}

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
        files, next_id, compressed = _load(start)
        by_tracked = {id(f.tracked): f for f in files}
        source = _PlanningSource(
            list(self.options.paths),
            pattern=self.options.pattern,
            inactive_after=self.options.inactive_after,
            on_lost=self.options.on_lost,
            clock=self.clock,
            max_line_bytes=self.options.max_line,
            follow_symlinks=self.options.follow_symlinks,
        )
        if compressed is not None:
            source.compressed_seen = compressed | self._compressed_listed
        plan = source.locate_files([f.tracked for f in files])
        self._compressed_listed.update(source.compressed_now)
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
            idle = self.clock() - c.mtime_ns / 1e9 >= self.options.inactive_after
            got, advanced = _advance(c, t, size, budget, idle, self.options.max_line)
            if advanced:
                moved = True
                if budget is not None:
                    budget -= got
        lost = [str(x) for x in source.lost]
        if not moved and not lost:
            return start  # nothing new: Spark runs no batch
        return _dump(out, next_id, lost, source.compressed_now)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """One partition per file whose offset grew from ``start`` to ``end``."""
        before = {f.id: f.tracked for f in _load(start)[0]}
        parts: list[InputPartition] = []
        for f in _load(end)[0]:
            was = before.get(f.id)
            offset, line = (was.offset, was.line) if was is not None else (0, 0)
            if f.tracked.offset > offset:
                skip = was is not None and bool(was.flags & IN_LONG_LINE)
                parts.append(LogRange(f.tracked.to_json(), offset, line, skip))
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
        limit = self.options.max_line
        t = Tracked.from_json(partition.entry)
        watches = self.options.watches()
        opened = _open_by_identity(t, watches, self.options.follow_symlinks, partition.start)
        if opened is None:
            self._lost(
                partition, letters, _not_found(t, watches, self.options.follow_symlinks, partition),
                partition.start, partition.start_line,
            )  # fmt: skip
            return
        f, path, stop = opened
        key = self.options.key
        rows: list[Any] = []
        places: list[tuple[int, int, bytes]] = []
        lines = 0
        pos, first, skip = partition.start, partition.start_line, partition.skip
        while True:
            line = first
            with f:
                reader = LineReader(f, pos, max_line=limit, end=stop, skipping=skip)
                for start, line, raw in _lines(reader, first, tail=stop == t.offset, end=stop):
                    lines += 1
                    if raw.__class__ is LongLine:
                        assert isinstance(raw, LongLine)
                        head = raw.head.decode("utf-8", "surrogateescape")
                        policy.handle(BadRecord("too-long", raw.describe(limit), path, start, line, head))
                        continue
                    assert isinstance(raw, bytes)
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
            if reader.pos >= stop:
                break
            # Truncated while this task read it (copytruncate): its copy holds the rest of the range.
            pos, first, skip = reader.offset, line, reader.skipping
            again = _open_by_identity(t, watches, self.options.follow_symlinks, pos)
            if again is None or again[1] == path:
                raise SourceError(
                    f"{path}: ended at byte {reader.pos}, before byte {stop} its micro-batch reads"
                )
            f, path, stop = again
        if rows:
            yield from _to_arrow(rows, places, arrow_schema, policy, path)
        policy.check_ratio(lines)
        if stop < t.offset:
            self._lost(
                partition,
                letters,
                f"{t.path}: bytes {reader.offset}-{t.offset} of the range {partition.start}-{t.offset} were "
                "not read: the file was truncated (as by logrotate's copytruncate) before the micro-batch "
                f"ran, and its copy {path} holds only its first {stop} bytes",
                reader.offset,
                None,
            )
        elif letters:
            self._write_letters(partition, letters)

    def _lost(
        self, partition: LogRange, letters: list[BadRecord], lost: str, offset: int, line: int | None
    ) -> None:
        """Report a range (or its end) that cannot be read: fail, or warn and leave a ``lost`` dead letter.

        Raises:
            SourceError: Under ``onLost=fail``.
        """
        if self.options.on_lost == "fail":
            raise SourceError(f"input lost: {lost}")
        warnings.warn(f"input lost: {lost}", InputLostWarning, stacklevel=3)
        if self.options.dead_letter_path is not None:
            letters.append(BadRecord("lost", lost, partition.entry[0], offset, line, ""))
        if letters:
            self._write_letters(partition, letters)

    def _write_letters(self, partition: LogRange, letters: Sequence[BadRecord]) -> None:
        """The range's dead letters, in a file named by the job and the range: a retried task replaces it.

        The job is ``read_logs``' ``job_id``, else the statekit job whose micro-batch
        reads the range (its driver says so in a local property of the batch's
        Spark jobs), else none: two jobs that read the same files into one
        directory keep a file each. Written exclusively under a hidden name and
        renamed (see DeadLetterDir), in a private directory.
        """
        directory = self.options.dead_letter_path
        assert directory is not None
        e = partition.entry
        job_id = self.options.job_id or batch_job_id()
        job = "" if job_id is None else f"{file_part(job_id)}-"
        name = f"part-{job}{e[4]}-{e[1]}-{e[2]}-{partition.start:012d}-{e[5]:012d}.json"
        now = time.time()
        ordered = sorted(letters, key=lambda b: b.offset or 0)  # in file order, whatever found them
        DeadLetterDir(directory).publish(
            name, ({"job_id": job_id, "time": now, **bad.to_json()} for bad in ordered)
        )
        tally_letters(directory, name, len(ordered))  # for the micro-batch's BatchInfo (_letter_tally)


class _PlanningSource(LogSource):
    """The LogSource the driver plans with: its offsets are planned, not read, and lost input says so."""

    _progress = "planned to"


def _advance(
    c: Candidate, t: Tracked, size: int, budget: int | None, idle: bool, max_line: int
) -> tuple[int, bool]:
    """Moves ``t`` past the complete lines of ``c`` up to ``size`` (at most ``budget``).

    Returns the lines taken and whether ``t`` moved (it also moves, taking no
    line, over the rest of a long line reported before). A last line without
    a newline is taken once the file is ``idle``, as the LogSource does (its
    offset then carries :data:`PARTIAL_END`), or at once if it is already
    longer than ``max_line`` (:data:`IN_LONG_LINE`: the task reports it, and
    the next range skips the rest of it).
    """
    f = open_candidate(c)
    if f is None:
        return 0, False  # gone since it was listed: the next plan finds it by identity
    skipping = bool(t.flags & IN_LONG_LINE)
    with f:
        pos = t.offset
        f.seek(pos)
        end, taken = pos, 0
        while pos < size and (budget is None or taken < budget):
            block = f.read(min(_BLOCK, size - pos))
            if not block:
                break
            i = 0
            if skipping:
                nl = block.find(b"\n")
                if nl < 0:
                    pos += len(block)
                    end = pos
                    continue
                skipping, i = False, nl + 1
                end = pos + i
            n = block.count(b"\n", i)
            if budget is not None and taken + n > budget:
                cut = i - 1
                for _ in range(budget - taken):
                    cut = block.index(b"\n", cut + 1)
                taken, end = budget, pos + cut + 1
                break
            if n:
                taken += n
                end = pos + block.rindex(b"\n") + 1
            pos += len(block)
        rest = size - end if pos >= size and not skipping and (budget is None or taken < budget) else 0
    long = rest > max_line
    partial = rest > 0 and idle and not long
    if long or partial:
        taken += 1
        end = size
    if end == t.offset:
        return 0, False
    t.offset, t.line = end, t.line + taken
    t.flags &= ~(PARTIAL_END | IN_LONG_LINE)
    if partial:
        t.flags |= PARTIAL_END
    if long or skipping:
        t.flags |= IN_LONG_LINE
    return taken, True


def _open_by_identity(
    t: Tracked, watches: Sequence[Watch], follow: bool, start: int
) -> tuple[IO[bytes], str, int] | None:
    """The file that holds ``t`` from ``start`` to its offset, open, its path now, and where it ends.

    Its path, if that is still the same inode with the same content; else the
    watched file with its inode (renamed); else a copy of its content under
    another inode (``copytruncate``'s). The end is ``t``'s offset, or less if
    only a copy of the file's first bytes is left (the original truncated
    after more was planned than the copy holds); None if nothing holds the range.
    """
    for _ in range(3):  # a rotation between finding the file and opening it: look again
        c = _stat(t.path, follow)
        if c is None or (c.dev, c.ino) != (t.dev, t.ino) or not matches(c, t, extend_to=t.fp_len):
            cands = list_candidates(watches, follow_symlinks=follow)
            same = [
                x for x in cands if (x.dev, x.ino) == (t.dev, t.ino) and matches(x, t, extend_to=t.fp_len)
            ]
            c = same[0] if same else find_copy(t, cands, {(t.dev, t.ino)})
            if c is None:
                p = find_prefix_copy(t, cands)
                f = open_candidate(p) if p is not None and p.size > start else None
                return None if f is None or p is None else (f, p.path, p.size)
        f = open_candidate(c)
        if f is None:
            continue
        if os.fstat(f.fileno()).st_size >= t.offset:
            return f, c.path, t.offset
        f.close()
    return None


def _not_found(t: Tracked, watches: Sequence[Watch], follow: bool, partition: LogRange) -> str:
    """Why no file holds ``partition``'s range of ``t``, for the report of its loss."""
    where = f"{t.path} (bytes {partition.start}-{t.offset}, after line {partition.start_line})"
    copy = find_prefix_copy(t, list_candidates(watches, follow_symlinks=follow))
    if copy is not None and copy.size <= partition.start:
        # The bytes came after the copy's end: written between copytruncate's copy and its
        # truncation, which logrotate loses (its manual says so); the plan saw them in between.
        return (
            f"{where} was truncated (as by logrotate's copytruncate) before its micro-batch ran, and its "
            f"copy {copy.path} ends at byte {copy.size}, before this range: these bytes were written to it "
            "after the copy was made and were truncated away with it; its lines of this range were not read"
        )
    z = find_compressed(t, watches)
    went = f"; its content is in {z.path}, and compressed files are not read" if z is not None else ""
    return (
        f"{where} could not be found by inode or fingerprint when its micro-batch ran: it was moved out "
        f"of the watched files, deleted or compressed after the batch was planned{went}; its lines of "
        "this range were not read"
    )


def _stat(path: str, follow: bool) -> Candidate | None:
    """``path`` as a candidate if it is a regular file (or a symlink to one, with ``follow``)."""
    try:
        st = os.lstat(path)
        link = stat.S_ISLNK(st.st_mode)
        if link and follow:
            st = os.stat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None  # the listing says what it is, or skips it
    return Candidate(path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, link)


def _lines(
    reader: LineReader, line: int, *, tail: bool, end: int
) -> Iterator[tuple[int, int, bytes | LongLine]]:
    """``(offset, line number, bytes without newline)`` of each line ``reader`` reads, or a :class:`LongLine`.

    With ``tail``, a last piece without a newline is a line: the range ends
    there only when the file's last line was taken without one, at ``end``
    (a file that ended before it was truncated meanwhile: its piece is not a line).
    """
    for piece in reader:
        if piece.__class__ is LongLine:
            assert isinstance(piece, LongLine)
            line += 1
            yield piece.offset, line, piece
            continue
        start, body = piece  # type: ignore[misc]
        for raw in body.split(b"\n"):
            line += 1
            yield start, line, raw
            start += len(raw) + 1
    if tail and reader.tail and reader.pos >= end:
        yield reader.offset, line + 1, reader.tail


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
