"""What ``read_logs`` planned as lost or read twice in a micro-batch, for the driver's ``BatchInfo``.

``read_logs`` plans a micro-batch in a Python process of Spark's own (not the
driver's), and records in the batch's end offset, in Spark's offset log
(``<checkpoint location>/offsets/<batch>``), what it found it cannot read
exactly: a file moved away or compressed before it was read to its end, or a
file truncated below its read offset and then appended to, whose first bytes
are read again (the message names the exact byte range). The warnings of that
process reach no one; so the driver reads the ``lost`` lists of the batch's
entry after the batch and puts them into ``BatchInfo.input_lost`` and a
warning of its own. Only a process that called :func:`~statekit.spark.read_logs`
reads the entry (one small file per micro-batch).
"""

from __future__ import annotations

import json
import threading

from ..checkpoints._source_position import SparkLocation, source_lines

__all__ = ["input_lost", "note_log_source"]

_used = threading.Event()


def note_log_source() -> None:
    """``read_logs`` was called in this process: its queries' drivers look for lost input."""
    _used.set()


def input_lost(location: str | None, batch_id: int) -> tuple[str, ...]:
    """The ``lost`` messages of micro-batch ``batch_id``'s offset log entry at ``location``, in source order.

    Empty when no ``read_logs`` was made in this process, the location is not known, or the
    entry is not there (a location Spark keeps elsewhere): nothing else is read.
    """
    if location is None or not _used.is_set():
        return ()
    try:
        text = SparkLocation(location).read(f"offsets/{batch_id}")
    except (OSError, ValueError) as e:  # the batch is committed: say what cannot be read, never fail it
        return (f"micro-batch {batch_id}'s entry of Spark's offset log at {location} could not be read "
                f"({type(e).__name__}: {e}), so what read_logs planned as lost there is not known: see the "
                "dead letters of stage 'lost' and the executors' warnings",)  # fmt: skip
    if text is None:
        return ()
    found: list[str] = []
    for line in source_lines(text):
        try:
            offset = json.loads(line)
        except ValueError:  # another source's offset ("-", or not JSON): none of ours
            continue
        lost = offset.get("lost") if isinstance(offset, dict) else None
        if isinstance(lost, list):
            found.extend(str(x) for x in lost)
    return tuple(found)
