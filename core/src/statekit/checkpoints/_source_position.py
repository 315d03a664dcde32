"""A Spark query's source position, as a savepoint carries it, and a new query seeded with it.

A Spark query keeps where its sources are in its checkpoint location (see
DESIGN.md section 20): ``offsets/<b>``, the offset log entry Spark writes
before micro-batch ``b`` runs (a version line, a metadata line, then one end
offset per source, ``-`` where a source has none); ``commits/<b>``, written
after the sink committed ``b``; ``metadata``, the query's id; and each source's
own log under ``sources/<n>/`` (a file source's log of files seen, one entry
per source offset, compacted every few entries into ``<i>.compact``; Kafka's
initial offsets).

A savepoint of micro-batch ``b`` carries a copy of what Spark needs to
continue after ``b`` (:func:`capture`): ``offsets/<b>``, ``metadata``, and
every source's log up to the offset ``offsets/<b>`` records (a file source's:
its newest compaction at or below that offset and the entries after it, never
an entry of a later batch). :func:`seed` writes it into a new, empty
checkpoint location as batch ``s = max(b, 1)``, done: ``offsets/<s>``,
``commits/<s>``, a new query id, and ``offsets/<s-1>`` with the same offsets
(Spark reads the entry before the last when it restarts, and hands a V1
source such as a file source or Kafka the range between the two: an empty
one, so nothing of the old batch is read again, also when the new query
reads another folder). Spark then starts that location at batch ``s + 1``
with every source right after the savepoint. The files are read and
written with fsspec (a local path, ``file:``, ``s3a://`` as ``s3://``, any
fsspec URL); nothing here imports Spark (``statekit checkpoints convert`` runs
without it).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from .._errors import CheckpointError

__all__ = [
    "LOCATION_PROPERTY",
    "ORIGIN_PROPERTY",
    "POSITION_PROPERTY",
    "PositionUnavailable",
    "SparkLocation",
    "SparkPosition",
    "capture",
    "origin_of",
    "same_origin",
    "seed",
]

#: In a Spark query's checkpoints: the query's checkpoint location (an fsspec URL).
LOCATION_PROPERTY = "spark_checkpoint_location"
#: In a savepoint of a Spark query: ``{"handle", "query", "batch", "location"}``, or ``{"missing": why}``.
POSITION_PROPERTY = "spark_position"
#: In every checkpoint after an explicit restore: the restored checkpoint or savepoint (see origin_of).
ORIGIN_PROPERTY = "restore_origin"

_VERSION = 1
_SCHEMES = {"s3a": "s3", "s3n": "s3"}  # Hadoop's names for what fsspec calls s3
_ENTRY = re.compile(r"^(\d+)(\.compact)?$")


class PositionUnavailable(CheckpointError):
    """A Spark checkpoint location no longer holds the position of a micro-batch."""


def fsspec_url(location: str) -> str:
    """``location`` as fsspec names it: ``s3a://`` as ``s3://``, a relative local path made absolute."""
    if "://" in location:
        scheme, rest = location.split("://", 1)
        return f"{_SCHEMES.get(scheme, scheme)}://{rest}"
    if location.startswith("file:"):
        return "file://" + "/" + location[len("file:") :].lstrip("/")
    return os.path.abspath(location)


class SparkLocation:
    """A Spark checkpoint location's files, read and written as text."""

    def __init__(self, location: str) -> None:
        try:
            from fsspec.core import url_to_fs  # type: ignore[import-untyped]
        except ImportError as e:  # pragma: no cover - fsspec comes with statekit-storage
            raise CheckpointError(
                f"reading the Spark checkpoint location {location} needs fsspec (pip install fsspec)"
            ) from e
        self.location = fsspec_url(location)
        fs, root = url_to_fs(self.location)
        self.fs: Any = fs
        self.root = str(root).rstrip("/")

    def _path(self, name: str) -> str:
        return posixpath.join(self.root, name)

    def read(self, name: str) -> str | None:
        """The text of file ``name`` (relative to the location), None if it is not there."""
        try:
            with self.fs.open(self._path(name), "rb") as f:
                return bytes(f.read()).decode("utf-8")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def names(self, directory: str) -> list[str]:
        """The names of the files directly under ``directory`` (empty if it is not there)."""
        path = self._path(directory)
        self.fs.invalidate_cache(path)
        try:
            entries = self.fs.ls(path, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(posixpath.basename(str(e).rstrip("/")) for e in entries)

    def write(self, name: str, text: str) -> None:
        path = self._path(name)
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        with self.fs.open(path, "wb") as f:
            f.write(text.encode("utf-8"))

    def query_id(self) -> str | None:
        """The query id in ``metadata``, None when Spark has not started a query here."""
        text = self.read("metadata")
        if text is None:
            return None
        try:
            found = json.loads(text.splitlines()[0])["id"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise CheckpointError(f"{self.location}/metadata names no streaming query id: {e}") from e
        return str(found)

    def batches(self, log: str) -> list[int]:
        """The batch ids of ``offsets`` or ``commits`` (Spark's temporary files left out)."""
        return sorted(int(n) for n in self.names(log) if n.isdigit())

    def is_empty(self) -> bool:
        """Whether no query has started here: no ``metadata``, no offset log."""
        return self.read("metadata") is None and not self.batches("offsets")

    def next_batch(self) -> int:
        """The micro-batch Spark runs next here: an uncommitted one again, else the one after the last."""
        offsets, commits = self.batches("offsets"), self.batches("commits")
        if not offsets:
            return 0
        if commits and commits[-1] >= offsets[-1]:
            return offsets[-1] + 1
        return offsets[-1]


@dataclass(frozen=True)
class SparkPosition:
    """What a savepoint of micro-batch ``batch`` of ``query`` carries of its Spark checkpoint location.

    ``files`` maps each file's path relative to the location to its text.
    """

    query: str
    batch: int
    location: str
    files: dict[str, str] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return json.dumps(
            {"v": _VERSION, "query": self.query, "batch": self.batch, "location": self.location,
             "files": self.files},
            sort_keys=True,
        ).encode("utf-8")  # fmt: skip

    @staticmethod
    def from_bytes(data: bytes, where: str) -> SparkPosition:
        try:
            d = json.loads(data)
            if d.get("v") != _VERSION:
                raise ValueError(f"version {d.get('v')!r}")
            files = {str(k): str(v) for k, v in d["files"].items()}
            return SparkPosition(str(d["query"]), int(d["batch"]), str(d["location"]), files)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{where}: the Spark source position is not readable: {e}") from e

    @property
    def seeded_batch(self) -> int:
        """The batch a seeded location holds as done (batch 0 has no entry before it to write: 1)."""
        return max(self.batch, 1)

    @property
    def offsets(self) -> str:
        """The offset log entry of the saved batch."""
        return self.files[f"offsets/{self.batch}"]

    def source_offsets(self) -> list[str]:
        """One line per source: its end offset in the saved batch (``-``: none)."""
        return source_lines(self.offsets)

    def describe(self) -> str:
        """The sources and their offsets, shortened, for messages."""
        lines = self.source_offsets()
        shown = "; ".join(f"source {i}: {line[:120]}" for i, line in enumerate(lines))
        return f"{len(lines)} source(s) after micro-batch {self.batch} of query {self.query} ({shown})"


def source_lines(entry: str) -> list[str]:
    """The per-source lines of an offset log entry (after its version and metadata lines)."""
    lines = entry.splitlines()
    return [line for line in lines[2:] if line != ""]


def _file_source_offset(line: str) -> int | None:
    """A file source's log offset in its offset log line (``{"logOffset": n}``), else None."""
    try:
        d = json.loads(line)
    except ValueError:
        return None
    if isinstance(d, dict) and set(d) == {"logOffset"} and isinstance(d["logOffset"], int):
        return int(d["logOffset"])
    return None


def _source_log(loc: SparkLocation, index: int, line: str) -> dict[str, str]:
    """The files of ``sources/<index>/`` a query continuing after offset ``line`` needs.

    A file source's log holds one entry per source offset, every few of them
    a compaction holding all entries so far: the newest compaction at or below
    the saved offset and the entries after it, up to that offset, are what
    Spark reads to know which files it has seen. Entries beyond it belong to
    batches after the savepoint and are left out. Another source's log (Kafka
    keeps its initial offsets at ``0``) is copied whole.
    """
    directory = f"sources/{index}"
    entries: list[tuple[int, str]] = []
    for name in loc.names(directory):
        m = _ENTRY.match(name)
        if m:
            entries.append((int(m.group(1)), name))
    upto = _file_source_offset(line)
    if upto is not None:
        kept = [(i, n) for i, n in entries if i <= upto]
        compactions = [i for i, n in kept if n.endswith(".compact")]
        if compactions:
            kept = [(i, n) for i, n in kept if i >= compactions[-1]]
        if upto >= 0 and not any(i == upto for i, _ in kept):
            raise PositionUnavailable(
                f"{loc.location}/{directory} has no entry for the file source's offset {upto}"
            )
        entries = kept
    files: dict[str, str] = {}
    for _, name in entries:
        text = loc.read(f"{directory}/{name}")
        if text is not None:
            files[f"{directory}/{name}"] = text
    return files


def capture(location: str, query: str, batch: int) -> SparkPosition:
    """The source position of micro-batch ``batch`` of ``query``, read from its checkpoint location.

    Raises:
        PositionUnavailable: If the location no longer holds it: another query
            there now, or the batch's offset log entry is gone (deleted,
            purged after ``spark.sql.streaming.minBatchesToRetain`` batches).
    """
    loc = SparkLocation(location)
    found = loc.query_id()
    if found != query:
        raise PositionUnavailable(
            f"the Spark checkpoint location {location} "
            + ("is gone or empty" if found is None else f"now holds query {found}, not {query}")
        )
    files: dict[str, str] = {"metadata": loc.read("metadata") or ""}
    entry = loc.read(f"offsets/{batch}")
    if entry is None:
        raise PositionUnavailable(f"{location}/offsets/{batch} is gone (Spark purges old offset log entries)")
    files[f"offsets/{batch}"] = entry
    for index, line in enumerate(source_lines(entry)):
        files.update(_source_log(loc, index, line))
    return SparkPosition(query, batch, loc.location, files)


def seed(position: SparkPosition, location: str, *, watermark_ms: int = 0) -> str:
    """Write ``position`` into the new checkpoint location ``location`` as a query done with its batch.

    Spark then starts there at batch ``position.seeded_batch + 1``, its sources
    right after the savepoint. Returns the new query's id.

    Raises:
        CheckpointError: If a query has started at ``location`` already.
    """
    loc = SparkLocation(location)
    if not loc.is_empty():
        raise CheckpointError(f"the Spark checkpoint location {location} is not new: it holds a query")
    query = str(uuid.uuid4())
    # Sources first, the offset and commit logs next, the query's metadata last: a location
    # left half-written by a crash holds no metadata and is seeded again.
    for name, text in sorted(position.files.items()):
        if name.startswith("sources/"):
            loc.write(name, text)
    done = position.seeded_batch
    loc.write(f"offsets/{done - 1}", position.offsets)
    loc.write(f"offsets/{done}", position.offsets)
    loc.write(f"commits/{done}", "v1\n" + json.dumps({"nextBatchWatermarkMs": watermark_ms}))
    loc.write("metadata", json.dumps({"id": query}) + "\n")
    return query


def matches(loc: SparkLocation, position: SparkPosition) -> bool:
    """Whether ``loc``'s offset log holds the saved batch and its source offsets (a seeded location)."""
    entry = loc.read(f"offsets/{position.seeded_batch}")
    return entry is not None and source_lines(entry) == position.source_offsets()


def origin_of(location: str, job_id: str, checkpoint_id: int, timestamp_ms: int) -> dict[str, Any]:
    """What a checkpoint records of the explicit restore its history descends from."""
    return {
        "location": location,
        "job_id": job_id,
        "checkpoint_id": checkpoint_id,
        "timestamp_ms": timestamp_ms,
    }


def same_origin(recorded: Any, origin: dict[str, Any]) -> bool:
    """Whether a recorded origin names the same checkpoint or savepoint (wherever it was moved since)."""
    if not isinstance(recorded, dict):
        return False
    return all(recorded.get(k) == origin[k] for k in ("job_id", "checkpoint_id", "timestamp_ms"))


def position_of(storage: Any, location: str, properties: dict[str, Any]) -> SparkPosition | str:
    """The Spark source position a checkpoint or savepoint carries, or why it carries none.

    Raises:
        CheckpointError: If the position is recorded but cannot be read.
    """
    recorded = properties.get(POSITION_PROPERTY)
    if isinstance(recorded, dict) and isinstance(recorded.get("handle"), dict):
        data = storage.resolve_handle(location, recorded["handle"]).read()
        return SparkPosition.from_bytes(data, location)
    if isinstance(recorded, dict) and recorded.get("missing"):
        return f"its Spark source position could not be copied: {recorded['missing']}"
    query = properties.get("spark_query_id")
    if query is None:
        return (
            "it was not made by a Spark query: a LocalRunner's checkpoint or savepoint keeps the "
            "LocalRunner's source position, which a Spark source cannot resume from, and one written "
            "from data (the state processor, write_savepoint) has none"
        )
    if query == "static":
        return "it was made by a static run(), whose input is a DataFrame and has no source position"
    batch, spark_location = properties.get("spark_batch_id"), properties.get(LOCATION_PROPERTY)
    if batch is None or spark_location is None:
        return "it was made by a statekit that did not record Spark source positions"
    try:  # a checkpoint (not a savepoint): its query's location may hold the position still
        return capture(str(spark_location), str(query), int(batch))
    except PositionUnavailable as e:
        return f"its Spark source position is no longer in its query's checkpoint location: {e}"
