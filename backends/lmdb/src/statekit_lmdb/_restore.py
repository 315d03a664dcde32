"""Restores from native snapshots, at the same or another parallelism.

A native snapshot is one compact LMDB data file (``_full_snapshot``).

Same key groups: the downloaded file becomes the live environment; no entry
is rewritten.

Rescaled: of the snapshots whose key groups overlap this subtask's, the one
that overlaps most becomes the *base* if at least 60 % of its key groups are
this subtask's: its file becomes the live environment and is clipped to the
subtask's key groups (key groups are contiguous key ranges, so clipping
deletes one range below and one above). Every other overlapping snapshot is
opened read-only and only its entries inside the subtask's range are copied,
by a range read in key order, with appends (no tree search per entry). When
no snapshot is mostly this subtask's (scaling up), every one is read that
way into a fresh environment: copying the owned part costs less than
deleting the rest (deleting an entry costs about 1.3 times copying one).
Snapshots that share no key group with the subtask are never downloaded
(core passes only overlapping handles).

Every check (format, max parallelism, serializers, LMDB version and machine
word, file names, then the size and CRC-32 of every downloaded file) passes
before the live environment changes.
"""

from __future__ import annotations

import os
import shutil
import struct
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import lmdb

from statekit.backend_api import KeyGroupRange
from statekit.errors import CorruptSnapshotError, SnapshotError
from statekit.ordered_kv import KVRestoreTarget
from statekit.snapshot_codec import NativeStateHandle

from ._layout import BULK_CHUNK, DATA_FILE, db_name, state_names

__all__ = ["RestoreTarget", "restore_instance"]


class RestoreTarget(KVRestoreTarget, Protocol):
    """What a restore needs of the (empty) environment it fills, beyond every ordered engine's.

    :class:`~statekit_lmdb.LMDBKeyedStateBackend` is one; naming only these
    keeps this step below the backend, which calls it.
    """

    @property
    def env(self) -> Any:
        """The live LMDB environment."""
        ...

    @property
    def lmdb_options(self) -> Mapping[str, Any]:
        """The plugin's options."""
        ...

    def lmdb_replace_env(self, data_file: str) -> None:
        """Make ``data_file`` the live environment."""
        ...

    def delete_range(self, name: str, lower: bytes, upper: bytes | None) -> None:
        """Delete state ``name``'s entries with a key in ``[lower, upper)``."""
        ...


def _check_readable(h: NativeStateHandle) -> None:
    """Refuse a data file this process's LMDB cannot open: another file format or machine word."""
    try:
        written = tuple(int(x) for x in h.meta["lmdb_version"])[:2]
        byteorder, bits = str(h.meta["byteorder"]), int(h.meta["pointer_bits"])
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptSnapshotError(f"native LMDB snapshot without its engine description: {e}") from None
    here = tuple(lmdb.version())[:2]
    if written != here or byteorder != sys.byteorder or bits != 8 * struct.calcsize("P"):
        raise SnapshotError(
            f"the native LMDB snapshot of {h.key_group_range} was written by LMDB "
            f"{'.'.join(map(str, written))} on a {bits}-bit {byteorder}-endian machine; this process has "
            f"LMDB {'.'.join(map(str, here))} on a {8 * struct.calcsize('P')}-bit {sys.byteorder}-endian "
            "one, which cannot open that data file. Restore from a savepoint (canonical) instead"
        )
    if len(h.files) != 1 or h.files[0].name != DATA_FILE:
        raise CorruptSnapshotError(
            f"native LMDB snapshot of {h.key_group_range} must consist of one file {DATA_FILE!r}, "
            f"it lists {[f.name for f in h.files]}"
        )


def _download(h: NativeStateHandle, directory: str) -> str:
    """``h``'s data file into ``directory``, checked against its size and CRC-32; its path."""
    os.makedirs(directory)
    path = os.path.join(directory, DATA_FILE)
    h.file(DATA_FILE).copy_to(path)
    return path


def restore_instance(
    backend: RestoreTarget,
    parts: Sequence[NativeStateHandle],
    ranges: Mapping[int, KeyGroupRange],
    best: NativeStateHandle,
) -> None:
    """Fill ``backend``'s empty environment from the snapshots ``parts``; see the module.

    The backend has checked and planned the restore (``kv_plan_native_restore``):
    ``parts`` overlap its key groups, ``ranges`` holds each one's key groups by
    ``id``, and ``best`` is the part overlapping most.
    """
    own = backend.key_group_range
    for h in parts:
        _check_readable(h)
    # Deleting an entry costs about 1.3 times copying one (measured on 1M entries): adopt from 60 %.
    overlap = len(ranges[id(best)].intersection(own))
    base = best if 5 * overlap >= 3 * len(ranges[id(best)]) else None
    lower, upper = backend.layout.group_range(own.start, own.end)
    staging = os.path.join(backend.instance_dir, f"restore-{os.urandom(4).hex()}")
    try:
        files = {id(h): _download(h, os.path.join(staging, str(i))) for i, h in enumerate(parts)}
        # Every byte is checked: now change the (empty) live environment.
        if base is not None:
            backend.lmdb_replace_env(files[id(base)])
            if ranges[id(base)] != own:
                with backend.env.begin() as txn:
                    names = state_names(txn)
                for name in names:
                    backend.delete_range(name, b"", lower)
                    if upper is not None:
                        backend.delete_range(name, upper, None)
        for h in sorted(parts, key=lambda h: ranges[id(h)].start):
            if h is not base:
                max_dbs = max(len(h.states), int(backend.lmdb_options["max-states"]))
                _copy_range(backend, files[id(h)], max_dbs, lower, upper)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _copy_range(
    backend: RestoreTarget, data_file: str, max_dbs: int, lower: bytes, upper: bytes | None
) -> None:
    """Copy the entries in ``[lower, upper)`` of another environment's data file into the live one."""
    # Nothing writes the file: no lock file, no reader table.
    src: Any = lmdb.open(data_file, subdir=False, readonly=True, lock=False, readahead=False, max_dbs=max_dbs)
    try:
        with src.begin() as txn:
            for name in state_names(txn):
                db = src.open_db(db_name(name), txn=txn, create=False)
                with txn.cursor(db=db) as cur:
                    if not cur.set_range(lower):
                        continue
                    chunk: list[tuple[bytes, bytes]] = []
                    for k, v in cur.iternext():
                        if upper is not None and k >= upper:
                            break
                        chunk.append((k, v))
                        if len(chunk) >= BULK_CHUNK:
                            backend.kv_load(name, chunk)  # sorted and distinct: a range of a database
                            chunk = []
                    backend.kv_load(name, chunk)
    finally:
        src.close()
