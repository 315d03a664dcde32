"""Fixtures of the heap backend's keyed-state tests: a manual clock and a backend factory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from statekit.backend_api import KeyGroupRange
from statekit.serializers import StrSerializer, TypeSerializer
from statekit.testing import ManualClock
from statekit_heap import HeapKeyedStateBackend

MAX_PARALLELISM = 128
FULL_RANGE = KeyGroupRange.of(0, MAX_PARALLELISM - 1)


BackendFactory = Callable[..., HeapKeyedStateBackend]


@pytest.fixture
def clock() -> ManualClock:
    """The clock shared by every backend the test's factory makes (starts at 1000 ms)."""
    return ManualClock()


@pytest.fixture
def make_backend(clock: ManualClock) -> Iterator[BackendFactory]:
    """A factory of heap keyed backends; str keys, key groups [0, 127] of 128 by default.

    Every backend made is closed at teardown.
    """
    made: list[HeapKeyedStateBackend] = []

    def make(
        *,
        key_group_range: KeyGroupRange = FULL_RANGE,
        max_parallelism: int = MAX_PARALLELISM,
        key_serializer: TypeSerializer | None = None,
        clock: Any = clock,
    ) -> HeapKeyedStateBackend:
        b = HeapKeyedStateBackend(
            key_serializer=key_serializer or StrSerializer(),
            key_group_range=key_group_range,
            max_parallelism=max_parallelism,
            clock=clock,
        )
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


@pytest.fixture
def backend(make_backend: BackendFactory) -> HeapKeyedStateBackend:
    """A heap keyed backend owning every key group, on the test's manual clock."""
    return make_backend()
