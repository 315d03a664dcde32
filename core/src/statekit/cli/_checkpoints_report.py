"""What ``statekit checkpoints`` reports of a checkpoint: its summary and its status.

A checkpoint is ``complete`` when its metadata parses and every file it names
is there with its size, ``verified`` when every byte was read and compared,
``unreadable`` (with its problems) when it cannot be restored.
"""

from __future__ import annotations

import datetime as dt
import posixpath
from collections.abc import Sequence
from typing import Any

from .._contracts import CheckpointStorage
from .._errors import CheckpointNotFoundError, CorruptCheckpointError
from ..checkpoints._metadata import CheckpointMetadata
from ..checkpoints._restore import load_checkpoint
from ..checkpoints._verify import (
    CheckpointProblem,
    crc_only_files,
    identity_notes,
    verify_checkpoint,
    verify_loaded,
)
from ..snapshots._snapshot import CANONICAL_FORMAT

__all__ = [
    "COMPLETE",
    "UNREADABLE",
    "VERIFIED",
    "checkpoint_summary",
    "entries_estimated",
    "listed",
    "raw_sizes",
    "status_fields",
    "unknown_summary",
    "uploaded_bytes",
    "verified",
    "when",
]

#: ``status`` of a checkpoint whose metadata parses and whose files are all there, with their sizes.
COMPLETE = "complete"
#: ``status`` of a checkpoint whose every byte was read and every checksum compared.
VERIFIED = "verified"
#: ``status`` of a checkpoint that cannot be restored; its ``problems`` say why.
UNREADABLE = "unreadable"


def when(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if ms else "-"


def raw_sizes(raw: Any) -> dict[str, int]:
    """What ``inspect`` shows of a subtask's raw state (its metadata entry): bytes per kind, items."""
    raw = raw if isinstance(raw, dict) else {}
    items = raw.get("items")
    spans = items if isinstance(items, list) else []
    keyed, size = raw.get("keyed_size", 0), raw.get("size", 0)
    return {
        "raw_bytes": size if isinstance(size, int) else 0,
        "raw_keyed_bytes": keyed if isinstance(keyed, int) else 0,
        "raw_keyed_key_groups": len(raw.get("key_groups") or {}),
        "raw_operator_items": len(spans),
    }


def entries_estimated(keyed: dict[str, Any]) -> bool:
    """Whether a keyed entry's ``entries`` is the engine's estimate, not a count.

    RocksDB's ``estimate-num-keys`` counts every version of a key held in SST
    files not yet compacted together: a key updated in four micro-batches may
    count four times. Its native snapshots say so in their ``meta``.
    """
    native = keyed.get("native")
    meta = native.get("meta") if isinstance(native, dict) else None
    return isinstance(meta, dict) and bool(meta.get("entries_estimated"))


def uploaded_bytes(keyed: dict[str, Any]) -> int | None:
    """The bytes a native (incremental) keyed snapshot uploaded; None for a canonical one (all written)."""
    if "uploaded" not in keyed:
        return None
    return int(keyed.get("uploaded", 0))


def checkpoint_summary(location: str, meta: CheckpointMetadata) -> dict[str, Any]:
    operators = {}
    for op, sts in meta.operators.items():
        keyed = [st.keyed for st in sts if st.keyed]
        raw = [raw_sizes(st.raw) for st in sts if st.raw]
        keyed_bytes = sum(int(k.get("size", 0)) for k in keyed)
        uploads = [u for k in keyed if (u := uploaded_bytes(k)) is not None]
        operators[op] = {
            "parallelism": len(sts),
            "entries": sum(int(k.get("entries", 0)) for k in keyed),
            "entries_estimated": any(entries_estimated(k) for k in keyed),
            "bytes": keyed_bytes
            + sum(int(st.operator.get("size", 0)) for st in sts if st.operator)
            + sum(r["raw_bytes"] for r in raw),
            "raw_bytes": sum(r["raw_bytes"] for r in raw),
            "raw_operator_items": sum(r["raw_operator_items"] for r in raw),
            # Native snapshots: what this checkpoint uploaded, and what it references of earlier ones.
            "uploaded_bytes": sum(uploads) if uploads else None,
            "referenced_bytes": (
                sum(int(k.get("size", 0)) - (uploaded_bytes(k) or 0) for k in keyed if "uploaded" in k)
                if uploads
                else None
            ),
            "formats": sorted({k.get("format", CANONICAL_FORMAT) for k in keyed}),
            "operator_states": sorted(
                {n for st in sts if st.operator for n in st.operator.get("states", [])}
            ),
        }
    return {
        "location": location,
        "job_id": meta.job_id,
        "checkpoint_id": meta.checkpoint_id,
        "kind": meta.kind,
        "time": when(meta.timestamp_ms),
        "max_parallelism": meta.max_parallelism,
        "backend": meta.backend,
        "operators": operators,
        "properties": meta.properties,
    }


def unknown_summary(job: str, location: str) -> dict[str, Any]:
    """The fields of :func:`checkpoint_summary` for a checkpoint whose metadata cannot be read: its path's."""
    name = posixpath.basename(location.rstrip("/"))
    number = name.removeprefix("chk-")
    return {
        "location": location,
        "job_id": job,
        "checkpoint_id": int(number) if number.isdigit() else None,
        "kind": None,
        "time": None,
        "max_parallelism": None,
        "backend": None,
        "operators": {},
        "properties": {},
    }


def status_fields(problems: Sequence[CheckpointProblem], good: str) -> dict[str, Any]:
    return {
        "status": UNREADABLE if problems else good,
        "problems": [{"file": p.file, "problem": p.problem} for p in problems],
    }


def listed(storage: CheckpointStorage, job: str, location: str) -> dict[str, Any] | None:
    """One row of ``checkpoints list``: the summary and the quick check; None if it is gone meanwhile."""
    try:
        try:
            cp = load_checkpoint(storage, location)
        except CorruptCheckpointError as e:
            problems = verify_checkpoint(storage, location, deep=False) or [
                CheckpointProblem(location, f"{location.rstrip('/')}/_metadata", e.problem)
            ]
            return {**unknown_summary(job, location), **status_fields(problems, COMPLETE)}
        problems = verify_loaded(cp, deep=False)
        if problems:
            # Files go missing while retention deletes the checkpoint: then it is gone, not damaged.
            storage.read_metadata(location)
    except CheckpointNotFoundError:
        return None  # deleted after it was listed: retention of a running job
    return {**checkpoint_summary(location, cp.metadata), **status_fields(problems, COMPLETE)}


def verified(
    storage: CheckpointStorage, location: str
) -> tuple[list[CheckpointProblem], list[str], list[str]]:
    """Every problem of the checkpoint at ``location`` (read whole), its files checked by CRC only, notes.

    A note says what could not be checked (the kind of metadata an early 0.1 statekit wrote).
    """
    try:
        cp = load_checkpoint(storage, location)
    except CorruptCheckpointError:
        return verify_checkpoint(storage, location, deep=True), [], []
    return verify_loaded(cp, deep=True), crc_only_files(cp), identity_notes(cp)
