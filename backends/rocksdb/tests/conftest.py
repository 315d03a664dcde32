"""Fixtures of the RocksDB backend's own tests: a manual clock and a factory of keyed backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from statekit import KeyGroupRange
from statekit.serializers import StrSerializer
from statekit.testing import ManualClock
from statekit_rocksdb import RocksDBKeyedStateBackend, RocksDBStateBackend

MAX_PARALLELISM = 128

Factory = Callable[..., RocksDBKeyedStateBackend]


@pytest.fixture
def clock() -> ManualClock:
    """The clock every backend of the test reads."""
    return ManualClock()


@pytest.fixture
def make_backend(clock: ManualClock, tmp_path: Path) -> Iterator[Factory]:
    """RocksDB keyed backends with str keys, key groups [0, 127] of 128 unless told; closed at teardown."""
    made: list[RocksDBKeyedStateBackend] = []

    def make(
        key_group_range: KeyGroupRange = KeyGroupRange.of(0, MAX_PARALLELISM - 1),
        options: dict[str, Any] | None = None,
        local_dir: Path | None = None,
    ) -> RocksDBKeyedStateBackend:
        b = RocksDBStateBackend(options).create_keyed_backend(
            key_serializer=StrSerializer(),
            key_group_range=key_group_range,
            max_parallelism=MAX_PARALLELISM,
            clock=clock,
            local_dir=str(local_dir or tmp_path / "local"),
        )
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()
