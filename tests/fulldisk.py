"""A disk that fills up: local files through an fsspec filesystem that fails with ENOSPC past a budget.

``fulldisk://<path>`` reads and writes the real local ``<path>``; every byte
written counts against :attr:`FullDisk.budget` (shared by all instances), and
the write that would exceed it fails as a full disk does, with
``OSError(ENOSPC)`` (nothing of that write lands). Renames and deletes work as
on the local disk, which is what the filesystem storage relies on.
"""

from __future__ import annotations

import errno
import os
import threading
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileOpener, LocalFileSystem


class FullDisk:
    """The shared budget: ``None`` is an empty disk; ``n`` bytes may still be written."""

    budget: int | None = None
    only: str = ""  # only paths containing this count (and fail)
    lock = threading.Lock()

    @classmethod
    def take(cls, path: str, n: int) -> None:
        if cls.only not in path:
            return
        with cls.lock:
            if cls.budget is not None:
                if n > cls.budget:
                    cls.budget = 0
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
                cls.budget -= n


class _FullDiskFile(LocalFileOpener):  # type: ignore[misc]
    def write(self, data: Any) -> int:
        FullDisk.take(self.path, len(data))
        written: int = super().write(data)
        return written


class FullDiskFileSystem(LocalFileSystem):  # type: ignore[misc]
    protocol = ("fulldisk", "local")  # "local": the storage treats it as a disk (rename, directories)
    root_marker = "/"

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        path = str(path)
        if path.startswith("fulldisk://"):
            path = path[len("fulldisk://") :]
        stripped: str = super()._strip_protocol(path)
        return stripped

    def unstrip_protocol(self, name: str) -> str:
        return f"fulldisk://{self._strip_protocol(name)}"

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        path = self._strip_protocol(path)
        if self.auto_mkdir and "w" in mode:
            self.makedirs(self._parent(path), exist_ok=True)
        return _FullDiskFile(path, mode, fs=self, **kwargs)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        FullDisk.take(self._strip_protocol(path), len(value))
        super().pipe_file(path, value, mode=mode, **kwargs)


fsspec.register_implementation("fulldisk", FullDiskFileSystem, clobber=True)
