"""Fixtures of the LMDB backend's own tests: a manual clock and a factory of keyed backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from statekit import KeyGroupRange
from statekit.serializers import StrSerializer
from statekit.testing import ManualClock
from statekit_lmdb import LMDBKeyedStateBackend, LMDBStateBackend

MAX_PARALLELISM = 128

Factory = Callable[..., LMDBKeyedStateBackend]


@pytest.fixture
def clock() -> ManualClock:
    """The clock every backend of the test reads."""
    return ManualClock()


@pytest.fixture
def make_backend(clock: ManualClock, tmp_path: Path) -> Iterator[Factory]:
    """LMDB keyed backends with str keys, key groups [0, 127] of 128 unless told; closed at teardown."""
    made: list[LMDBKeyedStateBackend] = []

    def make(
        key_group_range: KeyGroupRange = KeyGroupRange.of(0, MAX_PARALLELISM - 1),
        options: dict[str, Any] | None = None,
        local_dir: Path | None = None,
    ) -> LMDBKeyedStateBackend:
        b = LMDBStateBackend(options).create_keyed_backend(
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


def _raw_entries(backend: LMDBKeyedStateBackend, state: str) -> list[tuple[bytes, bytes]]:
    backend.kv_write_buffered()
    col = backend.kv_column(state, create=False)
    if col is None:
        return []
    with backend.env.begin(db=col.engine.db) as txn:
        return list(txn.cursor())


@pytest.fixture
def raw_entries() -> Callable[[LMDBKeyedStateBackend, str], list[tuple[bytes, bytes]]]:
    """``raw_entries(backend, state)``: every (key, value) LMDB holds for ``state``, buffer committed."""
    return _raw_entries
