"""A state as a keyed backend stores it: its kind, serializers, TTL and schema history.

:class:`RegisteredState` is made from a descriptor when a job declares a state,
or from a snapshot's entry when a state is restored natively before the job
declares it (its serializers rebuilt from their configs where they can be).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from .._errors import (
    SerializationError,
    SnapshotError,
)
from ..serialization._evolution import layout_serializer
from ..serialization._serializers import SerializerConfig, TypeSerializer, serializer_from_config
from ._migration import (
    LINEAGE,
    StateMigrationPlan,
    lineage_of,
    plan_state_migration,
)
from ._state import (
    StateDescriptor,
    StateKind,
    StateTtlConfig,
    TtlUpdateType,
    TtlVisibility,
)
from ._ttl import ttl_serializer

__all__ = ["RegisteredState", "StateEntries", "full_snapshot_ttl"]

StateEntries = tuple[list[Any], list[Any], list[Any]]
"""Keys, namespaces and stored values of one state in one key group."""

_STORAGE_KIND = {
    StateKind.VALUE: StateKind.VALUE,
    StateKind.REDUCING: StateKind.VALUE,
    StateKind.AGGREGATING: StateKind.VALUE,
    StateKind.LIST: StateKind.LIST,
    StateKind.MAP: StateKind.MAP,
}


@dataclass(frozen=True)
class RegisteredState:
    """A state as a backend stores it.

    ``storage_kind`` is value, list or map (reducing and aggregating state are
    stored as values); ``serializer`` is what one (key, namespace) entry
    stores, TTL timestamps included; ``default`` is None for TTL states, whose
    default is applied by the TTL layer. ``lineage`` is the state's schema
    history: the schemas its entries were migrated from, oldest first.
    """

    name: str
    kind: StateKind
    storage_kind: StateKind
    serializer: TypeSerializer
    namespace_serializer: TypeSerializer | None
    ttl: StateTtlConfig | None
    descriptor: StateDescriptor
    lineage: tuple[dict[str, Any], ...] = field(default=(), kw_only=True)

    @classmethod
    def of(cls, d: StateDescriptor, namespace_serializer: TypeSerializer | None) -> RegisteredState:
        """Registration of descriptor ``d``."""
        skind = _STORAGE_KIND[d.kind]
        ser = d.serializer if d.ttl is None else ttl_serializer(skind, d.serializer)
        return cls(d.name, d.kind, skind, ser, namespace_serializer, d.ttl, d)

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> RegisteredState:
        """A state known only from a snapshot's entry: restored natively and not declared yet.

        Its serializers are rebuilt from their configs where they describe
        themselves; a custom serializer becomes a placeholder that raises a
        clear error if its entries must be decoded before the state is declared.
        """
        name = str(meta["name"])
        kind = StateKind(meta["kind"])
        ttl_cfg = meta.get("ttl")
        ttl = None
        if ttl_cfg:
            ttl = StateTtlConfig(
                timedelta(milliseconds=int(ttl_cfg["ttl_ms"])),
                TtlUpdateType(ttl_cfg["update_type"]),
                TtlVisibility(ttl_cfg["visibility"]),
            )
        ns_cfg = meta.get("namespace_serializer")
        return _RestoredState(
            name,
            kind,
            _STORAGE_KIND[kind],
            _rebuild(meta["stored_serializer"], name),
            None if ns_cfg is None else _rebuild(ns_cfg, name),
            ttl,
            None,  # type: ignore[arg-type]
            dict(meta),
        )

    def default_value(self) -> Any:
        """The value a plain value handle returns when absent."""
        return self.descriptor.default_value() if self.ttl is None and self.kind is StateKind.VALUE else None

    def meta(self) -> dict[str, Any]:
        """The state's entry in snapshot headers (its schema history under ``lineage``, if it has one)."""
        m = self.descriptor.meta()
        m["stored_serializer"] = self.serializer.config()
        m["namespace_serializer"] = self.namespace_serializer.config() if self.namespace_serializer else None
        if self.lineage:
            m[LINEAGE] = [dict(x) for x in self.lineage]
        return m

    def with_lineage(self, lineage: tuple[dict[str, Any], ...]) -> RegisteredState:
        """The same state with schema history ``lineage``."""
        return self if lineage == self.lineage else replace(self, lineage=lineage)

    def plan_from(
        self, meta: dict[str, Any], origin: dict[str, Any] | None = None
    ) -> StateMigrationPlan | None:
        """How entries written under snapshot entry ``meta`` become this state's; None if they already are.

        Raises:
            StateMigrationError: If they cannot (:func:`~statekit.state._migration.plan_state_migration`).
        """
        return plan_state_migration(
            self.name, self.kind, self.descriptor, self.namespace_serializer, meta, origin
        )

    def check_restorable(self, meta: dict[str, Any]) -> None:
        """Raise :class:`StateMigrationError` unless ``meta``'s entries can be read or migrated."""
        self.plan_from(meta)

    def restored_as(self, meta: dict[str, Any], plan: StateMigrationPlan | None) -> RegisteredState:
        """This state after restoring entries of ``meta``: with its history, and ``plan``'s step if any."""
        return self.with_lineage(lineage_of(meta) if plan is None else plan.lineage)


@dataclass(frozen=True)
class _RestoredState(RegisteredState):
    """A natively restored state that the job has not declared (yet): its snapshot entry is its meta."""

    stored_meta: dict[str, Any]

    def default_value(self) -> Any:
        return None

    def meta(self) -> dict[str, Any]:
        return dict(self.stored_meta)


class _OpaqueSerializer(TypeSerializer):
    """Stands for a custom serializer of an undeclared restored state until the job declares it."""

    def __init__(self, cfg: SerializerConfig, state: str) -> None:
        self._cfg = cfg
        self._state = state

    def _refuse(self) -> SnapshotError:
        return SnapshotError(
            f"state {self._state!r} was restored from a native snapshot and uses a serializer "
            f"({self.describe()}) that cannot be rebuilt from its config; declare the state (get_state) "
            "before taking a canonical snapshot or savepoint"
        )

    def serialize(self, value: Any) -> bytes:
        raise self._refuse()

    def deserialize(self, data: bytes | memoryview) -> Any:
        raise self._refuse()

    def config(self) -> SerializerConfig:
        return self._cfg


def _rebuild(cfg: SerializerConfig, state: str) -> TypeSerializer:
    try:
        return serializer_from_config(cfg)
    except (SerializationError, ImportError, AttributeError, KeyError, TypeError, ValueError):
        pass
    try:
        # A dataclass that changed or is gone: its bytes still read (as tuples) and write back unchanged.
        return layout_serializer(cfg)
    except (SerializationError, KeyError, TypeError, ValueError):
        return _OpaqueSerializer(cfg, state)


def full_snapshot_ttl(
    names: Iterable[str], declared: Mapping[str, RegisteredState], restored: Mapping[str, int]
) -> dict[str, int]:
    """TTL (ms) of each of ``names`` whose expired entries full snapshots leave out.

    A declared state says so itself; an undeclared one as the snapshot it was
    restored from recorded (``restored``). Native snapshots record the result,
    with the time they were taken, so that a restore drops what a canonical
    snapshot taken then would have left out.
    """
    out = {}
    for name in names:
        reg = declared.get(name)
        if reg is None:
            if name in restored:
                out[name] = restored[name]
        elif reg.ttl is not None and reg.ttl.cleanup_full_snapshot:
            out[name] = reg.ttl.ttl_ms
    return out
