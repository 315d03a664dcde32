"""What a checkpoint or savepoint holds, as :class:`~statekit.state_processor.SavepointReader` lists it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..serialization._evolution import describe_schema
from ..serialization._serializers import describe_serializer
from ..state._migration import LINEAGE, SCHEMA_VERSION, SchemaStep, schema_history

__all__ = ["OperatorInfo", "StateInfo"]


@dataclass(frozen=True)
class StateInfo:
    """One keyed state of an operator, as the snapshot declares it."""

    operator: str
    name: str
    kind: str
    """``value``, ``list``, ``reducing``, ``aggregating`` or ``map``."""
    serializer: dict[str, Any]
    """The descriptor's serializer config (lists: ``list<element>``, maps: ``dict<key, optional<value>>``)."""
    key_serializer: dict[str, Any]
    namespace_serializer: dict[str, Any] | None
    ttl: dict[str, Any] | None
    """``{"ttl_ms", "update_type", "visibility"}``, or None."""
    bytes: int | None
    """Bytes of its serialized keys, namespaces and values: in a canonical snapshot, its sections';
    in the heap's native one (a base and deltas), those in every file a restore reads. None: the
    snapshot does not record them (RocksDB's and LMDB's native ones)."""
    timer_domain: str | None = None
    """For the internal state holding timers: its time domain."""
    schema_version: int = 1
    """The schema version the job declared (``version=`` of the descriptor)."""
    lineage: tuple[dict[str, Any], ...] = ()
    """The former schemas, oldest first, as the snapshot records them (see :attr:`history`)."""
    entries: int | None = None
    """Its (key, namespace) entries (a list's or map's whole list or map is one), summed over the
    subtasks, as the metrics' ``state.<name>.entries``. None: the snapshot does not record them
    (RocksDB's and LMDB's native ones, a canonical one written before per-state counts)."""

    @property
    def type_name(self) -> str:
        """The serializer, e.g. ``int`` or ``dict<str,optional<int>>``."""
        return describe_serializer(self.serializer)

    @property
    def schema(self) -> str:
        """The type in full, dataclass fields included: ``Visit{count: int, first_seen: optional<int>}``."""
        return describe_schema(self.serializer)

    @property
    def history(self) -> list[SchemaStep]:
        """Every schema the state had, oldest first, the current one last, with how each was migrated."""
        return schema_history(
            {
                "serializer": self.serializer,
                "ttl": self.ttl,
                SCHEMA_VERSION: self.schema_version,
                LINEAGE: list(self.lineage),
            }
        )


@dataclass(frozen=True)
class OperatorInfo:
    """One operator of a checkpoint or savepoint."""

    id: str
    parallelism: int
    entries: int
    """Keyed (key, namespace) entries, timers included."""
    bytes: int
    formats: tuple[str, ...]
    backends: tuple[str, ...]
    states: tuple[StateInfo, ...]
    operator_states: tuple[str, ...] = field(default=())
