"""The schema-evolution property: random state types, changed between restores, against a model of the rules.

A small schema language (:class:`Prim`, :class:`Opt`, :class:`Lst`, :class:`Dct`,
:class:`Tup`, :class:`Rec`) describes the type of a value, list and map state.
Types are built from it (records as dataclasses made for each version), values
drawn for it, and changed by one mutation at a time: either one the rules of
``docs/state.md`` allow (a field added with a default, removed, renamed with a
former name, moved; ``int`` to ``float``; ``T`` to ``T | None``) or one they
refuse (a narrowing, another type, a field added without a default). The
model migrates values itself, by the rules, without statekit's resolver.

:class:`EvolutionMachine` writes random entries in schema A, snapshots
(canonically or natively), restores into a fresh backend declared with schema
B, and checks that every entry reads as the model's migration of it, that the
state's schema history grew by A, and that a refused B changes nothing: the
restored backend (or a new one) still reads A.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from .._contracts import KeyedStateBackend, StateBackend, SupportsNativeSnapshot, create_keyed_backend
from .._errors import StateMigrationError
from ..serialization._evolution import FORMER_NAMES, describe_schema, same_declaration
from ..serialization._keygroups import KeyGroupRange
from ..serialization._serializers import StrSerializer, serializer_for
from ..state._parameters import KeyedBackendParameters
from ..state._state import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from ._clock import ManualClock
from ._job import snapshot_handle
from ._violation import SCHEMA_EVOLUTION, PropertyViolation

__all__ = ["Dct", "EvolutionMachine", "Field", "Lst", "Opt", "Prim", "Rec", "Schema", "Tup", "schemas"]

KEYS = ("a", "b", "c")
MAP_KEYS = ("x", "y")


@dataclasses.dataclass(frozen=True)
class Prim:
    """``int``, ``float``, ``str`` or ``bool``."""

    name: str

    def __repr__(self) -> str:
        return self.name


@dataclasses.dataclass(frozen=True)
class Opt:
    """``T | None``."""

    inner: Schema

    def __repr__(self) -> str:
        return f"{self.inner!r} | None"


@dataclasses.dataclass(frozen=True)
class Lst:
    """``list[T]``."""

    element: Schema

    def __repr__(self) -> str:
        return f"list[{self.element!r}]"


@dataclasses.dataclass(frozen=True)
class Dct:
    """``dict[str, T]``."""

    value: Schema

    def __repr__(self) -> str:
        return f"dict[str, {self.value!r}]"


@dataclasses.dataclass(frozen=True)
class Tup:
    """``tuple[A, B, ...]`` (fixed length)."""

    fields: tuple[Schema, ...]

    def __repr__(self) -> str:
        return f"tuple[{', '.join(map(repr, self.fields))}]"


@dataclasses.dataclass(frozen=True)
class Field:
    """A record field: its type, whether it has a default, and the names it had before."""

    name: str
    type: Schema
    default: bool = False
    former: tuple[str, ...] = ()

    def __repr__(self) -> str:
        extra = " = default" if self.default else ""
        extra += f" (was {', '.join(self.former)})" if self.former else ""
        return f"{self.name}: {self.type!r}{extra}"


@dataclasses.dataclass(frozen=True)
class Rec:
    """A dataclass named ``name``; fields with defaults come last (as dataclasses require)."""

    name: str
    fields: tuple[Field, ...]

    def __repr__(self) -> str:
        return f"{self.name}{{{'; '.join(map(repr, self.fields))}}}"


Schema = Prim | Opt | Lst | Dct | Tup | Rec

_PRIM_TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}
_PRIM_DEFAULTS: dict[str, Any] = {"int": 0, "float": 0.0, "str": "", "bool": False}


# --- schemas, types and values -----------------------------------------------------------------------


def schemas(depth: int = 2) -> st.SearchStrategy[Schema]:
    """Random schemas, at most ``depth`` levels of containers and records deep."""
    prim: st.SearchStrategy[Schema] = st.sampled_from([Prim(n) for n in _PRIM_TYPES])
    if depth <= 0:
        return prim
    inner = schemas(depth - 1)
    return st.one_of(
        prim,
        inner.map(Opt),
        inner.map(Lst),
        inner.map(Dct),
        st.lists(inner, min_size=1, max_size=2).map(lambda fs: Tup(tuple(fs))),
        _records(inner),
    ).map(_norm)


_names = st.sampled_from(["count", "seen", "tags", "total", "first", "name"])


@st.composite
def _records(draw: st.DrawFn, inner: st.SearchStrategy[Schema]) -> Rec:
    names = draw(st.lists(_names, min_size=1, max_size=3, unique=True))
    types = [draw(inner) for _ in names]
    defaults = draw(st.integers(0, len(names)))  # the last ones have defaults
    fields = tuple(Field(n, t, i >= len(names) - defaults) for i, (n, t) in enumerate(zip(names, types)))
    return Rec(f"Rec{draw(st.integers(0, 9))}", fields)


class Types:
    """The Python types of one schema version: dataclasses made for its records, once each."""

    def __init__(self) -> None:
        self._records: dict[Schema, type] = {}

    def of(self, s: Schema) -> Any:
        """The type annotation of ``s``."""
        if isinstance(s, Prim):
            return _PRIM_TYPES[s.name]
        if isinstance(s, Opt):
            return self.of(s.inner) | None
        if isinstance(s, Lst):
            return list[self.of(s.element)]  # type: ignore[misc]
        if isinstance(s, Dct):
            return dict[str, self.of(s.value)]  # type: ignore[misc]
        if isinstance(s, Tup):
            return tuple[tuple(self.of(f) for f in s.fields)]  # type: ignore[misc]
        # A record and the same record without former names (the next version of the schema) are one class.
        cls = self._records.get(_settled(s))
        if cls is None:
            specs = []
            for f in s.fields:
                kw: dict[str, Any] = {"metadata": {FORMER_NAMES: f.former}} if f.former else {}
                if f.default:
                    kw["default_factory"] = _default_factory(self, f.type)
                specs.append((f.name, self.of(f.type), dataclasses.field(**kw)))
            cls = dataclasses.make_dataclass(s.name, specs)
            cls.__module__ = __name__  # one class path for every version, as a job's class across its runs
            self._records[_settled(s)] = cls
        return cls

    def default(self, s: Schema) -> Any:
        """The default of a field of type ``s``."""
        if isinstance(s, Prim):
            return _PRIM_DEFAULTS[s.name]
        if isinstance(s, Opt):
            return None
        if isinstance(s, Lst):
            return []
        if isinstance(s, Dct):
            return {}
        if isinstance(s, Tup):
            return tuple(self.default(f) for f in s.fields)
        return self.of(s)(**{f.name: self.default(f.type) for f in s.fields})


def _default_factory(types: Types, s: Schema) -> Callable[[], Any]:
    return lambda: types.default(s)


def values(s: Schema, types: Types) -> st.SearchStrategy[Any]:
    """Values of schema ``s`` (ints a float holds exactly, no NaN: ``int → float`` is exact, ``==`` works)."""
    if isinstance(s, Prim):
        return {
            "int": st.integers(-(2**53), 2**53),
            "float": st.floats(allow_nan=False, width=64),
            "str": st.text(max_size=4),
            "bool": st.booleans(),
        }[s.name]
    if isinstance(s, Opt):
        return st.none() | values(s.inner, types)
    if isinstance(s, Lst):
        return st.lists(values(s.element, types), max_size=2)
    if isinstance(s, Dct):
        return st.dictionaries(st.sampled_from(MAP_KEYS), values(s.value, types), max_size=2)
    if isinstance(s, Tup):
        return st.tuples(*(values(f, types) for f in s.fields))
    cls = types.of(s)
    return st.builds(lambda *vs: cls(*vs), *(values(f.type, types) for f in s.fields))


def migrate(old: Schema, new: Schema, value: Any, types: Types) -> Any:
    """The model's migration of ``value`` from ``old`` to a compatible ``new`` (values of ``types``)."""
    if isinstance(new, Opt):
        if isinstance(old, Opt):
            return None if value is None else migrate(old.inner, new.inner, value, types)
        return migrate(old, new.inner, value, types)
    if isinstance(new, Prim):
        assert isinstance(old, Prim)
        return float(value) if (old.name, new.name) == ("int", "float") else value
    if isinstance(new, Lst):
        assert isinstance(old, Lst)
        return [migrate(old.element, new.element, v, types) for v in value]
    if isinstance(new, Dct):
        assert isinstance(old, Dct)
        return {k: migrate(old.value, new.value, v, types) for k, v in value.items()}
    if isinstance(new, Tup):
        assert isinstance(old, Tup)
        return tuple(migrate(o, n, v, types) for o, n, v in zip(old.fields, new.fields, value))
    assert isinstance(old, Rec)
    olds = {f.name: f for f in old.fields}
    kwargs = {}
    for f in new.fields:
        source = next((n for n in (f.name, *f.former) if n in olds), None)
        if source is None:
            kwargs[f.name] = types.default(f.type)
        else:
            kwargs[f.name] = migrate(olds[source].type, f.type, getattr(value, source), types)
    return types.of(new)(**kwargs)


def same(a: Any, b: Any) -> bool:
    """``a == b``, types included: ``1`` is not ``1.0``, a tuple not a list, a record only its own class."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return bool(a == b)


# --- mutations: one change at one place of a schema ------------------------------------------------------

Site = tuple[Schema, Callable[[Schema], Schema]]
"""A node of a schema and how to rebuild the whole schema with the node replaced."""


def _sites(s: Schema, rebuild: Callable[[Schema], Schema]) -> Iterator[Site]:
    yield s, rebuild
    if isinstance(s, Opt):
        yield from _sites(s.inner, lambda x: rebuild(Opt(x)))
    elif isinstance(s, Lst):
        yield from _sites(s.element, lambda x: rebuild(Lst(x)))
    elif isinstance(s, Dct):
        yield from _sites(s.value, lambda x: rebuild(Dct(x)))
    elif isinstance(s, Tup):
        for i in range(len(s.fields)):
            yield from _sites(
                s.fields[i],
                lambda x, i=i: rebuild(Tup((*s.fields[:i], x, *s.fields[i + 1 :]))),  # type: ignore[misc]
            )
    elif isinstance(s, Rec):
        for i, f in enumerate(s.fields):
            yield from _sites(
                f.type,
                lambda x, i=i, f=f: rebuild(  # type: ignore[misc]
                    Rec(
                        s.name,
                        (*s.fields[:i], dataclasses.replace(f, type=x, former=()), *s.fields[i + 1 :]),
                    )
                ),
            )


def _settled(s: Schema) -> Schema:
    """``s`` with no former names left: a new version declares only the renames it makes."""
    if isinstance(s, Opt):
        return Opt(_settled(s.inner))
    if isinstance(s, Lst):
        return Lst(_settled(s.element))
    if isinstance(s, Dct):
        return Dct(_settled(s.value))
    if isinstance(s, Tup):
        return Tup(tuple(_settled(f) for f in s.fields))
    if isinstance(s, Rec):
        return Rec(s.name, tuple(dataclasses.replace(f, type=_settled(f.type), former=()) for f in s.fields))
    return s


def _record_changes(r: Rec, compatible: bool) -> list[tuple[str, Rec]]:
    out: list[tuple[str, Rec]] = []
    fields = list(r.fields)
    used = {f.name for f in fields}
    fresh = next(n for n in (f"added{i}" for i in itertools.count()) if n not in used)
    if compatible:
        out.append(
            (f"add field {fresh!r} with a default", Rec(r.name, (*r.fields, Field(fresh, Prim("int"), True))))
        )
        if len(fields) > 1:
            for i, f in enumerate(fields):
                rest = fields[:i] + fields[i + 1 :]
                out.append((f"remove field {f.name!r}", Rec(r.name, tuple(rest))))
        for i, f in enumerate(fields):
            if f"{f.name}_v2" in used:
                continue
            renamed = dataclasses.replace(f, name=f"{f.name}_v2", former=(f.name,))
            out.append((f"rename field {f.name!r}", Rec(r.name, (*fields[:i], renamed, *fields[i + 1 :]))))
        plain = [f for f in fields if not f.default]
        with_default = [f for f in fields if f.default]
        if len(plain) > 1:
            out.append(("reorder fields", Rec(r.name, (*reversed(plain), *with_default))))
        if len(with_default) > 1:
            out.append(("reorder fields", Rec(r.name, (*plain, *reversed(with_default)))))
    else:
        new = Field(fresh, Prim("int"), False)
        plain = [f for f in fields if not f.default]
        out.append(
            (
                f"add field {fresh!r} without a default",
                Rec(r.name, (*plain, new, *(f for f in fields if f.default))),
            )
        )
    return out


def _changes(node: Schema, compatible: bool) -> list[tuple[str, Schema]]:
    out: list[tuple[str, Schema]] = []
    if compatible:
        if node == Prim("int"):
            out.append(("int → float", Prim("float")))
        if not isinstance(node, Opt):
            out.append(("T → T | None", Opt(node)))
        if isinstance(node, Rec):
            out.extend(_record_changes(node, True))
    else:
        if node == Prim("float"):
            out.append(("float → int (narrowing)", Prim("int")))
        if isinstance(node, Opt):
            out.append(("T | None → T (narrowing)", node.inner))
        if node == Prim("str"):
            out.append(("str → int", Prim("int")))
        if node == Prim("int"):
            out.append(("int → str", Prim("str")))
        if node == Prim("bool"):
            out.append(("bool → int", Prim("int")))
        if isinstance(node, Lst):
            out.append(("list → dict", Dct(node.element)))
        if isinstance(node, Rec):
            out.extend(_record_changes(node, False))
    return out


def _norm(s: Schema) -> Schema:
    """``s`` as Python spells it: ``T | None | None`` is ``T | None``."""
    if isinstance(s, Opt):
        inner = _norm(s.inner)
        return inner if isinstance(inner, Opt) else Opt(inner)
    if isinstance(s, Lst):
        return Lst(_norm(s.element))
    if isinstance(s, Dct):
        return Dct(_norm(s.value))
    if isinstance(s, Tup):
        return Tup(tuple(_norm(f) for f in s.fields))
    if isinstance(s, Rec):
        return Rec(s.name, tuple(dataclasses.replace(f, type=_norm(f.type)) for f in s.fields))
    return s


def _kind(what: str) -> str:
    """A change without the names it touches: ``rename field 'count'`` is a ``rename field``."""
    return re.sub(r" '[^']*'", "", what)


def mutations(s: Schema, compatible: bool) -> list[tuple[str, Schema]]:
    """Every single change of ``s`` that the rules allow (``compatible``) or refuse, with its description."""
    base = _settled(s)
    out = []
    for node, rebuild in _sites(base, lambda x: x):
        for what, new in _changes(node, compatible):
            changed = _norm(rebuild(new))
            if _settled(changed) != base:  # T | None inside an optional is no change
                out.append((what, changed))
    return out


# --- the machine ----------------------------------------------------------------------------------------


class EvolutionTarget(Protocol):
    """What the machine needs of :class:`~statekit.testing.ConformanceTarget`."""

    @property
    def backend_factory(self) -> Callable[[], StateBackend]:
        """Makes the backend under test."""

    @property
    def backend_name(self) -> str:
        """Its name, in messages."""

    @property
    def scratch(self) -> Path:
        """Where each keyed backend gets a fresh ``local_dir``."""


class EvolutionMachine(RuleBasedStateMachine):
    """Entries written in schema A, restored and declared as schema B, read as the model's migration."""

    def __init__(self, target: EvolutionTarget) -> None:
        """A machine against ``target``; the schema is drawn in :meth:`init`."""
        super().__init__()
        self.target = target
        self.clock = ManualClock()
        self.backends: list[KeyedStateBackend] = []
        self.last = "the start"

    # --- set up and tear down ------------------------------------------------------------------

    def _backend(self) -> KeyedStateBackend:
        b = create_keyed_backend(
            self.target.backend_factory(),
            KeyedBackendParameters(
                StrSerializer(),
                KeyGroupRange.of(0, 127),
                128,
                clock=self.clock,
                local_dir=tempfile.mkdtemp(dir=self.target.scratch),
            ),
        )
        self.backends.append(b)
        return b

    def _declare(self, backend: KeyedStateBackend, schema: Schema, types: Types) -> tuple[Any, Any, Any]:
        t = types.of(schema)
        return (
            backend.get_state(ValueStateDescriptor("v", t)),
            backend.get_state(ListStateDescriptor("l", t)),
            backend.get_state(MapStateDescriptor("m", str, t)),
        )

    @initialize(schema=_records(schemas(1)))
    def init(self, schema: Schema) -> None:
        """Declare a value, a list and a map state of ``schema`` on a new backend.

        ``schema`` is a record (the case that evolves most), of fields of any schema.
        """
        self.schema = schema
        self.types = Types()
        self.backend = self._backend()
        self.handles = self._declare(self.backend, schema, self.types)
        self.model: dict[str, dict[str, Any]] = {"v": {}, "l": {}, "m": {}}
        self.history = 0  # entries the value state's schema history must have
        self.past: list[list[dict[str, Any]]] = [[], [], []]  # each state's former schemas (its history)
        self.last = f"declaring the states as {schema!r}"

    def teardown(self) -> None:
        """Close every backend the run made."""
        for b in self.backends:
            b.close()

    # --- rules ---------------------------------------------------------------------------------------

    @rule(key=st.sampled_from(KEYS), data=st.data())
    def write(self, key: str, data: st.DataObject) -> None:
        """Write a random value of the current schema into each state under ``key``."""
        self._write(key, data)

    def _write(self, key: str, data: st.DataObject) -> None:
        value = data.draw(values(self.schema, self.types), label="value")
        map_key = data.draw(st.sampled_from(MAP_KEYS), label="map key")
        v, lst, m = self.handles
        self.backend.set_current_key(key)
        v.update(value)
        if value is None:
            self.model["v"].pop(key, None)
        else:
            self.model["v"][key] = value
            lst.add(value)
            self.model["l"].setdefault(key, []).append(value)
        m.put(map_key, value)
        self.model["m"].setdefault(key, {})[map_key] = value
        self.last = f"writing {value!r} under key {key!r}"

    def _draw_change(self, data: st.DataObject, compatible: bool) -> tuple[str, Schema] | None:
        """A change of the current schema: first its kind, then where (so that rare kinds come up too)."""
        changes = mutations(self.schema, compatible)
        if not changes:
            return None
        kinds = sorted({_kind(what) for what, _ in changes})
        kind = data.draw(st.sampled_from(kinds), label="change")
        return data.draw(st.sampled_from([c for c in changes if _kind(c[0]) == kind]), label="where")

    def _restore(
        self, data: st.DataObject, new_schema: Schema, new_types: Types, *, native: bool | None = None
    ) -> tuple[KeyedStateBackend, str]:
        """A new backend restored from the current one, ``new_schema`` declared before or after.

        Every key gets a value first when no state holds one, so that there is something to migrate.
        """
        if not any(self.model.values()):
            for key in KEYS:
                self._write(key, data)
        if native is None:
            native = isinstance(self.backend, SupportsNativeSnapshot) and data.draw(
                st.booleans(), label="native"
            )
        declare_first = data.draw(st.booleans(), label="declare first")
        handle = snapshot_handle(self.backend, native=native)
        target = self._backend()
        when = "before" if declare_first else "after"
        how = f"{'native' if native else 'canonical'} restore, states declared {when}"
        if declare_first:
            self._declare(target, new_schema, new_types)
        if native:
            target.restore_native([handle])  # type: ignore[attr-defined]
        else:
            target.restore([handle])
        return target, how

    @rule(data=st.data())
    def evolve(self, data: st.DataObject) -> None:
        """Restore into a schema the rules allow: every entry reads as the model migrates it.

        Restored canonically and, when the backend has a native format, natively
        too; both are checked, the run goes on with one of them.
        """
        change = self._draw_change(data, True)
        if change is None:
            return  # float | None, say: nothing widens it
        what, new = change
        old_cfg = serializer_for(self.types.of(self.schema)).config()
        olds = [d.serializer.config() for d in self._descriptors(self.schema, self.types)]
        news = [d.serializer.config() for d in self._descriptors(new, Types())]
        if any(
            not same_declaration(n, o) and any(same_declaration(n, p) for p in past)
            for n, o, past in zip(news, olds, self.past)
        ):
            self._rollback_refused(data, new, what)
            return
        model = self.model
        restored = []
        for native in (False, True) if isinstance(self.backend, SupportsNativeSnapshot) else (False,):
            new_types = Types()
            try:
                target, how = self._restore(data, new, new_types, native=native)
                handles = self._declare(target, new, new_types)
            except StateMigrationError as e:
                raise PropertyViolation(
                    SCHEMA_EVOLUTION,
                    f"changing {self.schema!r} to {new!r} ({what}) is allowed by the rules, "
                    f"but was refused: {e}",
                ) from e
            self.last = f"changing {self.schema!r} to {new!r} ({what}; {how})"
            self.model = {
                name: {k: self._migrated(name, v, new, new_types) for k, v in entries.items()}
                for name, entries in model.items()
            }
            self._check(target, handles)
            meta = next(m for m in target.snapshot().header.states if m["name"] == "v")
            lineage = meta.get("lineage") or []
            if len(lineage) != self.history + 1 or lineage[-1].get("serializer") != old_cfg:
                raise PropertyViolation(
                    SCHEMA_EVOLUTION,
                    f"after {self.last}: the schema history of state 'v' is {lineage!r}; expected "
                    f"{self.history + 1} entries, the last of them {describe_schema(old_cfg)}",
                )
            restored.append((target, handles, new_types, self.model, self.last))
        keep = (
            data.draw(st.sampled_from(range(len(restored))), label="go on with") if len(restored) > 1 else 0
        )
        self.backend, self.handles, self.types, self.model, self.last = restored[keep]
        self.schema = new
        self.history += 1
        for n, o, past in zip(news, olds, self.past):
            if not same_declaration(n, o):  # a state whose schema did not change gets no history entry
                past.append(o)

    def _rollback_refused(self, data: st.DataObject, new: Schema, what: str) -> None:
        """A schema the history holds, declared again (code rolled back over newer state): refused."""
        self.last = f"changing {self.schema!r} back to {new!r} ({what}), an older schema of its history"
        new_types = Types()
        try:
            target, _ = self._restore(data, new, new_types)
            self._declare(target, new, new_types)
        except StateMigrationError as e:
            if "an older schema of its history" in str(e):
                return  # refused; the current backend is untouched and the run goes on with it
            raise
        raise PropertyViolation(
            SCHEMA_EVOLUTION,
            f"{self.last}: restored, but a schema the state's history holds is refused (a rollback)",
        )

    def _migrated(self, state: str, value: Any, new: Schema, types: Types) -> Any:
        if state == "l":
            return [migrate(self.schema, new, v, types) for v in value]
        if state == "m":
            return {k: None if v is None else migrate(self.schema, new, v, types) for k, v in value.items()}
        return migrate(self.schema, new, value, types)

    @rule(data=st.data())
    def evolve_refused(self, data: st.DataObject) -> None:
        """Restore into a schema the rules refuse: refused, with nothing changed."""
        change = self._draw_change(data, False)
        if change is None:
            return
        what, new = change
        self.last = f"changing {self.schema!r} to {new!r} ({what}), which the rules refuse"
        try:
            # The same classes for records the change leaves alone: a state declared as before is as before.
            target, how = self._restore(data, new, self.types)
        except StateMigrationError:
            return  # declared first: the restore refused, the current backend is untouched
        counts = {n: target.num_entries(n) for n in ("v", "l", "m")}
        olds = self._descriptors(self.schema, self.types)
        for old, desc in zip(olds, self._descriptors(new, self.types)):
            # A map state's values are optional anyway: T | None to T leaves its declaration as it was.
            unchanged = old.serializer.config() == desc.serializer.config()
            try:
                target.get_state(desc)
            except StateMigrationError as e:
                if unchanged:
                    raise PropertyViolation(
                        SCHEMA_EVOLUTION,
                        f"{self.last} ({how}): state {old.name!r}, declared as before, was refused: {e}",
                    ) from e
                continue
            if not unchanged:
                raise PropertyViolation(
                    SCHEMA_EVOLUTION, f"{self.last} ({how}): state {old.name!r} was not refused"
                )
        after = {n: target.num_entries(n) for n in ("v", "l", "m")}
        if after != counts:
            raise PropertyViolation(
                SCHEMA_EVOLUTION,
                f"{self.last} ({how}): the refusals changed the entry counts {counts} to {after}",
            )
        # Nothing changed: the restored backend still reads every entry in the old schema.
        self.backend, self.handles = target, self._declare(target, self.schema, self.types)
        self.last += f" ({how}; then declared as before)"

    def _descriptors(self, schema: Schema, types: Types) -> Sequence[Any]:
        t = types.of(schema)
        return (ValueStateDescriptor("v", t), ListStateDescriptor("l", t), MapStateDescriptor("m", str, t))

    # --- the check ------------------------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self) -> None:
        """Every key of every state reads what the model holds."""
        if hasattr(self, "model"):
            self._check(self.backend, self.handles)

    def _check(self, backend: KeyedStateBackend, handles: tuple[Any, Any, Any]) -> None:
        v, lst, m = handles
        problems = []
        for key in KEYS:
            backend.set_current_key(key)
            got = {"v": v.value(), "l": lst.get(), "m": dict(m.items())}
            want = {
                "v": self.model["v"].get(key),
                "l": self.model["l"].get(key, []),
                "m": self.model["m"].get(key, {}),
            }
            for name in ("v", "l", "m"):
                if not same(got[name], want[name]):
                    problems.append(
                        f"state {name!r}, key {key!r}: backend holds {got[name]!r}, expected {want[name]!r}"
                    )
        if problems:
            raise PropertyViolation(
                SCHEMA_EVOLUTION,
                f"after {self.last} on {self.target.backend_name!r}:\n  - " + "\n  - ".join(problems),
            )
