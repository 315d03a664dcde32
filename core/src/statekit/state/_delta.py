"""Native snapshots in proportion to the change: a base now and then, a delta per checkpoint.

The model is Spark's HDFS-backed state store (a delta file per batch, a
snapshot every few deltas) and Flink's FLIP-151 (per key group, the changed
keys' new values and the removed keys, referring to older snapshots). A
backend that records which entries each write touches (the heap backend)
subclasses :class:`DeltaKeyedBackendBase` and implements three hooks:
``_delta_track`` (start recording), ``_delta_epoch`` (hand over what was
recorded since the last call) and ``_delta_changes`` (the current value, or
the removal, of every entry recorded in some epochs).

A snapshot's handle lists its *chain*: a **base** (every entry, a canonical
file) and the **deltas** after it, oldest first, each a canonical-format file
whose sections hold the changed entries' values and, as sections marked
``removal`` (states named ``"\\x00removed:" + name`` in its header), the keys
and namespaces of removed entries. A checkpoint uploads only its own delta and
references the base and deltas of the last *confirmed* checkpoint (the
completion contract of :mod:`statekit.snapshots._native`); a delta holds every
entry changed since that checkpoint, as it is at this one, so it applies on
top of any checkpoint from that one on. A base is due when the chain has
``max_deltas`` deltas, or when its deltas' bytes pass ``max_delta_ratio`` of
the base's. With ``background`` (the default) the due checkpoint still writes
a delta and a base of the state at that checkpoint is encoded on a thread of
its own (:mod:`._materialize`); the first checkpoint after it finished uploads
it and lists it first, followed by the deltas of later checkpoints. A
checkpoint writes a base itself when there is no confirmed chain, when the
encoding failed, or at twice the bound with nothing encoding; at twice the
bound with an encoding running it waits for it: a restore replays at most
``2 * max_deltas`` deltas (``max_deltas`` without ``background``).

Every mechanism that understands native snapshots understands this one:
retention counts references per shared file (a base stays while a retained
checkpoint's chain lists it), task-local recovery keeps the files, verify
checks each file's SHA-256, convert-to-savepoint and the state processor
restore the chain into a backend and write it canonically, and a rescale gives
each new subtask the blocks of its key groups from every file of every chain,
applied in order.

A rescale keeps the checkpoint cost in proportion to the change too. The new
instance's chain is its predecessors' chains, each link limited to the key
groups it holds there (the link's ``key_groups``; a link without them holds
all of its handle's), and, once the runner claims the restored checkpoint,
its first checkpoint writes a delta against that chain instead of a base of
everything. Each file holds only the key groups its writer owned, so a key
group reads its predecessor's base and deltas, then the new instance's
deltas. Until it writes a base of its own, a restore of such a chain reads
the predecessors' whole files; the same ``max_deltas`` and
``max_delta_ratio`` bound it, counted per predecessor's part.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

from .._errors import CorruptSnapshotError, SnapshotError, StateAccessError
from ..serialization._keygroups import KeyGroupRange
from ..snapshots._native import NativeFile, NativeSnapshotOutput, NativeStateHandle
from ..snapshots._snapshot import (
    BytesStreamHandle,
    KeyedStateHandle,
    ProgressCallback,
    Section,
    SnapshotHeader,
    SnapshotWriteResult,
    encode_namespaces,
    iter_blocks,
    read_header,
    read_index,
    write_canonical,
)
from ._keyed import KeyedBackendBase
from ._keyed_snapshots import KeyedSnapshot
from ._materialize import Materialization
from ._migration import same_schema
from ._registered import RegisteredState, full_snapshot_ttl
from ._state import VOID_NAMESPACE
from ._timerstate import TIMER_STATE_NAMES
from ._ttl import purge_expired

__all__ = ["REMOVAL_PREFIX", "DeltaChanges", "DeltaKeyedBackendBase", "DeltaSnapshot"]

_log = logging.getLogger("statekit.state")

#: Header state names of a delta's removal sections: this prefix, then the state's name.
REMOVAL_PREFIX = "\x00removed:"
#: A delta header's ``extra`` key: per state, per changed key group (a string), its entries after the
#: delta. A restore keeps a key group's sections as bytes (heap) only where it knows their exact count.
KG_ENTRIES = "kg_entries"
#: A confirmed checkpoint of a delta chain: its id, its chain's links and their files by name.
_Confirmed = tuple[int, list[dict[str, Any]], dict[str, NativeFile]]


@dataclass
class DeltaChanges:
    """One state's changes in one key group: new values, and removed entries."""

    keys: list[Any]
    namespaces: list[Any]
    values: list[Any]
    removed_keys: list[Any]
    removed_namespaces: list[Any]
    #: The state's entries in the key group after the change, if the backend counts them: written in the
    #: delta's header, so a restore knows each key group's exact count without decoding it.
    size: int | None = None


class DeltaSnapshot:
    """A native snapshot taken, not yet written: a base (a pinned canonical snapshot) or a delta."""

    def __init__(
        self,
        backend: DeltaKeyedBackendBase,
        checkpoint_id: int,
        states: list[dict[str, Any]],
        entries: int,
        state_entries: dict[str, int],
        *,
        base: KeyedSnapshot | None = None,
        delta: tuple[_Confirmed, SnapshotHeader, dict[int, list[tuple[int, bytes, bytes, bytes, int]]]]
        | None = None,
        ttl_cleanup: tuple[int, dict[str, int]] | None = None,
        adopt: Materialization | None = None,
    ) -> None:
        self._backend = backend
        self.checkpoint_id = checkpoint_id
        self._states = states
        self._entries = entries
        self._state_entries = state_entries
        self._base = base
        #: The chain confirmed when the delta was taken (what it applies on: a later one holds later
        #: writes), the delta's header and its blocks.
        self._delta = delta
        #: When it was taken, and the TTL of each state whose expired entries full snapshots leave out.
        self._ttl_cleanup = ttl_cleanup
        #: A base encoded in the background (of an earlier checkpoint) this delta's chain starts with.
        self._adopt = adopt
        self._done = False

    @property
    def is_base(self) -> bool:
        """True if this snapshot writes a base (every entry), False for a delta."""
        return self._base is not None

    def write(
        self, out: NativeSnapshotOutput, *, progress: ProgressCallback | None = None
    ) -> NativeStateHandle:
        """Upload the base or the delta, reference the confirmed chain's files; returns the handle."""
        if self._done:
            raise StateAccessError("this native snapshot was already written or released")
        self._done = True
        b = self._backend
        cid = out.checkpoint_id
        buf = io.BytesIO()
        try:
            if self._base is not None:
                r = self._base.write(buf, progress=progress)
                links: list[dict[str, Any]] = []
                files: list[NativeFile] = []
                kind = "base"
            else:
                assert self._delta is not None
                confirmed, header, blocks = self._delta
                adopt = self._adopt
                after = None if adopt is None else adopt.checkpoint_id
                files, links = b._delta_reference(cid, confirmed, after)
                if adopt is not None:
                    files, links = _adopted(out, adopt, files, links)
                r = write_canonical(buf, header, lambda kg: _delta_block(blocks, kg), progress=progress)
                kind = "delta"
        finally:
            self.release()
        f, link = _uploaded_link(out, kind, cid, buf.getvalue(), r)
        files = b._delta_pinned([*files, f])
        links.append(link)
        b._delta_written(cid, files, links)
        # Each state's bytes in the files a restore reads (its base's and deltas'): what storages limit.
        total: dict[str, int] = {}
        for link in {str(link["file"]): link for link in links}.values():  # a file listed twice is read once
            for name, n in (link.get("state_sizes") or {}).items():
                total[name] = total.get(name, 0) + int(n)
        meta: dict[str, Any] = {"chain": links, "state_sizes": total, "state_entries": self._state_entries}
        if self._ttl_cleanup is not None:
            meta["time_ms"], meta["ttl_cleanup"] = self._ttl_cleanup
        return b.native_handle(
            self.checkpoint_id, files, states=self._states, meta=meta, entries=self._entries
        )

    def release(self) -> None:
        """Give the snapshot up (idempotent; ``write`` releases too)."""
        self._done = True
        if self._base is not None:
            self._base.release()
        if self._delta is not None:
            self._backend._delta_unpin(self._delta[0][2])
        self._delta = None
        self._adopt = None


def _adopted(
    out: NativeSnapshotOutput,
    adopt: Materialization,
    files: list[NativeFile],
    links: list[dict[str, Any]],
) -> tuple[list[NativeFile], list[dict[str, Any]]]:
    """The chain ``links`` (of ``files``) after the base ``adopt`` encoded: it uploaded, then ``links``."""
    assert adopt.data is not None and adopt.result is not None
    f, link = _uploaded_link(out, "base", adopt.checkpoint_id, adopt.data, adopt.result)
    return [f, *files], [link, *links]


def _uploaded_link(
    out: NativeSnapshotOutput, kind: str, checkpoint_id: int, data: bytes, r: SnapshotWriteResult
) -> tuple[NativeFile, dict[str, Any]]:
    """Upload ``data`` as ``<kind>-<checkpoint_id>``; the file and its chain link (a delta's removal
    sections counted under their state's name)."""
    f = out.upload(f"{kind}-{checkpoint_id}", data, shared=True)
    sizes: dict[str, int] = {}
    for name, n in r.state_sizes.items():
        name = name.removeprefix(REMOVAL_PREFIX)
        sizes[name] = sizes.get(name, 0) + n
    link = {
        "file": f.name,
        "kind": kind,
        "checkpoint_id": checkpoint_id,
        "size": f.size,
        "entries": r.entries,
        "state_sizes": sizes,
    }
    return f, link


def _delta_block(
    blocks: dict[int, list[tuple[int, bytes, bytes, bytes, int]]], kg: int
) -> Iterable[tuple[int, int, bytes, bytes, bytes]]:
    for idx, keys, nss, vals, count in blocks.get(kg, ()):
        yield idx, count, keys, nss, vals


class DeltaKeyedBackendBase(KeyedBackendBase):
    """A keyed backend whose native snapshots are a base and deltas; see the module docstring.

    Subclasses implement the keyed base's hooks and ``_delta_track``,
    ``_delta_epoch`` and ``_delta_changes``, set ``native_format``, and call
    :meth:`_delta_setup` from ``__init__``.
    """

    native_format: str = ""

    def _delta_setup(
        self, max_deltas: int = 10, max_delta_ratio: float = 0.5, background: bool = True
    ) -> None:
        """Set the materialization policy (see the module docstring) and the bookkeeping."""
        self.delta_max_deltas = max(1, int(max_deltas))
        self.delta_max_ratio = float(max_delta_ratio)
        # Bases encoded on a thread of their own (see _delta_base_job), or by the checkpoint that is due.
        self.delta_background = bool(background)
        # The base being encoded in the background, or encoded and not yet in a confirmed chain.
        self._delta_base_job: Materialization | None = None
        # Epochs of recorded changes by the checkpoint whose snapshot closed them, oldest first.
        self._delta_epochs: list[tuple[int, Any]] = []
        # The chains of handles written but not confirmed, by checkpoint id.
        self._delta_chains: dict[int, tuple[list[dict[str, Any]], dict[str, NativeFile]]] = {}
        # The last confirmed checkpoint, its chain and files: what a delta is written against.
        self._delta_confirmed: _Confirmed | None = None
        # Per state and key group, the exact entries the last restored chain left there where a delta
        # changed them (None: not known); kept until the state is declared (see _delta_restored_count).
        self._delta_kg_entries: dict[str, dict[int, int | None]] = {}
        # The files of the chains that deltas taken but not written yet apply on (see _delta_pinned).
        self._delta_pins: list[dict[str, NativeFile]] = []
        # TTL (ms) of restored states whose expired entries full snapshots leave out, until declared.
        self._delta_restored_ttl: dict[str, int] = {}

    # --- the backend's hooks ---------------------------------------------------------

    def _delta_track(self) -> None:
        """Start recording the entries writes touch (idempotent)."""
        raise NotImplementedError

    def _delta_epoch(self) -> Any:
        """What was recorded since the last call; recording goes on afresh."""
        raise NotImplementedError

    def _delta_changes(self, epochs: Sequence[Any]) -> dict[str, dict[int, DeltaChanges]]:
        """Per state and key group, every entry recorded in ``epochs`` as it is now."""
        raise NotImplementedError

    # --- snapshots -------------------------------------------------------------------

    def native_snapshot(self, checkpoint_id: int) -> DeltaSnapshot:
        """Freeze the change since the last confirmed checkpoint (or, now and then, everything).

        When a base is due and bases are encoded in the background, this
        checkpoint still writes a delta and a base of the state as it is now
        starts encoding on a thread of its own; the first checkpoint after it
        finished uploads it and lists it, followed by the chain's deltas of
        later checkpoints. A checkpoint that finds the chain at twice the
        policy's bound (``max_deltas``, ``max_delta_ratio``) waits for it, or
        writes the base itself where none is being encoded (see
        :meth:`_delta_plan`).
        """
        if self._closed:
            raise StateAccessError("the backend is closed")
        self._refuse_broken()
        self._delta_track()
        confirmed = self._delta_confirmed
        if confirmed is None and not self._delta_chains:
            # No chain is confirmed or waiting to be: no delta can be written against an older epoch.
            self._delta_epochs.clear()
        self._delta_epochs.append((checkpoint_id, self._delta_epoch()))
        regs = [*self._states.values(), *self._restored.values()]
        states = [r.meta() for r in regs] + [m for m, _ in self._pending.values()]
        entries = self.num_entries()
        # Exact (key, namespace) entries per state at this checkpoint, for the metrics' state_entries.
        per_state = {m["name"]: self.num_entries(m["name"]) for m in states}
        # A delta leaves entries that expired unwritten since its base in the chain: a restore drops
        # them as of this time, as a full snapshot taken now would have. A base records it too, for
        # the states a restore holds undeclared (a base itself leaves expired entries out).
        cleanup = full_snapshot_ttl(self.state_names, self._states, self._delta_restored_ttl)
        ttl_cleanup = (self.clock(), cleanup) if cleanup else None
        base_now, adopt = (True, None) if confirmed is None else self._delta_plan(checkpoint_id, confirmed)
        if confirmed is None or base_now:
            self._delta_give_up_base()
            return DeltaSnapshot(
                self, checkpoint_id, states, entries, per_state, base=self.snapshot(), ttl_cleanup=ttl_cleanup
            )
        since = confirmed[0]
        epochs = [e for cid, e in self._delta_epochs if cid > since]
        counts: dict[str, dict[str, int]] = {}
        blocks = self._delta_blocks(regs, len(states), self._delta_changes(epochs), counts)
        header = SnapshotHeader(
            self.max_parallelism,
            self.key_group_range,
            self.key_serializer.config(),
            states + [{"name": REMOVAL_PREFIX + r.name} for r in regs],
            backend=self.backend_name,
            extra={
                "timers": {
                    d.value: n for d, n in TIMER_STATE_NAMES.items() if n in {m["name"] for m in states}
                },
                "delta_since": since,
                KG_ENTRIES: counts,
            },
        )
        self._delta_pins.append(confirmed[2])
        return DeltaSnapshot(
            self,
            checkpoint_id,
            states,
            entries,
            per_state,
            delta=(confirmed, header, blocks),
            ttl_cleanup=ttl_cleanup,
            adopt=adopt,
        )

    def _delta_plan(self, checkpoint_id: int, confirmed: _Confirmed) -> tuple[bool, Materialization | None]:
        """Whether this checkpoint writes a base itself, and the base encoded in the background it adopts.

        A base encoded in the background is adopted by the first checkpoint
        that finds it finished: its checkpoint's state, then the confirmed
        chain's deltas of later checkpoints, then this delta (the changes since
        the confirmed checkpoint, as they are now) is this checkpoint's state,
        also when the confirmed checkpoint is older than the base, since a
        delta applies on any state from the checkpoint it follows on. One that
        failed makes this checkpoint write a base itself, which meets the same
        error if it lies in the state. A chain continued across a rescale
        starts one at its second checkpoint (the first, the restart's, stays
        light): until the instance has a base of its own, a restore reads its
        predecessors' whole files.
        """
        chain = confirmed[1]
        job = self._delta_base_job
        if job is not None:
            if not job.finished and self._delta_due_base(chain, 2.0):
                job.wait()  # the chain is at twice the bound: a restore would replay too much
            if not job.finished:
                return False, None
            if job.data is None:
                self._delta_base_job = None
                _log.warning(
                    "%s %s: encoding the base of checkpoint %s in the background failed (%s: %s); "
                    "checkpoint %s writes a base itself",
                    self.backend_name,
                    self.key_group_range,
                    job.checkpoint_id,
                    type(job.error).__name__,
                    job.error,
                    checkpoint_id,
                )
                return True, None
            return False, job
        # After a claimed rescale, once the first checkpoint (the restart's, kept light) wrote its delta.
        rescaled = any("key_groups" in link for link in chain) and any(
            "key_groups" not in link for link in chain
        )
        if not self._delta_due_base(chain) and not (rescaled and self.delta_background):
            return False, None
        if not self.delta_background or self._delta_due_base(chain, 2.0):
            # Twice the bound and nothing encoding (an instance restored since the last one started):
            # written now, so a restore never replays more, however often instances are restored.
            return True, None
        self._delta_base_job = Materialization(checkpoint_id, self.snapshot())
        return False, None

    def _delta_give_up_base(self) -> None:
        """The base being encoded in the background is never used (a new chain, a close)."""
        job, self._delta_base_job = self._delta_base_job, None
        if job is not None:
            job.give_up()

    def _delta_unpin(self, files: dict[str, NativeFile]) -> None:
        """A delta applying on the chain of ``files`` was written or given up."""
        for i, pin in enumerate(self._delta_pins):
            if pin is files:
                del self._delta_pins[i]
                return

    def _delta_due_base(self, chain: list[dict[str, Any]], scale: float = 1.0) -> bool:
        """A base is due where some key groups' part of the chain has ``max_deltas`` deltas, or deltas
        of more than ``max_delta_ratio`` of their base's bytes (a rescaled chain: each predecessor's part);
        ``scale`` times those bounds with ``scale``."""
        for _, links in _coverage(self.key_group_range, chain):
            deltas = [link for link in links if link["kind"] == "delta"]
            if len(deltas) >= scale * self.delta_max_deltas:
                return True
            base = sum(int(link["size"]) for link in links if link["kind"] == "base")
            if sum(int(link["size"]) for link in deltas) > scale * self.delta_max_ratio * base:
                return True
        return False

    def _delta_blocks(
        self,
        regs: list[RegisteredState],
        n_states: int,
        changes: dict[str, dict[int, DeltaChanges]],
        counts: dict[str, dict[str, int]],
    ) -> dict[int, list[tuple[int, bytes, bytes, bytes, int]]]:
        """Each key group's sections, encoded now (values as they are at the checkpoint).

        ``counts`` receives, per state and changed key group, the entries a
        restore of the chain holds there (where the backend counted them and
        no expiry makes the restored count differ from the live one).
        """
        ks = self.key_serializer
        now = self.clock()
        out: dict[int, list[tuple[int, bytes, bytes, bytes, int]]] = {}
        for i, reg in enumerate(regs):
            by_kg = changes.get(reg.name)
            if not by_kg:
                continue
            ttl = reg.ttl.ttl_ms if reg.ttl is not None and reg.ttl.cleanup_full_snapshot else None
            for kg, c in by_kg.items():
                keys, nss, vals = c.keys, c.namespaces, c.values
                rkeys, rnss = c.removed_keys, c.removed_namespaces
                if c.size is not None and ttl is None:
                    counts.setdefault(reg.name, {})[str(kg)] = c.size
                if ttl is not None and keys:  # as a full snapshot drops expired entries, a delta removes them
                    k2, n2, v2 = [], [], []
                    for k, n, v in zip(keys, nss, vals):
                        live = purge_expired(reg.storage_kind, v, now, ttl)
                        if live is None:
                            rkeys.append(k)
                            rnss.append(n)
                        else:
                            k2.append(k)
                            n2.append(n)
                            v2.append(live)
                    keys, nss, vals = k2, n2, v2
                secs = out.setdefault(kg, [])
                if keys:
                    secs.append(
                        (
                            i,
                            ks.encode_column(keys),
                            encode_namespaces(nss, reg.namespace_serializer, VOID_NAMESPACE, reg.name),
                            reg.serializer.encode_column(vals),
                            len(keys),
                        )
                    )
                if rkeys:
                    secs.append(
                        (
                            n_states + i,
                            ks.encode_column(rkeys),
                            encode_namespaces(rnss, reg.namespace_serializer, VOID_NAMESPACE, reg.name),
                            b"",
                            len(rkeys),
                        )
                    )
        for secs in out.values():
            secs.sort(key=lambda s: s[0])
        return out

    def _delta_reference(
        self, checkpoint_id: int, confirmed: _Confirmed, after: int | None = None
    ) -> tuple[list[NativeFile], list[dict[str, Any]]]:
        """The chain ``confirmed`` when the delta was taken (its changes are since that chain), checked.

        With ``after``, only its links of later checkpoints (they follow a base
        of checkpoint ``after`` encoded in the background).

        Not the newest confirmed chain: a checkpoint that completed after this
        snapshot was taken holds writes made after it. Its files stay
        referenceable meanwhile: every checkpoint written while this snapshot
        waits holds them too (:meth:`_delta_pinned`), so retention keeps them.
        """
        cid, chain, files = confirmed
        if after is not None:
            chain = [link for link in chain if int(link["checkpoint_id"]) > after]
        if not cid < checkpoint_id:
            raise SnapshotError(
                f"the delta written as checkpoint {checkpoint_id} holds the changes since checkpoint {cid}: "
                "write a native snapshot as the checkpoint it was taken for"
            )
        out: dict[str, NativeFile] = {}
        for link in chain:
            name = str(link["file"])
            f = self.native_uploads.reusable(name)
            if f is None or f is not files.get(name):
                raise SnapshotError(
                    f"checkpoint {checkpoint_id}: file {name} of confirmed checkpoint {cid}'s chain "
                    "may no longer be referenced; the snapshot is not written"
                )
            out[name] = f  # a rescaled chain may list one file for two runs of key groups
        return list(out.values()), [dict(link) for link in chain]

    def _delta_pinned(self, files: list[NativeFile]) -> list[NativeFile]:
        """``files`` and the files of the chains that deltas taken but not written yet apply on.

        A checkpoint's handle holds them besides its own chain (a restore reads
        only the chain's), so they stay referenceable and retention keeps them
        until such a delta is written, even after a later checkpoint wrote a base.
        """
        names = {f.name for f in files}
        out = list(files)
        for pin in self._delta_pins:
            for f in pin.values():
                if f.name not in names:  # a name taken by another file: that delta's write refuses, naming it
                    names.add(f.name)
                    out.append(f)
        return out

    def _delta_written(
        self, checkpoint_id: int, files: list[NativeFile], chain: list[dict[str, Any]]
    ) -> None:
        by_name = {f.name: f for f in files}
        self.native_uploads.uploaded(checkpoint_id, by_name)
        self._delta_chains[checkpoint_id] = (chain, by_name)

    def _delta_forget_chain(self) -> None:
        """The next snapshot writes a base (a state's schema changed since the chain was written)."""
        self._delta_confirmed = None
        self._delta_chains.clear()
        self._delta_give_up_base()  # it holds the old schema's bytes too

    def close(self) -> None:
        """The keyed base's, after giving up a base being encoded in the background."""
        self._delta_give_up_base()
        super().close()

    def get_state(self, descriptor: Any, *, namespace_serializer: Any = None) -> Any:
        """The keyed base's; a restored state declared with another schema makes the next snapshot a base."""
        held = self._pending.get(descriptor.name)
        h = super().get_state(descriptor, namespace_serializer=namespace_serializer)
        if held is not None and not same_schema(held[0], self._states[descriptor.name].meta()):
            self._delta_forget_chain()  # the chain holds the old schema's bytes
        return h

    # --- the completion contract -------------------------------------------------------

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: later deltas are written against its chain."""
        super().notify_checkpoint_complete(checkpoint_id)
        done = self._delta_chains.pop(checkpoint_id, None)
        for cid in [c for c in self._delta_chains if c < checkpoint_id]:
            del self._delta_chains[cid]
        newer = self._delta_confirmed is not None and self._delta_confirmed[0] > checkpoint_id
        if done is not None and not newer:  # an older checkpoint completing late never replaces a newer chain
            self._delta_confirmed = (checkpoint_id, *done)
            self._delta_epochs = [(c, e) for c, e in self._delta_epochs if c > checkpoint_id]
            job = self._delta_base_job
            if job is not None and any(
                link["kind"] == "base" and int(link["checkpoint_id"]) >= job.checkpoint_id for link in done[0]
            ):
                self._delta_base_job = None  # in the confirmed chain now (or a newer base is): its bytes go

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` never completes: its changes go into the next delta."""
        super().notify_checkpoint_aborted(checkpoint_id)
        self._delta_chains.pop(checkpoint_id, None)

    # --- restores ----------------------------------------------------------------------

    def restore_native(self, handles: Sequence[NativeStateHandle]) -> None:
        """Restore chains of any parallelism: each owned key group's base, then its deltas in order.

        Every file is read and checked (size, SHA-256) before anything is
        restored. The restored chain is kept for the runner's claim, so later
        checkpoints write deltas against it: one handle's chain at the same
        key groups as it is, and after a rescale the chains of every handle
        that holds some of this instance's key groups, each link limited to
        the key groups it holds here (``key_groups``), as Flink's incremental
        checkpoints reference a rescaled predecessor's files.
        """
        metas = self.check_native_restore(handles, self.native_format)
        own = self.key_group_range
        staged: dict[str, tuple[dict[str, Any], list[tuple[int, Section]]]] = {
            name: (meta, []) for name, meta in metas.items()
        }
        counts: dict[str, dict[int, int | None]] = {}
        ordered = sorted(handles, key=lambda h: h.key_group_range.start)
        read: dict[str, bytes] = {}
        for h in ordered:
            for link, data, checked in _chain_files(h, read):
                _stage_file(data, checked, h, link, own, staged, counts)
        self._delta_purge_expired(ordered, own, staged)
        self._delta_kg_entries = counts
        self._delta_track()
        self._delta_give_up_base()
        self._delta_epochs = []
        self._delta_chains = {}
        self._delta_confirmed = None
        migrated = self._restore_staged(staged)
        ids = {h.checkpoint_id for h in handles}
        if migrated or len(ids) != 1:
            self.native_uploads.restored()
            return
        (cid,) = ids
        if len(handles) == 1 and handles[0].key_group_range == own:
            h = handles[0]
            files = {f.name: f for f in h.files}
            chain = [dict(link) for link in h.meta["chain"]]
        else:
            chain, files = _rescaled_chain(ordered, own)
        self.native_uploads.restored(cid, files)
        self._delta_chains[cid] = (chain, files)

    def _delta_purge_expired(
        self,
        handles: Sequence[NativeStateHandle],
        own: KeyGroupRange,
        staged: dict[str, tuple[dict[str, Any], list[tuple[int, Section]]]],
    ) -> None:
        """Drop what full-snapshot TTL cleanup would have, as of each handle's time (``ttl_cleanup``).

        A state's key groups are merged (base, changes, removals) into one
        section each, without the entries expired when the snapshot was taken.
        """
        self._delta_restored_ttl = {}
        for h in handles:
            cleanup, when = h.meta.get("ttl_cleanup"), h.meta.get("time_ms")
            if not cleanup:
                continue
            where = f"native {h.backend} snapshot of {h.key_group_range} (checkpoint {h.checkpoint_id})"
            if not (
                isinstance(cleanup, dict)
                and isinstance(when, int)
                and all(isinstance(v, int) and v > 0 for v in cleanup.values())
            ):
                raise CorruptSnapshotError(f"{where}: its 'ttl_cleanup' or 'time_ms' is malformed")
            mine = h.key_group_range.intersection(own)
            # A base alone left expired entries out when it was taken: nothing to drop.
            deltas = any(link.get("kind") == "delta" for link in h.meta["chain"])
            for name, ttl_ms in cleanup.items():
                self._delta_restored_ttl[name] = ttl_ms
                item = staged.get(name)
                if item is not None and deltas:
                    staged[name] = (item[0], self._purged(item[0], item[1], mine, when, ttl_ms, where))

    def _purged(
        self,
        meta: dict[str, Any],
        secs: list[tuple[int, Section]],
        mine: KeyGroupRange,
        when: int,
        ttl_ms: int,
        where: str,
    ) -> list[tuple[int, Section]]:
        """``secs``, each key group of ``mine`` merged into one section without what expired at ``when``."""
        name = meta["name"]
        try:
            reg = RegisteredState.from_meta(meta)
            merged = self._delta_merged(reg, [(kg, sec) for kg, sec in secs if kg in mine])
        except SnapshotError as e:
            raise SnapshotError(
                f"{where}: state {name!r} leaves expired entries out of full snapshots, and its serializers "
                f"cannot be rebuilt from their configs to drop them at this restore ({e}); restore it with "
                "serializers that describe themselves"
            ) from e
        out = [(kg, sec) for kg, sec in secs if kg not in mine]
        for kg, d in merged:
            live = {}
            for slot, v in d.items():
                kept = purge_expired(reg.storage_kind, v, when, ttl_ms)
                if kept is not None:
                    live[slot] = kept
            if live:
                out.append((kg, self._delta_section(reg, live)))
        return out

    def _delta_restored_count(self, name: str, key_group: int, sections: Sequence[Section]) -> int | None:
        """The exact entries of state ``name`` that ``sections`` (a key group's, in order) restore, if known.

        One plain section holds them all (a base's, or a delta's for a key group
        the base did not hold); after deltas, the last delta's header says (if
        its backend counted); otherwise None: decode to know.
        """
        if len(sections) == 1 and not sections[0].removal:
            return sections[0].count
        return self._delta_kg_entries.get(name, {}).get(key_group)

    def num_entries(self, state_name: str | None = None) -> int:
        """The keyed base's, exact also for undeclared states restored with deltas (entries, not sections)."""
        if state_name is None:
            return sum(self.num_entries(n) for n in self.state_names)
        held = self._pending.get(state_name)
        if held is None:
            return super().num_entries(state_name)
        by_kg: dict[int, list[Section]] = {}
        for kg, sec in held[1]:
            by_kg.setdefault(kg, []).append(sec)
        total = 0
        for kg, secs in by_kg.items():
            n = self._delta_restored_count(state_name, kg, secs)
            if n is None:
                n = self._delta_count_decoded(held[0], kg, secs)
            total += n
        return total

    def _delta_count_decoded(self, meta: dict[str, Any], kg: int, secs: list[Section]) -> int:
        """The entries a key group's sections restore, from their decoded keys (remembered)."""
        name = meta["name"]
        try:
            reg = RegisteredState.from_meta(meta)
            live: set[tuple[Any, Any]] = set()
            for sec in secs:
                keys_only = Section(name, sec.count, sec.keys, sec.namespaces, b"", removal=True)
                keys, nss, _ = self._decode(reg, keys_only)
                pairs = zip(nss, keys)
                if sec.removal:
                    live.difference_update(pairs)
                else:
                    live.update(pairs)
        except SnapshotError as e:
            raise SnapshotError(
                f"state {name!r}, key group {kg}: restored from a heap delta chain with serializers that "
                f"cannot be rebuilt from their configs ({e}), so its entries cannot be counted before it is "
                "declared; declare it (get_state) first"
            ) from e
        self._delta_kg_entries.setdefault(name, {})[kg] = len(live)
        return len(live)

    def _delta_restored_counts_done(self, name: str) -> None:
        """State ``name``'s restored sections were taken: its counts are not needed any more."""
        self._delta_kg_entries.pop(name, None)

    def snapshot(self) -> KeyedSnapshot:
        """The keyed base's, after merging the deltas of restored states not declared yet."""
        self._delta_merge_pending()
        return super().snapshot()

    def _delta_merge_pending(self) -> None:
        """Undeclared states with delta sections: merged into plain sections where their serializers allow.

        A restore leaves them in order (a base's sections, then each delta's), which
        declaring the state applies; a snapshot taken before needs them merged.
        """
        for name, (meta, secs) in list(self._pending.items()):
            if not any(s.removal for _, s in secs) and len({kg for kg, _ in secs}) == len(secs):
                continue
            try:
                reg = RegisteredState.from_meta(meta)
                merged = self._delta_merged(reg, secs)
            except SnapshotError:
                continue  # a custom serializer: merged when declared; a snapshot before that refuses
            self._pending[name] = (meta, [(kg, self._delta_section(reg, d)) for kg, d in merged if d])

    def _delta_merged(
        self, reg: RegisteredState, secs: Iterable[tuple[int, Section]]
    ) -> list[tuple[int, dict[tuple[Any, Any], Any]]]:
        """Per key group (in order), the entries ``secs`` restore: values replace, removals remove.

        Raises:
            SnapshotError: If a section cannot be decoded with ``reg``'s serializers.
        """
        merged: dict[int, dict[tuple[Any, Any], Any]] = {}
        for kg, sec in secs:
            keys, nss, vals = self._decode(reg, sec)
            d = merged.setdefault(kg, {})
            if sec.removal:
                for k, n in zip(keys, nss):
                    d.pop((n, k), None)
            else:
                d.update(zip(zip(nss, keys), vals))
        return sorted(merged.items())

    def _delta_section(self, reg: RegisteredState, entries: dict[tuple[Any, Any], Any]) -> Section:
        """One plain section of ``entries`` (by namespace and key) of state ``reg``."""
        nss = [n for n, _ in entries]
        return Section(
            reg.name,
            len(entries),
            self.key_serializer.encode_column([k for _, k in entries]),
            encode_namespaces(nss, reg.namespace_serializer, VOID_NAMESPACE, reg.name),
            reg.serializer.encode_column(list(entries.values())),
        )


def _link_range(whole: KeyGroupRange, link: dict[str, Any]) -> KeyGroupRange:
    """The key groups a chain link holds for its handle (of ``whole``): its ``key_groups``, else all.

    A runner may hand a backend a handle limited to the key groups it restores
    (:meth:`NativeStateHandle.intersect`), so a link's own range is limited too.
    """
    kgs = link.get("key_groups")
    return whole if kgs is None else KeyGroupRange.of(int(kgs[0]), int(kgs[1])).intersection(whole)


def _coverage(
    whole: KeyGroupRange, chain: list[dict[str, Any]]
) -> list[tuple[KeyGroupRange, list[dict[str, Any]]]]:
    """The runs of key groups of ``whole`` that the same links of ``chain`` hold, each with those links.

    One run for a chain written at one parallelism; after a rescale, one per
    predecessor's part (and per part a later rescale cut).
    """
    ranges = [_link_range(whole, link) for link in chain]
    cuts = {whole.start, whole.end + 1}
    for r in ranges:
        if len(r):
            cuts.update((r.start, r.end + 1))
    bounds = sorted(cuts)
    return [
        (KeyGroupRange.of(a, b - 1), [link for link, r in zip(chain, ranges) if a in r])
        for a, b in pairwise(bounds)
    ]


def _chain_files(
    h: NativeStateHandle, read: dict[str, bytes]
) -> Iterable[tuple[dict[str, Any], bytes, bool]]:
    """Each link of ``h``'s chain with its file's checked bytes, in order; the chain itself checked.

    The third item says whether those bytes were checked against a SHA-256
    (a file uploaded before digests is checked by its CRC-32).

    Every key group of the handle's must lie in a base followed by deltas of
    later checkpoints, none after the handle's. A file that two links list (a
    rescaled chain's), or two handles of one restore, is read once: ``read``
    holds what was read, by the file's identity.
    """
    chain = h.meta.get("chain")
    where = f"native {h.backend} snapshot of {h.key_group_range} (checkpoint {h.checkpoint_id})"
    if not isinstance(chain, list) or not chain or not all(isinstance(link, dict) for link in chain):
        raise CorruptSnapshotError(f"{where} lists no chain of files (meta 'chain')")
    whole = h.key_group_range
    for link in chain:
        kgs = link.get("key_groups")
        if kgs is None:
            continue
        if not (
            isinstance(kgs, list)
            and len(kgs) == 2
            and all(isinstance(k, int) and not isinstance(k, bool) for k in kgs)
        ):
            raise CorruptSnapshotError(
                f"{where}: link {link.get('file')!r} has key groups {kgs!r}, not [start, end]"
            )
        if not len(KeyGroupRange.of(kgs[0], kgs[1])):
            raise CorruptSnapshotError(f"{where}: link {link.get('file')!r} holds no key groups ({kgs!r})")
    rescaled = any("key_groups" in link for link in chain)
    for run, links in _coverage(whole, chain):
        at = f" for key groups {run}" if rescaled else ""
        kinds = [link.get("kind") for link in links]
        if not kinds or kinds[0] != "base" or any(k != "delta" for k in kinds[1:]):
            raise CorruptSnapshotError(f"{where}: its chain{at} {kinds} is not a base followed by deltas")
        ids = [int(link.get("checkpoint_id", -1)) for link in links]
        if ids != sorted(set(ids)) or ids[-1] > h.checkpoint_id:
            raise CorruptSnapshotError(f"{where}: its chain's checkpoints{at} {ids} are out of order")
    for link in chain:
        if not len(_link_range(whole, link)):
            continue  # none of this (limited) handle's key groups: not read
        f = h.file(str(link.get("file")))
        identity = _identity(f)
        data = read.get(identity)
        if data is None:
            data = read[identity] = f.read()
        yield link, data, f.sha256 is not None


def _identity(f: NativeFile) -> str:
    """What makes two handles' entries one file: its digest, size and where it lies."""
    return f"{f.sha256}:{f.size}:{json.dumps(f.stream.to_json(), sort_keys=True)}"


def _rescaled_chain(
    handles: Sequence[NativeStateHandle], own: KeyGroupRange
) -> tuple[list[dict[str, Any]], dict[str, NativeFile]]:
    """The chain of an instance of key groups ``own`` restored from ``handles`` (sorted by key group).

    Each handle's links that hold some of ``own``, in order, limited to those
    key groups; a file of another handle's under a name already taken gets a
    name of its own (names are unique within a handle), one listed by two
    handles keeps one name. Deltas written later hold all of ``own`` and
    follow every link, as each file holds only its writer's key groups.
    """
    chain: list[dict[str, Any]] = []
    files: dict[str, NativeFile] = {}
    by_stream: dict[str, str] = {}
    for h in handles:
        mine = h.key_group_range.intersection(own)
        if not len(mine):
            continue
        for link in h.meta["chain"]:
            r = _link_range(h.key_group_range, link).intersection(mine)
            if not len(r):
                continue
            f = h.file(str(link["file"]))
            identity = _identity(f)
            name = by_stream.get(identity)
            if name is None:
                name, n = f.name, 1
                while name in files:
                    name, n = f"{f.name}~{n}", n + 1
                files[name] = f if name == f.name else replace(f, name=name)
                by_stream[identity] = name
            chain.append({**link, "file": name, "key_groups": [r.start, r.end]})
    return chain, files


def _stage_file(
    data: bytes,
    digest_checked: bool,
    h: NativeStateHandle,
    link: dict[str, Any],
    own: KeyGroupRange,
    staged: dict[str, tuple[dict[str, Any], list[tuple[int, Section]]]],
    counts: dict[str, dict[int, int | None]],
) -> None:
    """Append the owned key groups' sections of one chain file to ``staged``, in order.

    A delta's counts (its header's ``kg_entries``) go to ``counts``: the last
    delta changing a state's key group says how many entries it holds.
    """
    where = f"native file {link['file']} of checkpoint {h.checkpoint_id}"
    stream = BytesStreamHandle(data, where, digest_checked)  # checked: its blocks parsed in place
    header, header_length = read_header(stream)
    holds = _link_range(h.key_group_range, link)
    if header.max_parallelism != h.max_parallelism or header.key_group_range.intersection(holds) != holds:
        raise CorruptSnapshotError(
            f"{where}: its header's key groups or max parallelism are not its handle's"
        )
    part = KeyedStateHandle(stream, holds.intersection(own), read_index(stream), header_length)
    recorded = header.extra.get(KG_ENTRIES) if link["kind"] == "delta" else None
    if recorded is not None and not (
        isinstance(recorded, dict)
        and all(
            isinstance(v, dict) and all(isinstance(n, int) and n >= 0 for n in v.values())
            for v in recorded.values()
        )
    ):
        raise CorruptSnapshotError(f"{where}: its header's {KG_ENTRIES!r} are not counts per key group")
    for kg, sections in iter_blocks(part, header):
        for s in sections:
            name, removal = s.state, False
            if name.startswith(REMOVAL_PREFIX):
                if link["kind"] != "delta":
                    raise CorruptSnapshotError(f"{where}: a base holds removals")
                name, removal = name[len(REMOVAL_PREFIX) :], True
            item = staged.get(name)
            if item is None:
                raise CorruptSnapshotError(
                    f"{where} holds entries of state {name!r}, which its handle does not list"
                )
            if removal:
                s = Section(name, s.count, s.keys, s.namespaces, b"", removal=True)
            item[1].append((kg, s))
            if link["kind"] == "delta":
                n = (recorded or {}).get(name, {}).get(str(kg))
                counts.setdefault(name, {})[kg] = n
