"""Fixtures of the storage tests: one checkpoints root per filesystem kind, each unique and cleaned."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from statekit_storage import FileSystemCheckpointStorage, JobManagerCheckpointStorage
from statekit_storage._localfiles import PrivateLocalFileSystem

KINDS = ["local", "file", "memory", "s3"]


@dataclass
class Root:
    """A fresh directory on one kind of filesystem, with helpers to look at it directly."""

    kind: str
    url: str
    storage_options: dict[str, Any]

    @property
    def fs(self) -> Any:
        """The filesystem the storage uses here (local paths: its private one, an fsspec cached instance)."""
        fs = fsspec.core.url_to_fs(self.url, **self.storage_options)[0]
        return PrivateLocalFileSystem() if type(fs) is LocalFileSystem else fs

    def path(self, url: str) -> str:
        """The fs path of a URL under this root."""
        return str(fsspec.core.url_to_fs(url, **self.storage_options)[1])

    def sub(self, *parts: str) -> str:
        return "/".join([self.url, *parts])

    def exists(self, url: str) -> bool:
        self.fs.invalidate_cache()
        return bool(self.fs.exists(self.path(url)))

    def names(self, url: str) -> list[str]:
        """The entries of a directory, by name."""
        self.fs.invalidate_cache()
        try:
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.path(url), detail=False))
        except FileNotFoundError:
            return []

    def storage(self, sub: str = "chk", **kwargs: Any) -> FileSystemCheckpointStorage:
        kwargs.setdefault("savepoints_dir", self.sub("savepoints"))
        return FileSystemCheckpointStorage(self.sub(sub), storage_options=self.storage_options, **kwargs)


@pytest.fixture(params=KINDS)
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Root]:
    """A unique root directory: a local path, a file:// URL, memory:// or s3:// (moto server)."""
    kind = request.param
    unique = f"statekit-{uuid.uuid4().hex[:12]}"
    options: dict[str, Any] = {}
    if kind == "local":
        url = str(tmp_path / unique)
    elif kind == "file":
        url = (tmp_path / unique).as_uri()
    elif kind == "memory":
        url = f"memory://{unique}"
    else:
        s3 = request.getfixturevalue("s3_endpoint")
        url = f"s3://{s3['bucket']}/{unique}"
        options = {"client_kwargs": {"endpoint_url": s3["endpoint_url"]}}
    r = Root(kind, url, options)
    yield r
    if kind in ("memory", "s3"):
        fs = r.fs
        fs.invalidate_cache()
        if fs.exists(r.path(url)):
            fs.rm(r.path(url), recursive=True)


@pytest.fixture
def job_id() -> str:
    """A unique job id."""
    return f"job-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def jobmanager(tmp_path: Path) -> JobManagerCheckpointStorage:
    """A jobmanager storage with a local savepoints dir."""
    return JobManagerCheckpointStorage(savepoints_dir=str(tmp_path / "savepoints"))
