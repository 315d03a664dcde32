"""Finding one key in a section's column bytes without decoding them (``SectionLookup``)."""

from __future__ import annotations

import struct

import pytest

from statekit import VOID_NAMESPACE
from statekit.errors import SerializationError
from statekit.serialization._lookup import column_finder, column_reader
from statekit.serializers import FloatSerializer, IntSerializer, StrSerializer, TupleSerializer
from statekit.snapshot_codec import Section, SectionLookup
from statekit.snapshots._snapshot import encode_namespaces


@pytest.fixture
def arrow() -> None:
    """numpy loaded (str columns are indexed by it; it is never imported for that)."""
    pytest.importorskip("numpy")


def test_int_keys_are_found_at_their_position_and_only_there():
    keys = [0, 1, -1, 2**63 - 1, -(2**63), 256, 1 << 40]
    find = column_finder(IntSerializer(), IntSerializer().encode_column(keys), len(keys))
    assert find is not None
    assert [find(k) for k in keys] == list(range(len(keys)))
    assert find(True) == 1  # True == 1 as a dict key: the same entry
    assert find(5) == -1 and find(1.0) == -1 and find("1") == -1  # floats and strs are never int keys
    # The bytes of a value that occur across two stored values (the high half of one, the low of the next).
    a, b = 0x0102030405060708, 0x1112131415161718
    pair = column_finder(IntSerializer(), IntSerializer().encode_column([a, b]), 2)
    assert pair is not None
    straddle = struct.unpack("<q", struct.pack("<q", a)[4:] + struct.pack("<q", b)[:4])[0]
    assert pair(straddle) == -1 and pair(b) == 1


def test_ints_beyond_64_bits_are_not_searched():
    data = IntSerializer().encode_column([1, 1 << 70])
    assert column_finder(IntSerializer(), data, 2) is None


@pytest.mark.usefixtures("arrow")
def test_ascii_str_keys_are_found_exactly_not_as_prefixes():
    keys = ["k1", "k10", "k100", "", "/a/b?c=1", "k"]
    find = column_finder(StrSerializer(), StrSerializer().encode_column(keys), len(keys))
    assert find is not None
    assert [find(k) for k in keys] == list(range(len(keys)))
    assert find("k1000") == -1 and find("1") == -1 and find("K1") == -1
    assert find("\u00e9") == -1 and find("k\udc80") == -1  # beyond ASCII: in no ASCII column
    assert find(1) == -1 and find(b"k1") == -1


@pytest.mark.usefixtures("arrow")
def test_str_columns_beyond_ascii_are_not_searched():
    keys = ["a", "\u00e9t\u00e9"]
    assert column_finder(StrSerializer(), StrSerializer().encode_column(keys), 2) is None


def test_other_key_types_are_not_searched():
    ser = TupleSerializer((StrSerializer(), IntSerializer()))
    assert column_finder(ser, ser.encode_column([("a", 1)]), 1) is None


@pytest.mark.usefixtures("arrow")
def test_a_malformed_column_is_an_error_not_a_miss():
    data = StrSerializer().encode_column(["a", "bb"])
    with pytest.raises(SerializationError):
        column_finder(StrSerializer(), data, 3)
    with pytest.raises(SerializationError):
        column_finder(IntSerializer(), IntSerializer().encode_column([1, 2]), 3)


def section(
    keys: list[int], values: list[float], *, removal: bool = False, namespaces: bytes = b"\x00"
) -> Section:
    return Section(
        "s",
        len(keys),
        IntSerializer().encode_column(keys),
        namespaces,
        b"" if removal else FloatSerializer().encode_column(values),
        removal=removal,
    )


def test_section_lookup_finds_a_key_and_decodes_its_value():
    look = SectionLookup.of(section([5, 9, 2], [0.5, 9.5, 2.5]), IntSerializer(), FloatSerializer())
    assert look is not None and not look.removal
    assert look.index(9) == 1 and look.value(1) == 9.5
    assert look.index(3) == -1
    gone = SectionLookup.of(section([9], [], removal=True), IntSerializer(), FloatSerializer())
    assert gone is not None and gone.removal and gone.index(9) == 0


def test_sections_with_namespaces_get_no_lookup():
    ns = encode_namespaces(["w1", VOID_NAMESPACE], StrSerializer(), VOID_NAMESPACE, "s")
    sec = section([1, 2], [1.0, 2.0], namespaces=ns)
    assert SectionLookup.of(sec, IntSerializer(), FloatSerializer()) is None


@pytest.mark.parametrize(
    ("serializer", "values"),
    [
        (IntSerializer(), [3, -(2**63), 2**63 - 1]),
        (IntSerializer(), [1, 1 << 80]),  # framed one by one: decoded whole
        (FloatSerializer(), [0.5, float("inf"), -0.0]),
        (StrSerializer(), ["a", "\u00e9", ""]),
    ],
)
def test_a_value_is_read_as_the_column_decodes_it(serializer, values):
    read = column_reader(serializer, serializer.encode_column(values), len(values))
    assert [read(i) for i in range(len(values))] == serializer.decode_column(
        serializer.encode_column(values), len(values)
    )


def test_a_fixed_width_column_of_the_wrong_length_is_an_error():
    with pytest.raises(SerializationError):
        column_reader(IntSerializer(), IntSerializer().encode_column([1, 2]), 3)
    with pytest.raises(SerializationError):
        column_reader(FloatSerializer(), FloatSerializer().encode_column([1.0]), 2)


@pytest.mark.usefixtures("arrow")
@pytest.mark.parametrize("scans", [True, False], ids=["scanned by Arrow, then indexed", "indexed at once"])
def test_a_str_column_s_index_finds_every_key_and_tells_keys_of_one_signature_apart(scans, monkeypatch):
    import sys

    if scans:
        pytest.importorskip("pyarrow.compute")
    else:
        monkeypatch.setitem(sys.modules, "pyarrow.compute", None)
    twins = ["abcdefgh" + "X" * 5 + "abcdefgh", "abcdefgh" + "Y" * 5 + "abcdefgh"]  # one signature
    keys = [f"/api/v1/items/{i}" for i in range(3000)] + ["", "a", "ab", "abcdefgh", "abcdefghi", *twins]
    find = column_finder(StrSerializer(), StrSerializer().encode_column(keys), len(keys))
    assert find is not None
    assert [find(k) for k in keys] == list(range(len(keys)))
    assert find._signatures is not None  # indexed by now, however it began
    misses = [
        "/api/v1/items/3000",
        "abcdefgh" + "Z" * 5 + "abcdefgh",
        "abcdefg",
        "b",
        "/api/v1/items/",
        "\x00",
    ]
    assert [find(m) for m in misses] == [-1] * len(misses)
    assert find("\u00e9") == -1 and find(1) == -1


@pytest.mark.usefixtures("arrow")
@pytest.mark.parametrize("how", ["is_in", "indexed", "scanned"])
def test_str_keys_found_together_are_found_as_one_by_one(how, monkeypatch):
    """``many``: Arrow's is_in over the column; once indexed, the index; without pyarrow.compute, each."""
    import sys

    if how == "scanned":  # without pyarrow.compute: one by one (the index)
        monkeypatch.setitem(sys.modules, "pyarrow.compute", None)
    else:
        pytest.importorskip("pyarrow.compute")
    twins = ["abcdefgh" + "X" * 5 + "abcdefgh", "abcdefgh" + "Y" * 5 + "abcdefgh"]
    keys = [f"/api/v1/items/{i}" for i in range(3000)] + ["", "a", "abcdefgh", *twins]
    find = column_finder(StrSerializer(), StrSerializer().encode_column(keys), len(keys))
    assert find is not None
    if how == "indexed":
        find._build()
    asked = [
        *keys[::7], "", twins[1], keys[5], keys[5],  # a key asked twice
        "/api/v1/items/3000", "abcdefgh" + "Z" * 5 + "abcdefgh", "\u00e9", "k\udc80", 1, b"a", None,
    ]  # fmt: skip
    expected = [keys.index(k) if isinstance(k, str) and k in keys else -1 for k in asked]
    assert find.many(asked) == expected
    assert [find(k) for k in asked] == expected
    assert find.many([]) == [] and find.many([1, "\u00e9"]) == [-1, -1]
    for _ in range(30):  # passes cost like scans: the column is indexed once they cost what an index does
        assert find.many(asked) == expected
    assert find._signatures is not None


def test_int_keys_found_together_are_found_as_one_by_one():
    pytest.importorskip("numpy")
    keys = [0, 1, -1, 2**63 - 1, -(2**63), 256, 1 << 40, *range(1000, 3000, 3)]
    find = column_finder(IntSerializer(), IntSerializer().encode_column(keys), len(keys))
    assert find is not None
    a, b = keys[3], keys[4]
    straddle = struct.unpack("<q", struct.pack("<q", a)[4:] + struct.pack("<q", b)[:4])[0]
    asked = [*keys[::5], True, 5, 1.0, "1", 2**70, straddle, None, keys[2], keys[2]]
    expected = [find(k) for k in asked]
    assert find.many(asked) == expected
    assert expected[: len(keys[::5])] == list(range(0, len(keys), 5)) and expected[-7:-2] == [-1] * 5


def test_finding_keys_alone_or_together_never_imports_pandas(tmp_path):
    """pyarrow imports pandas to convert Python objects; a Spark worker should not pay that for a lookup."""
    import subprocess
    import sys

    pytest.importorskip("pyarrow.compute")
    code = (
        "import sys, numpy, pyarrow, pyarrow.compute\n"
        "from statekit.serialization._lookup import column_finder\n"
        "from statekit.serializers import StrSerializer\n"
        "keys = [f'k{i}' for i in range(5000)]\n"
        "find = column_finder(StrSerializer(), StrSerializer().encode_column(keys), len(keys))\n"
        "assert find('k7') == 7 and find('nope') == -1\n"  # scanned by Arrow, one key
        "assert find.many(['k1', 'k4999', 'nope']) == [1, 4999, -1]\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert out.stdout.strip() == "False"


def test_a_section_lookup_finds_keys_together_in_small_and_large_sections():
    pytest.importorskip("numpy")
    for n in (10, 3000):  # a dict of decoded keys; the column's finder
        keys = list(range(0, 2 * n, 2))
        sec = section(keys, [k * 10.0 for k in keys])
        look = SectionLookup.of(sec, IntSerializer(), FloatSerializer())
        assert look is not None
        asked = [keys[-1], 1, keys[0], keys[-1]]
        assert look.index_many(asked) == [n - 1, -1, 0, n - 1]
        assert [look.value(i) for i in look.index_many(asked) if i >= 0] == [keys[-1] * 10, 0, keys[-1] * 10]


def test_str_columns_are_not_searched_without_numpy(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "numpy", None)
    assert column_finder(StrSerializer(), StrSerializer().encode_column(["a"]), 1) is None


def test_a_section_tells_whether_its_entries_are_all_in_the_void_namespace() -> None:
    from statekit import VOID_NAMESPACE
    from statekit.serializers import StrSerializer
    from statekit.snapshot_codec import Section
    from statekit.snapshots._snapshot import encode_namespaces

    void = Section.void("s", 2, b"keys", b"values")
    assert void.in_void_namespace and void.namespaces == encode_namespaces(
        [VOID_NAMESPACE, VOID_NAMESPACE], None, VOID_NAMESPACE, "s"
    )
    assert Section("s", 1, b"k", memoryview(b"\x00"), b"v").in_void_namespace  # as restores hold them
    mixed = encode_namespaces([VOID_NAMESPACE, "w"], StrSerializer(), VOID_NAMESPACE, "s")
    assert not Section("s", 2, b"k", mixed, b"v").in_void_namespace
    assert not Section("s", 0, b"", b"", b"").in_void_namespace
