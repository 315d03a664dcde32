"""The driver side of a query started from a Spark Connect client: it runs on the Connect server."""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from .._errors import CheckpointError
from ._driver import MicroBatchDriver
from ._jobspec import JobSpec

__all__ = ["ConnectBatches", "query_id_at"]


class ConnectBatches:
    """The ``foreachBatch`` function of a query started from a Spark Connect client.

    Spark Connect pickles it to the server, which calls it in a Python
    process of the query's own, with each micro-batch bound to a session of
    the query (a Connect session too). So the driver side of statekit runs
    there: the :class:`~statekit.spark._driver.MicroBatchDriver` is made at
    the first micro-batch of each query run and lives as long as that process,
    as it lives as long as ``start()``'s closure on a classic driver.

    A Connect session cannot tell which query runs a batch (classic tasks read
    it from a local property), so the query's id is read where Spark keeps it:
    the ``metadata`` file of the query's checkpoint location, written when the
    query first started and kept across restarts, read through Spark itself
    (any file system the checkpoint location is on).

    Savepoint requests of an idle query are answered at once, as on a classic
    driver: the driver's watcher thread (:meth:`SparkSavepointRequests.watch`)
    runs in this server-side process, started with its first micro-batch of
    the query run (the process lives as long as the run, and ends with it),
    and each batch waits for a savepoint the watcher is writing.
    """

    def __init__(
        self,
        spec: JobSpec,
        *,
        restore: str | None,
        checkpoint_location: str,
        input_begins_after_savepoint: bool = False,
        client_session_id: str | None = None,
    ) -> None:
        """``spec`` without its DataFrame (a Connect DataFrame belongs to the client's session).

        ``client_session_id``: the id of the Connect session that starts the
        query (the one that holds it: a stop-with-savepoint stops it there).
        """
        # The server puts each batch's DataFrame in; a Connect DataFrame cannot be pickled.
        self._spec = dataclasses.replace(spec, df=None)  # type: ignore[arg-type]
        self._restore = restore
        self._checkpoint_location = checkpoint_location
        self._input_begins_after_savepoint = input_begins_after_savepoint
        self._client_session_id = client_session_id
        self._driver: MicroBatchDriver | None = None
        self._query_id: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Pickled once, by the client, before any batch: no driver to carry.
        return {**self.__dict__, "_driver": None, "_query_id": None}

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        """Process one micro-batch (on the Connect server's Python process)."""
        if self._driver is None or self._query_id is None:
            session = batch_df.sparkSession
            query_id = query_id_at(session, self._checkpoint_location)
            spec = dataclasses.replace(self._spec, df=batch_df)
            self._driver = MicroBatchDriver(
                spec, session, restore=self._restore, checkpoint_location=self._checkpoint_location,
                input_begins_after_savepoint=self._input_begins_after_savepoint,
            )  # fmt: skip
            self._query_id = query_id
            self._driver.savepoints.stop_query = self._stop
            # Requests of the query while it is idle, answered at once (a daemon thread of this process).
            self._driver.savepoints.watch(_ServerSideQuery(query_id))
        with self._driver.savepoints.batch(batch_id):  # an idle savepoint is not written meanwhile
            self._driver.process_batch(batch_df, batch_id, self._query_id)

    def _stop(self, query_id: str) -> None:
        """Stop-with-savepoint: stop the query through the client's session, which holds it.

        The sessions of this process are clones made for the batches, and
        Spark keeps a query in the session that started it. Runs on a thread
        of its own; Spark ends this process with the query.
        """
        url = os.environ.get("SPARK_CONNECT_LOCAL_URL")  # how this process reaches its server
        query = None
        if url is not None and self._client_session_id is not None:
            session = SparkSession.builder.remote(f"{url};session_id={self._client_session_id}").create()
            query = session.streams.get(query_id)
        if query is None and self._driver is not None:  # a server that lists it in the batches' sessions
            query = self._driver.session.streams.get(query_id)
        if query is None:
            warnings.warn(
                f"statekit job {self._spec.job_id!r}: the savepoint was written, but streaming query "
                f"{query_id} could not be found to stop it (its client's session "
                f"{self._client_session_id} is gone?); stop it with StreamingQuery.stop()",
                RuntimeWarning,
                stacklevel=1,
            )
            return
        query.stop()


class _ServerSideQuery:
    """The running query, as the savepoint watcher of the server-side process sees it.

    Active as long as this process lives: Spark runs it for one query run and
    stops it when the query terminates, taking the watcher with it. (The
    process's Connect sessions are clones made for the batches, which do not
    list the query: Spark keeps it in the client's session.)
    """

    isActive = True  # StreamingQuery's name

    def __init__(self, query_id: str) -> None:
        self.id = query_id


def query_id_at(session: SparkSession, checkpoint_location: str) -> str:
    """The id of the streaming query whose checkpoint location this is, as Spark recorded it.

    Raises:
        CheckpointError: If the location holds no query metadata.
    """
    path = checkpoint_location.rstrip("/") + "/metadata"
    try:
        rows = session.read.text(path).collect()
        found = json.loads(rows[0][0])["id"] if rows else None
    except Exception as e:  # Spark's own errors (a missing file, ...), and bad JSON
        raise CheckpointError(
            f"cannot read the streaming query's id from {path} (Spark writes it when a query "
            f"starts): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from e
    if not isinstance(found, str) or not found:
        raise CheckpointError(f"{path} names no streaming query id")
    return found
