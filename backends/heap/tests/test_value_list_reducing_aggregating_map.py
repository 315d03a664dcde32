"""Keyed state on the heap backend, beyond the conformance kit.

The semantics every backend shares (DESIGN.md section 5) are the kit's
(``statekit.testing``), run against every installed backend by
``tests/test_conformance.py``; these cases cover what the heap backend does
its own way: stored defaults, merges, mutable values, ``update_batch``.
"""

from __future__ import annotations

import operator
from typing import Any

import pytest

from statekit import (
    AggregateFunction,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateAccessError,
    ValueStateDescriptor,
    serializer_for,
)

INT_NS = serializer_for(int)


class Mean(AggregateFunction[int, tuple[int, int], float]):
    """The mean of added ints; counts its calls so tests can see which ones ran."""

    def __init__(self) -> None:
        self.created = 0
        self.merged = 0

    def create_accumulator(self) -> tuple[int, int]:
        self.created += 1
        return (0, 0)

    def add(self, value: int, acc: tuple[int, int]) -> tuple[int, int]:
        return (acc[0] + value, acc[1] + 1)

    def get_result(self, acc: tuple[int, int]) -> float:
        return acc[0] / acc[1]

    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        self.merged += 1
        return (a[0] + b[0], a[1] + b[1])


def value_desc(name: str = "v", tp: Any = int, **kw: Any) -> ValueStateDescriptor[Any]:
    return ValueStateDescriptor(name, tp, **kw)


# --- ValueState ---------------------------------------------------------------------


def test_value_immutable_default_returned_when_absent(backend):
    s = backend.get_state(value_desc(default=42))
    backend.set_current_key("a")
    assert s.value() == 42
    assert backend.num_entries("v") == 0  # reading the default stores nothing


# --- namespaces -------------------------------------------------------------------------


def _merge_setup(backend, desc, values_by_ns):
    s = backend.get_state(desc, namespace_serializer=INT_NS)
    backend.set_current_key("other")
    for ns, vals in values_by_ns.items():
        s.set_current_namespace(ns)
        for v in vals:
            s.add(v)
    backend.set_current_key("a")
    for ns, vals in values_by_ns.items():
        s.set_current_namespace(ns)
        for v in vals:
            s.add(v)
    s.set_current_namespace(99)  # the current namespace must survive the merge
    return s


MERGEABLE = {
    "list": (lambda: ListStateDescriptor("s", int), lambda vals: sorted(vals)),
    "reducing": (lambda: ReducingStateDescriptor("s", operator.add, int), sum),
    "aggregating": (
        lambda: AggregatingStateDescriptor("s", Mean(), tuple[int, int]),
        lambda vals: sum(vals) / len(vals),
    ),
}


def _get(kind: str, s: Any) -> Any:
    got = s.get()
    return sorted(got) if kind == "list" else got


@pytest.mark.parametrize("kind", list(MERGEABLE))
def test_merge_into_empty_target_and_keeps_current_namespace(backend, kind):
    make, expect = MERGEABLE[kind]
    s = _merge_setup(backend, make(), {1: [1], 2: [2, 3], 99: [50]})
    s.merge_namespaces(7, [1, 2])
    assert _get(kind, s) == expect([50])  # namespace 99 is still current
    s.set_current_namespace(7)
    assert _get(kind, s) == expect([1, 2, 3])
    assert sorted(backend.keys("s", 7)) == ["a"]
    assert list(backend.keys("s", 1)) == ["other"]


# --- misuse -----------------------------------------------------------------------------


def _read(kind: str, s: Any) -> Any:
    if kind == "value":
        return s.value()
    if kind == "map":
        return s.get("u")
    if kind == "list":
        return s.get() or None
    return s.get()


@pytest.mark.parametrize("kind", ["value", "list", "map"])
def test_no_current_key_raises_with_mutable_values(backend, kind):
    desc = {
        "value": lambda: value_desc("s", list[int], default=[]),
        "list": lambda: ListStateDescriptor("s", list[int]),
        "map": lambda: MapStateDescriptor("s", str, list[int]),
    }[kind]()
    s = backend.get_state(desc)
    with pytest.raises(StateAccessError):
        _read(kind, s)


# --- update_batch -----------------------------------------------------------------------


def test_update_batch_empty_changes_nothing(backend):
    s = backend.get_state(value_desc(default=0))
    backend.set_current_key("a")
    s.update(3)
    assert s.update_batch([], lambda v: v + 1) == []
    assert backend.get_current_key() == "a"
    assert s.value() == 3
