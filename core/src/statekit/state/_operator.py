"""Operator (non-keyed) state and its redistribution on rescale.

Three modes, as in Flink:

- ``split`` (``get_list_state``): on rescale the lists of all old subtasks are
  concatenated in subtask order and cut into contiguous chunks; new subtask
  ``i`` gets ``total // p`` elements, the first ``total % p`` one more.
- ``union`` (``get_union_list_state``): every new subtask gets every element.
- ``broadcast`` (``get_broadcast_state``): a map that is the same on every
  subtask; new subtask ``i`` gets old subtask ``i % p_old``'s copy.

Elements are serialized one by one, so redistribution moves bytes and never
needs the element types. A state whose element (or broadcast value) type
changed by the rules of schema evolution is migrated when it is declared;
broadcast keys, like keyed state's keys, never change type.
"""

from __future__ import annotations

import enum
import json
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._errors import (
    CorruptSnapshotError,
    IncompatibleSerializerError,
    SerializationError,
    StateMigrationError,
)
from ..serialization._evolution import LossyValueError, describe_schema, resolve_schema, same_layout
from ..serialization._serializers import TypeSerializer, pack_parts, unpack_parts
from ._state import ListStateDescriptor, MapStateDescriptor, list_elements

__all__ = [
    "OperatorStateBackendImpl",
    "OperatorStateData",
    "OperatorStateMode",
    "decode_operator_snapshot",
    "encode_operator_snapshot",
    "redistribute_operator_state",
]

_MAGIC = b"STKOPST1"
_U32 = struct.Struct("<I")


class OperatorStateMode(enum.StrEnum):
    """How an operator state is redistributed on rescale."""

    SPLIT = "split"
    UNION = "union"
    BROADCAST = "broadcast"


@dataclass
class OperatorStateData:
    """One operator state of one subtask, as serialized elements.

    For broadcast state ``elements`` alternates key and value bytes.
    """

    name: str
    mode: OperatorStateMode
    serializers: list[dict[str, Any]]
    elements: list[bytes] = field(default_factory=list)


OperatorSnapshot = dict[str, OperatorStateData]


def encode_operator_snapshot(snapshot: OperatorSnapshot) -> bytes:
    """The bytes of an operator snapshot, with a checksum."""
    meta = [
        {"name": d.name, "mode": d.mode.value, "serializers": d.serializers, "count": len(d.elements)}
        for d in snapshot.values()
    ]
    mj = json.dumps(meta, separators=(",", ":")).encode()
    body = pack_parts([mj, *(pack_parts(d.elements) for d in snapshot.values())])
    return _MAGIC + body + _U32.pack(zlib.crc32(body))


def decode_operator_snapshot(data: bytes, where: str = "operator state") -> OperatorSnapshot:
    """Parse :func:`encode_operator_snapshot` bytes, checking the checksum."""
    if data[:8] != _MAGIC or len(data) < 12:
        raise CorruptSnapshotError(f"{where}: not a statekit operator state snapshot")
    body = data[8:-4]
    if zlib.crc32(body) != _U32.unpack(data[-4:])[0]:
        raise CorruptSnapshotError(f"{where}: checksum mismatch; the file is corrupt")
    try:
        parts = unpack_parts(body)
        meta = json.loads(bytes(parts[0])) if parts else None
        if not isinstance(meta, list) or len(parts) != len(meta) + 1:
            raise ValueError("state list and parts do not match")
        out: OperatorSnapshot = {}
        for m, p in zip(meta, parts[1:]):
            elems = [bytes(e) for e in unpack_parts(p)]
            if len(elems) != m["count"]:
                raise ValueError(f"state {m['name']!r} has {len(elems)} elements, expected {m['count']}")
            out[m["name"]] = OperatorStateData(
                m["name"], OperatorStateMode(m["mode"]), list(m["serializers"]), elems
            )
    except (SerializationError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise CorruptSnapshotError(
            f"{where}: malformed operator state: {type(e).__name__}: {e}"[:500]
        ) from None
    return out


def redistribute_operator_state(
    old: Sequence[OperatorSnapshot | None], new_parallelism: int
) -> list[OperatorSnapshot]:
    """Operator state for ``new_parallelism`` subtasks from the old subtasks' states."""
    if new_parallelism < 1:
        raise ValueError("new parallelism must be >= 1")
    olds = [o or {} for o in old]
    new: list[OperatorSnapshot] = [{} for _ in range(new_parallelism)]
    names: dict[str, OperatorStateData] = {}
    for snap in olds:
        for name, d in snap.items():
            first = names.setdefault(name, d)
            if (first.mode, first.serializers) != (d.mode, d.serializers):
                raise StateMigrationError(
                    f"operator state {name!r} has different modes or serializers across subtasks"
                )
    for name, proto in names.items():
        if proto.mode is OperatorStateMode.BROADCAST:
            for i in range(new_parallelism):
                src = olds[i % len(olds)].get(name) if olds else None
                src = src or proto  # every copy is equal; take any that exists
                new[i][name] = OperatorStateData(name, proto.mode, proto.serializers, list(src.elements))
            continue
        everything = [e for snap in olds for e in (snap[name].elements if name in snap else [])]
        if proto.mode is OperatorStateMode.UNION:
            for i in range(new_parallelism):
                new[i][name] = OperatorStateData(name, proto.mode, proto.serializers, list(everything))
            continue
        base, extra = divmod(len(everything), new_parallelism)
        pos = 0
        for i in range(new_parallelism):
            n = base + (1 if i < extra else 0)
            new[i][name] = OperatorStateData(name, proto.mode, proto.serializers, everything[pos : pos + n])
            pos += n
    return new


class OperatorListState:
    """A list of elements of an operator subtask (split or union mode)."""

    def __init__(self, values: list[Any] | None = None) -> None:
        self._values: list[Any] = values or []

    def get(self) -> list[Any]:
        """The elements (a copy)."""
        return list(self._values)

    def add(self, value: Any) -> None:
        """Append one element (not None)."""
        if value is None:
            raise ValueError("ListState.add(None): list state elements cannot be None")
        self._values.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        """Append elements (none of them None)."""
        self._values.extend(list_elements(values, "ListState.add_all"))

    def update(self, values: Iterable[Any]) -> None:
        """Replace the elements."""
        self._values = list_elements(values, "ListState.update")

    def clear(self) -> None:
        """Remove every element."""
        self._values = []


class BroadcastState:
    """A map that every subtask holds an identical copy of."""

    def __init__(self, entries: dict[Any, Any] | None = None) -> None:
        self._m: dict[Any, Any] = entries or {}

    def get(self, key: Any) -> Any:
        """The value of ``key`` or None."""
        return self._m.get(key)

    def put(self, key: Any, value: Any) -> None:
        """Set ``key``."""
        self._m[key] = value

    def put_all(self, entries: dict[Any, Any]) -> None:
        """Set several keys."""
        self._m.update(entries)

    def remove(self, key: Any) -> None:
        """Remove ``key`` if present."""
        self._m.pop(key, None)

    def contains(self, key: Any) -> bool:
        """Whether ``key`` is present."""
        return key in self._m

    def items(self) -> Iterator[tuple[Any, Any]]:
        """The entries."""
        return iter(list(self._m.items()))

    def keys(self) -> Iterator[Any]:
        """The keys."""
        return iter(list(self._m))

    def values(self) -> Iterator[Any]:
        """The values."""
        return iter(list(self._m.values()))

    def is_empty(self) -> bool:
        """Whether there is no entry."""
        return not self._m

    def clear(self) -> None:
        """Remove every entry."""
        self._m.clear()


def _then(decode: Callable[[bytes], Any], convert: Callable[[Any], Any]) -> Callable[[bytes], Any]:
    return lambda b: convert(decode(b))


class OperatorStateBackendImpl:
    """Operator state of one subtask, in memory (as in Flink, for every backend)."""

    def __init__(self) -> None:
        self._lists: dict[str, tuple[OperatorStateMode, TypeSerializer, OperatorListState]] = {}
        self._maps: dict[str, tuple[TypeSerializer, TypeSerializer, BroadcastState]] = {}
        self._restored: OperatorSnapshot = {}

    def _take(self, name: str, mode: OperatorStateMode, sers: list[TypeSerializer]) -> list[Any] | None:
        """The restored elements of ``name``, decoded (and migrated) by ``sers``, in turn; None if none."""
        d = self._restored.get(name)
        if d is None:
            return None
        if d.mode is not mode:
            raise StateMigrationError(
                f"operator state {name!r} was written in {d.mode.value} mode and is now requested "
                f"in {mode.value} mode; use a new name"
            )
        if len(d.serializers) != len(sers):
            raise StateMigrationError(
                f"operator state {name!r} has {len(d.serializers)} serializers, not {len(sers)}"
            )
        readers: list[Callable[[bytes], Any]] = []
        for i, (s, cfg) in enumerate(zip(sers, d.serializers)):
            if mode is OperatorStateMode.BROADCAST and i == 0:
                if not same_layout(cfg, s.config()):
                    raise IncompatibleSerializerError(
                        f"the keys of broadcast state {name!r} were written as {describe_schema(cfg)} and "
                        f"are declared as {describe_schema(s.config())}; keys never change type: declare "
                        "the original key type"
                    )
                readers.append(s.deserialize)
                continue
            c = resolve_schema(cfg, s)
            if not c.compatible:
                raise IncompatibleSerializerError(
                    f"operator state {name!r} was written as {describe_schema(cfg)} and is declared as "
                    f"{describe_schema(s.config())}: {c.reason}; declare the original type, or rewrite the "
                    "savepoint with statekit.state_processor"
                )
            assert c.migration is not None
            dec, conv = c.migration.decoder.deserialize, c.migration.convert
            readers.append(dec if conv is None else _then(dec, conv))
        n = len(readers)
        try:
            out = [readers[i % n](e) for i, e in enumerate(d.elements)]
        except LossyValueError as e:
            raise StateMigrationError(
                f"operator state {name!r} cannot be migrated: {e}; nothing changed"
            ) from e
        del self._restored[name]
        return out

    def _check_free(self, name: str, kind: str) -> None:
        other = self._maps if kind == "list" else self._lists
        if name in other:
            raise StateMigrationError(
                f"operator state {name!r} is already declared as "
                f"{'broadcast' if kind == 'list' else 'list'} state; use another name"
            )

    def _list(self, d: ListStateDescriptor[Any], mode: OperatorStateMode) -> OperatorListState:
        if d.ttl is not None:
            raise ValueError("operator state does not support TTL")
        self._check_free(d.name, "list")
        have = self._lists.get(d.name)
        if have is not None:
            if have[0] is not mode or have[1] != d.element_serializer:
                raise StateMigrationError(f"operator state {d.name!r} is already declared differently")
            return have[2]
        ser = d.element_serializer
        st = OperatorListState(self._take(d.name, mode, [ser]) or [])
        self._lists[d.name] = (mode, ser, st)
        return st

    def get_list_state(self, descriptor: ListStateDescriptor[Any]) -> OperatorListState:
        """A list redistributed by even split on rescale."""
        return self._list(descriptor, OperatorStateMode.SPLIT)

    def get_union_list_state(self, descriptor: ListStateDescriptor[Any]) -> OperatorListState:
        """A list of which every subtask gets all elements on restore."""
        return self._list(descriptor, OperatorStateMode.UNION)

    def get_broadcast_state(self, descriptor: MapStateDescriptor[Any, Any]) -> BroadcastState:
        """A map every subtask holds a copy of."""
        if descriptor.ttl is not None:
            raise ValueError("operator state does not support TTL")
        self._check_free(descriptor.name, "map")
        ks, vs = descriptor.user_key_serializer, descriptor.user_value_serializer
        have = self._maps.get(descriptor.name)
        if have is not None:
            if (have[0], have[1]) != (ks, vs):
                raise StateMigrationError(
                    f"broadcast state {descriptor.name!r} is already declared differently"
                )
            return have[2]
        elems = self._take(descriptor.name, OperatorStateMode.BROADCAST, [ks, vs]) or []
        m = {elems[i]: elems[i + 1] for i in range(0, len(elems), 2)}
        st = BroadcastState(m)
        self._maps[descriptor.name] = (ks, vs, st)
        return st

    @property
    def state_names(self) -> list[str]:
        """Declared and restored-but-undeclared operator states."""
        return [*self._lists, *self._maps, *self._restored]

    @property
    def undeclared_state_names(self) -> list[str]:
        """Operator states a restore brought that the job has not declared (yet); kept in snapshots."""
        return list(self._restored)

    def snapshot(self) -> OperatorSnapshot:
        """Serialize every operator state now (operator state is small)."""
        out: OperatorSnapshot = {}
        for name, (mode, ser, st) in self._lists.items():
            out[name] = OperatorStateData(name, mode, [ser.config()], [ser.serialize(v) for v in st._values])
        for name, (ks, vs, bst) in self._maps.items():
            elems = [b for k, v in bst._m.items() for b in (ks.serialize(k), vs.serialize(v))]
            out[name] = OperatorStateData(
                name, OperatorStateMode.BROADCAST, [ks.config(), vs.config()], elems
            )
        for name, d in self._restored.items():
            out[name] = d
        return out

    def restore(self, snapshot: OperatorSnapshot) -> None:
        """Take restored state; each state is decoded when first requested."""
        if self._lists or self._maps or self._restored:
            raise StateMigrationError("restore into an operator backend that already holds state")
        self._restored = dict(snapshot)

    def close(self) -> None:
        """Drop all state."""
        self._lists.clear()
        self._maps.clear()
        self._restored.clear()
