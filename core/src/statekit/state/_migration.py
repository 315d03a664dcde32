"""What a restore does with a state whose declaration changed: one plan, decided before anything is touched.

A restored state arrives with its snapshot entry (``RegisteredState.meta()``):
kind, serializers, TTL, schema version and schema history. When the job
declares it, :func:`plan_state_migration` compares that entry with the
declaration and returns None (the same schema: nothing to do), a
:class:`StateMigrationPlan`, or raises :class:`~statekit.errors.StateMigrationError`
naming both schemas. Every backend path calls it: canonical restores (in
``KeyedBackendBase``, which decodes old sections and converts them before it
loads anything), and natively restored states (rewritten in place by the
backend, ``OrderedKVBackendBase`` for the ordered engines).

The plan works on *units*, what one stored entry is made of: the value of a
value, reducing or aggregating state, each element of a list, each value of a
map (``docs/writing-a-backend.md``, the shared layout). A unit's schema
changes by the rules of :mod:`statekit.serialization._evolution`, or by a
:class:`~statekit.Migration` the descriptor declares; TTL may be turned on
(units are stamped with the time of the migration), off (timestamps are
dropped) or changed (the stored last-access times stay, the new TTL applies
to them). Every change is recorded in the state's schema history
(``lineage`` of its snapshot entry), with the checkpoint it was restored from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import IncompatibleSerializerError, SerializationError, StateMigrationError
from ..serialization._evolution import (
    Convert,
    describe_schema,
    layout_serializer,
    record_converter,
    resolve_schema,
    same_declaration,
    same_layout,
)
from ..serialization._serializers import (
    DictSerializer,
    IntSerializer,
    ListSerializer,
    NullableSerializer,
    SerializerConfig,
    TupleSerializer,
    TypeSerializer,
)
from ._state import Migration, StateDescriptor, StateKind, StateTtlConfig

__all__ = [
    "DROP",
    "LINEAGE",
    "REWRITTEN",
    "SCHEMA_VERSION",
    "MigrationProgress",
    "SchemaStep",
    "StateMigrationPlan",
    "lineage_of",
    "plan_state_migration",
    "same_schema",
    "schema_history",
    "schema_of",
    "version_of",
]

SCHEMA_VERSION = "schema_version"
"""The key of a snapshot entry holding the declared schema version (absent: version 1)."""
LINEAGE = "lineage"
"""The key of a snapshot entry holding the former schemas, oldest first (absent: none)."""

REWRITTEN = "rewritten"
"""The ``migration`` of a schema-history entry written by the state processor's offline rewrite."""

MigrationProgress = Callable[[str, int, "int | None"], None]
"""Called as ``progress(state, done, total)`` while a restore migrates a state's entries.

``total`` is None while the backend cannot tell it without a pass of its own
(an ordered engine migrating in place counts as it goes); the last report of a
state always has ``done == total``."""


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


DROP: Any = _Drop()
"""What a unit conversion returns for a unit the migration removes."""

_STORAGE = {
    StateKind.VALUE: StateKind.VALUE,
    StateKind.REDUCING: StateKind.VALUE,
    StateKind.AGGREGATING: StateKind.VALUE,
    StateKind.LIST: StateKind.LIST,
    StateKind.MAP: StateKind.MAP,
}


def schema_of(meta: Mapping[str, Any]) -> dict[str, Any]:
    """A snapshot entry without its schema history: what two declarations must agree on."""
    return {k: v for k, v in meta.items() if k != LINEAGE}


def same_schema(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two snapshot entries declare the same state (their histories may differ)."""
    return schema_of(a) == schema_of(b)


def lineage_of(meta: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    """The former schemas of a snapshot entry, oldest first."""
    raw = meta.get(LINEAGE) or ()
    return tuple(dict(x) for x in raw if isinstance(x, Mapping))


def version_of(meta: Mapping[str, Any]) -> int:
    """The schema version of a snapshot entry (1 when it has none)."""
    v = meta.get(SCHEMA_VERSION, 1)
    return v if isinstance(v, int) and not isinstance(v, bool) else 1


@dataclass(frozen=True)
class SchemaStep:
    """One schema a state had: its version and type, and how its entries left it.

    Attributes:
        version: The declared schema version.
        serializer: The descriptor's serializer config.
        ttl: The TTL settings, or None.
        migration: How entries were migrated out of it (``converted``,
            ``function``, ``unchanged``, or ``rewritten`` offline by the state
            processor); None for the state's current schema.
        restored_from: The checkpoint whose restore migrated them
            (``{"kind", "checkpoint_id"}``), None where the restore did not say.
        changes: What changed, in words.
    """

    version: int
    serializer: dict[str, Any]
    ttl: dict[str, Any] | None
    migration: str | None = None
    restored_from: dict[str, Any] | None = None
    changes: tuple[str, ...] = ()

    @property
    def schema(self) -> str:
        """The type in full (dataclass fields included)."""
        return describe_schema(self.serializer)

    @property
    def until(self) -> str:
        """``now``, or when and how entries were migrated out of this schema."""
        if self.migration is None:
            return "now"
        if self.migration == REWRITTEN:
            return "until an offline rewrite (statekit.state_processor, transform_state)"
        how = {"function": "a declared migration", "unchanged": "no rewrite"}.get(self.migration, "converted")
        origin = self.restored_from
        where = (
            f"the restore of {origin.get('kind')} {origin.get('checkpoint_id')}" if origin else "a restore"
        )
        return f"until {where} ({how})"


def schema_history(meta: Mapping[str, Any]) -> list[SchemaStep]:
    """The schemas of the state of snapshot entry ``meta``, oldest first, the current one last."""
    out = []
    for h in lineage_of(meta):
        origin = h.get("restored_from")
        out.append(
            SchemaStep(
                version_of(h),
                dict(h.get("serializer") or {}),
                h.get("ttl"),
                str(h.get("migration") or "converted"),
                dict(origin) if isinstance(origin, Mapping) else None,
                tuple(str(c) for c in h.get("changes") or ()),
            )
        )
    out.append(SchemaStep(version_of(meta), dict(meta.get("serializer") or {}), meta.get("ttl")))
    return out


def _describe(meta: Mapping[str, Any]) -> str:
    v = version_of(meta)
    ttl = meta.get("ttl")
    extra = [f"version {v}"] if v != 1 else []
    if ttl:
        extra.append(f"TTL {ttl.get('ttl_ms')} ms")
    return describe_schema(meta.get("serializer") or {}) + (f" ({', '.join(extra)})" if extra else "")


@dataclass(frozen=True)
class StateMigrationPlan:
    """How the stored entries of one state become entries of its declaration.

    Attributes:
        name: The state.
        storage_kind: Value, list or map: what a unit is (see the module docstring).
        old_meta: The snapshot entry the entries were written under.
        new_meta: The declaration's entry (without history).
        how: ``"converted"`` (by the schema rules, or TTL), ``"function"`` (a
            declared :class:`~statekit.Migration`) or ``"unchanged"`` (the bytes
            read as they are: a class renamed, a new TTL, a version bump).
        changes: What changes, in words.
        unit_decoder: Reads an old unit's value bytes (without a TTL timestamp).
        unit_convert: Turns an old unit value into a new one (None: as decoded).
        same_bytes: Whether an old unit's value bytes are the new one's.
        key_decoder: Map state: reads the user keys (they never change).
        old_ttl: Whether old units carry timestamps.
        new_ttl: Whether new units do.
        lineage: The state's schema history after this migration.
    """

    name: str
    storage_kind: StateKind
    old_meta: dict[str, Any]
    new_meta: dict[str, Any]
    how: str
    changes: tuple[str, ...]
    unit_decoder: TypeSerializer
    unit_convert: Convert | None
    same_bytes: bool
    key_decoder: TypeSerializer | None
    old_ttl: bool
    new_ttl: bool
    lineage: tuple[dict[str, Any], ...]

    @property
    def changes_data(self) -> bool:
        """Whether stored bytes must be rewritten (False: they read as the declared type as they are)."""
        return not self.same_bytes or self.old_ttl != self.new_ttl

    @property
    def entry_decoder(self) -> TypeSerializer:
        """Reads one old stored entry whole (a canonical snapshot's values column)."""
        unit = self.unit_decoder
        if self.old_ttl:
            unit = TupleSerializer([unit, IntSerializer()])
        if self.storage_kind is StateKind.LIST:
            return ListSerializer(unit)
        if self.storage_kind is StateKind.MAP:
            assert self.key_decoder is not None
            return DictSerializer(self.key_decoder, unit)
        return unit

    def unit(self, now: int) -> Callable[[Any], Any]:
        """Old unit (value, or ``(value, timestamp)`` with old TTL) to new unit, or :data:`DROP`.

        ``now`` stamps units when TTL is turned on.
        """
        conv, old_ttl, new_ttl = self.unit_convert, self.old_ttl, self.new_ttl
        drop_none = self.storage_kind is not StateKind.MAP  # a map value may be None; a value or element not

        def unit(u: Any) -> Any:
            if old_ttl:
                v, ts = u
            else:
                v, ts = u, now
            if conv is not None:
                v = conv(v)
                if v is None and drop_none:
                    return DROP
            return (v, ts) if new_ttl else v

        return unit

    def entry(self, now: int) -> Callable[[Any], Any]:
        """Old stored entry to new one; None when nothing of it is left."""
        unit = self.unit(now)
        if self.storage_kind is StateKind.LIST:
            return lambda e: [r for r in map(unit, e) if r is not DROP] or None
        if self.storage_kind is StateKind.MAP:
            return lambda e: {k: unit(u) for k, u in e.items()}
        return lambda e: None if (r := unit(e)) is DROP else r

    def describe(self) -> str:
        """``written as <old schema>, declared as <new schema>``."""
        return f"written as {_describe(self.old_meta)}, declared as {_describe(self.new_meta)}"

    def failure(self, where: str, error: BaseException, consequence: str) -> StateMigrationError:
        """The error for a unit that cannot be migrated: the state, ``where`` (its key), both schemas."""
        return StateMigrationError(
            f"state {self.name!r} ({self.describe()}): the entry of {where} cannot be migrated: "
            f"{type(error).__name__}: {error}; {consequence}. Fix the declared type or its Migration "
            "and restore again (the checkpoint is unchanged)"
        )


def _unit_config(kind: StateKind, cfg: SerializerConfig, state: str) -> SerializerConfig:
    try:
        if kind is StateKind.LIST:
            return dict(cfg["args"][0])
        if kind is StateKind.MAP:
            return dict(cfg["args"][1])
        return dict(cfg)
    except (KeyError, IndexError, TypeError, ValueError):
        raise StateMigrationError(
            f"state {state!r}: malformed serializer config {cfg!r} in the snapshot"
        ) from None


def _unit_serializer(kind: StateKind, ser: TypeSerializer) -> TypeSerializer:
    if kind is StateKind.LIST:
        assert isinstance(ser, ListSerializer)
        return ser.element
    if kind is StateKind.MAP:
        assert isinstance(ser, DictSerializer)
        return ser.value
    return ser


def _source_serializer(kind: StateKind, m: Migration) -> TypeSerializer:
    ser = m.source_serializer()
    assert ser is not None
    if kind is StateKind.MAP and not isinstance(ser, NullableSerializer):
        return NullableSerializer(ser)  # as MapStateDescriptor stores its values
    return ser


def _ttl_change(old: Mapping[str, Any] | None, new: StateTtlConfig | None) -> list[str]:
    if old is None and new is None:
        return []
    if old is None:
        return ["TTL turned on: every entry is stamped with the time of the restore"]
    if new is None:
        return ["TTL turned off: the entries' last-access times are dropped"]
    if dict(old) != new.to_json():
        return [f"TTL changed from {dict(old)} to {new.to_json()}: the stored last-access times stay"]
    return []


def plan_state_migration(
    name: str,
    kind: StateKind,
    descriptor: StateDescriptor,
    namespace_serializer: TypeSerializer | None,
    meta: Mapping[str, Any],
    origin: Mapping[str, Any] | None = None,
) -> StateMigrationPlan | None:
    """The plan that turns entries written under snapshot entry ``meta`` into ``descriptor``'s, or None.

    None when both declare the same schema (histories aside). ``origin``
    names the checkpoint being restored (``{"kind", "checkpoint_id"}``) for
    the schema history.

    Raises:
        StateMigrationError: On another kind, or a declared version older than the stored one.
        IncompatibleSerializerError: When the stored values cannot become the
            declared type (namespaces and map keys never change type), naming
            both schemas and the way out.
    """
    old_meta = dict(meta)
    _check_kind_and_namespaces(name, kind, namespace_serializer, old_meta)
    new_meta = descriptor.meta()
    old_v, new_v = version_of(old_meta), descriptor.version
    old_cfg = old_meta.get("serializer")
    if not isinstance(old_cfg, dict):
        raise StateMigrationError(f"state {name!r}: the snapshot declares no serializer")
    old_ttl_cfg = old_meta.get("ttl")
    if (
        same_declaration(old_cfg, new_meta["serializer"])
        and old_v == new_v
        and old_ttl_cfg == new_meta["ttl"]
    ):
        return None  # the same schema (the former names its fields declare may differ: nothing moves)
    plan_desc = (
        f"state {name!r} was written as {_describe(old_meta)} and is declared as {_describe(new_meta)}"
    )
    if old_v > new_v:
        raise StateMigrationError(
            f"{plan_desc}: the snapshot is of a newer schema version than the job; declare version {old_v} "
            "(the type that wrote it), or restore a checkpoint taken before that version (its schema "
            "history: statekit checkpoints inspect)"
        )
    skind = _STORAGE[kind]
    old_unit = _unit_config(skind, old_cfg, name)
    new_ser = descriptor.serializer
    new_unit = _unit_serializer(skind, new_ser)
    key_decoder = _map_key_decoder(skind, new_ser, old_cfg, name, plan_desc)
    changes = _ttl_change(old_ttl_cfg, descriptor.ttl)
    if old_v != new_v:
        changes.insert(0, f"schema version {old_v} → {new_v}")
    declared = _declared_migration(descriptor, skind, old_unit, old_v, new_v, plan_desc)
    if declared is None:
        _refuse_rollback(name, old_meta, new_meta, skind, old_unit, new_unit)
    convert: Convert | None
    if declared is not None:
        decoder, convert = _declared_conversion(declared, skind, old_unit, old_v, plan_desc, changes)
        how = "function"
        same_bytes = False
    else:
        decoder, convert, same_bytes = _schema_conversion(skind, old_unit, new_unit, plan_desc, changes)
        ttl_switched = (old_ttl_cfg is None) != (descriptor.ttl is None)
        how = "unchanged" if same_bytes and not ttl_switched else "converted"
    entry = {
        SCHEMA_VERSION: old_v,
        "serializer": old_cfg,
        "ttl": old_ttl_cfg,
        "migration": how,
        "changes": list(changes),
        "restored_from": dict(origin) if origin else None,
    }
    return StateMigrationPlan(
        name=name,
        storage_kind=skind,
        old_meta=old_meta,
        new_meta=new_meta,
        how=how,
        changes=tuple(changes),
        unit_decoder=decoder,
        unit_convert=convert,
        same_bytes=same_bytes,
        key_decoder=key_decoder,
        old_ttl=old_ttl_cfg is not None,
        new_ttl=descriptor.ttl is not None,
        lineage=(*lineage_of(old_meta), entry),
    )


def _refuse_rollback(
    name: str,
    old_meta: Mapping[str, Any],
    new_meta: Mapping[str, Any],
    skind: StateKind,
    old_unit: SerializerConfig,
    new_unit: TypeSerializer,
) -> None:
    """Refuse a declaration equal to an older schema in the history: code rolled back over newer state.

    Restoring would silently undo the upgrade on the stored values (a field
    the newer code added dropped, a rename undone, a widening narrowed where
    it can be), so it is refused by default, naming both schemas and the ways
    out; going back on purpose is a new schema version.
    """
    history = lineage_of(old_meta)
    older = next(
        (
            h
            for h in reversed(history)
            if isinstance(h.get("serializer"), dict)
            and same_declaration(h["serializer"], new_meta["serializer"])
            and version_of(h) == version_of(new_meta)
            and h.get("ttl") == new_meta.get("ttl")
        ),
        None,
    )
    if older is None:
        return
    c = resolve_schema(
        old_unit, new_unit, path={StateKind.LIST: "element", StateKind.MAP: "value"}.get(skind, "")
    )
    would = "; ".join(c.migration.changes) if c.migration is not None and c.migration.changes else c.reason
    origin = older.get("restored_from")
    upgraded = (
        f" (the restore of {origin.get('kind')} {origin.get('checkpoint_id')} upgraded it)"
        if isinstance(origin, Mapping)
        else ""
    )
    top = max([version_of(old_meta), *(version_of(h) for h in history)]) + 1
    raise StateMigrationError(
        f"state {name!r} is declared as {_describe(new_meta)}, an older schema of its history{upgraded}: "
        f"the checkpoint holds it as {_describe(old_meta)}, written by newer code. Code rolled back over "
        f"newer state is refused (restoring would: {would or 'reinterpret the values'}). Ways out: restore "
        "the savepoint taken before the upgrade; or declare a Migration on the descriptor that converts "
        f"the newer values (from_type= the newer type); or, if going back is deliberate, declare "
        f"version={top} (statekit checkpoints inspect shows the history)"
    )


def _check_kind_and_namespaces(
    name: str, kind: StateKind, namespace_serializer: TypeSerializer | None, old_meta: Mapping[str, Any]
) -> None:
    """Refuses another kind of state, or namespaces of another type: neither ever migrates."""
    if old_meta.get("kind") != kind.value:
        raise StateMigrationError(
            f"state {name!r} was written as {old_meta.get('kind')} state and is now declared as "
            f"{kind.value} state; use a new name for the new state"
        )
    ns = old_meta.get("namespace_serializer")
    if (
        ns is not None
        and namespace_serializer is not None
        and not same_layout(ns, namespace_serializer.config())
    ):
        raise IncompatibleSerializerError(
            f"the namespaces of state {name!r} were written as {describe_schema(ns)} and are declared as "
            f"{describe_schema(namespace_serializer.config())}; namespaces never change type (they are "
            "part of where an entry lives): declare the original namespace type"
        )


def _map_key_decoder(
    skind: StateKind, new_ser: TypeSerializer, old_cfg: SerializerConfig, name: str, plan_desc: str
) -> TypeSerializer | None:
    """Map state: the declared key serializer, once the stored keys are known to be of its type."""
    if skind is not StateKind.MAP:
        return None
    assert isinstance(new_ser, DictSerializer)
    old_key = _unit_config(StateKind.LIST, old_cfg, name)  # a list's element is args[0]: here the keys
    if not same_layout(old_key, new_ser.key.config()):
        raise IncompatibleSerializerError(
            f"{plan_desc}: map keys were written as {describe_schema(old_key)} and are declared as "
            f"{describe_schema(new_ser.key.config())}; map keys never change type (two old keys could "
            "become one): declare the original key type, or rewrite the savepoint with "
            "statekit.state_processor (transform_state)"
        )
    return new_ser.key


def _declared_migration(
    descriptor: StateDescriptor,
    skind: StateKind,
    old_unit: SerializerConfig,
    old_v: int,
    new_v: int,
    plan_desc: str,
) -> Migration | None:
    """The one declared :class:`~statekit.Migration` that applies to the stored values, if any."""
    declared = [
        m
        for m in descriptor.migrations
        if (m.from_version is not None and m.from_version == old_v and old_v != new_v)
        or (m.from_type is not None and same_layout(_source_serializer(skind, m).config(), old_unit))
    ]
    if len(declared) > 1:
        raise StateMigrationError(
            f"{plan_desc}: {len(declared)} declared migrations apply to it ({declared}); keep one"
        )
    return declared[0] if declared else None


def _declared_conversion(
    m: Migration, skind: StateKind, old_unit: SerializerConfig, old_v: int, plan_desc: str, changes: list[str]
) -> tuple[TypeSerializer, Convert]:
    """The decoder of the old values and the declared function that converts them; notes it in ``changes``."""
    fn = m.function
    if m.from_type is not None:
        decoder = _source_serializer(skind, m)
        convert = fn
        changes.append(f"declared migration from type {decoder.describe()}")
    else:
        try:
            decoder = layout_serializer(old_unit)
        except SerializationError:
            raise StateMigrationError(
                f"{plan_desc}: the declared migration from version {old_v} cannot read the old values "
                f"({describe_schema(old_unit)} is not a built-in serializer); declare it with "
                "from_type= naming the old type or serializer instead"
            ) from None
        records = record_converter(old_unit)
        convert = fn if records is None else (lambda v, fn=fn, rec=records: fn(rec(v)))  # type: ignore[misc]
        changes.append(f"declared migration from version {old_v}")
    return decoder, convert


def _schema_conversion(
    skind: StateKind, old_unit: SerializerConfig, new_unit: TypeSerializer, plan_desc: str, changes: list[str]
) -> tuple[TypeSerializer, Convert | None, bool]:
    """Decoder, conversion and whether the bytes stay, by the schema rules; notes the changes."""
    c = resolve_schema(
        old_unit, new_unit, path={StateKind.LIST: "element", StateKind.MAP: "value"}.get(skind, "")
    )
    if not c.compatible:
        raise IncompatibleSerializerError(
            f"{plan_desc}: {c.reason}. Declare a Migration on the descriptor (from_version= or "
            "from_type=) that converts the old values, or rewrite the savepoint with "
            "statekit.state_processor (transform_state)"
        )
    assert c.migration is not None
    decoder, convert, same_bytes = c.migration.decoder, c.migration.convert, c.migration.same_bytes
    changes.extend(c.migration.changes)
    return decoder, convert, same_bytes
