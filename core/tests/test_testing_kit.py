"""Tests of the conformance kit itself.

The kit passes a correct backend and storage (the reference ones), and it
catches broken ones: each deliberately broken backend below fails the named
property its bug breaks, with a counterexample a person can read (the
Hypothesis steps that lead to it, and a message naming key groups, keys,
subtasks and values). The guard refuses subclasses that override or remove kit
tests.
"""

from __future__ import annotations

import dataclasses
import tempfile
import unittest
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, settings

from statekit.backend_api import KeyedBackendParameters, KeyGroupRange, OperatorStateBackendImpl, StateKind
from statekit.checkpointing import OperatorStateData
from statekit.errors import IncompatibleSerializerError
from statekit.snapshot_codec import KeyedStateHandle
from statekit.testing import (
    PROPERTIES,
    CheckpointStorageTests,
    ConformanceTarget,
    PropertyViolation,
    ReferenceCheckpointStorage,
    ReferenceKeyedStateBackend,
    ReferenceStateBackend,
    StateBackendTests,
    kit_settings,
    kit_tests,
    run_property,
)

# --- the kit passes correct implementations ---------------------------------------------------


class TestReferenceBackend(StateBackendTests):
    """The whole kit on the reference backend, which also has a native snapshot format."""

    @pytest.fixture
    def backend_factory(self):
        return ReferenceStateBackend

    @pytest.fixture
    def other_backend_factories(self):
        return {}  # core's tests do not depend on installed plugins


class TestReferenceStorage(CheckpointStorageTests):
    """The storage kit on the reference storage."""

    @pytest.fixture
    def storage_factory(self):
        return ReferenceCheckpointStorage

    @pytest.fixture
    def other_backend_factories(self):
        return {}


# --- deliberately broken backends ------------------------------------------------------------------


class _Broken(ReferenceStateBackend):
    """A reference backend whose keyed backends are of another class."""

    keyed_class: type[ReferenceKeyedStateBackend] = ReferenceKeyedStateBackend
    name = "broken"

    def create_keyed_backend(self, parameters: KeyedBackendParameters, /) -> ReferenceKeyedStateBackend:
        return self.keyed_class(parameters)


class LosesKeyGroupOnRescale(ReferenceKeyedStateBackend):
    """Restoring from snapshots of other key group ranges, it drops its last key group (an off-by-one)."""

    def restore(self, handles: Sequence[KeyedStateHandle]) -> None:
        kgr = self.key_group_range
        if any(h.key_group_range != kgr for h in handles):
            clipped = KeyGroupRange.of(kgr.start, kgr.end - 1)  # the bug: the end is inclusive
            handles = [p for h in handles if (p := h.intersect(clipped)) is not None]
        super().restore(handles)


class KeepsTheLastKeyWhenHandedAGroup(ReferenceKeyedStateBackend):
    """Made current with its key group (the Spark runner's per-record switch), a key does not replace
    the last one: reads of handed-over keys go to the key read before."""

    def set_current_key_in_group(self, key: Any, key_group: int) -> None:
        self._kg = key_group  # the bug: self._key stays the previous key


class _Lenient:
    """A TTL handle whose reads strip timestamps without checking them; everything else delegates."""

    def __init__(self, ttl_handle: Any) -> None:
        self._h = ttl_handle

    def __getattr__(self, name: str) -> Any:
        return getattr(self._h, name)

    def value(self) -> Any:
        tv = self._h._raw.value()
        return self._h._default() if tv is None else tv[0]

    def get(self) -> list[Any]:
        return [v for v, _ in self._h._raw.get()]


class IgnoresTtl(ReferenceKeyedStateBackend):
    """Serves value and list reads from a 'fast path' that ignores TTL timestamps."""

    def get_state(self, descriptor: Any, *, namespace_serializer: Any = None) -> Any:
        handle = super().get_state(descriptor, namespace_serializer=namespace_serializer)
        if descriptor.ttl is not None and descriptor.kind in (StateKind.VALUE, StateKind.LIST):
            return _Lenient(handle)
        return handle


class SnapshotSeesLaterWrites(ReferenceKeyedStateBackend):
    """Its snapshot reads the live tables when it is written, not the state of the snapshot point."""

    def _snapshot_entries(self) -> Callable[[str, int], Any]:
        tables, regs = self._tables, self._states

        def read(name: str, kg: int) -> Any:
            d = tables[name].get(kg, {})
            des = regs[name].serializer.deserialize
            return [k for k, _ in d], [ns for _, ns in d], [des(v) for v in d.values()]

        return read


class NativeRestoreLosesKeyGroup(ReferenceKeyedStateBackend):
    """Its native restore skips the first key group of every handle."""

    def restore_native(self, handles: Sequence[Any]) -> None:
        # Narrows the range rather than dropping the block's offset: core checks offsets
        # against the file's index, so only a backend's own bookkeeping can lose it unnoticed.
        first = min((int(kg) for h in handles for kg in h.meta["offsets"]), default=None)
        handles = [
            dataclasses.replace(h, key_group_range=KeyGroupRange.of(first + 1, h.key_group_range.end))
            if first is not None and first in h.key_group_range
            else h
            for h in handles
        ]
        super().restore_native(handles)


class ReferencesUnconfirmedUploads(ReferenceKeyedStateBackend):
    """Its native snapshot re-references its last upload when nothing changed, completed or not."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.broken_last: tuple[bytes, Any] | None = None

    def native_snapshot(self, checkpoint_id: int) -> Any:
        inner = super().native_snapshot(checkpoint_id)
        backend = self

        class _Snap:
            def write(self, out: Any, **kw: Any) -> Any:
                scratch = _Scratch(out.checkpoint_id)
                h = inner.write(scratch, **kw)
                data = scratch.data
                last = backend.broken_last
                if last is not None and last[0] == data:
                    return dataclasses.replace(h, files=(last[1],))
                f = out.upload("state.bin", data, shared=True)
                backend.broken_last = (data, f)
                return dataclasses.replace(h, files=(f,))

            def release(self) -> None:
                inner.release()

        return _Snap()


class _Scratch:
    """Catches what a native snapshot uploads, without uploading it."""

    def __init__(self, checkpoint_id: int) -> None:
        self.checkpoint_id = checkpoint_id
        self.data = b""

    def upload(self, name: str, source: Any, *, shared: bool = True) -> Any:
        self.data = bytes(source)
        return None


class RefusesForeignSavepoints(ReferenceKeyedStateBackend):
    """Restores only snapshots its own backend wrote: another backend's savepoint comes back empty."""

    backend_name = "picky"

    def restore(self, handles: Sequence[KeyedStateHandle]) -> None:
        super().restore([h for h in handles if h.backend == self.backend_name])


class ReferencesConfirmedUploads(ReferenceKeyedStateBackend):
    """Follows the completion contract literally: re-references an unchanged upload once confirmed.

    The backend keeps one set of referenceable uploads (those of checkpoints it
    was told completed), whatever output or storage a snapshot writes to, and
    forgets it on restore. The kit must pass it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.contract_pending: dict[int, tuple[bytes, Any]] = {}
        self.contract_confirmed: tuple[bytes, Any] | None = None

    def native_snapshot(self, checkpoint_id: int) -> Any:
        inner = super().native_snapshot(checkpoint_id)
        backend = self

        class _Snap:
            def write(self, out: Any, **kw: Any) -> Any:
                scratch = _Scratch(out.checkpoint_id)
                h = inner.write(scratch, **kw)
                data = scratch.data
                last = backend.contract_confirmed
                if last is not None and last[0] == data:
                    return dataclasses.replace(h, files=(last[1],))
                f = out.upload("state.bin", data, shared=True)
                backend.contract_pending[out.checkpoint_id] = (data, f)
                return dataclasses.replace(h, files=(f,))

            def release(self) -> None:
                inner.release()

        return _Snap()

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        done = self.contract_pending.pop(checkpoint_id, None)
        if done is not None:
            self.contract_confirmed = done
        super().notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.contract_pending.pop(checkpoint_id, None)
        super().notify_checkpoint_aborted(checkpoint_id)

    def restore_native(self, handles: Sequence[Any]) -> None:
        super().restore_native(handles)
        self.contract_pending.clear()
        self.contract_confirmed = None


class RefusesEveryTypeChange(ReferenceKeyedStateBackend):
    """Refuses a declaration whose type is not exactly the restored one, as statekit did before #35."""

    def get_state(self, descriptor: Any, *, namespace_serializer: Any = None) -> Any:
        pending = self._pending.get(descriptor.name)
        if pending is not None and pending[0]["serializer"] != descriptor.serializer.config():
            raise IncompatibleSerializerError(f"state {descriptor.name!r} was written with another type")
        return super().get_state(descriptor, namespace_serializer=namespace_serializer)


class _BrokenOperator(ReferenceStateBackend):
    operator_class: type[OperatorStateBackendImpl] = OperatorStateBackendImpl
    name = "broken-operator"

    def create_operator_backend(self) -> OperatorStateBackendImpl:
        return self.operator_class()


class ReversesSplitLists(OperatorStateBackendImpl):
    """Writes even-split lists backwards."""

    def snapshot(self) -> dict[str, OperatorStateData]:
        out = super().snapshot()
        d = out.get("split")
        if d is not None:
            out["split"] = dataclasses.replace(d, elements=d.elements[::-1])
        return out


class KeepsOnlyItsOwnUnionElements(OperatorStateBackendImpl):
    """On restore, keeps only the first element of its union list (as if union were split)."""

    def restore(self, snapshot: dict[str, OperatorStateData]) -> None:
        d = snapshot.get("union")
        if d is not None and len(d.elements) > 1:
            snapshot = {**snapshot, "union": dataclasses.replace(d, elements=d.elements[:1])}
        super().restore(snapshot)


class KeepsOneBroadcastEntry(OperatorStateBackendImpl):
    """Restores only the first entry of the broadcast map (reads one key/value pair, not all)."""

    def restore(self, snapshot: dict[str, OperatorStateData]) -> None:
        d = snapshot.get("broadcast")
        if d is not None:
            snapshot = {**snapshot, "broadcast": dataclasses.replace(d, elements=d.elements[:2])}
        super().restore(snapshot)


class ListsNewestFirst(ReferenceCheckpointStorage):
    """Lists completed checkpoints newest first (the contract says oldest first)."""

    def list_checkpoints(self, job_id: str) -> list[str]:
        return super().list_checkpoints(job_id)[::-1]


def broken(keyed_class: type[ReferenceKeyedStateBackend]) -> Callable[[], ReferenceStateBackend]:
    return lambda: type(keyed_class.__name__, (_Broken,), {"keyed_class": keyed_class})()


def broken_operator(operator_class: type[OperatorStateBackendImpl]) -> Callable[[], ReferenceStateBackend]:
    return lambda: type(operator_class.__name__, (_BrokenOperator,), {"operator_class": operator_class})()


# What an author's run uses: the ci profile's examples (statekit's CI, conftest.py) at the steps of
# each test_property_* (kit_settings, property_step_count), made reproducible.
CI = kit_settings(
    StateBackendTests.property_step_count,
    max_examples=settings.get_profile("ci").max_examples,
    derandomize=True,
    database=None,
)


#: Every target's scratch directory lives under this one, removed when the test process exits
#: (they were left in the temporary directory: some 500 a test run).
_SCRATCH = tempfile.TemporaryDirectory(prefix="kit-")


def _violations(e: BaseException) -> list[PropertyViolation]:
    if isinstance(e, PropertyViolation):
        return [e]
    if isinstance(e, BaseExceptionGroup):
        return [v for x in e.exceptions for v in _violations(x)]
    return []


def _target(factory: Callable[[], Any], storage: Any, others: dict[str, Any]) -> ConformanceTarget:
    return ConformanceTarget(
        factory, factory().name, others, storage, Path(tempfile.mkdtemp(dir=_SCRATCH.name))
    )


def violation(
    prop: str,
    factory: Callable[[], Any],
    *,
    storage: Any = ReferenceCheckpointStorage,
    others: dict[str, Any] | None = None,
) -> PropertyViolation:
    """Run property ``prop`` against ``factory`` at the ci profile; return the violation of ``prop``.

    Hypothesis may report several distinct failures at once (an ExceptionGroup);
    one of them must be a violation of ``prop``.
    """
    target = _target(factory, storage, others or {})
    with pytest.raises((PropertyViolation, BaseExceptionGroup)) as e:
        run_property(prop, target, CI)
    found = _violations(e.value)
    matching = [v for v in found if v.property == prop]
    assert matching, f"expected a violation of {prop}, got {[v.property for v in found]}: {e.value!r}"
    v = matching[0]
    print(f"{v}\n" + "\n".join(getattr(v, "__notes__", [])))  # shown with -s: what an author sees
    return v


def steps(v: PropertyViolation) -> str:
    return "\n".join(getattr(v, "__notes__", []))


def test_every_property_has_a_test_in_the_kit() -> None:
    names = set(kit_tests(StateBackendTests)) | set(kit_tests(CheckpointStorageTests))
    for prop in PROPERTIES:
        if prop != "backend_agrees_with_model":
            assert f"test_property_{prop}" in names, prop
    assert "test_state_machine" in names


def test_a_backend_that_loses_a_key_group_on_rescale_fails_key_group_ownership() -> None:
    v = violation("rescale_key_group_ownership", broken(LosesKeyGroupOnRescale))
    assert v.property == "rescale_key_group_ownership"
    message = str(v)
    assert "key groups that lost entries: [" in message
    assert "backend holds '<absent>', expected" in message
    assert "owned by subtask" in message
    # The counterexample: a write, then a rescale, and nothing superfluous.
    s = steps(v)
    assert "state = RescaleMachine()" in s
    assert "state.rescale(" in s and "(new parallelism):" in s
    assert len([line for line in s.splitlines() if line.startswith("state.") and "agrees" not in line]) <= 6


def test_a_backend_whose_key_switch_with_a_group_keeps_the_last_key_disagrees_with_the_model() -> None:
    """The kit reads restored copies through set_current_key_in_group, as the Spark runner does."""
    target = _target(broken(KeepsTheLastKeyWhenHandedAGroup), ReferenceCheckpointStorage, {})
    with pytest.raises((PropertyViolation, BaseExceptionGroup)) as e:
        run_property("all", target, CI)
    found = [v for v in _violations(e.value) if v.property == "backend_agrees_with_model"]
    assert found, _violations(e.value)
    assert "in a restored copy" in str(found[0])


def test_a_backend_that_ignores_ttl_fails_never_returns_expired() -> None:
    v = violation("ttl_never_returns_expired", broken(IgnoresTtl))
    assert v.property == "ttl_never_returns_expired"
    assert v.rule is None  # not the update type: it returns entries no read refreshed
    assert "is expired" in str(v) and "returned" in str(v)
    s = steps(v)
    assert "state = TtlMachine()" in s
    assert "state.advance_clock(ms=" in s or "state.write_then_expire_then_read(" in s


def test_a_backend_whose_snapshot_changes_after_later_writes_fails_isolation() -> None:
    v = violation("snapshot_isolation", broken(SnapshotSeesLaterWrites))
    assert v.property == "snapshot_isolation"
    assert "writing the snapshot taken at t=" in str(v)
    s = steps(v)
    if "state.write_right_after_snapshot(" in s:  # the rule that takes, writes, and writes the snapshot
        return
    assert "state.take_snapshot(" in s and "state.write_snapshot(" in s
    # A write happened between taking and writing the snapshot.
    taken = s.index("state.take_snapshot(")
    written = s.index("state.write_snapshot(")
    writes = ("_update(", "_add(", "_add_all(", "_put(", "_put_all(", "_remove(", "clear(", "merge_")
    assert any(w in s[taken:written] for w in writes)


def test_a_backend_whose_native_restore_loses_a_key_group_fails_round_trip() -> None:
    v = violation("snapshot_restore_round_trip", broken(NativeRestoreLosesKeyGroup))
    assert v.property == "snapshot_restore_round_trip"
    assert "native snapshot" in str(v)
    assert "state.native_round_trip(" in steps(v)


def test_a_backend_that_references_unconfirmed_uploads_fails_the_native_property() -> None:
    v = violation("native_references_only_completed_uploads", broken(ReferencesUnconfirmedUploads))
    assert v.property == "native_references_only_completed_uploads"
    assert "which never completed" in str(v)
    assert "state.native_checkpoint_fails(" in steps(v)


def test_an_operator_backend_that_reverses_split_lists_fails_even_split() -> None:
    v = violation("even_split_redistribution", broken_operator(ReversesSplitLists))
    assert v.property == "even_split_redistribution"
    assert "order kept" in str(v)


def test_an_operator_backend_that_splits_union_state_fails_union() -> None:
    v = violation("union_redistribution", broken_operator(KeepsOnlyItsOwnUnionElements))
    assert v.property == "union_redistribution"
    assert "concatenation" in str(v)


def test_an_operator_backend_that_forgets_broadcast_state_fails_broadcast() -> None:
    v = violation("broadcast_redistribution", broken_operator(KeepsOneBroadcastEntry))
    assert v.property == "broadcast_redistribution"
    assert "every subtask must hold" in str(v)


def test_a_storage_listing_newest_first_fails_storage_round_trip() -> None:
    v = violation("storage_round_trip", ReferenceStateBackend, storage=ListsNewestFirst)
    assert v.property == "storage_round_trip"
    assert "the storage lists" in str(v)


def test_a_backend_that_refuses_other_backends_savepoints_fails_portability() -> None:
    picky = {"picky": broken(RefusesForeignSavepoints)}
    v = violation("savepoint_portability", ReferenceStateBackend, others=picky)
    assert v.property == "savepoint_portability"
    assert "into 'picky'" in str(v) and "backend holds '<absent>'" in str(v)
    assert "state.savepoint_into_every_backend(" in steps(v)


def test_a_backend_that_refuses_every_type_change_fails_schema_evolution() -> None:
    v = violation("schema_evolution", broken(RefusesEveryTypeChange))
    assert v.property == "schema_evolution"
    assert "is allowed by the rules, but was refused" in str(v)
    assert "state.evolve(" in steps(v)


def test_every_property_has_a_broken_backend_here() -> None:
    """Each named property is shown failing a backend (or storage) that breaks its invariant."""
    names = {n for n in globals() if n.startswith("test_a") and n.endswith(tuple(PROPERTY_TESTS.values()))}
    missing = [p for p, suffix in PROPERTY_TESTS.items() if not any(n.endswith(suffix) for n in names)]
    assert not missing, f"no broken variant fails these properties: {missing}"
    assert set(PROPERTY_TESTS) == set(PROPERTIES) - {"backend_agrees_with_model"}


# Property -> how the name of the test showing a broken variant failing it ends.
PROPERTY_TESTS = {
    "snapshot_restore_round_trip": "_fails_round_trip",
    "rescale_key_group_ownership": "_fails_key_group_ownership",
    "even_split_redistribution": "_fails_even_split",
    "union_redistribution": "_fails_union",
    "broadcast_redistribution": "_fails_broadcast",
    "savepoint_portability": "_fails_portability",
    "ttl_never_returns_expired": "_fails_never_returns_expired",
    "snapshot_isolation": "_fails_isolation",
    "storage_round_trip": "_fails_storage_round_trip",
    "native_references_only_completed_uploads": "_fails_the_native_property",
    "schema_evolution": "_fails_schema_evolution",
}


@pytest.mark.parametrize("prop", ["native_references_only_completed_uploads", "all"])
def test_a_backend_following_the_completion_contract_literally_passes(prop: str) -> None:
    """It references every upload of a checkpoint it was told completed, with no regard to outputs."""
    factory = broken(ReferencesConfirmedUploads)
    steps_ = StateBackendTests.stateful_step_count if prop == "all" else StateBackendTests.property_step_count
    settings_ = kit_settings(steps_, max_examples=CI.max_examples, derandomize=True, database=None)
    run_property(prop, _target(factory, ReferenceCheckpointStorage, {}), settings_)


# --- the same on the sqlite example, a third-party backend (when it is installed) ---------------


def _sqlite() -> Any:
    return pytest.importorskip("statekit_sqlite._backend", reason="the sqlite example is not installed")


def _sqlite_factory(keyed_class: type) -> Callable[[], Any]:
    sqlite = _sqlite()
    return type(keyed_class.__name__, (sqlite.SqliteStateBackend,), {"keyed_backend": keyed_class})  # type: ignore[no-any-return]


def test_a_sqlite_snapshot_reading_the_live_database_fails_isolation() -> None:
    sqlite = _sqlite()

    class ReadsTheLiveDatabase(sqlite.SqliteKeyedStateBackend):  # type: ignore[misc, name-defined]
        """Its frozen view queries the task's own connection when the snapshot is written: the live file."""

        def kv_reader(self) -> Any:
            db = self._sqlite_db

            class Live:
                def scan(self, lower: bytes, upper: bytes | None, limit: int) -> Any:
                    return sqlite._scan(db, lower, upper, limit)

                def release(self) -> None:
                    pass

            return Live()

    v = violation("snapshot_isolation", _sqlite_factory(ReadsTheLiveDatabase))
    assert "writing the snapshot taken at t=" in str(v)


def test_a_sqlite_restore_dropping_the_last_key_group_fails_key_group_ownership() -> None:
    sqlite = _sqlite()

    class DropsLastKeyGroup(sqlite.SqliteKeyedStateBackend):  # type: ignore[misc, name-defined]
        """Its restores skip its last key group (an inclusive end taken as exclusive)."""

        def _load_entries(self, reg: Any, key_group: int, *entries: Any) -> None:
            if key_group != self.key_group_range.end:
                super()._load_entries(reg, key_group, *entries)

        def kv_restore_key_groups(self, plan: Any) -> None:
            last = self.key_group_range.end
            plan.parts = [
                dataclasses.replace(
                    h,
                    meta={
                        **h.meta,
                        "key_groups": {
                            kg: name for kg, name in h.meta["key_groups"].items() if int(kg) != last
                        },
                    },
                )
                for h in plan.parts
            ]
            super().kv_restore_key_groups(plan)

    v = violation("rescale_key_group_ownership", _sqlite_factory(DropsLastKeyGroup))
    assert "key groups that lost entries: [" in str(v)


# --- the guard ---------------------------------------------------------------------------------------


def test_overriding_a_kit_test_is_refused_at_class_creation() -> None:
    with pytest.raises(TypeError, match=r"overrides the conformance tests \['test_list_add_none_raises'\]"):

        class TestSneaky(StateBackendTests):
            def test_list_add_none_raises(self, backend: Any) -> None:
                pass


def test_removing_a_kit_test_by_assignment_is_refused_at_class_creation() -> None:
    with pytest.raises(TypeError, match="test_property_snapshot_isolation"):

        class TestSneaky(StateBackendTests):
            test_property_snapshot_isolation = None


def test_overriding_the_guard_itself_is_refused() -> None:
    with pytest.raises(TypeError, match="test_kit_tests_are_present_and_unchanged"):

        class TestSneaky(CheckpointStorageTests):
            def test_kit_tests_are_present_and_unchanged(self) -> None:
                pass


def test_replacing_a_kit_test_after_class_creation_fails_the_guard_test() -> None:
    class TestLater(StateBackendTests):
        pass

    TestLater.test_map_basics = lambda self, backend: None  # type: ignore[method-assign]
    with pytest.raises(
        AssertionError, match=r"replaced or removed the conformance tests \['test_map_basics'\]"
    ):
        TestLater().test_kit_tests_are_present_and_unchanged()


def test_expected_failures_must_name_kit_tests_and_give_reasons() -> None:
    with pytest.raises(TypeError, match="names no kit test"):

        class TestTypo(StateBackendTests):
            expected_failures = {"test_no_such_thing": "because"}

    with pytest.raises(TypeError, match="gives no reason"):

        class TestNoReason(StateBackendTests):
            expected_failures = {"test_map_basics": " "}


def test_new_tests_of_the_subclass_are_fine() -> None:
    class TestExtra(StateBackendTests):
        def test_my_own_thing(self) -> None:
            pass

    TestExtra().test_kit_tests_are_present_and_unchanged()


pytest_plugins = ["pytester"]

INNER = """
import pytest
from hypothesis import settings
from statekit.testing import StateBackendTests, ReferenceStateBackend, ReferenceKeyedStateBackend

# Enough for Dropping's bug (the first rescale shows it); the union property passes here and runs
# every example, which grow costly past a hundred.
settings.register_profile("inner", max_examples=50, derandomize=True, database=None)
settings.load_profile("inner")


class Dropping(ReferenceKeyedStateBackend):
    def restore(self, handles):
        handles = [h for h in handles if h.key_group_range == self.key_group_range]  # drops rescaled state
        super().restore(handles)


class DroppingBackend(ReferenceStateBackend):
    name = "dropping"

    def create_keyed_backend(self, parameters):
        return Dropping(parameters)


class TestDropping(StateBackendTests):
    expected_failures = {"test_property_union_redistribution": "known: see issue 42"}

    @pytest.fixture
    def backend_factory(self):
        return DroppingBackend

    @pytest.fixture
    def other_backend_factories(self):
        return {}
"""


def test_an_author_sees_the_failing_property_and_the_steps(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=INNER)
    # In a subprocess: the inner file loads a Hypothesis profile, which must not leak into this session.
    result = pytester.runpytest_subprocess(
        "-q",
        "-p",
        "no:cacheprovider",
        "-k",
        "rescale_key_group_ownership or union_redistribution or present_and",
    )
    out = result.stdout.str()
    assert "[rescale_key_group_ownership]" in out
    assert "state = RescaleMachine()" in out
    assert "state.rescale(" in out
    # The union property passes on this backend: its strict expected failure is an XPASS(strict), a failure.
    assert "XPASS(strict)" in out or "[XPASS(strict)]" in out
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 2 and outcomes.get("passed") == 1, outcomes


OFF_BY_ONE = """
import pytest
from statekit.testing import StateBackendTests, ReferenceStateBackend, ReferenceKeyedStateBackend


class _OffByOne:
    def __init__(self, handle):
        self._h = handle

    def __getattr__(self, name):
        return getattr(self._h, name)

    def value(self):
        v = self._h.value()
        return v + 1 if isinstance(v, int) else v


class OffByOne(ReferenceKeyedStateBackend):
    def get_state(self, descriptor, *, namespace_serializer=None):
        return _OffByOne(super().get_state(descriptor, namespace_serializer=namespace_serializer))


class OffByOneBackend(ReferenceStateBackend):
    name = "off-by-one"

    def create_keyed_backend(self, parameters):
        return OffByOne(parameters)


class TestOffByOne(StateBackendTests):
    @pytest.fixture
    def backend_factory(self):
        return OffByOneBackend

    @pytest.fixture
    def other_backend_factories(self):
        return {}
"""


def test_a_failing_semantic_test_shows_the_values(pytester: pytest.Pytester) -> None:
    """The kit is registered for assertion rewriting (statekit-core's pytest11 entry point)."""
    pytester.makepyfile(test_inner=OFF_BY_ONE)
    result = pytester.runpytest_subprocess(
        "-q", "-p", "no:cacheprovider", "-k", "test_value_update_then_value_per_key"
    )
    out = result.stdout.str()
    assert result.parseoutcomes().get("failed") == 1, out
    # A bare "AssertionError" would mean the kit's asserts were not rewritten.
    assert "assert 2 == 1" in out, out


def test_property_settings_decides_how_much_each_property_runs(tmp_path: Path) -> None:
    """The public hook a kit class overrides (statekit's own matrix gives its S3 server fewer examples)."""
    asked: list[tuple[str, int]] = []

    class NoSearch(StateBackendTests):
        """Settings that generate nothing: Hypothesis says it ran no case, so these settings were used."""

        def property_settings(self, prop: str, target: ConformanceTarget, steps: int) -> settings:
            asked.append((prop, steps))
            return kit_settings(steps, phases=[Phase.explicit], database=None)

    broken_target = ConformanceTarget(
        broken(LosesKeyGroupOnRescale), "broken", {}, ReferenceCheckpointStorage, tmp_path
    )
    with pytest.raises(unittest.SkipTest, match="no test cases"):
        NoSearch()._run("rescale_key_group_ownership", broken_target, 12)
    assert asked == [("rescale_key_group_ownership", 12)]
    # The default settings search, and find the broken backend out.
    with pytest.raises(PropertyViolation):
        StateBackendTests()._run("rescale_key_group_ownership", broken_target, 12)
