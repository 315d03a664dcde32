"""Incremental native checkpoints through a real storage: uploads, references, retention, restores."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from statekit import KeyedProcessFunction, LocalRunner, ValueStateDescriptor
from statekit.checkpointing import load_checkpoint
from statekit.testing import keyed_checkpoint_part, value_state_contents

COUNT = ValueStateDescriptor("count", int, default=0)


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
            "statekit.backend": "rocksdb",
            "statekit.checkpoints.dir": str(tmp_path / "chk"),
            "statekit.local-dir": str(tmp_path / "local"),
            **conf,
        },
        job_id="inc",
    )


def feed(r: LocalRunner, records: list[tuple[str, int]]) -> None:
    for record in records:
        r.process(record)


def shared_files(tmp_path: Path) -> set[str]:
    d = tmp_path / "chk" / "inc" / "shared"
    return {p.name for p in d.iterdir()} if d.exists() else set()


def referenced(r: LocalRunner) -> set[str]:
    names = set()
    for loc in r.storage.list_checkpoints("inc"):
        for d in load_checkpoint(r.storage, loc).metadata.shared_handles():
            if d["type"] == "file":  # small files are inlined into _metadata
                names.add(os.path.basename(d["path"]))
    return names


def test_a_second_checkpoint_uploads_only_what_changed_and_restores_exactly(tmp_path: Path) -> None:
    r = runner(tmp_path, **{"statekit.checkpoints.retained": 2})
    keys = [f"user-{i:06d}" for i in range(50_000)]
    feed(r, [(k, 1) for k in keys])
    first = r.checkpoint()
    changed = random.Random(3).sample(keys, len(keys) // 100)
    feed(r, [(k, 2) for k in changed])
    second = r.checkpoint()
    p1, p2 = keyed_checkpoint_part(r, first), keyed_checkpoint_part(r, second)
    assert p1["format"] == "statekit-rocksdb-1"
    assert p2["uploaded"] < 0.2 * p1["uploaded"], (p1["uploaded"], p2["uploaded"])
    files2 = p2["native"]["files"]
    reused = [f for f in files2 if f["checkpoint_id"] == 1]
    assert reused and all(f["shared"] for f in reused)  # the first checkpoint's SST files, referenced
    expected = dict.fromkeys(keys, 1) | dict.fromkeys(changed, 2)
    assert value_state_contents(r, COUNT) == expected
    r.close()

    again = runner(tmp_path)
    assert again.restore("latest") == second
    assert value_state_contents(again, COUNT) == expected
    again.close()


def test_retention_deletes_exactly_the_shared_files_no_retained_checkpoint_references(tmp_path: Path) -> None:
    r = runner(tmp_path, **{"statekit.checkpoints.retained": 2, "statekit.parallelism": 2})
    keys = [f"k{i}" for i in range(5000)]
    rng = random.Random(1)
    for n in range(6):
        feed(r, [(k, n) for k in rng.sample(keys, 1500)])
        r.checkpoint()
        assert len(r.storage.list_checkpoints("inc")) == min(n + 1, 2)
        assert shared_files(tmp_path) == referenced(r)  # nothing kept that no retained checkpoint needs
    r.close()


def test_an_aborted_checkpoint_is_never_referenced_and_its_uploads_are_removed(tmp_path: Path) -> None:
    r = runner(tmp_path)
    feed(r, [(f"k{i}", i) for i in range(20_000)])
    r.checkpoint()
    feed(r, [(f"k{i}", -i) for i in range(2000)])
    before = shared_files(tmp_path)
    assert before  # files big enough not to be inlined into _metadata
    seen_at_failure: list[set[str]] = []

    real = r.storage.begin_checkpoint

    def failing(job_id: str, checkpoint_id: int) -> Any:
        writer = real(job_id, checkpoint_id)
        inner_complete = writer.complete

        def complete(metadata: bytes) -> str:
            seen_at_failure.append(shared_files(tmp_path))
            raise OSError("the metadata write failed")

        writer.complete = complete  # type: ignore[method-assign]
        del inner_complete
        return writer

    r.storage.begin_checkpoint = failing  # type: ignore[method-assign]
    with pytest.raises(OSError):
        r.checkpoint()
    r.storage.begin_checkpoint = real  # type: ignore[method-assign]
    assert seen_at_failure[0] > before  # checkpoint 2 had uploaded new files...
    assert shared_files(tmp_path) == before  # ...which its failure deleted
    third = r.checkpoint()
    part = keyed_checkpoint_part(r, third)
    assert {f["checkpoint_id"] for f in part["native"]["files"]} <= {1, 3}  # never the aborted 2
    uploaded_by_3 = {
        os.path.basename(f["handle"]["path"])
        for f in part["native"]["files"]
        if f["checkpoint_id"] == 3 and f["shared"] and f["handle"]["type"] == "file"
    }
    assert shared_files(tmp_path) == before | uploaded_by_3  # the failed checkpoint's uploads are gone
    expected = value_state_contents(r, COUNT)
    r.close()
    again = runner(tmp_path)
    again.restore("latest")
    assert value_state_contents(again, COUNT) == expected
    again.close()


@pytest.mark.parametrize("new_p", [1, 3, 4])
def test_native_rescale_from_two_subtasks(tmp_path: Path, new_p: int) -> None:
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


def test_a_restored_checkpoint_of_the_job_is_claimed_its_files_referenced_not_uploaded_again(
    tmp_path: Path,
) -> None:
    """Flink's claim of its own checkpoints: after restoring one, the next references its SST files."""
    r = runner(tmp_path, **{"statekit.checkpoints.retained": 3})
    keys = [f"user-{i:06d}" for i in range(50_000)]
    feed(r, [(k, 1) for k in keys])
    first = r.checkpoint()
    r.close()

    again = runner(tmp_path, **{"statekit.checkpoints.retained": 3})
    assert again.restore("latest") == first
    feed(again, [(k, 2) for k in keys[:100]])
    second = again.checkpoint()
    p1, p2 = keyed_checkpoint_part(again, first), keyed_checkpoint_part(again, second)
    restored_ssts = {f["name"] for f in p1["native"]["files"] if f["shared"]}
    referenced_now = {f["name"] for f in p2["native"]["files"] if f["checkpoint_id"] == 1}
    assert restored_ssts and restored_ssts <= referenced_now  # nothing the restore brought is uploaded again
    assert p2["uploaded"] < 0.2 * p1["uploaded"], (p1["uploaded"], p2["uploaded"])
    expected = dict.fromkeys(keys, 1) | dict.fromkeys(keys[:100], 2)
    again.close()
    third = runner(tmp_path)
    assert third.restore("latest") == second
    assert value_state_contents(third, COUNT) == expected
    third.close()


def test_a_rescaled_restore_references_only_the_files_its_instance_still_holds(tmp_path: Path) -> None:
    r = runner(tmp_path, **{"statekit.checkpoints.retained": 3, "statekit.parallelism": 2})
    keys = [f"k{i:05d}" for i in range(20_000)]
    feed(r, [(k, 1) for k in keys])
    r.checkpoint()
    r.close()
    down = runner(tmp_path, **{"statekit.checkpoints.retained": 3, "statekit.parallelism": 1})
    down.restore("latest")
    second = down.checkpoint()
    part = keyed_checkpoint_part(down, second)
    # Whatever it references is a live file of a completed checkpoint; the state is exact.
    assert {f["checkpoint_id"] for f in part["native"]["files"]} <= {1, 2}
    down.close()
    back = runner(tmp_path, **{"statekit.parallelism": 3})
    back.restore("latest")
    assert value_state_contents(back, COUNT) == dict.fromkeys(keys, 1)
    back.close()


def test_a_savepoint_is_never_claimed_the_first_checkpoint_after_it_uploads_every_file(
    tmp_path: Path,
) -> None:
    r = runner(tmp_path, **{"statekit.checkpoint.format": "native"})
    feed(r, [(f"user-{i:06d}", 1) for i in range(30_000)])
    r.checkpoint()
    savepoint = r.savepoint(str(tmp_path / "sp"))
    r.close()
    fresh = LocalRunner(
        Set,
        key_selector=lambda rec: rec[0],
        config={
            "statekit.backend": "rocksdb",
            "statekit.checkpoints.dir": str(tmp_path / "chk2"),
            "statekit.local-dir": str(tmp_path / "local2"),
        },
        job_id="inc",
    )
    fresh.restore(savepoint)
    first = fresh.checkpoint()
    part = keyed_checkpoint_part(fresh, first)
    assert {f["checkpoint_id"] for f in part["native"]["files"]} == {
        load_checkpoint(fresh.storage, first).checkpoint_id
    }
    fresh.close()
