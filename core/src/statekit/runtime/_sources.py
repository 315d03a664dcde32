"""The source side of the embedded runner: where the input is, reading it, and its bad records.

As Flink keeps a source reader apart from the operators it feeds, the
:class:`~statekit.LocalRunner` hands its input to a :class:`SourceReader`: the
source position after the last processed record and the operator state that
keeps it in every checkpoint, the loops that read a :class:`ReplayableSource`
record by record or in micro-batches (ending a batch where a periodic
checkpoint falls due), and the bad-record policy of one run (dead letters and
their budget). What a record does is the runner's: the reader calls it back
to process records, emit outputs and take periodic checkpoints.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .._contracts import CheckpointWriter
from .._errors import BadRecordError
from ..checkpoints._metadata import SubtaskState
from ..checkpoints._restore import CompletedCheckpoint
from ..checkpoints._writing import write_subtask_state
from ..sources import bad_record_error
from ..sources._badrecords import BadRecord, BadRecordPolicy
from ..sources._logsource import LogSource
from ..state._operator import OperatorStateBackendImpl
from ..state._state import ListStateDescriptor

__all__ = [
    "SOURCE_OPERATOR",
    "FileSource",
    "ProcessBatch",
    "ReadCounts",
    "RecordSource",
    "RejectedRecordError",
    "ReplayableSource",
    "SourceReader",
    "placed",
]

#: The operator id under which checkpoints keep the source position.
SOURCE_OPERATOR = "__source__"
_POSITION: ListStateDescriptor[str] = ListStateDescriptor("position", str)


@runtime_checkable
class ReplayableSource(Protocol):
    """Records that can be read again from a position kept in a checkpoint.

    ``read(position)`` yields ``(record, position after the record)``;
    ``position`` is None to read from the start. Positions must be JSON-able.
    """

    def read(self, position: Any) -> Iterator[tuple[Any, Any]]:
        """Records after ``position``, each with the position just after it."""


class RecordSource:
    """A replayable source over a sequence held in memory; the position is an index.

    A list is positional, as Flink's ``fromElements``: a run that restores a
    checkpoint taken after ``n`` records goes on at index ``n`` of whatever
    list it is handed, so handing it the same list again reads only what lies
    past ``n`` (:meth:`skipped_by` says how many it skips, which the runner
    reports in ``RunResult.skipped_records`` and a WARNING).
    """

    def __init__(self, records: Sequence[Any]) -> None:
        self.records = records

    def skipped_by(self, position: Any) -> int:
        """How many records of this sequence a read from ``position`` (an index) passes over."""
        return min(int(position or 0), len(self.records))

    def read(self, position: Any) -> Iterator[tuple[Any, Any]]:
        """Records from index ``position``."""
        start = int(position or 0)
        for i in range(start, len(self.records)):
            yield self.records[i], i + 1


#: The rotation-safe :class:`~statekit.LogSource` under its old name. The
#: FileSource it replaces identified a file by its name and lost or repeated lines
#: when logs rotated; a checkpoint holding that source's ``[file name, byte offset]``
#: position is still restored (files named before it count as read, as they did),
#: or refused naming the file when that cannot be done safely.
FileSource = LogSource


class RejectedRecordError(BadRecordError):
    """A record whose key or event time cannot be computed, or that Arrow refuses: no state was touched."""

    bad: BadRecord

    @classmethod
    def of(cls, stage: str, record: Any, exc: BaseException) -> RejectedRecordError:
        """The error for ``record``, which failed with ``exc`` at ``stage`` (key, event-time or arrow)."""
        bad = BadRecord(stage, f"{type(exc).__name__}: {exc}", raw=repr(record))
        return cls(str(bad_record_error(bad)), bad)


def placed(bad: BadRecord, src: Any, position: Any) -> BadRecord:
    """``bad`` with the place its source gives for ``position`` (file, offset, line, raw text), if any."""
    locate = getattr(src, "locate", None)
    place = locate(position) if locate is not None else None
    if place is None:
        # A source without files: the position (a RecordSource's index) is all there is.
        return BadRecord(bad.stage, bad.error, None, None, None, f"{bad.raw} (position {position!r})")
    return BadRecord(bad.stage, bad.error, place.file, place.offset, place.line, place.raw)


class ReadCounts(Protocol):
    """What a read counts, as :class:`~statekit.RunResult` holds it."""

    records: int
    bad_records: int
    outputs: int


#: Processes records as one micro-batch; a bad one (at index ``i``) goes to ``rejected(i, bad)``.
ProcessBatch = Callable[[Sequence[Any], Callable[[int, BadRecord], None]], list[Any]]


@dataclass(frozen=True)
class _Read:
    """One run's read: what it reads, counts into and checkpoints with."""

    source: ReplayableSource
    counts: ReadCounts
    policy: BadRecordPolicy
    checkpoint: Callable[[], None]
    interval: int  # records between periodic checkpoints; 0: none
    max_records: int | None

    def on_bad(self, bad: BadRecord) -> None:
        """Apply the bad-records policy to ``bad``: raise, or dead-letter it and check the count budget."""
        self.counts.bad_records += 1
        self.policy.handle(bad)

    def checkpoint_due(self) -> None:
        """Check the share of bad records (``statekit.bad-records.max-ratio``), then checkpoint."""
        self.check_budget()
        self.checkpoint()

    def check_budget(self) -> None:
        """Fail if the share of bad records is above ``statekit.bad-records.max-ratio``."""
        self.policy.check_ratio(self.counts.records + self.counts.bad_records)


class SourceReader:
    """The input of one :class:`~statekit.LocalRunner`: its position, and reading it into the runner.

    Args:
        process: Processes one record, returning its outputs; raises
            :class:`RejectedRecordError` for a record that touched no state.
        process_batch: Processes records as one micro-batch (a batch function's input).
        emit: Hands outputs to the runner's sink.
    """

    def __init__(
        self,
        process: Callable[[Any], Sequence[Any]],
        process_batch: ProcessBatch,
        emit: Callable[[Sequence[Any]], None],
    ) -> None:
        self._process = process
        self._process_batch = process_batch
        self._emit = emit
        self.position: Any = None
        """The source position after the last processed record (None: the start)."""
        self._state = OperatorStateBackendImpl()

    # --- the position in checkpoints ------------------------------------------------------

    def write(self, writer: CheckpointWriter) -> SubtaskState:
        """Write the position into ``writer`` as the state of :data:`SOURCE_OPERATOR`."""
        self._state.get_list_state(_POSITION).update(
            [] if self.position is None else [json.dumps(self.position)]
        )
        return write_subtask_state(writer, SOURCE_OPERATOR, 0, None, self._state)

    @staticmethod
    def restored(cp: CompletedCheckpoint) -> tuple[OperatorStateBackendImpl, Any]:
        """The source's state in ``cp`` and the position it holds, for :meth:`adopt`; changes nothing."""
        state = OperatorStateBackendImpl()
        state.restore(cp.operator_states(SOURCE_OPERATOR, 1)[0])
        positions = state.get_list_state(_POSITION).get()
        return state, json.loads(positions[0]) if positions else None

    def adopt(self, state: OperatorStateBackendImpl, position: Any) -> None:
        """Continue from a restored state and position (what :meth:`restored` returned)."""
        self._state = state
        self.position = position

    # --- reading ------------------------------------------------------------------------

    def read(
        self,
        source: ReplayableSource,
        counts: ReadCounts,
        policy: BadRecordPolicy,
        checkpoint: Callable[[], None],
        *,
        vectorized: bool,
        interval: int,
        batch_size: int,
        max_records: int | None,
    ) -> tuple[int, bool]:
        """Read ``source`` from :attr:`position` until it ends or ``max_records`` were processed.

        Every ``interval`` records (0: never) the bad-record budget is checked
        and ``checkpoint`` called. With ``vectorized``, records go to the
        runner in micro-batches of ``batch_size``. Bad records go to ``policy``,
        which is closed at the end. Returns the records since the last
        checkpoint and whether the source was exhausted.
        """
        run = _Read(source, counts, policy, checkpoint, interval, max_records)
        try:
            if vectorized:
                since, exhausted = self._read_batches(run, batch_size)
            else:
                since, exhausted = self._read_records(run)
            if exhausted:
                run.check_budget()
        finally:
            policy.close()
        return since, exhausted

    def _read_records(self, run: _Read) -> tuple[int, bool]:
        """:meth:`read`'s loop for a record-at-a-time function."""
        src, counts, interval, max_records = run.source, run.counts, run.interval, run.max_records
        process, emit = self._process, self._emit
        since = 0
        # A source that can hands bad lines over as BadRecords, so the position moves past them.
        read: Callable[[Any], Iterator[tuple[Any, Any]]] = getattr(src, "read_marked", src.read)
        for record, position in read(self.position):
            if record.__class__ is BadRecord:
                run.on_bad(record)
                outputs: Sequence[Any] = ()
            else:
                try:
                    outputs = process(record)
                except RejectedRecordError as e:
                    run.on_bad(placed(e.bad, src, position))
                    outputs = ()
                else:
                    counts.records += 1
            self.position = position
            if outputs:
                counts.outputs += len(outputs)
                emit(outputs)
            since += 1
            if interval and since >= interval:
                since = 0
                run.checkpoint_due()
            if max_records is not None and counts.records >= max_records:
                return since, False
        return since, True

    def _read_batches(self, run: _Read, batch_size: int) -> tuple[int, bool]:
        """:meth:`read`'s loop for a batch function: micro-batches of ``batch_size`` records.

        A batch also ends where a periodic checkpoint is due and at
        ``max_records``, so checkpoints and the kept position fall between
        batches.
        """
        src, counts, interval, max_records = run.source, run.counts, run.interval, run.max_records
        since = 0
        buffer: list[Any] = []
        places: list[Any] = []  # the position after each buffered record, to name a bad one
        last: Any = None  # the position after the buffered records (and bad lines after them)
        marked = 0  # bad lines read since the last batch, handled already

        def rejected(i: int, bad: BadRecord) -> None:
            run.on_bad(placed(bad, src, places[i]))

        def flush() -> None:
            nonlocal since, marked
            bad_before = counts.bad_records
            outputs = self._process_batch(buffer, rejected)
            self.position = last
            counts.records += len(buffer) - (counts.bad_records - bad_before)
            if outputs:
                counts.outputs += len(outputs)
                self._emit(outputs)
            since += len(buffer) + marked
            marked = 0
            buffer.clear()
            places.clear()

        read: Callable[[Any], Iterator[tuple[Any, Any]]] = getattr(src, "read_marked", src.read)
        for record, position in read(self.position):
            if record.__class__ is BadRecord:
                run.on_bad(record)
                last = position
                marked += 1
                if buffer:
                    continue
                self.position = position
                since += marked
                marked = 0
                if interval and since >= interval:
                    since = 0
                    run.checkpoint_due()
                continue
            buffer.append(record)
            places.append(position)
            last = position
            total = counts.records + len(buffer)
            stop = max_records is not None and total >= max_records
            if stop or len(buffer) >= batch_size or (interval and since + len(buffer) >= interval):
                flush()
                if interval and since >= interval:
                    since = 0
                    run.checkpoint_due()
                if stop:
                    return since, False
        if buffer:
            flush()
        return since, True
