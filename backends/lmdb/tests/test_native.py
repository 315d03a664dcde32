"""Native checkpoints through a real storage: one compact data file each, restores and rescales."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from statekit import KeyedProcessFunction, LocalRunner, ValueStateDescriptor
from statekit.testing import keyed_checkpoint_part, value_state_contents
from statekit_lmdb import LMDBKeyedStateBackend, LMDBStateBackend

COUNT = ValueStateDescriptor("count", int, default=0)
FORMAT = "statekit.backend.lmdb.native-format"


class Set(KeyedProcessFunction):
    """Records are (key, value): the key's state becomes value."""

    def open(self, ctx: Any) -> None:
        self.v = ctx.get_state(COUNT)

    def process(self, record: Any, ctx: Any) -> None:
        self.v.update(record[1])


def runner(tmp_path: Path, **conf: Any) -> LocalRunner:
    return LocalRunner(
        Set,
        key_selector=lambda r: r[0],
        config={
            "statekit.backend": "lmdb",
            "statekit.checkpoints.dir": str(tmp_path / "chk"),
            "statekit.local-dir": str(tmp_path / "local"),
            **conf,
        },
        job_id="nat",
    )


def feed(r: LocalRunner, records: list[tuple[str, int]]) -> None:
    for record in records:
        r.process(record)


def test_every_checkpoint_is_one_self_contained_data_file(tmp_path: Path) -> None:
    r = runner(tmp_path, **{"statekit.checkpoints.retained": 2, FORMAT: "full"})
    feed(r, [(f"user-{i:06d}", 1) for i in range(20_000)])
    first = r.checkpoint()
    feed(r, [(f"user-{i:06d}", 2) for i in range(0, 20_000, 100)])
    second = r.checkpoint()
    for loc, cid in ((first, 1), (second, 2)):
        part = keyed_checkpoint_part(r, loc)
        assert part["format"] == "statekit-lmdb-1" and part["entries"] == 20_000
        files = part["native"]["files"]
        assert [(f["name"], f["shared"], f["checkpoint_id"]) for f in files] == [("data.mdb", False, cid)]
        assert part["uploaded"] == part["size"] and part["shared"] == []  # nothing referenced
    shared = tmp_path / "chk" / "nat" / "shared"
    assert not shared.exists() or not list(shared.iterdir())
    expected = {f"user-{i:06d}": 2 if i % 100 == 0 else 1 for i in range(20_000)}
    assert value_state_contents(r, COUNT) == expected
    r.close()


def test_a_restore_at_the_same_parallelism_adopts_the_file(tmp_path: Path, monkeypatch: Any) -> None:
    r = runner(tmp_path, **{"statekit.parallelism": 2, FORMAT: "full"})  # restored by the default format
    feed(r, [(f"k{i}", i) for i in range(3000)])
    r.checkpoint()
    expected = value_state_contents(r, COUNT)
    r.close()
    loads: list[str] = []
    real = LMDBKeyedStateBackend.kv_load

    def spy(self: Any, name: str, items: Any, **kw: Any) -> None:
        loads.append(name)
        real(self, name, items, **kw)

    monkeypatch.setattr(LMDBKeyedStateBackend, "kv_load", spy)
    again = runner(tmp_path, **{"statekit.parallelism": 2})
    again.restore("latest")
    assert loads == []  # no entry went through the write path
    assert value_state_contents(again, COUNT) == expected
    again.close()


@pytest.mark.parametrize("new_p", [1, 3, 4])
def test_native_rescale_from_two_subtasks_and_back(tmp_path: Path, new_p: int) -> None:
    r = runner(tmp_path, **{"statekit.parallelism": 2})
    feed(r, [(f"k{i}", i) for i in range(3000)])
    r.checkpoint()
    expected = value_state_contents(r, COUNT)
    r.close()
    new = runner(tmp_path, **{"statekit.parallelism": new_p})
    new.restore("latest")
    assert value_state_contents(new, COUNT) == expected
    assert sum(ctx.keyed_backend.num_entries() for ctx in new.subtasks) == 3000
    feed(new, [(f"k{i}", -1) for i in range(0, 3000, 7)])
    new.checkpoint()
    expected.update({f"k{i}": -1 for i in range(0, 3000, 7)})
    new.close()
    back = runner(tmp_path, **{"statekit.parallelism": 2})
    back.restore("latest")
    assert value_state_contents(back, COUNT) == expected
    back.close()


def test_key_group_checkpoints_upload_only_what_changed(tmp_path: Path) -> None:
    """The default format: a file per key group named by its SHA-256, then a delta of the changed keys.

    The second checkpoint uploads one delta file and references every key
    group's file (retention keeps them for it, with one checkpoint retained);
    a rescale restores the chain.
    """
    r = runner(tmp_path, **{"statekit.checkpoints.retained": 1})
    feed(r, [(f"user-{i:06d}", 1) for i in range(20_000)])
    first = keyed_checkpoint_part(r, r.checkpoint())
    feed(r, [("user-000007", 2), ("user-000008", 2)])
    second = keyed_checkpoint_part(r, r.checkpoint())
    for part in (first, second):
        assert part["format"] == "statekit-lmdb-kg-2" and part["entries"] == 20_000
        groups = [f for f in part["native"]["files"] if not f["name"].startswith("kg-delta-")]
        assert len(groups) == 128  # every key group holds keys
        assert all(f["name"] == f"kg-{kg}-{f['sha256']}" for kg, f in enumerate(groups))
        assert all(f["checkpoint_id"] == 1 for f in groups)  # the second references them
    new = [f for f in second["native"]["files"] if f["checkpoint_id"] == 2]
    assert [f["name"] for f in new] == ["kg-delta-2"] and new[0]["size"] < 200
    r.close()
    again = runner(tmp_path, **{"statekit.parallelism": 3})
    again.restore("latest")
    expected = {f"user-{i:06d}": 2 if i in (7, 8) else 1 for i in range(20_000)}
    assert value_state_contents(again, COUNT) == expected
    again.close()


def test_without_exact_counts_deltas_go_on_with_lmdb_s_estimate_labelled(tmp_path: Path) -> None:
    """statekit.metrics.exact-entries=false: no counts kept, yet the second checkpoint is a delta.

    Its entries are LMDB's record count (exact for value state), labelled an
    estimate (``entries_estimated``, no ``entry_counts``) as the metrics and
    ``statekit checkpoints`` read it.
    """
    r = runner(tmp_path, **{"statekit.metrics.exact-entries": "false"})
    feed(r, [(f"user-{i:04d}", 1) for i in range(2_000)])
    first = keyed_checkpoint_part(r, r.checkpoint())
    feed(r, [("user-0007", 2), ("user-2001", 1)])
    second = keyed_checkpoint_part(r, r.checkpoint())
    for part, entries in ((first, 2_000), (second, 2_001)):
        meta = part["native"]["meta"]
        assert meta["entries_estimated"] is True and "entry_counts" not in meta
        assert part["entries"] == entries
    new = [f for f in second["native"]["files"] if f["checkpoint_id"] == 2]
    assert [f["name"] for f in new] == ["kg-delta-2"]
    r.close()


@pytest.mark.parametrize("p", [1, 3])
def test_chains_are_written_whole_again_and_retention_keeps_what_the_latest_references(
    tmp_path: Path, p: int
) -> None:
    """max-deltas=2, one checkpoint retained: deltas, then whole files, and the latest restores exactly."""
    r = runner(tmp_path, **{"statekit.checkpoints.retained": 1, "statekit.backend.lmdb.max-deltas": 2})
    feed(r, [(f"u{i}", 0) for i in range(3000)])
    chains = []
    for c in range(1, 6):
        feed(r, [(f"u{c * 7}", c), (f"u{c * 11}", c), (f"new{c}", c)])
        part = keyed_checkpoint_part(r, r.checkpoint())
        chains.append(len(part["native"]["meta"]["deltas"]))
    assert chains == [0, 1, 2, 0, 1]
    expected = value_state_contents(r, COUNT)
    r.close()
    again = runner(tmp_path, **{"statekit.parallelism": p})
    again.restore("latest")
    assert value_state_contents(again, COUNT) == expected
    again.close()


def test_a_checkpoint_of_the_format_before_deltas_restores(tmp_path: Path) -> None:
    """statekit-lmdb-kg-1 (one file per key group, no deltas) is read by the same path."""
    import dataclasses

    from statekit.backend_api import KeyedBackendParameters, KeyGroupRange
    from statekit.serializers import StrSerializer
    from statekit.testing import KitNativeOutput

    def make() -> LMDBKeyedStateBackend:
        kgr = KeyGroupRange.of(0, 127)
        params = KeyedBackendParameters(StrSerializer(), kgr, 128, local_dir=str(tmp_path))
        return LMDBKeyedStateBackend(params, {})

    b = make()
    s = b.get_state(COUNT)
    for i in range(300):
        b.set_current_key(f"k{i}")
        s.update(i)
    h = b.native_snapshot(1).write(KitNativeOutput(1))
    b.close()
    meta = {k: v for k, v in h.meta.items() if k != "deltas"}
    target = make()
    target.restore_native([dataclasses.replace(h, format="statekit-lmdb-kg-1", meta=meta)])
    ts = target.get_state(COUNT)
    target.set_current_key("k42")
    assert ts.value() == 42 and target.num_entries() == 300
    target.close()


@pytest.mark.parametrize(("written", "restored"), [("key-groups", "full"), ("full", "key-groups")])
def test_either_format_restores_whatever_the_option_says(tmp_path: Path, written: str, restored: str) -> None:
    """Checkpoints of the full format taken before the key-group one restore, and the other way round."""
    r = runner(tmp_path, **{"statekit.parallelism": 2, FORMAT: written})
    feed(r, [(f"k{i}", i) for i in range(500)])
    r.checkpoint()
    expected = value_state_contents(r, COUNT)
    r.close()
    again = runner(tmp_path, **{"statekit.parallelism": 3, FORMAT: restored})
    again.restore("latest")
    assert value_state_contents(again, COUNT) == expected
    again.close()


def test_a_mistyped_native_format_is_refused_naming_the_choices() -> None:
    import pytest

    from statekit.errors import ConfigurationError
    from statekit_lmdb import LMDBStateBackend

    choices = "'Full' for statekit.backend.lmdb.native-format: .*key-groups, full"
    with pytest.raises(ConfigurationError, match=choices):
        LMDBStateBackend({"native-format": "Full"})


def test_a_native_snapshot_written_after_a_later_checkpoint_shows_only_what_it_took(tmp_path: Path) -> None:
    """A snapshot taken at checkpoint 3, written after checkpoint 4 completed: never a delta on 4's chain.

    The kit's snapshot-isolation property found this at random: the delta of 3's
    changes was written against the newest confirmed chain (4's), which holds
    writes made after 3 was taken.
    """
    from statekit.backend_api import KeyedBackendParameters
    from statekit.checkpointing import key_group_range_for_operator
    from statekit.serializers import StrSerializer
    from statekit.testing import KitNativeOutput

    desc = ValueStateDescriptor("v", int)

    def make(name: str) -> Any:
        return LMDBStateBackend().create_keyed_backend(
            KeyedBackendParameters(
                key_serializer=StrSerializer(), key_group_range=key_group_range_for_operator(8, 1, 0),
                max_parallelism=8, local_dir=str(tmp_path / name),
            )
        )  # fmt: skip

    b = make("writer")
    state = b.get_state(desc)

    def put(key: str, value: int) -> None:
        b.set_current_key(key)
        state.update(value)

    def checkpoint(cid: int) -> Any:
        h = b.native_snapshot(cid).write(KitNativeOutput(cid))
        b.notify_checkpoint_complete(cid)
        return h

    put("a", 1)
    checkpoint(1)
    put("a", 2)
    checkpoint(2)
    taken = b.native_snapshot(3)  # taken now, written last
    put("a", 3)
    put("b", 30)
    checkpoint(4)
    h3 = taken.write(KitNativeOutput(3))
    r = make("reader")
    r.restore_native([h3])
    got = {}
    for key in ("a", "b"):
        r.set_current_key(key)
        got[key] = r.get_state(desc).value()
    assert got == {"a": 2, "b": None}
    # Checkpoint 3 completing late does not replace 4's chain: the next delta still holds 4's changes.
    b.notify_checkpoint_complete(3)
    put("c", 5)
    h5 = checkpoint(5)
    r5 = make("reader-5")
    r5.restore_native([h5])
    got = {}
    for key in ("a", "b", "c"):
        r5.set_current_key(key)
        got[key] = r5.get_state(desc).value()
    assert got == {"a": 3, "b": 30, "c": 5}
    b.close()
    r.close()
    r5.close()
