"""Each state's entries and bytes, as a subtask's keyed part of ``_metadata`` records them.

One reading for every channel that shows per-state numbers: the metrics
(``runtime/_metrics``: the log line, ``BatchInfo``, the Spark metrics system),
``statekit state list`` (``SavepointReader.operators``) and ``statekit
checkpoints inspect``. What a part records depends on its format:

- a canonical part (``checkpoints/_writing``) names both at its top level:
  ``state_entries``, the (key, namespace) entries of each state, and
  ``state_sizes``, the bytes of its sections; a part written by a statekit
  before per-state counts names the bytes only;
- the heap's native part (a base and deltas, ``state/_delta.py``, the default
  checkpoint of the default backend) names both in its handle's ``meta``: each
  state's exact entries at the checkpoint, and its bytes in every file a restore
  reads (the base's and each delta's, so an entry changed since the base counts
  once in every file that holds it);
- the ordered engines' native parts (RocksDB, LMDB) name neither: their entry
  counts are per state and key group and they record no bytes per state.

A number a part does not record is None, never 0: 0 is a measurement (a state
with no entries).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..snapshots._snapshot import CANONICAL_FORMAT

__all__ = ["StateSizes", "part_state_sizes", "summed_state_sizes"]


@dataclass(frozen=True)
class StateSizes:
    """Per state name: its entries and its bytes, each None where the parts do not record it.

    A state a part does not list while it lists others has none of either in that part.
    """

    entries: Mapping[str, int] | None
    bytes: Mapping[str, int] | None

    @property
    def complete(self) -> bool:
        """Whether both numbers are recorded for every state."""
        return self.entries is not None and self.bytes is not None


def part_state_sizes(keyed: Mapping[str, Any]) -> StateSizes:
    """What the keyed part ``keyed`` (a subtask's entry in ``_metadata``) records of each state."""
    if keyed.get("format", CANONICAL_FORMAT) == CANONICAL_FORMAT:
        return StateSizes(_counts(keyed.get("state_entries")), _counts(keyed.get("state_sizes")))
    native = keyed.get("native")
    meta = native.get("meta") if isinstance(native, Mapping) else None
    if not isinstance(meta, Mapping):
        return StateSizes(None, None)
    return StateSizes(_counts(meta.get("state_entries")), _counts(meta.get("state_sizes")))


def summed_state_sizes(parts: Iterable[StateSizes]) -> StateSizes:
    """Every part's numbers added up per state; a number any part lacks is None for all states."""
    entries: dict[str, int] | None = {}
    sizes: dict[str, int] | None = {}
    for part in parts:
        entries = _add(entries, part.entries)
        sizes = _add(sizes, part.bytes)
    return StateSizes(entries, sizes)


def _counts(value: Any) -> dict[str, int] | None:
    if not isinstance(value, Mapping):
        return None
    return {str(name): int(n) for name, n in value.items()}


def _add(total: dict[str, int] | None, part: Mapping[str, int] | None) -> dict[str, int] | None:
    if total is None or part is None:
        return None
    for name, n in part.items():
        total[name] = total.get(name, 0) + n
    return total
