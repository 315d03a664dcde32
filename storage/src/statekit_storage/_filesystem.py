"""The ``filesystem`` checkpoint storage: checkpoints as files under any fsspec URL.

Layout::

    <checkpoints dir>/<job id>/chk-<n>/_metadata   written last: checkpoint n exists once it does
    <checkpoints dir>/<job id>/chk-<n>/<name>      the exclusive files of checkpoint n
    <checkpoints dir>/<job id>/shared/<name>       files later checkpoints may reference too
    <checkpoints dir>/<job id>/taskowned/          state owned by tasks rather than checkpoints
    <savepoints dir>/savepoint-<job[:6]>-<hex>/    _metadata, files and shared/<name>: self-contained

Handle descriptions in ``_metadata`` hold paths relative to the directory that
holds it (``"op-0.bin"``, ``"../shared/abc"``), so a savepoint folder can be
copied anywhere and restored from there. Every URL takes the same fsspec path;
only how ``_metadata`` is made atomic depends on the protocol (see
:meth:`_FileWriter.complete`).
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import json
import os
import posixpath
import re
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import fsspec.asyn  # type: ignore[import-untyped]
from fsspec.core import split_protocol, url_to_fs  # type: ignore[import-untyped]
from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]

from statekit import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointOutputStream,
    CheckpointWriter,
    ConfigurationError,
    CorruptSnapshotError,
)
from statekit.backend_api import StreamStateHandle

from ._handles import FS_ERRORS, FileStreamHandle, InlineStreamHandle
from ._plugin import DEFAULT_INLINE_THRESHOLD

__all__ = ["METADATA_FILE", "FileSystemCheckpointStorage", "find_latest_checkpoint", "parse_storage_options"]

#: The file whose presence makes a directory a completed checkpoint or savepoint.
METADATA_FILE = "_metadata"
#: The largest ``_metadata`` read; a larger one is refused as corrupt before it is loaded.
MAX_METADATA_SIZE = 256 << 20
_CHECKPOINT_DIR = re.compile(r"chk-(0|[1-9][0-9]*)")
#: ``<job>/runs/``: one record per run of the job, for fencing (see ``register_run``).
RUNS_DIR = "runs"
_RUN_RECORD = re.compile(r"run-([1-9][0-9]{0,17})-([0-9a-f]{1,64})\.json")
_MAX_RUN_RECORD = 64 << 10
# Filesystems with real directories and an atomic rename; the others (object stores,
# memory://) have neither, and a single put is what makes a file appear whole.
_RENAMING = frozenset({"file", "local", "hdfs", "arrow_hdfs", "viewfs", "sftp", "ssh"})
_EXTRAS = {"s3": "s3", "s3a": "s3", "hdfs": "hdfs", "arrow_hdfs": "hdfs", "viewfs": "hdfs"}
_HDFS_HINT = (
    " HDFS needs pyarrow with libhdfs, JAVA_HOME, HADOOP_HOME and CLASSPATH "
    "(see the README of statekit-storage)."
)


def _protocol_of(url: str) -> str:
    protocol, _ = split_protocol(url)
    return str(protocol or "file")


def _has_directories(fs: Any) -> bool:
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    return bool(protocols & _RENAMING)


def _normalize_dir(url: str) -> str:
    """Makes local paths absolute and drops a trailing slash (but not from ``memory://``)."""
    url = os.fspath(url)
    if split_protocol(url)[0] is None:
        return os.path.abspath(os.path.expanduser(url))
    stripped = url.rstrip("/")
    return url if stripped.endswith(":") else stripped


def _location(location: str) -> str:
    """A location without a trailing slash or ``/_metadata``."""
    location = _normalize_dir(location)
    suffix = "/" + METADATA_FILE
    return location[: -len(suffix)] if location.endswith(suffix) else location


def _join(base: str, *parts: str) -> str:
    return base + ("" if base.endswith("/") else "/") + "/".join(parts)


def _check_job_id(job_id: str) -> str:
    if not job_id or job_id.startswith(".") or "/" in job_id or "\\" in job_id:
        raise CheckpointError(
            f"invalid job id {job_id!r}: it names a directory, so it may not be empty, "
            "start with '.' or hold '/' or '\\'"
        )
    return job_id


def _check_name(name: str) -> str:
    if (
        not name
        or "\\" in name
        or name == METADATA_FILE
        or any(part in ("", ".", "..") for part in name.split("/"))
    ):
        raise CheckpointError(
            f"invalid stream name {name!r}: use a relative path without empty, '.' or '..' parts, "
            f"other than {METADATA_FILE}"
        )
    return name


def _root_of(location: str) -> str:
    """The directory a checkpoint's (its job's) or a savepoint's (its own) files must lie in."""
    return (
        posixpath.dirname(location) if _CHECKPOINT_DIR.fullmatch(posixpath.basename(location)) else location
    )


def _contained_path(base: str, relative: object) -> str | None:
    """``base/relative`` normalized, or None if it is no plain relative path inside the allowed root.

    ``base`` is the path of a checkpoint (``.../<job>/chk-<n>``: the root is the job's
    directory) or of a savepoint (the root is the savepoint itself). Absolute paths,
    URLs (another bucket, another scheme) and ``..`` past the root are refused.
    """
    if (
        not isinstance(relative, str)
        or not relative
        or relative.startswith(("/", "~"))
        or "://" in relative
        or any(c in relative for c in ("\\", "\x00"))
    ):
        return None
    root = _root_of(base)
    path = posixpath.normpath(f"{base}/{relative}")
    return path if path.startswith(root.rstrip("/") + "/") else None


#: What opening a filesystem raises for a bad URL or options (a keyword its client does not take:
#: ``TypeError``), or when its store fails.
_OPEN_ERRORS: tuple[type[Exception], ...] = (ValueError, TypeError, *FS_ERRORS)


def _make_client(fs: Any) -> None:
    """Creates the client of a filesystem that makes it on first use (s3fs), now.

    s3fs passes its storage options on to botocore only when it first needs a
    client: an option nobody takes would otherwise escape as a ``TypeError`` from
    the first read or listing, wherever that is, instead of failing here.
    """
    set_session = getattr(fs, "set_session", None)
    if inspect.iscoroutinefunction(set_session) and not getattr(fs, "asynchronous", True):
        fsspec.asyn.sync(fs.loop, set_session)


def _remove_tree(fs: Any, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        fs.rm(path, recursive=True)
    fs.invalidate_cache(path)


def _list_names(fs: Any, path: str) -> list[str]:
    # Other processes (Spark executors) write here: never trust a cached listing.
    fs.invalidate_cache(path)
    try:
        entries = fs.ls(path, detail=False)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(posixpath.basename(str(entry).rstrip("/")) for entry in entries)


def parse_storage_options(
    raw: str | Mapping[str, Any] | None, storage: str, secret: str | Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Parses the ``storage-options`` and ``secret-storage-options`` options into fsspec storage options.

    Both are JSON objects; ``secret`` is merged over ``raw`` (nested objects
    merge key by key). A string value ``"${env:NAME}"`` anywhere is replaced by
    the environment variable ``NAME`` of this process (on Spark: of each
    executor), so no credential need appear in the configuration. Messages never
    show the values.

    Raises:
        ConfigurationError: If an option is no JSON object, or a named variable is unset.
    """
    merged: dict[str, Any] = {}
    for name, value in (("storage-options", raw), ("secret-storage-options", secret)):
        _merge(merged, _parse_json_object(value, f"statekit.checkpoint.storage.{storage}.{name}"))
    resolved: dict[str, Any] = _resolve_env(merged, f"statekit.checkpoint.storage.{storage}")
    return resolved


def _parse_json_object(raw: str | Mapping[str, Any] | None, key: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    where: str | None = None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep to decode
        where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
    if where is not None:
        # Raised here, not in the handler: the decoder's error (its .doc is the whole value, secrets
        # included) would stay reachable as __context__ even with "from None".
        raise ConfigurationError(f"invalid value for {key}: not JSON (malformed{where})")
    if not isinstance(value, dict):
        raise ConfigurationError(
            f"invalid value for {key}: expected a JSON object, got {type(value).__name__}"
        )
    return value


def _merge(into: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


_ENV_REFERENCE = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


def _resolve_env(value: Any, key: str) -> Any:
    if isinstance(value, dict):
        return {k: _resolve_env(v, key) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_env(v, key) for v in value]
    if isinstance(value, str) and (match := _ENV_REFERENCE.fullmatch(value)):
        resolved = os.environ.get(match[1])
        if resolved is None:
            raise ConfigurationError(
                f"{key} refers to environment variable {match[1]}, which is not set in this process "
                "(on Spark, set it on the executors too: spark.executorEnv." + match[1] + ")"
            )
        return resolved
    return value


def _publish(fs: Any, path: str, data: bytes, *, exclusive: bool, has_directories: bool) -> None:
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
        with contextlib.suppress(*FS_ERRORS):
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


class _MemoryOutputStream:
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


class _FileOutputStream(_MemoryOutputStream):
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
        except FS_ERRORS as exc:
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
        except FS_ERRORS as exc:
            raise self._fail(exc, "write") from exc
        return FileStreamHandle(self._fs, self._path, self._name, self._written)

    def discard(self) -> None:
        """Abandons the stream and deletes its file, if one was started.

        Best effort: a file the failing store keeps is no checkpoint's and is
        deleted by the cleanup after the next completed checkpoint.
        """
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(*FS_ERRORS):
                file.close()
            with contextlib.suppress(*FS_ERRORS):
                self._fs.rm_file(self._path)
        super().discard()


class _FileWriter:
    """Writes one checkpoint's or savepoint's files into its directory, then its ``_metadata``."""

    def __init__(self, files: _Files, url: str, shared_dir: str) -> None:
        self._files = files
        self._url = url
        self._fs, self._path = files.open(url)
        self._shared_dir = shared_dir
        self.has_directories = _has_directories(self._fs)
        self._open_checked = False

    @property
    def location(self) -> str:
        """The directory that holds (or will hold) ``_metadata``."""
        return self._url

    def make_dirs(self, *relative: str) -> None:
        """Creates directories, relative to :attr:`location`, on filesystems that have them."""
        for rel in relative:
            path = posixpath.normpath(f"{self._path}/{rel}")
            try:
                self._fs.makedirs(path, exist_ok=True)
            except FS_ERRORS as exc:
                raise CheckpointError(f"cannot create {self._fs.unstrip_protocol(path)}: {exc}") from exc

    def create_stream(self, name: str, *, shared: bool = False) -> CheckpointOutputStream:
        """A stream for file ``name`` (in the shared directory if ``shared``).

        Raises:
            CheckpointError: If the checkpoint is already complete: its files are never written again.
        """
        relative = f"{self._shared_dir}/{_check_name(name)}" if shared else _check_name(name)
        if not self._open_checked:
            # Once per writer: a stream written into a completed checkpoint would damage it.
            self._check_not_complete()
            self._open_checked = True
        path = posixpath.normpath(f"{self._path}/{relative}")
        return _FileOutputStream(
            self._fs, path, relative, self._files.inline_threshold, make_dirs=self.has_directories
        )

    def _check_not_complete(self) -> None:
        meta = f"{self._path}/{METADATA_FILE}"
        try:
            self._fs.invalidate_cache(self._path)
            complete = bool(self._fs.exists(meta))
        except FS_ERRORS as exc:
            raise CheckpointError(f"cannot read {_join(self._url, METADATA_FILE)}: {exc}") from exc
        if complete:
            raise CheckpointError(
                f"{self._url} is a completed checkpoint: its files are never written again (a checkpoint "
                "id is used once; the runner numbers new checkpoints above every existing one)"
            )

    def complete(self, metadata: bytes) -> str:
        """Writes ``_metadata`` atomically; returns :attr:`location`.

        Where rename is atomic (local files, HDFS), a temporary file in the same
        directory is renamed; on object stores one put makes the object appear
        whole or not at all.

        Raises:
            CheckpointError: If it is already complete or the write fails.
        """
        fs, meta = self._fs, f"{self._path}/{METADATA_FILE}"
        fs.invalidate_cache(self._path)
        already = CheckpointError(f"{self._url} is already complete; its {METADATA_FILE} is never replaced")
        try:
            if fs.exists(meta):
                raise already
            # Exclusive: of two writers completing one checkpoint (two runs of a job), one fails.
            _publish(fs, meta, bytes(metadata), exclusive=True, has_directories=self.has_directories)
        except FileExistsError:
            raise already from None
        except FS_ERRORS as exc:
            raise CheckpointError(f"cannot write {_join(self._url, METADATA_FILE)}: {exc}") from exc
        finally:
            fs.invalidate_cache(self._path)
        self._open_checked = False  # a stream asked of this writer now finds _metadata and is refused
        return self._url

    def abort(self) -> None:
        """Deletes the directory of this unfinished checkpoint (never shared files).

        Best effort when the store fails (an outage is often why a checkpoint is
        aborted): what stays is no checkpoint (it has no ``_metadata``) and is
        deleted by the cleanup after the next completed checkpoint.

        Raises:
            CheckpointError: If it is complete (see ``discard_checkpoint``).
        """
        try:
            self._fs.invalidate_cache(self._path)
            if self._fs.exists(f"{self._path}/{METADATA_FILE}"):
                raise CheckpointError(f"{self._url} is complete; abort() deletes only unfinished ones")
            _remove_tree(self._fs, self._path)
        except FS_ERRORS:
            pass


class _Files:
    """File access shared by both storages: opening URLs, savepoints, metadata, handles."""

    def __init__(
        self, storage_options: Mapping[str, Any], dirs: Iterable[str | None], inline_threshold: int
    ) -> None:
        if inline_threshold < 0:
            raise ConfigurationError(f"the inline threshold must be 0 or more, not {inline_threshold}")
        self.storage_options = dict(storage_options)
        self.inline_threshold = inline_threshold
        self._protocols = {_protocol_of(d) for d in dirs if d is not None}

    def open(self, url: str) -> tuple[Any, str]:
        """The filesystem and path of ``url``; storage options apply to the configured protocols.

        Raises:
            ConfigurationError: If the protocol's implementation is not installed, or
                the filesystem cannot be opened.
        """
        protocol = _protocol_of(url)
        options = self.storage_options if protocol in self._protocols else {}
        try:
            fs, path = url_to_fs(url, **options)
            if options:
                _make_client(fs)
        except ImportError as exc:
            extra = _EXTRAS.get(protocol)
            advice = (
                f'Install it with: pip install --find-links wheelhouse "statekit[{extra}]" (statekit is '
                "not on PyPI: `make wheels` in a statekit checkout builds the wheelhouse, see its README)"
                if extra
                else f"Install the fsspec implementation of {protocol!r}."
            )  # fmt: skip
            raise ConfigurationError(
                f"{url} needs support for the {protocol!r} protocol, which is not installed ({exc}). {advice}"
            ) from exc
        except _OPEN_ERRORS as exc:
            # The first line only: libhdfs lists every path it tried; the cause keeps them.
            reason = (str(exc).strip() or repr(exc)).splitlines()[0]
            hint = _HDFS_HINT if _EXTRAS.get(protocol) == "hdfs" else ""
            if isinstance(exc, TypeError):
                hint += f" Check the storage options: the {protocol!r} filesystem does not take one of them."
            raise ConfigurationError(f"cannot open {url}: {reason}.{hint}") from exc
        return fs, str(path)

    def begin_savepoint(self, job_id: str, parent: str | None) -> _FileWriter:
        """A writer for ``<parent>/savepoint-<job[:6]>-<random hex>/``.

        Raises:
            ConfigurationError: If ``parent`` is None.
        """
        _check_job_id(job_id)
        if parent is None:
            raise ConfigurationError(
                "no savepoints directory: set statekit.savepoints.dir or pass a target directory"
            )
        url = _join(_normalize_dir(parent), f"savepoint-{job_id[:6]}-{secrets.token_hex(6)}")
        writer = _FileWriter(self, url, shared_dir="shared")
        if writer.has_directories:
            writer.make_dirs(".")
        return writer

    def completed(self, job_url: str) -> list[str]:
        """Locations of the ``chk-<n>`` directories under ``job_url`` with a ``_metadata``, by n."""
        return [_join(job_url, f"chk-{i}") for i, complete in self.checkpoint_dirs(job_url) if complete]

    def checkpoint_dirs(self, job_url: str) -> list[tuple[int, bool]]:
        """``(n, has _metadata)`` of each ``chk-<n>`` directory under ``job_url``, by n.

        Raises:
            CheckpointError: If the store fails.
        """
        fs, path = self.open(job_url)
        try:
            ids = sorted(int(m[1]) for n in _list_names(fs, path) if (m := _CHECKPOINT_DIR.fullmatch(n)))
            out = []
            for i in ids:
                fs.invalidate_cache(f"{path}/chk-{i}")
                out.append((i, bool(fs.exists(f"{path}/chk-{i}/{METADATA_FILE}"))))
        except FS_ERRORS as exc:
            raise CheckpointError(f"cannot list the checkpoints in {job_url}: {exc}") from exc
        return out

    def read_metadata(self, location: str) -> bytes:
        """The ``_metadata`` bytes at ``location`` (the directory, or the file itself).

        Raises:
            CheckpointNotFoundError: If there is no ``_metadata``.
        """
        location = _location(location)
        fs, path = self.open(location)
        try:
            # One bounded range read: a huge (damaged or crafted) file is refused, not loaded.
            data = bytes(fs.cat_file(f"{path}/{METADATA_FILE}", start=0, end=MAX_METADATA_SIZE + 1))
        except (FileNotFoundError, NotADirectoryError):
            raise CheckpointNotFoundError(
                f"no completed checkpoint or savepoint at {location}: "
                f"{_join(location, METADATA_FILE)} does not exist"
            ) from None
        except FS_ERRORS as exc:
            raise CheckpointError(f"cannot read {_join(location, METADATA_FILE)}: {exc}") from exc
        if len(data) > MAX_METADATA_SIZE:
            raise CorruptSnapshotError(
                f"{_join(location, METADATA_FILE)} is larger than {MAX_METADATA_SIZE:,} bytes, the most "
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
        location = _location(location)
        fs, base = self.open(location)
        path = _contained_path(base, relative)
        if path is None:
            raise CorruptSnapshotError(
                f"{_join(location, METADATA_FILE)}: refusing state file path {str(relative)[:200]!r}: it "
                f"leads outside {_root_of(location)}. A checkpoint's files lie in its job's directory, a "
                "savepoint's in its own; the metadata is damaged or was crafted, and nothing was read"
            )
        if not isinstance(size, int) or size < 0:
            try:
                size = int(fs.size(path))
            except FileNotFoundError:
                raise CorruptSnapshotError(f"{fs.unstrip_protocol(path)}: the file is missing") from None
            except FS_ERRORS as exc:
                raise CheckpointError(f"cannot read state file {fs.unstrip_protocol(path)}: {exc}") from exc
        return FileStreamHandle(fs, path, str(relative), size)


class FileSystemCheckpointStorage:
    """Checkpoints and savepoints as files under any fsspec URL.

    Local paths, ``file://``, ``memory://``, ``s3://`` (``statekit[s3]``) and
    ``hdfs://`` (``statekit[hdfs]``) all work alike. Streams of at most
    ``inline_threshold`` bytes are inlined into ``_metadata``.

    Example::

        storage = FileSystemCheckpointStorage("s3://bucket/checkpoints")
        writer = storage.begin_checkpoint("job-1", 7)
        out = writer.create_stream("keyed-op-0.bin")
        out.write(data)
        description = out.close_and_get_handle().to_json()
        location = writer.complete(metadata)            # "s3://bucket/checkpoints/job-1/chk-7"
        storage.resolve_handle(location, description).read(0, 10)

    Attributes:
        checkpoints_dir: Where checkpoints are kept (local paths made absolute).
        savepoints_dir: The default parent of new savepoints, or None.
    """

    name = "filesystem"
    max_state_size: int | None = None

    def __init__(
        self,
        checkpoints_dir: str,
        *,
        savepoints_dir: str | None = None,
        inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        """Creates the storage; fails now if the URL's filesystem is not installed.

        Raises:
            ConfigurationError: On a negative threshold or a protocol without implementation.
        """
        self.checkpoints_dir = _normalize_dir(checkpoints_dir)
        self.savepoints_dir = None if savepoints_dir is None else _normalize_dir(savepoints_dir)
        dirs = (self.checkpoints_dir, self.savepoints_dir)
        self._files = _Files(storage_options or {}, dirs, inline_threshold)
        self._files.open(self.checkpoints_dir)
        self._prepared: set[str] = set()

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> FileSystemCheckpointStorage:
        """The registry's factory: builds the storage from its parsed options.

        Raises:
            ConfigurationError: If ``checkpoints-dir`` is unset or an option is invalid.
        """
        checkpoints_dir = options.get("checkpoints-dir")
        if not checkpoints_dir:
            raise ConfigurationError(
                "the filesystem checkpoint storage needs a directory: set statekit.checkpoints.dir "
                "(e.g. s3://bucket/checkpoints or /data/checkpoints)"
            )
        return cls(
            checkpoints_dir,
            savepoints_dir=options.get("savepoints-dir"),
            inline_threshold=options.get("inline-threshold", DEFAULT_INLINE_THRESHOLD),
            storage_options=parse_storage_options(
                options.get("storage-options"), cls.name, options.get("secret-storage-options")
            ),
        )

    def __repr__(self) -> str:
        """Names the checkpoints directory."""
        return f"FileSystemCheckpointStorage({self.checkpoints_dir!r})"

    @property
    def inline_threshold(self) -> int:
        """Streams of at most this many bytes become inline handles."""
        return self._files.inline_threshold

    def job_dir(self, job_id: str) -> str:
        """``<checkpoints dir>/<job id>``."""
        return _join(self.checkpoints_dir, _check_job_id(job_id))

    def task_owned_dir(self, job_id: str) -> str:
        """``<checkpoints dir>/<job id>/taskowned``, for state owned by tasks, not checkpoints."""
        return _join(self.job_dir(job_id), "taskowned")

    def begin_checkpoint(self, job_id: str, checkpoint_id: int) -> CheckpointWriter:
        """A writer for ``<job id>/chk-<checkpoint id>``; shared streams go to ``<job id>/shared``."""
        if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int) or checkpoint_id < 0:
            raise CheckpointError(f"invalid checkpoint id {checkpoint_id!r}: expected an integer >= 0")
        job = self.job_dir(job_id)
        writer = _FileWriter(self._files, _join(job, f"chk-{checkpoint_id}"), shared_dir="../shared")
        if writer.has_directories:  # object stores have no empty directories to create
            writer.make_dirs(".", *(() if job in self._prepared else ("../shared", "../taskowned")))
            self._prepared.add(job)
        return writer

    def begin_savepoint(self, job_id: str, target_dir: str | None = None) -> CheckpointWriter:
        """A writer for ``<target_dir or savepoints dir>/savepoint-<job[:6]>-<random hex>``.

        Raises:
            ConfigurationError: If neither ``target_dir`` nor a savepoints dir is set.
        """
        parent = target_dir if target_dir is not None else self.savepoints_dir
        return self._files.begin_savepoint(job_id, parent)

    def list_jobs(self) -> list[str]:
        """The ids of the jobs with at least one completed checkpoint, sorted."""
        fs, root = self._files.open(self.checkpoints_dir)
        try:
            names = _list_names(fs, root)
        except FS_ERRORS as exc:
            raise CheckpointError(f"cannot list {self.checkpoints_dir}: {exc}") from exc
        return [
            name
            for name in names
            if not name.startswith(".") and self._files.completed(_join(self.checkpoints_dir, name))
        ]

    def list_checkpoints(self, job_id: str) -> list[str]:
        """Locations of the completed checkpoints of ``job_id``, oldest first.

        A ``chk-<n>`` directory without ``_metadata`` (a crash before completion) is left out.
        """
        return self._files.completed(self.job_dir(job_id))

    def latest_checkpoint(self, job_id: str) -> str | None:
        """The location of the newest completed checkpoint of ``job_id``, if any."""
        done = self.list_checkpoints(job_id)
        return done[-1] if done else None

    def read_metadata(self, location: str) -> bytes:
        """The ``_metadata`` bytes of the checkpoint or savepoint at ``location``.

        Raises:
            CheckpointNotFoundError: If there is no ``_metadata`` at ``location``.
        """
        return self._files.read_metadata(location)

    def resolve_handle(self, location: str, description: Mapping[str, Any]) -> StreamStateHandle:
        """The handle a ``to_json()`` description in the metadata at ``location`` stands for."""
        return self._files.resolve_handle(location, description)

    def discard_checkpoint(self, location: str) -> None:
        """Deletes a checkpoint's ``_metadata`` (first) and exclusive files; never shared files.

        Raises:
            CheckpointError: If ``location`` is no ``chk-<n>`` directory, e.g. a savepoint.
        """
        location = _location(location)
        if not _CHECKPOINT_DIR.fullmatch(posixpath.basename(location)):
            raise CheckpointError(
                f"refusing to discard {location}: not a checkpoint directory (chk-<n>); "
                "savepoints are never deleted by a storage, delete them yourself"
            )
        fs, path = self._files.open(location)
        try:
            # Metadata first: from that moment on the checkpoint no longer exists.
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(f"{path}/{METADATA_FILE}")
            _remove_tree(fs, path)
        except FS_ERRORS as exc:
            raise CheckpointError(f"cannot discard {location}: {exc}") from exc

    def discard_shared(self, location: str, description: Mapping[str, Any]) -> None:
        """Deletes one shared file (in ``<job id>/shared/``) of the checkpoint at ``location``.

        Raises:
            CheckpointError: If the description is no shared file of a checkpoint.
        """
        if description.get("type") == "inline":
            return
        location = _location(location)
        handle = self._files.resolve_handle(location, description)
        _, path = self._files.open(location)
        shared = posixpath.normpath(f"{path}/../shared")
        if not (
            _CHECKPOINT_DIR.fullmatch(posixpath.basename(location))
            and isinstance(handle, FileStreamHandle)
            and handle.path.startswith(shared + "/")
        ):
            raise CheckpointError(
                f"refusing to delete {description.get('path')!r} of {location}: only shared files of a "
                "checkpoint (in <job id>/shared/) are deleted this way"
            )
        handle.discard()

    def discard_orphans(self, job_id: str, referenced: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
        """Deletes what failed checkpoints of ``job_id`` left: see :class:`statekit.SupportsOrphanCleanup`.

        That is every ``chk-<n>`` directory without ``_metadata`` older than the
        newest completed checkpoint, and every file under ``<job id>/shared/`` that
        no ``(location, description)`` of ``referenced`` names. Call it only when
        no checkpoint of the job is in flight (retention does).

        Raises:
            CheckpointError: If the store fails (what was deleted so far stays deleted).
        """
        job = self.job_dir(job_id)
        dirs = self._files.checkpoint_dirs(job)
        complete = [i for i, done in dirs if done]
        if not complete:
            return []
        fs, job_path = self._files.open(job)
        # One open per kept checkpoint, not per file: an incremental job references many,
        # and with skip_instance_cache every open builds a new filesystem.
        bases = {loc: self._files.open(_location(loc))[1] for loc in {loc for loc, _ in referenced}}
        keep = {
            path
            for location, description in referenced
            if description.get("type") == "file"
            and (path := _contained_path(bases[location], description.get("path"))) is not None
        }
        deleted: list[str] = []
        try:
            for i, done in dirs:
                if not done and i < complete[-1]:
                    _remove_tree(fs, f"{job_path}/chk-{i}")
                    deleted.append(_join(job, f"chk-{i}"))
            shared = f"{job_path}/shared"
            fs.invalidate_cache(shared)
            try:
                files = [posixpath.normpath(str(f)) for f in fs.find(shared)]
            except FileNotFoundError:
                files = []
            for path in files:
                if path not in keep:
                    with contextlib.suppress(FileNotFoundError):
                        fs.rm_file(path)
                    deleted.append(str(fs.unstrip_protocol(path)))
        except FS_ERRORS as exc:
            raise CheckpointError(f"cannot delete what failed checkpoints left in {job}: {exc}") from exc
        return deleted

    # --- fencing (statekit.SupportsRunFencing) --------------------------------------------

    def _runs(self, job_id: str) -> tuple[Any, str, list[tuple[int, str]]]:
        """The filesystem, the ``<job>/runs`` path and the ``(epoch, run id)`` of each record there."""
        runs = _join(self.job_dir(job_id), RUNS_DIR)
        fs, path = self._files.open(runs)
        try:
            names = _list_names(fs, path)
        except FS_ERRORS as exc:
            raise CheckpointError(f"cannot list the runs of job {job_id!r} in {runs}: {exc}") from exc
        return fs, path, sorted((int(m[1]), m[2]) for n in names if (m := _RUN_RECORD.fullmatch(n)))

    def register_run(self, job_id: str, run_id: str, description: Mapping[str, Any]) -> int:
        """Writes ``<job>/runs/run-<epoch>-<run id>.json``, ``epoch`` one above the highest there.

        Records older than the run this one displaces are deleted (best effort).
        See :class:`statekit.SupportsRunFencing`.

        Raises:
            CheckpointError: If the store fails.
        """
        if not re.fullmatch(r"[0-9a-f]{1,64}", run_id):
            raise CheckpointError(f"invalid run id {run_id!r}: expected up to 64 lowercase hex digits")
        fs, path, runs = self._runs(job_id)
        epoch = (runs[-1][0] if runs else 0) + 1
        record = f"{path}/run-{epoch}-{run_id}.json"
        data = json.dumps({**description, "run_id": run_id, "epoch": epoch}, sort_keys=True).encode()
        try:
            _publish(fs, record, data, exclusive=False, has_directories=_has_directories(fs))
        except FS_ERRORS as exc:
            where = fs.unstrip_protocol(record)
            raise CheckpointError(f"cannot record a run of job {job_id!r} at {where}: {exc}") from exc
        for old_epoch, old_run in runs:
            if old_epoch < epoch - 1:
                with contextlib.suppress(*FS_ERRORS):
                    fs.rm_file(f"{path}/run-{old_epoch}-{old_run}.json")
        fs.invalidate_cache(path)
        return epoch

    def newest_run(self, job_id: str) -> tuple[int, str, dict[str, Any]] | None:
        """``(epoch, run id, description)`` of the highest ``(epoch, run id)`` under ``<job>/runs``.

        Raises:
            CheckpointError: If the store fails.
        """
        fs, path, runs = self._runs(job_id)
        if not runs:
            return None
        epoch, run_id = runs[-1]
        return epoch, run_id, self._read_run(fs, f"{path}/run-{epoch}-{run_id}.json")

    def _read_run(self, fs: Any, record: str) -> dict[str, Any]:
        # Only for naming the run: an unreadable record still is the newest.
        try:
            obj = json.loads(bytes(fs.cat_file(record, start=0, end=_MAX_RUN_RECORD)))
        except FileNotFoundError:
            return {"runner": "a run whose record was deleted"}
        except FS_ERRORS as exc:
            return {"runner": f"a run whose record {fs.unstrip_protocol(record)} cannot be read ({exc})"}
        except ValueError:
            return {"runner": f"a run whose record {fs.unstrip_protocol(record)} is damaged"}
        return obj if isinstance(obj, dict) else {}

    def end_run(self, job_id: str, run_id: str) -> None:
        """Adds ``ended_ms`` to run ``run_id``'s record, if it is still there.

        Raises:
            CheckpointError: If the store fails.
        """
        fs, path, runs = self._runs(job_id)
        for epoch, rid in runs:
            if rid == run_id:
                record = f"{path}/run-{epoch}-{rid}.json"
                description = {**self._read_run(fs, record), "ended_ms": time.time_ns() // 1_000_000}
                data = json.dumps(description, sort_keys=True).encode()
                try:
                    _publish(fs, record, data, exclusive=False, has_directories=_has_directories(fs))
                except FS_ERRORS as exc:
                    raise CheckpointError(f"cannot record the end of a run at {record}: {exc}") from exc


def find_latest_checkpoint(directory: str, *, storage_options: Mapping[str, Any] | None = None) -> str | None:
    """The newest completed checkpoint in a job's directory, or in a checkpoints dir of one job.

    Args:
        directory: ``<checkpoints dir>/<job id>`` or ``<checkpoints dir>``.
        storage_options: fsspec storage options for ``directory``.

    Returns:
        The checkpoint's location, or None if there is none.

    Raises:
        CheckpointError: If ``directory`` holds checkpoints of several jobs.
    """
    storage = FileSystemCheckpointStorage(directory, storage_options=storage_options)
    own = storage._files.completed(storage.checkpoints_dir)
    if own:
        return own[-1]
    jobs = storage.list_jobs()
    if len(jobs) > 1:
        raise CheckpointError(
            f"{directory} holds checkpoints of several jobs ({', '.join(jobs)}); name one job's directory"
        )
    return storage.latest_checkpoint(jobs[0]) if jobs else None
