"""KeyedBackendBase around migrations: refusals that name things, mixed snapshots, carried states."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from statekit import ListStateDescriptor, Migration, StateTtlConfig, ValueStateDescriptor, default_registry
from statekit.backend_api import KeyedBackendParameters, KeyGroupRange
from statekit.errors import IncompatibleSerializerError, SnapshotError, StateMigrationError
from statekit.serializers import IntSerializer, StrSerializer
from statekit.state._migration import plan_state_migration
from statekit.state._state import StateKind
from statekit.testing import snapshot_handle

REGISTRY = default_registry()
BACKENDS = sorted(REGISTRY.backends())
KV = [b for b in ("rocksdb", "lmdb") if b in BACKENDS]


@pytest.fixture
def make() -> Iterator[Any]:
    made: list[Any] = []

    def make(name: str = "heap", start: int = 0, end: int = 127, key_serializer: Any = None) -> Any:
        b = REGISTRY.create_backend(name).create_keyed_backend(
            KeyedBackendParameters(
                key_serializer=key_serializer or StrSerializer(),
                key_group_range=KeyGroupRange.of(start, end),
                max_parallelism=128,
                clock=lambda: 1000,
                local_dir=tempfile.mkdtemp(),
            )
        )
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


def fill(backend: Any, descriptor: Any, values: dict[str, Any]) -> Any:
    s = backend.get_state(descriptor)
    for k, v in values.items():
        backend.set_current_key(k)
        s.update(v)
    return s


KEYS = {f"k{i}": i for i in range(40)}


def test_a_changed_key_type_is_refused_naming_the_states_and_both_types(make: Any) -> None:
    src = make()
    fill(src, ValueStateDescriptor("count", int), KEYS)
    src.get_state(ListStateDescriptor("seen", int))
    target = make(key_serializer=IntSerializer())
    with pytest.raises(IncompatibleSerializerError) as e:
        target.restore([snapshot_handle(src)])
    msg = str(e.value)
    assert "the keys of states ['count', 'seen'] were written as str and are declared as int" in msg
    assert target.num_entries() == 0


def halves(make: Any, name: str, first: Any, second: Any) -> list[Any]:
    """Snapshots of two subtasks, each with state 'count' declared as ``first`` and ``second``."""
    a, b = make(name, 0, 63), make(name, 64, 127)
    for backend, d in ((a, first), (b, second)):
        s = backend.get_state(d)
        for k, v in KEYS.items():
            try:
                backend.set_current_key(k)
            except Exception:  # noqa: BLE001 - a key of the other half
                continue
            s.update(v if d.serializer.config()["id"] == "int" else float(v))
    return [a, b]


@pytest.mark.parametrize("native", [False, True], ids=["canonical", "native"])
@pytest.mark.parametrize("name", ["heap", *KV])
def test_subtasks_that_wrote_one_state_in_two_schemas_are_refused_with_the_way_out(
    make: Any, name: str, native: bool
) -> None:
    if native and name not in KV:
        pytest.skip("no native format")
    parts = halves(make, name, ValueStateDescriptor("count", int), ValueStateDescriptor("count", float))
    handles = [snapshot_handle(p, native=native) for p in parts]
    target = make(name)
    with pytest.raises(StateMigrationError) as e:
        (target.restore_native if native else target.restore)(handles)
    msg = str(e.value)
    assert "state 'count' was written with different schemas" in msg and "int and float" in msg
    assert "restore at the parallelism the checkpoint was taken with" in msg
    assert target.num_entries() == 0


@pytest.mark.parametrize("name", BACKENDS)
def test_subtasks_with_one_schema_and_different_histories_restore_keeping_the_longer(
    make: Any, name: str
) -> None:
    parts = halves(make, name, ValueStateDescriptor("count", int), ValueStateDescriptor("count", int))
    hour = StateTtlConfig(timedelta(hours=1))
    steps = [  # the first half: int -> float at checkpoint 5; the second: via a TTL'd float, at 6 and 8
        [(5, ValueStateDescriptor("count", float))],
        [(6, ValueStateDescriptor("count", float, ttl=hour)), (8, ValueStateDescriptor("count", float))],
    ]
    migrated = []
    for (start, end), part, path in zip(((0, 63), (64, 127)), parts, steps):
        for origin, d in path:
            m = make(name, start, end)
            m.set_restore_origin("checkpoint", origin)
            m.restore([snapshot_handle(part)])
            m.get_state(d)
            part = m
        migrated.append(part)
    target = make(name)
    target.restore([snapshot_handle(p) for p in migrated])
    s = target.get_state(ValueStateDescriptor("count", float))
    for k, v in KEYS.items():
        target.set_current_key(k)
        assert s.value() == float(v)
    lineage = next(m for m in target.snapshot().header.states if m["name"] == "count")["lineage"]
    assert [h["restored_from"]["checkpoint_id"] for h in lineage] == [6, 8]


@dataclasses.dataclass
class Visit:
    """The class as this process has it now."""

    count: float
    region: str = "?"


@dataclasses.dataclass
class _Before:
    count: int


_Before.__qualname__ = _Before.__name__ = "Visit"


@pytest.mark.parametrize("native", [False, True], ids=["canonical", "native"])
@pytest.mark.parametrize("carrier", KV)
def test_an_undeclared_state_of_a_changed_class_is_carried_unchanged_and_migrates_later(
    make: Any, carrier: str, native: bool
) -> None:
    """An engine restores a state it cannot decode as the class now is; its next snapshot keeps the bytes."""
    src = make()
    fill(src, ValueStateDescriptor("visit", _Before), {k: _Before(v) for k, v in KEYS.items()})
    middle = make(carrier)
    middle.restore([snapshot_handle(src)])  # not declared: loaded into the engine as stored
    assert middle.num_entries("visit") == len(KEYS)
    target = make()
    handle = snapshot_handle(middle, native=native)
    if native:
        target = make(carrier)
        target.restore_native([handle])
    else:
        target.restore([handle])
    s = target.get_state(ValueStateDescriptor("visit", Visit))
    for k, v in KEYS.items():
        target.set_current_key(k)
        assert s.value() == Visit(float(v))


@pytest.mark.parametrize("name", KV)
def test_a_failed_in_place_migration_refuses_the_state_and_every_snapshot(make: Any, name: str) -> None:
    src = make(name)
    fill(src, ValueStateDescriptor("count", int), KEYS)
    target = make(name)
    target.restore_native([snapshot_handle(src, native=True)])

    def fails_late(n: int) -> int:
        if n == 39:
            raise ValueError("no")
        return n

    with pytest.raises(StateMigrationError, match="key 'k39'"):
        target.get_state(
            ValueStateDescriptor("count", int, version=2, migrations=[Migration(fails_late, from_version=1)])
        )
    for attempt in (
        lambda: target.get_state(ValueStateDescriptor("count", int)),
        lambda: target.get_state(ValueStateDescriptor("count", int, version=2)),
    ):
        with pytest.raises(StateMigrationError, match="partly rewritten"):
            attempt()
    with pytest.raises(SnapshotError, match="partly rewritten"):
        target.snapshot()
    with pytest.raises(SnapshotError, match="partly rewritten"):
        target.native_snapshot(99)


@pytest.mark.parametrize("name", KV)
def test_an_in_place_migration_reports_progress_per_batch(make: Any, name: str) -> None:
    src = make(name)
    fill(src, ValueStateDescriptor("count", int), KEYS)
    target = make(name)
    target.kv_migration_batch = 16
    target.restore_native([snapshot_handle(src, native=True)])
    calls: list[tuple[str, int, int | None]] = []
    target.on_migration_progress(lambda *a: calls.append(a))
    target.get_state(ValueStateDescriptor("count", float))
    # counted as it goes: the total is known at the last report
    assert calls == [("count", 0, None), ("count", 16, None), ("count", 32, None), ("count", 40, 40)]


def test_a_plan_needs_no_class_of_the_old_job() -> None:
    old = ValueStateDescriptor("visit", _Before).meta()
    old["serializer"]["class"] = "gone.module:Visit"  # the old job's module does not exist here
    plan = plan_state_migration("visit", StateKind.VALUE, ValueStateDescriptor("visit", Visit), None, old)
    assert plan is not None and plan.how == "converted" and plan.changes_data
    data = plan.entry_decoder.encode_column([(3,)])
    assert plan.entry(0)(plan.entry_decoder.decode_column(data, 1)[0]) == Visit(3.0)


def test_a_version_bump_alone_rewrites_nothing_and_is_recorded() -> None:
    old = ValueStateDescriptor("n", int).meta()
    plan = plan_state_migration("n", StateKind.VALUE, ValueStateDescriptor("n", int, version=3), None, old)
    assert plan is not None and not plan.changes_data and plan.how == "unchanged"
    assert plan.lineage[-1]["schema_version"] == 1 and plan.changes == ("schema version 1 → 3",)
    assert plan_state_migration("n", StateKind.VALUE, ValueStateDescriptor("n", int), None, old) is None


def test_two_migrations_for_one_old_schema_are_refused() -> None:
    old = ValueStateDescriptor("n", int).meta()
    d = ValueStateDescriptor(
        "n",
        float,
        version=2,
        migrations=[Migration(float, from_version=1), Migration(float, from_type=int)],
    )
    with pytest.raises(StateMigrationError, match="2 declared migrations apply"):
        plan_state_migration("n", StateKind.VALUE, d, None, old)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"version": 0}, "version must be an int >= 1"),
        ({"version": 2, "migrations": [Migration(float, from_version=2)]}, "must come from an older one"),
        (
            {"version": 3, "migrations": [Migration(float, from_version=1), Migration(int, from_version=1)]},
            "two migrations from one version",
        ),
    ],
)
def test_descriptor_versions_and_migrations_are_checked(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        ValueStateDescriptor("n", float, **kwargs)


def test_a_migration_names_its_schema_once() -> None:
    with pytest.raises(ValueError, match="one of them"):
        Migration(float)
    with pytest.raises(ValueError, match="one of them"):
        Migration(float, from_version=1, from_type=int)
    with pytest.raises(TypeError, match="callable"):
        Migration(3, from_version=1)  # type: ignore[arg-type]
