"""Value, list and map handles over one stored value per (key, namespace).

The simplest way to build a backend on a key-value engine is to store each
state's whole value under its (key group, key, namespace): an int for a
ValueState, the Python list for a ListState, the dict for a MapState, each
through the state's serializer. These bases carry the semantics on top of
that (defaults, no ``None`` elements, an empty list or map is no entry, copies
on read, the namespace checks); a backend implements only ``_get`` and
``_put`` of the current slot, and ``KeyedBackendBase`` adds the current key,
TTL, reducing and aggregating state and snapshots.

Engines that can store list elements or map entries one by one (RocksDB's
merge operator, prefix scans) do better with handles of their own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from .._errors import StateAccessError
from ._keyed import merge_list_namespaces
from ._registered import RegisteredState
from ._state import VOID_NAMESPACE, list_elements

__all__ = ["SlotListState", "SlotMapState", "SlotState", "SlotValueState"]


class SlotState(ABC):
    """The current namespace and the stored value of the current key and namespace.

    Subclasses implement :meth:`_get` and :meth:`_put`; they read the current
    key from their backend and the namespace from :attr:`current_namespace`
    (or keep what they derive from it up to date in :meth:`_namespace_changed`).
    """

    def __init__(self, reg: RegisteredState) -> None:
        self._reg = reg
        self._ns: Any = VOID_NAMESPACE

    @property
    def current_namespace(self) -> Any:
        """The namespace further calls use (core's merging and TTL layers read it)."""
        return self._ns

    def set_current_namespace(self, namespace: Any) -> None:
        """Scopes further calls to ``namespace``.

        Raises:
            StateAccessError: If the state was declared without a namespace serializer.
        """
        if namespace is not VOID_NAMESPACE and self._reg.namespace_serializer is None:
            raise StateAccessError(
                f"state {self._reg.name!r} has no namespace serializer; pass namespace_serializer= "
                "to get_state to use namespaces"
            )
        self._ns = namespace
        self._namespace_changed(namespace)

    def _namespace_changed(self, namespace: Any) -> None:  # noqa: B027 - an optional hook
        """Called after the namespace changed; e.g. to cache its serialized bytes."""

    @abstractmethod
    def _get(self) -> Any:
        """The stored value of the current key and namespace, deserialized; None if there is none.

        Raises:
            StateAccessError: Without a current key.
        """

    @abstractmethod
    def _put(self, value: Any) -> None:
        """Stores ``value`` for the current key and namespace; ``None`` removes the entry."""

    def clear(self) -> None:
        """Removes the entry of the current key and namespace."""
        self._put(None)


class SlotValueState(SlotState):
    """A ValueState: the value, or the descriptor's default when there is none."""

    def value(self) -> Any:
        v = self._get()
        return self._reg.default_value() if v is None else v

    def update(self, value: Any) -> None:
        self._put(value)


class SlotListState(SlotState):
    """A ListState stored as one list; the empty list is no entry."""

    def get(self) -> list[Any]:
        return list(self._get() or [])

    def add(self, value: Any) -> None:
        if value is None:
            raise ValueError("ListState.add(None): list state elements cannot be None")
        self._put([*(self._get() or []), value])

    def add_all(self, values: Iterable[Any]) -> None:
        vals = list_elements(values, "ListState.add_all")
        if vals:
            self._put([*(self._get() or []), *vals])

    def update(self, values: Iterable[Any]) -> None:
        self._put(list_elements(values, "ListState.update") or None)

    def merge_namespaces(self, target: Any, sources: Sequence[Any]) -> None:
        merge_list_namespaces(self, target, sources)


class SlotMapState(SlotState):
    """A MapState stored as one dict; removing its last entry removes the state."""

    def _map(self) -> dict[Any, Any]:
        return dict(self._get() or {})

    def get(self, key: Any) -> Any:
        return self._map().get(key)

    def contains(self, key: Any) -> bool:
        return key in self._map()

    def put(self, key: Any, value: Any) -> None:
        m = self._map()
        m[key] = value
        self._put(m)

    def put_all(self, entries: Mapping[Any, Any]) -> None:
        if entries:
            m = self._map()
            m.update(entries)
            self._put(m)

    def remove(self, key: Any) -> None:
        m = self._map()
        if key in m:
            del m[key]
            self._put(m or None)

    def items(self) -> Iterator[tuple[Any, Any]]:
        return iter(list(self._map().items()))

    def keys(self) -> Iterator[Any]:
        return iter(list(self._map()))

    def values(self) -> Iterator[Any]:
        return iter(list(self._map().values()))

    def is_empty(self) -> bool:
        return not self._map()
