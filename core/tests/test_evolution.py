"""Schema evolution of serializer configs: which old schemas read as which declared types, and how."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from statekit.errors import SerializationError
from statekit.serialization._evolution import (
    FORMER_NAMES,
    LossyValueError,
    RecordLayoutSerializer,
    describe_schema,
    layout_serializer,
    record_converter,
    resolve_schema,
    same_layout,
)
from statekit.serializers import serializer_for, serializer_from_config


def migrate(old_type: Any, new_type: Any, values: list[Any]) -> list[Any]:
    """``values`` written as ``old_type``, read back as ``new_type`` through the migration."""
    old = serializer_for(old_type)
    data = old.encode_column(values)
    c = resolve_schema(old.config(), serializer_for(new_type))
    assert c.compatible, c.reason
    assert c.migration is not None
    decoded = c.migration.decoder.decode_column(data, len(values))
    conv = c.migration.convert
    return decoded if conv is None else [conv(v) for v in decoded]


def refusal(old_type: Any, new_type: Any) -> str:
    c = resolve_schema(serializer_for(old_type).config(), serializer_for(new_type))
    assert not c.compatible
    assert c.migration is None
    return c.reason


def named(cls: type, qualname: str = "Visit") -> type:
    """``cls`` under one class path, as an old and a new version of one class in two runs."""
    cls.__qualname__ = qualname
    cls.__module__ = "app.model"
    return cls


# --- primitives and containers --------------------------------------------------------------


def test_equal_configs_are_identical() -> None:
    c = resolve_schema(serializer_for(dict[str, list[int]]).config(), serializer_for(dict[str, list[int]]))
    assert c.kind == "identical"
    assert c.migration is not None and c.migration.convert is None


@pytest.mark.parametrize(
    ("old", "new", "values", "expected"),
    [
        (int, float, [1, -2, 2**53], [1.0, -2.0, float(2**53)]),
        (int, int | None, [1, 2], [1, 2]),
        (int, float | None, [3], [3.0]),
        (int | None, float | None, [None, 4], [None, 4.0]),
        (list[int], list[float], [[1, 2], []], [[1.0, 2.0], []]),
        (list[int], list[int | None], [[1]], [[1]]),
        (tuple[int, ...], tuple[float, ...], [(1, 2)], [(1.0, 2.0)]),
        (dict[str, int], dict[str, float | None], [{"a": 1}, {}], [{"a": 1.0}, {}]),
        (tuple[int, str], tuple[float, str | None], [(1, "x")], [(1.0, "x")]),
        (list[dict[str, int]], list[dict[str, float]], [[{"a": 1}], []], [[{"a": 1.0}], []]),
    ],
)
def test_widenings_migrate_each_value(old: Any, new: Any, values: list[Any], expected: list[Any]) -> None:
    got = migrate(old, new, values)
    assert got == expected
    assert [type(x) for x in got] == [type(x) for x in expected]


def test_int_to_float_refuses_a_value_no_float_holds_exactly() -> None:
    with pytest.raises(LossyValueError, match=str(2**53 + 1)):
        migrate(int, float, [1, 2**53 + 1])
    with pytest.raises(LossyValueError, match="too large"):
        migrate(int, float, [10**400])


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        (float, int, "narrowing"),
        (int | None, int, "narrowing"),
        (list[int | None], list[int], "narrowing"),
        (str, int, "another type"),
        (int, str, "another type"),
        (bool, int, "another type"),
        (list[int], tuple[int, ...], "another type"),
        (tuple[int, str], tuple[int, str, int], "a tuple of 2 fields cannot become one of 3"),
        (dict[int, str], dict[float, str], "dict keys never change type"),
        (dict[str, float], dict[str, int], "narrowing"),
    ],
)
def test_narrowing_and_other_types_are_refused_naming_the_place(old: Any, new: Any, words: str) -> None:
    assert words in refusal(old, new)


def test_a_refusal_names_the_place_in_the_type() -> None:
    assert refusal(list[dict[str, float]], list[dict[str, int]]).startswith(
        "element.value: float cannot become int"
    )


def test_a_custom_serializer_is_identical_or_refused() -> None:
    from statekit.serializers import PickleSerializer

    assert resolve_schema(PickleSerializer().config(), PickleSerializer()).kind == "identical"
    c = resolve_schema({"id": "myapp.point", "v": 1}, PickleSerializer())
    assert not c.compatible and "another type" in c.reason


# --- dataclasses --------------------------------------------------------------------------


@named
@dataclasses.dataclass
class V1:
    count: int
    first_seen: float
    tags: list[int]


def test_a_dataclass_gains_a_field_with_its_default_loses_one_and_reorders() -> None:
    @named
    @dataclasses.dataclass
    class V2:
        tags: list[float]
        count: int
        region: str = "eu"
        seen: list[int] = dataclasses.field(default_factory=list)

    c = resolve_schema(serializer_for(V1).config(), serializer_for(V2))
    assert c.kind == "migrate" and c.migration is not None
    assert set(c.migration.changes) >= {
        "Visit: field 'region' added with its default",
        "Visit: field 'seen' added with its default",
        "Visit: field 'first_seen' removed (its values are dropped)",
        "Visit: fields reordered",
        "Visit.tags.element: int → float",
    }
    assert migrate(V1, V2, [V1(3, 1.5, [1])]) == [V2([1.0], 3)]


def test_a_field_renamed_with_its_former_name_keeps_its_values() -> None:
    @named
    @dataclasses.dataclass
    class V2:
        visits: float = dataclasses.field(metadata={FORMER_NAMES: ("count",)})
        first_seen: float = 0.0
        tags: list[int] = dataclasses.field(default_factory=list)

    c = resolve_schema(serializer_for(V1).config(), serializer_for(V2))
    assert c.migration is not None and "Visit: field 'count' renamed to 'visits'" in c.migration.changes
    assert migrate(V1, V2, [V1(3, 1.5, [1])]) == [V2(3.0, 1.5, [1])]


def test_a_former_name_may_be_a_single_str() -> None:
    @named
    @dataclasses.dataclass
    class V2:
        n: int = dataclasses.field(metadata={FORMER_NAMES: "count"})

    assert migrate(V1, V2, [V1(7, 0.0, [])]) == [V2(7)]


def test_a_new_field_without_a_default_is_refused() -> None:
    @named
    @dataclasses.dataclass
    class V2:
        count: int
        region: str

    reason = refusal(V1, V2)
    assert reason.startswith("Visit.region: the field is new and has no default")


def test_a_field_matching_two_old_fields_is_refused() -> None:
    @named
    @dataclasses.dataclass
    class V2:
        count: int = dataclasses.field(metadata={FORMER_NAMES: ("first_seen",)})

    assert "matches the old fields ['count', 'first_seen']" in refusal(V1, V2)


def test_an_old_field_feeding_two_new_fields_is_refused() -> None:
    @named
    @dataclasses.dataclass
    class V2:
        a: int = dataclasses.field(default=0, metadata={FORMER_NAMES: ("count",)})
        b: int = dataclasses.field(default=0, metadata={FORMER_NAMES: ("count",)})

    assert "old field 'count' would feed both 'a' and 'b'" in refusal(V1, V2)


def test_a_retyped_field_is_refused_naming_it() -> None:
    @named
    @dataclasses.dataclass
    class V2:
        count: str
        first_seen: float
        tags: list[int]

    assert refusal(V1, V2).startswith("Visit.count: int cannot become str")


def test_a_moved_class_with_the_same_fields_reads_the_bytes_as_they_are() -> None:
    @named
    @dataclasses.dataclass
    class Moved:
        count: int
        first_seen: float
        tags: list[int]

    Moved.__module__ = "app.other"
    c = resolve_schema(serializer_for(V1).config(), serializer_for(Moved))
    assert c.kind == "migrate" and c.migration is not None
    assert c.migration.convert is None  # the same bytes: decoded as the new class directly
    assert c.migration.changes == ("dataclass app.model:Visit is now app.other:Visit",)
    assert migrate(V1, Moved, [V1(1, 2.0, [3])]) == [Moved(1, 2.0, [3])]


def test_nested_dataclasses_evolve_inside_containers() -> None:
    @named
    @dataclasses.dataclass
    class Inner2:
        x: float
        y: int = 0

    @named
    @dataclasses.dataclass
    class Inner1:
        x: int

    Inner1.__qualname__ = Inner2.__qualname__ = "Point"
    out = migrate(dict[str, list[Inner1]], dict[str, list[Inner2] | None], [{"a": [Inner1(1)]}])
    assert out == [{"a": [Inner2(1.0, 0)]}]


def test_a_malformed_former_names_declaration_is_an_error() -> None:
    @named
    @dataclasses.dataclass
    class V2:
        count: int = dataclasses.field(metadata={FORMER_NAMES: (1,)})

    with pytest.raises(SerializationError, match="former_names"):
        resolve_schema(serializer_for(V1).config(), serializer_for(V2))


# --- reading old bytes without their classes -----------------------------------------------------


def test_layout_serializer_reads_and_writes_the_exact_bytes_without_the_class() -> None:
    s = serializer_for(list[V1])
    values = [[V1(1, 2.0, [3])], []]
    data = s.encode_column(values)
    cfg = dict(s.config(), args=[dict(s.config()["args"][0], **{"class": "gone.module:Visit"})])
    layout = layout_serializer(cfg)
    rows = layout.decode_column(data, 2)
    assert rows == [[(1, 2.0, [3])], []]
    assert layout.encode_column(rows) == data
    assert layout.config() == cfg
    element = layout_serializer(cfg["args"][0])
    assert isinstance(element, RecordLayoutSerializer) and element.names == ["count", "first_seen", "tags"]


def test_record_converter_turns_dataclass_tuples_into_dicts() -> None:
    cfg = serializer_for(dict[str, list[V1]]).config()
    conv = record_converter(cfg)
    assert conv is not None
    assert conv({"k": [(1, 2.0, [3])]}) == {"k": [{"count": 1, "first_seen": 2.0, "tags": [3]}]}
    assert record_converter(serializer_for(list[int]).config()) is None


def test_serializer_from_config_refuses_a_class_whose_fields_changed() -> None:
    cfg = serializer_for(V1).config()
    cfg = dict(cfg, **{"class": f"{__name__}:V1Current"})
    with pytest.raises(SerializationError, match="has changed since the snapshot"):
        serializer_from_config(cfg)


@dataclasses.dataclass
class V1Current:
    count: int


def test_same_layout_ignores_only_class_paths() -> None:
    a = serializer_for(V1).config()
    assert same_layout(a, dict(a, **{"class": "x:Y"}))
    assert not same_layout(a, dict(a, fields=a["fields"][:2]))


def test_describe_schema_shows_the_fields() -> None:
    assert describe_schema(serializer_for(list[V1] | None).config()) == (
        "optional<list<Visit{count: int, first_seen: float, tags: list<int>}>>"
    )
    assert describe_schema(serializer_for(tuple[int, ...]).config()) == "tuple<int,...>"
