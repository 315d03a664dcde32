"""Publishing a file whole or not at all, on filesystems with an atomic rename and on object stores."""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import secrets
from typing import Any

from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]

from ._handles import fs_errors

__all__ = ["has_directories", "publish"]

# Filesystems with real directories and an atomic rename; the others (object stores,
# memory://) have neither, and a single put is what makes a file appear whole.
_RENAMING = frozenset({"file", "local", "hdfs", "arrow_hdfs", "viewfs", "sftp", "ssh"})


def has_directories(fs: Any) -> bool:
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    return bool(protocols & _RENAMING)


def publish(fs: Any, path: str, data: bytes, *, exclusive: bool, has_directories: bool) -> None:
    """Make file ``path`` appear whole, holding ``data``, or not at all.

    Where rename is atomic (local files, HDFS) a temporary file in the same
    directory is renamed into place; on object stores one put makes the object
    appear whole. ``exclusive`` refuses to replace an existing file, raising
    ``FileExistsError``: atomically on local disks (a hard link, which fails if
    the name exists) and on S3 (a conditional put, ``If-None-Match: *``); on other
    stores by a check just before the write, which a writer racing in between
    can slip past.
    """
    if not has_directories:
        if not exclusive:
            fs.pipe_file(path, data)
            return
        try:
            fs.pipe_file(path, data, mode="create")
        except TypeError:  # an fsspec implementation that knows no modes
            if fs.exists(path):
                raise FileExistsError(path) from None
            fs.pipe_file(path, data)
        return
    parent, name = posixpath.split(path)
    fs.makedirs(parent, exist_ok=True)
    temp = f"{parent}/.{name}.{secrets.token_hex(8)}.inprogress"
    try:
        with fs.open(temp, "wb") as out:
            out.write(data)
            out.flush()
            # The rename publishes the file: its bytes must be on disk first.
            with contextlib.suppress(AttributeError, OSError, ValueError):
                os.fsync(out.fileno())
        if exclusive and isinstance(fs, LocalFileSystem) and _link_no_clobber(temp, path):
            fs.rm_file(temp)
            return
        if exclusive and fs.exists(path):
            raise FileExistsError(path)
        fs.mv(temp, path)
    except BaseException:
        with contextlib.suppress(*fs_errors()):
            fs.rm_file(temp)
        raise


def _link_no_clobber(source: str, target: str) -> bool:
    """Hard-link ``source`` as ``target`` unless ``target`` exists (then ``FileExistsError``).

    False where the file system has no hard links (some network and FUSE file
    systems): the caller falls back to check-then-rename.
    """
    try:
        os.link(source, target)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
            return False
        raise
    return True
