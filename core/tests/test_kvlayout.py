"""The composite-key layout and TTL encoding every ordered key-value backend shares."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekit import ListStateDescriptor, MapStateDescriptor, StateTtlConfig, ValueStateDescriptor
from statekit.backend_api import RegisteredState
from statekit.ordered_kv import (
    KeyLayout,
    decode_varint,
    encode_varint,
    entry_codec,
    prefix_end,
    ttl_timestamp,
)

parts = st.binary(max_size=40)
namespaces = st.none() | st.binary(max_size=20)


@given(st.integers(0, 2**63))
def test_varints_round_trip(n: int) -> None:
    raw = encode_varint(n)
    assert decode_varint(raw + b"tail", 0) == (n, len(raw))


@pytest.mark.parametrize("maxp, width", [(1, 1), (128, 1), (129, 2), (32768, 2)])
def test_the_key_group_prefix_has_one_byte_up_to_128_key_groups(maxp: int, width: int) -> None:
    layout = KeyLayout(maxp)
    assert layout.group_width == width
    assert layout.group_prefix(maxp - 1) == (maxp - 1).to_bytes(width, "big")


@given(st.integers(0, 127), parts, namespaces, parts)
def test_split_inverts_composition(kg: int, key: bytes, ns: bytes | None, suffix: bytes) -> None:
    layout = KeyLayout(128)
    composite = layout.key_prefix(kg, key) + layout.namespace_part(ns) + suffix
    assert layout.split(composite) == (kg, key, ns, suffix)
    assert layout.key_group_of(composite) == kg


@given(st.integers(0, 300), parts, namespaces, parts, st.integers(0, 300), parts, namespaces, parts)
def test_a_prefix_scan_returns_exactly_one_entrys_keys(
    kg1: int, k1: bytes, ns1: bytes | None, s1: bytes, kg2: int, k2: bytes, ns2: bytes | None, s2: bytes
) -> None:
    """The bytes up to the namespace start a composite key only if key group, key and namespace match."""
    layout = KeyLayout(512)
    prefix1 = layout.key_prefix(kg1, k1) + layout.namespace_part(ns1)
    other = layout.key_prefix(kg2, k2) + layout.namespace_part(ns2) + s2
    assert other.startswith(prefix1) == ((kg1, k1, ns1) == (kg2, k2, ns2))
    # and a key's prefix (any namespace) matches exactly that key group and key
    assert other.startswith(layout.key_prefix(kg1, k1)) == ((kg1, k1) == (kg2, k2))


@given(st.integers(0, 126), parts, namespaces, parts)
def test_a_key_group_is_one_contiguous_range(kg: int, key: bytes, ns: bytes | None, suffix: bytes) -> None:
    layout = KeyLayout(128)
    composite = layout.key_prefix(kg, key) + layout.namespace_part(ns) + suffix
    lower, upper = layout.group_range(kg, kg)
    assert upper is not None and lower <= composite < upper
    lo_all, hi_all = layout.group_range(0, 127)
    assert hi_all is None or composite < hi_all
    assert composite >= lo_all


def test_list_sequence_numbers_sort_in_append_order() -> None:
    seqs = [KeyLayout.sequence(n) for n in (0, 1, 255, 256, 2**40)]
    assert seqs == sorted(seqs)


def test_prefix_end() -> None:
    assert prefix_end(b"ab") == b"ac"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") is None


def test_ttl_units_start_with_their_timestamp() -> None:
    ttl = StateTtlConfig(timedelta(seconds=5))
    value = entry_codec(RegisteredState.of(ValueStateDescriptor("v", str, ttl=ttl), None))
    raw = value.encode(("hello", -7))
    assert ttl_timestamp(raw) == -7 and value.decode(raw) == ("hello", -7)
    lst = entry_codec(RegisteredState.of(ListStateDescriptor("l", int, ttl=ttl), None))
    assert lst.decode(lst.encode((3, 1234))) == (3, 1234) and ttl_timestamp(lst.encode((3, 1234))) == 1234
    m = entry_codec(RegisteredState.of(MapStateDescriptor("m", str, int, ttl=ttl), None))
    assert m.user_key is not None and m.user_key.deserialize(m.user_key.serialize("k")) == "k"
    assert m.decode(m.encode((9, 99))) == (9, 99)
    plain = entry_codec(RegisteredState.of(MapStateDescriptor("m", str, int), None))
    assert plain.decode(plain.encode(9)) == 9 and not plain.ttl
