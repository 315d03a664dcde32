"""The driver side of a query started from a Spark Connect client: it runs on the Connect server."""

from __future__ import annotations

import dataclasses
import json
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
    """

    def __init__(
        self,
        spec: JobSpec,
        *,
        restore: str | None,
        checkpoint_location: str,
        input_begins_after_savepoint: bool = False,
    ) -> None:
        """``spec`` without its DataFrame (a Connect DataFrame belongs to the client's session)."""
        # The server puts each batch's DataFrame in; a Connect DataFrame cannot be pickled.
        self._spec = dataclasses.replace(spec, df=None)  # type: ignore[arg-type]
        self._restore = restore
        self._checkpoint_location = checkpoint_location
        self._input_begins_after_savepoint = input_begins_after_savepoint
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
        self._driver.process_batch(batch_df, batch_id, self._query_id)


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
