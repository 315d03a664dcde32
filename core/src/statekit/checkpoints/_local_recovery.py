"""Task-local recovery: a copy of each checkpoint file a process wrote, kept in its local directory.

Flink's task-local recovery, for processes that share one local directory
(the Python workers of one Spark executor): every file a subtask's snapshot
writes into the checkpoint storage is also kept under ``root/files``, named by
the digest the checkpoint's ``_metadata`` records for the file (the SHA-256 of
its bytes, or of its parts': :class:`~statekit.snapshots._digest.FileDigest`),
so one copy serves every checkpoint file with those bytes. A restore reads
through :class:`LocalRecoveryStorage`, which is given
the digest the restored checkpoint records for each file it names
(:func:`digests_of`): a file whose copy's bytes have that digest is read from
the copy, any other from the storage, whose bytes are counted
(:class:`Downloads`). Shared files a native snapshot downloads are kept too, so
a subtask that comes back downloads only what it does not have. Files of
checkpoints written before digests are always read from the storage.

A copy is hashed once per restore, before its first read, and bound to what
was hashed (device, inode, size, modification time); what a restore then reads
from it is not hashed again (:meth:`_LocalHandle.read_verified`). A copy that is there but
cannot be used (its bytes have another digest, it cannot be read, it vanished
or changed after it was checked) is *rejected*: the file is read from the
storage instead, and the rejection counted with its reason
(:attr:`Downloads.rejected`, which the Spark runner reports in ``BatchInfo``).
A local copy never fails a restore and never gives it other bytes.

The directory is confined (:mod:`statekit._localfs`): :class:`LocalCopies`
creates it with mode 0700 and refuses, with :class:`~statekit.errors.UnsafeLocalPathError`,
one that belongs to another user, that its group or others may write, or that
is (or passes through) a symlink; the caller then turns local recovery off
and deletes and writes nothing there. Copies, temporaries and manifests are
created exclusively (``O_EXCL | O_NOFOLLOW``, mode 0600) and renamed or linked
into place.

Copies are bounded: each subtask keeps the files of its last two snapshots
here (the one being written may never complete), and
:meth:`LocalCopies.collect` deletes every file no subtask keeps (once it is
ten minutes old: younger ones may belong to a snapshot another process has
not finished yet). Concurrent processes never share a file being written
(each writes under a unique temporary name, then links it to its digest's
name, which replaces nothing); a copy deleted under a reader only sends that
reader to the storage.

What it may import: ``_contracts``, ``snapshots``, ``statekit._localfs`` and
``statekit._errors``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._contracts import CheckpointOutputStream, CheckpointStorage, CheckpointWriter
from .._errors import CorruptSnapshotError
from .._localfs import create_exclusive, open_exclusive, private_dir, settled_before, write_atomically
from ..snapshots._digest import FileDigest, fd_has_digest, recorded_digest
from ..snapshots._snapshot import BytesStreamHandle, StreamStateHandle, describe_stream

__all__ = ["Downloads", "LocalCopies", "LocalRecoveryStorage", "LocalRecoveryWriter", "digests_of"]

_CHUNK = 4 << 20
#: A temporary file older than this is a leftover of a killed process.
_STALE_TMP_SECONDS = 3600.0
#: A copy younger than this may belong to a snapshot another process is still writing (its
#: manifest comes after its files): collect leaves it for a later round.
_GRACE_SECONDS = 600.0
_COPY_NAME = re.compile(r"[0-9a-f]{64}")
_TMP_PREFIX = ".tmp-"
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
#: Rejection reasons a restore keeps (the count is exact; the reasons are examples).
_MAX_REASONS = 10
# Copies this process hashed and found to have their digest, as they were then (path -> _Checked):
# a copy is immutable (named by its digest, written once, hard-linked, never written into), so one
# that is still the same file (device, inode, size, mtime) is not hashed again. A rewrite changes
# its mtime, a replacement its inode; either is hashed anew.
_VERIFIED: dict[str, _Checked] = {}
_VERIFIED_LOCK = threading.Lock()


def _key(description: Mapping[str, Any]) -> str | None:
    """The storage's description of a file as a short name; None for bytes inline in metadata."""
    if description.get("type") in ("bytes", "inline"):
        return None
    text = json.dumps(description, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def digests_of(state: Any) -> dict[str, FileDigest]:
    """The digest recorded for each file a subtask state's JSON names, by the file's description.

    Every entry that names a file (a ``handle``) beside its digest
    (:func:`~statekit.snapshots._digest.recorded_digest`): keyed, operator and
    native files, uploaded or referenced. A description recorded with two
    different digests (a damaged or crafted metadata) maps to none, so no local
    copy is used for it.
    """
    found: dict[str, FileDigest | None] = {}
    stack = [state]
    while stack:
        obj = stack.pop()
        if isinstance(obj, dict):
            handle = obj.get("handle")
            if isinstance(handle, dict):
                key = _key(handle)
                try:
                    sha = recorded_digest(obj)
                except CorruptSnapshotError:
                    sha = None  # the restore itself refuses the entry
                if key is not None and sha is not None:
                    found[key] = sha if found.get(key, sha) == sha else None
            stack.extend(v for k, v in obj.items() if k != "handle")
        elif isinstance(obj, list):
            stack.extend(obj)
    return {k: v for k, v in found.items() if v is not None}


class _Rejected(Exception):
    """A local copy that is there but cannot be used; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class _Checked:
    """A copy whose bytes had the digest it is named by, as it was when it was hashed."""

    path: str
    dev: int
    ino: int
    size: int
    mtime_ns: int

    def same(self, st: os.stat_result) -> bool:
        """Whether ``st`` is still the file that was hashed (a rename, rewrite or truncation is not)."""
        return stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == (
            self.dev,
            self.ino,
            self.size,
            self.mtime_ns,
        )


class Downloads:
    """Bytes read from the checkpoint storage, and from local copies, during one restore.

    Attributes:
        rejected: How many local copies were there but not used (and their
            files read from the storage instead).
        reasons: Why, one line per rejected copy naming the checkpoint file
            (at most ten are kept).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.remote_bytes = 0
        self.local_bytes = 0
        self.remote_files = 0
        self.local_files = 0
        self.rejected = 0
        self.reasons: list[str] = []

    def add(self, *, remote: int = 0, local: int = 0) -> None:
        """Count bytes read."""
        with self._lock:
            self.remote_bytes += remote
            self.local_bytes += local

    def reject(self, reason: str) -> None:
        """Count a local copy that could not be used (its file is read from the storage instead)."""
        with self._lock:
            self.rejected += 1
            if len(self.reasons) < _MAX_REASONS:
                self.reasons.append(reason)


class LocalCopies:
    """The local copies of one job operator's checkpoint files, in ``root`` (shared by processes).

    Args:
        root: The directory (``<local dir>/statekit/local-recovery/<job>/<operator>``).
        base: A trusted ancestor of ``root`` (the executor's local directory):
            every directory between it and ``root/files`` is created with mode
            0700 or checked (see :func:`statekit._localfs.private_dir`); default
            ``root``'s parent.
        grace_seconds: How old an unkept copy must be before :meth:`collect` deletes it.

    Raises:
        UnsafeLocalPathError: If a directory on the way is a symlink, another
            user's, or writable by its group or others. Nothing is written there.
    """

    def __init__(self, root: str, *, base: str | None = None, grace_seconds: float = _GRACE_SECONDS) -> None:
        self.root = os.path.abspath(root)
        self.grace_seconds = grace_seconds
        self.files = private_dir(
            os.path.join(self.root, "files"),
            base=os.path.dirname(self.root) if base is None else base,
            what="the local-recovery directory",
        )

    def path_of(self, sha256: str) -> str:
        """Where the copy of the file with this digest lies (if one is kept)."""
        return os.path.join(self.files, sha256)

    def index(self) -> dict[str, str]:
        """Every copy kept now: digest -> path."""
        with contextlib.suppress(FileNotFoundError):
            return {n: self.path_of(n) for n in os.listdir(self.files) if _COPY_NAME.fullmatch(n)}
        return {}

    def check(self, digest: FileDigest) -> _Checked | None:
        """The copy of the file with this digest, hashed now (one pass); None if there is none.

        Raises:
            _Rejected: If a copy is there but its bytes have another digest (it is
                deleted), or it cannot be read.
        """
        path = self.path_of(digest.name)
        try:
            fd = os.open(path, _READ_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as e:  # ELOOP: a symlink where a copy should be
            raise _Rejected(f"the local copy cannot be opened ({e.strerror or e})") from None
        try:
            before = os.fstat(fd)
            if not stat.S_ISREG(before.st_mode):
                raise _Rejected("the local copy is not a regular file")
            with _VERIFIED_LOCK:
                known = _VERIFIED.get(path)
            if known is not None and known.same(before) and digest.size in (None, before.st_size):
                return known  # hashed by this process, and not changed since
            hashed_at = time.time_ns()
            matches = fd_has_digest(fd, digest)
            after = os.fstat(fd)
        except OSError as e:
            raise _Rejected(f"the local copy cannot be read ({e.strerror or e})") from None
        finally:
            os.close(fd)
        checked = _Checked(path, after.st_dev, after.st_ino, after.st_size, after.st_mtime_ns)
        if not matches:
            self._remove(checked)
            raise _Rejected("the local copy's bytes are not the ones the checkpoint records")
        if not checked.same(before):
            raise _Rejected("the local copy changed while it was checked")
        # Remembered only if its mtime was well before the hash: file times tick coarsely (a few ms),
        # so a write right after an early hash could leave the mtime as it was.
        if settled_before(after.st_mtime_ns, hashed_at):
            with _VERIFIED_LOCK:
                _VERIFIED[path] = checked
        return checked

    def read(self, copy: _Checked, offset: int, length: int | None) -> bytes:
        """``length`` bytes of ``copy`` from ``offset``, if it is still the file that was hashed.

        Raises:
            _Rejected: If it was deleted, replaced or changed since, or cannot be read.
        """
        end = copy.size if length is None else offset + length
        try:
            fd = os.open(copy.path, _READ_FLAGS)
        except FileNotFoundError:
            raise _Rejected("the local copy was deleted after it was checked") from None
        except OSError as e:
            raise _Rejected(f"the local copy cannot be opened ({e.strerror or e})") from None
        try:
            if not copy.same(os.fstat(fd)):
                raise _Rejected("the local copy was replaced or changed after it was checked")
            parts = []
            pos = offset
            while pos < end:
                data = os.pread(fd, min(_CHUNK, end - pos), pos)
                if not data:
                    raise _Rejected("the local copy is shorter than when it was checked")
                parts.append(data)
                pos += len(data)
        except OSError as e:
            raise _Rejected(f"the local copy cannot be read ({e.strerror or e})") from None
        finally:
            os.close(fd)
        return b"".join(parts)

    def link(self, copy: _Checked, path: str) -> None:
        """Hard-link ``copy`` at ``path`` (a new name), if it is still the file that was hashed.

        Raises:
            _Rejected: If it was deleted, replaced or changed since (nothing is left at ``path``).
        """
        try:
            os.link(copy.path, path, follow_symlinks=False)
        except FileNotFoundError:
            raise _Rejected("the local copy was deleted after it was checked") from None
        except OSError as e:
            raise _Rejected(f"the local copy cannot be linked ({e.strerror or e})") from None
        try:
            same = copy.same(os.lstat(path))
        except OSError:
            same = False
        if not same:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise _Rejected("the local copy was replaced or changed after it was checked")

    def staged(self) -> tuple[Any, str]:
        """A new temporary file in the copies' directory (0600, exclusive): (binary file, path)."""
        fd, path = create_exclusive(self.files, f"{_TMP_PREFIX}{os.getpid()}-")
        return os.fdopen(fd, "wb"), path

    def stage_link(self, path: str) -> str:
        """A hard link to the immutable local file ``path`` under a temporary name (a copy across devices)."""
        for _ in range(100):
            staged = os.path.join(self.files, f"{_TMP_PREFIX}{os.getpid()}-{os.urandom(8).hex()}")
            try:
                os.link(path, staged, follow_symlinks=False)
                return staged
            except FileExistsError:
                continue
            except OSError:  # another file system: copy it
                break
        with open(path, "rb") as src, open_exclusive(self.files, f"{_TMP_PREFIX}{os.getpid()}-") as (dst, p):
            while data := src.read(_CHUNK):
                dst.write(data)
        return p

    def keep(self, staged: str, sha256: str) -> None:
        """Make the complete file at ``staged`` the copy of the file with this digest (replaces none)."""
        try:
            os.link(staged, self.path_of(sha256), follow_symlinks=False)
        except FileExistsError:
            pass  # kept already (a restore rejects and deletes one whose bytes are not these)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(staged)

    def adopt(self, path: str, sha256: str) -> None:
        """Keep the local file ``path``, whose bytes were checked to have this digest (linked if it can)."""
        if os.path.lexists(self.path_of(sha256)):
            return
        self.keep(self.stage_link(path), sha256)

    def _remove(self, copy: _Checked) -> None:
        """Delete a copy found bad, unless another process replaced it with a new file meanwhile."""
        with _VERIFIED_LOCK:
            _VERIFIED.pop(copy.path, None)
        with contextlib.suppress(OSError):
            st = os.lstat(copy.path)
            if (st.st_dev, st.st_ino) == (copy.dev, copy.ino):
                os.unlink(copy.path)

    def remember(self, subtask: int, digests: list[str]) -> None:
        """Subtask ``subtask``'s newest snapshot uses these files; its snapshot before stays kept too."""
        manifest = os.path.join(self.root, f"subtask-{subtask}.json")
        previous = self._manifest(manifest).get("current", [])
        body = {"current": sorted(set(digests)), "previous": previous}
        write_atomically(manifest, json.dumps(body).encode())

    @staticmethod
    def _manifest(path: str) -> dict[str, list[str]]:
        try:
            fd = os.open(path, _READ_FLAGS)
            with os.fdopen(fd, "rb") as f:
                obj = json.loads(f.read(16 << 20))
            return {k: [str(d) for d in obj[k] if isinstance(d, str)] for k in ("current", "previous")}
        except (OSError, ValueError, TypeError, KeyError):
            return {}

    def collect(self) -> int:
        """Delete every copy no subtask's manifest keeps (and stale temporaries); returns bytes freed."""
        kept: set[str] = set()
        now = time.time()
        for name in os.listdir(self.root):
            if name.startswith("subtask-") and name.endswith(".json"):
                entry = self._manifest(os.path.join(self.root, name))
                kept.update(entry.get("current", []))
                kept.update(entry.get("previous", []))
            elif name.startswith(".subtask-"):  # a manifest's temporary a killed process left
                with contextlib.suppress(OSError):
                    if now - os.lstat(os.path.join(self.root, name)).st_mtime > _STALE_TMP_SECONDS:
                        os.unlink(os.path.join(self.root, name))
        freed = 0
        for name in os.listdir(self.files):
            path = os.path.join(self.files, name)
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if name.startswith("."):
                    young = now - st.st_mtime <= _STALE_TMP_SECONDS
                elif name in kept:
                    continue
                else:
                    # ctime: a hard link made now has an old mtime but a new ctime.
                    young = now - max(st.st_mtime, st.st_ctime) < self.grace_seconds
                if young:
                    continue
                os.unlink(path)
                freed += st.st_size
        return freed

    def size(self) -> int:
        """Bytes of every copy kept now."""
        total = 0
        for name in os.listdir(self.files):
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(self.files, name)).st_size
        return total


class _Delegating:
    """A storage handle that reads in its own way and hands everything else to the storage's."""

    def __init__(self, inner: StreamStateHandle, reading: LocalRecoveryStorage) -> None:
        self._inner = inner
        self._reading = reading

    def discard(self) -> None:
        self._inner.discard()

    def to_json(self) -> dict[str, Any]:
        return self._inner.to_json()

    def _remote(self, offset: int, length: int | None) -> bytes:
        data = self._inner.read(offset, length)
        self._reading.downloads.add(remote=len(data))
        return data

    def keep_local(self, path: str, sha256: str) -> None:
        """``path`` holds this file's bytes, checked to have ``sha256`` (a native restore downloaded it)."""
        copies = self._reading.copies
        if copies is not None:
            copies.adopt(path, sha256)
            self._reading.used.append(sha256)

    def __getattr__(self, name: str) -> Any:  # what a storage's handle offers beyond the protocol
        return getattr(self._inner, name)


class _LocalHandle(_Delegating):
    """A checkpoint file read from its checked local copy; from the storage once the copy is rejected."""

    def __init__(
        self, inner: StreamStateHandle, reading: LocalRecoveryStorage, copy: _Checked, digest: FileDigest
    ) -> None:
        super().__init__(inner, reading)
        self._copy: _Checked | None = copy
        self._digest = digest

    @property
    def size(self) -> int:
        return self._inner.size if self._copy is None else self._copy.size

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        data = self.read_verified(offset, length)
        return self._remote(offset, length) if data is None else data

    def read_verified(self, offset: int = 0, length: int | None = None) -> bytes | None:
        """The bytes from the local copy, whose whole was checked against the recorded digest; None if not.

        None once the copy is rejected, or for a range outside it: then the
        caller reads the storage (:meth:`read`) and checks what it gets. A
        reader that checks parts against their digests (a canonical file's
        header and blocks) does not hash these bytes again.
        """
        copy, copies = self._copy, self._reading.copies
        # A range outside the file goes to the storage, which says what is wrong with it.
        if copy is None or copies is None or not _inside(offset, length, copy.size):
            return None
        try:
            data = copies.read(copy, offset, length)
        except _Rejected as e:
            self._reject(e.reason)
            return None
        self._reading.downloads.add(local=len(data))
        return data

    def link_verified_copy(self, path: str, sha256: str) -> bool:
        """Hard-link the local copy at ``path`` if its bytes have ``sha256``; False: download instead."""
        copy, copies = self._copy, self._reading.copies
        if copy is None or copies is None or sha256 != self._digest.name:
            return False
        try:
            copies.link(copy, path)
        except _Rejected as e:
            self._reject(e.reason)
            return False
        self._reading.downloads.add(local=copy.size)
        return True

    def _reject(self, reason: str) -> None:
        self._copy = None
        self._reading.reject(self._digest.name, self._inner, reason)
        with self._reading.downloads._lock:
            self._reading.downloads.remote_files += 1  # from now on this file is read from the storage


def _inside(offset: int, length: int | None, size: int) -> bool:
    return 0 <= offset <= size and (length is None or 0 <= length <= size - offset)


class _CountedHandle(_Delegating):
    """A checkpoint file read from the storage, counted; downloaded shared files may be kept locally."""

    @property
    def size(self) -> int:
        return self._inner.size

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        return self._remote(offset, length)


class LocalRecoveryStorage:
    """A checkpoint storage whose reads prefer checked local copies; everything else goes to ``inner``.

    Args:
        inner: The checkpoint storage.
        copies: The local copies, or None to only count what is read from ``inner``.
        downloads: Where reads and rejected copies are counted.
        digests: The digest the restored checkpoint records for each file, by
            the file's description (:func:`digests_of` of its subtask entries).
            A file without one is read from ``inner``.

    ``used`` lists the digests of every copy a restore read or kept, so the
    subtask's manifest keeps them.
    """

    def __init__(
        self,
        inner: CheckpointStorage,
        copies: LocalCopies | None,
        downloads: Downloads,
        digests: Mapping[str, FileDigest] | None = None,
    ) -> None:
        self._inner = inner
        self.copies = copies
        self.downloads = downloads
        self.used: list[str] = []
        self._digests = dict(digests or {})
        self._checked: dict[str, _Checked | None] = {}  # each copy is hashed once per restore, by name
        self.name = inner.name
        self.max_state_size = inner.max_state_size

    def resolve_handle(self, location: str, description: Mapping[str, Any]) -> StreamStateHandle:
        """The file's checked local copy if one is kept, else the storage's (counted) handle."""
        inner = self._inner.resolve_handle(location, description)
        key = _key(description)
        if key is None or isinstance(inner, BytesStreamHandle):
            return inner
        sha = self._digests.get(key)
        copy = self._check(sha, inner) if sha is not None and self.copies is not None else None
        if copy is None or sha is None:
            self.downloads.remote_files += 1
            return _CountedHandle(inner, self)
        self.used.append(sha.name)
        self.downloads.local_files += 1
        return _LocalHandle(inner, self, copy, sha)

    def _check(self, digest: FileDigest, inner: StreamStateHandle) -> _Checked | None:
        if digest.name in self._checked:
            return self._checked[digest.name]
        assert self.copies is not None
        try:
            copy = self.copies.check(digest)
        except _Rejected as e:
            self.reject(digest.name, inner, e.reason)
            return None
        self._checked[digest.name] = copy
        return copy

    def reject(self, sha256: str, inner: StreamStateHandle, reason: str) -> None:
        """Never use the copy of ``sha256`` again in this restore; count it, naming the file."""
        self._checked[sha256] = None
        self.downloads.reject(f"{describe_stream(inner)}: {reason}; read from the checkpoint storage instead")

    def __getattr__(self, name: str) -> Any:  # the rest of the storage, unchanged
        return getattr(self._inner, name)


class _TeeStream:
    """Writes into the storage's stream and into a local temporary file, staged on success."""

    def __init__(self, inner: CheckpointOutputStream, writer: LocalRecoveryWriter) -> None:
        self._inner = inner
        self._writer = writer
        self._local: Any
        self._tmp: str | None
        self._local, self._tmp = writer.copies.staged()
        self._linked: str | None = None

    def write(self, data: bytes) -> int:
        n = self._inner.write(data)
        if self._local is not None:
            try:
                self._local.write(data)
            except OSError:  # a full local disk: no copy, the checkpoint file is still written
                self._drop_local()
        return n

    def tell(self) -> int:
        return self._inner.tell()

    def link_source(self, path: str) -> None:
        """The bytes come from the immutable local file ``path``: keep a hard link, not a second copy.

        A source that changed after all fails its digest when a restore checks
        the copy, and the storage is read instead.
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
                self._writer.stage(key, self._writer.copies.stage_link(self._linked))
            elif self._local is not None and self._tmp is not None:
                self._local.close()
                self._local = None
                self._writer.stage(key, self._tmp)
                self._tmp = None
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
            with contextlib.suppress(OSError):
                local.close()
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


class LocalRecoveryWriter:
    """A checkpoint writer whose streams also leave local copies.

    Each stream's bytes are staged under a temporary name as they are written;
    :meth:`keep` names them by the digests the subtask's metadata entry
    records (so the copy is named by the digest a restore will ask for), or
    :meth:`discard_staged` deletes them.
    """

    def __init__(self, inner: CheckpointWriter, copies: LocalCopies) -> None:
        self._inner = inner
        self.copies = copies
        self._staged: dict[str, str] = {}

    @property
    def location(self) -> str:
        """The checkpoint's location."""
        return self._inner.location

    def create_stream(self, name: str, *, shared: bool = False) -> CheckpointOutputStream:
        """The storage's stream for ``name``, copied locally as it is written."""
        inner = self._inner.create_stream(name, shared=shared)
        try:
            return _TeeStream(inner, self)
        except OSError:
            return inner  # no local copy (a full local disk): the checkpoint is still written

    def stage(self, key: str, path: str) -> None:
        """The bytes of the file described by ``key`` lie complete at ``path`` (a temporary name)."""
        old = self._staged.pop(key, None)
        if old is not None:
            with contextlib.suppress(OSError):
                os.unlink(old)
        self._staged[key] = path

    def keep(self, state: Any) -> list[str]:
        """Keep each staged file under the digest ``state`` (a subtask entry's JSON) records for it.

        Returns:
            The digests of every file ``state`` names (written here or referenced),
            for the subtask's manifest.
        """
        digests = digests_of(state)
        staged, self._staged = self._staged, {}
        for key, path in staged.items():
            sha = digests.get(key)
            if sha is None:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                continue
            with contextlib.suppress(OSError):
                self.copies.keep(path, sha.name)
        return sorted({d.name for d in digests.values()})

    def discard_staged(self) -> None:
        """Delete every staged file (the snapshot failed)."""
        staged, self._staged = self._staged, {}
        for path in staged.values():
            with contextlib.suppress(OSError):
                os.unlink(path)

    def complete(self, metadata: bytes) -> str:
        """Complete the checkpoint (the storage's writer does)."""
        return self._inner.complete(metadata)

    def abort(self) -> None:
        """Abort the checkpoint (the storage's writer does)."""
        self._inner.abort()
