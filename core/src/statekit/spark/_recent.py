"""The driver's last micro-batches of each query, for a ``StreamingQueryListener``: :func:`batch_info_for`.

Spark keeps a ``foreachBatch`` sink out of its progress events
(``stateOperators`` and ``observedMetrics`` stay empty, ``numOutputRows`` is
-1; docs/spark.md says why), so a listener cannot read statekit's numbers
from the event itself. It can ask for them: the driver keeps the
:class:`~statekit.spark.BatchInfo` of each query's last
:data:`KEPT_PER_QUERY` micro-batches in this process, and a listener's
``onQueryProgress`` (called after the batch, in the driver's Python process)
looks its event's batch up with :func:`batch_info_for`. A Spark Connect
client's listener runs in the client, not beside the driver: there the
metrics system and the log line are the channels.

What it may import: ``._batchinfo`` only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from ._batchinfo import BatchInfo

__all__ = ["KEPT_PER_QUERY", "KEPT_QUERIES", "batch_info_for", "record_batch"]

#: Micro-batches kept per query (a listener that falls further behind gets None).
KEPT_PER_QUERY = 100
#: Queries kept (the least recently reported is forgotten first).
KEPT_QUERIES = 64

_LOCK = threading.Lock()
_RECENT: OrderedDict[str, OrderedDict[int, BatchInfo]] = OrderedDict()


def record_batch(query_id: str, info: BatchInfo) -> None:
    """Keep ``info`` as query ``query_id``'s batch ``info.batch_id`` (the driver calls this per batch)."""
    with _LOCK:
        batches = _RECENT.pop(query_id, None) or OrderedDict()
        _RECENT[query_id] = batches
        batches.pop(info.batch_id, None)
        batches[info.batch_id] = info
        while len(batches) > KEPT_PER_QUERY:
            batches.popitem(last=False)
        while len(_RECENT) > KEPT_QUERIES:
            _RECENT.popitem(last=False)


def batch_info_for(
    progress: Any = None, *, query_id: str | None = None, batch_id: int | None = None
) -> BatchInfo | None:
    """What statekit did in the micro-batch a progress event reports; None if this driver kept no record.

    Args:
        progress: A ``StreamingQueryProgress`` (``event.progress`` in a
            listener's ``onQueryProgress``, or ``query.lastProgress`` as a dict);
            its query ``id`` and ``batchId`` name the batch.
        query_id: The query's id (``query.id``), instead of ``progress``.
        batch_id: The batch id, instead of ``progress``.

    None when the batch ran no statekit operator, ran in another process (a
    Spark Connect server, an earlier driver), or is older than the last
    :data:`KEPT_PER_QUERY` batches of its query.

    Example::

        class StateSize(StreamingQueryListener):
            def onQueryProgress(self, event):
                info = batch_info_for(event.progress)
                if info is not None and info.checkpoint_stats is not None:
                    print(event.progress.batchId, info.checkpoint_stats.state_entries)
    """
    if progress is not None:
        if isinstance(progress, dict):
            query_id, batch_id = progress.get("id"), progress.get("batchId")
        else:
            query_id, batch_id = getattr(progress, "id", None), getattr(progress, "batchId", None)
    if query_id is None or batch_id is None:
        raise TypeError("batch_info_for needs a progress (event.progress) or both query_id and batch_id")
    with _LOCK:
        batches = _RECENT.get(str(query_id))
        return None if batches is None else batches.get(int(batch_id))
