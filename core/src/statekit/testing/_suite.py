"""The test classes backend and storage authors subclass, and the guard that keeps them whole.

A subclass provides factories, never instances: Hypothesis runs many examples
per test, and each example needs a fresh backend (or storage)::

    class TestMyBackend(StateBackendTests):
        @pytest.fixture
        def backend_factory(self):
            return lambda: MyStateBackend({})

Every kit test (``test_*`` of these classes) is part of the contract. A
subclass that overrides or removes one fails at import (and the guard test
fails if one is replaced later); a known failure is declared instead, with a
reason, in ``expected_failures``, which turns the test into a strict xfail.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import FunctionType
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from .._contracts import CheckpointStorage, KeyedStateBackend, SupportsNativeSnapshot, create_keyed_backend
from .._errors import CheckpointError, CheckpointNotFoundError, PluginError, StateError
from ..plugins._registry import default_registry
from ..serialization._keygroups import KeyGroupRange
from ..serialization._serializers import StrSerializer, TypeSerializer
from ..state._parameters import KeyedBackendParameters
from ._clock import ManualClock
from ._job import BackendFactory, StorageFactory, new_job_id
from ._properties import (
    BROADCAST_REDISTRIBUTION,
    EVEN_SPLIT_REDISTRIBUTION,
    NATIVE_REFERENCES_COMPLETED,
    RESCALE_KEY_GROUP_OWNERSHIP,
    SAVEPOINT_PORTABILITY,
    SCHEMA_EVOLUTION,
    SNAPSHOT_ISOLATION,
    SNAPSHOT_RESTORE_ROUND_TRIP,
    STORAGE_ROUND_TRIP,
    TTL_NEVER_RETURNS_EXPIRED,
    UNION_REDISTRIBUTION,
)
from ._reference import ReferenceCheckpointStorage, ReferenceStateBackend
from ._semantics_evolution import EvolutionSemantics
from ._semantics_snapshot import SnapshotSemantics
from ._semantics_state import KeyedStateSemantics
from ._semantics_timers import TimerSemantics
from ._semantics_ttl import TtlSemantics
from ._stateful import MACHINES, ConformanceTarget

__all__ = [
    "WRITE_BUFFERS",
    "CheckpointStorageTests",
    "GuardedTests",
    "StateBackendTests",
    "buffers_writes",
    "kit_settings",
    "kit_tests",
    "run_property",
    "with_write_buffer",
]

#: The write buffers every test of :class:`StateBackendTests` runs with: the backend's default
#: (None) and 1, where every update reaches the engine at once (a buffering backend's bugs in
#: snapshots and TTL hide behind its buffer otherwise).
WRITE_BUFFERS: tuple[int | None, ...] = (None, 1)

_KIT_MODULE_PREFIX = __name__.rpartition(".")[0] + "."
_KIT_TESTS: dict[type, dict[str, Any]] = {}  # kit class -> its kit tests, frozen when it is defined

HEALTH_CHECKS_OFF = [
    HealthCheck.function_scoped_fixture,  # the fixtures are factories, called per example
    HealthCheck.too_slow,
    HealthCheck.filter_too_much,
    HealthCheck.data_too_large,
]


def kit_settings(stateful_step_count: int, **overrides: Any) -> settings:
    """The settings of the kit's state machines, on top of the loaded Hypothesis profile.

    ``max_examples`` comes from the profile (``--hypothesis-profile``); the kit
    sets the number of steps per example, turns deadlines off and the health
    checks that factories and slow disk backends trip, and skips the explain
    phase (costly with steps as slow as restores).
    """
    kw: dict[str, Any] = {
        "deadline": None,
        "stateful_step_count": stateful_step_count,
        "suppress_health_check": HEALTH_CHECKS_OFF,
        # The explain phase re-runs the failing case under a tracer to annotate it; with steps
        # as costly as restores it takes longer than shrinking itself, for little.
        "phases": [p for p in Phase if p is not Phase.explain],
    }
    kw.update(overrides)
    return settings(**kw)


def run_property(prop: str, target: ConformanceTarget, settings_: settings) -> None:
    """Run the state machine of property ``prop`` (a key of ``MACHINES``) against ``target``.

    Raises:
        PropertyViolation: With Hypothesis's shortest failing sequence of steps in its notes.
    """
    machine = MACHINES[prop]
    # Hypothesis documents a factory of machines as valid here; its annotation says a class.
    run_state_machine_as_test(lambda: machine(target), settings=settings_)  # type: ignore[arg-type]


def kit_tests(cls: type) -> dict[str, Any]:
    """The kit tests a class inherits, by name (the functions as the kit defined them)."""
    out: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        out.update(_KIT_TESTS.get(base, {}))
    return out


def _buffer_id(size: int | None) -> str:
    return "buffer-default" if size is None else f"buffer-{size}"


class _WriteBuffered:
    """A state backend whose keyed backends hold ``size`` updates in their write buffer at most.

    Everything but :meth:`create_keyed_backend` is the wrapped backend's.
    """

    def __init__(self, inner: Any, size: int) -> None:
        self._inner = inner
        self._size = size

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def create_keyed_backend(self, parameters: KeyedBackendParameters, /) -> KeyedStateBackend:
        keyed = create_keyed_backend(self._inner, parameters)
        if hasattr(keyed, "kv_batch_size"):
            keyed.kv_batch_size = self._size
        return keyed


def with_write_buffer(factory: BackendFactory, size: int | None) -> BackendFactory:
    """``factory`` with its keyed backends' write buffer at ``size`` updates (None: as they make it).

    The buffer is the keyed backend's ``kv_batch_size`` (``OrderedKVBackendBase``'s,
    the ``write-batch-size`` option of the ``rocksdb`` and ``lmdb`` backends); a
    backend without one is returned unchanged.
    """
    if size is None:
        return factory
    return lambda: _WriteBuffered(factory(), size)


def buffers_writes(factory: BackendFactory) -> bool:
    """Whether ``factory``'s keyed backends buffer writes (have a ``kv_batch_size`` the kit can set)."""
    scratch = tempfile.mkdtemp(prefix="statekit-kit-probe-")
    try:
        keyed = create_keyed_backend(
            factory(),
            KeyedBackendParameters(StrSerializer(), KeyGroupRange.of(0, 0), 1, local_dir=scratch),
        )
        try:
            return hasattr(keyed, "kv_batch_size")
        finally:
            keyed.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class GuardedTests:
    """Refuses subclasses that override or remove a kit test; applies ``expected_failures``."""

    expected_failures: ClassVar[Mapping[str, str]] = {}
    """Kit tests known to fail, with the reason: ``{"test_name": "why"}`` (strict xfail)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__module__.startswith(_KIT_MODULE_PREFIX):
            _KIT_TESTS[cls] = {
                name: value
                for base in cls.__mro__
                if base.__module__.startswith(_KIT_MODULE_PREFIX) or base in _KIT_TESTS
                for name, value in vars(base).items()
                if name.startswith("test_") and isinstance(value, FunctionType)
            }
            return
        kit = kit_tests(cls)
        overridden = sorted(name for name in kit if name in vars(cls))
        if overridden:
            raise TypeError(
                f"{cls.__qualname__} overrides the conformance tests {overridden} of statekit.testing. "
                "Kit tests cannot be overridden or removed; to declare a known failure, add "
                f"expected_failures = {{{overridden[0]!r}: 'the reason'}} to the class"
            )
        unknown = sorted(set(cls.expected_failures) - set(kit))
        if unknown:
            raise TypeError(f"{cls.__qualname__}.expected_failures names no kit test: {unknown}")
        empty = sorted(n for n, reason in cls.expected_failures.items() if not str(reason).strip())
        if empty:
            raise TypeError(f"{cls.__qualname__}.expected_failures gives no reason for {empty}")

    @pytest.fixture(autouse=True)
    def _statekit_expected_failure(self, request: pytest.FixtureRequest) -> None:
        """Marks the kit tests listed in ``expected_failures`` as strict xfails."""
        name = getattr(request.node, "originalname", request.node.name)
        reason = self.expected_failures.get(name)
        if reason:
            request.applymarker(pytest.mark.xfail(reason=reason, strict=True))

    def test_kit_tests_are_present_and_unchanged(self) -> None:
        """The guard: every kit test is still the kit's own (none replaced or removed since import)."""
        cls = type(self)
        changed = sorted(name for name, fn in kit_tests(cls).items() if getattr(cls, name, None) is not fn)
        assert not changed, (
            f"{cls.__qualname__} replaced or removed the conformance tests {changed}; "
            "declare known failures in expected_failures instead"
        )


def _registry_backends() -> dict[str, BackendFactory]:
    """Every installed backend that can be created with default options, by name."""
    reg = default_registry()
    out: dict[str, BackendFactory] = {}
    for name in reg.backends():
        try:
            reg.create_backend(name)
        except (PluginError, StateError) as e:
            warnings.warn(f"statekit.testing: backend {name!r} is skipped: {e}", stacklevel=2)
            continue
        out[name] = lambda name=name: reg.create_backend(name)  # type: ignore[misc]
    return out


class _KitFixtures(GuardedTests):
    """What every kit class needs: factories, a scratch directory, a clock."""

    stateful_step_count: ClassVar[int] = 25
    """Steps per example of :meth:`test_state_machine`, which runs every rule."""
    property_step_count: ClassVar[int] = 12
    """Steps per example of each ``test_property_*`` state machine."""

    @pytest.fixture
    def backend_factory(self) -> BackendFactory:
        """The backend under test. Override it (``StateBackendTests`` requires it)."""
        return ReferenceStateBackend

    @pytest.fixture
    def other_backend_factories(self) -> Mapping[str, BackendFactory]:
        """Backends that savepoints and rescales move state into: every installed one, by default."""
        return _registry_backends()

    @pytest.fixture
    def storage_factory(self) -> StorageFactory:
        """The checkpoint storage of the runs (default: the in-memory reference storage)."""
        return ReferenceCheckpointStorage

    @pytest.fixture
    def kit_write_buffer(self) -> int | None:
        """The keyed backends' write buffer (None: the backend's default); see :data:`WRITE_BUFFERS`."""
        return None

    @pytest.fixture
    def kit_scratch(self, tmp_path_factory: pytest.TempPathFactory) -> Path:
        """A directory under which every keyed backend gets its own ``local_dir``."""
        return tmp_path_factory.mktemp("statekit-kit")

    @pytest.fixture
    def conformance_target(
        self,
        backend_factory: BackendFactory,
        other_backend_factories: Mapping[str, BackendFactory],
        storage_factory: StorageFactory,
        kit_scratch: Path,
        kit_write_buffer: int | None,
    ) -> ConformanceTarget:
        """Everything the state machines need (the backend under test with the test's write buffer)."""
        return ConformanceTarget(
            with_write_buffer(backend_factory, kit_write_buffer),
            str(backend_factory().name),
            dict(other_backend_factories),
            storage_factory,
            kit_scratch,
        )

    @pytest.fixture
    def clock(self) -> ManualClock:
        """The clock of the backends a semantic test makes (starts at 1000 ms)."""
        return ManualClock()

    @pytest.fixture
    def make_backend(
        self,
        backend_factory: BackendFactory,
        clock: ManualClock,
        tmp_path: Path,
        kit_write_buffer: int | None,
    ) -> Iterator[Callable[..., KeyedStateBackend]]:
        """A factory of keyed backends: ``str`` keys, key groups [0, 127] of 128 by default.

        Each gets a fresh ``local_dir`` and the test's write buffer; all are closed at teardown.
        """
        made: list[KeyedStateBackend] = []
        factory = with_write_buffer(backend_factory, kit_write_buffer)()

        def make(
            *,
            key_group_range: KeyGroupRange | None = None,
            max_parallelism: int = 128,
            key_serializer: TypeSerializer | None = None,
            clock: Callable[[], int] = clock,
        ) -> KeyedStateBackend:
            b = create_keyed_backend(
                factory,
                KeyedBackendParameters(
                    key_serializer=key_serializer or StrSerializer(),
                    key_group_range=key_group_range or KeyGroupRange.of(0, max_parallelism - 1),
                    max_parallelism=max_parallelism,
                    clock=clock,
                    local_dir=tempfile.mkdtemp(dir=tmp_path),
                ),
            )
            made.append(b)
            return b

        yield make
        for b in made:
            b.close()

    @pytest.fixture
    def backend(self, make_backend: Callable[..., KeyedStateBackend]) -> KeyedStateBackend:
        """A keyed backend owning every key group of 128, on the test's manual clock."""
        return make_backend()

    def property_settings(self, prop: str, target: ConformanceTarget, steps: int) -> settings:
        """The Hypothesis settings of property ``prop`` (``"all"``: the full machine).

        Override it to change them per property or target, e.g. fewer examples
        on a storage whose every operation is a network round trip::

            def property_settings(self, prop, target, steps):
                if getattr(target.storage_factory, "remote", False):
                    return kit_settings(steps, max_examples=5)
                return super().property_settings(prop, target, steps)
        """
        return kit_settings(steps)

    def _run(self, prop: str, target: ConformanceTarget, steps: int) -> None:
        run_property(prop, target, self.property_settings(prop, target, steps))


class StateBackendTests(
    _KitFixtures, KeyedStateSemantics, TtlSemantics, SnapshotSemantics, TimerSemantics, EvolutionSemantics
):
    """The conformance kit for a state backend: every semantic test and every named property.

    Subclass it in a ``test_*.py`` module and provide ``backend_factory``::

        class TestSqliteBackend(StateBackendTests):
            @pytest.fixture
            def backend_factory(self):
                return lambda: SqliteStateBackend({})

    Optional fixtures: ``other_backend_factories`` (backends that savepoints
    and rescales move state into; default: every installed backend) and
    ``storage_factory`` (default: the in-memory reference storage).
    """

    @pytest.fixture
    def backend_factory(self) -> BackendFactory:
        """Required: a zero-argument callable that returns a fresh StateBackend."""
        pytest.fail(
            f"{type(self).__qualname__} must define a backend_factory fixture returning a "
            "zero-argument callable that makes a fresh StateBackend"
        )

    @pytest.fixture(params=WRITE_BUFFERS, ids=_buffer_id)
    def kit_write_buffer(self, request: pytest.FixtureRequest, backend_factory: BackendFactory) -> int | None:
        """Every test runs with the backend's write buffer at its default and at 1 (:data:`WRITE_BUFFERS`).

        A backend that buffers nothing (no ``kv_batch_size``) runs each test once:
        its other variants are skipped, saying so.
        """
        size: int | None = request.param
        if size is not None and not buffers_writes(backend_factory):
            pytest.skip("this backend has no write buffer (kv_batch_size): the default run covers it")
        return size

    # --- the named properties: one state machine each -------------------------------------------

    def test_state_machine(self, conformance_target: ConformanceTarget) -> None:
        """Every rule at once: keyed and operator state, TTL, snapshots, rescales, storage, savepoints."""
        self._run("all", conformance_target, self.stateful_step_count)

    def test_property_snapshot_restore_round_trip(self, conformance_target: ConformanceTarget) -> None:
        """restore(snapshot(s)) == s, canonical and (when the backend has one) native."""
        self._run(SNAPSHOT_RESTORE_ROUND_TRIP, conformance_target, self.property_step_count)

    def test_property_rescale_key_group_ownership(self, conformance_target: ConformanceTarget) -> None:
        """After a rescale, each key group has one owner and the subtasks' keyed state is the model."""
        self._run(RESCALE_KEY_GROUP_OWNERSHIP, conformance_target, self.property_step_count)

    def test_property_even_split_redistribution(self, conformance_target: ConformanceTarget) -> None:
        """Even-split lists keep their order; sizes differ by at most one."""
        self._run(EVEN_SPLIT_REDISTRIBUTION, conformance_target, self.property_step_count)

    def test_property_union_redistribution(self, conformance_target: ConformanceTarget) -> None:
        """Union lists are the concatenation of the old ones on every subtask."""
        self._run(UNION_REDISTRIBUTION, conformance_target, self.property_step_count)

    def test_property_broadcast_redistribution(self, conformance_target: ConformanceTarget) -> None:
        """Broadcast state is equal on every subtask."""
        self._run(BROADCAST_REDISTRIBUTION, conformance_target, self.property_step_count)

    def test_property_savepoint_portability(self, conformance_target: ConformanceTarget) -> None:
        """A savepoint taken on this backend restores into every backend with the same state."""
        self._run(SAVEPOINT_PORTABILITY, conformance_target, self.property_step_count)

    def test_property_ttl_never_returns_expired(self, conformance_target: ConformanceTarget) -> None:
        """Under never_return_expired, expired entries are never visible, across restores too."""
        self._run(TTL_NEVER_RETURNS_EXPIRED, conformance_target, self.property_step_count)

    def test_property_snapshot_isolation(self, conformance_target: ConformanceTarget) -> None:
        """A snapshot is unaffected by writes made after it was taken."""
        self._run(SNAPSHOT_ISOLATION, conformance_target, self.property_step_count)

    def test_property_schema_evolution(self, conformance_target: ConformanceTarget) -> None:
        """Entries written in schema A read as migrated in a compatible B; a refused B changes nothing."""
        self._run(SCHEMA_EVOLUTION, conformance_target, self.property_step_count)

    def test_property_native_references_only_completed_uploads(
        self, conformance_target: ConformanceTarget, backend: KeyedStateBackend
    ) -> None:
        """Native checkpoints (complete, aborted, unconfirmed, pending) reference only completed uploads."""
        if not isinstance(backend, SupportsNativeSnapshot):
            pytest.skip("this backend has no native snapshot format (SupportsNativeSnapshot)")
        self._run(NATIVE_REFERENCES_COMPLETED, conformance_target, self.property_step_count)


class CheckpointStorageTests(_KitFixtures):
    """The conformance kit for a checkpoint storage: its contract and the storage properties.

    Subclass it and provide ``storage_factory`` (a zero-argument callable that
    makes a fresh storage with savepoints configured). State is written by the
    ``backend_factory`` backend (default: the reference backend).
    """

    @pytest.fixture
    def storage_factory(self) -> StorageFactory:
        """Required: a zero-argument callable that returns a fresh CheckpointStorage."""
        pytest.fail(
            f"{type(self).__qualname__} must define a storage_factory fixture returning a "
            "zero-argument callable that makes a fresh CheckpointStorage"
        )

    @pytest.fixture
    def storage(self, storage_factory: StorageFactory) -> CheckpointStorage:
        """One storage, for the example-based contract tests."""
        return storage_factory()

    def test_property_storage_round_trip(self, conformance_target: ConformanceTarget) -> None:
        """Checkpoints and savepoints restore their state at any parallelism; retention keeps the newest."""
        self._run(STORAGE_ROUND_TRIP, conformance_target, self.property_step_count)

    def test_property_savepoint_portability(self, conformance_target: ConformanceTarget) -> None:
        """A savepoint written through this storage restores into every backend."""
        self._run(SAVEPOINT_PORTABILITY, conformance_target, self.property_step_count)

    def test_satisfies_the_protocol(self, storage: CheckpointStorage) -> None:
        assert isinstance(storage, CheckpointStorage)
        assert isinstance(storage.name, str) and storage.name

    def test_streams_read_back_by_range_after_a_json_round_trip(self, storage: CheckpointStorage) -> None:
        job = new_job_id()
        writer = storage.begin_checkpoint(job, 1)
        data = bytes(range(256)) * 200  # above any inline threshold
        small = b"tiny"
        handles = []
        for name, payload in (("big", data), ("small", small)):
            out = writer.create_stream(name)
            for i in range(0, len(payload), 1000):
                out.write(payload[i : i + 1000])
            assert out.tell() == len(payload)
            handles.append((payload, out.close_and_get_handle()))
        location = writer.complete(b"meta")
        for payload, h in handles:
            again = storage.resolve_handle(location, json.loads(json.dumps(h.to_json())))
            assert again.size == len(payload)
            assert again.read() == payload
            assert again.read(1, 2) == payload[1:3]

    def test_a_checkpoint_exists_once_completed(self, storage: CheckpointStorage) -> None:
        job = new_job_id()
        assert storage.list_checkpoints(job) == []
        assert storage.latest_checkpoint(job) is None
        writer = storage.begin_checkpoint(job, 1)
        writer.create_stream("x").write(b"x")
        assert storage.list_checkpoints(job) == []
        location = writer.complete(b"meta-1")
        assert storage.list_checkpoints(job) == [location]
        assert storage.latest_checkpoint(job) == location
        assert storage.read_metadata(location) == b"meta-1"

    def test_an_aborted_checkpoint_does_not_exist(self, storage: CheckpointStorage) -> None:
        job = new_job_id()
        writer = storage.begin_checkpoint(job, 1)
        out = writer.create_stream("x")
        out.write(b"x" * 100_000)
        out.close_and_get_handle()
        writer.abort()
        assert storage.list_checkpoints(job) == []
        assert storage.latest_checkpoint(job) is None

    def test_checkpoints_are_listed_oldest_first_and_discarded(self, storage: CheckpointStorage) -> None:
        job = new_job_id()
        locations = []
        for cid in (1, 2, 10, 11):
            w = storage.begin_checkpoint(job, cid)
            locations.append(w.complete(f"m{cid}".encode()))
        assert storage.list_checkpoints(job) == locations
        storage.discard_checkpoint(locations[1])
        assert storage.list_checkpoints(job) == [locations[0], *locations[2:]]
        assert storage.latest_checkpoint(job) == locations[-1]
        with pytest.raises(CheckpointNotFoundError):
            storage.read_metadata(locations[1])

    def test_completing_twice_is_refused(self, storage: CheckpointStorage) -> None:
        job = new_job_id()
        storage.begin_checkpoint(job, 1).complete(b"first")
        with pytest.raises(CheckpointError):
            storage.begin_checkpoint(job, 1).complete(b"second")
        assert storage.read_metadata(storage.list_checkpoints(job)[0]) == b"first"

    def test_a_completed_checkpoint_refuses_new_streams_and_abort(self, storage: CheckpointStorage) -> None:
        """``create_stream`` and ``abort()`` of a completed checkpoint raise CheckpointError, change nothing.

        Both on the writer that completed it and on a new writer of the same id
        (a run that numbers a checkpoint again must not damage the completed one).
        """
        job = new_job_id()
        writer = storage.begin_checkpoint(job, 1)
        payload = bytes(range(256)) * 200  # above any inline threshold: a file of its own
        out = writer.create_stream("state")
        out.write(payload)
        description = json.loads(json.dumps(out.close_and_get_handle().to_json()))
        location = writer.complete(b"meta")
        new_writer = storage.begin_checkpoint(job, 1)
        writers = (("the writer that completed it", writer), ("a new writer", new_writer))
        for which, w in writers:
            with pytest.raises(CheckpointError):
                w.create_stream("state")
                pytest.fail(f"create_stream on {which} of completed {location} did not raise CheckpointError")
            with pytest.raises(CheckpointError):
                w.abort()
                pytest.fail(f"abort() on {which} of completed {location} did not raise CheckpointError")
        assert storage.list_checkpoints(job) == [location], f"{location} is no longer listed"
        assert storage.read_metadata(location) == b"meta", f"the metadata of {location} changed"
        again = storage.resolve_handle(location, description)
        assert again.read() == payload, f"a stream of {location} changed after a refused call"

    def test_missing_location_raises_not_found(self, storage: CheckpointStorage) -> None:
        with pytest.raises(CheckpointNotFoundError):
            storage.read_metadata(storage.begin_checkpoint(new_job_id(), 7).location)

    def test_savepoints_are_separate_and_never_listed_as_checkpoints(
        self, storage: CheckpointStorage
    ) -> None:
        job = new_job_id()
        first = storage.begin_savepoint(job)
        a = first.complete(b"sp-a")
        b = storage.begin_savepoint(job).complete(b"sp-b")
        assert a != b
        assert storage.list_checkpoints(job) == []
        assert storage.read_metadata(a) == b"sp-a"
        assert storage.read_metadata(b) == b"sp-b"
