"""State descriptors and the user-facing state handles.

A descriptor names a state and declares its type; a keyed backend turns it into
a handle bound to the backend's current key. Semantics follow Flink where
sensible (see docs/semantics.md)::

    count = ctx.get_state(ValueStateDescriptor("count", int, default=0))
    count.update(count.value() + 1)
"""

from __future__ import annotations

import copy as _copy
import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from ..serialization._serializers import (
    DictSerializer,
    ListSerializer,
    NullableSerializer,
    TypeSerializer,
    serializer_for,
)

__all__ = [
    "VOID_NAMESPACE",
    "AggregateFunction",
    "AggregatingState",
    "AggregatingStateDescriptor",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "Migration",
    "ReducingState",
    "ReducingStateDescriptor",
    "State",
    "StateDescriptor",
    "StateKind",
    "StateTtlConfig",
    "TtlUpdateType",
    "TtlVisibility",
    "ValueState",
    "ValueStateDescriptor",
    "list_elements",
]

T = TypeVar("T")
IN = TypeVar("IN")
ACC = TypeVar("ACC")
OUT = TypeVar("OUT")
UK = TypeVar("UK")
UV = TypeVar("UV")
IN_contra = TypeVar("IN_contra", contravariant=True)
OUT_co = TypeVar("OUT_co", covariant=True)


class _VoidNamespace:
    """The namespace of state that is not scoped to a window."""

    _instance: _VoidNamespace | None = None

    def __new__(cls) -> _VoidNamespace:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "VOID_NAMESPACE"

    def __reduce__(self) -> str:
        return "VOID_NAMESPACE"


VOID_NAMESPACE: Any = _VoidNamespace()
"""The default namespace; state without windows lives here."""


class StateKind(enum.StrEnum):
    """The five kinds of keyed state."""

    VALUE = "value"
    LIST = "list"
    REDUCING = "reducing"
    AGGREGATING = "aggregating"
    MAP = "map"


class TtlUpdateType(enum.StrEnum):
    """When an entry's last-access timestamp is refreshed."""

    ON_CREATE_AND_WRITE = "on_create_and_write"
    ON_READ_AND_WRITE = "on_read_and_write"


class TtlVisibility(enum.StrEnum):
    """Whether expired entries not yet cleaned up may still be returned."""

    NEVER_RETURN_EXPIRED = "never_return_expired"
    RETURN_EXPIRED_IF_NOT_CLEANED_UP = "return_expired_if_not_cleaned_up"


@dataclass(frozen=True)
class StateTtlConfig:
    """Time-to-live of keyed state entries, in processing time.

    An entry is expired when ``last_access + ttl <= now`` (milliseconds of the
    backend's clock). Expired entries are always dropped when read; besides:

    - ``cleanup_full_snapshot``: full (canonical) snapshots leave them out;
    - ``cleanup_incremental_size``: on a state access, the heap backend also
      checks this many further entries (0 turns it off).

    Example::

        StateTtlConfig(timedelta(hours=1), cleanup_incremental_size=10)
    """

    ttl: timedelta
    update_type: TtlUpdateType = TtlUpdateType.ON_CREATE_AND_WRITE
    visibility: TtlVisibility = TtlVisibility.NEVER_RETURN_EXPIRED
    cleanup_full_snapshot: bool = False
    cleanup_incremental_size: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.ttl, timedelta):
            object.__setattr__(self, "ttl", timedelta(seconds=float(self.ttl)))
        if self.ttl_ms <= 0:
            raise ValueError(f"TTL must be positive, got {self.ttl}")
        object.__setattr__(self, "update_type", TtlUpdateType(self.update_type))
        object.__setattr__(self, "visibility", TtlVisibility(self.visibility))
        if self.cleanup_incremental_size < 0:
            raise ValueError("cleanup_incremental_size must be >= 0")

    @property
    def ttl_ms(self) -> int:
        """The TTL in whole milliseconds."""
        return int(self.ttl / timedelta(milliseconds=1))

    def to_json(self) -> dict[str, Any]:
        """The TTL settings as stored in snapshots."""
        return {
            "ttl_ms": self.ttl_ms,
            "update_type": self.update_type.value,
            "visibility": self.visibility.value,
        }


class AggregateFunction(ABC, Generic[IN, ACC, OUT]):
    """Aggregates added values into an accumulator, as Flink's ``AggregateFunction``.

    Example, an average::

        class Mean(AggregateFunction[float, tuple[float, int], float]):
            def create_accumulator(self):
                return (0.0, 0)
            def add(self, value, acc):
                return (acc[0] + value, acc[1] + 1)
            def get_result(self, acc):
                return acc[0] / acc[1]
            def merge(self, a, b):
                return (a[0] + b[0], a[1] + b[1])
    """

    @abstractmethod
    def create_accumulator(self) -> ACC:
        """A new, empty accumulator."""

    @abstractmethod
    def add(self, value: IN, accumulator: ACC) -> ACC:
        """``accumulator`` with ``value`` added (may update it in place and return it)."""

    @abstractmethod
    def get_result(self, accumulator: ACC) -> OUT:
        """The result of an accumulator."""

    @abstractmethod
    def merge(self, a: ACC, b: ACC) -> ACC:
        """The accumulator of both ``a`` and ``b`` (used when namespaces merge)."""


@dataclass(frozen=True)
class Migration:
    """How values written under an older schema of a state become values of its declared type.

    Declared on the state's descriptor, it is applied when a restore finds the
    state written under that schema: to every stored value of the state on
    every backend, before the state is used (``docs/state.md``, "Migrations
    you declare"). ``function`` gets one old value and returns the new one:
    the value of value, reducing and aggregating state (the accumulator), each
    element of a list, each value of a map (None included; keys stay). A
    returned None removes the entry (value state) or the element (list
    state); a map stores None. Old values come as ``from_type`` declares them
    or, with ``from_version``, as their stored schema reads without its
    classes: each dataclass a ``dict`` of its fields. Example::

        ValueStateDescriptor("visits", Visit, version=3, migrations=[
            Migration(lambda n: Visit(count=n, first_seen=None), from_version=1),  # v1 stored an int
            Migration(lambda old: Visit(old["n"], old["first"]), from_version=2),
        ])

    Attributes:
        function: The old value to the new one.
        from_version: The schema version (``version=`` of the old descriptor) it applies to.
        from_type: Or the type the old descriptor declared (its bytes must be
            the stored ones; a dataclass may have another name).
    """

    function: Callable[[Any], Any]
    from_version: int | None = None
    from_type: Any = None

    def __post_init__(self) -> None:
        if not callable(self.function):
            raise TypeError(f"Migration.function must be callable, got {self.function!r}")
        if (self.from_version is None) == (self.from_type is None):
            raise ValueError(
                "a Migration names the schema it applies to: from_version= or from_type=, one of them"
            )
        if self.from_version is not None and (
            not isinstance(self.from_version, int)
            or isinstance(self.from_version, bool)
            or self.from_version < 1
        ):
            raise ValueError(f"Migration.from_version must be an int >= 1, got {self.from_version!r}")

    def source_serializer(self) -> TypeSerializer | None:
        """The serializer of ``from_type`` (None with ``from_version``)."""
        return None if self.from_type is None else serializer_for(self.from_type)


class StateDescriptor(ABC):
    """Names a keyed state and declares how its values are stored.

    Two descriptors of one name must declare the same kind and serializers.
    ``version`` numbers the state's schema (1 unless declared; snapshots record
    it) and ``migrations`` turn values of older schemas into the declared type
    on restore (:class:`Migration`).
    """

    kind: StateKind

    def __init__(
        self,
        name: str,
        serializer: TypeSerializer,
        ttl: StateTtlConfig | None = None,
        *,
        version: int = 1,
        migrations: Sequence[Migration] = (),
    ) -> None:
        if not name or not isinstance(name, str):
            raise ValueError("a state needs a non-empty str name")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(f"state {name!r}: version must be an int >= 1, got {version!r}")
        migs = tuple(migrations)
        for m in migs:
            if not isinstance(m, Migration):
                raise TypeError(f"state {name!r}: migrations must be Migration objects, got {m!r}")
            if m.from_version is not None and m.from_version >= version:
                raise ValueError(
                    f"state {name!r} is declared as version {version}; a migration from version "
                    f"{m.from_version} must come from an older one"
                )
        froms = [m.from_version for m in migs if m.from_version is not None]
        if len(froms) != len(set(froms)):
            raise ValueError(f"state {name!r} declares two migrations from one version: {sorted(froms)}")
        self.name = name
        self.serializer = serializer
        """What one (key, namespace) entry stores: the value, list or dict."""
        self.ttl = ttl
        self.version = version
        self.migrations = migs

    def default_value(self) -> Any:
        """The value read when the state is absent (None unless a ValueState default)."""
        return None

    def meta(self) -> dict[str, Any]:
        """The descriptor as stored in snapshots (kind, serializers, TTL, schema version when not 1)."""
        m: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind.value,
            "serializer": self.serializer.config(),
            "ttl": self.ttl.to_json() if self.ttl else None,
        }
        if self.version != 1:
            m["schema_version"] = self.version
        return m

    def __repr__(self) -> str:
        v = f", version={self.version}" if self.version != 1 else ""
        return f"{type(self).__name__}({self.name!r}, {self.serializer.describe()}{v})"


def _ser(tp: Any, serializer: TypeSerializer | None) -> TypeSerializer:
    if serializer is not None:
        return serializer
    if tp is None:
        raise TypeError("declare the state's type (e.g. int) or pass serializer=")
    return serializer_for(tp)


class ValueStateDescriptor(StateDescriptor, Generic[T]):
    """A single value per key and namespace.

    ``default`` is returned (as a fresh copy) when the state is absent.
    """

    kind = StateKind.VALUE

    def __init__(
        self,
        name: str,
        type: Any = None,  # noqa: A002 - mirrors the user's mental model
        *,
        default: T | None = None,
        serializer: TypeSerializer | None = None,
        ttl: StateTtlConfig | None = None,
        version: int = 1,
        migrations: Sequence[Migration] = (),
    ) -> None:
        super().__init__(name, _ser(type, serializer), ttl, version=version, migrations=migrations)
        self.default = default

    def default_value(self) -> Any:
        d = self.default
        return d if d is None or self.serializer.immutable else _copy.deepcopy(d)


def list_elements(values: Iterable[Any], what: str) -> list[Any]:
    """``values`` as a list, checked for None, which list state never holds.

    Raises:
        ValueError: Naming ``what`` (e.g. ``"ListState.add_all"``), if an element is None.
    """
    out = list(values)
    if any(v is None for v in out):
        raise ValueError(f"{what}: list state elements cannot be None")
    return out


class ListStateDescriptor(StateDescriptor, Generic[T]):
    """A list of elements per key and namespace."""

    kind = StateKind.LIST

    def __init__(
        self,
        name: str,
        element_type: Any = None,
        *,
        serializer: TypeSerializer | None = None,
        ttl: StateTtlConfig | None = None,
        version: int = 1,
        migrations: Sequence[Migration] = (),
    ) -> None:
        self.element_serializer = _ser(element_type, serializer)
        super().__init__(
            name, ListSerializer(self.element_serializer), ttl, version=version, migrations=migrations
        )


class ReducingStateDescriptor(StateDescriptor, Generic[T]):
    """One value per key and namespace, combined from added values by ``reduce_function``."""

    kind = StateKind.REDUCING

    def __init__(
        self,
        name: str,
        reduce_function: Callable[[T, T], T],
        type: Any = None,  # noqa: A002
        *,
        serializer: TypeSerializer | None = None,
        ttl: StateTtlConfig | None = None,
        version: int = 1,
        migrations: Sequence[Migration] = (),
    ) -> None:
        super().__init__(name, _ser(type, serializer), ttl, version=version, migrations=migrations)
        self.reduce_function = reduce_function


class AggregatingStateDescriptor(StateDescriptor, Generic[IN, ACC, OUT]):
    """An accumulator per key and namespace, fed and read by an :class:`AggregateFunction`."""

    kind = StateKind.AGGREGATING

    def __init__(
        self,
        name: str,
        aggregate_function: AggregateFunction[IN, ACC, OUT],
        accumulator_type: Any = None,
        *,
        serializer: TypeSerializer | None = None,
        ttl: StateTtlConfig | None = None,
        version: int = 1,
        migrations: Sequence[Migration] = (),
    ) -> None:
        super().__init__(
            name, _ser(accumulator_type, serializer), ttl, version=version, migrations=migrations
        )
        self.aggregate_function = aggregate_function


class MapStateDescriptor(StateDescriptor, Generic[UK, UV]):
    """A map of user keys to values per key and namespace; values may be None."""

    kind = StateKind.MAP

    def __init__(
        self,
        name: str,
        key_type: Any = None,
        value_type: Any = None,
        *,
        key_serializer: TypeSerializer | None = None,
        value_serializer: TypeSerializer | None = None,
        ttl: StateTtlConfig | None = None,
        version: int = 1,
        migrations: Sequence[Migration] = (),
    ) -> None:
        self.user_key_serializer = _ser(key_type, key_serializer)
        vs = _ser(value_type, value_serializer)
        self.user_value_serializer = vs if isinstance(vs, NullableSerializer) else NullableSerializer(vs)
        super().__init__(
            name,
            DictSerializer(self.user_key_serializer, self.user_value_serializer),
            ttl,
            version=version,
            migrations=migrations,
        )


@runtime_checkable
class State(Protocol):
    """What every keyed state handle can do."""

    def clear(self) -> None:
        """Remove the value of the current key and current namespace only."""

    def set_current_namespace(self, namespace: Any) -> None:
        """Scope further calls to ``namespace`` (e.g. a window); default VOID_NAMESPACE."""


@runtime_checkable
class ValueState(State, Protocol[T]):
    """A single value per key."""

    def value(self) -> T | None:
        """The value, or a fresh copy of the descriptor's default when absent."""

    def update(self, value: T | None) -> None:
        """Replace the value; ``update(None)`` is ``clear()``."""


class _Mergeable(State, Protocol):
    def merge_namespaces(self, target: Any, sources: Sequence[Any]) -> None:
        """Merge the state of ``sources`` into ``target``; the sources are cleared."""


@runtime_checkable
class ListState(_Mergeable, Protocol[T]):
    """A list per key. ``None`` elements are refused with ValueError."""

    def get(self) -> list[T]:
        """The elements (an empty list when absent)."""

    def add(self, value: T) -> None:
        """Append one element."""

    def add_all(self, values: Iterable[T]) -> None:
        """Append elements; an empty iterable is a no-op."""

    def update(self, values: Iterable[T]) -> None:
        """Replace all elements; an empty iterable clears."""


@runtime_checkable
class ReducingState(_Mergeable, Protocol[T]):
    """A value per key, reduced from all added values."""

    def get(self) -> T | None:
        """The reduced value, or None when empty."""

    def add(self, value: T) -> None:
        """Reduce ``value`` into the state."""


@runtime_checkable
class AggregatingState(_Mergeable, Protocol[IN_contra, OUT_co]):
    """An aggregate per key, of all added values."""

    def get(self) -> OUT_co | None:
        """The aggregate's result, or None when empty."""

    def add(self, value: IN_contra) -> None:
        """Add ``value`` to the accumulator (creating it first when absent)."""


@runtime_checkable
class MapState(State, Protocol[UK, UV]):
    """A map per key. Removing the last entry removes the state."""

    def get(self, key: UK) -> UV | None:
        """The value of ``key``, or None when absent."""

    def put(self, key: UK, value: UV | None) -> None:
        """Set the value of ``key`` (None is a value)."""

    def put_all(self, entries: dict[UK, UV | None]) -> None:
        """Set several entries."""

    def remove(self, key: UK) -> None:
        """Remove ``key`` if present."""

    def contains(self, key: UK) -> bool:
        """Whether ``key`` is present."""

    def items(self) -> Iterator[tuple[UK, UV | None]]:
        """The entries."""

    def keys(self) -> Iterator[UK]:
        """The user keys."""

    def values(self) -> Iterator[UV | None]:
        """The values."""

    def is_empty(self) -> bool:
        """Whether the map has no entry."""
