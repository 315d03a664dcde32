"""Where a checkpoint's time goes, by phase, with one meaning in every channel.

A checkpoint has four numbers, the same in ``BatchInfo`` /
``CheckpointInfo``, the metrics and the log line, the checkpoint history
and ``statekit checkpoints history``:

``snapshot``
    The subtasks' snapshots, without the upload: the backends copying or
    serializing their state (on Spark the slowest task's, summed over the
    subtasks it serves).
``upload``
    The same task's time handing the snapshots' bytes to the checkpoint
    storage (every ``create_stream``, ``write`` and close).
``metadata``
    Completing the checkpoint on the driver: writing ``_metadata``.
``duration``
    From the checkpoint's trigger to its completion. On Spark a checkpoint
    is triggered when its micro-batch starts (after the batch to start from
    is decided), so this is the whole batch up to ``_metadata``: its tasks
    (input, records, snapshots), its sink, and the metadata. On the
    :class:`~statekit.LocalRunner` it is ``snapshot + upload + metadata`` and
    what lies between them.

``checkpoint_seconds`` (metrics), ``BatchInfo.checkpoint_seconds`` and
``CheckpointInfo.duration`` are ``snapshot + upload + metadata``: the time
the checkpoint itself cost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .._contracts import CheckpointOutputStream, CheckpointWriter
from ..snapshots._snapshot import StreamStateHandle

__all__ = ["CheckpointTiming", "TimedWriter"]


@dataclass(frozen=True)
class CheckpointTiming:
    """One checkpoint's phases, in seconds (see the module doc)."""

    snapshot: float = 0.0
    upload: float = 0.0
    metadata: float = 0.0
    duration: float = 0.0

    @property
    def checkpoint(self) -> float:
        """What the checkpoint itself cost: ``snapshot + upload + metadata``."""
        return self.snapshot + self.upload + self.metadata

    def to_ms(self) -> dict[str, int]:
        """The phases in whole milliseconds, as the history keeps them."""
        return {
            "snapshot_ms": _ms(self.snapshot),
            "upload_ms": _ms(self.upload),
            "metadata_ms": _ms(self.metadata),
            "duration_ms": _ms(self.duration),
        }


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


class TimedWriter:
    """A checkpoint writer that adds the time spent in the storage's streams to :attr:`upload_seconds`."""

    def __init__(self, inner: CheckpointWriter) -> None:
        self._inner = inner
        self.upload_seconds = 0.0

    @property
    def location(self) -> str:
        """The checkpoint's location."""
        return self._inner.location

    def create_stream(self, name: str, *, shared: bool = False) -> CheckpointOutputStream:
        """The inner writer's stream, timed."""
        t = time.perf_counter()
        try:
            stream = self._inner.create_stream(name, shared=shared)
        finally:
            self.upload_seconds += time.perf_counter() - t
        return _TimedStream(stream, self)

    def complete(self, metadata: bytes) -> str:
        """Complete the inner writer's checkpoint."""
        return self._inner.complete(metadata)

    def abort(self) -> None:
        """Abort the inner writer's checkpoint."""
        self._inner.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _TimedStream:
    """A checkpoint stream whose writes and close count as upload."""

    def __init__(self, inner: CheckpointOutputStream, owner: TimedWriter) -> None:
        self._inner = inner
        self._owner = owner

    def write(self, data: bytes) -> int:
        t = time.perf_counter()
        try:
            return self._inner.write(data)
        finally:
            self._owner.upload_seconds += time.perf_counter() - t

    def tell(self) -> int:
        return self._inner.tell()

    def close_and_get_handle(self) -> StreamStateHandle:
        t = time.perf_counter()
        try:
            return self._inner.close_and_get_handle()
        finally:
            self._owner.upload_seconds += time.perf_counter() - t

    def discard(self) -> None:
        self._inner.discard()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
