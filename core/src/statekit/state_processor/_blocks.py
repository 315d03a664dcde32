"""The blocks a read takes: each subtask's canonical file, its key-group blocks, checked on the way.

A native snapshot is restored (once) into the backend that wrote it and
written canonically to a temporary file first. :class:`BlockReading` is the
part of :class:`~statekit.state_processor.SavepointReader` that does it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import CheckpointError, CorruptSnapshotError, StateError
from ..checkpoints._metadata import SubtaskState
from ..checkpoints._restore import CompletedCheckpoint
from ..plugins._registry import PluginRegistry, default_registry
from ..serialization._evolution import describe_schema
from ..serialization._keygroups import KeyGroupRange
from ..snapshots._snapshot import (
    CANONICAL_FORMAT,
    KeyedStateHandle,
    Section,
    SnapshotHeader,
    describe_stream,
    read_block,
    read_header,
    read_index,
)
from ..state._migration import version_of
from ._info import StateInfo

__all__ = ["BlockReading", "Part"]


class _FileHandle:
    """A :class:`~statekit.snapshot_codec.StreamStateHandle` over a local temporary file."""

    def __init__(self, path: str, name: str) -> None:
        self.path = path
        self.name = name

    @property
    def size(self) -> int:
        return os.path.getsize(self.path)

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(offset)
            return f.read() if length is None else f.read(length)

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)

    def to_json(self) -> dict[str, Any]:
        return {"type": "file", "name": self.name}


@dataclass
class Part:
    """One subtask's canonical keyed file, and the metadata's offsets of its blocks."""

    subtask: int
    handle: KeyedStateHandle
    header: SnapshotHeader | None = None

    def read_header(self) -> SnapshotHeader:
        if self.header is None:
            self.header, _ = read_header(self.handle.stream)
        return self.header


class BlockReading:
    """Reads the key-group blocks of an operator's subtasks: the savepoint reader's base, which sets these."""

    _cp: CompletedCheckpoint
    _registry: PluginRegistry | None
    _parts: dict[str, dict[int, Part]]
    _native_dir: tempfile.TemporaryDirectory[str] | None
    bytes_read: int

    if TYPE_CHECKING:

        @property
        def location(self) -> str:
            """Where the checkpoint or savepoint is (the reader's)."""

        def state(self, operator: str, name: str) -> StateInfo:
            """One keyed state of an operator (the reader's)."""

    def _keyed_parts(self, operator: str, key_groups: set[int] | None = None) -> list[Part]:
        """The files of ``operator``'s subtasks that own any of ``key_groups`` (all when None).

        A native subtask is restored (once) only when one of its key groups is read.
        """
        cache = self._parts.setdefault(operator, {})
        cp = self._cp
        sts = [
            st
            for st in cp.metadata.operators.get(operator, [])
            if st.keyed and (key_groups is None or any(kg in st.key_group_range for kg in key_groups))
        ]
        missing = [st for st in sts if st.subtask_index not in cache]
        if missing and cp.keyed_formats(operator) - {CANONICAL_FORMAT}:
            for st in missing:
                cache[st.subtask_index] = self._counted(self._native_part(operator, st))
        elif missing:
            full = KeyGroupRange.of(0, cp.metadata.max_parallelism - 1)
            handles = {h.key_group_range.start: h for h in cp.keyed_handles(operator, full)}
            for st in missing:
                h = handles.get(st.key_group_range.start)
                if h is not None:
                    cache[st.subtask_index] = self._counted(Part(st.subtask_index, h))
        return [cache[st.subtask_index] for st in sts if st.subtask_index in cache]

    def _counted(self, part: Part) -> Part:
        part.handle = dataclasses.replace(part.handle, stream=_Counting(part.handle.stream, self))
        return part

    def _native_part(self, operator: str, st: SubtaskState) -> Part:
        """Restore a native subtask into its own backend, and write it canonically to a temporary file."""
        backend_name = str((st.keyed or {}).get("backend") or self._cp.metadata.backend)
        registry = self._registry or default_registry()
        try:
            backend = registry.create_backend(backend_name, {})
        except StateError as e:
            raise CheckpointError(
                f"{self.location}: operator {operator!r} is a native snapshot of the {backend_name!r} "
                f"backend, which only that backend reads. {e} Or read a savepoint instead: "
                f"statekit savepoint convert {self.location} --target <dir> writes one (canonical, "
                "readable without any backend)"
            ) from None
        if self._native_dir is None:
            self._native_dir = tempfile.TemporaryDirectory(prefix="statekit-read-")
        base = self._native_dir.name
        path = os.path.join(base, f"{operator}-{st.subtask_index}.keyed")
        with (
            self._cp.restored_native(operator, st, backend, tempfile.mkdtemp(dir=base)) as keyed,
            open(path, "wb") as f,
        ):
            r = keyed.snapshot().write(f)
        handle = KeyedStateHandle(
            _FileHandle(path, f"{self.location} {operator}-{st.subtask_index} (native, via {backend_name})"),
            st.key_group_range,
            r.offsets,
            r.header_length,
            backend=backend_name,
            size=r.size,
            entries=r.entries,
        )
        return Part(st.subtask_index, handle)

    def _check_index(self, part: Part) -> None:
        """Refuse a file whose own block index disagrees with the metadata (a block left out)."""
        index = read_index(part.handle.stream)
        if index != {kg: tuple(o) for kg, o in part.handle.offsets.items()}:
            raise CorruptSnapshotError(
                f"{describe_stream(part.handle.stream)}: the block index disagrees with the "
                "checkpoint metadata"
            )

    def blocks(
        self, operator: str, key_groups: set[int] | None = None, *, state: str | None = None
    ) -> Iterator[tuple[int, SnapshotHeader, list[Section], str]]:
        """Each key-group block of ``operator``: ``(key group, its file's header, sections, file name)``.

        Only blocks in ``key_groups`` (all when None), and only of files that
        hold ``state`` (when given), are read; every block's checksum is
        checked. When no key groups are chosen, each file's index is checked
        against the metadata too, so a block left out of it is an error.

        Raises:
            StateError: If a state has another schema in this file than in the
                checkpoint's description of it (some subtasks migrated it, others
                never declared it): its sections could not be read as one.
        """
        for part in self._keyed_parts(operator, key_groups):
            blocks = sorted(kg for kg in part.handle.offsets if key_groups is None or kg in key_groups)
            if not blocks:
                continue
            header = part.read_header()
            self._check_schemas(operator, header, part)
            names = [s["name"] for s in header.states]
            if state is not None and state not in names:
                continue
            if key_groups is None:
                self._check_index(part)
            where = describe_stream(part.handle.stream)
            for kg in blocks:
                off, ln = part.handle.offsets[kg]
                yield kg, header, read_block(part.handle.stream, kg, off, ln, names), where

    def _check_schemas(self, operator: str, header: SnapshotHeader, part: Part) -> None:
        for meta in header.states:
            info = self.state(operator, str(meta["name"]))
            mine = (meta.get("serializer"), meta.get("ttl"), version_of(meta))
            if mine != (info.serializer, info.ttl, info.schema_version):
                raise StateError(
                    f"{describe_stream(part.handle.stream)}: state {info.name!r} of operator {operator!r} is "
                    f"{describe_schema(meta.get('serializer') or {})} (version {version_of(meta)}) in this "
                    f"file and {info.schema} (version {info.schema_version}) in another: only some "
                    "subtasks declared it after its type changed. Restore the checkpoint at its parallelism "
                    "with a job that declares the state in every subtask (in open()), and read its next "
                    "checkpoint"
                )


class _Counting:
    """A stream handle that adds what it reads to its reader's ``bytes_read``."""

    def __init__(self, inner: Any, reader: BlockReading) -> None:
        self._inner = inner
        self._reader = reader

    @property
    def size(self) -> int:
        return int(self._inner.size)

    @property
    def url(self) -> str | None:
        """The wrapped file's URL, so that messages name it in full."""
        url = getattr(self._inner, "url", None)
        return url if isinstance(url, str) else None

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        data: bytes = self._inner.read(offset, length)
        self._reader.bytes_read += len(data)
        return data

    def discard(self) -> None:
        self._inner.discard()

    def to_json(self) -> dict[str, Any]:
        j: dict[str, Any] = self._inner.to_json()
        return j
