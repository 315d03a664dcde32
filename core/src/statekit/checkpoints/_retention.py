"""Which checkpoints exist and which stay: ids that only go up, and retention.

:func:`highest_checkpoint_id` numbers new checkpoints above every completed
one; :func:`apply_retention` keeps the newest ``n`` and deletes shared files
no kept checkpoint references (Flink's ``CheckpointsCleaner``).
"""

from __future__ import annotations

import contextlib
import json
import re
import warnings
from typing import Any

from .._contracts import (
    CheckpointStorage,
    SupportsOrphanCleanup,
)
from .._errors import (
    CheckpointError,
    CorruptSnapshotError,
    StateError,
)
from ._restore import load_checkpoint

__all__ = ["apply_retention", "highest_checkpoint_id", "named_checkpoint_id"]

_CHECKPOINT_NAME = re.compile(r"chk-(0|[1-9][0-9]*)/?$")


def named_checkpoint_id(location: str) -> int | None:
    """The id a location's ``chk-<n>`` name gives, or None where the storage names it otherwise."""
    match = _CHECKPOINT_NAME.search(location)
    return None if match is None else int(match[1])


def highest_checkpoint_id(storage: CheckpointStorage, job_id: str) -> int:
    """The highest id of the completed checkpoints of ``job_id`` (damaged ones included), or 0.

    A new checkpoint must be numbered above it: an id is never used twice, so a
    restore of an older checkpoint never writes into a newer one. The id comes
    from the location's ``chk-<n>`` name where the storage uses it, else from
    the metadata (an unreadable one then counts as nothing: its name told nothing).
    """
    highest = 0
    for location in storage.list_checkpoints(job_id):
        named = named_checkpoint_id(location)
        if named is not None:
            highest = max(highest, named)
            continue
        with contextlib.suppress(CorruptSnapshotError, CheckpointError):
            highest = max(highest, load_checkpoint(storage, location).checkpoint_id)
    return highest


def apply_retention(storage: CheckpointStorage, job_id: str, retained: int) -> list[str]:
    """Discard all but the newest ``retained`` checkpoints, unreferenced shared files, and orphans.

    Orphans are what failed checkpoints could not delete (their store was down):
    storages that can (:class:`~statekit.backend_api.SupportsOrphanCleanup`) delete them here.
    Never raises for a failing store: what cannot be deleted now is warned of
    and tried again after the next checkpoint. Returns the discarded locations.
    Call it when no checkpoint is in flight.
    """
    try:
        locations = storage.list_checkpoints(job_id)
    except StateError as e:
        warnings.warn(f"retention skipped: {e}", RuntimeWarning, stacklevel=2)
        return []
    drop, keep = (locations[:-retained], locations[-retained:]) if retained >= 1 else ([], locations)
    unreadable = False

    def shared_of(loc: str, *, kept: bool = False) -> dict[str, dict[str, Any]]:
        nonlocal unreadable
        try:
            meta = load_checkpoint(storage, loc).metadata
        except StateError as e:
            # Its shared files stay (orphans beat deleting a kept file), and while a kept
            # one is unreadable no file can be told to be an orphan.
            unreadable = unreadable or kept
            if kept:
                warnings.warn(
                    f"retention cannot read a kept checkpoint, so it deletes no orphaned files: {e}",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return {}
        return {json.dumps(d, sort_keys=True): d for d in meta.shared_handles()}

    kept: dict[str, tuple[str, dict[str, Any]]] = {}
    for loc in keep:
        kept.update((key, (loc, d)) for key, d in shared_of(loc, kept=True).items())
    done: set[str] = set(kept)
    for loc in drop:
        for key, desc in shared_of(loc).items():
            if key not in done:
                try:
                    storage.discard_shared(loc, desc)
                except StateError as e:
                    # Refused (a description pointing outside the job's shared files: damaged
                    # or crafted metadata) or the store failed. Never deleted by force.
                    warnings.warn(f"retention left a file alone: {e}", RuntimeWarning, stacklevel=2)
                done.add(key)  # discard once even if several dropped checkpoints share it
        try:
            storage.discard_checkpoint(loc)
        except StateError as e:
            warnings.warn(f"retention could not discard {loc} now: {e}", RuntimeWarning, stacklevel=2)
    # Orphans only when every kept checkpoint's references are known: else a file
    # only an unreadable checkpoint references would look like one.
    if isinstance(storage, SupportsOrphanCleanup) and keep and not unreadable:
        try:
            storage.discard_orphans(job_id, list(kept.values()))
        except StateError as e:
            warnings.warn(f"retention could not delete orphans now: {e}", RuntimeWarning, stacklevel=2)
    return drop
