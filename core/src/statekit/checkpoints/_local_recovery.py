"""Task-local recovery: a copy of each checkpoint file a process wrote, kept in its local directory.

Flink's task-local recovery, for processes that share one local directory
(the Python workers of one Spark executor): every file a subtask's snapshot
writes into the checkpoint storage is also kept under ``root/files``, named
after the storage's own description of the file (which names the attempt
that wrote it: no two checkpoint files share one). A restore reads through
:class:`LocalRecoveryStorage`: a file with a local copy is read from it, any
other from the storage, whose bytes are counted (:class:`Downloads`). Shared
files a native snapshot downloads are kept too, so a subtask that comes back
downloads only what it does not have.

A local copy is used only if it is the very file the checkpoint names (the
description decides) and its bytes still have the CRC-32 recorded when it was
kept (checked before its first read); anything else is deleted and read from
the storage. Copies are bounded: each subtask keeps the files of its last two
snapshots here (the one being written may never complete), and
:meth:`LocalCopies.collect` deletes every file no subtask keeps (once it is
ten minutes old: younger ones may belong to a snapshot another process has
not finished yet). Concurrent
processes never share a file being written (each writes under a unique
temporary name and renames); a copy deleted under a reader only sends that
reader to the storage.

What it may import: ``_contracts``, ``snapshots`` and ``statekit._errors``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from .._contracts import CheckpointOutputStream, CheckpointStorage, CheckpointWriter
from ..snapshots._snapshot import BytesStreamHandle, StreamStateHandle

__all__ = ["Downloads", "LocalCopies", "LocalRecoveryStorage", "LocalRecoveryWriter"]

_CHUNK = 4 << 20
#: A temporary file older than this is a leftover of a killed process.
_STALE_TMP_SECONDS = 3600.0
#: A copy younger than this may belong to a snapshot another process is still writing (its
#: manifest comes after its files): collect leaves it for a later round.
_GRACE_SECONDS = 600.0


def _key(description: Mapping[str, Any]) -> str | None:
    """The local name of the file a storage describes so; None for bytes inline in metadata."""
    if description.get("type") == "bytes":
        return None
    text = json.dumps(description, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _crc_of(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while data := f.read(_CHUNK):
            crc = zlib.crc32(data, crc)
    return crc


class Downloads:
    """Bytes read from the checkpoint storage, and from local copies, during one restore."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.remote_bytes = 0
        self.local_bytes = 0
        self.remote_files = 0
        self.local_files = 0

    def add(self, *, remote: int = 0, local: int = 0) -> None:
        """Count bytes read."""
        with self._lock:
            self.remote_bytes += remote
            self.local_bytes += local


class LocalCopies:
    """The local copies of one job operator's checkpoint files, in ``root`` (shared by processes)."""

    def __init__(self, root: str, *, grace_seconds: float = _GRACE_SECONDS) -> None:
        self.root = root
        self.grace_seconds = grace_seconds
        self.files = os.path.join(root, "files")
        os.makedirs(self.files, exist_ok=True)

    def index(self) -> dict[str, str]:
        """Every copy kept now: local name -> path (``<name>.<crc32 hex>``)."""
        found: dict[str, str] = {}
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.files):
                if not name.startswith("."):
                    found[name.rsplit(".", 1)[0]] = os.path.join(self.files, name)
        return found

    def verified(self, key: str, index: Mapping[str, str] | None = None) -> str | None:
        """The copy of file ``key`` if its bytes still have its recorded CRC-32; deleted if not."""
        path = (self.index() if index is None else index).get(key)
        if path is None:
            return None
        try:
            expected = int(path.rsplit(".", 1)[1], 16)
            if _crc_of(path) == expected:
                return path
        except (OSError, ValueError):
            pass
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None

    def temporary(self) -> str:
        """A fresh temporary path in the copies' directory (never collected while young)."""
        return os.path.join(self.files, f".tmp-{os.getpid()}-{os.urandom(6).hex()}")

    def keep(self, key: str, staged: str, crc: int) -> None:
        """Make the complete file at ``staged`` the copy of ``key`` (atomically; replaces none)."""
        os.replace(staged, os.path.join(self.files, f"{key}.{crc:08x}"))

    def adopt(self, key: str, path: str, crc: int) -> None:
        """Keep the immutable local file ``path`` (a hard link; a copy across file systems)."""
        if key in self.index():
            return
        staged = self.temporary()
        try:
            try:
                os.link(path, staged)
            except OSError:
                with open(path, "rb") as src, open(staged, "wb") as dst:
                    while data := src.read(_CHUNK):
                        dst.write(data)
            self.keep(key, staged, crc)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(staged)

    @staticmethod
    def keys_of(state: Any) -> list[str]:
        """The local names of every file a subtask state's JSON describes (uploaded or referenced)."""
        keys: list[str] = []
        stack = [state]
        while stack:
            obj = stack.pop()
            if isinstance(obj, dict):
                handle = obj.get("handle")
                if isinstance(handle, dict):
                    key = _key(handle)
                    if key is not None:
                        keys.append(key)
                stack.extend(v for k, v in obj.items() if k != "handle")
            elif isinstance(obj, list):
                stack.extend(obj)
        return keys

    def remember(self, subtask: int, keys: Sequence[str]) -> None:
        """Subtask ``subtask``'s newest snapshot here uses ``keys``; its snapshot before stays kept too."""
        manifest = os.path.join(self.root, f"subtask-{subtask}.json")
        previous: list[str] = []
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError), open(manifest) as f:
            previous = list(json.load(f)["current"])
        staged = os.path.join(self.root, f".subtask-{subtask}-{os.getpid()}-{os.urandom(4).hex()}")
        with open(staged, "w") as f:
            json.dump({"current": sorted(set(keys)), "previous": previous}, f)
        os.replace(staged, manifest)

    def collect(self) -> int:
        """Delete every copy no subtask's manifest keeps (and stale temporaries); returns bytes freed."""
        kept: set[str] = set()
        for name in os.listdir(self.root):
            if name.startswith("subtask-") and name.endswith(".json"):
                with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                    with open(os.path.join(self.root, name)) as f:
                        entry = json.load(f)
                    kept.update(entry["current"])
                    kept.update(entry["previous"])
        freed = 0
        now = time.time()
        for name in os.listdir(self.files):
            path = os.path.join(self.files, name)
            if name.startswith("."):
                with contextlib.suppress(OSError):
                    if now - os.stat(path).st_mtime > _STALE_TMP_SECONDS:
                        freed += os.stat(path).st_size
                        os.unlink(path)
                continue
            if name.rsplit(".", 1)[0] not in kept:
                with contextlib.suppress(OSError):
                    st = os.stat(path)
                    # ctime: a hard link made now has an old mtime but a new ctime.
                    if now - max(st.st_mtime, st.st_ctime) < self.grace_seconds:
                        continue
                    freed += st.st_size
                    os.unlink(path)
        return freed

    def size(self) -> int:
        """Bytes of every copy kept now."""
        total = 0
        for name in os.listdir(self.files):
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(self.files, name)).st_size
        return total


class _Delegating:
    """A storage handle that reads in its own way and hands everything else to the storage's."""

    def __init__(self, inner: StreamStateHandle, downloads: Downloads) -> None:
        self._inner = inner
        self._downloads = downloads

    def discard(self) -> None:
        self._inner.discard()

    def to_json(self) -> dict[str, Any]:
        return self._inner.to_json()

    def __getattr__(self, name: str) -> Any:  # what a storage's handle offers beyond the protocol
        return getattr(self._inner, name)


class _LocalHandle(_Delegating):
    """A checkpoint file read from its local copy; the storage's handle for everything else."""

    def __init__(self, inner: StreamStateHandle, path: str, downloads: Downloads) -> None:
        super().__init__(inner, downloads)
        self._path = path

    @property
    def size(self) -> int:
        return os.stat(self._path).st_size

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        with open(self._path, "rb") as f:
            f.seek(offset)
            data = f.read(-1 if length is None else length)
        self._downloads.add(local=len(data))
        return data

    def local_file(self) -> str:
        """The verified local copy (native restores hard-link it instead of copying)."""
        self._downloads.add(local=self.size)
        return self._path


class _CountedHandle(_Delegating):
    """A checkpoint file read from the storage, counted; downloaded shared files may be kept locally."""

    def __init__(
        self,
        inner: StreamStateHandle,
        key: str,
        copies: LocalCopies | None,
        downloads: Downloads,
        kept: list[str],
    ) -> None:
        super().__init__(inner, downloads)
        self._key = key
        self._copies = copies
        self._kept = kept

    @property
    def size(self) -> int:
        return self._inner.size

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        data = self._inner.read(offset, length)
        self._downloads.add(remote=len(data))
        return data

    def keep_local(self, path: str, crc32: int) -> None:
        """``path`` holds this file's verified bytes (a native restore downloaded it): keep a copy."""
        if self._copies is not None:
            self._copies.adopt(self._key, path, crc32)
            self._kept.append(self._key)


class LocalRecoveryStorage:
    """A checkpoint storage whose reads prefer local copies; everything else goes to ``inner``.

    With ``copies`` None it only counts what is read from ``inner``. ``used``
    lists the local names of every file a restore read locally or kept, so the
    subtask's manifest keeps them.
    """

    def __init__(self, inner: CheckpointStorage, copies: LocalCopies | None, downloads: Downloads) -> None:
        self._inner = inner
        self.copies = copies
        self.downloads = downloads
        self.used: list[str] = []
        self._index: dict[str, str] | None = None
        self.name = inner.name
        self.max_state_size = inner.max_state_size

    def resolve_handle(self, location: str, description: Mapping[str, Any]) -> StreamStateHandle:
        """The file's local copy if a verified one is kept, else the storage's (counted) handle."""
        inner = self._inner.resolve_handle(location, description)
        key = _key(description)
        if key is None or isinstance(inner, BytesStreamHandle):
            return inner
        if self.copies is None:
            self.downloads.remote_files += 1
            return _CountedHandle(inner, key, None, self.downloads, self.used)
        if self._index is None:
            self._index = self.copies.index()
        path = self.copies.verified(key, self._index)
        if path is not None:
            self.used.append(key)
            self.downloads.local_files += 1
            return _LocalHandle(inner, path, self.downloads)
        self.downloads.remote_files += 1
        return _CountedHandle(inner, key, self.copies, self.downloads, self.used)

    def __getattr__(self, name: str) -> Any:  # the rest of the storage, unchanged
        return getattr(self._inner, name)


class _TeeStream:
    """Writes into the storage's stream and into a local temporary file; keeps it on success."""

    def __init__(self, inner: CheckpointOutputStream, copies: LocalCopies, kept: list[str]) -> None:
        self._inner = inner
        self._copies = copies
        self._kept = kept
        self._tmp: str | None = copies.temporary()
        self._local: Any = open(self._tmp, "wb")  # noqa: SIM115 - closed in close/discard
        self._crc = 0
        self._linked: str | None = None

    def write(self, data: bytes) -> int:
        n = self._inner.write(data)
        if self._local is not None:
            try:
                self._local.write(data)
            except OSError:  # a full local disk: no copy, the checkpoint file is still written
                self._drop_local()
        self._crc = zlib.crc32(data, self._crc)
        return n

    def tell(self) -> int:
        return self._inner.tell()

    def link_source(self, path: str) -> None:
        """The bytes come from the immutable local file ``path``: keep a hard link, not a second copy.

        The link is kept under the CRC-32 of the bytes written, so a source that
        changed after all is never used (it fails the check before its first read).
        """
        self._drop_local()
        self._linked = path

    def close_and_get_handle(self) -> StreamStateHandle:
        handle = self._inner.close_and_get_handle()
        key = _key(handle.to_json())
        try:
            if key is None or isinstance(handle, BytesStreamHandle):
                self._drop_local()
            elif self._linked is not None:
                self._copies.adopt(key, self._linked, self._crc)
                self._kept.append(key)
            elif self._local is not None and self._tmp is not None:
                self._local.close()
                self._local = None
                self._copies.keep(key, self._tmp, self._crc)
                self._tmp = None
                self._kept.append(key)
        except OSError:
            self._drop_local()  # a local copy is an optimization: the checkpoint file is written
        return handle

    def discard(self) -> None:
        self._drop_local()
        self._inner.discard()

    def _drop_local(self) -> None:
        local, self._local = self._local, None
        tmp, self._tmp = self._tmp, None
        if local is not None:
            local.close()
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


class LocalRecoveryWriter:
    """A checkpoint writer whose streams also leave local copies; ``kept`` lists their local names."""

    def __init__(self, inner: CheckpointWriter, copies: LocalCopies) -> None:
        self._inner = inner
        self._copies = copies
        self.kept: list[str] = []

    @property
    def location(self) -> str:
        """The checkpoint's location."""
        return self._inner.location

    def create_stream(self, name: str, *, shared: bool = False) -> CheckpointOutputStream:
        """The storage's stream for ``name``, copied locally as it is written."""
        inner = self._inner.create_stream(name, shared=shared)
        try:
            return _TeeStream(inner, self._copies, self.kept)
        except OSError:
            return inner  # no local copy (a full local disk): the checkpoint is still written

    def complete(self, metadata: bytes) -> str:
        """Complete the checkpoint (the storage's writer does)."""
        return self._inner.complete(metadata)

    def abort(self) -> None:
        """Abort the checkpoint (the storage's writer does)."""
        self._inner.abort()
