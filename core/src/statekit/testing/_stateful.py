"""Hypothesis state machines that drive a backend (and a storage) against the model.

Every machine starts a :class:`~statekit.testing._job.Job` on the backend
under test with a random layout and TTL settings, applies random operations to
it and to the model, and after every step checks that the backend holds exactly
what the model holds (read from canonical snapshots, which has no side effects)
and that its ``num_entries``/``keys``/operator state agree. Rule groups are
mixins; :data:`MACHINES` composes them into one machine per named property and
:class:`ConformanceMachine`, which runs them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from .._contracts import SupportsNativeSnapshot
from ..checkpoints._retention import apply_retention
from ..serialization._keygroups import key_group_for_bytes, key_group_range_for_operator
from ..serialization._serializers import StrSerializer
from ..snapshots._snapshot import KeyedStateHandle
from ..state._parameters import DEFAULT_KEY_CACHE_SIZE
from ..state._state import StateKind, StateTtlConfig, TtlUpdateType, TtlVisibility
from ._clock import ManualClock
from ._evolving import EvolutionMachine
from ._job import (
    BackendFactory,
    Job,
    KitNativeOutput,
    NativeCheckpoints,
    StorageFactory,
    check_native_references,
    decode_canonical,
    new_job_id,
    snapshot_handle,
    write_snapshot,
)
from ._model import KEYED_STATE_NAMES, NAMESPACES, KeyedModel, KeyedStateSpec, OperatorModel, purge
from ._properties import (
    AGREES_WITH_MODEL,
    BROADCAST_REDISTRIBUTION,
    CLEAR_SCOPE,
    EVEN_SPLIT_REDISTRIBUTION,
    NATIVE_REFERENCES_COMPLETED,
    RESCALE_KEY_GROUP_OWNERSHIP,
    SAVEPOINT_PORTABILITY,
    SCHEMA_EVOLUTION,
    SNAPSHOT_ISOLATION,
    SNAPSHOT_RESTORE_ROUND_TRIP,
    STORAGE_ROUND_TRIP,
    TTL_NEVER_RETURNS_EXPIRED,
    TTL_UPDATE_TYPE,
    UNION_REDISTRIBUTION,
    PropertyViolation,
    check_keyed,
    check_keyed_counts,
    check_operator,
    check_redistribution,
    check_same_entries,
)
from ._reference import ReferenceStateBackend

__all__ = [
    "MACHINES",
    "ConformanceMachine",
    "ConformanceTarget",
    "MachineConfig",
    "machine_configs",
]

KEYS = ("a", "b", "c", "d", "e", "f", "k1", "k2", "k10", "key-42")
USER_KEYS = ("p", "q", "r")
MAX_PARALLELISMS = (1, 2, 3, 8, 16, 128)

# Skewed towards a few keys and the void namespace, so that reads, merges and clears
# mostly meet entries written earlier; every key and namespace still comes up.
_keys = st.one_of(st.sampled_from(KEYS[:2]), st.sampled_from(KEYS))
_namespaces = st.one_of(st.just(NAMESPACES[0]), st.sampled_from(NAMESPACES))
_ints = st.integers(-3, 9)
_user_keys = st.sampled_from(USER_KEYS)
#: A key no rule writes: handed over with the keys a probe reads (``Job.hand_over``).
_ABSENT_KEY = "key-never-written"


@dataclass(frozen=True)
class ConformanceTarget:
    """What the machines run against.

    Attributes:
        backend_factory: Makes the backend under test.
        backend_name: Its name, in messages.
        other_backends: Further backends that savepoints and rescales move state into, by name.
        storage_factory: Makes the checkpoint storage of a run.
        scratch: A directory under which every keyed backend gets a fresh ``local_dir``.
    """

    backend_factory: BackendFactory
    backend_name: str
    other_backends: Mapping[str, BackendFactory]
    storage_factory: StorageFactory
    scratch: Path

    def backends(self) -> dict[str, BackendFactory]:
        """The backend under test first, then the others, by name."""
        out = {self.backend_name: self.backend_factory}
        for name in sorted(self.other_backends):
            out.setdefault(name, self.other_backends[name])
        return out


@dataclass(frozen=True)
class MachineConfig:
    """The layout and TTL settings a run starts with."""

    max_parallelism: int
    parallelism: int
    ttl: tuple[StateTtlConfig | None, ...]
    key_cache_size: int = DEFAULT_KEY_CACHE_SIZE
    retained: int = 1

    def __repr__(self) -> str:
        """Compact, for counterexamples."""
        ttls = []
        for name, t in zip(KEYED_STATE_NAMES, self.ttl):
            if t is not None:
                flags = [f"{t.ttl_ms}ms", t.update_type.value, t.visibility.value]
                if t.cleanup_full_snapshot:
                    flags.append("cleanup_full_snapshot")
                if t.cleanup_incremental_size:
                    flags.append(f"cleanup_incremental_size={t.cleanup_incremental_size}")
                ttls.append(f"{name}: {' '.join(flags)}")
        return (
            f"MachineConfig(max_parallelism={self.max_parallelism}, parallelism={self.parallelism}, "
            f"ttl={{{', '.join(ttls)}}}, key_cache_size={self.key_cache_size}, retained={self.retained})"
        )

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis prints counterexamples with this."""
        printer.text(repr(self))


@st.composite
def _ttl_config(draw: st.DrawFn, never_return_expired: bool) -> StateTtlConfig:
    never = never_return_expired or draw(st.booleans())
    return StateTtlConfig(
        timedelta(milliseconds=draw(st.sampled_from([1, 10, 50, 100]))),
        update_type=draw(st.sampled_from(list(TtlUpdateType))),
        visibility=TtlVisibility.NEVER_RETURN_EXPIRED
        if never
        else TtlVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP,
        cleanup_full_snapshot=draw(st.booleans()),
        # Incremental cleanup may drop an expired entry at any access; with
        # return_expired_if_not_cleaned_up that makes reads undecidable, so only here.
        cleanup_incremental_size=draw(st.sampled_from([0, 0, 1, 3])) if never else 0,
    )


_TTL_CONFIGS: dict[str, st.SearchStrategy[StateTtlConfig | None]] = {
    "none": st.none(),
    "random": st.one_of(st.none(), _ttl_config(False)),
    "never_return_expired": _ttl_config(True),
}


# 1 ≤ p ≤ maxp. Mostly small layouts (each subtask is a backend, checked after every
# step), but max parallelism itself and uneven splits anywhere in between keep coming up.
_PARALLELISMS: dict[int, st.SearchStrategy[int]] = {
    maxp: st.one_of(
        *[st.integers(1, min(maxp, 4))] * 5,
        *[st.integers(1, min(maxp, 9))] * 2,
        st.just(maxp),
        st.integers(1, maxp),
    )
    for maxp in MAX_PARALLELISMS
}


@st.composite
def _configs(draw: st.DrawFn, ttl_mode: str) -> MachineConfig:
    maxp = draw(st.sampled_from(MAX_PARALLELISMS))
    ttl = _TTL_CONFIGS[ttl_mode]
    return MachineConfig(
        max_parallelism=maxp,
        parallelism=draw(_PARALLELISMS[maxp]),
        ttl=tuple(draw(ttl) for _ in KEYED_STATE_NAMES),
        key_cache_size=draw(st.sampled_from([DEFAULT_KEY_CACHE_SIZE, 1])),
        retained=draw(st.integers(1, 3)),
    )


def machine_configs(ttl_mode: str = "random") -> st.SearchStrategy[MachineConfig]:
    """Random layouts: max parallelism, parallelism, TTL per state, key cache size, retention.

    Args:
        ttl_mode: ``"random"`` (TTL or not per state, any settings), ``"never_return_expired"``
            (TTL on every state, never returning expired entries) or ``"none"``.
    """
    return _configs(ttl_mode)


@dataclass
class _Pending:
    snapshots: list[Any]
    job: Job
    entries: dict[str, dict[Any, Any]]
    now: int
    taken_after: str
    native_checkpoint: int | None = None  # the checkpoint id of native snapshots


@dataclass
class _Saved:
    entries: dict[str, dict[Any, Any]]
    operators: OperatorModel
    now: int
    backend: str
    parallelism: int
    native: bool = False


class _Machine(RuleBasedStateMachine):
    """The base: a job, the model, and the invariant that they agree."""

    keyed_state: ClassVar[bool] = True
    """False: only operator state matters, keyed backends come from the reference backend."""
    visibility_probe: ClassVar[bool] = False
    """True: once time passed or state was restored, read every entry in a restored copy."""
    redistribution_checks: ClassVar[frozenset[str]] = frozenset(
        {EVEN_SPLIT_REDISTRIBUTION, UNION_REDISTRIBUTION, BROADCAST_REDISTRIBUTION}
    )

    def __init__(self, target: ConformanceTarget) -> None:
        """A machine against ``target``; the run starts in :meth:`init`."""
        super().__init__()
        self.target = target
        self.backends = target.backends()
        self.clock = ManualClock()
        self._job: Job | None = None
        self._others: list[Job] = []
        self.pending: list[_Pending] = []
        self.saved: dict[str, _Saved] = {}
        self.checkpoints: list[str] = []
        self._storage: Any = None
        self.job_id = new_job_id()
        self.next_checkpoint = 1
        # Native snapshots taken directly and checkpoints through the storage share one id sequence.
        self.native_checkpoints = NativeCheckpoints(ids=self._checkpoint_ids())
        # A backend may reference every upload of a checkpoint it was told completed, so
        # where checkpoints go through the storage, snapshots written into memory are aborted.
        self.native_checkpoints.confirm_in_memory = not isinstance(self, StorageRules)
        self.last = "the start"
        # What may have changed since the invariant last ran (checking keyed state is the costly part).
        self.keyed_dirty = True
        self.ops_dirty = True
        self.probe_due = False  # entries can only become visible wrongly when time passes or on restores
        self._isolation_writes = 0
        self._operator_marks = 0
        # What names the specific rule a failure broke: the clear() calls since the invariant last
        # ran, and when each TTL entry was last read (a read must not refresh it under OnCreateAndWrite).
        self.clears: list[tuple[str, Any, Any]] = []
        self.ttl_reads: dict[tuple[str, Any, Any], int] = {}

    def _checkpoint_ids(self) -> Iterator[int]:
        while True:
            cid = self.next_checkpoint
            self.next_checkpoint += 1
            yield cid

    # --- set up -----------------------------------------------------------------------------------

    @initialize(config=machine_configs())
    def init(self, config: MachineConfig) -> None:
        """Start a job on the backend under test with ``config``."""
        self._start(config)

    def _start(self, config: MachineConfig) -> None:
        self.config = config
        self.specs = [KeyedStateSpec(StateKind(n), t) for n, t in zip(KEYED_STATE_NAMES, config.ttl)]
        self.model = KeyedModel(self.specs, self.clock)
        self.ops = OperatorModel.empty(config.parallelism)
        job = self._new_job(self.target.backend_name, config.parallelism)
        job.declare_keyed(self.specs)
        job.declare_operator()
        self._job = job
        self.last = f"starting {job}"

    @property
    def job(self) -> Job:
        """The running job."""
        assert self._job is not None
        return self._job

    @property
    def native(self) -> bool:
        """Whether the running job's backend has a native snapshot format."""
        return self._job is not None and isinstance(self._job.subtasks[0].keyed, SupportsNativeSnapshot)

    @property
    def storage(self) -> Any:
        """The run's checkpoint storage, made on first use."""
        if self._storage is None:
            self._storage = self.target.storage_factory()
        return self._storage

    def _new_job(self, backend: str, parallelism: int, *, clock: ManualClock | None = None) -> Job:
        job = Job(
            self.backends[backend](),
            backend_name=backend,
            parallelism=parallelism,
            max_parallelism=self.config.max_parallelism,
            clock=self.clock if clock is None else clock,
            scratch=self.target.scratch,
            key_cache_size=self.config.key_cache_size,
            keyed_backend=None if self.keyed_state else ReferenceStateBackend(),
        )
        job.native_checkpoints = self.native_checkpoints
        self._others.append(job)
        self.keyed_dirty = self.ops_dirty = True
        return job

    def _drop(self, job: Job) -> None:
        if job in self._others:
            self._others.remove(job)
        job.close()

    def _replace(self, new: Job) -> None:
        """Continue on ``new``; pending snapshots of the old job are written and checked first."""
        while self.pending:
            self._verify_pending(self.pending.pop(0))
        old = self.job
        self._job = new
        self.keyed_dirty = self.ops_dirty = self.probe_due = True
        if new in self._others:
            self._others.remove(new)
        old.close()

    def _draw_parallelism(self, data: st.DataObject) -> int:
        return data.draw(_PARALLELISMS[self.config.max_parallelism], label="new parallelism")

    def _mark_range_edges(self, parallelism: int) -> None:
        """Write a value into the first and last key group of every subtask's range, old and new.

        A restore that loses a key group (the plain violation of key-group ownership,
        an off-by-one at a range's end) shows only where there are entries: random
        writes to a few keys leave most key groups empty, the edges never.
        """
        maxp = self.config.max_parallelism
        edges: set[int] = set()
        for p in {self.job.parallelism, parallelism}:
            for i in range(p):
                r = key_group_range_for_operator(maxp, p, i)
                edges.update((r.start, r.end))
        keys = _edge_keys(maxp)
        for kg in sorted(edges):
            key = keys[kg]
            self.job.at(key, NAMESPACES[0], "value").update(kg)
            self.model.value_update(key, NAMESPACES[0], kg)
        self.keyed_dirty = True

    def teardown(self) -> None:
        """Close every job; pending snapshots are released unwritten."""
        for p in self.pending:
            for snap in p.snapshots:
                release = getattr(snap, "release", None)
                if release is not None:
                    release()
        self.pending.clear()
        for job in [*self._others, *([self._job] if self._job else [])]:
            job.close()

    # --- the invariant ------------------------------------------------------------------------------

    @invariant()
    def backend_agrees_with_model(self) -> None:
        """Keyed state (from a canonical snapshot), entry counts, keys and operator state match the model."""
        if self._job is None:
            return
        clears, self.clears = self.clears, []
        if self.keyed_dirty:
            try:
                check_keyed(self.job, self.model, prop=AGREES_WITH_MODEL, context=self.last, skip_empty=True)
            except PropertyViolation as v:
                raise _clear_scope_violation(v, clears) or v from None
            check_keyed_counts(self.job, self.model, prop=AGREES_WITH_MODEL, context=self.last)
            if self.visibility_probe and self.probe_due:
                self._probe_reads()
                self.probe_due = False
        if self.ops_dirty:
            check_operator(self.job, self.ops, prop=AGREES_WITH_MODEL, context=self.last)
        self.keyed_dirty = self.ops_dirty = False

    def _probe_reads(self) -> None:
        """Read every entry, through the handles, in a copy restored from a snapshot taken now.

        Reads of TTL state have side effects (expired entries go, timestamps may be
        refreshed), so they are made on the copy and on a copy of the model: the run
        itself is not disturbed, yet what a read would return is checked after every step.
        """
        job, now = self.job, self.clock()
        # One subtask owning every key group reads the same entries, at a fraction of the cost.
        probe = self._restored_job(job.backend_name, 1, declare_first=True)
        saved_model = self.model
        try:
            self.model = KeyedModel(self.specs, self.clock)
            self.model.restore_from(saved_model.entries, now)
            # The keys ahead of their reads, as a runner hands them over (``_keys_ahead``), with a key
            # that holds nothing: whatever a backend looks up together must read as one by one.
            probe.hand_over(
                [key for name in KEYED_STATE_NAMES for key, _ in self.model.entries[name]] + [_ABSENT_KEY]
            )
            for name in KEYED_STATE_NAMES:
                for key, ns in sorted(self.model.entries[name], key=repr):
                    stored = self.model.entries[name].get((key, ns))
                    got = _READS[name](probe.at(key, ns, name))
                    want = _MODEL_READS[name](self.model, key, ns)
                    _read_check(
                        self, name, key, ns, f"{_READ_NAMES[name]} (in a restored copy)", got, want, stored
                    )
        finally:
            self.model = saved_model
            self._drop(probe)

    # --- helpers of the restore rules -------------------------------------------------------------

    def _verify_pending(self, p: _Pending) -> None:
        if p.native_checkpoint is None:
            decoded = [
                decode_canonical(write_snapshot(s, st.keyed)) for s, st in zip(p.snapshots, p.job.subtasks)
            ]
        else:
            decoded = self._decode_native(p)
        check_keyed(
            p.job,
            self.model,
            prop=SNAPSHOT_ISOLATION,
            context=f"writing the snapshot taken at t={p.now} (after {p.taken_after}) after later writes",
            decoded=decoded,
            expected=self.model.snapshot_view(p.entries, p.now),
            now=p.now,
        )

    def _decode_native(self, p: _Pending) -> list[Any]:
        """Write pending native snapshots, settle their checkpoint, restore them in a new job: its state."""
        cid = p.native_checkpoint
        assert cid is not None
        handles = []
        for snap, sub in zip(p.snapshots, p.job.subtasks):
            h = snap.write(KitNativeOutput(cid))
            check_native_references(h, self.native_checkpoints.completed, f"{p.job} subtask {sub.index}")
            handles.append(h)
        p.job.settle_native(cid, "complete" if self.native_checkpoints.confirm_in_memory else "abort")
        # Read back as of the time it was taken: decoding re-snapshots the restored state, and a
        # full-snapshot TTL cleanup at the current time would drop entries that expired since.
        new = self._new_job(p.job.backend_name, p.job.parallelism, clock=ManualClock(p.now))
        try:
            new.restore_from(
                handles, p.job.operator_snapshots(), self.specs, declare_first=False, native=True
            )
            return new.decoded()
        finally:
            self._drop(new)
            self.keyed_dirty = self.ops_dirty = True

    def _compact_union(self) -> None:
        """Each subtask keeps every p-th element of its union list, so union state does not grow."""
        p = self.job.parallelism
        for subtask in self.job.subtasks:
            kept = subtask.union.get()[subtask.index :: p]
            subtask.union.update(kept)
            self.ops.union[subtask.index] = kept
        self.ops_dirty = True

    def _restored_job(
        self,
        backend: str,
        parallelism: int,
        *,
        declare_first: bool,
        native: bool = False,
        location: str | None = None,
        keyed: Sequence[KeyedStateHandle] | None = None,
        claim: bool = False,
    ) -> Job:
        """A new job restored from the current one (directly) or from ``location`` (through the storage).

        ``keyed``: the current job's keyed snapshots, when the caller took them already. ``claim``
        (native snapshots of a confirmed checkpoint): the new job is then told that checkpoint
        completed, as a runner claims the checkpoint it restores, so its backends may reference the
        restored files (at the same parallelism or, rescaled, the parts they hold).
        """
        new = self._new_job(backend, parallelism)
        try:
            if location is not None:
                new.restore_checkpoint(self.storage, location, self.specs, declare_first=declare_first)
            else:
                handles = self.job.keyed_handles(native=native) if keyed is None else keyed
                new.restore_from(
                    handles,
                    self.job.operator_snapshots(),
                    self.specs,
                    declare_first=declare_first,
                    native=native,
                )
                restored = {int(getattr(h, "checkpoint_id", -1)) for h in handles} if native else set()
                if claim and len(restored) == 1 and restored <= self.native_checkpoints.completed:
                    new.settle_native(restored.pop(), "complete")
        except BaseException:
            self._drop(new)
            raise
        return new


_EDGE_KEYS: dict[int, list[str]] = {}


def _model_write(m: Any, name: str, key: Any, ns: Any, value: int) -> None:
    """The model's side of writing ``value`` into state ``name`` (as each kind's write rule does)."""
    if name == "value":
        m.value_update(key, ns, value)
    elif name == "list":
        m.list_add_all(key, ns, [value])
    elif name == "reducing":
        m.reducing_add(key, ns, value)
    elif name == "aggregating":
        m.aggregating_add(key, ns, value)
    else:
        m.map_put_all(key, ns, {"p": value})


def flush_write_buffers(job: Job) -> None:
    """Write every subtask's buffered updates to its engine (backends on ``OrderedKVBackendBase``).

    Where an invariant is about what the engine holds (a snapshot reading the live
    state, a read rewriting a timestamp), a buffer the engine has not seen yet hides
    its violation; the rules that set such a stage flush first.
    """
    for subtask in job.subtasks:
        flush = getattr(subtask.keyed, "kv_write_buffered", None)
        if flush is not None:
            flush()


def _edge_keys(max_parallelism: int) -> list[str]:
    """A ``str`` key of every key group of ``max_parallelism`` (the kit's key serializer), by key group."""
    found = _EDGE_KEYS.get(max_parallelism)
    if found is None:
        ser = StrSerializer()
        by_group: dict[int, str] = {}
        i = 0
        while len(by_group) < max_parallelism:
            key = f"kg-{i}"
            by_group.setdefault(key_group_for_bytes(ser.serialize(key), max_parallelism), key)
            i += 1
        found = _EDGE_KEYS[max_parallelism] = [by_group[kg] for kg in range(max_parallelism)]
    return found


_READ_NAMES = {
    "value": "value()",
    "list": "get()",
    "reducing": "get()",
    "aggregating": "get()",
    "map": "items()",
}
_READS: dict[str, Callable[[Any], Any]] = {
    "value": lambda h: h.value(),
    "list": lambda h: h.get(),
    "reducing": lambda h: h.get(),
    "aggregating": lambda h: h.get(),
    "map": lambda h: dict(h.items()),
}
_MODEL_READS: dict[str, Callable[[KeyedModel, Any, Any], Any]] = {
    "value": KeyedModel.value_get,
    "list": KeyedModel.list_get,
    "reducing": KeyedModel.reducing_get,
    "aggregating": KeyedModel.aggregating_get,
    "map": KeyedModel.map_items,
}


def _clear_scope_violation(
    v: PropertyViolation, clears: list[tuple[str, Any, Any]]
) -> PropertyViolation | None:
    """``v`` named as the clear-scope rule, when a clear() since the last check explains what was lost.

    A clear() of state ``s`` at key ``k``, namespace ``n`` may remove that entry only; entries
    of ``s`` lost elsewhere, under ``k`` in another namespace or under another key in ``n``,
    are the clear's doing.
    """
    if v.property != AGREES_WITH_MODEL or not clears:
        return None
    wide = [
        (name, key, ns)
        for name, key, ns in v.lost
        for c_name, c_key, c_ns in clears
        if name == c_name and (key, ns) != (c_key, c_ns) and (key == c_key or ns == c_ns)
    ]
    if not wide:
        return None
    c = ", ".join(f"{n!r} at key {k!r}, namespace {ns!r}" for n, k, ns in clears)
    lost = ", ".join(f"{n!r} at key {k!r}, namespace {ns!r}" for n, k, ns in wide[:8])
    out = PropertyViolation(
        AGREES_WITH_MODEL,
        f"clear() of {c} also removed {lost}\n{str(v).split(chr(10), 1)[1]}",
        rule=CLEAR_SCOPE,
    )
    out.lost = v.lost
    return out


def _held_by_backend(job: Job, name: str, key: Any, ns: Any) -> Any:
    """The stored form (TTL timestamps included) of one entry, from a canonical snapshot of its owner."""
    for e in decode_canonical(snapshot_handle(job.owner(key).keyed)):
        if e.state == name and e.key == key and e.namespace == ns:
            return e.stored
    return None


def _timestamps(stored: Any) -> set[int]:
    """The TTL timestamps in a stored TTL entry: ``(value, ts)``, a list of them, or a dict of them."""
    if isinstance(stored, tuple) and len(stored) == 2 and isinstance(stored[1], int):
        return {stored[1]}
    if isinstance(stored, list):
        return {t for x in stored for t in _timestamps(x)}
    if isinstance(stored, dict):
        return {t for x in stored.values() for t in _timestamps(x)}
    return set()


def _read_check(
    machine: _Machine, name: str, key: Any, ns: Any, what: str, got: Any, want: Any, stored: Any
) -> None:
    """Compare a read's result with the model's; name the TTL property (and rule) for expired entries."""
    if got == want:
        return
    spec = machine.model.specs[name]
    now = machine.clock()
    where = f"{what} of state {name!r} at key {key!r}, namespace {ns!r}, t={now}"
    expired = spec.ttl is not None and stored is not None and purge(spec, stored, now) != stored
    if expired and not spec.return_expired:
        read_at = machine.ttl_reads.get((name, key, ns))
        written = max(_timestamps(stored), default=None)
        if not spec.refresh_on_read and read_at is not None and written is not None:
            held = _held_by_backend(machine.job, name, key, ns)
            later = sorted(t for t in _timestamps(held) if t > written)
            if later:  # no write since `written`: only reads could have moved the timestamp
                raise PropertyViolation(
                    TTL_NEVER_RETURNS_EXPIRED,
                    f"{where} returned {got!r}, expected {want!r}: the entry was last written at "
                    f"t={written} ({stored!r}) and expired under a TTL of {spec.ttl_ms} ms, but the "
                    f"backend holds it with timestamp {later[-1]} ({held!r}): a read (the last at "
                    f"t={read_at}) refreshed it, which only writes may under OnCreateAndWrite",
                    rule=TTL_UPDATE_TYPE,
                )
        raise PropertyViolation(
            TTL_NEVER_RETURNS_EXPIRED,
            f"{where} returned {got!r}, expected {want!r}: the entry is {stored!r} and the TTL is "
            f"{spec.ttl_ms} ms, so whatever was last written at or before t={now - spec.ttl_ms} is expired",
        )
    raise PropertyViolation(AGREES_WITH_MODEL, f"{where} returned {got!r}, the model says {want!r}")


class KeyedRules(_Machine):
    """Writes and reads of the five keyed state kinds, in several keys and namespaces."""

    def _read(
        self, name: str, key: Any, ns: Any, what: str, backend: Callable[[Any], Any], model: Callable[[], Any]
    ) -> None:
        if self.model.specs[name].ttl is not None:
            self.keyed_dirty = True  # reads of TTL state change it
        stored = self.model.entries[name].get((key, ns))
        got = backend(self.job.at(key, ns, name))
        want = model()
        self.last = f"{what} of {name!r} at key {key!r}, namespace {ns!r}"
        _read_check(self, name, key, ns, what, got, want, stored)
        if self.model.specs[name].ttl is not None:
            self.ttl_reads[(name, key, ns)] = self.clock()

    def _write(
        self, name: str, key: Any, ns: Any, what: str, backend: Callable[[Any], Any], model: Callable[[], Any]
    ) -> None:
        self.keyed_dirty = True
        backend(self.job.at(key, ns, name))
        model()
        self.last = f"{what} of {name!r} at key {key!r}, namespace {ns!r}"

    @rule(key=_keys, namespace=_namespaces, value=st.none() | _ints)
    def value_update(self, key: Any, namespace: Any, value: int | None) -> None:
        """``ValueState.update(value)`` (None clears)."""
        self._write("value", key, namespace, f"update({value!r})", lambda h: h.update(value),
                    lambda: self.model.value_update(key, namespace, value))  # fmt: skip

    @rule(key=_keys, namespace=_namespaces)
    def value_read(self, key: Any, namespace: Any) -> None:
        """``ValueState.value()``."""
        self._read("value", key, namespace, "value()", lambda h: h.value(),
                   lambda: self.model.value_get(key, namespace))  # fmt: skip

    @rule(key=_keys, namespace=_namespaces, value=_ints)
    def list_add(self, key: Any, namespace: Any, value: int) -> None:
        """``ListState.add(value)``."""
        self._write("list", key, namespace, f"add({value!r})", lambda h: h.add(value),
                    lambda: self.model.list_add_all(key, namespace, [value]))  # fmt: skip

    @rule(key=_keys, namespace=_namespaces, values=st.lists(_ints, max_size=3))
    def list_add_all(self, key: Any, namespace: Any, values: list[int]) -> None:
        """``ListState.add_all(values)``."""
        self._write("list", key, namespace, f"add_all({values!r})", lambda h: h.add_all(values),
                    lambda: self.model.list_add_all(key, namespace, values))  # fmt: skip

    @rule(key=_keys, namespace=_namespaces, values=st.lists(_ints, max_size=3))
    def list_update(self, key: Any, namespace: Any, values: list[int]) -> None:
        """``ListState.update(values)`` (empty clears)."""
        self._write("list", key, namespace, f"update({values!r})", lambda h: h.update(values),
                    lambda: self.model.list_update(key, namespace, values))  # fmt: skip

    @rule(key=_keys, namespace=_namespaces)
    def list_read(self, key: Any, namespace: Any) -> None:
        """``ListState.get()``."""
        self._read("list", key, namespace, "get()", lambda h: h.get(),
                   lambda: self.model.list_get(key, namespace))  # fmt: skip

    @rule(key=_keys, namespace=_namespaces, value=_ints)
    def reducing_add(self, key: Any, namespace: Any, value: int) -> None:
        """``ReducingState.add(value)`` (a sum)."""
        self._write("reducing", key, namespace, f"add({value!r})", lambda h: h.add(value),
                    lambda: self.model.reducing_add(key, namespace, value))  # fmt: skip

    @rule(key=_keys, namespace=_namespaces)
    def reducing_read(self, key: Any, namespace: Any) -> None:
        """``ReducingState.get()``."""
        self._read("reducing", key, namespace, "get()", lambda h: h.get(),
                   lambda: self.model.reducing_get(key, namespace))  # fmt: skip

    @rule(key=_keys, namespace=_namespaces, value=_ints)
    def aggregating_add(self, key: Any, namespace: Any, value: int) -> None:
        """``AggregatingState.add(value)`` (sum and count, accumulated in place)."""
        self._write("aggregating", key, namespace, f"add({value!r})", lambda h: h.add(value),
                    lambda: self.model.aggregating_add(key, namespace, value))  # fmt: skip

    @rule(key=_keys, namespace=_namespaces)
    def aggregating_read(self, key: Any, namespace: Any) -> None:
        """``AggregatingState.get()``."""
        self._read("aggregating", key, namespace, "get()", lambda h: h.get(),
                   lambda: self.model.aggregating_get(key, namespace))  # fmt: skip

    @rule(key=_keys, namespace=_namespaces, user_key=_user_keys, value=st.none() | _ints)
    def map_put(self, key: Any, namespace: Any, user_key: str, value: int | None) -> None:
        """``MapState.put(user_key, value)`` (None is a value)."""
        self._write("map", key, namespace, f"put({user_key!r}, {value!r})", lambda h: h.put(user_key, value),
                    lambda: self.model.map_put_all(key, namespace, {user_key: value}))  # fmt: skip

    @rule(
        key=_keys, namespace=_namespaces, entries=st.dictionaries(_user_keys, st.none() | _ints, max_size=2)
    )
    def map_put_all(self, key: Any, namespace: Any, entries: dict[str, int | None]) -> None:
        """``MapState.put_all(entries)``."""
        self._write("map", key, namespace, f"put_all({entries!r})", lambda h: h.put_all(entries),
                    lambda: self.model.map_put_all(key, namespace, entries))  # fmt: skip

    @rule(key=_keys, namespace=_namespaces, user_key=_user_keys)
    def map_remove(self, key: Any, namespace: Any, user_key: str) -> None:
        """``MapState.remove(user_key)``."""
        self._write("map", key, namespace, f"remove({user_key!r})", lambda h: h.remove(user_key),
                    lambda: self.model.map_remove(key, namespace, user_key))  # fmt: skip

    @rule(key=_keys, namespace=_namespaces, user_key=_user_keys)
    def map_get(self, key: Any, namespace: Any, user_key: str) -> None:
        """``MapState.get(user_key)``."""
        self._read("map", key, namespace, f"get({user_key!r})", lambda h: h.get(user_key),
                   lambda: self.model.map_get(key, namespace, user_key))  # fmt: skip

    @rule(key=_keys, namespace=_namespaces, user_key=_user_keys)
    def map_contains(self, key: Any, namespace: Any, user_key: str) -> None:
        """``MapState.contains(user_key)``."""
        self._read("map", key, namespace, f"contains({user_key!r})", lambda h: h.contains(user_key),
                   lambda: self.model.map_contains(key, namespace, user_key))  # fmt: skip

    @rule(key=_keys, namespace=_namespaces, view=st.sampled_from(["items", "keys", "values", "is_empty"]))
    def map_iterate(self, key: Any, namespace: Any, view: str) -> None:
        """``MapState.items()``, ``keys()``, ``values()`` or ``is_empty()``."""

        def backend(h: Any) -> Any:
            if view == "is_empty":
                return h.is_empty()
            got = list(getattr(h, view)())
            return dict(got) if view == "items" else sorted(got, key=repr)

        def model() -> Any:
            if view == "is_empty":
                return self.model.map_is_empty(key, namespace)
            m = self.model.map_items(key, namespace)
            return m if view == "items" else sorted(m if view == "keys" else m.values(), key=repr)

        self._read("map", key, namespace, f"{view}()", backend, model)

    @rule(name=st.sampled_from(KEYED_STATE_NAMES))
    def read_everything(self, name: str) -> None:
        """Read every entry the model holds of state ``name`` (value(), get() or items())."""
        for key, ns in sorted(self.model.entries[name], key=repr):

            def model(key: Any = key, ns: Any = ns) -> Any:
                return _MODEL_READS[name](self.model, key, ns)

            self._read(name, key, ns, _READ_NAMES[name], _READS[name], model)

    @rule(name=st.sampled_from(KEYED_STATE_NAMES), key=_keys, namespace=_namespaces)
    def clear(self, name: str, key: Any, namespace: Any) -> None:
        """``clear()``: the current key and namespace only."""
        self._write(name, key, namespace, "clear()", lambda h: h.clear(),
                    lambda: self.model.clear(name, key, namespace))  # fmt: skip
        self.clears.append((name, key, namespace))

    @rule(
        name=st.sampled_from(["list", "reducing", "aggregating"]),
        key=_keys,
        current=_namespaces,
        into=_namespaces,
        sources=st.lists(_namespaces, max_size=3),
    )
    def merge_namespaces(self, name: str, key: Any, current: Any, into: Any, sources: list[Any]) -> None:
        """``merge_namespaces(into, sources)`` with ``current`` as the current namespace."""
        self._write(name, key, current, f"merge_namespaces({into!r}, {sources!r})",
                    lambda h: h.merge_namespaces(into, sources),
                    lambda: self.model.merge(name, key, into, sources))  # fmt: skip


class ClearScopeRules(KeyedRules):
    """The scope of ``clear()``, in one rule: for the full machine only.

    Kept out of the property machines on purpose: a rule of their own changes
    the (derandomized) steps each property takes at the ``ci`` profile, which
    must keep reaching the violation it is named for.
    """

    @rule(key=_keys, value=_ints)
    def clear_one_namespace_of_two(self, key: Any, value: int) -> None:
        """Write every state at ``key`` in two namespaces, clear each in one: the other keeps its entry.

        The plain violation of clear's scope (a clear of the key's entries in every
        namespace, or of every key in the namespace) fails here whenever the rule
        runs, not only when random steps happen to fill two namespaces first.
        """
        m, kept, cleared = self.model, NAMESPACES[1], NAMESPACES[0]
        writes: dict[str, Callable[[Any], Any]] = {
            "value": lambda h: h.update(value),
            "list": lambda h: h.add(value),
            "reducing": lambda h: h.add(value),
            "aggregating": lambda h: h.add(value),
            "map": lambda h: h.put("p", value),
        }
        other = next(k for k in KEYS if k != key)  # the same namespace under another key stays too
        for name in KEYED_STATE_NAMES:
            for k, ns in ((key, kept), (key, cleared), (other, cleared)):

                def model(n: str = name, k: Any = k, ns: Any = ns) -> None:
                    _model_write(m, n, k, ns, value)

                self._write(name, k, ns, "a write", writes[name], model)
        for name in KEYED_STATE_NAMES:
            self.clear(name, key, cleared)
        self.last = (
            f"a write of every state at key {key!r} in namespaces {cleared!r} and {kept!r} (and at "
            f"{other!r}), then clear() of each in {cleared!r}"
        )


class ClockRules(_Machine):
    """Processing time moves on."""

    # Just below, at and past the TTLs in use (1, 10, 50, 100 ms): expiry is ts + ttl <= now.
    @rule(ms=st.sampled_from([0, 1, 9, 10, 49, 50, 99, 100, 120]))
    def advance_clock(self, ms: int) -> None:
        """Move the clock by ``ms`` milliseconds."""
        self.clock.advance(ms)
        if any(spec.ttl is not None for spec in self.specs):
            self.keyed_dirty = self.probe_due = True  # what is expired changed
        self.last = f"advancing the clock by {ms} ms to t={self.clock.now}"


class OperatorRules(_Machine):
    """Writes of operator state in its three modes."""

    def _subtask(self, data: st.DataObject) -> int:
        self.ops_dirty = True
        return data.draw(st.integers(0, self.job.parallelism - 1), label="subtask")

    @rule(data=st.data(), value=_ints)
    def split_add(self, data: st.DataObject, value: int) -> None:
        """Append to one subtask's even-split list."""
        i = self._subtask(data)
        self.job.subtasks[i].split.add(value)
        self.ops.split[i].append(value)
        self.last = f"add({value}) to the even-split list of subtask {i}"

    @rule(data=st.data(), values=st.lists(_ints, max_size=4))
    def split_update(self, data: st.DataObject, values: list[int]) -> None:
        """Replace one subtask's even-split list."""
        i = self._subtask(data)
        self.job.subtasks[i].split.update(values)
        self.ops.split[i] = list(values)
        self.last = f"update({values}) of the even-split list of subtask {i}"

    @rule(data=st.data(), value=_ints)
    def union_add(self, data: st.DataObject, value: int) -> None:
        """Append to one subtask's union list."""
        i = self._subtask(data)
        self.job.subtasks[i].union.add(value)
        self.ops.union[i].append(value)
        self.last = f"add({value}) to the union list of subtask {i}"

    @rule(user_key=_user_keys, value=_ints)
    def broadcast_put(self, user_key: str, value: int) -> None:
        """Put one entry into the broadcast map of every subtask (as broadcast state is used)."""
        self.ops_dirty = True
        for st_ in self.job.subtasks:
            st_.broadcast.put(user_key, value)
        for m in self.ops.broadcast:
            m[user_key] = value
        self.last = f"put({user_key!r}, {value}) into every broadcast map"

    @rule(user_key=_user_keys)
    def broadcast_remove(self, user_key: str) -> None:
        """Remove one entry from the broadcast map of every subtask."""
        self.ops_dirty = True
        for st_ in self.job.subtasks:
            st_.broadcast.remove(user_key)
        for m in self.ops.broadcast:
            m.pop(user_key, None)
        self.last = f"remove({user_key!r}) from every broadcast map"


class RoundTripRules(_Machine):
    """Snapshot every subtask and restore into a new job of the same backend and layout."""

    def _round_trip(self, *, native: bool, declare_first: bool, claim: bool = False) -> None:
        self._mark_range_edges(self.job.parallelism)
        job, now = self.job, self.clock()
        handles = job.keyed_handles(native=native)
        # Canonical snapshots are both what is restored and what the restored job is compared with.
        before = job.decoded() if native else [decode_canonical(h) for h in handles]
        new = self._restored_job(
            job.backend_name,
            job.parallelism,
            declare_first=declare_first,
            native=native,
            keyed=handles,
            claim=claim,
        )
        kind = "native" if native else "canonical"
        try:
            check_same_entries(
                before,
                new.decoded(),
                prop=SNAPSHOT_RESTORE_ROUND_TRIP,
                context=f"restoring a {kind} snapshot of {job} into a new {job}",
            )
        except BaseException:
            self._drop(new)
            raise
        self.model.restore_from(self.model.entries, now)
        self.ops = self.ops.redistributed(new.parallelism)  # even-split lists are re-split at any restore
        self._replace(new)
        self._compact_union()
        self.last = f"a {kind} snapshot and restore of {job}"

    @rule(declare_first=st.booleans())
    def canonical_round_trip(self, declare_first: bool) -> None:
        """restore(snapshot(s)) in the canonical format; states declared before or after the restore."""
        self._round_trip(native=False, declare_first=declare_first)

    @precondition(lambda self: self.native)
    @rule(declare_first=st.booleans())
    def native_round_trip(self, declare_first: bool) -> None:
        """restore_native(native_snapshot(s)), for backends with a native format.

        Claimed (as a runner restoring its own checkpoint) at odd parallelisms: chosen
        without a draw of its own, so the kit explores the same programs as before.
        """
        claim = self.job.parallelism % 2 == 1
        self._round_trip(native=True, declare_first=declare_first, claim=claim)

    @precondition(lambda self: self.native)
    @rule(outcome=st.sampled_from(["abort", "lost"]))
    def native_checkpoint_fails(self, outcome: str) -> None:
        """A native checkpoint that never completes (aborted, or its completion never arrives), then the next.

        Its uploads are deleted at once; a later snapshot that references them
        breaks :data:`NATIVE_REFERENCES_COMPLETED` (and its restore would fail).
        The next checkpoint is taken at once, of the same state: the plain
        violation (re-referencing what the failed one uploaded) fails here.
        """
        job = self.job
        cid = self.native_checkpoints.next_id()
        for sub in job.subtasks:
            keyed = sub.keyed
            assert isinstance(keyed, SupportsNativeSnapshot)
            out = KitNativeOutput(cid)
            handle = keyed.native_snapshot(cid).write(out)
            check_native_references(handle, self.native_checkpoints.completed, f"{job} subtask {sub.index}")
            out.delete_all()
        job.settle_native(cid, outcome)
        if isinstance(self, StorageRules):
            self._checkpoint()
        else:
            job.keyed_handles(native=True)  # checks its references, then settles it
        self.last = (
            f"native checkpoint {cid} of {job}, {'aborted' if outcome == 'abort' else 'never confirmed'}"
        )


class RescaleRules(_Machine):
    """Restore at a random parallelism, possibly into another backend."""

    @rule(data=st.data(), declare_first=st.booleans())
    def rescale(self, data: st.DataObject, declare_first: bool) -> None:
        """Snapshot, then restore into ``p'`` new subtasks (1 ≤ p' ≤ max parallelism)."""
        old, now, old_ops = self.job, self.clock(), self.ops
        maxp = self.config.max_parallelism
        if maxp > 1:  # another parallelism: restoring the same layout is the round trip's
            p = data.draw(_PARALLELISMS[maxp].filter(lambda n: n != old.parallelism), label="new parallelism")
        else:
            p = 1
        if self.keyed_state:
            self._mark_range_edges(p)
        self._mark_operator_state()
        backend = data.draw(st.sampled_from(list(self.backends)), label="into backend")
        native = self.native and backend == old.backend_name and data.draw(st.booleans(), label="native")
        # Claimed (as a runner restoring its own checkpoint) between an odd and an even parallelism,
        # where new subtasks hold parts of two old ones (3 -> 2, 2 -> 3): chosen without a draw of its
        # own, so the kit explores the same programs as before.
        claim = native and (p + old.parallelism) % 2 == 1
        new = self._restored_job(backend, p, declare_first=declare_first, native=native, claim=claim)
        kind = "claimed native" if claim else "native" if native else "canonical"
        context = (
            f"rescaling {old} to p={p} on {backend!r} ({kind} snapshots, states declared "
            f"{'before' if declare_first else 'after'} the restore)"
        )
        try:
            self.model.restore_from(self.model.entries, now)
            check_keyed(new, self.model, prop=RESCALE_KEY_GROUP_OWNERSHIP, context=context)
            check_redistribution(new, old_ops, context=context, checks=self.redistribution_checks)
        except BaseException:
            self._drop(new)
            raise
        self.ops = old_ops.redistributed(p)
        self._replace(new)
        self._compact_union()
        self.last = context

    @rule(data=st.data(), declare_first=st.booleans())
    def rescale_twice(self, data: st.DataObject, declare_first: bool) -> None:
        """Two rescales in a row (p to p' to p''): the second restores snapshots of a rescaled job."""
        self.rescale(data, declare_first)
        self.rescale(data, declare_first)

    def _mark_operator_state(self) -> None:
        """Add two distinct elements to every subtask's lists and two entries to the broadcast maps.

        Reordered, split or dropped elements show only in lists of two elements or
        more, a broadcast map that keeps one entry only in maps of two.
        """
        self._operator_marks += 2
        a, b = 1000 + self._operator_marks, 1001 + self._operator_marks
        for sub in self.job.subtasks:
            sub.split.add_all([a, b])
            self.ops.split[sub.index].extend([a, b])
            sub.union.add(a)
            self.ops.union[sub.index].append(a)
            sub.broadcast.put_all({"edge-a": a, "edge-b": b})
        for m in self.ops.broadcast:
            m.update({"edge-a": a, "edge-b": b})
        self.ops_dirty = True


class PortabilityRules(_Machine):
    """A savepoint restores into every backend."""

    @rule(data=st.data(), declare_first=st.booleans())
    def savepoint_into_every_backend(self, data: st.DataObject, declare_first: bool) -> None:
        """Take a savepoint through the storage; restore it into each backend at ``p'``; compare."""
        job, now = self.job, self.clock()
        p = self._draw_parallelism(data)
        location = job.write_checkpoint(self.storage, self.job_id, self.next_checkpoint - 1, savepoint=True)
        expected = self.model.snapshot_view(self.model.entries, now)
        self.saved[location] = _Saved(
            self.model.copy_entries(), self.ops.copy(), now, job.backend_name, job.parallelism
        )
        for backend in self.backends:
            context = f"restoring a savepoint of {job} into {backend!r} at p={p}"
            new = self._restored_job(backend, p, declare_first=declare_first, location=location)
            try:
                check_keyed(
                    new, self.model, prop=SAVEPOINT_PORTABILITY, context=context, expected=expected, now=now
                )
                check_operator(new, self.ops.redistributed(p), prop=SAVEPOINT_PORTABILITY, context=context)
            finally:
                self._drop(new)
        self.last = f"a savepoint of {job} restored into {sorted(self.backends)} at p={p}"


class StorageRules(_Machine):
    """Checkpoints and savepoints through the storage; restores of the newest and of older ones."""

    @rule(data=st.data(), savepoint=st.booleans(), declare_first=st.booleans())
    def checkpoint_and_restore(self, data: st.DataObject, savepoint: bool, declare_first: bool) -> None:
        """Write a checkpoint (or savepoint), apply retention, restore it at ``p'``."""
        if savepoint:
            job, now = self.job, self.clock()
            cid = self.next_checkpoint - 1
            location = job.write_checkpoint(self.storage, self.job_id, cid, savepoint=True)
            self.saved[location] = _Saved(
                self.model.copy_entries(), self.ops.copy(), now, job.backend_name, job.parallelism
            )
        else:
            location = self._checkpoint()
        self._restore_saved(data, location, declare_first)

    @rule()
    def two_checkpoints(self) -> None:
        """Two checkpoints in a row: listed oldest first, until retention drops the older one."""
        first = self._checkpoint()
        second = self._checkpoint()
        self.last = f"checkpoints {first} and {second} of {self.job}"

    def _checkpoint(self) -> str:
        """Write the next checkpoint, check the listing, apply retention, check it again."""
        job, now, storage = self.job, self.clock(), self.storage
        location = job.write_checkpoint(storage, self.job_id, self.next_checkpoint, savepoint=False)
        self.saved[location] = _Saved(
            self.model.copy_entries(),
            self.ops.copy(),
            now,
            job.backend_name,
            job.parallelism,
            native=job.native,
        )
        self.next_checkpoint += 1
        self.checkpoints.append(location)
        self._check_listing(f"completing {location}", location)
        dropped = apply_retention(storage, self.job_id, self.config.retained)
        for loc in dropped:
            self.checkpoints.remove(loc)
            del self.saved[loc]
        self._check_listing(f"completing {location} and retaining {self.config.retained}", location)
        return location

    def _check_listing(self, context: str, latest: str) -> None:
        storage = self.storage
        listed = storage.list_checkpoints(self.job_id)
        if listed != self.checkpoints or storage.latest_checkpoint(self.job_id) != latest:
            raise PropertyViolation(
                STORAGE_ROUND_TRIP,
                f"after {context}: the storage lists {listed} (latest "
                f"{storage.latest_checkpoint(self.job_id)!r}), expected {self.checkpoints} (oldest first)",
            )

    @precondition(lambda self: bool(self.saved))
    @rule(data=st.data(), declare_first=st.booleans())
    def restore_older(self, data: st.DataObject, declare_first: bool) -> None:
        """Restore a retained checkpoint or a savepoint taken earlier."""
        location = data.draw(st.sampled_from(sorted(self.saved)), label="location")
        self._restore_saved(data, location, declare_first)

    def _restore_saved(self, data: st.DataObject, location: str, declare_first: bool) -> None:
        saved = self.saved[location]
        p = self._draw_parallelism(data)
        # A native checkpoint restores only into the backend that wrote it.
        backend = (
            saved.backend
            if saved.native
            else data.draw(st.sampled_from(list(self.backends)), label="into backend")
        )
        taken = f"taken of {saved.backend} at p={saved.parallelism}"
        context = f"restoring {location} ({taken}) into {backend!r} at p={p}"
        new = self._restored_job(backend, p, declare_first=declare_first, location=location)
        try:
            self.model.restore_from(saved.entries, saved.now)
            self.ops = saved.operators.redistributed(p)
            check_keyed(new, self.model, prop=STORAGE_ROUND_TRIP, context=context)
            check_operator(new, self.ops, prop=STORAGE_ROUND_TRIP, context=context)
        except BaseException:
            self._drop(new)
            raise
        self._replace(new)
        self._compact_union()
        self.last = context


class IsolationRules(_Machine):
    """Snapshots taken now and written later, after more writes."""

    @precondition(lambda self: len(self.pending) < 3)
    @rule(data=st.data())
    def take_snapshot(self, data: st.DataObject) -> None:
        """Snapshot every subtask now (natively too, where the backend can); written by a later step."""
        job = self.job
        cid = None
        if self.native and data.draw(st.booleans(), label="native"):
            cid = self.native_checkpoints.next_id()
            snaps = [st.keyed.native_snapshot(cid) for st in job.subtasks]  # type: ignore[attr-defined]
        else:
            snaps = [st.keyed.snapshot() for st in job.subtasks]
        self.pending.append(_Pending(snaps, job, self.model.copy_entries(), self.clock(), self.last, cid))
        kind = "canonical" if cid is None else f"native (checkpoint {cid})"
        self.last = f"taking {kind} snapshot #{len(self.pending)} of {job}"

    @precondition(lambda self: len(self.pending) < 3)
    @rule(data=st.data(), key=_keys)
    def write_right_after_snapshot(self, data: st.DataObject, key: Any) -> None:
        """Take a snapshot, change a value at once, then write the snapshot: the change must not show.

        The plain violation of isolation (a snapshot that reads the live state when
        it is written) fails here whenever the rule runs, not only when random steps
        happen to write between taking a snapshot and writing it.
        """
        self.take_snapshot(data)
        self._isolation_writes += 1
        value = 1000 + self._isolation_writes  # never stored before: the write always changes the state
        self.job.at(key, NAMESPACES[0], "value").update(value)
        self.model.value_update(key, NAMESPACES[0], value)
        self.keyed_dirty = True
        flush_write_buffers(self.job)  # the write reaches the engine, whatever the buffer holds
        self._verify_pending(self.pending.pop())
        self.last = f"a snapshot, then update({value}) of 'value' at key {key!r}, then writing the snapshot"

    @precondition(lambda self: bool(self.pending))
    @rule(data=st.data())
    def write_snapshot(self, data: st.DataObject) -> None:
        """Write one of the pending snapshots and check it holds the state of its time."""
        i = data.draw(st.integers(0, len(self.pending) - 1), label="pending snapshot")
        self._verify_pending(self.pending.pop(i))
        self.last = "writing a pending snapshot"


# --- the machines -------------------------------------------------------------------------------


class ConformanceMachine(
    ClearScopeRules,
    ClockRules,
    OperatorRules,
    RoundTripRules,
    RescaleRules,
    PortabilityRules,
    StorageRules,
    IsolationRules,
):
    """Every rule: keyed and operator state, TTL, snapshots, rescales, storages, savepoints."""

    visibility_probe = True


class RoundTripMachine(KeyedRules, ClockRules, OperatorRules, RoundTripRules):
    """restore(snapshot(s)) == s."""


class RescaleMachine(KeyedRules, ClockRules, RescaleRules):
    """Key groups after rescales."""


class EvenSplitMachine(OperatorRules, RescaleRules):
    """Even-split operator state across rescales."""

    keyed_state = False
    redistribution_checks = frozenset({EVEN_SPLIT_REDISTRIBUTION})


class UnionMachine(OperatorRules, RescaleRules):
    """Union operator state across rescales."""

    keyed_state = False
    redistribution_checks = frozenset({UNION_REDISTRIBUTION})


class BroadcastMachine(OperatorRules, RescaleRules):
    """Broadcast operator state across rescales."""

    keyed_state = False
    redistribution_checks = frozenset({BROADCAST_REDISTRIBUTION})


class PortabilityMachine(KeyedRules, ClockRules, OperatorRules, PortabilityRules):
    """Savepoints into every backend."""


class TtlMachine(KeyedRules, ClockRules, RoundTripRules, RescaleRules):
    """Every state with TTL under never_return_expired, across restores; all entries read after each step."""

    visibility_probe = True

    @initialize(config=machine_configs("never_return_expired"))
    def init(self, config: MachineConfig) -> None:
        """Start with TTL on every state."""
        self._start(config)

    @rule(key=_keys, value=_ints)
    def write_then_expire_then_read(self, key: Any, value: int) -> None:
        """Write every state at ``key``; read each just before its TTL passes and when it has passed.

        The plain violation (a read that does not look at timestamps, in any kind
        of state) fails here whenever the rule runs, whatever the cleanup settings;
        so does a read that refreshes the timestamp where the update type says it
        must not (seen past a write buffer: the writes are flushed first).
        """
        ns, m = NAMESPACES[0], self.model
        writes: dict[str, tuple[Callable[[Any], Any], Callable[[], Any]]] = {
            "value": (lambda h: h.update(value), lambda: m.value_update(key, ns, value)),
            "list": (lambda h: h.add(value), lambda: m.list_add_all(key, ns, [value])),
            "reducing": (lambda h: h.add(value), lambda: m.reducing_add(key, ns, value)),
            "aggregating": (lambda h: h.add(value), lambda: m.aggregating_add(key, ns, value)),
            "map": (lambda h: h.put("p", value), lambda: m.map_put_all(key, ns, {"p": value})),
        }
        for name in KEYED_STATE_NAMES:
            self._write(name, key, ns, "a write", *writes[name])
        # Past a write buffer: a read that refreshes the timestamp in the engine (under
        # ON_CREATE_AND_WRITE) would otherwise be shadowed by the buffered write.
        flush_write_buffers(self.job)
        start = self.clock()
        ttls = sorted({m.specs[name].ttl_ms for name in KEYED_STATE_NAMES})
        for ttl_ms in ttls:
            # Each state is read 1 ms before its TTL passes (a read that refreshes where the TTL
            # says it must not keeps it alive), then when it has passed: expired, unless refreshed.
            for at in (start + ttl_ms - 1, start + ttl_ms):
                if at > self.clock():
                    self.clock.advance(at - self.clock())
                self.probe_due = True
                for name in KEYED_STATE_NAMES:
                    if m.specs[name].ttl_ms != ttl_ms:
                        continue

                    def model(n: str = name) -> Any:
                        return _MODEL_READS[n](m, key, ns)

                    self._read(name, key, ns, _READ_NAMES[name], _READS[name], model)
        self.last = (
            f"a write of every state at key {key!r}, then reads of each 1 ms before and when its TTL "
            f"({', '.join(map(str, ttls))} ms) passed"
        )


class IsolationMachine(KeyedRules, ClockRules, IsolationRules):
    """Snapshots written after later writes."""


class StorageMachine(KeyedRules, ClockRules, OperatorRules, StorageRules):
    """Checkpoints and savepoints through the storage."""


class NativeCheckpointMachine(KeyedRules, ClockRules, RoundTripRules, StorageRules, IsolationRules):
    """Native checkpoints that complete, abort or are never confirmed, pending ones, restores of each."""


MACHINES: Mapping[str, Callable[[ConformanceTarget], RuleBasedStateMachine]] = {
    "all": ConformanceMachine,
    SNAPSHOT_RESTORE_ROUND_TRIP: RoundTripMachine,
    RESCALE_KEY_GROUP_OWNERSHIP: RescaleMachine,
    EVEN_SPLIT_REDISTRIBUTION: EvenSplitMachine,
    UNION_REDISTRIBUTION: UnionMachine,
    BROADCAST_REDISTRIBUTION: BroadcastMachine,
    SAVEPOINT_PORTABILITY: PortabilityMachine,
    TTL_NEVER_RETURNS_EXPIRED: TtlMachine,
    SNAPSHOT_ISOLATION: IsolationMachine,
    STORAGE_ROUND_TRIP: StorageMachine,
    NATIVE_REFERENCES_COMPLETED: NativeCheckpointMachine,
    SCHEMA_EVOLUTION: EvolutionMachine,
}
"""The machine of each named property; ``"all"`` runs every rule."""
