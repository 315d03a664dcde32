"""Exact entry counts of an ordered key-value backend, kept on write (as Spark's RocksDB ``numRowsTotal``).

An engine's own count is of stored records (RocksDB's ``estimate-num-keys``
counts every version of a key in SST files not yet compacted together; a
list element or a map entry is a record of its own), while statekit reports
(key, namespace) entries: a value, a whole list, a whole map, as ``statekit
state list`` does. :class:`EntryCounts` keeps that number per state and key
group, exactly, as the buffered writes reach the engine
(:meth:`before_write`, called by the ordered base for every write of a
column's buffer):

- a value entry (a composite key without a suffix) counts when it appears
  and when it is deleted; whether it existed before is known from the read
  that preceded the write (the handles note each engine read in
  ``KVColumn.known``, and the keys it found absent in ``KVColumn.absent``:
  a read-modify-write costs no extra lookup), else looked up, once per key
  per write batch. A batch of a column of values costs C-level passes over
  its buffer and its new keys, and Python work only per deleted entry
  (:meth:`EntryCounts._values`; ``bench/bench_count_cost.py`` measures it);
- a list or map entry is a group of records under one (key, namespace)
  prefix: for each prefix a batch touches, one seek says whether the engine
  held any record under it before, and the batch's own records (or, for a
  batch that only deletes, a look past them) whether any remains.

Bulk loads count the groups they load. A native snapshot records the counts
per state and key group in its meta (``entry_counts``), so a restore, at the
same or another parallelism, sums those of the key groups it owns; a
snapshot without them (an older statekit's) leaves the count unknown until
the state is written anew from empty, and the backend then reports the
engine's estimate, labelled.

Counting is per backend instance: :attr:`EntryCounts.enabled` comes from the
instance's :class:`~statekit.backend_api.KeyedBackendParameters`
(``exact_entries``: the job's ``statekit.metrics.exact-entries``, as Spark's
``spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows``). Off, the
instance keeps no counts, its columns' reads note nothing (no bookkeeping on
the hot path), its snapshots record no ``entry_counts``, and what it reports
is the engine's estimate, labelled as such.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from operator import is_, itemgetter
from typing import Any

from ._kvcolumn import KVColumn
from ._kvlayout import KeyLayout

__all__ = ["ENTRY_COUNTS", "EntryCounts"]

#: The native snapshot meta key of the counts: ``{state: {key group: entries}}``.
ENTRY_COUNTS = "entry_counts"
_MISSING: Any = object()


class EntryCounts:
    """(key, namespace) entries per state and key group of one backend instance; see the module doc."""

    def __init__(self, layout: KeyLayout, enabled: bool = True) -> None:
        #: Off: no counting at all, for this instance only (``statekit.metrics.exact-entries=false``).
        self.enabled = enabled
        self.layout = layout
        self._group = itemgetter(slice(0, layout.group_width))  # a key's key-group prefix
        #: Per state, entries per key group, by the key group's prefix (``KeyLayout.group_prefix``):
        #: a write batch adds its new entries with one ``Counter.update`` over their keys' prefixes.
        self.by_state: dict[str, Counter[bytes]] = {}
        self.unknown: set[str] = set()

    # --- writes ---------------------------------------------------------------------------------

    def before_write(self, col: KVColumn) -> None:
        """Count what ``col``'s buffer changes, before the engine applies it."""
        name = col.name
        if not self.enabled or name in self.unknown:
            col.forget_presence()
            return
        counts = self.by_state.get(name)
        if counts is None:
            counts = self.by_state[name] = Counter()
        if col.grouped is False:  # value entries only: the record is the entry
            self._values(col, counts)
        else:
            self._groups(col, counts)
        col.forget_presence()

    def _values(self, col: KVColumn, counts: Counter[bytes]) -> None:
        """A column of value entries: which buffered writes make an entry appear or go.

        No Python code runs per buffered key, nor per new key or key group: one
        C-level pass checks that the reads noted every key (``known``; a blind
        write's key is looked up in the engine first) and one whether the buffer
        deletes anything. An entry appears where a key the reads found absent
        (``absent``) is put: without deletes, that is every buffered key of
        ``absent`` (a set intersection), counted per key-group prefix by one
        ``Counter.update``; one goes where a key that existed is deleted.
        """
        buf, known, absent = col.buffer, col.known, col.absent
        keys = buf.keys()
        if not keys <= known.keys():  # blind writes: what the engine holds under them
            get = col.get
            for k in keys - known.keys():
                if get(k) is None:
                    known[k] = False
                    absent.add(k)
                else:
                    known[k] = True
        group = self._group
        deletes = any(map(is_, buf.values(), repeat(None)))
        if absent:
            new = absent.intersection(keys)  # absent keys the batch writes (reads alone write nothing)
            if deletes:
                new = {k for k in new if buf[k] is not None}
            counts.update(map(group, new))
        if deletes:
            counts.subtract(map(group, [k for k, v in buf.items() if v is None and known[k]]))

    def _groups(self, col: KVColumn, counts: Counter[bytes]) -> None:
        """A column whose entries may be groups of records (list, map, or not known yet)."""
        split, group = self.layout.split, self._group
        touched: dict[bytes, list[Any]] = {}  # prefix -> [key-group prefix, any put]
        values: dict[bytes, bytes | None] = {}
        for k, v in col.buffer.items():
            suffix = split(k)[3]
            if not suffix:  # a value entry
                old = col.known.pop(k, _MISSING)
                if old is _MISSING:
                    old = col.get(k) is not None
                if old is (v is None):
                    counts[group(k)] += 1 if v is not None else -1
                continue
            prefix = k[: len(k) - len(suffix)]
            t = touched.get(prefix)
            if t is None:
                t = touched[prefix] = [group(k), False]
            if v is not None:
                t[1] = True
            values[k] = v
        for prefix, (kg, put) in touched.items():
            before = next(iter(col.scan(prefix)), None) is not None
            if put:
                after = True
            elif not before:
                after = False
            else:  # only deletes under the prefix: does a record the batch leaves remain?
                after = any(values.get(k, _MISSING) is _MISSING for k, _ in col.scan(prefix))
            if after != before:
                counts[kg] += 1 if after else -1

    # --- loads and restores ---------------------------------------------------------------------

    def loaded(self, name: str, items: Sequence[tuple[bytes, bytes]]) -> None:
        """``items`` (sorted, distinct) were bulk-loaded into state ``name``'s column."""
        if not self.enabled or name in self.unknown:
            return
        counts = self.by_state.setdefault(name, Counter())
        if any(counts.values()):
            self.unknown.add(name)  # loaded over entries: they may overlap, so the count is unknown
            return
        split, group = self.layout.split, self._group
        last = b""
        for k, _ in items:
            suffix = split(k)[3]
            prefix = k[: len(k) - len(suffix)]
            if prefix != last:
                counts[group(k)] += 1
                last = prefix
        # A group split across loads of one state is not a case: a state loads once per restore.

    def restored(self, metas: Iterable[Mapping[str, Any]], owned: range, states: Iterable[str]) -> None:
        """After a native restore: the counts of the owned key groups, from each snapshot's meta.

        ``states``: every state the restored instance holds. A snapshot without counts makes them unknown.
        """
        self.by_state, self.unknown = {}, set()
        if not self.enabled:
            return
        metas = list(metas)
        if any(not isinstance(m.get(ENTRY_COUNTS), Mapping) for m in metas):
            self.unknown = set(states)  # an older snapshot: no counts to restore
            return
        for meta in metas:
            for name, per_group in meta[ENTRY_COUNTS].items():
                counts = self.by_state.setdefault(str(name), Counter())
                for kg, n in per_group.items():
                    if int(kg) in owned:
                        counts[self.layout.group_prefix(int(kg))] += int(n)

    def forget(self, name: str) -> None:
        """State ``name``'s column was dropped or replaced: it holds nothing (exactly)."""
        self.by_state.pop(name, None)
        self.unknown.discard(name)

    # --- what snapshots and metrics read --------------------------------------------------------

    def exact(self, names: Iterable[str]) -> dict[str, int] | None:
        """Entries per state of ``names``; None if any is unknown (or counting is off)."""
        if not self.enabled:
            return None
        out = {}
        for name in names:
            if name in self.unknown:
                return None
            counts = self.by_state.get(name)
            out[name] = 0 if counts is None else sum(counts.values())
        return out

    def meta(self, names: Iterable[str]) -> dict[str, dict[str, int]] | None:
        """What a native snapshot records (``entry_counts``): per state and key group; None if unknown."""
        if self.exact(names) is None:
            return None
        out = {}
        for name in names:
            counts: Mapping[bytes, int] = self.by_state.get(name, {})
            per_group = {int.from_bytes(p, "big"): n for p, n in counts.items() if n}
            out[name] = {str(kg): per_group[kg] for kg in sorted(per_group)}
        return out
