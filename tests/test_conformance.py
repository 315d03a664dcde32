"""The conformance kit against every installed backend and checkpoint storage.

Backends and storages are found through the ``statekit`` entry points, so
installing a plugin adds it to this matrix. Each backend runs the whole
:class:`~statekit.testing.StateBackendTests`; each storage runs
:class:`~statekit.testing.CheckpointStorageTests` with every backend writing
the state. A storage this file has no configuration for gets a temporary
directory for each of its options whose name ends in ``-dir``.

S3 is moto's server in this process, where every request costs milliseconds: under
``ci`` the storage properties on ``filesystem-s3`` run a third of the profile's
examples (the other storages run FilesystemStorage's code with all of them);
``nightly`` runs all of them there too. Under ``ci`` the storage properties also run
a third of the examples where neither the backend is the default (heap) nor the
storage a local directory: every backend's files go through a real file system at
full depth, every storage holds the default backend's at full depth, and the rest
of the matrix (what ``rocksdb`` writes into ``jobmanager``, say) at a third.

The state machines make and drop backends by the hundred; their working directories
(``kit_scratch``) are in memory where the machine has room there (Linux's /dev/shm),
or the fsyncs of RocksDB and LMDB creating and closing throwaway instances take longer
than the checks. Checkpoint storages stay where the storage kinds put them.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from statekit import default_registry
from statekit.testing import (
    CheckpointStorageTests,
    ConformanceTarget,
    StateBackendTests,
    kit_settings,
)

REGISTRY = default_registry()
BACKENDS = sorted(REGISTRY.backends())
#: Backends run once more with options that reach, on the kit's small states, what their defaults
#: reach at scale: the heap's checkpoints as deltas however small its base (chains continued after a
#: claimed rescale, deltas of TTL states), with a base every fifth checkpoint.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = (
    {"heap-deltas": ("heap", {"max-delta-ratio": 1000.0, "max-deltas": 4})} if "heap" in BACKENDS else {}
)
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


#: Where the backends' working copies go when it has this much room: memory, without fsyncs.
#: A run keeps a few MB there at a time; a container's /dev/shm (64 MB by default) is passed over.
MEMORY_FS, MEMORY_FS_ROOM = Path("/dev/shm"), 512 << 20


class ScratchInMemory:
    """``kit_scratch`` in MEMORY_FS when it has MEMORY_FS_ROOM free, else on disk as the kit has it."""

    @pytest.fixture
    def kit_scratch(self, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
        if not MEMORY_FS.is_dir() or shutil.disk_usage(MEMORY_FS).free < MEMORY_FS_ROOM:
            yield tmp_path_factory.mktemp("statekit-kit")
            return
        scratch = Path(tempfile.mkdtemp(prefix="statekit-kit-", dir=MEMORY_FS))
        try:
            yield scratch
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


class TestBackendConformance(ScratchInMemory, StateBackendTests):
    """Every semantic test and named property, on every installed backend (and VARIANTS)."""

    @pytest.fixture
    def tmp_path(self, kit_scratch: Path) -> Path:
        """Where ``make_backend`` puts each backend's local directory (this class has no other use)."""
        return kit_scratch

    @pytest.fixture(params=BACKENDS + sorted(VARIANTS))
    def backend_factory(self, request: pytest.FixtureRequest) -> Callable[[], Any]:
        name, options = VARIANTS.get(request.param, (request.param, {}))
        return lambda: REGISTRY.create_backend(name, options)


class StorageFactory:
    """Makes one kind of storage; says which, so that the kind can set the depth of its properties."""

    def __init__(self, kind: str, name: str, options: dict[str, Any]) -> None:
        self.kind, self.name, self.options = kind, name, options

    def __call__(self) -> Any:
        return REGISTRY.create_storage(self.name, self.options)


def examples_for(kind: str, backend: str) -> int | None:
    """The examples of a storage property on ``kind`` written by ``backend``; None: the loaded profile's."""
    if settings.get_current_profile_name() == "nightly":
        return None
    if kind != "filesystem-s3" and (backend == "heap" or kind == "filesystem-local"):
        return None
    return max(1, settings.default.max_examples // 3)


class TestStorageConformance(ScratchInMemory, CheckpointStorageTests):
    """The storage contract and properties on every installed storage, written by every backend."""

    @pytest.fixture(params=BACKENDS)
    def backend_factory(self, request: pytest.FixtureRequest) -> Callable[[], Any]:
        name = request.param
        return lambda: REGISTRY.create_backend(name)

    @pytest.fixture(params=STORAGE_KINDS)
    def storage_factory(self, request: pytest.FixtureRequest, tmp_path: Path) -> StorageFactory:
        name, options = storage_options(request.param, tmp_path, request)
        return StorageFactory(request.param, name, options)

    def property_settings(self, prop: str, target: ConformanceTarget, steps: int) -> settings:
        examples = examples_for(getattr(target.storage_factory, "kind", ""), target.backend_name)
        if examples is None:
            return super().property_settings(prop, target, steps)
        return kit_settings(steps, max_examples=examples)


def test_the_matrix_holds_every_installed_plugin() -> None:
    assert set(BACKENDS) == set(REGISTRY.backends()) and BACKENDS
    assert {k.split("-")[0] for k in STORAGE_KINDS} >= set(REGISTRY.storages())
    # What this repository installs (make install) is found through its entry points.
    assert {"heap", "sqlite"} <= set(BACKENDS)
    assert {"jobmanager", "filesystem-local", "filesystem-memory", "filesystem-s3"} <= set(STORAGE_KINDS)
