"""The snapshot codec: the canonical format read and written, and native snapshots' handles.

For what reads or writes snapshots directly (a native format, a tool, a
runner): the canonical format of ``docs/snapshot-format.md``
(:func:`write_canonical`, :func:`read_header`, :func:`read_index`,
:func:`read_block`, :func:`iter_blocks`, its :class:`KeyedStateHandle`) and the
handles, files and outputs of native snapshots (:class:`NativeStateHandle`,
:class:`NativeFile`, :class:`NativeSnapshotOutput`, the completion
bookkeeping :class:`UploadTracker`), and what a delta checkpoint holds
(:class:`DeltaChanges` per key group; :data:`REMOVED`, the values of a
decoded removal section), and :class:`SectionLookup` (one key's entry in a
restored section, found without decoding it). A backend on ``KeyedBackendBase`` needs
none of it for canonical snapshots: the base writes and reads them.
"""

from __future__ import annotations

from .snapshots._lookup import SectionLookup
from .snapshots._native import (
    NativeFile,
    NativeSnapshot,
    NativeSnapshotOutput,
    NativeStateHandle,
    WriterNativeOutput,
    upload_native_file,
)
from .snapshots._snapshot import (
    CANONICAL_FORMAT,
    BytesStreamHandle,
    KeyedStateHandle,
    ProgressCallback,
    Section,
    SnapshotHeader,
    SnapshotWriteResult,
    StreamStateHandle,
    iter_blocks,
    read_block,
    read_header,
    read_index,
    write_canonical,
)
from .state._delta import DeltaChanges
from .state._keyed_snapshots import REMOVED, KeyedSnapshot
from .state._uploads import UploadTracker

__all__ = [
    "CANONICAL_FORMAT",
    "REMOVED",
    "BytesStreamHandle",
    "DeltaChanges",
    "KeyedSnapshot",
    "KeyedStateHandle",
    "NativeFile",
    "NativeSnapshot",
    "NativeSnapshotOutput",
    "NativeStateHandle",
    "ProgressCallback",
    "Section",
    "SectionLookup",
    "SnapshotHeader",
    "SnapshotWriteResult",
    "StreamStateHandle",
    "UploadTracker",
    "WriterNativeOutput",
    "iter_blocks",
    "read_block",
    "read_header",
    "read_index",
    "upload_native_file",
    "write_canonical",
]
