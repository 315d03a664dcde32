"""The embedded runner: a keyed function over records in one process.

:class:`LocalRunner` routes each record by key group to one of ``p`` logical
subtasks, checkpoints every N records (and on demand), takes savepoints, and
resumes after a crash from the latest completed checkpoint: state is restored
and the source replays the records after the checkpointed position, so state
reflects every record exactly once.

With :class:`~statekit.EventTime` the watermark advances as records
arrive (the largest event time minus the delay); event-time timers fire as it
passes them, processing-time timers when the clock reaches them (checked after
every record). Timers are keyed state, and the watermark is kept in each
checkpoint's metadata, so a resumed run fires exactly what an uninterrupted
one would.

The runner keeps the subtasks and routes records to them; the rest it hands
to collaborators, as Flink does: checkpoints to a
:class:`~statekit.checkpoints._coordinator.CheckpointCoordinator`, the input (its
position, reading it, bad records) to a
:class:`~statekit.runtime._sources.SourceReader`, and time (the watermark, late
records, firing timers) to a :class:`~statekit.runtime._time.TimeCoordinator`.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._contracts import (
    CheckpointStorage,
    CheckpointWriter,
    StateBackend,
)
from .._errors import CheckpointError, SourceError
from ..checkpoints._coordinator import CheckpointCoordinator, CheckpointPolicy, start_point
from ..checkpoints._fencing import RunFence
from ..checkpoints._honour import SavepointRequests
from ..checkpoints._metadata import SubtaskState
from ..checkpoints._restore import CompletedCheckpoint
from ..checkpoints._restore_rules import RestoreRules
from ..checkpoints._retention import highest_checkpoint_id
from ..checkpoints._source_position import ORIGIN_PROPERTY, origin_of
from ..plugins._config import Configuration
from ..plugins._registry import PluginRegistry, default_registry
from ..serialization._keygroups import (
    compute_default_max_parallelism,
    validate_parallelism,
)
from ..serialization._serializers import serializer_for
from ..sources._badrecords import BadRecord, BadRecordPolicy
from ..sources._logsource import LogSource
from ..state._ttl import Clock, system_clock
from ..timers import MAX_WATERMARK, MIN_WATERMARK, NO_TIMER
from ..timers._eventtime import EventTime
from ._batches import process_as_batch, process_one_by_one
from ._configured import checkpoint_storage_from_config, state_backend_from_config
from ._declared import DeclaredStates, declared_states
from ._function import (
    KeyedBatchFunction,
    KeyedProcessFunction,
    RuntimeContext,
    declares_raw_restore,
)
from ._letters import JobDeadLetters
from ._metrics import LOGGER, CheckpointInfo, checkpoint_fields, checkpoint_stats, log_checkpoint
from ._migration_log import DROPPED_PROPERTY, merge_undeclared, warn_of_dropped, warn_of_undeclared
from ._sources import (
    SOURCE_OPERATOR,
    FileSource,
    RecordSource,
    RejectedRecordError,
    ReplayableSource,
    SourceReader,
)
from ._subtasks import OperatorSubtasks
from ._time import TimeCoordinator, end_of_time_message

__all__ = [
    "FileSource",
    "LocalRunner",
    "RecordSource",
    "ReplayableSource",
    "RunResult",
]


class _StopWithSavepoint(Exception):
    """Leaves run()'s read loop after the checkpoint a stop-with-savepoint was taken at (its location)."""


@dataclass
class RunResult:
    """What a :meth:`LocalRunner.run` did."""

    records: int = 0
    outputs: int = 0
    checkpoints: list[str] = field(default_factory=list)
    failed_checkpoints: list[str] = field(default_factory=list)
    restored_from: str | None = None
    restore_origin: str | None = None
    """The checkpoint or savepoint an explicit restore took, whose history this run's state descends from."""
    skipped_checkpoints: list[tuple[str, str]] = field(default_factory=list)
    """``(location, reason)`` of each newer checkpoint ``restore="latest"`` could not restore and skipped."""
    late_records: int = 0
    """Records at or below the watermark (see :class:`~statekit.timers.LatePolicy`)."""
    bad_records: int = 0
    """Records skipped into dead letters (see ``statekit.bad-records.policy``); not in :attr:`records`."""
    timers_fired: int = 0
    undeclared_states: dict[str, list[str]] = field(default_factory=dict)
    """Restored states the function does not declare, by kind (``keyed``, ``operator``): kept and carried
    into every checkpoint, and named in a WARNING of the ``statekit.state`` logger when the run opened."""
    dropped_fields: dict[str, list[str]] = field(default_factory=dict)
    """What the restore dropped of the values the checkpoint held (state to changes: a dataclass field
    the code no longer has); named in a WARNING of the ``statekit.state`` logger, and recorded by the
    first checkpoint after the restore (the checkpoint history shows it)."""
    watermark: int = MIN_WATERMARK
    """The event-time watermark when the run ended: the one the records made, also after an end of
    input fired every timer. ``MAX_WATERMARK`` only when the job's restored watermark is the end of
    time (a checkpoint an older statekit wrote at an end of input): then every record is late, with
    a warning."""
    stopped_with_savepoint: str | None = None
    """The savepoint a stop-with-savepoint request (``statekit savepoint trigger --stop``) took, after
    which the run ended before the next record; None if the run was not stopped so."""
    input_lost: list[str] = field(default_factory=list)
    """What the source reported of its input (a :class:`~statekit.LogSource`'s ``InputLostWarning``
    messages): bytes not read, and bytes of a file truncated in place that are read a second time."""
    checkpoint_infos: list[CheckpointInfo] = field(default_factory=list)
    """What each checkpoint of :attr:`checkpoints` holds and what led to it (also given to
    :attr:`LocalRunner.on_checkpoint` and logged at INFO on the ``statekit`` logger)."""
    skipped_records: int = 0
    """Records of a list (a :class:`RecordSource`) the run did not read because the position it
    went on from (restored, or left by the runner's previous run) was past them: a list is
    positional, as Flink's ``fromElements``. Also said in a WARNING on the ``statekit`` logger when the
    position was restored. A list that is not empty and shorter than the position is refused
    (``SourceError``, before anything is read); one that holds only records after the restored
    checkpoint or savepoint is read from its start with ``input_begins_after_savepoint=True``."""


def _positional_skip(src: RecordSource, position: Any, job: str, *, restored: bool) -> int:
    """How many records of ``src`` the run skips from ``position``; the log says so when any.

    A WARNING when the position was restored (by this run, or by ``restore()`` before it);
    INFO when it is the one the runner's previous run left (going on over a grown list is what
    ``max_records`` is for).

    Raises:
        SourceError: If the list is not empty and shorter than the position: it cannot be the
            input the position counts, and none of it would be read. Nothing was read.
    """
    total = len(src.records)
    start = int(position or 0)
    whence = "restored" if restored else "left by this runner's previous run"
    if 0 < total < start:
        raise SourceError(
            f"statekit job {job!r}: the run would go on from position {start} ({whence}: the records "
            f"of the input read so far), but the list it was given has {total} records, so none of "
            "them would be read (a list is positional, as Flink's fromElements: the position is an "
            "index into the list). Hand over the whole input: the records read before, then the new "
            "ones. If the list holds only records after the restored checkpoint or savepoint, say so: "
            "run(..., restore=..., input_begins_after_savepoint=True) reads it from its first record. "
            "Nothing was read"
        )
    skipped = src.skipped_by(position)
    if skipped:
        LOGGER.log(
            logging.WARNING if restored else logging.INFO,
            "statekit job %r: the run goes on from position %s (%s), so it skipped the first %d of "
            "the %d records of the list it was given (a list is positional, as Flink's fromElements: "
            "the position is an index into the list). To read them as new input, run without restore= "
            "(a new job id, or delete its checkpoints); if the list holds only records after the "
            "restored checkpoint or savepoint, run(..., input_begins_after_savepoint=True)",
            job, position, whence, skipped, total,
        )  # fmt: skip
    return skipped


def _drop_restored_position(source: SourceReader, job: str, restored_from: str | None) -> None:
    """The user's statement that the input begins after the restored checkpoint: read it from its start.

    One place for every source (a list, a :class:`~statekit.LogSource`, one of the user's): the
    position restored is of the input before, so it is dropped, and said so at INFO.
    """
    if source.position is not None:
        LOGGER.info(
            "statekit job %r: the input begins after %s (input_begins_after_savepoint=True), so the "
            "source position restored from it (%s) is dropped and the source is read from its start",
            job, restored_from, repr(source.position)[:300],  # a LogSource's names every file
        )  # fmt: skip
    source.position = None


def _parallelisms(conf: Configuration, parallelism: int | None) -> tuple[int, int]:
    """``(parallelism, max parallelism)``: as given, else as configured, else 1 and Flink's default."""
    # `is None`, not `or`: parallelism=0 must fail in validate_parallelism, not mean 1.
    p = int(parallelism if parallelism is not None else conf.get("statekit.parallelism") or 1)
    maxp = conf.get("statekit.max-parallelism")
    max_parallelism = int(maxp) if maxp else compute_default_max_parallelism(p)
    validate_parallelism(p, max_parallelism)
    return p, max_parallelism


def _operator_of(runner: LocalRunner, conf: Configuration) -> OperatorSubtasks:
    """The runner's subtasks (made when first needed)."""
    return OperatorSubtasks(
        runner.backend,
        runner.function_factory,
        job_id=runner.job_id,
        operator_id=runner.operator_id,
        key_serializer=runner.key_serializer,
        parallelism=runner.parallelism,
        max_parallelism=runner.max_parallelism,
        clock=runner.clock,
        key_cache_size=int(conf.get("statekit.key-cache-size")),
        local_dir_parent=conf.get("statekit.local-dir"),
        exact_entries=bool(conf.get("statekit.metrics.exact-entries")),
        hint=runner._time.processing_hint,
        migration_progress=runner.on_migration_progress,
        registry=runner.registry,
    )


def _coordinator_of(runner: LocalRunner, conf: Configuration) -> CheckpointCoordinator:
    """The runner's checkpoint coordinator, with the LocalRunner's policy."""
    return CheckpointCoordinator(
        runner.storage,
        runner.job_id,
        max_parallelism=runner.max_parallelism,
        retained=int(conf.get("statekit.checkpoints.retained")),
        native=conf.get("statekit.checkpoint.format") != "canonical",
        history_entries=int(conf.get("statekit.checkpoints.history.max-entries")),
        policy=CheckpointPolicy("LocalRunner", ways_out=_NO_FALLBACK),
        registry=runner.registry,
    )


def _warn_of_late_records(
    time: TimeCoordinator, result: RunResult, job: str, restored_from: str | None
) -> None:
    """Late records a run counted and did not process, or that met a watermark at the end of time."""
    if time.watermark == MAX_WATERMARK and result.late_records:
        # Only a restored watermark can be the end of time (an end of input here keeps the
        # event-time one) and nothing lowers it: every record is late, so say so loudly.
        warnings.warn(
            end_of_time_message(job, restored_from, f"all {result.late_records} records"),
            RuntimeWarning,
            stacklevel=3,
        )
    if time.late_unsunk:
        warnings.warn(
            f"{time.late_unsunk} late records (event time at or below the watermark) were "
            "counted and not processed: pass late_sink= to receive them, or EventTime(late='process')",
            RuntimeWarning,
            stacklevel=3,
        )


def _check_source_position(cp: CompletedCheckpoint, job_id: str, input_begins_after: bool) -> None:
    """Refuse a Spark query's checkpoint or savepoint: its source position is Spark's, not this runner's.

    Raises:
        CheckpointError: Unless ``input_begins_after`` states the source begins after it.
    """
    query = cp.metadata.properties.get("spark_query_id")
    if query is None or input_begins_after:
        return
    raise CheckpointError(
        f"statekit job {job_id!r}: {cp.location} was made by a Spark "
        + (
            "static run()"
            if query == "static"
            else f"query ({query}, micro-batch {cp.metadata.properties.get('spark_batch_id')})"
        )
        + ": its source position is Spark's (offsets of Spark sources), which the LocalRunner's sources "
        "cannot resume from, so restoring it would read the source given to run() from its start, counting "
        "again what its state holds. If that source begins after it, say so: "
        "run(..., restore=..., input_begins_after_savepoint=True); see docs/operations.md#upgrading-a-job"
    )


#: What a damaged checkpoint's error says when statekit.restore.fallback is off.
_NO_FALLBACK = (
    ". statekit.restore.fallback is off, so no older checkpoint is tried: restore one by its location "
    "(statekit checkpoints list shows them), or a savepoint"
)


class LocalRunner:
    """Runs a :class:`KeyedProcessFunction` in this process over ``p`` logical subtasks.

    Backend and storage come from ``config`` by name (the same keys as on
    Spark, see docs/configuration.md), or are passed as objects. Example::

        runner = LocalRunner(
            CountPerUrl,
            key_selector=lambda r: r["url"],
            config={"statekit.checkpoints.dir": "/tmp/ckpt", "statekit.parallelism": 2,
                    "statekit.checkpoint.interval-records": 10_000},
        )
        result = runner.run(FileSource("logs/", parse=json.loads), restore="latest")
        runner.close()  # or ``with LocalRunner(...) as runner:``

    :meth:`close` closes the backends and removes their working directories; a
    runner never closed has its directories removed when it is garbage-collected
    or the interpreter exits.

    A restore that migrates a state's entries (see docs/state.md) logs its
    progress at INFO (logger ``statekit.state``); ``on_migration_progress``
    gets every report too, as ``(state, done, total)`` of one subtask.

    Why it is over 400 lines: it is the embedded runner's whole public API, and
    most of its length is the documentation of each method and property (about 325
    lines of code, each method a few lines handing over to a collaborator:
    ``OperatorSubtasks``, ``SourceReader``, ``TimeCoordinator``, ``JobDeadLetters``,
    the ``CheckpointCoordinator``).
    """

    dead_letter_sink: Callable[[BadRecord], None] | None = None
    """Called with every bad record skipped under ``statekit.bad-records.policy=dead-letter``
    (besides or instead of ``statekit.bad-records.dead-letter-path``): set it on the runner
    before :meth:`run`."""

    on_checkpoint: Callable[[CheckpointInfo], None] | None = None
    """Called with a :class:`~statekit.CheckpointInfo` after every checkpoint this runner completes
    (the same numbers as the log line; set it on the runner before :meth:`run`)."""

    def __init__(
        self,
        function: Callable[[], KeyedProcessFunction],
        *,
        key_selector: Callable[[Any], Any],
        key_type: Any = str,
        config: Mapping[str, object] | Configuration | None = None,
        backend: StateBackend | None = None,
        storage: CheckpointStorage | None = None,
        parallelism: int | None = None,
        job_id: str = "job",
        operator_id: str = "process",
        clock: Clock | None = None,
        registry: PluginRegistry | None = None,
        sink: Callable[[Any], None] | None = None,
        allow_non_restored_state: bool = False,
        event_time: EventTime | None = None,
        late_sink: Callable[[Any], None] | None = None,
        on_migration_progress: Callable[[str, int, int | None], None] | None = None,
    ) -> None:
        conf = config if isinstance(config, Configuration) else Configuration.from_mapping(config or {})
        self.config = conf
        self.registry = registry or default_registry()
        # As the Spark driver does: unknown keys, ill-typed or out-of-range values and options of
        # plugins not installed fail here, also beside backend and storage objects.
        conf.validate(self.registry, backend_given=backend is not None, storage_given=storage is not None)
        self.function_factory = function
        self.key_selector = key_selector
        self.key_serializer = serializer_for(key_type)
        self.parallelism, self.max_parallelism = _parallelisms(conf, parallelism)
        self.backend = backend or state_backend_from_config(conf, self.registry)
        self.storage = storage or checkpoint_storage_from_config(conf, self.registry)
        self.job_id = job_id
        self.operator_id = operator_id
        self.clock = clock or system_clock
        self.checkpoint_interval = int(conf.get("statekit.checkpoint.interval-records"))  # 0: off
        self.batch_size = int(conf.get("statekit.batch-size"))  # >= 1: its option's minimum
        self.sink = sink
        self.allow_non_restored_state = allow_non_restored_state
        self.on_migration_progress = on_migration_progress
        self.event_time = event_time
        self._time = TimeCoordinator(
            lambda: self._operator.subtasks,
            event_time=event_time,
            clock=self.clock,
            fire_at_end_of_input=conf.get("statekit.timers.end-of-input") != "keep",
            late_sink=late_sink,
        )
        self._operator = _operator_of(self, conf)
        self._source = SourceReader(self.process, self._process_batch, self._emit)
        self._opened = False
        self._coordinator = _coordinator_of(self, conf)
        self._restored_from: str | None = None
        self._origin: dict[str, Any] | None = None  # the explicit restore the job's history descends from
        self._foreign_position: CompletedCheckpoint | None = None  # a restored Spark checkpoint
        self._input_begins_after = False  # the user said the source begins after the restored one
        self._position_restored = False  # the source position was restored and no run read from it yet
        self._letters = JobDeadLetters(conf, job_id)
        self.skipped_checkpoints: list[tuple[str, str]] = []
        """What the last ``restore("latest")`` skipped: ``(location, reason)`` of each damaged checkpoint."""
        self.undeclared_states: dict[str, list[str]] = {}
        """Restored states the function does not declare (``{"keyed": [...], "operator": [...]}``), kept."""
        self.dropped_fields: dict[str, list[str]] = {}
        """What the restore dropped of the stored values (see :attr:`RunResult.dropped_fields`)."""
        self._dropped_unrecorded = False  # no checkpoint recorded dropped_fields yet
        self._declared: DeclaredStates | None = None
        self._rules: RestoreRules | None = None  # what a restored checkpoint must match
        self._metrics = bool(conf.get("statekit.metrics.enabled"))
        self._result: RunResult | None = None  # the run under way, whose counts checkpoints report
        self._counted = (0, 0, 0, 0, 0)  # those counts at the last checkpoint
        self._running = False  # inside run(): its result gets each checkpoint's info
        self._requests: SavepointRequests | None = None  # savepoint requests, honoured inside run()
        self._stop_at: str | None = None  # the savepoint a stop request took: run() ends there

    # --- life cycle ----------------------------------------------------------------

    def restore(self, location: str = "latest", *, input_begins_after_savepoint: bool = False) -> str | None:
        """Restore from a checkpoint or savepoint location, or the newest restorable checkpoint.

        With ``"latest"``, the newest completed checkpoint is checked first (its
        metadata, and that every file it names is there with its size) and
        restored, every block's checksum verified as it is read. If it is
        damaged, the next older retained one is tried, with a warning naming
        what was skipped and why (:attr:`skipped_checkpoints`), unless
        ``statekit.restore.fallback`` is off. Incompatible state (another max
        parallelism, other serializers) never falls back: it fails at once.

        A location restores that checkpoint or savepoint, state and source
        position, whatever history the job has (Flink's ``run -s``); the
        checkpoints after it record it (``restore_origin``, in the history).
        A checkpoint or savepoint of a Spark query holds Spark's source
        position, not this runner's: :meth:`run` refuses to read a source
        after it unless ``input_begins_after_savepoint`` states that the
        source begins after it (it is then read from its start). Restoring
        it only to read its state (as tests and tools do) is fine. A list
        (:class:`RecordSource`) is positional: the next run goes on at the
        restored index of the list it is given, refuses a non-empty list
        shorter than that index (``SourceError``: none of it would be read).
        ``input_begins_after_savepoint`` says the source given to the next
        run holds only what came after: the restored position is dropped
        and that source (a list, a LogSource, one of your own) is read
        from its start.

        Returns the location restored from (None when ``"latest"`` finds none).
        Every check runs and every byte is verified before the runner's state
        is replaced; on error the runner is unchanged. Checkpoints taken after a
        restore are numbered above every checkpoint of the job, so no existing
        one is ever written into.

        Raises:
            CorruptCheckpointError: If the checkpoint (with ``"latest"``: every
                retained one) is damaged, naming each damaged file.
        """
        if self._opened:
            raise CheckpointError("restore before the runner starts processing")
        self.skipped_checkpoints = []
        start = start_point(
            self.storage, self.job_id, location, self._restore_checkpoint,
            fallback=bool(self.config.get("statekit.restore.fallback")),
            ways_out="" if location != "latest" else _NO_FALLBACK,
        )  # fmt: skip
        self.skipped_checkpoints = start.skipped
        self._input_begins_after = input_begins_after_savepoint
        cp = start.checkpoint
        if cp is None:
            return None
        if start.explicit:  # the runs after it descend from it (restore_origin)
            m = cp.metadata
            self._origin = origin_of(cp.location, m.job_id, m.checkpoint_id, m.timestamp_ms)
            return location
        return cp.location

    def _restore_checkpoint(self, cp: CompletedCheckpoint) -> None:
        """Restore everything from ``cp``, or raise and leave the runner unchanged."""
        self._coordinator.validate(cp, self._restore_rules())
        # Known before anything is replaced: a failing listing leaves the runner unchanged too.
        highest = highest_checkpoint_id(self.storage, self.job_id)
        claimed = self._coordinator.claims(cp)
        fresh = self._operator.restored(cp, claimed=claimed)
        try:
            source_state, position = SourceReader.restored(cp)
        except BaseException:
            for st in fresh:
                st.discard()
            raise
        self._operator.replace(fresh)
        self._source.adopt(source_state, position)
        self._position_restored = True
        self._time.restored(cp.metadata.properties)
        self._restored_from = cp.location
        self.dropped_fields = self._declared.dropped(cp) if self._declared is not None else {}
        self._dropped_unrecorded = bool(self.dropped_fields)
        self._origin = cp.metadata.properties.get(ORIGIN_PROPERTY)  # carried forward
        self._foreign_position = cp if "spark_query_id" in cp.metadata.properties else None
        self._letters.restored(cp, claimed=claimed)
        self._coordinator.restored(cp, highest)
        self._operator.restore_done(cp.checkpoint_id)

    def _restore_rules(self) -> RestoreRules:
        """What a checkpoint this runner restores must match (made once, with the declared states)."""
        if self._rules is None:
            function = self.function_factory()
            self._declared = DeclaredStates(
                self.operator_id, declared_states(function, job_id=self.job_id, parallelism=self.parallelism,
                                                  max_parallelism=self.max_parallelism),
            )  # fmt: skip
            self._rules = RestoreRules(
                self.operator_id,
                self.parallelism,
                type(function).__name__,
                declares_raw_restore(function),
                self.allow_non_restored_state,
                self._declared,
                {SOURCE_OPERATOR: 1},
            )
        return self._rules

    def _open(self) -> None:
        self._operator.open(self._time.watermark)
        self._opened = True
        if self._restored_from is not None:
            self.undeclared_states = merge_undeclared(
                st.undeclared_states() for st in self._operator.subtasks
            )
            warn_of_undeclared(f"job {self.job_id!r}", self._restored_from, self.undeclared_states)
            warn_of_dropped(f"job {self.job_id!r}", self._restored_from, self.dropped_fields)

    def close(self) -> None:
        """Close every subtask's function and backends, as Flink cancels a job: no checkpoint.

        What a run read after its last checkpoint (one stopped at ``max_records``) is read
        again by the next run that restores; call :meth:`checkpoint` first to keep it.
        """
        self._opened = False
        try:
            self._operator.close()
        finally:
            self._coordinator.end()
            self._letters.close()

    # --- processing ----------------------------------------------------------------

    def process(self, record: Any) -> list[Any]:
        """Process one record now (no source, no periodic checkpoints); returns its outputs.

        The outputs include those of timers the record's event time (or the
        clock) made due. A late record under the side-output policy goes to
        ``late_sink`` and has no outputs.
        """
        if not self._opened:
            self._open()
        time = self._time
        event_time_of = time.event_time_of
        ts = None
        if event_time_of is not None:
            try:
                ts = event_time_of(record)
            except Exception as e:  # before any state is touched: the record alone is bad
                raise RejectedRecordError.of("event-time", record, e) from e
            if ts is not None and time.left_out_late(record, ts):
                return time.fire_processing_time([])
        try:
            key = self.key_selector(record)
            st = self._operator.of_key(key)
        except Exception as e:
            raise RejectedRecordError.of("key", record, e) from e
        st.keyed.set_current_key(key)
        pctx = st.pctx
        pctx.current_key = key
        pctx.timestamp = ts
        out = st.function.process(record, pctx)
        outputs = [] if out is None else list(out)
        if ts is not None:
            time.event_time_seen(ts, outputs)
        if time.processing_hint.earliest != NO_TIMER:
            time.fire_processing_time(outputs)
        return outputs

    @property
    def vectorized(self) -> bool:
        """Whether the function is a :class:`~statekit.KeyedBatchFunction` (records go in micro-batches)."""
        return isinstance(self._operator.ensure()[0].function, KeyedBatchFunction)

    def process_batch(self, records: Sequence[Any]) -> list[Any]:
        """Process ``records`` now as one micro-batch (no source, no periodic checkpoints); its outputs.

        A :class:`~statekit.KeyedBatchFunction` gets each key's records (dicts)
        as one Arrow record batch and its outputs come back as dicts, one per
        row; a :class:`KeyedProcessFunction` processes them one by one. With
        event time, records at or below the watermark the batch starts with are
        late, and the watermark moves after the batch (as on Spark). A bad
        record (its key or event time cannot be computed, its columns clash
        with the rows before it) raises :class:`~statekit.errors.BadRecordError`.
        """
        return self._process_batch(records, None)

    def _process_batch(
        self, records: Sequence[Any], rejected: Callable[[int, BadRecord], None] | None
    ) -> list[Any]:
        """:meth:`process_batch`, a bad record (see ``_batches``) to ``rejected(index, bad)``, or raised."""
        if not self._opened:
            self._open()
        if not self.vectorized:
            return process_one_by_one(records, rejected, self.process)
        return process_as_batch(
            records, rejected, subtasks=self._operator, time=self._time, key_selector=self.key_selector
        )

    def _emit(self, outputs: Sequence[Any]) -> None:
        """Hand ``outputs`` to the sink, if there is one."""
        sink = self.sink
        if sink is not None:
            for o in outputs:
                sink(o)

    def advance_watermark(self, watermark: int, outputs: list[Any] | None = None) -> list[Any]:
        """Move the event-time watermark to ``watermark`` (never back) and fire the timers it passes.

        Runs by itself as records arrive; call it to inject a watermark (e.g.
        idle input). ``MAX_WATERMARK`` ends the input as the end of the source
        does under ``statekit.timers.end-of-input=fire``: every event-time timer
        fires and the watermark stays the one the records made (see
        :meth:`TimeCoordinator.fire_at_end_of_time
        <statekit.runtime._time.TimeCoordinator.fire_at_end_of_time>`). Returns
        the fired timers' outputs (also appended to ``outputs``).
        """
        out = [] if outputs is None else outputs
        if not self._opened:
            self._open()
        return self._time.advance(watermark, out)

    @property
    def watermark(self) -> int:
        """The current event-time watermark in ms (``MIN_WATERMARK`` before any event time)."""
        return self._time.watermark

    @property
    def late_records(self) -> int:
        """Records at or below the watermark so far (see :class:`~statekit.timers.LatePolicy`)."""
        return self._time.late_records

    @property
    def late_sink(self) -> Callable[[Any], None] | None:
        """Receives late records under the side-output policy (None: they are counted, with a warning)."""
        return self._time.late_sink

    @late_sink.setter
    def late_sink(self, sink: Callable[[Any], None] | None) -> None:
        self._time.late_sink = sink

    @property
    def fire_at_end_of_input(self) -> bool:
        """Whether the end of the input fires every event-time timer (``statekit.timers.end-of-input``)."""
        return self._time.fire_at_end_of_input

    @fire_at_end_of_input.setter
    def fire_at_end_of_input(self, fire: bool) -> None:
        self._time.fire_at_end_of_input = fire

    def run(
        self,
        source: ReplayableSource | Iterable[Any],
        *,
        restore: str | None = None,
        max_records: int | None = None,
        input_begins_after_savepoint: bool = False,
    ) -> RunResult:
        """Process ``source`` (from the restored position), checkpointing as configured.

        ``restore`` is a checkpoint or savepoint location, or ``"latest"``.
        ``max_records`` stops early (the position is kept, so a later ``run``
        continues; the next run that restores reads again what this one read
        after its last checkpoint). Reaching the end of the source takes a final
        checkpoint when anything was read since the last one, as Flink does when
        a bounded job finishes, so the next run goes on from there; dead letters
        are published with the checkpoint that covers them. Plain iterables are
        not replayable: wrap a sequence in :class:`RecordSource` to resume after a crash.
        ``input_begins_after_savepoint``: see :meth:`restore`.
        """
        result = RunResult()
        self._result, self._running = result, True
        self._counted = self._counts()
        if restore is not None and not self._opened:
            result.restored_from = self.restore(
                restore, input_begins_after_savepoint=input_begins_after_savepoint
            )
            result.skipped_checkpoints = list(self.skipped_checkpoints)
        begins_after = input_begins_after_savepoint or self._input_begins_after
        if self._foreign_position is not None:
            _check_source_position(self._foreign_position, self.job_id, begins_after)
            self._foreign_position = None  # stated once: the run's checkpoints hold this runner's position
        src = source if isinstance(source, ReplayableSource) else RecordSource(list(source))
        if self._position_restored and begins_after:
            _drop_restored_position(self._source, self.job_id, self._restored_from)
        elif isinstance(src, RecordSource):  # before anything is read: a list that cannot follow stops here
            result.skipped_records = _positional_skip(
                src, self._source.position, self.job_id, restored=self._position_restored
            )
        self._position_restored = False
        if self._origin is not None:
            result.restore_origin = str(self._origin.get("location"))
        # A store that is down now fails the first checkpoint instead (which claims again).
        with contextlib.suppress(CheckpointError):
            self._coordinator.claim()
        if not self._opened:
            self._open()
        result.undeclared_states = self.undeclared_states
        result.dropped_fields = self.dropped_fields
        letters = self._letters.staged()
        time = self._time
        late_before, fired_before = time.start_run()
        if isinstance(src, LogSource):
            src.configure(self.config)  # statekit.source.*, for what the source was not given
        policy = BadRecordPolicy.from_config(
            self.config, sink=self.dead_letter_sink, job_id=self.job_id, letters=letters
        )
        self._requests = SavepointRequests(self._coordinator, self.config.get("statekit.savepoints.dir"))
        self._stop_at = None
        tolerable = self.config.get("statekit.checkpoint.tolerable-failures")

        def periodic() -> None:
            self._coordinator.periodic(
                self.checkpoint, result.checkpoints, result.failed_checkpoints, tolerable=tolerable
            )
            if self._stop_at is not None:
                raise _StopWithSavepoint(self._stop_at)  # before the next record is read

        try:
            since, exhausted = self._source.read(
                src,
                result,
                policy,
                periodic,
                vectorized=self.vectorized,
                interval=self.checkpoint_interval,
                batch_size=self.batch_size,
                max_records=max_records,
            )
            result.input_lost = [str(x) for x in getattr(src, "lost", None) or ()]
            if exhausted:
                final = time.end_of_input()
                result.outputs += len(final)
                self._emit(final)
                since += len(final)
            if exhausted and since:
                # As Flink does when bounded input ends: a final checkpoint, so a later run
                # over a grown source continues exactly where this one stopped.
                periodic()
        except _StopWithSavepoint as stop:
            result.stopped_with_savepoint = str(stop)
        finally:
            self._requests = None
        result.late_records = time.late_records - late_before
        result.timers_fired = time.timers_fired - fired_before
        result.watermark = time.watermark
        self._running = False
        _warn_of_late_records(time, result, f"job {self.job_id!r}", self._restored_from)
        return result

    # --- checkpoints and savepoints ------------------------------------------------------

    def _write_all(
        self, writer: CheckpointWriter, max_state_size: int | None, native_checkpoint_id: int | None = None
    ) -> list[SubtaskState]:
        if not self._opened:
            self._open()
        states = self._operator.write(writer, max_state_size, native_checkpoint_id)
        states.append(self._source.write(writer))
        return states

    def checkpoint(self) -> str:
        """Take a checkpoint now; returns its location. Older ones are retained per policy.

        Raises:
            FencedError: If a newer run of the job took over; nothing is written or deleted.
            CheckpointError: If the checkpoint fails; the previous one stays the latest.
        """
        properties = self._time_properties()
        if self._dropped_unrecorded:  # what the restore dropped: into the checkpoint history
            properties[DROPPED_PROPERTY] = self.dropped_fields
        staged = self._letters.seal(properties)
        written: list[SubtaskState] = []

        def write_all(
            writer: CheckpointWriter, max_state_size: int | None, native_checkpoint_id: int | None = None
        ) -> list[SubtaskState]:
            written[:] = self._write_all(writer, max_state_size, native_checkpoint_id)
            return written

        location = self._coordinator.checkpoint(write_all, properties, self._operator.notify)
        self._dropped_unrecorded = False
        self._letters.publish(self._coordinator.last_completed, staged)
        self._report(location, written)
        if self._running and self._requests is not None:  # statekit savepoint trigger: at run's checkpoints
            answer = self._requests.after_checkpoint(location, self._coordinator.last_completed, properties)
            if answer is not None and answer.stopped:
                self._stop_at = answer.location
        return location

    def _counts(self) -> tuple[int, int, int, int, int]:
        """Records, outputs, late records, bad records, timers fired so far in the run under way."""
        r, t = self._result, self._time
        if r is None:
            return (0, 0, t.late_records, 0, t.timers_fired)
        return (r.records, r.outputs, t.late_records, r.bad_records, t.timers_fired)

    def _report(self, location: str, states: list[SubtaskState]) -> None:
        """The completed checkpoint's :class:`CheckpointInfo`: into the run's result, log, callback."""
        checkpoint_id = self._coordinator.last_completed
        now = self._counts()
        records, outputs, late, bad, fired = (a - b for a, b in zip(now, self._counted))
        self._counted = now
        stats = checkpoint_stats(checkpoint_id, states)
        timing = self._coordinator.last_timing  # the phases the history records too (checkpoints/_timing)
        info = CheckpointInfo(
            checkpoint_id, location, records, outputs, late, bad, fired, timing.checkpoint, stats, timing
        )
        if self._result is not None and self._running:
            self._result.checkpoint_infos.append(info)
        if self._metrics:
            fields: dict[str, int | float] = {
                "records_in": records,
                "records_out": outputs,
                "late_records": late,
                "dead_letters": bad,
                "timers_fired": fired,
            }
            fields.update(checkpoint_fields(stats, timing))
            log_checkpoint(self.job_id, self.operator_id, fields)
        if self.on_checkpoint is not None:
            self.on_checkpoint(info)

    def _time_properties(self) -> dict[str, Any]:
        """What a checkpoint's metadata keeps of time (the watermark)."""
        properties = self._time.properties()
        if self._origin is not None:
            properties[ORIGIN_PROPERTY] = self._origin  # the explicit restore the history descends from
        return properties

    def savepoint(self, target_dir: str | None = None) -> str:
        """Take a savepoint now: canonical, self-contained, never deleted by statekit."""
        return self._coordinator.savepoint(self._write_all, self._time_properties(), target_dir)

    @property
    def retained(self) -> int:
        """Completed checkpoints kept (``statekit.checkpoints.retained``)."""
        return self._coordinator.retained

    @property
    def native_checkpoints(self) -> bool:
        """Whether checkpoints are native where the backend has a format of its own."""
        return self._coordinator.native

    @property
    def _fence(self) -> RunFence:
        """This run's fence (for tests that inspect the run's id)."""
        return self._coordinator.fence

    # --- inspection ----------------------------------------------------------------

    @property
    def subtasks(self) -> list[RuntimeContext]:
        """The runtime context of each subtask (its state backends), for inspection."""
        if not self._operator.subtasks:
            self._open()
        return [st.ctx for st in self._operator.subtasks]

    @property
    def position(self) -> Any:
        """The source position after the last processed record."""
        return self._source.position

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
