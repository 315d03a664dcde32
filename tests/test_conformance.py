"""The conformance kit against every installed backend and checkpoint storage.

Backends and storages are found through the ``statekit`` entry points, so
installing a plugin adds it to this matrix. Each backend runs the whole
:class:`~statekit.testing.StateBackendTests`; each storage runs
:class:`~statekit.testing.CheckpointStorageTests` with every backend writing
the state. A storage this file has no configuration for gets a temporary
directory for each of its options whose name ends in ``-dir``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statekit import default_registry
from statekit.testing import CheckpointStorageTests, StateBackendTests

REGISTRY = default_registry()
BACKENDS = sorted(REGISTRY.backends())
SESSION = uuid.uuid4().hex[:8]


def _storage_kinds() -> list[str]:
    kinds = []
    for name in sorted(REGISTRY.storages()):
        if name == "filesystem":
            kinds += ["filesystem-local", "filesystem-memory", "filesystem-s3"]
        else:
            kinds.append(name)
    return kinds


STORAGE_KINDS = _storage_kinds()


def storage_options(kind: str, root: Path, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """The storage name and options for one kind of storage; savepoints always configured."""
    if kind == "jobmanager":
        return "jobmanager", {"savepoints-dir": str(root / "savepoints")}
    if kind == "filesystem-local":
        return "filesystem", {
            "checkpoints-dir": str(root / "chk"),
            "savepoints-dir": str(root / "savepoints"),
        }
    if kind == "filesystem-memory":
        base = f"memory://statekit-conformance/{SESSION}/{uuid.uuid4().hex[:8]}"
        return "filesystem", {"checkpoints-dir": f"{base}/chk", "savepoints-dir": f"{base}/savepoints"}
    if kind == "filesystem-s3":
        s3 = request.getfixturevalue("s3_endpoint")
        base = f"s3://{s3['bucket']}/conformance-{uuid.uuid4().hex[:8]}"
        return "filesystem", {
            "checkpoints-dir": f"{base}/chk",
            "savepoints-dir": f"{base}/savepoints",
            "storage-options": json.dumps({"client_kwargs": {"endpoint_url": s3["endpoint_url"]}}),
        }
    # A storage plugin we know nothing about: a fresh directory for every *-dir option.
    spec = REGISTRY.storage_spec(kind)
    return kind, {o.name: str(root / o.name) for o in spec.options if o.name.endswith("-dir")}


class TestBackendConformance(StateBackendTests):
    """Every semantic test and named property, on every installed backend."""

    @pytest.fixture(params=BACKENDS)
    def backend_factory(self, request: pytest.FixtureRequest) -> Callable[[], Any]:
        name = request.param
        return lambda: REGISTRY.create_backend(name)


class TestStorageConformance(CheckpointStorageTests):
    """The storage contract and properties on every installed storage, written by every backend."""

    @pytest.fixture(params=BACKENDS)
    def backend_factory(self, request: pytest.FixtureRequest) -> Callable[[], Any]:
        name = request.param
        return lambda: REGISTRY.create_backend(name)

    @pytest.fixture(params=STORAGE_KINDS)
    def storage_factory(self, request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Any]:
        name, options = storage_options(request.param, tmp_path, request)
        return lambda: REGISTRY.create_storage(name, options)


def test_the_matrix_holds_every_installed_plugin() -> None:
    assert set(BACKENDS) == set(REGISTRY.backends()) and BACKENDS
    assert {k.split("-")[0] for k in STORAGE_KINDS} >= set(REGISTRY.storages())
    # What this repository installs (make install) is found through its entry points.
    assert {"heap", "sqlite"} <= set(BACKENDS)
    assert {"jobmanager", "filesystem-local", "filesystem-memory", "filesystem-s3"} <= set(STORAGE_KINDS)
