"""State handles of the storages: bytes inlined into ``_metadata``, and files read by range."""

from __future__ import annotations

import base64
import binascii
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]

from statekit.errors import CheckpointError, CorruptSnapshotError
from statekit.snapshot_codec import BytesStreamHandle

__all__ = ["FileStreamHandle", "InlineStreamHandle", "fs_errors"]


def fs_errors() -> tuple[type[Exception], ...]:
    """What fsspec filesystems raise when their store fails (for ``except``; evaluated where it is).

    Mostly ``OSError``; but s3fs lets botocore's connection errors and timeouts
    (``EndpointConnectionError``, ``ReadTimeoutError``: ``BotoCoreError``) and
    aiohttp's through untranslated, and a checkpoint must fail with statekit's
    error, not another, when an endpoint is down.

    Their classes are taken from the modules already imported, never imported
    here: an exception of a module no one imported cannot be raised, and
    importing aiohttp cost every process that reads a local checkpoint (a
    Spark worker restoring its first subtask) an eighth of a second.
    """
    errors: tuple[type[Exception], ...] = (OSError,)
    botocore = sys.modules.get("botocore.exceptions")
    boto_error = getattr(botocore, "BotoCoreError", None)
    if isinstance(boto_error, type) and issubclass(boto_error, Exception):
        errors += (boto_error,)
    aiohttp = sys.modules.get("aiohttp.client_exceptions")
    client_error = getattr(aiohttp, "ClientError", None)
    if isinstance(client_error, type) and issubclass(client_error, Exception):
        errors += (client_error,)
    return errors


def _size_errors() -> tuple[type[Exception], ...]:
    """What asking a file's size may raise besides a missing file (an odd answer of a store)."""
    return (*fs_errors(), TypeError, ValueError)


@dataclass(frozen=True, eq=False)
class InlineStreamHandle(BytesStreamHandle):
    """Bytes small enough to live inside the checkpoint's ``_metadata``.

    :meth:`to_json` embeds them (base64), so the description alone brings them
    back: it can travel from a Spark executor to the driver in a task result.
    """

    def to_json(self) -> dict[str, Any]:
        """``{"type": "inline", "name": ..., "size": n, "data": <base64>}``."""
        encoded = base64.b64encode(self.data).decode("ascii")
        return {"type": "inline", "name": self.name, "size": len(self.data), "data": encoded}

    @classmethod
    def from_json(cls, description: Mapping[str, Any]) -> InlineStreamHandle:
        """Rebuilds a handle from :meth:`to_json`'s output.

        Raises:
            CheckpointError: If the description is malformed or its size does not match.
        """
        name = str(description.get("name", "<inline>"))
        try:
            data = base64.b64decode(description["data"], validate=True)
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise CheckpointError(f"inline state {name!r}: malformed description ({exc!r})") from None
        if "size" in description and description["size"] != len(data):
            raise CheckpointError(
                f"inline state {name!r}: holds {len(data)} bytes, its description says {description['size']}"
            )
        return cls(data, name)


@dataclass(frozen=True, eq=False)
class FileStreamHandle:
    """A file of a checkpoint or savepoint, read by byte range.

    Attributes:
        fs: The fsspec filesystem holding the file.
        path: The file's path on ``fs``.
        relative_path: The path relative to the directory holding ``_metadata``
            (``"op-0.bin"``, ``"../shared/abc"``): what :meth:`to_json` records, so
            a savepoint folder can be moved.
        size: The number of bytes.
    """

    fs: Any
    path: str
    relative_path: str
    size: int

    @property
    def url(self) -> str:
        """The file's URL, for messages: a plain path for local files, as locations are given."""
        if isinstance(self.fs, LocalFileSystem):
            return str(self.path)
        return str(self.fs.unstrip_protocol(self.path))

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        """Reads ``length`` bytes from ``offset`` (to the end when None), in one range request.

        Raises:
            CorruptSnapshotError: If the range lies outside the file, or the file is shorter.
            CorruptSnapshotError: If the file is missing.
            CheckpointError: If the store fails.
        """
        end = self.size if length is None else offset + length
        if offset < 0 or end < offset or end > self.size:
            raise CorruptSnapshotError(
                f"{self.url}: range [{offset}, {end}) is outside its {self.size} bytes"
            )
        if end == offset:  # an empty HTTP range is invalid
            return b""
        try:
            data: bytes = self.fs.cat_file(self.path, start=offset, end=end)
        except FileNotFoundError:
            # A file its checkpoint names is gone: the checkpoint is damaged, not the store down.
            raise CorruptSnapshotError(f"{self.url}: the file is missing") from None
        except fs_errors() as exc:
            # Object stores refuse a range past the end (S3: InvalidRange) instead of reading short.
            raise self._shorter_than_recorded(end) or CheckpointError(
                f"cannot read state file {self.url}: {exc}"
            ) from exc
        if len(data) != end - offset:
            raise CorruptSnapshotError(
                f"{self.url}: expected {end - offset} bytes at offset {offset}, got {len(data)}; "
                "the file is truncated"
            )
        return data

    def _shorter_than_recorded(self, end: int) -> CorruptSnapshotError | None:
        """The error to raise if the file now holds fewer than ``end`` bytes; None if not (or unknown)."""
        try:
            actual = int(self.fs.size(self.path))
        except FileNotFoundError:
            return CorruptSnapshotError(f"{self.url}: the file is missing")
        except _size_errors():
            return None
        if actual >= end:
            return None
        return CorruptSnapshotError(
            f"{self.url}: has {actual} bytes, the checkpoint records {self.size}; the file is truncated"
        )

    def discard(self) -> None:
        """Deletes the file; a missing file is no error.

        Raises:
            CheckpointError: If the store fails.
        """
        try:
            self.fs.rm_file(self.path)
        except FileNotFoundError:
            pass
        except fs_errors() as exc:
            raise CheckpointError(f"cannot delete state file {self.url}: {exc}") from exc

    def to_json(self) -> dict[str, Any]:
        """``{"type": "file", "path": <relative path>, "size": n}``."""
        return {"type": "file", "path": self.relative_path, "size": self.size}
