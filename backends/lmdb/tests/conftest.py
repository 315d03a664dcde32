"""Fixtures of the LMDB backend's own tests: a manual clock and a factory of keyed backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from statekit.testing import ManualClock, keyed_backends
from statekit_lmdb import LMDBKeyedStateBackend, LMDBStateBackend

MAX_PARALLELISM = 128

Factory = Callable[..., LMDBKeyedStateBackend]


@pytest.fixture
def clock() -> ManualClock:
    """The clock every backend of the test reads."""
    return ManualClock()


@pytest.fixture
def make_backend(clock: ManualClock, tmp_path: Path) -> Iterator[Factory]:
    """LMDB keyed backends with str keys, key groups [0, 127] of 128 unless told; closed at teardown.

    ``make_backend(key_group_range=None, options=None, local_dir=None)``: ``options`` by short name.
    """
    with keyed_backends(
        LMDBStateBackend, local_dir=tmp_path / "local", clock=clock, max_parallelism=MAX_PARALLELISM
    ) as make:
        yield make


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
