"""The output streams of the storages: bytes in memory up to the inline threshold, then a file."""

from __future__ import annotations

import contextlib
import posixpath
from typing import Any

from statekit.errors import CheckpointError
from statekit.snapshot_codec import StreamStateHandle

from ._handles import FileStreamHandle, InlineStreamHandle, fs_errors

__all__ = ["FileOutputStream", "MemoryOutputStream"]


class MemoryOutputStream:
    """Buffers a stream in memory; it becomes an :class:`InlineStreamHandle`."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._buffer = bytearray()
        self._written = 0
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError(f"stream {self._name!r} is closed")

    def write(self, data: bytes) -> int:
        """Appends bytes; returns how many."""
        self._check_open()
        self._buffer += data
        self._written += len(data)
        return len(data)

    def tell(self) -> int:
        """Bytes written so far."""
        return self._written

    def close_and_get_handle(self) -> StreamStateHandle:
        """Finishes the stream; its bytes become an inline handle."""
        self._check_open()
        self._closed = True
        return InlineStreamHandle(bytes(self._buffer), self._name)

    def discard(self) -> None:
        """Abandons the stream."""
        self._closed = True
        self._buffer = bytearray()


class FileOutputStream(MemoryOutputStream):
    """Buffers up to the inline threshold; past it, streams into its file."""

    def __init__(self, fs: Any, path: str, relative: str, threshold: int, *, make_dirs: bool) -> None:
        super().__init__(relative)
        self._fs = fs
        self._path = path
        self._threshold = threshold
        self._make_dirs = make_dirs
        self._file: Any = None

    def _fail(self, exc: Exception, what: str) -> CheckpointError:
        return CheckpointError(f"cannot {what} state file {self._fs.unstrip_protocol(self._path)}: {exc}")

    def write(self, data: bytes) -> int:
        """Appends bytes; returns how many."""
        self._check_open()
        if self._file is None and self._written + len(data) <= self._threshold:
            return super().write(data)
        try:
            if self._file is None:
                if self._make_dirs:
                    self._fs.makedirs(posixpath.dirname(self._path), exist_ok=True)
                self._file = self._fs.open(self._path, "wb")
                self._file.write(bytes(self._buffer))
                self._buffer = bytearray()
            self._file.write(data)
        except fs_errors() as exc:
            raise self._fail(exc, "write") from exc
        self._written += len(data)
        return len(data)

    def close_and_get_handle(self) -> StreamStateHandle:
        """Finishes the stream: an inline handle up to the threshold, else a file handle."""
        if self._file is None:
            return super().close_and_get_handle()
        self._check_open()
        self._closed = True
        try:
            self._file.close()
        except fs_errors() as exc:
            raise self._fail(exc, "write") from exc
        return FileStreamHandle(self._fs, self._path, self._name, self._written)

    def discard(self) -> None:
        """Abandons the stream and deletes its file, if one was started.

        Best effort: a file the failing store keeps is no checkpoint's and is
        deleted by the cleanup after the next completed checkpoint.
        """
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(*fs_errors()):
                file.close()
            with contextlib.suppress(*fs_errors()):
                self._fs.rm_file(self._path)
        super().discard()
