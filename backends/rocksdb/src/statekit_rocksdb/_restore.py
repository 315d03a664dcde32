"""Restores from native snapshots, at the same or another parallelism (Flink's incremental restore).

Same key groups: download the instance's files (SST files a local copy of
task-local recovery holds are hard-linked instead) and open it. Its SST files
are the restored checkpoint's: once the runner claims that checkpoint
(``notify_checkpoint_complete`` of its id right after the restore), the next
checkpoint references them instead of uploading them again; without the claim
it uploads them (see ``UploadTracker.restored``).

Rescaled: every old instance that holds some of this subtask's key groups is
downloaded the same way, opened, and clipped to the key groups this subtask
takes from it, with a range deletion per column family on each side where it
holds key groups the subtask does not own (key groups are contiguous key
ranges, so a clip costs two range deletions, not a pass over the entries; see
``_clip`` for why nothing is compacted). The subtask then holds several
instances, each the keeper of a contiguous part of its key groups: old
subtasks owned disjoint key groups, so every key group lives in exactly one,
and the backend routes each read, write, scan and snapshot by key group. Its
native snapshots carry each instance's files (``statekit-rocksdb-2``, see
``_layout``), so the next rescale clips those instances in turn. No entry is
copied: a rescale costs the downloads and the opens, as a restore does.

At most :data:`MAX_INSTANCES` instances are kept: past that (a rescale between
parallelisms that share few boundaries, repeated), the smallest part is merged
into its larger neighbour: its instance is downloaded, opened read-only, and
only its keys inside the part are written, by a bounded range scan that C
drives, into one SST file per column family, which is ingested into the
neighbour (no entry goes through the write path or a Python loop). What
rocksdict 0.3.29 lacks keeps that rewrite: RocksDB ingests only SST files an
``SstFileWriter`` wrote (``allow_db_generated_files`` is not exposed; the old
instance's own files are refused, "External file version not found"), and it
has no column-family export/import (Flink's ``useIngestDbRestoreMode``).

Measured (``bench/bench_checkpoint_scaling.py --backends rocksdb``, one
process, 2 cores shared; docs/backends/rocksdb.md, "Restore and rescale",
has the tables): copying the other instances' keys was 43 % of a 2 -> 3
rescale at 4M keys and 62-66 % at 16M (1.05-1.50 s), 70-85 % of a 3 -> 2;
the rescale took 13.3x a same-parallelism restore at 16M (2 -> 3) and 6.95x
(3 -> 2). Without the copy, 1.5-2.4x and 0.76-1.03x; what was left was
downloading the same files twice (2 -> 3: the middle subtask overlaps both
old instances) and closing column-family handles in the clip, which flushed
them. An SST file this process already downloaded and checked is linked
(:class:`_CheckedFiles`), and the clip is one WriteBatch: 1.04x and 1.00x at
16M.

A RocksDB instance cannot be opened without all of its files, so an
overlapping instance is downloaded whole (hard-linked when task-local recovery
holds it). Every check (format, layout, max parallelism, serializers,
checksums of every file) passes before the live instance is replaced.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import starmap
from typing import Any, Protocol

from rocksdict import AccessType, Options, Rdict, ReadOptions, SstFileWriter, WriteBatch

from statekit.backend_api import KeyGroupRange
from statekit.errors import CorruptSnapshotError
from statekit.ordered_kv import KVRestoreTarget
from statekit.snapshot_codec import NativeFile, NativeStateHandle

from ._layout import CF_PREFIX, INSTANCES_META, ROCKSDB_NATIVE_FORMAT

__all__ = ["MAX_INSTANCES", "RestoreTarget", "instances_of", "restore_instances"]

#: Instances a subtask keeps after a rescale, at most; smaller parts are merged into a neighbour.
MAX_INSTANCES = 4


class RestoreTarget(KVRestoreTarget, Protocol):
    """What a restore needs of the (empty) instance it replaces, beyond every ordered engine's.

    :class:`~statekit_rocksdb.RocksDBKeyedStateBackend` is one; naming only
    these keeps this step below the backend, which calls it.
    """

    @property
    def databases(self) -> list[tuple[KeyGroupRange, Any]]:
        """The live databases and the key groups each holds, in key-group order."""
        ...

    def rocksdb_close_db(self) -> None:
        """Close the live databases, releasing their files."""
        ...

    def rocksdb_open(self, instances: Sequence[tuple[str, int]]) -> None:
        """Open the live databases: ``(directory, first key group)`` each, in key-group order."""
        ...

    def engine_options(self) -> Options:
        """The options every column family and SST writer of the instance uses."""
        ...


@dataclass
class _Piece:
    """An old instance that holds some of the subtask's key groups."""

    handle: NativeStateHandle
    prefix: str  # its files' prefix in the handle ("" in a statekit-rocksdb-1 snapshot)
    held: KeyGroupRange  # the key groups it holds
    taken: KeyGroupRange  # those the subtask owns


@dataclass
class _Target:
    """A live instance after the restore: a base piece, clipped, and pieces merged into it."""

    base: _Piece
    merged: list[_Piece] = field(default_factory=list)

    @property
    def start(self) -> int:
        return min(p.taken.start for p in (self.base, *self.merged))

    @property
    def end(self) -> int:
        return max(p.taken.end for p in (self.base, *self.merged))

    @property
    def size(self) -> int:
        return self.end - self.start + 1


def instances_of(h: NativeStateHandle, held: KeyGroupRange) -> list[tuple[str, KeyGroupRange]]:
    """The instances of snapshot ``h``: each one's file prefix and key groups, in key-group order.

    ``held`` is the snapshot's key groups. A ``statekit-rocksdb-1`` snapshot
    is one instance; a ``statekit-rocksdb-2`` one lists them in its meta.

    Raises:
        CorruptSnapshotError: If the list is malformed, its ranges do not
            tile ``held``, or a file belongs to no instance.
    """
    raw = h.meta.get(INSTANCES_META)
    if h.format == ROCKSDB_NATIVE_FORMAT and raw is None:
        return [("", held)]
    where = f"native RocksDB snapshot of {held} (checkpoint {h.checkpoint_id})"
    if not isinstance(raw, list) or len(raw) < 2:
        raise CorruptSnapshotError(f"{where} lists no instances in meta[{INSTANCES_META!r}]: {raw!r}")
    out: list[tuple[str, KeyGroupRange]] = []
    expect = held.start
    for entry in raw:
        try:
            prefix = str(entry["files"])
            start, end = (int(x) for x in entry["range"])
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptSnapshotError(f"{where} has a malformed instance {entry!r}: {e}") from None
        if start != expect or end < start or not prefix or "/" in prefix:
            raise CorruptSnapshotError(f"{where} has instances that do not tile its key groups: {raw!r}")
        out.append((prefix, KeyGroupRange.of(start, end)))
        expect = end + 1
    if expect != held.end + 1 or len({p for p, _ in out}) != len(out):
        raise CorruptSnapshotError(f"{where} has instances that do not tile its key groups: {raw!r}")
    for f in h.files:
        owners = [p for p, _ in out if f.name.startswith(p)]
        if len(owners) != 1:
            raise CorruptSnapshotError(f"{where} has a file {f.name!r} of {len(owners)} instances, not one")
    return out


class _CheckedFiles:
    """SST files this process downloaded and checked, still in a live instance: a later download links them.

    A rescale downloads an old instance once per new subtask that overlaps it
    (2 -> 3: the middle subtask downloads both old instances, which its
    neighbours download too). An SST file is immutable: RocksDB writes it once
    and deletes it, never rewrites it. A copy whose bytes were checked against
    the file's SHA-256 when it was downloaded is still those bytes while its
    inode, size and modification time are the same, so a later download of
    the same file in this process hard-links that copy instead of reading and
    hashing it again (issue 46: "bound to its inode, size and time"). A copy
    gone (its instance closed, or compacted away), replaced or on another file
    system is downloaded as usual.
    """

    #: Files remembered at most (the oldest are forgotten first).
    LIMIT = 8192

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[str, tuple[str, int, int, int]] = {}  # sha256 -> path, inode, size, mtime_ns

    def link(self, sha256: str, size: int, dst: str) -> bool:
        """Hard-link the checked copy of the file with ``sha256`` and ``size`` at ``dst``; False: download."""
        with self._lock:
            entry = self._files.get(sha256)
        if entry is None:
            return False
        path, ino, known_size, mtime = entry
        try:
            st = os.stat(path)
            if (st.st_ino, st.st_size, st.st_mtime_ns) != (ino, known_size, mtime) or known_size != size:
                raise FileNotFoundError(path)
            os.link(path, dst)
            if os.stat(dst).st_ino != ino:  # replaced between the check and the link
                os.unlink(dst)
                raise FileNotFoundError(path)
        except OSError:
            with self._lock:
                if self._files.get(sha256) == entry:
                    del self._files[sha256]
            return False
        return True

    def add(self, sha256: str, path: str) -> None:
        """``path`` holds the bytes of the file with ``sha256``, checked (downloaded or linked)."""
        try:
            st = os.stat(path)
        except OSError:
            return
        with self._lock:
            self._files.pop(sha256, None)
            self._files[sha256] = (path, st.st_ino, st.st_size, st.st_mtime_ns)
            while len(self._files) > self.LIMIT:
                del self._files[next(iter(self._files))]


_CHECKED = _CheckedFiles()


def _download(piece: _Piece, directory: str) -> dict[str, NativeFile]:
    """Every file of the piece's instance into ``directory``, each checked; its SST files by local name."""
    os.makedirs(directory)
    prefix = piece.prefix
    ssts: dict[str, NativeFile] = {}
    for f in piece.handle.files:
        if not f.name.startswith(prefix):
            continue
        name = f.name[len(prefix) :]
        if os.path.basename(name) != name or name in ("", ".", ".."):
            raise CorruptSnapshotError(
                f"native RocksDB snapshot names a file {f.name!r} outside its directory"
            )
        # SST files are immutable: a copy this process checked, or a local copy from an earlier
        # checkpoint on this machine (task-local recovery), is linked.
        dst = os.path.join(directory, name)
        sst = name.endswith(".sst")
        if not (sst and f.sha256 is not None and _CHECKED.link(f.sha256, f.size, dst)):
            f.copy_to(dst, link=sst)
        if sst and f.sha256 is not None:  # the next instance of this restore may hold it too
            _CHECKED.add(f.sha256, dst)
        if f.shared and name.endswith(".sst"):
            ssts[name] = f
    if not os.path.exists(os.path.join(directory, "CURRENT")):
        raise CorruptSnapshotError(
            f"native RocksDB snapshot of {piece.held} (checkpoint {piece.handle.checkpoint_id}) has no "
            f"CURRENT file{f' for its instance {prefix!r}' if prefix else ''}; it is incomplete"
        )
    return ssts


def _plan(pieces: list[_Piece], limit: int) -> list[_Target]:
    """One target per piece, in key-group order; past ``limit``, the smallest merged into a neighbour."""
    targets = [_Target(p) for p in sorted(pieces, key=lambda p: p.taken.start)]
    while len(targets) > limit:
        i = min(range(len(targets)), key=lambda j: (targets[j].size, j))
        neighbours = [j for j in (i - 1, i + 1) if 0 <= j < len(targets)]
        j = max(neighbours, key=lambda j: (targets[j].size, -j))
        small, big = targets[i], targets[j]
        # The larger base stays (its instance is adopted); the other pieces are copied into it.
        pieces_of = [small.base, *small.merged, big.base, *big.merged]
        base = max(pieces_of, key=lambda p: (len(p.taken), -p.taken.start))
        merged = _Target(base, [p for p in pieces_of if p is not base])
        targets[min(i, j)] = merged
        del targets[max(i, j)]
    return targets


def restore_instances(backend: RestoreTarget, parts: Sequence[NativeStateHandle]) -> dict[str, NativeFile]:
    """Replace ``backend``'s empty instance with the instances of ``parts`` that hold its key groups.

    The backend has checked and planned the restore (``kv_plan_native_restore``):
    ``parts`` are the snapshots overlapping its key groups. Returns the SST
    files the live instances adopted, under the names their next native
    snapshot gives them (see the module).
    """
    own = backend.key_group_range
    pieces = []
    for h in parts:
        held = KeyGroupRange.of(int(h.meta["range"][0]), int(h.meta["range"][1]))
        for prefix, rng in instances_of(h, held):
            taken = rng.intersection(own)
            if len(taken):
                pieces.append(_Piece(h, prefix, rng, taken))
    targets = _plan(pieces, MAX_INSTANCES)
    staging = os.path.join(backend.instance_dir, f"restore-{os.urandom(4).hex()}")
    dirs = []
    adopted: dict[str, NativeFile] = {}
    kept: list[dict[str, NativeFile]] = []
    names = [""] if len(targets) == 1 else [f"{i}-" for i in range(len(targets))]
    try:
        merges: list[list[tuple[_Piece, str]]] = []
        for i, t in enumerate(targets):
            d = os.path.join(staging, f"db-{i}")
            kept.append(_download(t.base, d))
            for name, f in kept[i].items():
                adopted[names[i] + name] = dataclasses.replace(f, name=names[i] + name)
            dirs.append(d)
            copies = []
            for j, p in enumerate(t.merged):
                c = os.path.join(staging, f"merge-{i}-{j}")
                _download(p, c)
                copies.append((p, c))
            merges.append(copies)
        # Every byte is checked: now replace the (empty) live instance.
        backend.rocksdb_close_db()
        for name in os.listdir(backend.instance_dir):
            if name == "db" or name.startswith("db-"):
                shutil.rmtree(os.path.join(backend.instance_dir, name), ignore_errors=True)
        placed = []
        for i, d in enumerate(dirs):
            path = os.path.join(backend.instance_dir, "db" if i == 0 else f"db-{i}")
            os.replace(d, path)
            placed.append((path, own.start if i == 0 else targets[i].start))
            for name, f in kept[i].items():  # where the checked copies are from now on
                if f.sha256 is not None:
                    _CHECKED.add(f.sha256, os.path.join(path, name))
        backend.rocksdb_open(placed)
        layout = backend.layout
        dbs = backend.databases
        for i, t in enumerate(targets):
            lower, upper = layout.group_range(t.start, t.end)
            # Only the sides where the base holds key groups this instance does not.
            below = lower if t.base.held.start < t.start else None
            above = upper if t.base.held.end > t.end else None
            if below is not None or above is not None:
                _clip(dbs[i][1], placed[i][0], layout.group_width, below, above)
            for p, c in merges[i]:
                lo, hi = layout.group_range(p.taken.start, p.taken.end)
                _ingest_range(backend, i, c, lo, hi, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return adopted


def _state_families(path: str) -> list[str]:
    return [n for n in Rdict.list_cf(path) if n.startswith(CF_PREFIX)]


def _clip(db: Any, path: str, group_width: int, below: bytes | None, above: bytes | None) -> None:
    """Drop every key before ``below`` and from ``above`` on, in every state's column family of ``db``.

    A range deletion each, whatever the size, all in one WriteBatch (closing
    a column family's handle instead would flush its memtable: an SST file
    per family, 30-40 ms of a 2 -> 3 rescale at 4M keys). The deleted ranges
    are not compacted away here (Flink neither compacts after a rescale unless
    told to): a compaction reads every deleted entry, about 60 % of a 2 -> 3
    rescale's time at 1M keys, while reads and iterators skip a range
    tombstone without visiting what it covers and RocksDB's own compactions
    drop the covered entries when they merge the files holding them (under
    universal compaction, the large run at the latest in its next full merge).
    Until then the instance's files keep the deleted entries on disk, and the
    next checkpoint references those files as they are (or, unclaimed, uploads them).
    """
    top = b"\xff" * (group_width + 1)
    batch = WriteBatch(raw_mode=True)
    for cf_name in _state_families(path):
        handle = db.get_column_family_handle(cf_name)
        if below:
            batch.delete_range(b"", below, handle)
        if above is not None:
            batch.delete_range(above, top, handle)
    if not batch.is_empty():
        db.write(batch)


def _ingest_range(
    backend: RestoreTarget, index: int, directory: str, lower: bytes, upper: bytes | None, staging: str
) -> None:
    """Bring the keys in ``[lower, upper)`` of another instance into live instance ``index``: ingested SSTs.

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
                col.engine[index][0].ingest_external_file([path])
                if os.path.exists(path):
                    os.unlink(path)
            finally:
                src.close()
    finally:
        other.close()
