"""Checkpoint and savepoint files on local disks: private to the running user unless shared deliberately.

Checkpoints hold all of a job's state. On a machine with other users, files
made under the process's umask (typically directories 0755, files 0644) let
any of them read it. The storages therefore open local paths (plain paths and
``file://``) through :class:`PrivateLocalFileSystem`: every directory they
create is made with mode 0700 and every file with mode 0600, whatever the
umask, as Spark's and Flink's local working directories are. Directories that
already exist keep their mode: a directory an operator prepared (say 0750 for
a group of readers) stays as it is, and what statekit creates inside it is
still private.

To share deliberately (a group reading savepoints, a backup agent of another
user), set ``statekit.checkpoint.storage.<name>.local-permissions=umask``:
local files and directories are then created as the process's umask makes
them, as before this rule. Other filesystems (S3, HDFS) keep their own access
control and are not affected.
"""

from __future__ import annotations

import os
from typing import Any

from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]

__all__ = ["LOCAL_PERMISSIONS", "PrivateLocalFileSystem"]

#: The values of the ``local-permissions`` option: ``private`` (0700/0600) or ``umask`` (as the umask makes).
LOCAL_PERMISSIONS = ("private", "umask")

_DIR_MODE = 0o700
_FILE_MODE = 0o600
_CREATE = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC


class PrivateLocalFileSystem(LocalFileSystem):  # type: ignore[misc]
    """fsspec's local filesystem, creating directories 0700 and files 0600, whatever the umask."""

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Every missing component of ``path`` created with mode 0700 (``os.makedirs`` sets only the last)."""
        path = self._strip_protocol(path)
        missing = []
        current = path
        while current and not os.path.isdir(current):
            missing.append(current)
            parent = os.path.dirname(current)
            if parent == current:
                break
            current = parent
        if not missing and not exist_ok:
            raise FileExistsError(path)
        for p in reversed(missing):
            try:
                os.mkdir(p, _DIR_MODE)
            except FileExistsError:
                if not os.path.isdir(p):
                    raise
                if p == path and not exist_ok:
                    raise
            else:
                os.chmod(p, _DIR_MODE)  # a umask with unusual bits (0o277) cannot narrow it either

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """As fsspec's, with mode 0700."""
        path = self._strip_protocol(path)
        if self.exists(path):
            raise FileExistsError(path)
        if create_parents:
            self.makedirs(path, exist_ok=True)
        else:
            os.mkdir(path, _DIR_MODE)

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, **kwargs: Any) -> Any:
        """As fsspec's; a file created for writing is created with mode 0600 first, so it never is wider."""
        if "w" in mode or "x" in mode or "a" in mode:
            local = self._strip_protocol(path)
            if self.auto_mkdir:
                self.makedirs(self._parent(local), exist_ok=True)
            flags = _CREATE | (os.O_EXCL if "x" in mode else 0)
            os.close(os.open(local, flags, _FILE_MODE))
            if "x" in mode:
                mode = mode.replace("x", "w")  # created just now, exclusively
        return super()._open(path, mode, block_size, **kwargs)

    def touch(self, path: str, truncate: bool = True, **kwargs: Any) -> None:
        """As fsspec's, a new file with mode 0600."""
        local = self._strip_protocol(path)
        os.close(os.open(local, _CREATE, _FILE_MODE))
        super().touch(path, truncate=truncate, **kwargs)
