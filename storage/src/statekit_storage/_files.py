"""File access shared by both storages: opening URLs, listing checkpoints, reading ``_metadata``, handles."""

from __future__ import annotations

import contextlib
import inspect
import posixpath
from collections.abc import Iterable, Mapping
from typing import Any

import fsspec.asyn  # type: ignore[import-untyped]
from fsspec.core import url_to_fs  # type: ignore[import-untyped]
from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]

from statekit.backend_api import redact_urls
from statekit.errors import CheckpointError, CheckpointNotFoundError, ConfigurationError, CorruptSnapshotError
from statekit.snapshot_codec import StreamStateHandle

from ._handles import FileStreamHandle, InlineStreamHandle, fs_errors
from ._localfiles import PrivateLocalFileSystem
from ._paths import (
    CHECKPOINT_DIR,
    METADATA_FILE,
    contained_path,
    join_url,
    location_dir,
    protocol_of,
    root_of,
)

__all__ = ["MAX_METADATA_SIZE", "Files", "list_names", "remove_tree"]

#: The largest ``_metadata`` read; a larger one is refused as corrupt before it is loaded.
MAX_METADATA_SIZE = 256 << 20
_EXTRAS = {"s3": "s3", "s3a": "s3", "hdfs": "hdfs", "arrow_hdfs": "hdfs", "viewfs": "hdfs"}
_HDFS_HINT = (
    " HDFS needs pyarrow with libhdfs, JAVA_HOME, HADOOP_HOME and CLASSPATH "
    "(see the README of statekit-storage)."
)


def _open_errors() -> tuple[type[Exception], ...]:
    """What opening a filesystem raises for a bad URL or options (a keyword its client does not take:
    ``TypeError``), or when its store fails."""
    return (ValueError, TypeError, *fs_errors())


def _make_client(fs: Any) -> None:
    """Creates the client of a filesystem that makes it on first use (s3fs), now.

    s3fs passes its storage options on to botocore only when it first needs a
    client: an option nobody takes would otherwise escape as a ``TypeError`` from
    the first read or listing, wherever that is, instead of failing here.
    """
    set_session = getattr(fs, "set_session", None)
    if inspect.iscoroutinefunction(set_session) and not getattr(fs, "asynchronous", True):
        fsspec.asyn.sync(fs.loop, set_session)


def remove_tree(fs: Any, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        fs.rm(path, recursive=True)
    fs.invalidate_cache(path)


def list_names(fs: Any, path: str) -> list[str]:
    # Other processes (Spark executors) write here: never trust a cached listing.
    fs.invalidate_cache(path)
    try:
        entries = fs.ls(path, detail=False)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(posixpath.basename(str(entry).rstrip("/")) for entry in entries)


#: How many entries of a directory without ``_metadata`` are looked into for one that has it.
_LOOK_INSIDE = 50


def _completed_inside(fs: Any, path: str, location: str) -> str:
    """What a directory without ``_metadata`` holds that has one, as the rest of an error message.

    A savepoint's target directory (the savepoint is a directory inside it) and
    a job's checkpoint directory (``chk-<n>`` inside) are the usual mistakes:
    the message names what to pass instead. ``""`` when there is nothing such.
    """
    try:
        names = list_names(fs, path)[:_LOOK_INSIDE]
        found = [n for n in names if fs.exists(f"{path}/{n}/{METADATA_FILE}")]
    except fs_errors():
        return ""
    if not found:
        return ""
    number = {n: int(m[1]) for n in found if (m := CHECKPOINT_DIR.fullmatch(n))}
    found.sort(key=lambda n: (n in number, number.get(n, 0), n))
    last = join_url(location, found[-1])
    if len(found) == 1:
        return f"; it holds one that does, {found[0]}: pass {last}"
    shown = ", ".join(found[-3:])
    more = "…, " if len(found) > 3 else ""
    return f"; {len(found)} directories in it do ({more}{shown}): pass one of them, such as {last}"


class Files:
    """File access shared by both storages: opening URLs, savepoints, metadata, handles."""

    def __init__(
        self,
        storage_options: Mapping[str, Any],
        dirs: Iterable[str | None],
        inline_threshold: int,
        *,
        local_permissions: str = "private",
    ) -> None:
        if inline_threshold < 0:
            raise ConfigurationError(f"the inline threshold must be 0 or more, not {inline_threshold}")
        self.storage_options = dict(storage_options)
        self.inline_threshold = inline_threshold
        self._protocols = {protocol_of(d) for d in dirs if d is not None}
        # Local checkpoint files private (0700/0600) unless shared deliberately: see _localfiles.
        self._private_local = local_permissions == "private"

    def open(self, url: str) -> tuple[Any, str]:
        """The filesystem and path of ``url``; storage options apply to the configured protocols.

        Raises:
            ConfigurationError: If the protocol's implementation is not installed, or
                the filesystem cannot be opened.
        """
        protocol = protocol_of(url)
        options = self.storage_options if protocol in self._protocols else {}
        try:
            fs, path = url_to_fs(url, **options)
            if options:
                _make_client(fs)
            if self._private_local and type(fs) is LocalFileSystem:
                fs = PrivateLocalFileSystem()
        except ImportError as exc:
            extra = _EXTRAS.get(protocol)
            advice = (
                f'Install it with: pip install --find-links wheelhouse "statekit[{extra}]" (statekit is '
                "not on PyPI: `make wheels` in a statekit checkout builds the wheelhouse, see its README)"
                if extra
                else f"Install the fsspec implementation of {protocol!r}."
            )  # fmt: skip
            raise ConfigurationError(
                f"{redact_urls(url)} needs support for the {protocol!r} protocol, which is not installed "
                f"({redact_urls(str(exc))}). {advice}"
            ) from exc
        except _open_errors() as exc:
            # The first line only: libhdfs lists every path it tried; the cause keeps them.
            reason = redact_urls((str(exc).strip() or repr(exc)).splitlines()[0])
            hint = _HDFS_HINT if _EXTRAS.get(protocol) == "hdfs" else ""
            if isinstance(exc, TypeError):
                hint += f" Check the storage options: the {protocol!r} filesystem does not take one of them."
            raise ConfigurationError(f"cannot open {redact_urls(url)}: {reason}.{hint}") from exc
        return fs, str(path)

    def completed(self, job_url: str) -> list[str]:
        """Locations of the ``chk-<n>`` directories under ``job_url`` with a ``_metadata``, by n."""
        return [join_url(job_url, f"chk-{i}") for i, complete in self.checkpoint_dirs(job_url) if complete]

    def checkpoint_dirs(self, job_url: str) -> list[tuple[int, bool]]:
        """``(n, has _metadata)`` of each ``chk-<n>`` directory under ``job_url``, by n.

        Raises:
            CheckpointError: If the store fails.
        """
        fs, path = self.open(job_url)
        try:
            ids = sorted(int(m[1]) for n in list_names(fs, path) if (m := CHECKPOINT_DIR.fullmatch(n)))
            out = []
            for i in ids:
                fs.invalidate_cache(f"{path}/chk-{i}")
                out.append((i, bool(fs.exists(f"{path}/chk-{i}/{METADATA_FILE}"))))
        except fs_errors() as exc:
            raise CheckpointError(f"cannot list the checkpoints in {job_url}: {exc}") from exc
        return out

    def read_metadata(self, location: str) -> bytes:
        """The ``_metadata`` bytes at ``location`` (the directory, or the file itself).

        Raises:
            CheckpointNotFoundError: If there is no ``_metadata``.
        """
        location = location_dir(location)
        fs, path = self.open(location)
        try:
            # One bounded range read: a huge (damaged or crafted) file is refused, not loaded.
            data = bytes(fs.cat_file(f"{path}/{METADATA_FILE}", start=0, end=MAX_METADATA_SIZE + 1))
        except (FileNotFoundError, NotADirectoryError):
            raise CheckpointNotFoundError(
                f"no completed checkpoint or savepoint at {location}: "
                f"{join_url(location, METADATA_FILE)} does not exist{_completed_inside(fs, path, location)}"
            ) from None
        except fs_errors() as exc:
            raise CheckpointError(f"cannot read {join_url(location, METADATA_FILE)}: {exc}") from exc
        if len(data) > MAX_METADATA_SIZE:
            raise CorruptSnapshotError(
                f"{join_url(location, METADATA_FILE)} is larger than {MAX_METADATA_SIZE:,} bytes, the most "
                "statekit reads; the file is damaged or was crafted (real metadata stays far smaller: "
                "state above the inline threshold lives in files of its own)"
            )
        return data

    def resolve_handle(self, location: str, description: Mapping[str, Any]) -> StreamStateHandle:
        """Rebuilds an inline or file handle; file paths are relative to ``location``.

        Raises:
            CheckpointError: If the description is malformed or of an unknown type.
        """
        kind = description.get("type")
        if kind == "inline":
            return InlineStreamHandle.from_json(description)
        if kind != "file":
            raise CheckpointError(
                f"unknown state handle type {kind!r} in the metadata of {location}; "
                "this storage reads 'inline' and 'file'"
            )
        relative, size = description.get("path"), description.get("size")
        location = location_dir(location)
        fs, base = self.open(location)
        path = contained_path(base, relative)
        if path is None:
            raise CorruptSnapshotError(
                f"{join_url(location, METADATA_FILE)}: refusing state file path {str(relative)[:200]!r}: it "
                f"leads outside {root_of(location)}. A checkpoint's files lie in its job's directory, a "
                "savepoint's in its own; the metadata is damaged or was crafted, and nothing was read"
            )
        if not isinstance(size, int) or size < 0:
            try:
                size = int(fs.size(path))
            except FileNotFoundError:
                raise CorruptSnapshotError(f"{fs.unstrip_protocol(path)}: the file is missing") from None
            except fs_errors() as exc:
                raise CheckpointError(f"cannot read state file {fs.unstrip_protocol(path)}: {exc}") from exc
        return FileStreamHandle(fs, path, str(relative), size)
