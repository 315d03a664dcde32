"""Kit tests of state types that change across restores: declared migrations, refusals, history, progress.

The rules themselves (which changes migrate, which are refused) are checked
against a model by the ``schema_evolution`` property (``_evolving``); these are
the behaviours around them, one each, on canonical and (when the backend has
one) native snapshots, with the state declared before or after the restore.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from .._contracts import SupportsNativeSnapshot
from .._errors import IncompatibleSerializerError, SnapshotError, StateMigrationError
from ..serialization._serializers import serializer_for
from ..state._keyed import KeyedBackendBase
from ..state._state import ListStateDescriptor, MapStateDescriptor, Migration, ValueStateDescriptor
from ._job import snapshot_handle

__all__ = ["EvolutionSemantics"]

KEYS = ("a", "b", "c", "d")


@dataclasses.dataclass
class Visit:
    """The state's type in the new job: the count became a float, ``first_seen`` is new."""

    visits: float = dataclasses.field(metadata={"statekit.former_names": ("count",)})
    first_seen: int | None = None


@dataclasses.dataclass
class _OldVisit:
    """The same class, as the old job declared it (a class of another shape under one path)."""

    count: int
    region: str


_OldVisit.__qualname__ = _OldVisit.__name__ = "Visit"


def restore_into(
    make_backend: Any, source: Any, *descriptors: Any, native: bool, declare_first: bool
) -> tuple[Any, list[Any]]:
    """A new backend restored from ``source``, ``descriptors`` declared before or after the restore."""
    if native and not isinstance(source, SupportsNativeSnapshot):
        pytest.skip("this backend has no native snapshot format (SupportsNativeSnapshot)")
    handle = snapshot_handle(source, native=native)
    target = make_backend()
    states = [target.get_state(d) for d in descriptors] if declare_first else []
    if native:
        target.restore_native([handle])
    else:
        target.restore([handle])
    if not declare_first:
        states = [target.get_state(d) for d in descriptors]
    return target, states


def base_or_skip(backend: Any) -> KeyedBackendBase:
    """``backend`` if it builds on KeyedBackendBase (which offers progress and the restore origin)."""
    if not isinstance(backend, KeyedBackendBase):
        pytest.skip("this backend does not build on KeyedBackendBase")
    return backend


def entry_of(backend: Any, name: str) -> dict[str, Any]:
    """The snapshot entry (``RegisteredState.meta()``) of state ``name``."""
    return next(m for m in backend.snapshot().header.states if m["name"] == name)


NATIVE = pytest.mark.parametrize("native", [False, True], ids=["canonical", "native"])
DECLARED = pytest.mark.parametrize("declare_first", [False, True], ids=["declared-after", "declared-first"])


class EvolutionSemantics:
    """Declared migrations, refusals, schema history and migration progress on any backend."""

    def _write_counts(self, backend: Any) -> tuple[Any, Any, Any]:
        """Version 1 of three states: a count per key, a list of counts, a map of counts."""
        v = backend.get_state(ValueStateDescriptor("count", int))
        lst = backend.get_state(ListStateDescriptor("counts", int))
        m = backend.get_state(MapStateDescriptor("by_page", str, int))
        for i, k in enumerate(KEYS):
            backend.set_current_key(k)
            v.update(i)
            lst.add_all([i, -1, i + 10])
            m.put_all({"/a": i, "/b": -1})
        return v, lst, m

    @NATIVE
    @DECLARED
    def test_a_declared_migration_converts_every_entry(
        self, make_backend: Any, backend: Any, native: bool, declare_first: bool
    ) -> None:
        self._write_counts(backend)

        def to_visit(n: int) -> Visit | None:
            return None if n < 0 else Visit(float(n), first_seen=1000 + n)

        migrations = [Migration(to_visit, from_version=1)]
        target, (v, lst, m) = restore_into(
            make_backend,
            backend,
            ValueStateDescriptor("count", Visit, version=2, migrations=migrations),
            ListStateDescriptor("counts", Visit, version=2, migrations=migrations),
            MapStateDescriptor("by_page", str, Visit, version=2, migrations=migrations),
            native=native,
            declare_first=declare_first,
        )
        for i, k in enumerate(KEYS):
            target.set_current_key(k)
            assert v.value() == Visit(float(i), 1000 + i)
            # A None from the function removes a list element; a map stores it.
            assert lst.get() == [Visit(float(i), 1000 + i), Visit(float(i + 10), 1010 + i)]
            assert dict(m.items()) == {"/a": Visit(float(i), 1000 + i), "/b": None}
        history = entry_of(target, "count")["lineage"]
        assert [(h["schema_version"], h["migration"]) for h in history] == [(1, "function")]
        assert entry_of(target, "count")["schema_version"] == 2

    @NATIVE
    def test_a_migration_returning_none_removes_the_value_entry(
        self, make_backend: Any, backend: Any, native: bool
    ) -> None:
        self._write_counts(backend)
        keep_odd = Migration(lambda n: n if n % 2 else None, from_version=1)
        target, _ = restore_into(
            make_backend,
            backend,
            ValueStateDescriptor("count", int, version=2, migrations=[keep_odd]),
            native=native,
            declare_first=False,
        )
        assert target.num_entries("count") == 2
        assert sorted(target.keys("count")) == ["b", "d"]

    @NATIVE
    def test_a_migration_from_a_type_gets_old_values_as_that_type(
        self, make_backend: Any, backend: Any, native: bool
    ) -> None:
        s = backend.get_state(ValueStateDescriptor("visit", _OldVisit))
        backend.set_current_key("a")
        s.update(_OldVisit(3, "eu"))
        seen: list[Any] = []

        def convert(old: _OldVisit) -> Visit:
            seen.append(old)
            return Visit(float(old.count), first_seen=len(old.region))

        target, (s2,) = restore_into(
            make_backend,
            backend,
            ValueStateDescriptor("visit", Visit, migrations=[Migration(convert, from_type=_OldVisit)]),
            native=native,
            declare_first=False,
        )
        target.set_current_key("a")
        assert s2.value() == Visit(3.0, 2)
        assert seen == [_OldVisit(3, "eu")]

    @NATIVE
    def test_without_a_migration_old_dataclass_values_come_as_field_dicts(
        self, make_backend: Any, backend: Any, native: bool
    ) -> None:
        s = backend.get_state(ValueStateDescriptor("visit", _OldVisit, version=4))
        backend.set_current_key("a")
        s.update(_OldVisit(3, "eu"))
        seen: list[Any] = []

        def convert(old: Any) -> Visit:
            seen.append(old)
            return Visit(float(old["count"]))

        m = Migration(convert, from_version=4)
        target, (s2,) = restore_into(
            make_backend,
            backend,
            ValueStateDescriptor("visit", Visit, version=5, migrations=[m]),
            native=native,
            declare_first=False,
        )
        target.set_current_key("a")
        assert s2.value() == Visit(3.0)
        assert seen == [{"count": 3, "region": "eu"}]

    @NATIVE
    def test_a_failing_migration_names_the_key_and_changes_nothing_it_can_keep(
        self, make_backend: Any, backend: Any, native: bool
    ) -> None:
        """The error names the state and the key. Then the state still reads as before, or, where an
        engine's files were being rewritten in place, every further use and snapshot of it is refused."""
        self._write_counts(backend)

        def fails_on_two(n: int) -> float:
            if n == 2:
                raise ValueError("two is not allowed")
            return float(n)

        bad: ValueStateDescriptor[float] = ValueStateDescriptor(
            "count", float, version=2, migrations=[Migration(fails_on_two, from_version=1)]
        )
        if native and not isinstance(backend, SupportsNativeSnapshot):
            pytest.skip("this backend has no native snapshot format (SupportsNativeSnapshot)")
        handle = snapshot_handle(backend, native=native)
        target = make_backend()
        if native:
            target.restore_native([handle])
        else:
            target.restore([handle])
        with pytest.raises(StateMigrationError) as e:
            target.get_state(bad)
        assert "state 'count'" in str(e.value) and "key 'c'" in str(e.value)
        assert "two is not allowed" in str(e.value)
        try:
            again = target.get_state(ValueStateDescriptor("count", int))
        except StateMigrationError as refused:
            assert "partly rewritten" in str(refused) and "restore again" in str(refused)
            with pytest.raises(SnapshotError, match="partly rewritten"):
                target.snapshot()
            return
        for i, k in enumerate(KEYS):
            target.set_current_key(k)
            assert again.value() == i

    @NATIVE
    @DECLARED
    def test_a_narrowing_is_refused_naming_both_schemas_before_anything_changes(
        self, make_backend: Any, backend: Any, native: bool, declare_first: bool
    ) -> None:
        s = backend.get_state(ValueStateDescriptor("ratio", float | None))
        for k in KEYS:
            backend.set_current_key(k)
            s.update(0.5)
        narrowed: ValueStateDescriptor[int] = ValueStateDescriptor("ratio", int)
        with pytest.raises(IncompatibleSerializerError) as e:
            restore_into(make_backend, backend, narrowed, native=native, declare_first=declare_first)
        msg = str(e.value)
        assert "state 'ratio'" in msg and "optional<float>" in msg and "int" in msg
        assert "Migration" in msg  # the way out

    @NATIVE
    def test_a_refused_change_leaves_the_restored_state_as_it_was(
        self, make_backend: Any, backend: Any, native: bool
    ) -> None:
        self._write_counts(backend)
        target, _ = restore_into(make_backend, backend, native=native, declare_first=False)
        before = target.num_entries("count")
        with pytest.raises(IncompatibleSerializerError):
            target.get_state(ValueStateDescriptor("count", str))
        assert target.num_entries("count") == before
        s = target.get_state(ValueStateDescriptor("count", int))
        target.set_current_key("d")
        assert s.value() == 3

    @NATIVE
    def test_a_newer_schema_version_than_declared_is_refused(
        self, make_backend: Any, backend: Any, native: bool
    ) -> None:
        s = backend.get_state(ValueStateDescriptor("count", int, version=3))
        backend.set_current_key("a")
        s.update(1)
        with pytest.raises(StateMigrationError, match="newer schema version"):
            restore_into(
                make_backend,
                backend,
                ValueStateDescriptor("count", int, version=2),
                native=native,
                declare_first=False,
            )

    @NATIVE
    def test_map_keys_and_namespaces_never_change_type(
        self, make_backend: Any, backend: Any, native: bool
    ) -> None:
        m = backend.get_state(MapStateDescriptor("m", int, int))
        w = backend.get_state(ListStateDescriptor("w", int), namespace_serializer=serializer_for(int))
        backend.set_current_key("a")
        m.put(1, 1)
        w.set_current_namespace(7)
        w.add(1)
        with pytest.raises(IncompatibleSerializerError, match="map keys never change type"):
            restore_into(
                make_backend, backend, MapStateDescriptor("m", float, int), native=native, declare_first=False
            )
        with pytest.raises(IncompatibleSerializerError, match="namespaces never change type"):
            target = make_backend()
            target.get_state(ListStateDescriptor("w", int), namespace_serializer=serializer_for(float))
            target.restore([snapshot_handle(backend)])

    @NATIVE
    def test_schema_history_records_each_migration_and_where_it_came_from(
        self, make_backend: Any, backend: Any, native: bool
    ) -> None:
        s = backend.get_state(ValueStateDescriptor("count", int))
        backend.set_current_key("a")
        s.update(5)
        # Step 1: int -> float, restoring "checkpoint 7".
        if native and not isinstance(backend, SupportsNativeSnapshot):
            pytest.skip("this backend has no native snapshot format (SupportsNativeSnapshot)")
        second: Any = base_or_skip(make_backend())
        second.set_restore_origin("checkpoint", 7)
        h = snapshot_handle(backend, native=native)
        if native:
            second.restore_native([h])
        else:
            second.restore([h])
        second.get_state(ValueStateDescriptor("count", float))
        # Step 2: float -> float | None, version 2, restoring "savepoint 9"; step 3: nothing changes.
        third = base_or_skip(make_backend())
        third.set_restore_origin("savepoint", 9)
        third.restore([snapshot_handle(second)])
        third.get_state(ValueStateDescriptor("count", float | None, version=2))
        fourth = make_backend()
        fourth.restore([snapshot_handle(third)])
        s4 = fourth.get_state(ValueStateDescriptor("count", float | None, version=2))
        fourth.set_current_key("a")
        assert s4.value() == 5.0
        history = entry_of(fourth, "count")["lineage"]
        assert [h["serializer"] for h in history] == [{"id": "int", "v": 1}, {"id": "float", "v": 1}]
        assert [h["restored_from"] for h in history] == [
            {"kind": "checkpoint", "checkpoint_id": 7},
            {"kind": "savepoint", "checkpoint_id": 9},
        ]
        assert [h["schema_version"] for h in history] == [1, 1]
        assert "int → float" in history[0]["changes"]

    @NATIVE
    def test_migration_progress_is_reported_per_state(
        self, make_backend: Any, backend: Any, native: bool
    ) -> None:
        s = backend.get_state(ValueStateDescriptor("count", int))
        for i in range(300):
            backend.set_current_key(f"k{i}")
            s.update(i)
        if native and not isinstance(backend, SupportsNativeSnapshot):
            pytest.skip("this backend has no native snapshot format (SupportsNativeSnapshot)")
        target: Any = base_or_skip(make_backend())
        calls: list[tuple[str, int, int]] = []
        target.on_migration_progress(lambda state, done, total: calls.append((state, done, total)))
        h = snapshot_handle(backend, native=native)
        if native:
            target.restore_native([h])
        else:
            target.restore([h])
        target.get_state(ValueStateDescriptor("count", float))
        assert calls, "no progress was reported"
        assert {c[0] for c in calls} == {"count"}
        dones = [c[1] for c in calls]
        assert dones == sorted(dones) and dones[-1] == calls[-1][2] == 300

    def test_a_state_the_job_no_longer_declares_is_kept_and_named(
        self, make_backend: Any, backend: Any
    ) -> None:
        self._write_counts(backend)
        target = base_or_skip(make_backend())
        target.restore([snapshot_handle(backend)])
        target.get_state(ValueStateDescriptor("count", int))
        assert sorted(target.undeclared_state_names) == ["by_page", "counts"]
        later = make_backend()
        later.restore([snapshot_handle(target)])
        lst = later.get_state(ListStateDescriptor("counts", int))
        later.set_current_key("b")
        assert lst.get() == [1, -1, 11]
