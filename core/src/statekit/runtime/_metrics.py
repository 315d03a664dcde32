"""What a completed checkpoint holds and what led to it, as the numbers every channel shows.

Both runners describe each checkpoint they complete (on Spark: one per
micro-batch) with the same field names, which the log line, the Spark
metrics system and the docs share (docs/spark.md, "Where statekit shows
up"). The state's size comes from the checkpoint's own metadata, read on the
driver: nothing is scanned and the tasks send nothing extra. A canonical
snapshot counts its (key, namespace) entries and bytes exactly, per state; so
does the heap's native one (a base and deltas, ``state/_delta.py``, the
default checkpoint of the default backend), whose per-state bytes are those
of the files a restore reads; a native snapshot of an ordered key-value
engine (RocksDB, LMDB) records the entries its backend counted on write
(``state/_kvcount``), exact as well; one without them (an older statekit's,
or restored from one, or a job with ``statekit.metrics.exact-entries=false``)
records the engine's own count, an estimate (RocksDB's ``estimate-num-keys``
counts stored records, not entries), and the checkpoint says
``state_entries_exact=0``. The ordered engines' parts name no per-state
bytes, so a checkpoint with any of them has no per-state numbers. The
per-state numbers are read as ``statekit state list`` and ``statekit
checkpoints inspect`` read them (``checkpoints/_state_sizes``).

:func:`log_checkpoint` writes one line per checkpoint at INFO on the
``statekit`` logger::

    statekit checkpoint job=urls operator=process batch=7 checkpoint=8 records_in=1000 ...
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..checkpoints._metadata import SubtaskState
from ..checkpoints._state_sizes import StateSizes, part_state_sizes, summed_state_sizes
from ..checkpoints._timing import CheckpointTiming
from ..snapshots._snapshot import CANONICAL_FORMAT
from ..state._kvcount import ENTRY_COUNTS

__all__ = [
    "LOGGER",
    "CheckpointInfo",
    "CheckpointStats",
    "StateSize",
    "checkpoint_fields",
    "checkpoint_stats",
    "log_checkpoint",
    "metric_name",
]

#: The logger of the per-checkpoint line (INFO).
LOGGER = logging.getLogger("statekit")

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def metric_name(name: str) -> str:
    """``name`` as a metric or log key part: letters, digits, ``_``, ``.``, ``-``; the rest ``_``."""
    return _UNSAFE.sub("_", name) or "_"


@dataclass(frozen=True)
class StateSize:
    """One state's size in a checkpoint, summed over its subtasks (exact)."""

    entries: int
    """(key, namespace) entries; a map state's entry is a key's whole map, a list's its whole list."""
    bytes: int
    """Bytes of the state's serialized keys, namespaces and values in the canonical format: in the
    snapshot, or for the heap's native one in every file a restore reads (its base and deltas)."""


@dataclass(frozen=True)
class CheckpointStats:
    """What one completed checkpoint holds and what writing it cost.

    Attributes:
        checkpoint_id: The checkpoint.
        state_entries: (key, namespace) entries of every keyed state, as ``statekit state
            list`` reports them for the same checkpoint.
        state_entries_exact: False when a native snapshot's count is the engine's estimate
            (any native part makes the total an estimate).
        state_bytes: Bytes of every subtask's keyed snapshot (a native one's files, the
            referenced ones included): its full size.
        operator_state_bytes: Bytes of the operator (non-keyed) state.
        bytes_written: Bytes this checkpoint wrote to the checkpoint storage: canonical
            files, a native snapshot's new uploads, operator state.
        bytes_referenced: Bytes of native files this checkpoint references from earlier
            ones instead of uploading them again (0 for canonical snapshots).
        states: Per state, when every subtask's snapshot names them: canonical ones and the
            heap's native base and deltas (else empty: RocksDB's and LMDB's native ones).
    """

    checkpoint_id: int
    state_entries: int = 0
    state_entries_exact: bool = True
    state_bytes: int = 0
    operator_state_bytes: int = 0
    bytes_written: int = 0
    bytes_referenced: int = 0
    states: Mapping[str, StateSize] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointInfo:
    """What the :class:`~statekit.LocalRunner` did up to a checkpoint it completed.

    The counts are those since the previous checkpoint of the same :meth:`~statekit.LocalRunner.run`
    (or since the run began), the names those of Spark's :class:`~statekit.spark.BatchInfo`.

    Attributes:
        checkpoint_id: The checkpoint.
        location: Where it lives.
        records: Records processed.
        outputs: Output records.
        late_records: Records at or below the watermark.
        bad_records: Records skipped into dead letters.
        timers_fired: Timers that fired.
        duration: Seconds the checkpoint itself took: ``timing.checkpoint`` (its
            snapshots, their upload, ``_metadata``).
        stats: The checkpoint's size.
        timing: Its phases (:mod:`statekit.checkpoints._timing`), as the metrics
            and the checkpoint history show them.
    """

    checkpoint_id: int
    location: str
    records: int
    outputs: int
    late_records: int
    bad_records: int
    timers_fired: int
    duration: float
    stats: CheckpointStats
    timing: CheckpointTiming = field(default_factory=CheckpointTiming)


def checkpoint_stats(checkpoint_id: int, states: Iterable[SubtaskState]) -> CheckpointStats:
    """The size of checkpoint ``checkpoint_id`` from its subtasks' metadata entries."""
    entries = state_bytes = op_bytes = written = referenced = 0
    exact = True
    parts: list[StateSizes] = []
    for st in states:
        op = st.operator or {}
        op_bytes += int(op.get("size", 0))
        k = st.keyed
        if k is None:
            continue
        entries += int(k.get("entries", 0))
        size = int(k.get("size", 0))
        state_bytes += size
        parts.append(part_state_sizes(k))
        if k.get("format", CANONICAL_FORMAT) == CANONICAL_FORMAT and "state_entries" in k:
            written += size
        else:
            # A native snapshot (or a canonical one from before per-state counts): its own total,
            # exact when the backend counted (key, namespace) entries on write (state/_kvcount).
            counted = _counted_entries(k)
            if counted is not None:
                entries += counted - int(k.get("entries", 0))
            exact = exact and (k.get("format", CANONICAL_FORMAT) == CANONICAL_FORMAT or counted is not None)
            uploaded = int(k.get("uploaded", size))
            written += uploaded
            referenced += size - uploaded
    named = summed_state_sizes(parts)
    per_state = (
        {n: StateSize(named.entries[n], named.bytes.get(n, 0)) for n in sorted(named.entries)}
        if named.entries is not None and named.bytes is not None
        else {}
    )
    return CheckpointStats(
        checkpoint_id,
        state_entries=entries,
        state_entries_exact=exact,
        state_bytes=state_bytes,
        operator_state_bytes=op_bytes,
        bytes_written=written + op_bytes,
        bytes_referenced=referenced,
        states=per_state,
    )


def _counted_entries(keyed: Mapping[str, Any]) -> int | None:
    """A native part's exact entries, from the counts its backend kept on write; None: none recorded."""
    per_state = part_state_sizes(keyed).entries
    if per_state is not None:  # a backend that knows each state's entries (heap's deltas)
        return sum(per_state.values())
    native = keyed.get("native")
    meta = native.get("meta") if isinstance(native, Mapping) else None
    counts = meta.get(ENTRY_COUNTS) if isinstance(meta, Mapping) else None
    if not isinstance(counts, Mapping) or meta.get("entries_estimated"):  # type: ignore[union-attr]
        return None
    return sum(int(n) for per_group in counts.values() for n in per_group.values())


def checkpoint_fields(stats: CheckpointStats, timing: CheckpointTiming) -> dict[str, int | float]:
    """The checkpoint's metric fields, by the names every channel uses.

    The times are the phases of :mod:`statekit.checkpoints._timing` (the
    history keeps the same in milliseconds): ``checkpoint_seconds`` is
    ``snapshot + upload + metadata``, ``checkpoint_duration_seconds`` the time
    from the trigger to ``_metadata`` (on Spark the whole micro-batch).
    """
    fields: dict[str, int | float] = {
        "checkpoint_id": stats.checkpoint_id,
        "checkpoint_seconds": round(timing.checkpoint, 6),
        "checkpoint_snapshot_seconds": round(timing.snapshot, 6),
        "checkpoint_upload_seconds": round(timing.upload, 6),
        "checkpoint_metadata_seconds": round(timing.metadata, 6),
        "checkpoint_duration_seconds": round(timing.duration, 6),
        "checkpoint_bytes_written": stats.bytes_written,
        "checkpoint_bytes_referenced": stats.bytes_referenced,
        "state_entries": stats.state_entries,
        "state_entries_exact": int(stats.state_entries_exact),
        "state_bytes": stats.state_bytes,
        "operator_state_bytes": stats.operator_state_bytes,
    }
    for name, size in stats.states.items():
        fields[f"state.{metric_name(name)}.entries"] = size.entries
        fields[f"state.{metric_name(name)}.bytes"] = size.bytes
    return fields


def log_checkpoint(job_id: str, operator_id: str, fields: Mapping[str, int | float | str]) -> None:
    """One line at INFO on the ``statekit`` logger: ``statekit checkpoint job=… operator=… <fields>``."""
    if LOGGER.isEnabledFor(logging.INFO):
        text = " ".join(f"{k}={v}" for k, v in fields.items())
        LOGGER.info(
            "statekit checkpoint job=%s operator=%s %s", metric_name(job_id), metric_name(operator_id), text
        )
