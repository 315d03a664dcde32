"""Checkpoints, savepoints, restore and rescale through the embedded runner, on every storage."""

from __future__ import annotations

import json
import shutil
import uuid
from typing import Any

import pytest

from jobs import COUNT, RULES, SEEN, CountUrls, make_records, model_state, state_of_runner
from statekit import LocalRunner, RecordSource, default_registry
from statekit.errors import CheckpointNotFoundError, MaxParallelismMismatchError, StateMigrationError
from statekit.serializers import StrSerializer

RECORDS = make_records(3000)


@pytest.fixture(params=["local", "file-url", "memory", "s3", "jobmanager"])
def storage_config(request: pytest.FixtureRequest, tmp_path: Any) -> dict[str, Any]:
    """statekit configuration for one storage; savepoints always go to a local directory."""
    kind = request.param
    conf: dict[str, Any] = {"statekit.savepoints.dir": str(tmp_path / "savepoints")}
    if kind == "local":
        conf["statekit.checkpoints.dir"] = str(tmp_path / "ckpt")
    elif kind == "file-url":
        conf["statekit.checkpoints.dir"] = (tmp_path / "ckpt").as_uri()
    elif kind == "memory":
        conf["statekit.checkpoints.dir"] = f"memory://statekit-tests/{uuid.uuid4().hex}"
    elif kind == "s3":
        s3 = request.getfixturevalue("s3_endpoint")
        conf["statekit.checkpoints.dir"] = f"s3://{s3['bucket']}/{uuid.uuid4().hex}"
        conf["statekit.checkpoint.storage.filesystem.storage-options"] = json.dumps(
            {"client_kwargs": {"endpoint_url": s3["endpoint_url"]}}
        )
    else:
        conf["statekit.checkpoint.storage"] = "jobmanager"
    return conf


def runner(conf: dict[str, Any], parallelism: int, **kw: Any) -> LocalRunner:
    config = {**conf, "statekit.parallelism": parallelism, "statekit.max-parallelism": 128}
    return LocalRunner(CountUrls, key_selector=lambda r: r["url"], config=config, **kw)


def same_storage(first: LocalRunner, conf: dict[str, Any], parallelism: int) -> LocalRunner:
    # jobmanager checkpoints live in the coordinating process: a restarted job there
    # reuses that storage object, as Flink's JobManager keeps its checkpoints.
    return runner(conf, parallelism, storage=first.storage)


def test_checkpoint_restore_resume_gives_exact_state(storage_config: dict[str, Any]) -> None:
    src = RecordSource(RECORDS)
    r1 = runner(storage_config, 2)
    res = r1.run(src, max_records=1700)
    loc = r1.checkpoint()
    r1.run(src, max_records=400)  # processed after the checkpoint: lost with the "crash"
    r1.close()

    r2 = same_storage(r1, storage_config, 2)
    res2 = r2.run(src, restore="latest")
    assert res2.restored_from == loc
    assert res.records + res2.records == len(RECORDS)
    assert state_of_runner(r2) == model_state(RECORDS)
    r2.close()


ALL_PAIRS = [(p, q) for p in (1, 2, 3, 7) for q in (1, 2, 3, 7) if p != q]


@pytest.mark.parametrize(("p", "p2"), ALL_PAIRS)
def test_rescale_every_pair_on_local_storage(tmp_path: Any, p: int, p2: int) -> None:
    conf = {"statekit.checkpoints.dir": str(tmp_path / "ckpt")}
    check_rescale(conf, p, p2)


@pytest.mark.parametrize(("p", "p2"), [(1, 7), (7, 3), (2, 3), (3, 1)])
def test_rescale_moves_every_key_to_its_new_owner(storage_config: dict[str, Any], p: int, p2: int) -> None:
    check_rescale(storage_config, p, p2)


def check_rescale(storage_config: dict[str, Any], p: int, p2: int) -> None:
    src = RecordSource(RECORDS)
    r1 = runner(storage_config, p)
    r1.run(src, max_records=2000)
    r1.checkpoint()
    before = [x for ctx in r1.subtasks for x in ctx.get_list_state(SEEN).get()]
    r1.close()

    r2 = same_storage(r1, storage_config, p2)
    r2.restore("latest")
    # Operator state: even split of the old lists concatenated in subtask order...
    lists = [ctx.get_list_state(SEEN).get() for ctx in r2.subtasks]
    assert [x for lst in lists for x in lst] == before
    assert max(map(len, lists)) - min(map(len, lists)) <= 1
    # ...and broadcast state equal everywhere.
    assert all(dict(ctx.get_broadcast_state(RULES).items()) == {"version": "1"} for ctx in r2.subtasks)
    r2.run(src)
    assert state_of_runner(r2) == model_state(RECORDS)
    r2.close()


def test_even_split_operator_state_redistribution_exact(storage_config: dict[str, Any]) -> None:
    r1 = runner(storage_config, 2)
    r1.subtasks[0].get_list_state(SEEN).update([1, 2, 3])
    r1.subtasks[1].get_list_state(SEEN).update([4, 5])
    r1.checkpoint()
    r1.close()
    r2 = same_storage(r1, storage_config, 3)
    r2.restore("latest")
    assert [ctx.get_list_state(SEEN).get() for ctx in r2.subtasks] == [[1, 2], [3, 4], [5]]
    r2.close()


def test_savepoint_is_relocatable_and_restores_at_another_parallelism(
    storage_config: dict[str, Any], tmp_path: Any
) -> None:
    src = RecordSource(RECORDS)
    r1 = runner(storage_config, 3)
    r1.run(src, max_records=1000)
    sp = r1.savepoint()
    r1.close()
    moved = tmp_path / "elsewhere" / "my-savepoint"
    shutil.copytree(sp, moved)
    shutil.rmtree(sp)
    r2 = same_storage(r1, storage_config, 2)
    r2.run(src, restore=str(moved))
    assert state_of_runner(r2) == model_state(RECORDS)
    r2.close()


def test_restore_refuses_changed_max_parallelism_before_touching_state(
    storage_config: dict[str, Any],
) -> None:
    r1 = runner(storage_config, 2)
    r1.run(RecordSource(RECORDS), max_records=100)
    r1.checkpoint()
    r1.close()
    r2 = LocalRunner(
        CountUrls,
        key_selector=lambda r: r["url"],
        config={**storage_config, "statekit.parallelism": 2, "statekit.max-parallelism": 256},
        storage=r1.storage,
    )
    with pytest.raises(MaxParallelismMismatchError, match="statekit.max-parallelism=128"):
        r2.restore("latest")
    assert r2.subtasks[0].keyed_backend.num_entries() == 0


def test_restore_refuses_unclaimed_operator_state_unless_allowed(storage_config: dict[str, Any]) -> None:
    r1 = runner(storage_config, 1)
    r1.run(RecordSource(RECORDS), max_records=100)
    r1.checkpoint()
    r1.close()
    renamed = runner(storage_config, 1, storage=r1.storage, operator_id="renamed")
    with pytest.raises(StateMigrationError, match="allow_non_restored_state"):
        renamed.restore("latest")
    allowed = runner(
        storage_config, 1, storage=r1.storage, operator_id="renamed", allow_non_restored_state=True
    )
    allowed.restore("latest")
    assert allowed.subtasks[0].keyed_backend.num_entries() == 0


def test_restore_from_a_missing_location_names_it(storage_config: dict[str, Any], tmp_path: Any) -> None:
    r = runner(storage_config, 1)
    missing = str(tmp_path / "no-such-savepoint")
    with pytest.raises(CheckpointNotFoundError, match="no-such-savepoint"):
        r.restore(missing)


def test_latest_with_nothing_restores_nothing(storage_config: dict[str, Any]) -> None:
    r = runner(storage_config, 2)
    res = r.run(RecordSource(RECORDS[:10]), restore="latest")
    assert res.restored_from is None and res.records == 10


def test_lifecycle_hooks_fire(storage_config: dict[str, Any]) -> None:
    from statekit.backend_api import hookimpl

    calls: list[tuple[str, Any]] = []

    class Listener:
        @hookimpl
        def statekit_checkpoint_completed(self, job_id: str, checkpoint_id: int, location: str) -> None:
            calls.append(("completed", checkpoint_id))

        @hookimpl
        def statekit_restore_done(
            self, job_id: str, checkpoint_id: int | None, subtask_index: int, parallelism: int
        ) -> None:
            calls.append(("restored", checkpoint_id, subtask_index, parallelism))

    reg = default_registry()
    listener = Listener()
    reg._pm.register(listener)  # a plain pluggy plugin, as a user's module would be
    try:
        r1 = runner(storage_config, 3)
        r1.checkpoint()
        r2 = same_storage(r1, storage_config, 2)
        r2.restore("latest")
    finally:
        reg._pm.unregister(listener)
    # Once per subtask, as on Spark: each of the 3 started empty, then each of the 2 restored.
    assert calls == [
        *(("restored", None, i, 3) for i in range(3)),
        ("completed", 1),
        *(("restored", 1, i, 2) for i in range(2)),
    ]


def test_metadata_records_the_layout(storage_config: dict[str, Any]) -> None:
    from statekit.checkpointing import load_checkpoint

    r = runner(storage_config, 3)
    r.run(RecordSource(RECORDS), max_records=500)
    cp = load_checkpoint(r.storage, r.checkpoint())
    meta = cp.metadata
    assert meta.max_parallelism == 128 and meta.parallelism("process") == 3
    ranges = [st.key_group_range for st in meta.operators["process"]]
    assert [(x.start, x.end) for x in ranges] == [(0, 42), (43, 85), (86, 127)]
    assert {s["name"] for s in meta.operators["process"][0].states} >= {COUNT.name}
    position = cp.operator_states("__source__", 1)[0]["position"].elements
    assert [json.loads(StrSerializer().deserialize(e)) for e in position] == [500]


def test_end_of_input_takes_a_final_checkpoint_and_a_later_run_continues(tmp_path: Any) -> None:
    conf = {
        "statekit.checkpoints.dir": str(tmp_path / "ckpt"),
        "statekit.checkpoint.interval-records": 400,
        "statekit.parallelism": 2,
    }
    first = runner(conf, 2)
    res = first.run(RecordSource(RECORDS[:1000]))
    assert len(res.checkpoints) == 3  # at 400, 800, and the end of the input at 1000
    first.close()
    second = runner(conf, 3)
    res2 = second.run(RecordSource(RECORDS), restore="latest")  # the same source, grown
    assert res2.restored_from == res.checkpoints[-1] and res2.records == len(RECORDS) - 1000
    assert state_of_runner(second) == model_state(RECORDS)
