"""Key-group deltas: what an ordered engine's native checkpoint writes when little changed.

The key-group files of :mod:`._kvnative` make a checkpoint upload only the key
groups that changed, but a 1 % change spread at random touches nearly every key
group. So the ordered base records which composite keys every write of its
buffer touches (``kv_flush``: one set per state, no engine read), and a native
checkpoint writes **one delta file per subtask**: per changed key group, the
changed keys' values at the checkpoint, or their removal, read from the frozen
view. The key groups' whole files stay where they are and are referenced.

A handle's chain (its meta) is:

- ``key_groups``: each key group's whole file (the base), by name;
- ``deltas``: the delta files after them, oldest first
  (``{"file", "checkpoint_id", "since", "size"}``): a delta of checkpoint ``c``
  holds every key changed since the confirmed checkpoint ``since`` it was
  written against, as it is at ``c``;
- ``kg_since``: key groups whose whole file was rewritten while the chain had
  deltas, and the checkpoint that rewrote them: a delta of a checkpoint at or
  before it does not apply to that key group;
- ``kg_delta_bytes``: each key group's delta bytes since its whole file, what
  decides when it is rewritten.

When it is written whole again is the heap's policy (``max-deltas``,
``max-delta-ratio``): a key group's whole file is rewritten when its delta
bytes would pass ``max-delta-ratio`` of its file, and the checkpoint writes
every key group's file again (reusing unchanged ones by digest) when the chain
has ``max-deltas`` deltas or its deltas' bytes pass that share of its bases': a
restore replays at most ``max-deltas`` deltas.

A delta file is::

    b"statekit-kgd\\x01"                                       magic and version
    per key group, ascending: varint(kg) varint(len(block)) block
    block: per state, by name: varint(len(name)) name varint(n)
        n x ( varint(len(key)) key varint(0 | len(value) + 1) value )   0: removed

Writes that bypass the buffer (bulk loads of a restore) start a new chain; a
restore claims its chain only when it restores one snapshot of the same key
groups, as the heap's does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .._errors import CorruptSnapshotError
from ..plugins._config import ConfigOption
from ._kvlayout import decode_varint, encode_varint

__all__ = [
    "DELTA_FILE_MAGIC",
    "KEY_GROUP_NATIVE_OPTIONS",
    "Ops",
    "apply_ops",
    "decode_delta_file",
    "encode_delta_block",
    "encode_delta_file",
]

#: The first bytes of every key-group delta file (the format's version is the last).
DELTA_FILE_MAGIC = b"statekit-kgd\x01"

#: The options of :class:`~statekit.ordered_kv.KeyGroupNativeSnapshots` (the heap's, same names):
#: declare them in your plugin's options beside ``ORDERED_KV_OPTIONS``.
KEY_GROUP_NATIVE_OPTIONS: tuple[ConfigOption, ...] = (
    ConfigOption(
        "max-deltas", int, 10,
        "Native checkpoints that write only the keys changed since the last one (one delta file) "
        "before every key group's file is written again; a restore replays at most this many deltas. "
        "0: no deltas (every changed key group's whole file).", minimum=1, off=0,
    ),
    ConfigOption(
        "max-delta-ratio", float, 0.5,
        "A key group's whole file is written again once its deltas pass this share of its bytes, "
        "and every key group's once the chain's deltas pass this share of the whole files' bytes.",
        minimum=0.0,
    ),
)  # fmt: skip

#: One state's changes in one key group: (composite key, value or None for removed), key order.
Ops = list[tuple[bytes, "bytes | None"]]


def encode_delta_block(by_state: Mapping[str, Ops]) -> bytes:
    """One key group's block of a delta file (states by name, keys in order)."""
    out = bytearray()
    for name in sorted(by_state):
        ops = by_state[name]
        if not ops:
            continue
        raw = name.encode()
        out += encode_varint(len(raw))
        out += raw
        out += encode_varint(len(ops))
        for k, v in ops:
            out += encode_varint(len(k))
            out += k
            if v is None:
                out += b"\x00"
            else:
                out += encode_varint(len(v) + 1)
                out += v
    return bytes(out)


def encode_delta_file(blocks: Mapping[int, bytes]) -> bytes:
    """A delta file of the key groups' blocks (see the module docstring)."""
    out = bytearray(DELTA_FILE_MAGIC)
    for kg in sorted(blocks):
        block = blocks[kg]
        out += encode_varint(kg)
        out += encode_varint(len(block))
        out += block
    return bytes(out)


def decode_delta_file(
    data: bytes, where: str, wanted: Iterable[int], prefix_of: Any
) -> dict[int, dict[str, Ops]]:
    """The blocks of the ``wanted`` key groups of one delta file, each key checked against its group.

    ``prefix_of(kg)`` is the first bytes of every composite key of ``kg``.

    Raises:
        CorruptSnapshotError: Naming ``where``, if the bytes are not such a file.
    """
    if not data.startswith(DELTA_FILE_MAGIC):
        raise CorruptSnapshotError(f"{where}: not a key-group delta file of statekit (magic {data[:13]!r})")
    want = set(wanted)
    view = memoryview(data)
    pos = len(DELTA_FILE_MAGIC)
    out: dict[int, dict[str, Ops]] = {}
    last = -1
    try:
        while pos < len(data):
            kg, pos = decode_varint(view, pos)
            size, pos = decode_varint(view, pos)
            end = pos + size
            if kg <= last or end > len(data):
                raise ValueError(f"the block of key group {kg} is out of order or cut short")
            last = kg
            if kg in want:
                out[kg] = _decode_block(view, pos, end, prefix_of(kg))
            pos = end
    except (ValueError, IndexError, UnicodeDecodeError) as e:
        raise CorruptSnapshotError(f"{where}: malformed key-group delta file: {e}") from None
    return out


def _decode_block(view: memoryview, pos: int, end: int, prefix: bytes) -> dict[str, Ops]:
    out: dict[str, Ops] = {}
    while pos < end:
        size, pos = decode_varint(view, pos)
        name = bytes(view[pos : pos + size]).decode()
        pos += size
        count, pos = decode_varint(view, pos)
        ops: Ops = []
        for _ in range(count):
            size, pos = decode_varint(view, pos)
            k = bytes(view[pos : pos + size])
            pos += size
            size, pos = decode_varint(view, pos)
            if size:
                v: bytes | None = bytes(view[pos : pos + size - 1])
                pos += size - 1
            else:
                v = None
            if pos > end:
                raise ValueError(f"an entry of state {name!r} is cut short")
            if not k.startswith(prefix):
                raise ValueError(f"an entry of state {name!r} belongs to another key group")
            ops.append((k, v))
        out[name] = ops
    if pos != end:
        raise ValueError("a block ends inside an entry")
    return out


def apply_ops(items: list[tuple[bytes, bytes]], changes: Sequence[Ops]) -> list[tuple[bytes, bytes]]:
    """A key group's entries of one state (key order) with deltas' changes applied in order."""
    if not changes:
        return items
    merged = dict(items)
    for ops in changes:
        for k, v in ops:
            if v is None:
                merged.pop(k, None)
            else:
                merged[k] = v
    return sorted(merged.items())
