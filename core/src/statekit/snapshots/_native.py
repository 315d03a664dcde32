"""Native snapshots: a backend's own files, uploaded incrementally and referenced across checkpoints.

A native snapshot of one subtask is a set of files (an engine's SST files,
say) plus a little JSON of the backend's own. Each file is either *uploaded*
by the checkpoint that takes the snapshot, or a *reference* to a file that an
earlier, **completed** checkpoint uploaded into the storage's shared area:
immutable engine files are sent once and then referenced, as Flink's
incremental RocksDB checkpoints do.

The life of an upload, for a backend author::

    snap = backend.native_snapshot(7)          # on the task thread: freeze the state now
    handle = snap.write(out)                   # later, maybe on another thread: upload
    ...                                        # the runner completes checkpoint 7
    backend.notify_checkpoint_complete(7)      # from now on, 7's uploads may be referenced
    # or: backend.notify_checkpoint_aborted(7) # 7's uploads must never be referenced

An upload of a checkpoint that failed (or whose completion never reached the
backend) can be deleted at any time. The coordinator counts references per
shared file (:meth:`NativeStateHandle.shared_descriptions`), and retention
deletes a shared file once no retained checkpoint references it.

The completion contract follows: :data:`COMPLETION_CONTRACT`, written once
here and appended to this docstring, to :class:`statekit.backend_api.SupportsNativeSnapshot`'s
and to :mod:`statekit.testing`'s when they are imported.
"""

from __future__ import annotations

import contextlib
import os
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from .._errors import CorruptSnapshotError
from ..serialization._keygroups import KeyGroupRange
from ._digest import NOT_RECORDED, new_sha256, parse_sha256
from ._snapshot import ProgressCallback, StreamStateHandle, describe_stream

__all__ = [
    "COMPLETION_CONTRACT",
    "NativeFile",
    "NativeSnapshot",
    "NativeSnapshotOutput",
    "NativeStateHandle",
    "WriterNativeOutput",
    "upload_native_file",
]

#: The one rule of native snapshots, as backend authors read it (docs/writing-a-backend.md quotes it).
COMPLETION_CONTRACT = """\
The completion contract. The snapshot of checkpoint n may reference a file (put into its handle a
NativeFile that out.upload returned for an earlier checkpoint, instead of uploading the file again)
only if the checkpoint m that uploaded it, with shared=True, was confirmed to this backend instance
by notify_checkpoint_complete(m) before n's snapshot references it. Nothing else is ever referenced:
not an upload of a checkpoint that was aborted (notify_checkpoint_aborted) or never confirmed, even
once a later checkpoint completes (the completion of m says nothing about the checkpoints before m),
and not a file of a restored snapshot unless the restored checkpoint is confirmed the same way:
restore_native(handles) followed by notify_checkpoint_complete(c), c the checkpoint id of the
handles, lets the instance reference the files of those handles it still holds (Flink's claim of its
own checkpoints; runners confirm only a completed checkpoint of the same job in the storage the
backend checkpoints into, never a savepoint), and without it the first checkpoint after a restore
uploads every file. A backend needs to know nothing more: it keeps each checkpoint's uploads by
checkpoint id (out.checkpoint_id), and a restore's files by the restored checkpoint's id, until that
checkpoint is confirmed or aborted, and one set of referenceable uploads, whatever output or storage
a snapshot writes to: the shared files the handle of the last confirmed checkpoint holds, uploaded
or referenced (KeyedBackendBase keeps it: native_uploads). Retention deletes a shared file once no
retained checkpoint references it and always keeps the newest completed checkpoint, so exactly
those files are sure to exist; a file that only an older confirmed checkpoint held may be gone and
is uploaded again. File names need to be unique within one handle only: out.upload stores every
shared upload under a stream name of its own, so two checkpoints uploading the same name or the
same bytes make two uploads. Runners and the kit confirm a checkpoint only where every later checkpoint of
the backend can reach its files: a runner sends all native checkpoints of a backend into one
checkpoint storage, and the kit confirms the native snapshots it writes into memory only while the
backend checkpoints nowhere else (its state machines that also checkpoint through a storage abort
them).
"""
if __doc__ is not None:  # None under python -OO
    __doc__ += "\n" + COMPLETION_CONTRACT

_CHUNK = 4 << 20


@dataclass(frozen=True)
class NativeFile:
    """One file of a native snapshot, as the storage holds it.

    Attributes:
        name: The backend's own name for the file (``000012.sst``).
        stream: Where its bytes are.
        size: Its size in bytes.
        crc32: The CRC-32 of its bytes (what statekit checked before digests;
            still written, for older readers).
        shared: True if it lies in the storage's shared area, so later
            checkpoints may reference it; False for files of this checkpoint only.
        checkpoint_id: The checkpoint that uploaded it. A handle of checkpoint
            ``n`` whose file has another id references an earlier upload.
        sha256: The SHA-256 of its bytes (lowercase hex), computed by
            :func:`upload_native_file` as they were uploaded and checked on
            every read; None for a file uploaded by a statekit before digests,
            whose reads check the CRC-32. A snapshot that references the file
            carries it forward (it reuses this object).
    """

    name: str
    stream: StreamStateHandle
    size: int
    crc32: int
    shared: bool
    checkpoint_id: int
    sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The file's entry in checkpoint metadata."""
        entry = {
            "name": self.name,
            "handle": self.stream.to_json(),
            "size": self.size,
            "crc32": self.crc32,
            "shared": self.shared,
            "checkpoint_id": self.checkpoint_id,
        }
        if self.sha256 is not None:
            entry["sha256"] = self.sha256
        return entry

    @classmethod
    def from_json(
        cls, obj: Mapping[str, Any], resolve: Callable[[Mapping[str, Any]], StreamStateHandle]
    ) -> NativeFile:
        """Parse :meth:`to_json` output; ``resolve`` turns a handle description into a stream."""
        try:
            return cls(
                str(obj["name"]),
                resolve(obj["handle"]),
                int(obj["size"]),
                int(obj["crc32"]),
                bool(obj["shared"]),
                int(obj["checkpoint_id"]),
                parse_sha256(obj.get("sha256"), f"native file {obj.get('name')!r}"),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CorruptSnapshotError(f"malformed native file entry {str(obj)[:200]}: {e!r}") from None

    def chunks(self, chunk_size: int = _CHUNK) -> Iterable[bytes]:
        """The file's bytes in chunks; the size and digest are checked after the last one.

        The digest is the SHA-256 where the checkpoint records one, else the
        CRC-32 (a file uploaded before digests). A caller must not use the
        bytes before the last chunk was yielded without an error.

        Raises:
            CorruptSnapshotError: Naming the file, if its bytes are not what was uploaded.
        """
        self._check_size()
        sha = new_sha256() if self.sha256 is not None else None
        # A local copy checked whole against this digest (task-local recovery) vouches for the
        # bytes it gives: they are not hashed again. If it is rejected part-way, the bytes it
        # gave are hashed from the storage, with the rest.
        read_verified = getattr(self.stream, "read_verified", None) if sha is not None else None
        trusted = 0  # the leading bytes the checked copy gave
        crc = 0
        pos = 0
        while pos < self.size:
            n = min(chunk_size, self.size - pos)
            data = read_verified(pos, n) if read_verified is not None and trusted == pos else None
            if data is not None:
                trusted += len(data)
            else:
                if trusted and trusted == pos and sha is not None:
                    self._hash_from_storage(sha, trusted, chunk_size)
                data = self.stream.read(pos, n)
                if sha is not None:
                    sha.update(data)
                else:
                    crc = zlib.crc32(data, crc)
            if not data:
                break
            pos += len(data)
            yield data
        if trusted and trusted == self.size:
            return
        if sha is not None:
            self._check_sha256(sha, pos)
        elif pos != self.size or crc != self.crc32:
            raise CorruptSnapshotError(
                f"{describe_stream(self.stream)}: native file {self.name}: checksum mismatch; "
                "the file is corrupt"
            )

    def _check_sha256(self, sha: Any, length: int) -> None:
        """The bytes read (``length`` of them, hashed into ``sha``) must be the ones recorded."""
        if length != self.size or sha.hexdigest() != self.sha256:
            raise CorruptSnapshotError(
                f"{describe_stream(self.stream)}: native file {self.name}: {NOT_RECORDED}"
            )

    def _check_size(self) -> None:
        if self.stream.size != self.size:
            raise CorruptSnapshotError(
                f"{describe_stream(self.stream)}: native file {self.name} has {self.stream.size} bytes, "
                f"the checkpoint says {self.size}; the file is truncated or was replaced"
            )

    def _hash_from_storage(self, sha: Any, length: int, chunk_size: int) -> None:
        """Hash the file's first ``length`` bytes as :meth:`read <StreamStateHandle.read>` gives them now."""
        pos = 0
        while pos < length:
            data = self.stream.read(pos, min(chunk_size, length - pos))
            if not data:
                return  # short: the size check after the last chunk fails
            sha.update(data)
            pos += len(data)

    def read(self) -> bytes:
        """The whole file, checked (see :meth:`chunks`).

        A file with a SHA-256 is read in one request and hashed after, as one
        object: joining chunks held the file twice in memory and copied it
        once more (at 290 MB a file, 0.3-0.7 s of a restore on a 2-core
        machine). A local copy checked whole gives its bytes as they are.
        """
        if self.sha256 is None:
            return b"".join(self.chunks())
        self._check_size()
        read_verified = getattr(self.stream, "read_verified", None)
        if read_verified is not None:
            trusted = read_verified(0, self.size)
            if trusted is not None and len(trusted) == self.size:
                return bytes(trusted)
            return b"".join(self.chunks())  # the copy was rejected: the storage's bytes, chunk by chunk
        data = self.stream.read(0, self.size) if self.size else b""
        sha = new_sha256()
        sha.update(data)
        self._check_sha256(sha, len(data))
        return data

    def copy_to(self, path: str | os.PathLike[str], *, link: bool = False) -> None:
        """Download the file to local ``path``, checked; nothing is left at ``path`` on error.

        Args:
            path: Where the file goes.
            link: True if the caller never modifies the file at ``path`` (an
                engine's immutable file, such as a RocksDB SST). Then a local copy
                that task-local recovery kept of it, whose bytes have this file's
                SHA-256, is hard-linked instead of copied, and a downloaded file is
                kept as such a copy for the next restore on this machine. Never
                pass True for a file the engine writes into (an LMDB data file).
                Files without a recorded SHA-256 (uploaded before digests) are
                always downloaded.
        """
        if link and self.sha256 is not None:
            linked = getattr(self.stream, "link_verified_copy", None)
            if linked is not None and linked(os.fspath(path), self.sha256):
                return
        try:
            with open(path, "wb") as f:
                for data in self.chunks():
                    f.write(data)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        if link and self.sha256 is not None:
            keep = getattr(self.stream, "keep_local", None)
            if keep is not None:
                with contextlib.suppress(OSError):
                    keep(os.fspath(path), self.sha256)


@dataclass(frozen=True)
class NativeStateHandle:
    """One subtask's native snapshot: its files and what a restore must check first.

    Attributes:
        format: The backend's :attr:`~statekit.backend_api.SupportsNativeSnapshot.native_format`.
        backend: The backend's name.
        checkpoint_id: The checkpoint that took it.
        key_group_range: The key groups it holds (the owner's range, or a part of it).
        max_parallelism: The job's max parallelism.
        key_serializer: The key serializer's config.
        states: Each state's entry (``RegisteredState.meta()``), as canonical headers hold them.
        files: Every file the snapshot consists of, uploaded or referenced.
        meta: The backend's own JSON (sequence numbers, column families, ...).
        entries: The number of (key, namespace) entries, if the backend knows it (else 0).
    """

    format: str
    backend: str
    checkpoint_id: int
    key_group_range: KeyGroupRange
    max_parallelism: int
    key_serializer: dict[str, Any]
    states: list[dict[str, Any]]
    files: tuple[NativeFile, ...]
    meta: dict[str, Any] = field(default_factory=dict)
    entries: int = 0

    @property
    def size(self) -> int:
        """Bytes of all its files."""
        return sum(f.size for f in self.files)

    @property
    def uploaded_size(self) -> int:
        """Bytes this checkpoint uploaded (the rest it referenced)."""
        return sum(f.size for f in self.files if f.checkpoint_id == self.checkpoint_id)

    def file(self, name: str) -> NativeFile:
        """The file named ``name``."""
        for f in self.files:
            if f.name == name:
                return f
        raise CorruptSnapshotError(f"native snapshot of {self.key_group_range} has no file {name!r}")

    def shared_descriptions(self) -> list[dict[str, Any]]:
        """Storage descriptions of its shared files: what retention counts references of."""
        return [f.stream.to_json() for f in self.files if f.shared]

    def intersect(self, key_groups: KeyGroupRange) -> NativeStateHandle | None:
        """The same snapshot, limited to ``key_groups`` (the files stay: they hold ranges)."""
        r = self.key_group_range.intersection(key_groups)
        if not len(r):
            return None
        return replace(self, key_group_range=r)

    def to_json(self) -> dict[str, Any]:
        """The handle's part of checkpoint metadata."""
        return {
            "format": self.format,
            "backend": self.backend,
            "checkpoint_id": self.checkpoint_id,
            "key_group_range": [self.key_group_range.start, self.key_group_range.end],
            "max_parallelism": self.max_parallelism,
            "key_serializer": self.key_serializer,
            "states": self.states,
            "files": [f.to_json() for f in self.files],
            "meta": self.meta,
            "entries": self.entries,
        }

    @classmethod
    def from_json(
        cls, obj: Mapping[str, Any], resolve: Callable[[Mapping[str, Any]], StreamStateHandle]
    ) -> NativeStateHandle:
        """Parse :meth:`to_json` output; ``resolve`` turns a file's handle description into a stream."""
        try:
            start, end = obj["key_group_range"]
            return cls(
                format=str(obj["format"]),
                backend=str(obj.get("backend", "")),
                checkpoint_id=int(obj["checkpoint_id"]),
                key_group_range=KeyGroupRange.of(int(start), int(end)),
                max_parallelism=int(obj["max_parallelism"]),
                key_serializer=dict(obj["key_serializer"]),
                states=list(obj["states"]),
                files=tuple(NativeFile.from_json(f, resolve) for f in obj["files"]),
                meta=dict(obj.get("meta") or {}),
                entries=int(obj.get("entries", 0)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CorruptSnapshotError(f"malformed native snapshot handle: {e!r}") from None


@runtime_checkable
class NativeSnapshotOutput(Protocol):
    """Where a native snapshot's files go: core gives one to :meth:`NativeSnapshot.write`."""

    @property
    def checkpoint_id(self) -> int:
        """The checkpoint being written."""

    def upload(self, name: str, source: str | os.PathLike[str] | bytes, *, shared: bool = True) -> NativeFile:
        """Upload a local file (a path) or bytes as the snapshot's file ``name``."""


@runtime_checkable
class NativeSnapshot(Protocol):
    """A native snapshot taken (frozen) but not yet written."""

    def write(
        self, out: NativeSnapshotOutput, *, progress: ProgressCallback | None = None
    ) -> NativeStateHandle:
        """Upload what is new, reference what completed checkpoints uploaded; returns the handle.

        Args:
            out: Where the files go: ``out.upload(name, path_or_bytes, shared=...)``
                returns each file's :class:`NativeFile`; ``out.checkpoint_id`` is the
                checkpoint being written (remember the uploads under it until it is
                confirmed or aborted; see the completion contract in this module).
            progress: None, or a callback to call as ``progress(done, total)`` while
                uploading (files or bytes so far, of how many; the last call with
                ``done == total``), from the thread ``write`` runs on. Runners and
                the CLI draw it; ignoring it loses only the display.

        Returns:
            The snapshot's handle (``KeyedBackendBase.native_handle`` fills it in).
        """

    def release(self) -> None:
        """Give the snapshot up without writing it (idempotent; ``write`` releases too)."""


def upload_native_file(
    create_stream: Callable[[str, bool], Any],
    stream_name: str,
    name: str,
    source: str | os.PathLike[str] | bytes,
    *,
    shared: bool,
    checkpoint_id: int,
) -> NativeFile:
    """Copy ``source`` into a new checkpoint stream, computing its size, CRC-32 and SHA-256 as it goes."""
    out = create_stream(stream_name, shared)
    crc = size = 0
    sha = new_sha256()
    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            view = memoryview(source).cast("B")  # no copy: chunks of it are written and hashed
            for pos in range(0, len(view), _CHUNK):
                chunk = view[pos : pos + _CHUNK]
                out.write(chunk)
                crc = zlib.crc32(chunk, crc)
                sha.update(chunk)
            size = len(view)
        else:
            link_source = getattr(out, "link_source", None)
            if shared and link_source is not None:
                # A shared file is immutable: task-local recovery may keep a hard link to it.
                link_source(os.fspath(source))
            with open(source, "rb") as f:
                while data := f.read(_CHUNK):
                    out.write(data)
                    crc = zlib.crc32(data, crc)
                    sha.update(data)
                    size += len(data)
        stream = out.close_and_get_handle()
    except BaseException:
        out.discard()
        raise
    return NativeFile(name, stream, size, crc, shared, checkpoint_id, sha.hexdigest())


class WriterNativeOutput:
    """A :class:`NativeSnapshotOutput` over a checkpoint writer's streams.

    Stream names are ``<prefix>/<name>`` plus a random part for shared files,
    so uploads of different attempts and instances never overwrite each other.
    """

    def __init__(self, writer: Any, prefix: str, checkpoint_id: int) -> None:
        self._writer = writer
        self._prefix = prefix
        self._checkpoint_id = checkpoint_id
        self._tag = os.urandom(6).hex()
        self.uploaded: list[NativeFile] = []

    @property
    def checkpoint_id(self) -> int:
        """The checkpoint being written."""
        return self._checkpoint_id

    def upload(self, name: str, source: str | os.PathLike[str] | bytes, *, shared: bool = True) -> NativeFile:
        """Upload ``source`` as file ``name`` (into the shared area when ``shared``)."""
        safe = name.replace("/", "_")
        stream_name = f"{self._prefix}-{self._tag}-{safe}" if shared else f"{self._prefix}-native/{safe}"
        f = upload_native_file(
            lambda n, s: self._writer.create_stream(n, shared=s),
            stream_name,
            name,
            source,
            shared=shared,
            checkpoint_id=self._checkpoint_id,
        )
        self.uploaded.append(f)
        return f

    def discard(self) -> None:
        """Delete what this output uploaded (a checkpoint that failed before it completed)."""
        for f in self.uploaded:
            with contextlib.suppress(Exception):  # best effort: the checkpoint already failed
                f.stream.discard()
        self.uploaded.clear()
