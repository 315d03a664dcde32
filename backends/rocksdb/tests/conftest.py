"""Fixtures of the RocksDB backend's own tests: a manual clock and a factory of keyed backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from statekit.testing import ManualClock, keyed_backends
from statekit_rocksdb import RocksDBKeyedStateBackend, RocksDBStateBackend

MAX_PARALLELISM = 128

Factory = Callable[..., RocksDBKeyedStateBackend]


@pytest.fixture
def clock() -> ManualClock:
    """The clock every backend of the test reads."""
    return ManualClock()


@pytest.fixture
def make_backend(clock: ManualClock, tmp_path: Path) -> Iterator[Factory]:
    """RocksDB keyed backends with str keys, key groups [0, 127] of 128 unless told; closed at teardown.

    ``make_backend(key_group_range=None, options=None, local_dir=None)``: ``options`` by short name.
    """
    with keyed_backends(
        RocksDBStateBackend, local_dir=tmp_path / "local", clock=clock, max_parallelism=MAX_PARALLELISM
    ) as make:
        yield make


def _raw_entries(backend: RocksDBKeyedStateBackend, state: str) -> list[tuple[bytes, bytes]]:
    backend.kv_write_buffered()
    cf = backend.db.get_column_family(f"state:{state}")
    try:
        return list(cf.items())
    finally:
        cf.close()


def _raw_count(backend: RocksDBKeyedStateBackend, state: str = "v") -> int:
    cf = backend.db.get_column_family(f"state:{state}")
    try:
        return sum(1 for _ in cf.keys())
    finally:
        cf.close()


@pytest.fixture
def raw_entries() -> Callable[[RocksDBKeyedStateBackend, str], list[tuple[bytes, bytes]]]:
    """``raw_entries(backend, state)``: every (key, value) RocksDB holds for ``state``, buffer written."""
    return _raw_entries


@pytest.fixture
def raw_count() -> Callable[..., int]:
    """``raw_count(backend, state="v")``: entries RocksDB holds for ``state`` (the buffer is not written)."""
    return _raw_count
