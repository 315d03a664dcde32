"""Raw state: bytes a function writes itself at a snapshot, kept per key group and as a list of items.

Beside managed state (descriptors and handles, which statekit serializes),
Flink lets an operator write *raw* state: a byte stream per key group it owns
(raw keyed state, ``StateSnapshotContext.getRawKeyedOperatorStateOutput()``,
``startNewKeyGroup(kg)`` for each key group of the subtask), handed back on
restore for exactly the key groups the new subtask owns
(``StateInitializationContext.getRawKeyedStateInputs()``), and a list of byte
partitions per subtask (raw operator state, ``getRawOperatorStateOutput()``),
redistributed as an even split. statekit keeps both in one file per subtask,
laid out here; ``checkpoints/_raw.py`` writes and reads it through a storage.

The file: the magic ``STKRAW01``, then each key group's bytes in key-group
order, then each operator item's bytes in order. Its ``_metadata`` entry
names where each part lies and the SHA-256 of the whole file, of each key
group's block and of the items' region, so that a restore checks exactly the
bytes it hands over.

What it may import: ``statekit._errors``, ``statekit.serialization``, ``statekit.snapshots``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._errors import CorruptSnapshotError
from ..serialization._keygroups import KeyGroupRange
from ..snapshots._digest import NOT_RECORDED, parse_sha256, sha256_of

__all__ = [
    "RAW_FORMAT",
    "RAW_MAGIC",
    "RawSnapshot",
    "decode_raw_file",
    "encode_raw_file",
    "even_split",
]

#: The first bytes of a raw state file.
RAW_MAGIC = b"STKRAW01"
#: The ``format`` of a raw state file's ``_metadata`` entry.
RAW_FORMAT = "statekit-raw-1"


@dataclass
class RawSnapshot:
    """One subtask's raw state: bytes per key group, and a list of byte items.

    Attributes:
        keyed: The bytes written for each key group (only key groups with bytes).
        items: The raw operator state items, in the order written.
    """

    keyed: dict[int, bytes] = field(default_factory=dict)
    items: list[bytes] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.keyed) or bool(self.items)

    @property
    def size(self) -> int:
        """The number of bytes of every block and item."""
        return sum(map(len, self.keyed.values())) + sum(map(len, self.items))


def encode_raw_file(snap: RawSnapshot) -> tuple[bytes, dict[str, Any]]:
    """The bytes of ``snap``'s raw state file, and its ``_metadata`` entry (without the handle)."""
    parts = [RAW_MAGIC]
    pos = len(RAW_MAGIC)
    key_groups: dict[str, list[int]] = {}
    block_sha256: dict[str, str] = {}
    for kg in sorted(snap.keyed):
        data = bytes(snap.keyed[kg])
        key_groups[str(kg)] = [pos, len(data)]
        block_sha256[str(kg)] = sha256_of(data)
        parts.append(data)
        pos += len(data)
    items_start = pos
    items: list[list[int]] = []
    for item in snap.items:
        items.append([pos, len(item)])
        parts.append(bytes(item))
        pos += len(item)
    data = b"".join(parts)
    entry: dict[str, Any] = {
        "format": RAW_FORMAT,
        "size": len(data),
        "key_groups": key_groups,
        "block_sha256": block_sha256,
        "keyed_size": items_start - len(RAW_MAGIC),
        "items": items,
        "items_sha256": sha256_of(data[items_start:]),
        "sha256": sha256_of(data),
    }
    return data, entry


def parse_raw_entry(
    entry: Any, key_group_range: KeyGroupRange, where: str
) -> tuple[dict[int, tuple[int, int, str]], list[tuple[int, int]], str, str, int]:
    """The parts a raw state entry names: ``(blocks, items, items_sha256, sha256, size)``.

    ``blocks`` maps each key group to ``(offset, length, sha256)``. Every
    key group must lie in ``key_group_range`` (the writing subtask's), every
    part inside the file, so that a damaged or crafted entry never hands a key
    group to two subtasks or reads past the file.

    Raises:
        CorruptSnapshotError: Naming ``where``, if the entry is malformed.
    """
    try:
        if not isinstance(entry, dict) or entry.get("format") != RAW_FORMAT:
            raise ValueError(f"format {entry.get('format') if isinstance(entry, dict) else entry!r}")
        size = entry["size"]
        sha = parse_sha256(entry.get("sha256"), "the raw state file")
        items_sha = parse_sha256(entry.get("items_sha256"), "the raw operator items")
        if sha is None or items_sha is None or not _is_int(size):
            raise ValueError("no digest or size recorded")
        digests = entry["block_sha256"]
        blocks: dict[int, tuple[int, int, str]] = {}
        for key, span in dict(entry["key_groups"]).items():
            kg = int(key)
            if kg not in key_group_range:
                raise ValueError(f"key group {kg} is outside the subtask's {key_group_range}")
            block_sha = parse_sha256(digests.get(key), f"the block of key group {kg}")
            if block_sha is None:
                raise ValueError(f"no digest for key group {kg}")
            blocks[kg] = (*_span(span, size), block_sha)
        items = [_span(span, size) for span in list(entry["items"])]
    except CorruptSnapshotError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CorruptSnapshotError(
            f"{where}: malformed raw state entry ({e}); the metadata is corrupt"
        ) from None
    return blocks, items, items_sha, sha, size


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _span(span: Any, size: int) -> tuple[int, int]:
    off, length = span
    if not (_is_int(off) and _is_int(length)) or off < len(RAW_MAGIC) or off + length > size:
        raise ValueError(f"part {span!r} lies outside the {size}-byte file")
    return off, length


def decode_raw_file(
    data: bytes,
    entry: Any,
    key_group_range: KeyGroupRange,
    *,
    key_groups: KeyGroupRange,
    item_slice: tuple[int, int],
    where: str,
) -> RawSnapshot:
    """The blocks of ``key_groups`` and items ``item_slice`` (start, end) of a raw state file, checked.

    Raises:
        CorruptSnapshotError: Naming ``where``, if the bytes are not the ones the
            entry records (the whole file, each block taken, the items), or the
            entry is malformed.
    """
    blocks, items, items_sha, sha, size = parse_raw_entry(entry, key_group_range, where)
    if len(data) != size or sha256_of(data) != sha or data[: len(RAW_MAGIC)] != RAW_MAGIC:
        raise CorruptSnapshotError(f"{where}: {NOT_RECORDED}")
    out = RawSnapshot()
    for kg, (off, length, block_sha) in sorted(blocks.items()):
        if kg not in key_groups:
            continue
        block = data[off : off + length]
        if sha256_of(block) != block_sha:
            raise CorruptSnapshotError(f"{where}: the raw block of key group {kg}: {NOT_RECORDED}")
        out.keyed[kg] = block
    if items:
        start = items[0][0]
        if sha256_of(data[start:]) != items_sha:
            raise CorruptSnapshotError(f"{where}: the raw operator items: {NOT_RECORDED}")
    lo, hi = item_slice
    out.items = [data[off : off + length] for off, length in items[lo:hi]]
    return out


def even_split(counts: list[int], parallelism: int, index: int) -> list[tuple[int, int, int]]:
    """Which old items new subtask ``index`` of ``parallelism`` gets: ``(old subtask, start, end)``.

    The old subtasks' items concatenated in subtask order and cut into
    contiguous chunks, the first ``total % parallelism`` one longer (as
    operator list state, Flink's even-split redistribution).
    """
    total = sum(counts)
    base, extra = divmod(total, parallelism)
    lo = index * base + min(index, extra)
    hi = lo + base + (1 if index < extra else 0)
    out: list[tuple[int, int, int]] = []
    pos = 0
    for old, n in enumerate(counts):
        s, e = max(lo, pos), min(hi, pos + n)
        if s < e:
            out.append((old, s - pos, e - pos))
        pos += n
    return out
