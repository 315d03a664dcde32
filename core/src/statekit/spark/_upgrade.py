"""An explicit restore of a Spark query: its source position, and whether a location may take it.

``start(restore=<savepoint>)`` means: this query's state *and its sources*
continue right after the savepoint, as ``flink run -s`` does. So:

- On a new (empty) checkpoint location the savepoint's source position is
  written in before Spark starts (:func:`prepare_location`, see
  :mod:`statekit.checkpoints._source_position`): Spark starts at the batch
  after the savepoint's, every source right after what it had read.
- A savepoint without a Spark source position (a LocalRunner's, an older
  statekit's, a conversion whose Spark files were gone) is refused before
  any batch, unless the user states that the new input begins after the
  savepoint (``input_begins_after_savepoint=True``).
- A seeded position holds one offset per source, in the order of the query
  that was saved: a new query reading another number of sources is refused
  before Spark starts, naming both (:func:`streaming_sources` counts them
  on a classic session; on Spark Connect the plan is the server's, and
  Spark's own start reports the mismatch with both counts).
- On a location that already has history, the restore is taken only where it
  is what that history is: the savepoint's own query and batch (after a
  stop-with-savepoint, Spark runs the saved batch again: it is skipped), or a
  history that descends from this very restore (the same script started
  again after a crash). Anything else would ignore the restore (the query
  would go on from its own checkpoints) and is refused, with the way out: a
  new checkpoint location.

:func:`decide` is that rule, used before the query starts and again at every
micro-batch by the driver (a Connect query's driver runs on the server).
"""

from __future__ import annotations

import os
import uuid
import warnings
from typing import Any, Literal

from pyspark.sql import SparkSession

from .._errors import CheckpointError, ConfigurationError
from ..checkpoints._restore import CompletedCheckpoint
from ..checkpoints._source_position import (
    ORIGIN_PROPERTY,
    SparkLocation,
    SparkPosition,
    matches,
    origin_of,
    position_of,
    same_origin,
    seed,
)

__all__ = [
    "Decision",
    "check_latest_taken_over",
    "checkpoint_location_of",
    "decide",
    "no_position_error",
    "prepare_location",
    "restore_origin",
    "streaming_sources",
]

#: What a micro-batch is, for a query told to restore: go on from the job's latest checkpoint (whose
#: history is this restore's), skip (the restored savepoint holds the batch), or start from the restore.
Decision = Literal["latest", "skip", "restore"]

_KEYWORD = "input_begins_after_savepoint=True"


def checkpoint_location_of(
    session: SparkSession, checkpoint_location: str | None, query_name: str | None
) -> str:
    """The checkpoint location the query will use, made explicit.

    As Spark picks it: the given one, else ``<spark.sql.streaming.checkpointLocation>/<query name>``,
    else that directory with a new random name (which statekit then passes to Spark itself).

    Raises:
        ConfigurationError: If there is none (Spark would refuse the query too).
    """
    if checkpoint_location is not None:
        return checkpoint_location
    base = session.conf.get("spark.sql.streaming.checkpointLocation", None)
    if not base:
        raise ConfigurationError(
            "start() needs checkpoint_location (or spark.sql.streaming.checkpointLocation): the query's "
            "sources keep their position there"
        )
    return f"{base.rstrip('/')}/{query_name if query_name is not None else uuid.uuid4()}"


def absolute_location(location: str) -> str:
    """A local relative location made absolute, as Spark resolves it (against the driver's directory)."""
    if ":" in location.split("/", 1)[0]:
        return location
    return os.path.abspath(location)


def restore_origin(cp: CompletedCheckpoint) -> dict[str, Any]:
    """What the checkpoints of a run that restored ``cp`` record of it."""
    m = cp.metadata
    return origin_of(cp.location, m.job_id, m.checkpoint_id, m.timestamp_ms)


def no_position_error(job_id: str, restore: CompletedCheckpoint, reason: str) -> CheckpointError:
    """A restore refused because ``restore`` carries no source position the query can resume from."""
    return CheckpointError(
        f"statekit job {job_id!r}: restore={restore.location} carries no Spark source position: {reason}. "
        "A query started from it would read its sources from their configured start, again counting what "
        "the savepoint's state already holds, so it is refused before any micro-batch. Ways out: restore a "
        "savepoint of the Spark query (stop_with_savepoint(), savepoint(), `statekit savepoint trigger`, "
        "or `statekit savepoint convert` while the query's checkpoint location still holds the batch), or, "
        "if the new query's input begins after the savepoint (a new folder of new files, a Kafka "
        f"topic read from the right offsets), say so: start(..., {_KEYWORD}); see "
        "docs/spark.md#what-a-restore-takes-state-and-source-position"
    )


def _history_error(job_id: str, restore: CompletedCheckpoint, where: str, why: str) -> CheckpointError:
    return CheckpointError(
        f"statekit job {job_id!r}: restore={restore.location} cannot be taken on {where}: {why}. Going on "
        "would ignore the restore. Ways out: start a new query (a new checkpoint_location) with "
        f"restore={restore.location} (its source position is written there); or drop restore= to go on from "
        "this location's own checkpoints; see docs/operations.md#upgrading-a-job"
    )


def decide(
    restore: CompletedCheckpoint,
    latest: CompletedCheckpoint | None,
    *,
    job_id: str,
    query: str,
    batch: int,
    location: SparkLocation | None,
    position: SparkPosition | str,
    input_begins_after: bool,
) -> Decision:
    """What micro-batch ``batch`` of ``query`` is, for a query told to restore ``restore`` (module doc).

    Raises:
        CheckpointError: If the restore cannot be taken here, with the reason and the way out.
    """
    props = restore.metadata.properties
    saved_query, saved_batch = props.get("spark_query_id"), props.get("spark_batch_id")
    where = f"query {query}" + (f" at {location.location}" if location is not None else "")
    if latest is not None and latest.metadata.properties.get("spark_query_id") == query:
        lp = latest.metadata.properties
        if same_origin(lp.get(ORIGIN_PROPERTY), restore_origin(restore)):
            return "latest"  # this query's history comes from this restore (a restart after a crash)
        if saved_query == query and saved_batch == lp.get("spark_batch_id"):
            return "latest"  # the restore is this query's latest checkpoint (e.g. its stop-with-savepoint)
        raise _history_error(
            job_id, restore, where,
            f"its latest checkpoint {latest.location} holds micro-batch {lp.get('spark_batch_id')} of this "
            "query, whose history does not come from that restore",
        )  # fmt: skip
    if saved_query == query and saved_batch is not None:
        if batch <= int(saved_batch):
            return "skip"  # Spark runs again a batch the savepoint holds (uncommitted at its stop)
        if batch == int(saved_batch) + 1:
            return "restore"
        raise _history_error(
            job_id, restore, where,
            f"the savepoint holds micro-batch {saved_batch} of this query, which has run micro-batches up "
            f"to {batch - 1} since (rolling back this location's sources is not possible)",
        )  # fmt: skip
    if batch == 0:
        if input_begins_after:
            return "restore"
        if isinstance(position, SparkPosition):
            raise CheckpointError(
                f"statekit job {job_id!r}: restore={restore.location} carries a Spark source position "
                f"({position.describe()}), but {where} starts at micro-batch 0, its sources from their "
                "configured start: the position was not written into the new checkpoint location (a "
                "query started by statekit's start() writes it). Start it with start(restore=...) on a new "
                f"checkpoint location, or pass {_KEYWORD} if its input begins after the savepoint"
            )
        raise no_position_error(job_id, restore, position)
    if (
        isinstance(position, SparkPosition)
        and location is not None
        and batch == position.seeded_batch + 1
        and matches(location, position)
    ):
        return "restore"  # a location seeded with the savepoint's position
    raise _history_error(
        job_id, restore, where,
        f"Spark has run micro-batches up to {batch - 1} here, and the savepoint's source position is "
        "not where this location stands",
    )  # fmt: skip


def streaming_sources(df: Any) -> int | None:
    """How many sources Spark's offset log will hold for a query over ``df`` (None: not known here).

    Spark's micro-batch execution turns each distinct streaming relation of
    the analyzed plan into one source (a relation read twice, as in a
    self-union, is one), in plan order: the count its offset log entries have
    a line for. Known only where the plan is reachable (a classic session).
    """
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return None
    try:
        leaves = jdf.queryExecution().analyzed().collectLeaves().iterator()
        found: list[Any] = []
        while leaves.hasNext():
            leaf = leaves.next()
            if leaf.getClass().getSimpleName() in ("StreamingRelation", "StreamingRelationV2") and not any(
                leaf.equals(seen) for seen in found
            ):
                found.append(leaf)
    except Exception:  # noqa: BLE001 - a plan Py4J cannot walk: Spark's own start checks the count
        return None
    return len(found)


def _check_sources(
    job_id: str, restore: CompletedCheckpoint, position: SparkPosition, sources: int | None
) -> None:
    """Refuse a seed whose offsets are for another number of sources than the query reads."""
    saved = len(position.source_offsets())
    if sources is None or sources == saved:
        return
    raise CheckpointError(
        f"statekit job {job_id!r}: {restore.location} holds the position of {position.describe()}, but "
        f"this query reads {sources} source(s): Spark resumes each source from its own line of the offset "
        "log, in the order of the query that was saved, so a different set of sources cannot continue from "
        "it. Ways out: read the same sources, in the same order, as the saved query did; or, if the new "
        f"query's input begins after the savepoint, pass {_KEYWORD} (its sources then start from their "
        "configured start)"
    )


def prepare_location(
    location: str,
    restore: CompletedCheckpoint,
    latest: CompletedCheckpoint | None,
    *,
    job_id: str,
    position: SparkPosition | str,
    input_begins_after: bool,
    sources: int | None = None,
) -> str | None:
    """Before Spark starts: seed a new location with the savepoint's position, or refuse the start.

    Returns the seeded query's id (None if nothing was written). ``sources``:
    how many sources the new query reads, where known (:func:`streaming_sources`).

    Raises:
        CheckpointError: If the restore would be refused at the first micro-batch (see :func:`decide`),
            or the query reads another number of sources than the position holds.
    """
    loc = SparkLocation(location)
    if loc.is_empty():
        if input_begins_after:
            return None
        if not isinstance(position, SparkPosition):
            raise no_position_error(job_id, restore, position)
        _check_sources(job_id, restore, position, sources)
        return seed(position, location)
    query = loc.query_id()
    if query is None:
        return None  # an offset log without metadata: Spark's own start reports it
    decide(
        restore, latest, job_id=job_id, query=query, batch=loc.next_batch(), location=loc,
        position=position, input_begins_after=input_begins_after,
    )  # fmt: skip
    return None


def prepare_latest(
    location: str,
    latest: CompletedCheckpoint | None,
    storage: Any,
    *,
    job_id: str,
    sources: int | None = None,
) -> str | None:
    """``restore="latest"`` on a new location: seed it with the latest checkpoint's source position.

    The latest checkpoint of a Spark query stands for a position its query's
    checkpoint location still holds (Spark keeps the last 100 batches): the new
    query continues right after it, as a restart on that location would. When
    the position is gone, the query's sources start from their configured
    start, as before, and a warning says why. Returns the seeded query's id.

    A location that already holds another query (one that never committed a
    batch, say, after its start was refused) is refused: Spark would go on
    from its own position with state that counts another query's input. One
    seeded from this checkpoint before (the same start again, after a crash
    before its first checkpoint) is the query's own and goes on.

    Raises:
        CheckpointError: If ``location`` holds a query other than the latest checkpoint's.
    """
    if latest is None:
        return None
    query = latest.metadata.properties.get("spark_query_id")
    if query is None or query == "static":
        return None  # a LocalRunner's or a static run's: no Spark position to continue from
    loc = SparkLocation(location)
    if not loc.is_empty():
        here = loc.query_id()
        if here is not None and here != query and not _seeded_from(loc, storage, latest):
            # Spark would go on from this location's own offsets (from its first file, for a query
            # that never committed a batch) with state that already counts another query's input.
            raise _elsewhere(job_id, latest, location, f"belongs to query {here}", loc)
        return None
    position = position_of(storage, latest.location, latest.metadata.properties)
    if isinstance(position, SparkPosition):
        _check_sources(job_id, latest, position, sources)
        return seed(position, location)
    warnings.warn(
        f"statekit job {job_id!r}: restore='latest' starts from {latest.location}, whose Spark source "
        f"position is not available ({position}); the new query's sources start from their configured "
        "start, so input the checkpoint already counts is read again unless it is gone. Restore a savepoint "
        "instead (it carries its position)",
        RuntimeWarning,
        stacklevel=3,
    )
    return None


def check_latest_taken_over(
    latest: CompletedCheckpoint,
    storage: Any,
    *,
    job_id: str,
    location: str,
    query: str,
    batch: int,
    connect: bool = False,
) -> None:
    """A batch of a query that ``restore='latest'`` started on another Spark query's checkpoint.

    The driver's check at the batch, for both runners: :func:`prepare_latest`
    refuses a location of another query at ``start()``, but a Spark Connect
    client may not reach the location (a relative path is the server's), and
    a location can change between ``start()`` and Spark's first batch. The
    batch is taken only where :func:`prepare_latest` put the query: right
    after the checkpoint's source position (the micro-batch after the seeded
    one, on a location whose offset log holds that position). A checkpoint
    without a Spark position (``start()`` warned: the sources start from their
    configured start) and a LocalRunner's or static run's pass.

    Args:
        connect: The query was started from a Spark Connect client (the way
            out then says how the client brings the position along).

    Raises:
        CheckpointError: If the batch does not continue from the checkpoint's source position.
    """
    other = latest.metadata.properties.get("spark_query_id")
    if other is None or other == "static" or other == query:
        return
    position = position_of(storage, latest.location, latest.metadata.properties)
    if not isinstance(position, SparkPosition):
        return
    loc = SparkLocation(location)
    if batch == position.seeded_batch + 1 and matches(loc, position):
        return
    what = (
        f"runs micro-batch {batch} of query {query}, not micro-batch {position.seeded_batch + 1} after "
        "that checkpoint's source position"
    )
    # start() on a Connect client seeds only a location it reaches under the same name.
    connect_way_out = (
        ". From a Spark Connect client, give the new checkpoint location as an absolute path or a URL that "
        "the client reaches too (a relative one is the server's): start() writes the checkpoint's source "
        "position into it before the query starts"
    )
    raise _elsewhere(job_id, latest, location, what, loc, more=connect_way_out if connect else "")


def _seeded_from(loc: SparkLocation, storage: Any, latest: CompletedCheckpoint) -> bool:
    """Whether ``loc`` was seeded with ``latest``'s source position (its offset log holds it)."""
    position = position_of(storage, latest.location, latest.metadata.properties)
    return isinstance(position, SparkPosition) and matches(loc, position)


def _elsewhere(
    job_id: str, latest: CompletedCheckpoint, location: str, what: str, loc: SparkLocation, more: str = ""
) -> CheckpointError:
    """``restore='latest'`` refused: Spark's location ``location`` does not continue from ``latest``."""
    offsets, commits = loc.batches("offsets"), loc.batches("commits")
    query = latest.metadata.properties.get("spark_query_id")
    return CheckpointError(
        f"statekit job {job_id!r}: restore='latest' takes {latest.location}, made by Spark query "
        f"{query}, but the checkpoint location {location} {what} (offset log {_span(offsets)}, commit log "
        f"{_span(commits)}): Spark would go on from that location's own source position, and the input the "
        "state already counts would be read again. Start on a new checkpoint location (restore='latest' "
        "then continues right after the checkpoint), or on the query's own location"
        + ("; this one holds no committed micro-batch and may be deleted" if not commits else "")
        + more
    )


def _span(batches: list[int]) -> str:
    """Micro-batches ``batches`` of a Spark log as a message names them."""
    if not batches:
        return "empty"
    return f"batch {batches[0]}" if len(batches) == 1 else f"batches {batches[0]}-{batches[-1]}"
