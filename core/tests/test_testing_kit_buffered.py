"""The conformance kit against buffering backends: each violation is caught whatever the write buffer.

A backend on :class:`~statekit.ordered_kv.OrderedKVBackendBase` holds 1,024
updates in its write buffer by default, and reads see the buffer: a bug in
what the engine holds (a snapshot that reads the live engine, a read that
rewrites a timestamp in it) hides behind it. The kit runs every test with the
buffer at its default and at 1 (``WRITE_BUFFERS``), and flushes where an
invariant is about the engine. Here, for each named property of
:class:`~statekit.testing.StateBackendTests`, a backend on the ordered base
(in memory, buffer at its default) that breaks only that property's
invariant, and the property catching it at the ``ci`` profile as the kit runs it.

Also here: the installed kit's Hypothesis profiles, and failing example tests
naming their invariant.
"""

from __future__ import annotations

import dataclasses
import struct
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, settings

from statekit.backend_api import (
    KeyedBackendParameters,
    OperatorStateBackendImpl,
    RegisteredState,
    StateEntries,
)
from statekit.checkpointing import OperatorStateData
from statekit.errors import IncompatibleSerializerError
from statekit.ordered_kv import (
    KeyGroupNativeSnapshots,
    KVColumn,
    KVMapState,
    KVValueState,
    OrderedKVBackendBase,
)
from statekit.snapshot_codec import KeyedStateHandle, UploadTracker
from statekit.testing import (
    PROPERTIES,
    WRITE_BUFFERS,
    ConformanceTarget,
    PropertyViolation,
    ReferenceCheckpointStorage,
    StateBackendTests,
    kit_settings,
    run_property,
    with_write_buffer,
)

pytest_plugins = ["pytester"]


# --- an ordered engine in memory: the smallest backend on OrderedKVBackendBase ---------------------


class DictKV(OrderedKVBackendBase):
    """Each state a dict of composite keys; iteration sorts. Snapshots copy the dicts (a frozen view)."""

    backend_name = "dictkv"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("local_dir", None)
        super().__init__(*args, **kwargs)
        self.dictkv_tables: dict[str, dict[bytes, bytes]] = {}

    def kv_bind(self, col: KVColumn, create: bool) -> bool:
        table = self.dictkv_tables.get(col.name)
        if table is None:
            if not create:
                return False
            table = self.dictkv_tables[col.name] = {}
        col.get = table.get
        col.iterate = lambda start, t=table: iter(sorted((k, v) for k, v in t.items() if k >= start))
        return True

    def kv_write(self, columns: Sequence[KVColumn]) -> None:
        for col in columns:
            table = self.dictkv_tables[col.name]
            for k, v in col.buffer.items():
                if v is None:
                    table.pop(k, None)
                else:
                    table[k] = v
            col.buffer.clear()

    def kv_load(self, name: str, items: list[tuple[bytes, bytes]]) -> None:
        self.dictkv_tables.setdefault(name, {}).update(items)

    def dictkv_view(self) -> dict[str, dict[bytes, bytes]]:
        """What a snapshot reads: a copy of every table, taken now."""
        self.kv_write_buffered()
        return {name: dict(t) for name, t in self.dictkv_tables.items()}

    def _snapshot_entries(self) -> Callable[[str, int], StateEntries]:
        return self.dictkv_reader(self.dictkv_view())

    def dictkv_reader(self, view: dict[str, dict[bytes, bytes]]) -> Callable[[str, int], StateEntries]:
        def read(name: str, kg: int) -> StateEntries:
            lower, upper = self.layout.group_range(kg, kg)
            table = view.get(name, {})
            items = sorted((k, v) for k, v in table.items() if k >= lower and (upper is None or k < upper))
            return self.kv_read_group(name, items)

        return read


class _CopiedView:
    def __init__(self, tables: dict[str, dict[bytes, bytes]]) -> None:
        self.tables = tables

    def items(self, name: str, lower: bytes, upper: bytes | None) -> list[tuple[bytes, bytes]]:
        t = self.tables.get(name, {})
        return sorted((k, v) for k, v in t.items() if k >= lower and (upper is None or k < upper))

    def release(self) -> None:
        self.tables = {}


class NativeDictKV(KeyGroupNativeSnapshots, DictKV):
    """DictKV with core's incremental native snapshots: one content-addressed file per key group."""

    backend_name = "dictkv-native"
    native_format = "dictkv-kg-1"

    def kv_freeze(self) -> _CopiedView:
        return _CopiedView(self.dictkv_view())


class _ConfirmsAtUpload(UploadTracker):
    """Makes a checkpoint's files referenceable as soon as they are written, confirmed or not."""

    def uploaded(self, checkpoint_id: int, files: Any) -> None:
        super().uploaded(checkpoint_id, files)
        self.complete(checkpoint_id)


class ReferencesUnconfirmedUploads(NativeDictKV):
    """References the files of a checkpoint that was never confirmed (or aborted) when unchanged."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.native_uploads = _ConfirmsAtUpload()


class DictKVBackend:
    """The state backend of :class:`DictKV` (keyed) and core's operator backend."""

    name = "dictkv"
    keyed_class: type[DictKV] = DictKV
    operator_class: type[OperatorStateBackendImpl] = OperatorStateBackendImpl

    def create_keyed_backend(self, parameters: KeyedBackendParameters, /) -> DictKV:
        return self.keyed_class(parameters)

    def create_operator_backend(self) -> OperatorStateBackendImpl:
        return self.operator_class()


def dictkv(
    keyed: type[DictKV] = DictKV, operator: type[OperatorStateBackendImpl] = OperatorStateBackendImpl
) -> Callable[[], DictKVBackend]:
    """A factory of DictKV backends with these classes (the buffer at its default, 1,024)."""
    name = keyed.__name__ if keyed is not DictKV else operator.__name__
    cls = type(name, (DictKVBackend,), {"keyed_class": keyed, "operator_class": operator, "name": name})
    return cls


# --- one violation per property, each of the invariant only ----------------------------------------


class SnapshotReadsTheLiveEngine(DictKV):
    """Commits the buffer at the snapshot point, then reads the live tables when the snapshot is written."""

    def _snapshot_entries(self) -> Callable[[str, int], StateEntries]:
        self.kv_write_buffered()
        return self.dictkv_reader(self.dictkv_tables)


class _RefreshingValue(KVValueState):
    """A TTL value read that writes the unit back with the current time, into the engine directly."""

    def value(self) -> Any:
        out = super().value()
        if self._reg.ttl is not None:
            table = self._b.dictkv_tables[self._col.name]  # type: ignore[attr-defined]
            k = self._entry()
            raw = table.get(k)
            if raw is not None:
                table[k] = struct.pack(">q", self._b.clock()) + raw[8:]
        return out


class ReadRefreshesTtl(DictKV):
    """Every read of a TTL value refreshes its timestamp (as ON_READ_AND_WRITE), whatever the update type."""

    def _create_value(self, reg: RegisteredState) -> Any:
        return _RefreshingValue(self, self._kv_col(reg.name), reg)


class _ClearsEveryNamespace(KVMapState):
    """A map's clear() that removes the key's entries in every namespace, not only the current one."""

    def clear(self) -> None:
        self._delete_prefix(self._b.kv_key_prefix())


class ClearsEveryNamespace(DictKV):
    """Map state's clear() is too wide: the current key's maps in all namespaces go."""

    def _create_map(self, reg: RegisteredState) -> Any:
        return _ClearsEveryNamespace(self, self._kv_col(reg.name), reg)


class LosesKeyGroupOnRescale(DictKV):
    """Restoring snapshots of other key-group ranges, it drops its last key group (an inclusive end)."""

    def restore(self, handles: Sequence[KeyedStateHandle]) -> None:
        kgr = self.key_group_range
        if any(h.key_group_range != kgr for h in handles) and kgr.end > kgr.start:
            clipped = type(kgr).of(kgr.start, kgr.end - 1)
            handles = [p for h in handles if (p := h.intersect(clipped)) is not None]
        super().restore(handles)


class RestoresListsReversed(DictKV):
    """Bulk-loads restored list elements in reverse order: a restore changes every list of two or more."""

    def _load_entries(
        self, reg: RegisteredState, key_group: int, keys: list[Any], namespaces: list[Any], values: list[Any]
    ) -> None:
        if reg.storage_kind.name == "LIST":
            values = [list(reversed(v)) for v in values]
        super()._load_entries(reg, key_group, keys, namespaces, values)


class RefusesForeignSavepoints(DictKV):
    """Restores only snapshots its own backend wrote: another backend's savepoint comes back empty."""

    backend_name = "picky"

    def restore(self, handles: Sequence[KeyedStateHandle]) -> None:
        super().restore([h for h in handles if h.backend == self.backend_name])


class RefusesEveryTypeChange(DictKV):
    """Refuses a declaration whose type is not exactly the restored one."""

    def get_state(self, descriptor: Any, *, namespace_serializer: Any = None) -> Any:
        restored = self._restored.get(descriptor.name)  # the ordered base loads restored states at once
        if restored is not None and restored.meta()["serializer"] != descriptor.serializer.config():
            raise IncompatibleSerializerError(f"state {descriptor.name!r} was written with another type")
        return super().get_state(descriptor, namespace_serializer=namespace_serializer)


class ReversesSplitLists(OperatorStateBackendImpl):
    """Writes even-split lists backwards."""

    def snapshot(self) -> dict[str, OperatorStateData]:
        out = super().snapshot()
        d = out.get("split")
        if d is not None:
            out["split"] = dataclasses.replace(d, elements=d.elements[::-1])
        return out


class KeepsOnlyItsOwnUnionElements(OperatorStateBackendImpl):
    """On restore, keeps only the first element of its union list."""

    def restore(self, snapshot: dict[str, OperatorStateData]) -> None:
        d = snapshot.get("union")
        if d is not None and len(d.elements) > 1:
            snapshot = {**snapshot, "union": dataclasses.replace(d, elements=d.elements[:1])}
        super().restore(snapshot)


class KeepsOneBroadcastEntry(OperatorStateBackendImpl):
    """Restores only the first entry of the broadcast map."""

    def restore(self, snapshot: dict[str, OperatorStateData]) -> None:
        d = snapshot.get("broadcast")
        if d is not None:
            snapshot = {**snapshot, "broadcast": dataclasses.replace(d, elements=d.elements[:2])}
        super().restore(snapshot)


#: Each named property of StateBackendTests, and the buffered backend that breaks only it.
BROKEN: dict[str, Callable[[], Any]] = {
    "snapshot_isolation": dictkv(SnapshotReadsTheLiveEngine),
    "ttl_never_returns_expired": dictkv(ReadRefreshesTtl),
    "rescale_key_group_ownership": dictkv(LosesKeyGroupOnRescale),
    "snapshot_restore_round_trip": dictkv(RestoresListsReversed),
    "savepoint_portability": dictkv(RefusesForeignSavepoints),
    "schema_evolution": dictkv(RefusesEveryTypeChange),
    "even_split_redistribution": dictkv(operator=ReversesSplitLists),
    "union_redistribution": dictkv(operator=KeepsOnlyItsOwnUnionElements),
    "broadcast_redistribution": dictkv(operator=KeepsOneBroadcastEntry),
    "native_references_only_completed_uploads": dictkv(ReferencesUnconfirmedUploads),
}

# The ci profile's examples at each test_property_*'s steps, reproducible (as test_testing_kit.py).
CI = kit_settings(
    StateBackendTests.property_step_count,
    max_examples=settings.get_profile("ci").max_examples,
    derandomize=True,
    database=None,
)


#: What ``caught_by_the_kit`` needs: whether a run finds a violation, not its shortest steps (the kit's
#: shrinking, what an author sees, is test_testing_kit.py's), so nothing is shrunk.
CI_FIND = settings(CI, phases=[Phase.explicit, Phase.reuse, Phase.generate])


#: Every target's scratch directory lives under this one, removed when the test process exits
#: (they were left in the temporary directory: some 500 a test run).
_SCRATCH = tempfile.TemporaryDirectory(prefix="kit-buffered-")


def _violations(e: BaseException) -> list[PropertyViolation]:
    if isinstance(e, PropertyViolation):
        return [e]
    if isinstance(e, BaseExceptionGroup):
        return [v for x in e.exceptions for v in _violations(x)]
    return []


def _target(factory: Callable[[], Any], others: dict[str, Any]) -> ConformanceTarget:
    scratch = Path(tempfile.mkdtemp(dir=_SCRATCH.name))
    return ConformanceTarget(factory, factory().name, others, ReferenceCheckpointStorage, scratch)


def caught_by_the_kit(
    prop: str, factory: Callable[[], Any], others: dict[str, Any], *, until_caught: bool = False
) -> dict[Any, str]:
    """Run ``prop`` as the kit does (unshrunk), once per write buffer of WRITE_BUFFERS; what each reported.

    Returns, by buffer size, ``"violation"`` (of ``prop``), ``"passed"``, or the
    other properties a run reported instead; ``until_caught``: no buffer after
    the first whose run reported a violation of ``prop``.
    """
    out: dict[Any, str] = {}
    for size in WRITE_BUFFERS:
        try:
            run_property(prop, _target(with_write_buffer(factory, size), others), CI_FIND)
        except (PropertyViolation, BaseExceptionGroup) as e:
            found = _violations(e)
            if not found:
                raise
            hit = any(v.property == prop for v in found)
            out[size] = "violation" if hit else repr([v.property for v in found])
            if hit and until_caught:
                break
        else:
            out[size] = "passed"
    return out


def test_every_named_property_has_a_buffered_violation_here() -> None:
    storage_only = {"storage_round_trip", "backend_agrees_with_model"}
    assert set(BROKEN) == set(PROPERTIES) - storage_only


@pytest.mark.parametrize("prop", sorted(BROKEN))
def test_the_kit_catches_a_buffered_backend_breaking_only(prop: str) -> None:
    """The violation of ``prop``'s invariant, on the ordered base with its default buffer, fails ``prop``."""
    factory, others = BROKEN[prop], {}
    if prop == "savepoint_portability":  # the backend a savepoint moves into is the broken one
        factory, others = dictkv(), {"picky": BROKEN[prop]}
    outcome = caught_by_the_kit(prop, factory, others, until_caught=True)
    assert "violation" in outcome.values(), f"{prop} missed its violation at every write buffer: {outcome}"


def rules_named(prop: str, factory: Callable[[], Any]) -> dict[Any, list[tuple[str, str | None]]]:
    """Run ``prop`` as the kit does at each write buffer: the (property, rule) of each violation reported."""
    out: dict[Any, list[tuple[str, str | None]]] = {}
    for size in WRITE_BUFFERS:
        try:
            run_property(prop, _target(with_write_buffer(factory, size), {}), CI)
        except (PropertyViolation, BaseExceptionGroup) as e:
            found = _violations(e)
            if not found:
                raise
            out[size] = [(v.property, v.rule) for v in found]
        else:
            out[size] = []
    return out


def test_the_kit_names_the_clear_scope_rule_for_a_buffered_clear_of_too_wide_a_scope() -> None:
    """No property of its own: the full machine's per-step agreement catches it, naming the rule."""
    outcome = rules_named("all", dictkv(ClearsEveryNamespace))
    assert all(found == [("backend_agrees_with_model", "clear_scope")] for found in outcome.values()), outcome


def test_the_kit_names_the_ttl_update_type_rule_for_a_read_that_refreshes() -> None:
    """A read that refreshes under OnCreateAndWrite fails the TTL property as the update-type rule."""
    outcome = rules_named("ttl_never_returns_expired", dictkv(ReadRefreshesTtl))
    assert any(found for found in outcome.values()), outcome
    named = {rule for found in outcome.values() for _, rule in found}
    assert named == {"ttl_update_type"}, outcome


def test_the_correct_buffered_backend_passes_the_properties_it_breaks_elsewhere() -> None:
    """The unbroken backends pass at both buffers: the violations above are the bugs'.

    NativeDictKV runs core's key-group native format through the kit's native machine.
    """
    for prop in ("snapshot_isolation", "ttl_never_returns_expired"):
        assert caught_by_the_kit(prop, dictkv(), {}) == dict.fromkeys(WRITE_BUFFERS, "passed"), prop
    prop = "native_references_only_completed_uploads"
    assert caught_by_the_kit(prop, dictkv(NativeDictKV), {}) == dict.fromkeys(WRITE_BUFFERS, "passed")


# --- the installed kit: profiles, and example tests that name their invariant ---------------------

PROFILES = """
from hypothesis import settings

def test_the_profile_is_loaded():
    assert settings.get_current_profile_name() == "{name}"
    assert settings().max_examples == {examples}
"""


@pytest.mark.parametrize(("name", "examples"), [("ci", 15), ("nightly", 2000)])
def test_the_installed_kit_registers_every_profile_the_docs_name(
    pytester: pytest.Pytester, name: str, examples: int
) -> None:
    """A plugin's repository (no conftest of statekit's) runs ``--hypothesis-profile=<name>``."""
    pytester.makepyfile(test_profile=PROFILES.format(name=name, examples=examples))
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", f"--hypothesis-profile={name}")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, out
    assert result.parseoutcomes().get("passed") == 1, out


MISCOUNTS = """
import pytest
from statekit.testing import StateBackendTests
from test_testing_kit_buffered_inner import DictKV, dictkv


class Miscounts(DictKV):
    def _state_size(self, reg):
        return super()._state_size(reg) + 2


class TestMiscounts(StateBackendTests):
    @pytest.fixture
    def backend_factory(self):
        return dictkv(Miscounts)

    @pytest.fixture
    def other_backend_factories(self):
        return {}
"""


def test_a_failing_example_test_names_its_invariant_and_shows_the_values(pytester: pytest.Pytester) -> None:
    """``assert 62 == 60`` alone says little: the kit puts the test's invariant in front of it."""
    pytester.makepyfile(
        test_inner=MISCOUNTS, test_testing_kit_buffered_inner=Path(__file__).read_text(encoding="utf-8")
    )
    result = pytester.runpytest_subprocess(
        "-q", "-p", "no:cacheprovider", "test_inner.py", "-k", "test_keys_and_num_entries"
    )
    out = result.stdout.str()
    assert result.parseoutcomes().get("failed") == 2, out
    assert "statekit kit invariant (test_keys_and_num_entries):" in out, out
    assert "statekit kit invariant (test_keys_and_num_entries, write buffer at 1):" in out, out
    assert "assert 62 == 60" in out, out  # the values, as pytest's rewriting shows them
