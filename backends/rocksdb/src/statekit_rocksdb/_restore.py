"""Restores from native snapshots, at the same or another parallelism (Flink's incremental restore).

Same key groups: download the instance's files (SST files a local copy of
task-local recovery holds are hard-linked instead) and open it. Its SST files
are the restored checkpoint's: once the runner claims that checkpoint
(``notify_checkpoint_complete`` of its id right after the restore), the next
checkpoint references them instead of uploading them again; without the claim
it uploads them (see ``UploadTracker.restored``).

Rescaled (Flink's way): of the instances whose key groups overlap this
subtask's, the one that overlaps most becomes the base: downloaded, opened,
and clipped to the subtask's key groups with a range deletion per column
family on each side where it holds key groups the subtask does not own (key
groups are contiguous key ranges, so a clip costs two range deletions, not a
pass over the entries; see ``_clip`` for why nothing is compacted). Every
other overlapping instance is downloaded and opened read-only, and only its
keys inside the subtask's key groups are written, by a bounded range scan
that C drives, into one SST file per column family, which is ingested into
the base: no entry goes through the write path or a Python loop. Instances
that own none of the subtask's key groups are never read (core passes only
overlapping handles). What rocksdict 0.3.29 lacks keeps the rewrite: RocksDB
ingests only SST files an ``SstFileWriter`` wrote (``allow_db_generated_files``
is not exposed; the old instance's own files are refused, "External file
version not found"), and it has no column-family export/import (Flink's
``useIngestDbRestoreMode``). A RocksDB instance cannot be opened without all
of its files, so an overlapping instance is downloaded whole (hard-linked
when task-local recovery holds it).

Every check (format, max parallelism, serializers, checksums of every file)
passes before the live instance is replaced.
"""

from __future__ import annotations

import os
import shutil
from collections import deque
from collections.abc import Sequence
from itertools import starmap
from typing import Any, Protocol

from rocksdict import AccessType, Options, Rdict, ReadOptions, SstFileWriter

from statekit.backend_api import KeyGroupRange
from statekit.errors import CorruptSnapshotError
from statekit.ordered_kv import KVRestoreTarget
from statekit.snapshot_codec import NativeStateHandle

from ._layout import CF_PREFIX

__all__ = ["RestoreTarget", "restore_instance"]


class RestoreTarget(KVRestoreTarget, Protocol):
    """What a restore needs of the (empty) instance it replaces, beyond every ordered engine's.

    :class:`~statekit_rocksdb.RocksDBKeyedStateBackend` is one; naming only
    these keeps this step below the backend, which calls it.
    """

    @property
    def db_path(self) -> str:
        """The live database's directory."""
        ...

    @property
    def db(self) -> Any:
        """The live rocksdict database."""
        ...

    def rocksdb_close_db(self) -> None:
        """Close the live database, releasing its files."""
        ...

    def rocksdb_open(self, path: str) -> None:
        """Open the live database at ``path``."""
        ...

    def engine_options(self) -> Options:
        """The options every column family and SST writer of the instance uses."""
        ...


def _download(h: NativeStateHandle, directory: str) -> None:
    """Every file of ``h`` into ``directory``, each checked against its size and CRC-32."""
    os.makedirs(directory)
    for f in h.files:
        name = os.path.basename(f.name)
        if name != f.name or name in ("", ".", ".."):
            raise CorruptSnapshotError(
                f"native RocksDB snapshot names a file {f.name!r} outside its directory"
            )
        # SST files are immutable: a local copy from an earlier checkpoint on this machine is linked.
        f.copy_to(os.path.join(directory, name), link=name.endswith(".sst"))
    if not os.path.exists(os.path.join(directory, "CURRENT")):
        raise CorruptSnapshotError("native RocksDB snapshot has no CURRENT file; it is incomplete")


def restore_instance(
    backend: RestoreTarget,
    base: NativeStateHandle,
    parts: Sequence[NativeStateHandle],
    base_range: KeyGroupRange,
) -> None:
    """Replace ``backend``'s empty instance with ``base``, clipped, plus the other ``parts``' keys.

    The backend has checked and planned the restore (``kv_plan_native_restore``):
    ``parts`` are the snapshots overlapping its key groups, ``base`` the one
    overlapping most (one of ``parts``), holding ``base_range``. See the module.
    """
    own = backend.key_group_range
    staging = os.path.join(backend.instance_dir, f"restore-{os.urandom(4).hex()}")
    try:
        base_dir = os.path.join(staging, "base")
        _download(base, base_dir)
        others = []
        for i, h in enumerate(p for p in parts if p is not base):
            d = os.path.join(staging, f"other-{i}")
            _download(h, d)
            others.append((h, d))
        # Every byte is checked: now replace the (empty) live instance.
        backend.rocksdb_close_db()
        shutil.rmtree(backend.db_path, ignore_errors=True)
        os.replace(base_dir, backend.db_path)
        backend.rocksdb_open(backend.db_path)
        lower, upper = backend.layout.group_range(own.start, own.end)
        # Only the sides where the base holds key groups this subtask does not own.
        below = lower if base_range.start < own.start else None
        above = upper if base_range.end > own.end else None
        if below is not None or above is not None:
            _clip(backend, below, above)
        for _, d in others:
            _ingest_range(backend, d, lower, upper, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _state_families(path: str) -> list[str]:
    return [n for n in Rdict.list_cf(path) if n.startswith(CF_PREFIX)]


def _clip(backend: RestoreTarget, below: bytes | None, above: bytes | None) -> None:
    """Drop every key before ``below`` and from ``above`` on, in every state's column family.

    A range deletion each, whatever the size. The deleted ranges are not
    compacted away here (Flink neither compacts after a rescale unless told
    to): a compaction reads every deleted entry, about 60 % of a 2 -> 3
    rescale's time at 1M keys, while reads and iterators skip a range
    tombstone without visiting what it covers and RocksDB's own compactions
    drop the covered entries when they merge the files holding them (under
    universal compaction, the large run at the latest in its next full merge).
    Until then the base's files keep the deleted entries on disk, and the next
    checkpoint references those files as they are (or, unclaimed, uploads them).
    """
    top = b"\xff" * (backend.layout.group_width + 1)
    for cf_name in _state_families(backend.db_path):
        cf = backend.db.get_column_family(cf_name)
        try:
            if below:
                cf.delete_range(b"", below)
            if above is not None:
                cf.delete_range(above, top)
        finally:
            cf.close()


def _ingest_range(
    backend: RestoreTarget, directory: str, lower: bytes, upper: bytes | None, staging: str
) -> None:
    """Bring the keys in ``[lower, upper)`` of another instance into the live one as ingested SST files.

    RocksDB ingests only files an ``SstFileWriter`` wrote (it refuses the old
    instance's own files, "External file version not found", and rocksdict
    exposes neither ``allow_db_generated_files`` nor column-family import), so
    the range is rewritten: a bounded iterator of the old instance feeds the
    writer through ``deque(starmap(...))``, which runs the loop in C (no
    bytecode per key). A column family with no key in the range writes no file.
    """
    families = _state_families(directory)
    opts = Options(raw_mode=True)
    other = Rdict(
        directory,
        opts,
        column_families={n: Options(raw_mode=True) for n in families},
        access_type=AccessType.read_only(),
    )
    try:
        for cf_name in families:
            src = other.get_column_family(cf_name)
            try:
                read = ReadOptions()
                # A throwaway instance read once: its blocks would only push the live ones out of
                # the block cache the process's instances share. (rocksdict's stub omits the argument.)
                read.fill_cache(False)  # type: ignore[call-arg]
                if upper is not None:
                    read.set_iterate_upper_bound(upper)
                peek = src.iter(read)
                peek.seek(lower)
                empty = not peek.valid()
                del peek
                if empty:
                    continue
                path = os.path.join(staging, f"ingest-{os.urandom(6).hex()}.sst")
                writer = SstFileWriter(backend.engine_options())
                writer.open(path)
                items = src.items(from_key=lower, read_opt=read)
                deque(starmap(writer.__setitem__, items), maxlen=0)
                del items
                writer.finish()
                del writer
                col = backend.kv_column(cf_name[len(CF_PREFIX) :])
                assert col is not None
                col.engine[0].ingest_external_file([path])
                if os.path.exists(path):
                    os.unlink(path)
            finally:
                src.close()
    finally:
        other.close()
