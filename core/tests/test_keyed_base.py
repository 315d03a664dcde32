"""What KeyedBackendBase gives the backends built on it, beyond the kit's semantics."""

from __future__ import annotations

import pytest

from statekit import ValueStateDescriptor
from statekit.backend_api import KeyGroupRange, key_group_for_bytes
from statekit.errors import StateAccessError
from statekit.serializers import serializer_for
from statekit.testing import ReferenceKeyedStateBackend

KEYS = serializer_for(tuple[int, str])


def _backend(key_group_range: KeyGroupRange = KeyGroupRange.of(0, 127)) -> ReferenceKeyedStateBackend:
    return ReferenceKeyedStateBackend(
        key_serializer=KEYS, key_group_range=key_group_range, max_parallelism=128, key_cache_size=2
    )


def test_current_key_bytes_are_the_serialized_current_key() -> None:
    b = _backend()
    with pytest.raises(StateAccessError):
        _ = b.current_key_bytes
    for key in [(1, "a"), (2, "b"), (1, "a"), (3, "c"), (2, "b")]:  # cache hits and misses (size 2)
        b.set_current_key(key)
        assert b.current_key_bytes == KEYS.serialize(key)
        assert b.current_key_bytes == KEYS.serialize(key)


def test_a_refused_key_switch_keeps_the_bytes_of_the_current_key() -> None:
    b = _backend(KeyGroupRange.of(0, 63))
    inside = next((i, "k") for i in range(1000) if key_group_for_bytes(KEYS.serialize((i, "k")), 128) < 64)
    outside = next((i, "k") for i in range(1000) if key_group_for_bytes(KEYS.serialize((i, "k")), 128) >= 64)
    b.set_current_key(inside)
    with pytest.raises(StateAccessError):
        b.set_current_key(outside)
    assert b.get_current_key() == inside
    assert b.current_key_bytes == KEYS.serialize(inside)


@pytest.mark.parametrize("name", ["_decode", "_assign", "_wrap", "_no_key", "_check_snapshot", "_states"])
def test_a_subclass_that_reuses_an_internal_name_is_refused_when_defined(name: str) -> None:
    """A helper named like one of the base's internals would break restores deep inside core."""
    with pytest.raises(TypeError) as e:
        type("MyBackend", (ReferenceKeyedStateBackend,), {name: lambda self, *a: None})
    msg = str(e.value)
    assert f"MyBackend defines {name}" in msg
    assert "KeyedBackendBase uses internally" in msg
    assert f"_reference{name}" in msg  # a suggested name of the backend's own
    assert "_create_value" in msg  # and the methods meant to be implemented


def test_the_hooks_and_own_names_may_be_defined() -> None:
    ok = type(
        "MyBackend",
        (ReferenceKeyedStateBackend,),
        {"_ttl_hook": lambda self, reg: None, "_mydb_decode": lambda self: None, "helper": 1},
    )
    assert ok.helper == 1


def _groups(keys: list[tuple[int, str]]) -> list[int]:
    return [key_group_for_bytes(KEYS.serialize(k), 128) for k in keys]


def _hashes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The key bytes the base hashes from now on (each key switch it computes a key group for)."""
    from statekit.state import _keyed

    hashed: list[bytes] = []

    def counted(raw: bytes, max_parallelism: int) -> int:
        hashed.append(raw)
        return key_group_for_bytes(raw, max_parallelism)

    monkeypatch.setattr(_keyed, "key_group_for_bytes", counted)
    return hashed


def test_key_groups_a_runner_routed_by_are_not_computed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    b = ReferenceKeyedStateBackend(key_serializer=KEYS, key_group_range=KeyGroupRange.of(0, 127),
                                   max_parallelism=128, key_cache_size=100)  # fmt: skip
    keys = [(i, "k") for i in range(10)]
    hashed = _hashes(monkeypatch)
    b.remember_key_groups(keys, _groups(keys))
    for key, kg in zip(keys, _groups(keys)):
        b.set_current_key(key)
        assert b.current_key_group == kg
        assert b.current_key_bytes == KEYS.serialize(key)  # serialized when asked, as before
    assert hashed == []
    b.set_current_key((99, "new"))  # a key it was not told: computed as before
    assert hashed == [KEYS.serialize((99, "new"))]


def test_key_groups_outside_the_range_or_null_are_not_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Records that did not come by key group: each key's group is computed, and a foreign one refused."""
    b = ReferenceKeyedStateBackend(key_serializer=KEYS, key_group_range=KeyGroupRange.of(0, 63),
                                   max_parallelism=128, key_cache_size=100)  # fmt: skip
    outside = next((i, "k") for i in range(1000) if _groups([(i, "k")])[0] >= 64)
    inside = next((i, "k") for i in range(1000) if _groups([(i, "k")])[0] < 64)
    hashed = _hashes(monkeypatch)
    b.remember_key_groups([inside, outside], _groups([inside, outside]))  # one of them not this backend's
    b.remember_key_groups([inside, outside], [_groups([inside])[0], None])  # type: ignore[list-item]
    b.set_current_key(inside)
    assert hashed == [KEYS.serialize(inside)]
    with pytest.raises(StateAccessError, match="does not own"):
        b.set_current_key(outside)


def test_remembered_key_groups_keep_the_cache_bound_and_end_with_the_backend() -> None:
    b = ReferenceKeyedStateBackend(key_serializer=KEYS, key_group_range=KeyGroupRange.of(0, 127),
                                   max_parallelism=128, key_cache_size=4)  # fmt: skip
    keys = [(i, "k") for i in range(6)]
    b.remember_key_groups(keys[:3], _groups(keys[:3]))
    assert b._kg_cache == {}  # into the cache at the first key it misses
    b.set_current_key(keys[0])
    assert set(b._kg_cache) == set(keys[:3])
    b.remember_key_groups(keys[3:], _groups(keys[3:]))
    b.set_current_key(keys[3])  # 3 + 3 > 4: the cache starts over
    assert set(b._kg_cache) == set(keys[3:])
    b.remember_key_groups(keys, _groups(keys))  # more than it holds: not remembered
    assert b._remembered_groups(keys) is None
    b.set_current_key(keys[0])
    assert len(b._kg_cache) == 4
    b.close()
    b.remember_key_groups(keys[:2], _groups(keys[:2]))
    with pytest.raises(StateAccessError, match="closed"):
        b.set_current_key(keys[0])


def test_remembered_groups_are_given_for_the_remembered_keys_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bulk update takes the groups as remembered, for an equal list only: a list changed since is not."""
    b = ReferenceKeyedStateBackend(key_serializer=KEYS, key_group_range=KeyGroupRange.of(0, 127),
                                   max_parallelism=128, key_cache_size=100)  # fmt: skip
    keys = [(i, "k") for i in range(10)]
    hashed = _hashes(monkeypatch)
    b.remember_key_groups(keys, _groups(keys))
    assert b._remembered_groups(keys) == _groups(keys)
    assert b._remembered_groups(list(keys)) == _groups(keys)  # equal keys: the same groups
    assert b._remembered_groups(tuple(keys)) is None  # a list only
    assert b._remembered_groups(keys[:-1]) is None
    changed = list(keys)
    changed[3] = (99, "new")
    assert b._remembered_groups(changed) is None
    keys[3] = (99, "new")  # the runner's list changed in place after remembering: not taken
    assert b._remembered_groups(keys) is None
    assert hashed == []
    b.set_current_key((99, "new"))  # not remembered: computed
    assert hashed == [KEYS.serialize((99, "new"))]
    assert b._remembered_groups(keys) is None  # in the cache now, no longer remembered apart
    b.remember_key_groups(keys, _groups(keys)[:-1])  # lengths differ: nothing remembered
    assert b._remembered_groups(keys) is None
    b.remember_key_groups(keys, _groups(keys))
    b.close()
    assert b._remembered_groups(keys) is None


def test_handed_over_key_groups_make_keys_current_without_computing_or_caching_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    b = ReferenceKeyedStateBackend(key_serializer=KEYS, key_group_range=KeyGroupRange.of(0, 127),
                                   max_parallelism=128, key_cache_size=100)  # fmt: skip
    keys = [(i, "k") for i in range(10)]
    ahead: list[tuple[list[object], list[int]]] = []
    monkeypatch.setattr(b, "_keys_ahead", lambda ks, gs: ahead.append((list(ks), list(gs))))
    hashed = _hashes(monkeypatch)
    assert b.hand_over_key_groups(keys, _groups(keys))
    assert ahead == [(keys, _groups(keys))]  # what a backend may look up together
    count = b.get_state(ValueStateDescriptor("count", int, default=0))
    for key, kg in zip(keys, _groups(keys)):
        b.set_current_key_in_group(key, kg)
        assert b.get_current_key() == key and b.current_key_group == kg
        assert b.current_key_bytes == KEYS.serialize(key)  # serialized when asked, as after set_current_key
        count.update(count.value() + key[0])
    assert hashed == [] and b._kg_cache == {}
    for key in keys:  # the same entries as set_current_key reaches
        b.set_current_key(key)
        assert count.value() == key[0]


def test_key_groups_that_are_not_all_the_backend_s_are_not_taken() -> None:
    b = ReferenceKeyedStateBackend(key_serializer=KEYS, key_group_range=KeyGroupRange.of(0, 63),
                                   max_parallelism=128, key_cache_size=100)  # fmt: skip
    outside = next((i, "k") for i in range(1000) if _groups([(i, "k")])[0] >= 64)
    inside = next((i, "k") for i in range(1000) if _groups([(i, "k")])[0] < 64)
    assert not b.hand_over_key_groups([inside, outside], _groups([inside, outside]))
    assert not b.hand_over_key_groups([inside, outside], [_groups([inside])[0], None])  # type: ignore[list-item]
    assert not b.hand_over_key_groups([inside], _groups([inside, outside]))  # lengths differ
    assert not b.hand_over_key_groups([], [])
    assert b.hand_over_key_groups([inside], _groups([inside]))
    b.close()
    assert not b.hand_over_key_groups([inside], _groups([inside]))


def test_a_backend_with_its_own_set_current_key_is_handed_no_key_groups() -> None:
    """Its key switch may do more than the base's: every key goes through it (remembered groups help)."""
    switched: list[object] = []

    class Watching(ReferenceKeyedStateBackend):
        def set_current_key(self, key: object) -> None:
            switched.append(key)
            super().set_current_key(key)

    b = Watching(key_serializer=KEYS, key_group_range=KeyGroupRange.of(0, 127), max_parallelism=128,
                 key_cache_size=100)  # fmt: skip
    keys = [(i, "k") for i in range(3)]
    assert not b.hand_over_key_groups(keys, _groups(keys))
    b.remember_key_groups(keys, _groups(keys))
    b.set_current_key(keys[0])
    assert set(b._kg_cache) == set(keys)
