"""Tests of the built-in serializers: round trips, identities, copies, errors."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import typing
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekit._errors import IncompatibleSerializerError, SerializationError
from statekit.serialization._serializers import (
    BoolSerializer,
    BytesSerializer,
    DataclassSerializer,
    DictSerializer,
    FloatSerializer,
    IntSerializer,
    ListSerializer,
    NullableSerializer,
    PickleSerializer,
    StrSerializer,
    TupleSerializer,
    TypeSerializer,
    VarTupleSerializer,
    pack_parts,
    serializer_for,
    serializer_from_config,
)

# --------------------------------------------------------------------------------------
# Test types (module level, so their import path resolves for serializer_from_config)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrozenPoint:
    x: int
    y: float
    label: str


@dataclass
class MutableBag:
    name: str
    items: list[int]
    tags: dict[str, float | None]


@dataclass
class MutablePoint:
    x: int
    label: str


@dataclass(frozen=True)
class FrozenWithList:
    key: str
    values: list[int]


@dataclass
class Outer:
    point: FrozenPoint
    bags: list[MutableBag]
    pair: tuple[int, str]
    maybe: bytes | None = None
    derived: int = field(default=0, init=False)


# --------------------------------------------------------------------------------------
# Comparison that treats NaN as equal to NaN and checks exact types and -0.0
# --------------------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        # order is part of the contract
        return list(a.keys()) == list(b.keys()) and all(same(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return bool(a == b)


def assert_same(a: Any, b: Any) -> None:
    assert same(a, b), f"{a!r} != {b!r}"


def roundtrip(ser: TypeSerializer, value: Any) -> None:
    data = ser.serialize(value)
    assert isinstance(data, bytes)
    assert_same(ser.deserialize(data), value)
    assert_same(ser.deserialize(memoryview(data)), value)


def roundtrip_column(ser: TypeSerializer, values: list[Any]) -> None:
    data = ser.encode_column(values)
    assert isinstance(data, bytes)
    assert_same(ser.decode_column(data, len(values)), values)
    assert_same(ser.decode_column(memoryview(data), len(values)), values)


# --------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------

BIG = 2**200
ints = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-BIG, BIG),
    st.sampled_from([0, -1, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 2**64, -(2**64), 2**64 - 1]),
)
floats = st.one_of(st.floats(), st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 5e-324]))
chars = st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr))
texts = st.text(chars, max_size=12)

# (annotation, strategy of its values); keys of dicts must be hashable and NaN-free
PRIMS: list[tuple[Any, st.SearchStrategy[Any]]] = [
    (int, ints),
    (float, floats),
    (bool, st.booleans()),
    (str, texts),
    (bytes, st.binary(max_size=12)),
]
KEY_PRIMS: list[tuple[Any, st.SearchStrategy[Any]]] = [
    (int, ints),
    (str, texts),
    (bytes, st.binary(max_size=8)),
    (bool, st.booleans()),
    (float, st.floats(allow_nan=False)),
]

TypeAndValues = tuple[Any, st.SearchStrategy[Any]]


def _extend(children: st.SearchStrategy[TypeAndValues]) -> st.SearchStrategy[TypeAndValues]:
    keys = st.sampled_from(KEY_PRIMS)
    return st.one_of(
        children.map(lambda c: (c[0] | None, st.one_of(st.none(), c[1]))),
        children.map(lambda c: (list[c[0]], st.lists(c[1], max_size=4))),
        children.map(lambda c: (tuple[c[0], ...], st.lists(c[1], max_size=4).map(tuple))),
        st.tuples(children, children).map(
            lambda ab: (tuple[ab[0][0], ab[1][0]], st.tuples(ab[0][1], ab[1][1]))
        ),
        st.tuples(keys, children).map(
            lambda kv: (dict[kv[0][0], kv[1][0]], st.dictionaries(kv[0][1], kv[1][1], max_size=4))
        ),
    )


types_and_values: st.SearchStrategy[TypeAndValues] = st.recursive(
    st.sampled_from(PRIMS), _extend, max_leaves=6
)


# --------------------------------------------------------------------------------------
# Primitive round trips
# --------------------------------------------------------------------------------------


@given(ints)
def test_int_roundtrip(v: int) -> None:
    roundtrip(IntSerializer(), v)


@given(st.lists(ints, max_size=20))
def test_int_column_roundtrip_mixing_bigints_and_small(values: list[int]) -> None:
    roundtrip_column(IntSerializer(), values)


@pytest.mark.parametrize(
    "values",
    [
        [],
        [0],
        [1, 2**63 - 1, -(2**63)],
        [1, 2**64, -3],  # one big value switches the column to the framed encoding
        [-(2**63) - 1, 5],
        [2**1000, -(2**1000), 0, -1],
    ],
)
def test_int_column_examples(values: list[int]) -> None:
    roundtrip_column(IntSerializer(), values)


def test_int_encoding_is_8_bytes_little_endian_when_it_fits() -> None:
    s = IntSerializer()
    assert s.serialize(1) == b"\x01" + b"\x00" * 7
    assert s.serialize(-(2**63)) == b"\x00" * 7 + b"\x80"
    assert len(s.serialize(2**63)) == 9
    assert s.deserialize(s.serialize(2**63)) == 2**63


@given(floats)
def test_float_roundtrip(v: float) -> None:
    roundtrip(FloatSerializer(), v)


@given(st.lists(floats, max_size=20))
def test_float_column_roundtrip(values: list[float]) -> None:
    roundtrip_column(FloatSerializer(), values)


def test_float_specials() -> None:
    s = FloatSerializer()
    assert math.isnan(s.deserialize(s.serialize(math.nan)))
    assert s.deserialize(s.serialize(math.inf)) == math.inf
    assert s.deserialize(s.serialize(-math.inf)) == -math.inf
    out = s.decode_column(s.encode_column([math.nan, math.inf, -0.0]), 3)
    assert math.isnan(out[0]) and out[1] == math.inf
    assert math.copysign(1.0, out[2]) == -1.0


@given(st.booleans())
def test_bool_roundtrip(v: bool) -> None:
    roundtrip(BoolSerializer(), v)


@given(st.lists(st.booleans(), max_size=20))
def test_bool_column_roundtrip(values: list[bool]) -> None:
    roundtrip_column(BoolSerializer(), values)


@given(texts)
def test_str_roundtrip(v: str) -> None:
    roundtrip(StrSerializer(), v)


@given(st.lists(texts, max_size=12))
def test_str_column_roundtrip(values: list[str]) -> None:
    roundtrip_column(StrSerializer(), values)


@pytest.mark.parametrize(
    "values",
    [
        [],
        [""],
        ["", "", ""],
        ["\ud800"],
        ["\ud800", "\udc00"],  # two lone surrogates that would pair up if merged
        ["a\udfffb", "", "\U0001f600", "\x00", "\u00e9\u0301"],
        ["\ud83d", "\ude00", "\ud83d\ude00"],
    ],
)
def test_str_column_edge_cases(values: list[str]) -> None:
    roundtrip_column(StrSerializer(), values)
    for v in values:
        roundtrip(StrSerializer(), v)


def _spy_columnar(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the str columns split by Arrow (:func:`_ascii_strings` answering, not declining)."""
    from statekit.serialization import _serializers

    calls: list[int] = []
    real = _serializers._ascii_strings

    def spy(lengths: Any, blob: Any, size: int) -> Any:
        out = real(lengths, blob, size)
        if out is not None:
            calls.append(len(lengths))
        return out

    monkeypatch.setattr(_serializers, "_ascii_strings", spy)
    return calls


@given(st.lists(st.text(alphabet=st.characters(max_codepoint=127), max_size=6), min_size=256, max_size=600))
def test_long_ascii_str_columns_split_by_arrow_are_exact(values: list[str]) -> None:
    pytest.importorskip("pyarrow")
    pytest.importorskip("numpy")
    with pytest.MonkeyPatch.context() as mp:
        calls = _spy_columnar(mp)
        roundtrip_column(StrSerializer(), values)
    assert calls and set(calls) == {len(values)}  # the Arrow path ran, and gave back exactly what was written


def test_long_str_columns_not_ascii_or_without_arrow_are_sliced(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyarrow")
    calls = _spy_columnar(monkeypatch)
    mixed = [f"k{i}" for i in range(300)] + ["\u00e9", "\ud800", "\U0001f600"]
    roundtrip_column(StrSerializer(), mixed)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as in a process that never imported it
    roundtrip_column(StrSerializer(), [f"k{i}" for i in range(300)])
    assert calls == []


def test_long_ascii_str_column_whose_lengths_do_not_add_up_is_refused() -> None:
    pytest.importorskip("pyarrow")
    pytest.importorskip("numpy")
    from array import array

    from statekit.serialization._serializers import pack_parts

    # One byte short, one byte over, and lengths whose sum is the text's size modulo 2**32 only.
    for lengths in ([1] * 299 + [2], [1] * 299 + [0], [2**32 - 1, 3] + [1] * 298):
        data = pack_parts([array("I", lengths).tobytes(), b"x" * 300])
        with pytest.raises(SerializationError, match="lengths do not add up"):
            StrSerializer().decode_column(data, 300)


@given(st.binary(max_size=40))
def test_bytes_roundtrip(v: bytes) -> None:
    roundtrip(BytesSerializer(), v)


@given(st.lists(st.binary(max_size=10), max_size=12))
def test_bytes_column_roundtrip(values: list[bytes]) -> None:
    roundtrip_column(BytesSerializer(), values)


def test_bytes_serializer_accepts_buffers_and_returns_bytes() -> None:
    s = BytesSerializer()
    assert s.deserialize(s.serialize(bytearray(b"ab"))) == b"ab"
    assert s.deserialize(s.serialize(memoryview(b"cd"))) == b"cd"
    assert type(s.deserialize(memoryview(b"x"))) is bytes


# --------------------------------------------------------------------------------------
# Composite round trips
# --------------------------------------------------------------------------------------


@given(st.lists(st.one_of(st.none(), ints), max_size=12))
def test_optional_int_column_roundtrip(values: list[int | None]) -> None:
    s = serializer_for(typing.Optional[int])  # noqa: UP045
    assert isinstance(s, NullableSerializer)
    roundtrip_column(s, values)
    for v in values:
        roundtrip(s, v)


@given(st.lists(st.one_of(st.none(), texts), max_size=8))
def test_pep604_optional_is_the_same_serializer(values: list[str | None]) -> None:
    a, b = serializer_for(str | None), serializer_for(typing.Optional[str])  # noqa: UP045
    assert a == b
    roundtrip_column(a, values)


@given(st.lists(st.tuples(ints, texts), max_size=8))
def test_fixed_tuple_roundtrip(values: list[tuple[int, str]]) -> None:
    s = serializer_for(tuple[int, str])
    assert isinstance(s, TupleSerializer)
    roundtrip_column(s, values)
    for v in values:
        roundtrip(s, v)


@given(st.lists(st.lists(floats, max_size=5).map(tuple), max_size=8))
def test_var_tuple_roundtrip(values: list[tuple[float, ...]]) -> None:
    s = serializer_for(tuple[float, ...])
    assert isinstance(s, VarTupleSerializer)
    roundtrip_column(s, values)
    for v in values:
        roundtrip(s, v)


@given(st.lists(st.lists(ints, max_size=5), max_size=8))
def test_list_roundtrip(values: list[list[int]]) -> None:
    s = serializer_for(list[int])
    assert isinstance(s, ListSerializer)
    roundtrip_column(s, values)
    for v in values:
        roundtrip(s, v)


@given(st.lists(st.dictionaries(texts, st.one_of(st.none(), floats), max_size=5), max_size=6))
def test_dict_roundtrip(values: list[dict[str, float | None]]) -> None:
    s = serializer_for(dict[str, float | None])
    assert isinstance(s, DictSerializer)
    roundtrip_column(s, values)
    for v in values:
        roundtrip(s, v)


def test_dict_keeps_insertion_order() -> None:
    s = serializer_for(dict[str, int])
    d = {"z": 1, "a": 2, "m": 3, "b": 4}
    assert list(s.deserialize(s.serialize(d))) == ["z", "a", "m", "b"]
    col = [{"b": 1, "a": 2}, {}, {"y": 0, "x": 1, "w": 2}]
    out = s.decode_column(s.encode_column(col), 3)
    assert [list(d) for d in out] == [["b", "a"], [], ["y", "x", "w"]]


@given(st.data())
def test_nested_combinations_roundtrip(data: st.DataObject) -> None:
    tp, values = data.draw(types_and_values, label="type")
    s = serializer_for(tp)
    column = data.draw(st.lists(values, max_size=5), label="column")
    roundtrip_column(s, column)
    for v in column:
        roundtrip(s, v)
    # the config rebuilds the same serializer
    assert serializer_from_config(s.config()) == s


def test_deeply_nested_example() -> None:
    tp = dict[str, list[tuple[int, tuple[bytes, ...]] | None]]
    s = serializer_for(tp)
    v = {"a": [None, (2**70, (b"", b"x")), (-1, ())], "": [], "b": [None]}
    roundtrip(s, v)
    roundtrip_column(s, [v, {}, v])


# --------------------------------------------------------------------------------------
# Dataclasses
# --------------------------------------------------------------------------------------

points = st.builds(FrozenPoint, ints, floats, texts)
bags = st.builds(
    MutableBag,
    texts,
    st.lists(ints, max_size=4),
    st.dictionaries(texts, st.one_of(st.none(), floats), max_size=3),
)


@given(st.lists(points, max_size=6))
def test_frozen_dataclass_roundtrip(values: list[FrozenPoint]) -> None:
    s = serializer_for(FrozenPoint)
    assert isinstance(s, DataclassSerializer)
    roundtrip_column(s, values)
    for v in values:
        roundtrip(s, v)


@given(st.lists(bags, max_size=6))
def test_mutable_dataclass_roundtrip(values: list[MutableBag]) -> None:
    s = serializer_for(MutableBag)
    roundtrip_column(s, values)
    for v in values:
        roundtrip(s, v)


@given(st.lists(st.builds(Outer, points, st.lists(bags, max_size=2), st.tuples(ints, texts),
                          st.one_of(st.none(), st.binary(max_size=4))), max_size=4))  # fmt: skip
def test_nested_dataclass_roundtrip(values: list[Outer]) -> None:
    s = serializer_for(Outer)
    roundtrip_column(s, values)
    for v in values:
        roundtrip(s, v)


def test_dataclass_field_with_init_false_is_not_stored() -> None:
    s = serializer_for(Outer)
    names = [n for n, _ in s.config()["fields"]]
    assert names == ["point", "bags", "pair", "maybe"]


def test_dataclass_immutable_flag() -> None:
    assert serializer_for(FrozenPoint).immutable is True
    assert serializer_for(MutableBag).immutable is False
    # not frozen: mutable even though every field is immutable
    assert serializer_for(MutablePoint).immutable is False
    # frozen, but a field is a (mutable) list
    assert serializer_for(FrozenWithList).immutable is False


def test_dataclass_serializer_refuses_other_types() -> None:
    s = serializer_for(FrozenPoint)
    with pytest.raises(SerializationError, match="FrozenPoint"):
        s.serialize(MutableBag("n", [], {}))
    with pytest.raises(SerializationError):
        DataclassSerializer(int)


def _make_point_class(with_z: bool, z_type: Any = int) -> type[Any]:
    # Every variant gets the same module and qualname, as a class edited between two
    # runs of a job would.
    fields: list[tuple[str, Any]] = [("x", int), ("y", int)]
    if with_z:
        fields.append(("z", z_type))
    cls = dataclasses.make_dataclass("Point", fields)
    cls.__module__ = __name__
    cls.__qualname__ = "EditedPoint"
    return cls


def test_dataclass_identity_depends_on_fields_not_on_the_class_object() -> None:
    a, b = _make_point_class(False), _make_point_class(False)
    assert a is not b
    assert serializer_for(a).config() == serializer_for(b).config()
    serializer_for(b).check_compatibility(serializer_for(a).config(), "state 'p'")


def test_dataclass_with_added_field_has_a_different_config() -> None:
    old, new = _make_point_class(False), _make_point_class(True)
    assert old.__qualname__ == new.__qualname__
    old_cfg = serializer_for(old).config()
    assert serializer_for(new).config() != old_cfg
    with pytest.raises(IncompatibleSerializerError):
        serializer_for(new).check_compatibility(old_cfg, "state 'p'")


def test_dataclass_with_retyped_field_has_a_different_config() -> None:
    a, b = _make_point_class(True, int), _make_point_class(True, str)
    assert serializer_for(a).config() != serializer_for(b).config()


# --------------------------------------------------------------------------------------
# Pickle
# --------------------------------------------------------------------------------------

picklable = st.recursive(
    st.one_of(st.none(), ints, floats, texts, st.binary(max_size=8), st.booleans()),
    lambda c: st.one_of(
        st.lists(c, max_size=3),
        st.lists(c, max_size=3).map(tuple),
        st.dictionaries(st.one_of(texts, ints), c, max_size=3),
        st.frozensets(st.one_of(texts, ints), max_size=3),
    ),
    max_leaves=8,
)


@given(st.lists(picklable, max_size=6))
def test_pickle_roundtrip(values: list[Any]) -> None:
    s = PickleSerializer()
    roundtrip_column(s, values)
    for v in values:
        roundtrip(s, v)


def test_pickle_handles_sets_and_dataclasses() -> None:
    s = PickleSerializer()
    for v in ({1, 2, 3}, FrozenPoint(1, 2.0, "x"), MutableBag("b", [1], {"k": None})):
        assert s.deserialize(s.serialize(v)) == v


def test_pickle_refuses_unpicklable_with_serialization_error() -> None:
    with pytest.raises(SerializationError):
        PickleSerializer().serialize(lambda: None)
    with pytest.raises(SerializationError):
        PickleSerializer().encode_column([1, lambda: None])


# --------------------------------------------------------------------------------------
# serializer_for
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tp", "cls"),
    [
        (int, IntSerializer),
        (float, FloatSerializer),
        (bool, BoolSerializer),
        (str, StrSerializer),
        (bytes, BytesSerializer),
        (typing.Optional[int], NullableSerializer),  # noqa: UP045
        (int | None, NullableSerializer),
        (typing.Union[None, str], NullableSerializer),  # noqa: UP007
        (tuple[int, str], TupleSerializer),
        (tuple[int], TupleSerializer),
        (tuple[int, ...], VarTupleSerializer),
        (list[int], ListSerializer),
        (typing.List[int], ListSerializer),  # noqa: UP006
        (dict[str, int], DictSerializer),
        (typing.Dict[str, int], DictSerializer),  # noqa: UP006
        (FrozenPoint, DataclassSerializer),
        (Outer, DataclassSerializer),
    ],
)
def test_serializer_for_supported_annotations(tp: Any, cls: type[TypeSerializer]) -> None:
    assert type(serializer_for(tp)) is cls


def test_serializer_for_passes_serializers_through() -> None:
    p = PickleSerializer()
    assert serializer_for(p) is p


@pytest.mark.parametrize(
    ("tp", "name"),
    [
        (set[int], "set[int]"),
        (frozenset[str], "frozenset[str]"),
        (object, "object"),
        (complex, "complex"),
        (typing.Any, "Any"),
        (int | str, "int | str"),
        (int | str | None, "str"),
        (list, "list"),
        (dict, "dict"),
        (tuple, "tuple"),
        (list[set[int]], "set[int]"),  # the unsupported inner type is named
        (dict[str, object], "object"),
    ],
)
def test_serializer_for_unsupported_types_names_the_type(tp: Any, name: str) -> None:
    with pytest.raises(SerializationError) as ei:
        serializer_for(tp)
    msg = str(ei.value)
    assert name in msg
    assert "PickleSerializer" in msg  # tells the user the way out


def test_serializer_for_dataclass_with_unsupported_field() -> None:
    @dataclass
    class HasSet:
        s: set[int]

    with pytest.raises(SerializationError, match=r"set\[int\]"):
        serializer_for(HasSet)


# --------------------------------------------------------------------------------------
# Identities: config() / describe(), compatibility
# --------------------------------------------------------------------------------------

INT_CFG = {"id": "int", "v": 1}
STR_CFG = {"id": "str", "v": 1}


@pytest.mark.parametrize(
    ("tp", "cfg", "desc"),
    [
        (int, INT_CFG, "int"),
        (float, {"id": "float", "v": 1}, "float"),
        (bool, {"id": "bool", "v": 1}, "bool"),
        (str, STR_CFG, "str"),
        (bytes, {"id": "bytes", "v": 1}, "bytes"),
        (int | None, {"id": "optional", "v": 1, "args": [INT_CFG]}, "optional<int>"),
        (list[int], {"id": "list", "v": 1, "args": [INT_CFG]}, "list<int>"),
        (tuple[int, ...], {"id": "tuple...", "v": 1, "args": [INT_CFG]}, "tuple...<int>"),
        (tuple[int, str], {"id": "tuple", "v": 1, "args": [INT_CFG, STR_CFG]}, "tuple<int,str>"),
        (
            dict[str, list[int]],
            {"id": "dict", "v": 1, "args": [STR_CFG, {"id": "list", "v": 1, "args": [INT_CFG]}]},
            "dict<str,list<int>>",
        ),
    ],
)
def test_config_and_describe_are_stable(tp: Any, cfg: dict[str, Any], desc: str) -> None:
    s = serializer_for(tp)
    assert s.config() == cfg
    assert s.describe() == desc
    # identical when asked again, and JSON-able as it goes into snapshots
    assert serializer_for(tp).config() == cfg
    assert json.loads(json.dumps(s.config())) == cfg
    assert desc in repr(s)


def test_pickle_config() -> None:
    assert PickleSerializer().config() == {"id": "pickle", "v": 1}
    assert PickleSerializer().describe() == "pickle"


def test_dataclass_config_is_stable() -> None:
    s = serializer_for(FrozenPoint)
    path = f"{FrozenPoint.__module__}:FrozenPoint"
    assert s.config() == {
        "id": "dataclass",
        "v": 1,
        "class": path,
        "fields": [["x", INT_CFG], ["y", {"id": "float", "v": 1}], ["label", STR_CFG]],
    }
    assert s.describe() == f"dataclass<{path}>"


def test_serializer_equality_and_hash_follow_config() -> None:
    assert serializer_for(list[int]) == ListSerializer(IntSerializer())
    assert hash(serializer_for(list[int])) == hash(ListSerializer(IntSerializer()))
    assert serializer_for(list[int]) != serializer_for(list[str])
    assert serializer_for(tuple[int, ...]) != serializer_for(list[int])


def test_check_compatibility_accepts_same_config() -> None:
    s = serializer_for(dict[str, list[int]])
    s.check_compatibility(serializer_for(dict[str, list[int]]).config(), "state 'x'")


@pytest.mark.parametrize(
    ("declared", "stored"),
    [
        (int, str),
        (list[int], list[str]),
        (int | None, int),
        (tuple[int, ...], list[int]),
        (dict[str, int], dict[str, float]),
    ],
)
def test_check_compatibility_names_both_serializers(declared: Any, stored: Any) -> None:
    s = serializer_for(declared)
    stored_cfg = serializer_for(stored).config()
    with pytest.raises(IncompatibleSerializerError) as ei:
        s.check_compatibility(stored_cfg, "state 'counts'")
    msg = str(ei.value)
    assert "state 'counts'" in msg
    assert serializer_for(stored).describe() in msg
    assert s.describe() in msg


def test_check_compatibility_detects_version_bump() -> None:
    with pytest.raises(IncompatibleSerializerError):
        IntSerializer().check_compatibility({"id": "int", "v": 2}, "key")


# --------------------------------------------------------------------------------------
# serializer_from_config
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tp",
    [
        int,
        float,
        bool,
        str,
        bytes,
        int | None,
        list[str],
        tuple[int, ...],
        tuple[int, str, bytes],
        dict[str, list[float] | None],
        FrozenPoint,
        Outer,
    ],
)
def test_serializer_from_config_roundtrip(tp: Any) -> None:
    s = serializer_for(tp)
    rebuilt = serializer_from_config(s.config())
    assert rebuilt == s
    assert type(rebuilt) is type(s)
    assert rebuilt.config() == s.config()


def test_serializer_from_config_of_pickle() -> None:
    assert isinstance(serializer_from_config({"id": "pickle", "v": 1}), PickleSerializer)


def test_serializer_from_config_rebuilt_serializer_reads_the_bytes() -> None:
    s = serializer_for(list[tuple[int, str] | None])
    values = [[None, (1, "a")], [], [(2**70, "\ud800")]]
    data = s.encode_column(values)
    assert serializer_from_config(s.config()).decode_column(data, 3) == values


@pytest.mark.parametrize(
    "cfg", [{"id": "myapp.point", "v": 1}, {}, {"id": "list", "v": 1, "args": [{"id": "nope"}]}]
)
def test_serializer_from_config_unknown_id(cfg: dict[str, Any]) -> None:
    with pytest.raises(SerializationError):
        serializer_from_config(cfg)


def test_serializer_from_config_unimportable_dataclass_is_a_serialization_error() -> None:
    # Tools that read snapshots without the job (CLI) hit this when the class moved.
    cfg = {"id": "dataclass", "v": 1, "class": "statekit_no_such_module:Gone", "fields": []}
    with pytest.raises(SerializationError, match="statekit_no_such_module"):
        serializer_from_config(cfg)


# --------------------------------------------------------------------------------------
# copy()
# --------------------------------------------------------------------------------------


def test_copy_of_immutable_values_may_share() -> None:
    cases: list[tuple[TypeSerializer, Any]] = [
        (IntSerializer(), 2**80),
        (StrSerializer(), "x"),
        (serializer_for(FrozenPoint), FrozenPoint(1, 2.0, "a")),
        (serializer_for(tuple[int, str]), (1, "a")),
    ]
    for s, v in cases:
        assert s.copy(v) is v


def test_copy_of_list_is_deep() -> None:
    s = serializer_for(list[list[int]])
    orig = [[1, 2], [3]]
    c = s.copy(orig)
    assert c == orig
    c[0].append(99)
    c.append([7])
    assert orig == [[1, 2], [3]]


def test_copy_of_dict_is_deep() -> None:
    s = serializer_for(dict[str, list[int]])
    orig = {"a": [1], "b": []}
    c = s.copy(orig)
    c["a"].append(2)
    c["c"] = [0]
    assert orig == {"a": [1], "b": []}
    assert list(c) == ["a", "b", "c"]


def test_copy_of_tuple_with_mutable_fields_is_deep() -> None:
    s = serializer_for(tuple[str, list[int]])
    orig = ("k", [1, 2])
    c = s.copy(orig)
    c[1].append(3)
    assert orig == ("k", [1, 2])


def test_copy_of_var_tuple_of_lists_is_deep() -> None:
    s = serializer_for(tuple[list[int], ...])
    orig = ([1], [2])
    c = s.copy(orig)
    assert type(c) is tuple
    c[0].append(5)
    assert orig == ([1], [2])


def test_copy_of_optional_mutable_is_deep() -> None:
    s = serializer_for(list[int] | None)
    assert s.copy(None) is None
    orig = [1]
    c = s.copy(orig)
    c.append(2)
    assert orig == [1]


def test_copy_of_mutable_dataclass_is_deep() -> None:
    s = serializer_for(MutableBag)
    orig = MutableBag("n", [1, 2], {"t": 1.5})
    c = s.copy(orig)
    assert c == orig and c is not orig
    c.items.append(3)
    c.tags["u"] = None
    c.name = "changed"
    assert orig == MutableBag("n", [1, 2], {"t": 1.5})


def test_copy_of_non_frozen_dataclass_is_a_new_object() -> None:
    s = serializer_for(MutablePoint)
    orig = MutablePoint(1, "a")
    c = s.copy(orig)
    assert c == orig and c is not orig
    c.x = 2
    assert orig == MutablePoint(1, "a")


def test_copy_of_frozen_dataclass_with_list_is_deep() -> None:
    s = serializer_for(FrozenWithList)
    orig = FrozenWithList("k", [1])
    c = s.copy(orig)
    c.values.append(2)
    assert orig.values == [1]


def test_copy_of_nested_dataclass_is_deep() -> None:
    s = serializer_for(Outer)
    orig = Outer(FrozenPoint(1, 1.0, "p"), [MutableBag("b", [1], {})], (1, "x"))
    c = s.copy(orig)
    c.bags[0].items.append(2)
    c.bags.append(MutableBag("c", [], {}))
    assert orig.bags == [MutableBag("b", [1], {})]


def test_copy_with_pickle_is_deep() -> None:
    s = PickleSerializer()
    orig = {"a": [1, {2, 3}]}
    c = s.copy(orig)
    c["a"][1].add(4)
    assert orig == {"a": [1, {2, 3}]}


@given(st.data())
def test_copy_equals_original_for_any_type(data: st.DataObject) -> None:
    tp, values = data.draw(types_and_values, label="type")
    s = serializer_for(tp)
    v = data.draw(values, label="value")
    assert_same(s.copy(v), v)


# --------------------------------------------------------------------------------------
# Errors: unserializable values, malformed bytes
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ser", "bad"),
    [
        (IntSerializer(), "12x"),
        (IntSerializer(), None),
        (FloatSerializer(), "1.5"),
        (StrSerializer(), 5),
        (BytesSerializer(), "text"),
        (serializer_for(tuple[int, int]), (1, 2, 3)),
        (serializer_for(list[int]), [1, "x"]),
    ],
)
def test_unserializable_values_raise_serialization_error(ser: TypeSerializer, bad: Any) -> None:
    with pytest.raises(SerializationError):
        ser.encode_column([bad])
    with pytest.raises(SerializationError):
        ser.serialize(bad)


def test_int_serializer_does_not_truncate_floats() -> None:
    # encode_column refuses 3.7; serialize() must not silently store 3 instead (the
    # single-value path is the one key groups and per-entry backends use).
    s = IntSerializer()
    with pytest.raises(SerializationError):
        s.encode_column([3.7])
    with pytest.raises(SerializationError):
        s.serialize(3.7)


COLUMN_CASES: list[tuple[str, TypeSerializer, list[Any]]] = [
    ("int", IntSerializer(), [1, -2, 3]),
    ("int-big", IntSerializer(), [1, 2**70, -3]),
    ("float", FloatSerializer(), [1.5, math.inf, -0.0]),
    ("bool", BoolSerializer(), [True, False, True]),
    ("str", StrSerializer(), ["ab", "", "\u00e9\ud800"]),
    ("bytes", BytesSerializer(), [b"ab", b"", b"\x00"]),
    ("optional", serializer_for(int | None), [1, None, 2]),
    ("list", serializer_for(list[str]), [["a"], [], ["b", "c"]]),
    ("var-tuple", serializer_for(tuple[int, ...]), [(1,), (), (2, 3)]),
    ("tuple", serializer_for(tuple[int, str]), [(1, "a"), (2, "b"), (3, "")]),
    ("dict", serializer_for(dict[str, int]), [{"a": 1}, {}, {"b": 2, "c": 3}]),
    ("dataclass", serializer_for(FrozenPoint), [FrozenPoint(1, 2.0, "x")] * 3),
    ("pickle", PickleSerializer(), [1, "a", None]),
]


def _malformations(data: bytes) -> list[tuple[str, bytes]]:
    return [
        ("empty", b""),
        ("one byte", data[:1]),
        ("minus last byte", data[:-1]),
        ("half", data[: len(data) // 2]),
        ("extra byte", data + b"\x07"),
        ("garbage", b"\xff\xfe\xfd\xfc\xfb\xfa\xf9"),
        # well-framed, but not what this serializer wrote
        ("zero frames", pack_parts([])),
        ("one odd frame", pack_parts([b"\x01\x02\x03"])),
        ("four odd frames", pack_parts([b"\x01", b"\x02\x03", b"\x04\x05\x06", b""])),
    ]


@pytest.mark.parametrize(("name", "ser", "values"), COLUMN_CASES, ids=[c[0] for c in COLUMN_CASES])
def test_valid_column_roundtrips(name: str, ser: TypeSerializer, values: list[Any]) -> None:
    roundtrip_column(ser, values)


@pytest.mark.parametrize(("name", "ser", "values"), COLUMN_CASES, ids=[c[0] for c in COLUMN_CASES])
def test_malformed_column_bytes_raise_serialization_error(
    name: str, ser: TypeSerializer, values: list[Any]
) -> None:
    data = ser.encode_column(values)
    failures = []
    for what, bad in _malformations(data):
        try:
            out = ser.decode_column(bad, len(values))
        except SerializationError:
            continue
        except Exception as e:  # noqa: BLE001 - the point of the test
            failures.append(f"{what} {bad!r}: {type(e).__name__}: {e}")
        else:
            failures.append(f"{what} {bad!r}: decoded without error to {out!r}")
    assert not failures, f"{ser.describe()}: " + "; ".join(failures)


@pytest.mark.parametrize(("name", "ser", "values"), COLUMN_CASES, ids=[c[0] for c in COLUMN_CASES])
def test_decode_column_with_wrong_count_raises_serialization_error(
    name: str, ser: TypeSerializer, values: list[Any]
) -> None:
    data = ser.encode_column(values)
    for count in (0, len(values) - 1, len(values) + 1):
        with pytest.raises(SerializationError):
            ser.decode_column(data, count)


def _u32s(*xs: int) -> bytes:
    return b"".join(x.to_bytes(4, "little") for x in xs)


@pytest.mark.parametrize(
    ("what", "data"),
    [
        ("lengths longer than the text", pack_parts([_u32s(5), b"ab"])),
        ("lengths shorter than the text", pack_parts([_u32s(1), b"abc"])),
        ("invalid utf-8", pack_parts([_u32s(2), b"\xff\xfe"])),
        ("lengths not a multiple of 4", pack_parts([b"\x01\x00", b"a"])),
    ],
    ids=["lengths-too-long", "lengths-too-short", "invalid-utf8", "ragged-lengths"],
)
def test_str_column_inconsistent_frames_raise_serialization_error(what: str, data: bytes) -> None:
    with pytest.raises(SerializationError):
        StrSerializer().decode_column(data, 1)
