"""A full LMDB map grows: never an error for the user, never a lost write, and snapshots keep their point."""

from __future__ import annotations

import os
from typing import Any

import pytest

from statekit import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from statekit.errors import ConfigurationError, SnapshotError, StateAccessError
from statekit.testing import KitNativeOutput, decode_canonical, snapshot_handle
from statekit_lmdb import LMDBStateBackend, MapSizeLimitError

SMALL = {"initial-map-size": 256 << 10}  # 64 pages of 4 KiB
#: Native snapshots as one compact copy of the environment (the format these tests size maps for).
FULL = {"native-format": "full"}
VALUE = ValueStateDescriptor("v", str)
LIST = ListStateDescriptor("l", str)
MAP = MapStateDescriptor("m", str, str)


def fill(b: Any, n: int, tag: str = "", start: int = 0, append: bool = False) -> None:
    """n keys, each with a 100-byte value, a list of two elements and a map entry (all replaced).

    ``append``: add to the lists instead (no read of them, so nothing is committed before a batch is full).
    """
    v, lst, m = b.get_state(VALUE), b.get_state(LIST), b.get_state(MAP)
    for i in range(start, start + n):
        b.set_current_key(f"key-{i}")
        v.update(f"{tag}{i}".ljust(100, "."))
        (lst.add_all if append else lst.update)([f"{tag}a{i}", f"{tag}b{i}"])
        m.put("u", f"{tag}{i}")


def expected(n: int, tag: str = "", start: int = 0) -> dict[tuple[str, str], Any]:
    out: dict[tuple[str, str], Any] = {}
    for i in range(start, start + n):
        out["v", f"key-{i}"] = f"{tag}{i}".ljust(100, ".")
        out["l", f"key-{i}"] = [f"{tag}a{i}", f"{tag}b{i}"]
        out["m", f"key-{i}"] = {"u": f"{tag}{i}"}
    return out


def content(handle: Any) -> dict[tuple[str, str], Any]:
    return {(e.state, e.key): e.stored for e in decode_canonical(handle)}


def read_back(b: Any, n: int) -> dict[tuple[str, str], Any]:
    v, lst, m = b.get_state(VALUE), b.get_state(LIST), b.get_state(MAP)
    out: dict[tuple[str, str], Any] = {}
    for i in range(n):
        b.set_current_key(f"key-{i}")
        out["v", f"key-{i}"] = v.value()
        out["l", f"key-{i}"] = lst.get()
        out["m", f"key-{i}"] = dict(m.items())
    return out


def test_filling_many_times_past_the_initial_map_loses_nothing(make_backend: Any) -> None:
    b = make_backend(options=SMALL)
    fill(b, 6000)  # ~2.5 MB of pages: ten times the initial map
    assert b.map_growths >= 3 and b.map_size > 8 * (256 << 10)
    assert read_back(b, 6000) == expected(6000)
    assert content(snapshot_handle(b)) == expected(6000)
    assert b.num_entries() == 3 * 6000


def test_a_growth_inside_one_large_batch_replays_it_and_the_snapshot_sees_all(make_backend: Any) -> None:
    # Every write stays in the buffer until the snapshot commits them in one transaction, which
    # hits the full map several times over: aborted, grown, written again.
    b = make_backend(options={**SMALL, "write-batch-size": 1_000_000})
    fill(b, 4000, append=True)
    assert b.map_growths == 0 and b.kv_pending == 4 * 4000
    handle = snapshot_handle(b)
    assert b.map_growths >= 2
    assert content(handle) == expected(4000)
    assert read_back(b, 4000) == expected(4000)


@pytest.mark.parametrize("native", [False, True], ids=["canonical", "native"])
def test_pending_snapshots_keep_their_point_across_growths(make_backend: Any, native: bool) -> None:
    b = make_backend(options=SMALL)
    fill(b, 300)
    first = b.native_snapshot(1) if native else b.snapshot()
    fill(b, 300, tag="second-")
    second = b.native_snapshot(2) if native else b.snapshot()
    fill(b, 5000, tag="later-")  # the map grows while both are pending: both are frozen first
    assert b.map_growths >= 2 and b.frozen_views == 2
    if native:
        handles = [s.write(KitNativeOutput(i + 1)) for i, s in enumerate((first, second))]
        restored = []
        for h in handles:
            t = make_backend()
            t.restore_native([h])
            restored.append(content(snapshot_handle(t)))
    else:
        restored = [content(s.to_handle()) for s in (first, second)]
    assert restored == [expected(300), expected(300, "second-")]
    assert read_back(b, 300) == expected(300, "later-")
    # Frozen copies are deleted once written.
    assert sorted(os.listdir(b.instance_dir)) == [".statekit-owner", "db"]


def test_a_canonical_restore_grows_the_map_as_it_loads(make_backend: Any) -> None:
    src = make_backend()
    fill(src, 5000)
    handle = snapshot_handle(src)
    target = make_backend(options=SMALL)
    target.restore([handle])
    assert target.map_growths >= 3
    assert content(snapshot_handle(target)) == expected(5000)


def test_a_native_restore_sizes_the_map_for_the_file(make_backend: Any) -> None:
    src = make_backend(options=FULL)
    fill(src, 5000)
    handle = snapshot_handle(src, native=True)
    target = make_backend(options=SMALL)
    target.restore_native([handle])
    assert target.map_size >= 2 * handle.size and target.map_growths == 0
    fill(target, 100, tag="after-")  # and it goes on growing from there
    assert read_back(target, 100) == expected(100, "after-")


def test_reaching_the_maximum_is_a_clear_error_and_loses_nothing_committed(make_backend: Any) -> None:
    b = make_backend(options={"initial-map-size": 256 << 10, "max-map-size": 1 << 20, "write-batch-size": 64})
    v = b.get_state(VALUE)
    written = 0
    with pytest.raises(MapSizeLimitError, match=r"statekit\.backend\.lmdb\.max-map-size") as err:
        for i in range(100_000):
            b.set_current_key(f"key-{i}")
            v.update(str(i).ljust(200, "."))
            written = i + 1
    assert isinstance(err.value, StateAccessError)
    assert b.map_size == 1 << 20
    for i in range(written):  # committed and still buffered writes alike read back
        b.set_current_key(f"key-{i}")
        assert v.value() == str(i).ljust(200, ".")
    with pytest.raises(MapSizeLimitError):
        b.snapshot()


def test_map_size_options_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="initial-map-size"):
        LMDBStateBackend({"initial-map-size": 2 << 20, "max-map-size": 1 << 20})
    with pytest.raises(ConfigurationError, match="write-batch-size"):
        LMDBStateBackend({"write-batch-size": 0})


def test_too_many_pending_snapshots_is_a_clear_error(make_backend: Any) -> None:
    b = make_backend()
    fill(b, 10)
    snaps = []
    with pytest.raises(SnapshotError, match="pending"):
        for _ in range(1000):
            snaps.append(b.snapshot())
    assert len(snaps) >= 126
    for s in snaps:
        s.release()
    b.snapshot().release()  # reader slots come back


def test_a_native_snapshot_larger_than_the_maximum_is_refused_before_any_change(make_backend: Any) -> None:
    src = make_backend(options=FULL)
    fill(src, 5000)
    handle = snapshot_handle(src, native=True)
    assert handle.size > 1 << 20
    target = make_backend(options={"initial-map-size": 256 << 10, "max-map-size": 1 << 20})
    with pytest.raises(MapSizeLimitError, match=r"statekit\.backend\.lmdb\.max-map-size"):
        target.restore_native([handle])
    assert target.num_entries() == 0 and sorted(os.listdir(target.instance_dir)) == [".statekit-owner", "db"]
    fill(target, 10)  # still usable
    assert read_back(target, 10) == expected(10)
