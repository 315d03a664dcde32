"""Raw state as a function sees it: the contexts of its two hooks, and the rule for undeclared hooks.

A :class:`~statekit.KeyedProcessFunction` that keeps a structure statekit
cannot describe with descriptors (a sketch, a trie, a native library's
buffer) may serialise it itself. At every checkpoint and savepoint the runner
calls its ``snapshot_raw_state(ctx)`` with a :class:`RawStateSnapshotContext`:
the function writes bytes per key group it owns
(``ctx.raw_keyed_output(kg).write(...)``) and adds raw operator items
(``ctx.add_raw_operator_item(b)``). When a subtask starts from a checkpoint,
the runner calls its ``restore_raw_state(ctx)`` before ``open`` with a
:class:`RawStateRestoreContext`: the bytes of exactly the key groups this
subtask owns now (whatever the parallelism that wrote them) and its even
split of the items.

A checkpoint holding raw state of an operator whose function declares no
``restore_raw_state`` is refused before anything is restored (see
:func:`statekit.checkpoints._restore_rules.check_raw_state_claimed`).
"""

from __future__ import annotations

import io
from collections.abc import Iterator

from ..serialization._keygroups import KeyGroupRange
from ..state._raw import RawSnapshot

__all__ = [
    "RawStateRestoreContext",
    "RawStateSnapshotContext",
]


class RawStateSnapshotContext:
    """What ``snapshot_raw_state`` gets: a writer per key group this subtask owns, and the item list.

    Example::

        def snapshot_raw_state(self, ctx):
            for kg, sketch in self.sketches.items():  # kept per key group
                ctx.raw_keyed_output(kg).write(sketch.to_bytes())
            ctx.add_raw_operator_item(self.dictionary.to_bytes())

    Attributes:
        key_groups: The key groups this subtask owns (each key's is
            ``ctx.runtime.key_group_of(key)`` in ``process``).
        subtask_index: This subtask's index.
        parallelism: The operator's parallelism.
    """

    def __init__(self, key_groups: KeyGroupRange, subtask_index: int, parallelism: int) -> None:
        self.key_groups = key_groups
        self.subtask_index = subtask_index
        self.parallelism = parallelism
        self._keyed: dict[int, io.BytesIO] = {}
        self._items: list[bytes] = []

    def raw_keyed_output(self, key_group: int) -> io.BytesIO:
        """The byte stream of ``key_group`` (the same one on every call); write its bytes into it.

        Raises:
            ValueError: If this subtask does not own ``key_group``: another
                subtask restores it, so its bytes here would be lost or doubled.
        """
        if isinstance(key_group, bool) or not isinstance(key_group, int) or key_group not in self.key_groups:
            raise ValueError(
                f"raw keyed state for key group {key_group!r}: subtask {self.subtask_index} of "
                f"{self.parallelism} owns key groups {self.key_groups}; write only those (each key's "
                "key group is ctx.runtime.key_group_of(key))"
            )
        out = self._keyed.get(key_group)
        if out is None:
            out = self._keyed[key_group] = io.BytesIO()
        return out

    def add_raw_operator_item(self, data: bytes | bytearray | memoryview) -> None:
        """Add one item of raw operator state (redistributed as an even split on restore)."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"a raw operator state item is bytes, not {type(data).__name__}")
        self._items.append(bytes(data))

    def snapshot(self) -> RawSnapshot:
        """What was written (key groups with no bytes left out)."""
        keyed = {kg: out.getvalue() for kg, out in self._keyed.items()}
        return RawSnapshot({kg: b for kg, b in keyed.items() if b}, list(self._items))


class RawStateRestoreContext:
    """What ``restore_raw_state`` gets: the raw bytes of this subtask's key groups, and its items.

    Example::

        def restore_raw_state(self, ctx):
            self.sketches = {kg: Sketch.from_bytes(b) for kg, b in ctx.raw_keyed_state.items()}
            self.items = ctx.raw_operator_items

    Attributes:
        key_groups: The key groups this subtask owns.
        raw_keyed_state: The bytes written for each of them (only key groups with bytes).
        raw_operator_items: This subtask's even split of every old subtask's items, in order.
        checkpoint_id: The checkpoint (or the savepoint's) id restored from.
    """

    def __init__(self, key_groups: KeyGroupRange, restored: RawSnapshot, checkpoint_id: int) -> None:
        self.key_groups = key_groups
        self.raw_keyed_state: dict[int, bytes] = restored.keyed
        self.raw_operator_items: list[bytes] = restored.items
        self.checkpoint_id = checkpoint_id

    def raw_keyed_inputs(self) -> Iterator[tuple[int, io.BytesIO]]:
        """Each key group with bytes, in order, a stream of its bytes (Flink: ``getRawKeyedStateInputs``)."""
        for kg in sorted(self.raw_keyed_state):
            yield kg, io.BytesIO(self.raw_keyed_state[kg])
