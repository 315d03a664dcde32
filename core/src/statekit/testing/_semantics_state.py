"""Kit tests of keyed state semantics (DESIGN.md §5), one behaviour per test, on any backend.

Every test gets its keyed backend from the ``backend`` or ``make_backend``
fixtures of :class:`~statekit.testing.StateBackendTests`, which make it with
the backend factory under test.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest

from .._contracts import SupportsBatchUpdate, SupportsNativeSnapshot
from .._errors import StateAccessError, StateMigrationError
from ..serialization._keygroups import KeyGroupRange, key_group_for_bytes
from ..serialization._serializers import StrSerializer, serializer_for
from ..state._state import (
    VOID_NAMESPACE,
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from ._job import native_snapshot_handle

__all__ = ["KeyedStateSemantics", "Mean", "batch_update_or_skip", "key_with_group"]

INT_NS = serializer_for(int)


class Mean(AggregateFunction[int, tuple[int, int], float]):
    """The mean of added ints; counts its calls so tests can see which ones ran."""

    def __init__(self) -> None:
        """No calls yet."""
        self.created = 0
        self.merged = 0

    def create_accumulator(self) -> tuple[int, int]:
        """``(0, 0)``."""
        self.created += 1
        return (0, 0)

    def add(self, value: int, accumulator: tuple[int, int]) -> tuple[int, int]:
        """Sum and count."""
        return (accumulator[0] + value, accumulator[1] + 1)

    def get_result(self, accumulator: tuple[int, int]) -> float:
        """The mean."""
        return accumulator[0] / accumulator[1]

    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        """Both sums and counts."""
        self.merged += 1
        return (a[0] + b[0], a[1] + b[1])


def key_with_group(pred: Callable[[int], bool], maxp: int = 128) -> str:
    """The first ``str`` key ``k<i>`` whose key group satisfies ``pred``."""
    for i in range(10_000):
        k = f"k{i}"
        if pred(key_group_for_bytes(StrSerializer().serialize(k), maxp)):
            return k
    raise AssertionError("no such key")


def batch_update_or_skip(state: Any) -> Any:
    """``state`` if it offers ``update_batch`` (SupportsBatchUpdate); else the test is skipped."""
    if not isinstance(state, SupportsBatchUpdate):
        pytest.skip("this backend's value state does not offer update_batch (SupportsBatchUpdate)")
    return state


def _value(name: str = "v", tp: Any = int, **kw: Any) -> ValueStateDescriptor[Any]:
    return ValueStateDescriptor(name, tp, **kw)


KIND_DESCRIPTORS: dict[str, Callable[[], StateDescriptor]] = {
    "value": lambda: _value("s"),
    "list": lambda: ListStateDescriptor("s", int),
    "reducing": lambda: ReducingStateDescriptor("s", operator.add, int),
    "aggregating": lambda: AggregatingStateDescriptor("s", Mean(), tuple[int, int]),
    "map": lambda: MapStateDescriptor("s", str, int),
}

MERGEABLE: dict[str, tuple[Callable[[], StateDescriptor], Callable[[list[int]], Any]]] = {
    "list": (lambda: ListStateDescriptor("s", int), lambda vals: sorted(vals)),
    "reducing": (lambda: ReducingStateDescriptor("s", operator.add, int), sum),
    "aggregating": (
        lambda: AggregatingStateDescriptor("s", Mean(), tuple[int, int]),
        lambda vals: sum(vals) / len(vals),
    ),
}


def _fill(kind: str, s: Any, x: int) -> None:
    if kind == "value":
        s.update(x)
    elif kind == "map":
        s.put("u", x)
    else:
        s.add(x)


def _read(kind: str, s: Any) -> Any:
    if kind == "value":
        return s.value()
    if kind == "map":
        return s.get("u")
    if kind == "list":
        return s.get() or None
    return s.get()


def _get(kind: str, s: Any) -> Any:
    got = s.get()
    return sorted(got) if kind == "list" else got


NO_KEY_CALLS: list[tuple[str, Callable[[Any], Any]]] = [
    ("value", lambda s: s.value()),
    ("value", lambda s: s.update(1)),
    ("value", lambda s: s.update(None)),
    ("value", lambda s: s.clear()),
    ("list", lambda s: s.get()),
    ("list", lambda s: s.add(1)),
    ("list", lambda s: s.add_all([1])),
    ("list", lambda s: s.update([1])),
    ("list", lambda s: s.clear()),
    ("reducing", lambda s: s.get()),
    ("reducing", lambda s: s.add(1)),
    ("aggregating", lambda s: s.get()),
    ("aggregating", lambda s: s.add(1)),
    ("map", lambda s: s.get("x")),
    ("map", lambda s: s.put("x", 1)),
    ("map", lambda s: s.put_all({"x": 1})),
    ("map", lambda s: s.contains("x")),
    ("map", lambda s: s.remove("x")),
    ("map", lambda s: list(s.items())),
    ("map", lambda s: s.is_empty()),
    ("map", lambda s: s.clear()),
]

REDECLARATIONS: list[tuple[Callable[[], StateDescriptor], Callable[[], StateDescriptor]]] = [
    (lambda: _value("x", int), lambda: _value("x", str)),
    (lambda: _value("x", int), lambda: ListStateDescriptor("x", int)),
    (lambda: ListStateDescriptor("x", int), lambda: ListStateDescriptor("x", str)),
    (lambda: ListStateDescriptor("x", int), lambda: ReducingStateDescriptor("x", operator.add, int)),
    (lambda: ReducingStateDescriptor("x", operator.add, int), lambda: _value("x", int)),
    (
        lambda: AggregatingStateDescriptor("x", Mean(), tuple[int, int]),
        lambda: ReducingStateDescriptor("x", operator.add, tuple[int, int]),
    ),
    (lambda: MapStateDescriptor("x", str, int), lambda: MapStateDescriptor("x", str, str)),
    (lambda: MapStateDescriptor("x", str, int), lambda: _value("x", dict[str, int])),
]

MUTABLE_DEFAULTS: list[tuple[Any, Any, Callable[[Any], Any]]] = [
    (list[int], [], lambda v: v.append(1)),
    (list[int], [5], lambda v: v.append(1)),
    (dict[str, int], {}, lambda v: v.__setitem__("x", 1)),
    (dict[str, list[int]], {"x": [1]}, lambda v: v["x"].append(2)),
]

BATCH_KEYS = ["a", "b", "a", "c", "d", "a", "b", "e"]
BATCH_CASES: list[tuple[Any, Any, Callable[[Any], Any]]] = [
    (int, 0, lambda v: v + 1),
    (int, None, lambda v: 1 if v is None else v * 2),
    (int, 0, lambda v: None if v >= 2 else v + 1),  # None clears, as update(None) does
    (list[int], [], lambda v: [*v, len(v)]),
]


class KeyedStateSemantics:
    """DESIGN.md §5: value, list, reducing, aggregating and map state; namespaces; misuse.

    Long on purpose: a test suite class, one short test per rule of §5, grouped
    by state kind in the ``# ---`` sections below. A plugin's test class inherits
    every test from the kit classes at once, so splitting this one would only
    scatter the rules of one subject over several files.
    """

    # --- ValueState -----------------------------------------------------------------------------

    def test_value_absent_is_none_without_default(self, backend: Any) -> None:
        s = backend.get_state(_value())
        backend.set_current_key("a")
        assert s.value() is None

    def test_value_update_then_value_per_key(self, backend: Any) -> None:
        s = backend.get_state(_value())
        backend.set_current_key("a")
        s.update(1)
        backend.set_current_key("b")
        s.update(2)
        backend.set_current_key("a")
        assert s.value() == 1
        backend.set_current_key("b")
        assert s.value() == 2
        assert backend.num_entries("v") == 2

    def test_value_update_none_is_clear(self, backend: Any) -> None:
        s = backend.get_state(_value(default=7))
        backend.set_current_key("a")
        s.update(3)
        assert backend.num_entries("v") == 1
        s.update(None)
        assert s.value() == 7
        assert backend.num_entries("v") == 0
        assert list(backend.keys("v")) == []

    def test_value_default_returned_when_absent_stores_nothing(self, backend: Any) -> None:
        s = backend.get_state(_value(default=42))
        backend.set_current_key("a")
        assert s.value() == 42
        assert backend.num_entries("v") == 0

    @pytest.mark.parametrize(("tp", "default", "mutate"), MUTABLE_DEFAULTS)
    def test_value_mutable_default_is_a_fresh_copy(
        self, backend: Any, tp: Any, default: Any, mutate: Callable[[Any], Any]
    ) -> None:
        expected = repr(default)
        d = _value(tp=tp, default=default)
        s = backend.get_state(d)
        backend.set_current_key("a")
        mutate(s.value())
        # Neither the next read, another key's read, nor the descriptor sees the change.
        assert repr(s.value()) == expected
        backend.set_current_key("b")
        assert repr(s.value()) == expected
        assert repr(d.default) == expected
        assert s.value() is not s.value()
        assert backend.num_entries("v") == 0

    def test_value_mutated_default_stored_by_update_does_not_leak(self, backend: Any) -> None:
        s = backend.get_state(_value(tp=list[int], default=[]))
        backend.set_current_key("a")
        v = s.value()
        v.append(1)
        s.update(v)
        backend.set_current_key("b")
        assert s.value() == []
        backend.set_current_key("a")
        assert s.value() == [1]

    def test_value_of_every_built_in_type_round_trips(self, backend: Any) -> None:
        cases: list[tuple[Any, Any]] = [
            (int, -(2**70)),
            (float, 1.5),
            (bool, False),
            (str, "\u00e9\U0001f600"),
            (bytes, b"\x00\xff"),
            (int | None, None),
            (tuple[int, str], (1, "x")),
            (tuple[int, ...], (1, 2, 3)),
            (list[str], ["a", ""]),
            (dict[str, list[int]], {"k": [1], "": []}),
        ]
        states = [backend.get_state(_value(f"v{i}", tp)) for i, (tp, _) in enumerate(cases)]
        backend.set_current_key("a")
        for s, (_, v) in zip(states, cases):
            s.update(v)
        backend.set_current_key("b")
        backend.set_current_key("a")
        for s, (tp, v) in zip(states, cases):
            if v is None:
                assert s.value() is None  # update(None) is clear()
            else:
                assert s.value() == v, tp
                assert type(s.value()) is type(v), tp

    # --- clear() scope ----------------------------------------------------------------------------

    @pytest.mark.parametrize("kind", list(KIND_DESCRIPTORS))
    def test_clear_removes_current_key_and_namespace_only(self, backend: Any, kind: str) -> None:
        s = backend.get_state(KIND_DESCRIPTORS[kind](), namespace_serializer=INT_NS)
        for key in ("a", "b"):
            backend.set_current_key(key)
            for ns in (VOID_NAMESPACE, 1, 2):
                s.set_current_namespace(ns)
                _fill(kind, s, 10)
        assert backend.num_entries("s") == 6
        backend.set_current_key("a")
        s.set_current_namespace(1)
        s.clear()
        assert _read(kind, s) is None
        assert backend.num_entries("s") == 5
        for key in ("a", "b"):
            backend.set_current_key(key)
            for ns in (VOID_NAMESPACE, 1, 2):
                if (key, ns) == ("a", 1):
                    continue
                s.set_current_namespace(ns)
                assert _read(kind, s) is not None, (key, ns)
        assert sorted(backend.keys("s", 1)) == ["b"]
        assert sorted(backend.keys("s", 2)) == ["a", "b"]
        assert sorted(backend.keys("s")) == ["a", "b"]

    @pytest.mark.parametrize("kind", list(KIND_DESCRIPTORS))
    def test_clear_of_absent_state_is_a_no_op(self, backend: Any, kind: str) -> None:
        s = backend.get_state(KIND_DESCRIPTORS[kind]())
        backend.set_current_key("b")
        _fill(kind, s, 1)
        backend.set_current_key("a")
        s.clear()
        assert backend.num_entries("s") == 1
        backend.set_current_key("b")
        assert _read(kind, s) is not None

    # --- ListState ------------------------------------------------------------------------------

    def test_list_get_is_empty_list_when_absent(self, backend: Any) -> None:
        s = backend.get_state(ListStateDescriptor("l", int))
        backend.set_current_key("a")
        assert s.get() == []

    def test_list_add_add_all_update(self, backend: Any) -> None:
        s = backend.get_state(ListStateDescriptor("l", int))
        backend.set_current_key("a")
        s.add(1)
        s.add(2)
        s.add_all([3, 4])
        assert s.get() == [1, 2, 3, 4]
        s.update([9, 8])
        assert s.get() == [9, 8]
        backend.set_current_key("b")
        assert s.get() == []
        s.add_all(iter([5, 6]))  # any iterable
        assert s.get() == [5, 6]
        assert backend.num_entries("l") == 2

    def test_list_get_returns_a_copy(self, backend: Any) -> None:
        s = backend.get_state(ListStateDescriptor("l", int))
        backend.set_current_key("a")
        s.add_all([1, 2])
        s.get().append(3)
        assert s.get() == [1, 2]

    def test_list_add_none_raises(self, backend: Any) -> None:
        s = backend.get_state(ListStateDescriptor("l", int))
        backend.set_current_key("a")
        s.add(1)
        with pytest.raises(ValueError):
            s.add(None)
        assert s.get() == [1]

    @pytest.mark.parametrize("method", ["add_all", "update"])
    @pytest.mark.parametrize("values", [[None], [1, None], [None, 2, 3]])
    def test_list_none_element_raises_and_changes_nothing(
        self, backend: Any, method: str, values: list[Any]
    ) -> None:
        s = backend.get_state(ListStateDescriptor("l", int))
        backend.set_current_key("a")
        s.add(7)
        with pytest.raises(ValueError):
            getattr(s, method)(values)
        assert s.get() == [7]
        backend.set_current_key("b")
        with pytest.raises(ValueError):
            getattr(s, method)(values)
        assert s.get() == []
        assert backend.num_entries("l") == 1

    def test_list_update_empty_clears(self, backend: Any) -> None:
        s = backend.get_state(ListStateDescriptor("l", int))
        backend.set_current_key("a")
        s.add_all([1, 2])
        assert backend.num_entries("l") == 1
        s.update([])
        assert s.get() == []
        assert backend.num_entries("l") == 0
        assert list(backend.keys("l")) == []

    def test_list_add_all_empty_is_a_no_op(self, backend: Any) -> None:
        s = backend.get_state(ListStateDescriptor("l", int))
        backend.set_current_key("a")
        s.add_all([])
        assert backend.num_entries("l") == 0
        assert list(backend.keys("l")) == []
        s.add_all([1])
        s.add_all([])
        assert s.get() == [1]
        assert backend.num_entries("l") == 1

    # --- ReducingState / AggregatingState -----------------------------------------------------------

    def test_reducing_get_none_when_empty_then_reduces(self, backend: Any) -> None:
        s = backend.get_state(ReducingStateDescriptor("r", lambda a, b: a * 10 + b, int))
        backend.set_current_key("a")
        assert s.get() is None
        s.add(1)
        assert s.get() == 1  # created from the first value, not reduced with anything
        s.add(2)
        s.add(3)
        assert s.get() == 123
        backend.set_current_key("b")
        assert s.get() is None
        s.clear()
        backend.set_current_key("a")
        s.clear()
        assert s.get() is None
        assert backend.num_entries("r") == 0

    def test_aggregating_get_none_when_empty_then_aggregates(self, backend: Any) -> None:
        fn = Mean()
        s = backend.get_state(AggregatingStateDescriptor("a", fn, tuple[int, int]))
        backend.set_current_key("a")
        assert s.get() is None
        assert fn.created == 0
        s.add(2)
        assert fn.created == 1
        assert s.get() == 2.0
        s.add(4)
        s.add(6)
        assert fn.created == 1  # the accumulator is reused once created
        assert s.get() == 4.0
        backend.set_current_key("b")
        assert s.get() is None
        s.add(10)
        assert fn.created == 2
        assert s.get() == 10.0
        backend.set_current_key("a")
        assert s.get() == 4.0
        s.clear()
        assert s.get() is None
        s.add(1)
        assert fn.created == 3
        assert s.get() == 1.0

    @pytest.mark.parametrize("kind", ["reducing", "aggregating"])
    def test_reducing_and_aggregating_add_none_raises(self, backend: Any, kind: str) -> None:
        s = backend.get_state(KIND_DESCRIPTORS[kind]())
        backend.set_current_key("a")
        s.add(2)
        with pytest.raises(ValueError):
            s.add(None)
        assert s.get() in (2, 2.0)

    # --- MapState ---------------------------------------------------------------------------------

    def test_map_basics(self, backend: Any) -> None:
        s = backend.get_state(MapStateDescriptor("m", str, int))
        backend.set_current_key("a")
        assert s.get("x") is None
        assert not s.contains("x")
        assert s.is_empty()
        assert list(s.items()) == [] and list(s.keys()) == [] and list(s.values()) == []
        s.put("x", 1)
        s.put_all({"y": 2, "z": 3})
        s.put("x", 4)
        assert s.get("x") == 4
        assert s.contains("y")
        assert not s.is_empty()
        assert dict(s.items()) == {"x": 4, "y": 2, "z": 3}
        assert sorted(s.keys()) == ["x", "y", "z"]
        assert sorted(s.values()) == [2, 3, 4]
        s.remove("y")
        s.remove("nope")
        assert not s.contains("y")
        assert s.get("y") is None
        assert dict(s.items()) == {"x": 4, "z": 3}
        backend.set_current_key("b")
        assert s.is_empty()
        assert s.get("x") is None
        assert backend.num_entries("m") == 1

    def test_map_none_values_are_values(self, backend: Any) -> None:
        s = backend.get_state(MapStateDescriptor("m", str, int))
        backend.set_current_key("a")
        s.put("x", None)
        s.put_all({"y": None})
        assert s.contains("x") and s.contains("y")
        assert s.get("x") is None
        assert not s.is_empty()
        assert dict(s.items()) == {"x": None, "y": None}
        assert list(s.values()) == [None, None]
        assert backend.num_entries("m") == 1

    def test_map_removing_last_entry_removes_the_state(self, backend: Any) -> None:
        s = backend.get_state(MapStateDescriptor("m", str, int))
        backend.set_current_key("a")
        s.put_all({"x": 1, "y": None})
        backend.set_current_key("b")
        s.put("x", 1)
        assert backend.num_entries("m") == 2
        backend.set_current_key("a")
        s.remove("x")
        assert backend.num_entries("m") == 2
        s.remove("y")
        assert s.is_empty()
        assert backend.num_entries("m") == 1
        assert sorted(backend.keys("m")) == ["b"]

    def test_map_put_all_empty_creates_nothing(self, backend: Any) -> None:
        s = backend.get_state(MapStateDescriptor("m", str, int))
        backend.set_current_key("a")
        s.put_all({})
        assert backend.num_entries("m") == 0
        assert s.is_empty()

    def test_map_iteration_returns_snapshots_of_the_map(self, backend: Any) -> None:
        s = backend.get_state(MapStateDescriptor("m", str, int))
        backend.set_current_key("a")
        s.put_all({"x": 1, "y": 2})
        for k in s.keys():  # noqa: SIM118 - removing while iterating keys() must be safe
            s.remove(k)
        assert s.is_empty()
        assert backend.num_entries("m") == 0

    # --- namespaces ---------------------------------------------------------------------------------

    def test_namespaces_are_separate(self, backend: Any) -> None:
        s = backend.get_state(_value(), namespace_serializer=INT_NS)
        backend.set_current_key("a")
        s.update(0)  # the default namespace is the void namespace
        s.set_current_namespace(1)
        assert s.value() is None
        s.update(1)
        s.set_current_namespace(2)
        s.update(2)
        s.set_current_namespace(VOID_NAMESPACE)
        assert s.value() == 0
        s.set_current_namespace(1)
        assert s.value() == 1
        assert backend.num_entries("v") == 3
        assert list(backend.keys("v", 1)) == ["a"]
        assert list(backend.keys("v", 3)) == []

    def test_namespace_survives_a_key_switch(self, backend: Any) -> None:
        s = backend.get_state(_value(), namespace_serializer=INT_NS)
        s.set_current_namespace(5)
        backend.set_current_key("a")
        s.update(1)
        backend.set_current_key("b")
        s.update(2)
        assert sorted(backend.keys("v", 5)) == ["a", "b"]
        assert list(backend.keys("v")) == []

    def test_namespace_without_serializer_is_refused(self, backend: Any) -> None:
        s = backend.get_state(_value())
        with pytest.raises(StateAccessError):
            s.set_current_namespace(1)

    def _merge_setup(self, backend: Any, desc: StateDescriptor, values_by_ns: dict[int, list[int]]) -> Any:
        s = backend.get_state(desc, namespace_serializer=INT_NS)
        for key in ("other", "a"):
            backend.set_current_key(key)
            for ns, vals in values_by_ns.items():
                s.set_current_namespace(ns)
                for v in vals:
                    s.add(v)
        s.set_current_namespace(99)  # the current namespace must survive the merge
        return s

    @pytest.mark.parametrize("kind", list(MERGEABLE))
    @pytest.mark.parametrize("target_in_sources", [False, True])
    def test_merge_namespaces(self, backend: Any, kind: str, target_in_sources: bool) -> None:
        make, expect = MERGEABLE[kind]
        data = {1: [1, 2], 2: [3], 3: [4, 5], 4: [100]}
        s = self._merge_setup(backend, make(), data)
        before = backend.num_entries("s")
        sources = [1, 2, 3] if target_in_sources else [2, 3]
        s.merge_namespaces(1, sources)
        s.set_current_namespace(1)
        assert _get(kind, s) == expect([1, 2, 3, 4, 5])
        for ns in (2, 3):
            s.set_current_namespace(ns)
            assert s.get() in (None, []), ns  # sources are cleared
        s.set_current_namespace(4)
        assert _get(kind, s) == expect([100])  # not a source: untouched
        backend.set_current_key("other")  # other keys: untouched
        for ns, vals in data.items():
            s.set_current_namespace(ns)
            assert _get(kind, s) == expect(vals)
        assert backend.num_entries("s") == before - 2
        assert sorted(backend.keys("s", 1)) == ["a", "other"]
        assert sorted(backend.keys("s", 2)) == ["other"]

    def test_merged_list_is_target_then_sources_in_order(self, backend: Any) -> None:
        s = self._merge_setup(backend, ListStateDescriptor("s", int), {1: [1, 2], 2: [3], 3: [4, 5]})
        s.merge_namespaces(2, [3, 1])
        s.set_current_namespace(2)
        assert s.get() == [3, 4, 5, 1, 2]

    @pytest.mark.parametrize("kind", list(MERGEABLE))
    def test_merge_into_empty_target_keeps_current_namespace(self, backend: Any, kind: str) -> None:
        make, expect = MERGEABLE[kind]
        s = self._merge_setup(backend, make(), {1: [1], 2: [2, 3], 99: [50]})
        s.merge_namespaces(7, [1, 2])
        assert _get(kind, s) == expect([50])  # namespace 99 is still current
        s.set_current_namespace(7)
        assert _get(kind, s) == expect([1, 2, 3])
        assert sorted(backend.keys("s", 7)) == ["a"]
        assert list(backend.keys("s", 1)) == ["other"]

    @pytest.mark.parametrize("kind", list(MERGEABLE))
    def test_merge_of_empty_sources_changes_nothing(self, backend: Any, kind: str) -> None:
        make, expect = MERGEABLE[kind]
        s = self._merge_setup(backend, make(), {1: [5]})
        s.merge_namespaces(1, [2, 3])
        s.merge_namespaces(1, [])
        s.set_current_namespace(1)
        assert _get(kind, s) == expect([5])
        assert backend.num_entries("s") == 2

    def test_aggregating_merge_uses_merge_function(self, backend: Any) -> None:
        fn = Mean()
        s = self._merge_setup(backend, AggregatingStateDescriptor("s", fn, tuple[int, int]), {1: [2], 2: [4]})
        s.merge_namespaces(1, [2])
        assert fn.merged == 1
        s.set_current_namespace(1)
        assert s.get() == 3.0

    # --- keys / num_entries ----------------------------------------------------------------------------

    def test_keys_and_num_entries(self, backend: Any) -> None:
        v = backend.get_state(_value(), namespace_serializer=INT_NS)
        m = backend.get_state(MapStateDescriptor("m", str, int))
        keys = [f"k{i}" for i in range(50)]
        for k in keys:
            backend.set_current_key(k)
            v.update(len(k))
            m.put_all({"p": 1, "q": 2})  # one entry per key, whatever the map's size
        for k in keys[:10]:
            backend.set_current_key(k)
            v.set_current_namespace(5)
            v.update(1)
            v.set_current_namespace(VOID_NAMESPACE)
        assert sorted(backend.keys("v")) == sorted(keys)
        assert sorted(backend.keys("v", 5)) == sorted(keys[:10])
        assert backend.num_entries("v") == 60
        assert backend.num_entries("m") == 50
        assert backend.num_entries() == 110
        assert backend.num_entries("undeclared") == 0
        with pytest.raises(StateAccessError):
            backend.keys("undeclared")

    def test_non_str_keys(self, make_backend: Any) -> None:
        b = make_backend(key_serializer=serializer_for(tuple[int, str]))
        s = b.get_state(_value())
        for i in range(20):
            b.set_current_key((i, "x"))
            s.update(i)
        b.set_current_key((3, "x"))
        assert s.value() == 3
        assert sorted(b.keys("v")) == [(i, "x") for i in range(20)]

    # --- misuse -------------------------------------------------------------------------------------

    @pytest.mark.parametrize(("kind", "call"), NO_KEY_CALLS)
    def test_no_current_key_raises(self, backend: Any, kind: str, call: Callable[[Any], Any]) -> None:
        s = backend.get_state(KIND_DESCRIPTORS[kind]())
        with pytest.raises(StateAccessError):
            call(s)
        assert backend.num_entries() == 0

    @pytest.mark.parametrize("kind", ["value", "list", "map"])
    def test_no_current_key_raises_with_mutable_values(self, backend: Any, kind: str) -> None:
        """Also where a read would hand out a copy of a mutable value, or a mutable default."""
        descs: dict[str, Callable[[], StateDescriptor]] = {
            "value": lambda: _value("s", list[int], default=[]),
            "list": lambda: ListStateDescriptor("s", list[int]),
            "map": lambda: MapStateDescriptor("s", str, list[int]),
        }
        s = backend.get_state(descs[kind]())
        with pytest.raises(StateAccessError):
            _read(kind, s)

    def test_current_key_group_without_key_raises(self, backend: Any) -> None:
        with pytest.raises(StateAccessError):
            _ = backend.current_key_group

    def test_unhashable_key_raises(self, backend: Any) -> None:
        with pytest.raises(StateAccessError):
            backend.set_current_key(["not", "hashable"])

    def test_key_outside_key_group_range_raises(self, make_backend: Any) -> None:
        b = make_backend(key_group_range=KeyGroupRange.of(0, 63))
        s = b.get_state(_value())
        inside = key_with_group(lambda kg: kg < 64)
        outside = key_with_group(lambda kg: kg >= 64)
        b.set_current_key(inside)
        s.update(1)
        with pytest.raises(StateAccessError):
            b.set_current_key(outside)
        # The failed switch changed nothing: the previous key is still current.
        assert b.get_current_key() == inside
        assert s.value() == 1

    @pytest.mark.parametrize(("first", "second"), REDECLARATIONS)
    def test_redeclaring_a_state_with_another_type_raises(
        self, backend: Any, first: Callable[[], StateDescriptor], second: Callable[[], StateDescriptor]
    ) -> None:
        s = backend.get_state(first())
        with pytest.raises(StateMigrationError):
            backend.get_state(second())
        assert backend.get_state(first()) is s  # the same declaration is fine

    # --- the optional batched update -----------------------------------------------------------------

    @pytest.mark.parametrize(("tp", "default", "fn"), BATCH_CASES)
    def test_update_batch_equals_per_key_path(
        self, make_backend: Any, tp: Any, default: Any, fn: Callable[[Any], Any]
    ) -> None:
        batched, looped = make_backend(), make_backend()
        sb = batch_update_or_skip(batched.get_state(_value(tp=tp, default=default)))
        sl = looped.get_state(_value(tp=tp, default=default))
        for b, s in ((batched, sb), (looped, sl)):
            b.set_current_key("b")
            s.update(fn(s.value()))
        out_b = sb.update_batch(iter(BATCH_KEYS), fn)
        out_l = []
        for k in BATCH_KEYS:
            looped.set_current_key(k)
            new = fn(sl.value())
            sl.update(new)
            out_l.append(new)
        assert out_b == out_l
        assert batched.get_current_key() == BATCH_KEYS[-1]
        for b in (batched, looped):
            b.set_current_key("z")
        dump = []
        for b, s in ((batched, sb), (looped, sl)):
            d = {}
            for k in sorted(b.keys("v")):
                b.set_current_key(k)
                d[k] = s.value()
            dump.append(d)
        assert dump[0] == dump[1]
        assert batched.num_entries() == looped.num_entries()

    @pytest.mark.parametrize("changed", [False, True], ids=["as-remembered", "changed-since"])
    def test_update_batch_over_keys_a_runner_remembered_equals_per_key_path(
        self, make_backend: Any, changed: bool
    ) -> None:
        """The Spark runner remembers a batch's keys with their groups before the function's bulk update.

        A backend may take the groups as remembered for that list; a list changed
        in place since (a function rewriting its keys) must get each key's own.
        """
        batched, looped = make_backend(), make_backend()
        sb = batch_update_or_skip(batched.get_state(_value(default=0)))
        sl = looped.get_state(_value(default=0))
        native = isinstance(batched, SupportsNativeSnapshot)
        if native:  # as in the runner, where every batch ends in one
            native_snapshot_handle(batched)
        keys = [f"r{i % 7}" for i in range(30)]
        ser = batched.key_serializer
        remember = getattr(batched, "remember_key_groups", None)
        if remember is not None:
            remember(keys, [key_group_for_bytes(ser.serialize(k), batched.max_parallelism) for k in keys])
        if changed:
            keys[4] = keys[5] = "elsewhere"
        out_b = sb.update_batch(keys, lambda v: v + 1)
        out_l = []
        for k in keys:
            looped.set_current_key(k)
            sl.update(sl.value() + 1)
            out_l.append(sl.value())
        assert out_b == out_l
        assert batched.get_current_key() == keys[-1]
        for k in sorted(set(keys)):
            batched.set_current_key(k)
            looped.set_current_key(k)
            assert sb.value() == sl.value(), k
        assert batched.num_entries() == looped.num_entries()

    def test_update_batch_outside_key_group_range_raises(self, make_backend: Any) -> None:
        b = make_backend(key_group_range=KeyGroupRange.of(0, 63))
        s = batch_update_or_skip(b.get_state(_value()))
        with pytest.raises(StateAccessError):
            s.update_batch(
                [key_with_group(lambda kg: kg < 64), key_with_group(lambda kg: kg >= 64)], lambda v: 5
            )

    def test_update_batch_of_no_keys_changes_nothing(self, backend: Any) -> None:
        s = batch_update_or_skip(backend.get_state(_value(default=0)))
        backend.set_current_key("a")
        s.update(3)
        assert s.update_batch([], lambda v: v + 1) == []
        assert backend.get_current_key() == "a"
        assert s.value() == 3
        assert backend.num_entries() == 1
