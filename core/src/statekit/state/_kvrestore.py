"""What an ordered engine's native restore step needs of the instance it fills: declared once.

An engine keeps its restore (download, clip, load) in a module below its
backend class, naming only what it uses of the backend; what every ordered
engine's restore uses is :class:`KVRestoreTarget`, which the engine's own
protocol extends with its engine's calls::

    class RestoreTarget(KVRestoreTarget, Protocol):
        @property
        def db(self) -> Any: ...
"""

from __future__ import annotations

from typing import Protocol

from ..serialization._keygroups import KeyGroupRange
from ._kvcolumn import KVColumn
from ._kvlayout import KeyLayout

__all__ = ["KVRestoreTarget"]


class KVRestoreTarget(Protocol):
    """The (empty) instance a native restore fills: an :class:`OrderedKVBackendBase` with a directory."""

    @property
    def key_group_range(self) -> KeyGroupRange:
        """The key groups the instance owns: a restore keeps exactly these."""
        ...

    @property
    def layout(self) -> KeyLayout:
        """The composite key layout (``layout.group_range(start, end)``: the owned keys' bounds)."""
        ...

    @property
    def instance_dir(self) -> str:
        """The instance's local directory: downloads are staged inside it."""
        ...

    def kv_column(self, name: str, create: bool = True) -> KVColumn | None:
        """The column of state ``name`` (the ordered base's)."""
        ...

    def kv_load(self, name: str, items: list[tuple[bytes, bytes]]) -> None:
        """Bulk-load sorted, distinct entries into state ``name`` (the engine's)."""
        ...
