"""Schema evolution: whether bytes written under one serializer config read as another type, and how.

A snapshot records each state's serializer config; the job declares a type.
:func:`resolve_schema` decides from the old config and the declared serializer
alone, before any state is touched, and answers one of:

- ``identical``: the configs are equal; the old bytes are the new bytes;
- ``migrate``: the old bytes are read by a decoder built from the old config
  (the class of a dataclass that has changed since is not needed: its bytes
  are its fields' columns) and each value is converted to the declared type
  (:class:`ValueMigration`);
- ``incompatible``: with the reason, naming the place in the type.

The rules (``docs/state.md``, "Evolving a state's type"):

- a dataclass's fields are matched by name, or by a former name the field
  declares (``dataclasses.field(metadata={"statekit.former_names": ("old",)})``),
  or, to undo a rename, by a former name the *stored* field declared (the
  stored schema keeps its fields' former names): code rolled back from
  ``hits`` (formerly ``count``) to ``count`` finds the values of ``hits``;
  a field may be added if it has a default, removed (its values are dropped),
  moved; the class itself may move or be renamed;
- ``int`` widens to ``float`` (exactly: an int that no float holds exactly
  fails the migration with :class:`LossyValueError`), ``T`` to ``T | None``;
- containers evolve element-wise: ``list[T]``, ``tuple[T, ...]``,
  ``tuple[A, B]`` (same length), ``T | None``, and the values of ``dict[K, V]``;
- keys never change type: a dict's keys, like a state's keys, its map keys
  and its namespaces, decide where an entry lives, and two old keys could
  become one;
- everything else is refused: narrowing (``float`` to ``int``, ``T | None`` to
  ``T``), another type, a new field without a default, a field that two old
  fields could feed, a changed custom or pickle serializer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import SerializationError
from ._serializers import (
    DataclassSerializer,
    DictSerializer,
    IntSerializer,
    ListSerializer,
    NullableSerializer,
    SerializerConfig,
    TupleSerializer,
    TypeSerializer,
    VarTupleSerializer,
    rebuild_serializer,
)

__all__ = [
    "FORMER_NAMES",
    "Compatibility",
    "Convert",
    "LossyValueError",
    "RecordLayoutSerializer",
    "ValueMigration",
    "describe_schema",
    "exact_float",
    "former_names",
    "layout_serializer",
    "record_converter",
    "resolve_schema",
    "same_declaration",
    "same_layout",
]

FORMER_NAMES = "statekit.former_names"
"""The key of a dataclass field's metadata that names the field's former names."""

Convert = Callable[[Any], Any]
"""Turns one decoded old value into a value of the declared type."""


class LossyValueError(ValueError):
    """A value that a widening cannot carry exactly (an int a float does not hold exactly)."""


def describe_schema(cfg: SerializerConfig) -> str:
    """A serializer config in full, dataclass fields included: ``Visit{count: int, seen: float}``."""
    ident = str(cfg.get("id", "?"))
    if ident == "dataclass":
        cls = str(cfg.get("class", "?")).rpartition(":")[2]
        fields = ", ".join(f"{n}: {describe_schema(c)}" for n, c in cfg.get("fields", []))
        return f"{cls}{{{fields}}}"
    args = cfg.get("args")
    if ident == "tuple..." and args:
        return f"tuple<{describe_schema(args[0])},...>"
    if args:
        return f"{ident}<{','.join(describe_schema(a) for a in args)}>"
    return ident


def _strip_classes(cfg: Any) -> Any:
    if isinstance(cfg, dict):
        return {
            k: _strip_classes(v)
            for k, v in cfg.items()
            if not (k in ("class", "former_names") and cfg.get("id") == "dataclass")
        }
    if isinstance(cfg, list):
        return [_strip_classes(v) for v in cfg]
    return cfg


def same_declaration(a: SerializerConfig, b: SerializerConfig) -> bool:
    """Whether two configs are equal but for the former names their dataclass fields declare."""
    return bool(a == b or _strip_former_names(a) == _strip_former_names(b))


def _strip_former_names(cfg: Any) -> Any:
    if isinstance(cfg, dict):
        return {
            k: _strip_former_names(v)
            for k, v in cfg.items()
            if not (k == "former_names" and cfg.get("id") == "dataclass")
        }
    if isinstance(cfg, list):
        return [_strip_former_names(v) for v in cfg]
    return cfg


def same_layout(a: SerializerConfig, b: SerializerConfig) -> bool:
    """Whether bytes of config ``a`` are bytes of config ``b``, value for value.

    The configs may differ only in the classes of dataclasses (a class that
    moved or was renamed, with the same fields in the same order) and in the
    former names their fields declare.
    """
    return bool(a == b or _strip_classes(a) == _strip_classes(b))


class RecordLayoutSerializer(TupleSerializer):
    """A dataclass's bytes without its class: each value a tuple of its fields (in the stored order).

    Its config is the stored one, so a state whose class has changed or is
    gone can still be carried through snapshots unchanged.
    """

    def __init__(self, cfg: SerializerConfig) -> None:
        try:
            fields = [(str(n), c) for n, c in cfg["fields"]]
        except (KeyError, TypeError, ValueError) as e:
            raise SerializationError(f"malformed dataclass config {cfg!r}: {e}") from None
        super().__init__([layout_serializer(c) for _, c in fields])
        self.names = [n for n, _ in fields]
        self._cfg = cfg

    def config(self) -> SerializerConfig:
        return self._cfg


def layout_serializer(cfg: SerializerConfig) -> TypeSerializer:
    """A serializer that reads and writes exactly the bytes of ``cfg``, without importing any class.

    Dataclasses read as tuples of their fields (:class:`RecordLayoutSerializer`).

    Raises:
        SerializationError: For a serializer that is not built in.
    """
    return rebuild_serializer(cfg, RecordLayoutSerializer)


def record_converter(cfg: SerializerConfig) -> Convert | None:
    """Turns values read by :func:`layout_serializer` into records: each dataclass a ``dict`` of its fields.

    None when nothing needs turning. Dict keys stay as read (a record is not hashable).
    """
    ident = cfg.get("id")
    args = list(cfg.get("args", []))
    if ident == "dataclass":
        names = [str(n) for n, _ in cfg["fields"]]
        subs = [record_converter(c) for _, c in cfg["fields"]]
        return lambda t: {n: x if c is None else c(x) for n, c, x in zip(names, subs, t)}
    if ident == "optional":
        inner = record_converter(args[0])
        return None if inner is None else _optional(inner)
    if ident in ("list", "tuple..."):
        el = record_converter(args[0])
        if el is None:
            return None
        return _tuple_of(el) if ident == "tuple..." else _list_of(el)
    if ident == "dict":
        val = record_converter(args[1])
        return None if val is None else _dict_of(val)
    if ident == "tuple":
        parts = [record_converter(a) for a in args]
        return None if all(p is None for p in parts) else _fields_of(parts)
    return None


@dataclasses.dataclass(frozen=True)
class ValueMigration:
    """How old bytes become values of the declared type.

    Attributes:
        decoder: Reads the old bytes (its column layout is the old config's).
        convert: Turns each decoded value into a declared one; None when the
            decoder already yields declared values (``int`` read for ``int | None``).
        same_bytes: Whether the old bytes are the declared type's bytes too
            (equal configs, or only a dataclass's class changed): nothing to rewrite.
        changes: What changes, in words, for messages and the schema history.
    """

    decoder: TypeSerializer
    convert: Convert | None
    same_bytes: bool = False
    changes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Compatibility:
    """The answer of :func:`resolve_schema`.

    Attributes:
        kind: ``"identical"``, ``"migrate"`` or ``"incompatible"``.
        migration: For ``identical`` and ``migrate``: how to read the old bytes.
        reason: For ``incompatible``: why, naming the place in the type.
    """

    kind: str
    migration: ValueMigration | None = None
    reason: str = ""

    @property
    def compatible(self) -> bool:
        """Whether old values can be read as the declared type."""
        return self.kind != "incompatible"


class _Refused(Exception):
    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}" if path else reason)


def resolve_schema(old: SerializerConfig, new: TypeSerializer, *, path: str = "") -> Compatibility:
    """Whether values stored with config ``old`` can be read as ``new``'s type, and how.

    ``path`` prefixes the places named in reasons and changes (e.g. ``"list element"``).

    >>> resolve_schema(IntSerializer().config(), FloatSerializer()).kind
    'migrate'
    >>> resolve_schema(FloatSerializer().config(), IntSerializer()).reason
    'float cannot become int: a narrowing loses information'
    """
    new_cfg = new.config()
    if same_declaration(old, new_cfg):
        return Compatibility("identical", ValueMigration(new, None, True))
    try:
        decoder, convert, changes = _plan(old, new, path)
    except _Refused as e:
        return Compatibility("incompatible", reason=str(e))
    return Compatibility(
        "migrate", ValueMigration(decoder, convert, same_layout(old, new_cfg), tuple(changes))
    )


def _at(path: str) -> str:
    return f"{path}: " if path else ""


def _optional(conv: Convert) -> Convert:
    return lambda v: None if v is None else conv(v)


def _list_of(conv: Convert) -> Convert:
    return lambda v: [conv(x) for x in v]


def _tuple_of(conv: Convert) -> Convert:
    return lambda v: tuple(conv(x) for x in v)


def _dict_of(conv: Convert) -> Convert:
    return lambda d: {k: conv(v) for k, v in d.items()}


def _fields_of(convs: Sequence[Convert | None]) -> Convert:
    return lambda t: tuple(x if c is None else c(x) for c, x in zip(convs, t))


def exact_float(v: int) -> float:
    """``v`` as a float, or :class:`LossyValueError` if no float holds it exactly."""
    try:
        f = float(v)
    except OverflowError:
        raise LossyValueError(f"the int {v} is too large for a float") from None
    if f != v:
        raise LossyValueError(f"the int {v} has no exact float (the nearest is {f!r})")
    return f


_Plan = tuple[TypeSerializer, "Convert | None", list[str]]


def _plan(old: SerializerConfig, new: TypeSerializer, path: str) -> _Plan:
    new_cfg = new.config()
    if same_layout(old, new_cfg):
        moved = (
            []
            if same_declaration(old, new_cfg)
            else [f"{_at(path)}dataclass {_classes(old)} is now {_classes(new_cfg)}"]
        )
        return new, None, moved
    oid, nid = old.get("id"), new_cfg.get("id")
    what = f"{describe_schema(old)} cannot become {describe_schema(new_cfg)}"
    if nid == "float" and oid == "int":
        return IntSerializer(), exact_float, [f"{_at(path)}int → float"]
    if nid == "optional" and isinstance(new, NullableSerializer):
        if oid == "optional":
            dec, conv, ch = _plan(_arg(old, 0), new.inner, path)
            return NullableSerializer(dec), None if conv is None else _optional(conv), ch
        dec, conv, ch = _plan(old, new.inner, path)
        return dec, conv, [*ch, f"{_at(path)}{describe_schema(old)} → {describe_schema(new_cfg)}"]
    if oid == "optional":
        raise _Refused(path, f"{what}: a narrowing (None would have no value)")
    if nid == oid == "list" and isinstance(new, ListSerializer):
        dec, conv, ch = _plan(_arg(old, 0), new.element, _join(path, "element"))
        return ListSerializer(dec), None if conv is None else _list_of(conv), ch
    if nid == oid == "tuple..." and isinstance(new, VarTupleSerializer):
        dec, conv, ch = _plan(_arg(old, 0), new.element, _join(path, "element"))
        return VarTupleSerializer(dec), None if conv is None else _tuple_of(conv), ch
    if nid == oid == "dict" and isinstance(new, DictSerializer):
        if not same_layout(_arg(old, 0), new.key.config()):
            raise _Refused(
                _join(path, "key"),
                f"{describe_schema(_arg(old, 0))} cannot become {describe_schema(new.key.config())}: "
                "dict keys never change type (two old keys could become one)",
            )
        dec, conv, ch = _plan(_arg(old, 1), new.value, _join(path, "value"))
        return DictSerializer(new.key, dec), None if conv is None else _dict_of(conv), ch
    if nid == oid == "tuple" and isinstance(new, TupleSerializer):
        olds = list(old.get("args", []))
        if len(olds) != len(new.fields):
            raise _Refused(
                path, f"{what}: a tuple of {len(olds)} fields cannot become one of {len(new.fields)}"
            )
        parts = [_plan(o, n, _join(path, f"[{i}]")) for i, (o, n) in enumerate(zip(olds, new.fields))]
        convs = [p[1] for p in parts]
        conv = None if all(c is None for c in convs) else _fields_of(convs)
        return TupleSerializer([p[0] for p in parts]), conv, [c for p in parts for c in p[2]]
    if nid == oid == "dataclass" and isinstance(new, DataclassSerializer):
        return _plan_dataclass(old, new, path)
    if (oid, nid) == ("float", "int"):
        raise _Refused(path, f"{what}: a narrowing loses information")
    raise _Refused(path, f"{what}: another type (only int → float, T → T | None and their containers widen)")


def _arg(cfg: SerializerConfig, i: int) -> SerializerConfig:
    try:
        return dict(cfg["args"][i])
    except (KeyError, IndexError, TypeError, ValueError):
        raise _Refused("", f"malformed serializer config {cfg!r}") from None


def _join(path: str, part: str) -> str:
    if not path:
        return part
    return f"{path}{part}" if part.startswith("[") else f"{path}.{part}"


def _classes(cfg: SerializerConfig) -> str:
    return str(cfg.get("class", "?")) if cfg.get("id") == "dataclass" else describe_schema(cfg)


def former_names(field: dataclasses.Field[Any]) -> tuple[str, ...]:
    """The former names a dataclass field declares (``metadata={"statekit.former_names": (...)}``)."""
    raw = field.metadata.get(FORMER_NAMES, ())
    names = (raw,) if isinstance(raw, str) else tuple(raw)
    if not all(isinstance(n, str) and n for n in names):
        raise SerializationError(
            f"field {field.name!r}: metadata[{FORMER_NAMES!r}] must be a str or a tuple of non-empty str, "
            f"got {raw!r}"
        )
    return names


def _stored_former_names(old: SerializerConfig, here: str) -> dict[str, tuple[str, ...]]:
    """The former names each stored field declared when it was written (none before renames kept them)."""
    raw = old.get("former_names") or {}
    if not isinstance(raw, dict):
        raise _Refused(here, f"malformed former names {raw!r} in the stored dataclass config")
    return {str(k): tuple(str(n) for n in v) for k, v in raw.items() if isinstance(v, (list, tuple))}


class _Skipped(TypeSerializer):
    """The column of a removed field: never decoded."""

    immutable = True

    def __init__(self, cfg: SerializerConfig) -> None:
        self._cfg = cfg

    def serialize(self, value: Any) -> bytes:
        raise SerializationError("a removed field is never written")

    def deserialize(self, data: bytes | memoryview) -> Any:
        return None

    def decode_column(self, data: bytes | memoryview, count: int) -> list[Any]:
        return [None] * count

    def config(self) -> SerializerConfig:
        return self._cfg


def _plan_dataclass(old: SerializerConfig, new: DataclassSerializer, path: str) -> _Plan:
    cls_name = new.cls.__qualname__
    here = path or cls_name
    try:
        old_fields = [(str(n), dict(c)) for n, c in old["fields"]]
    except (KeyError, TypeError, ValueError):
        raise _Refused(here, f"malformed dataclass config {old!r}") from None
    index = {n: i for i, (n, _) in enumerate(old_fields)}
    specs = {f.name: f for f in dataclasses.fields(new.cls)}
    stored_formers = _stored_former_names(old, here)
    # Stored fields a declared field names (as itself or a former name): never a rename undone.
    claimable = {n for name in new.names for n in (name, *former_names(specs[name]))}
    claimed: dict[int, str] = {}
    changes: list[str] = []
    for name in new.names:
        f = specs[name]
        formers = [n for n in former_names(f) if n in index and n != name]
        matches = ([name] if name in index else []) + formers
        if not matches:  # a rename undone: a stored field once called ``name`` that no field claims
            matches = [
                n
                for n, former in stored_formers.items()
                if name in former and n in index and n not in claimable
            ]
        if len(matches) > 1:
            raise _Refused(
                f"{here}.{name}",
                f"the field matches the old fields {matches} (its name and its former names); "
                "keep one of them in the former names",
            )
        if matches:
            i = index[matches[0]]
            if i in claimed:
                raise _Refused(
                    f"{here}.{name}",
                    f"old field {matches[0]!r} would feed both {claimed[i]!r} and {name!r}; "
                    "remove the former name from one of them",
                )
            claimed[i] = name
            if matches[0] != name:
                back = name in stored_formers.get(matches[0], ())
                changes.append(f"{here}: field {matches[0]!r} renamed {'back ' if back else ''}to {name!r}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise _Refused(
                f"{here}.{name}",
                "the field is new and has no default; give it a default (or default_factory), name the old "
                f"field it replaces in metadata={{{FORMER_NAMES!r}: (...)}}, or declare a migration",
            )
        else:
            changes.append(f"{here}: field {name!r} added with its default")
    sers = dict(zip(new.names, new.field_serializers))
    decoders: list[TypeSerializer] = []
    pairs: list[tuple[str, int, Convert | None]] = []
    for i, (oname, ocfg) in enumerate(old_fields):
        nname = claimed.get(i)
        if nname is None:
            decoders.append(_Skipped(ocfg))
            changes.append(f"{here}: field {oname!r} removed (its values are dropped)")
            continue
        dec, conv, ch = _plan(ocfg, sers[nname], f"{here}.{nname}")
        decoders.append(dec)
        pairs.append((nname, i, conv))
        changes.extend(ch)
    kept_old = [claimed[i] for i in sorted(claimed)]
    kept_new = [n for n in new.names if n in claimed.values()]
    if kept_old != kept_new:
        changes.append(f"{here}: fields reordered")
    old_class = str(old.get("class", ""))
    new_class = f"{new.cls.__module__}:{new.cls.__qualname__}"
    if old_class != new_class:
        changes.append(f"{here}: dataclass {old_class} is now {new_class}")
    cls = new.cls

    def convert(row: Sequence[Any]) -> Any:
        return cls(**{n: row[i] if c is None else c(row[i]) for n, i, c in pairs})

    return TupleSerializer(decoders), convert, changes
