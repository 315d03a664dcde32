"""One checkpoint coordinator, two runners: the same scenarios on the LocalRunner and on Spark.

Both runners hand their checkpoints to ``checkpoints._coordinator.CheckpointCoordinator``
(issue 36); what differs is the policy they pass in. Each scenario runs a few
batches of :class:`CountUrls` through a run of either runner, one checkpoint per
batch: on the LocalRunner records go through ``process`` and ``checkpoint``;
on Spark through the query run's driver, one static micro-batch after another
(as a streaming query's batches), so a run's driver outlives its batches and
can be fenced off. Both write real files into one checkpoint directory per test.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
from sparkutil import OUTPUT, SCHEMA, assert_exact_state

from jobs import CountUrls, make_records
from statekit import LocalRunner
from statekit.checkpointing import load_checkpoint
from statekit.checkpoints import _coordinator
from statekit.checkpoints._verify import verify_checkpoint
from statekit.errors import CorruptCheckpointError, FencedError
from statekit.serialization._keygroups import KeyGroupRange
from statekit.spark import keyed
from statekit.spark._driver import BATCH_PROPERTY, QUERY_PROPERTY, STATIC_QUERY, MicroBatchDriver
from statekit.spark._shipping import ship_by_value
from statekit_storage import FileSystemCheckpointStorage

RECORDS = make_records(800, urls=40, seed=36)
PARTS = [RECORDS[i : i + 200] for i in range(0, 800, 200)]


class Run(Protocol):
    """One run of a job on either runner: each batch ends in a checkpoint, whose location it returns."""

    def batch(self, records: list[dict[str, Any]]) -> str: ...

    def end(self) -> None: ...


class LocalRun:
    def __init__(self, conf: dict[str, Any], job_id: str, restore: str | None) -> None:
        self.runner = LocalRunner(CountUrls, key_selector=lambda r: r["url"], config=conf, job_id=job_id)
        self.skipped: list[tuple[str, str]] = []
        if restore is not None:
            self.runner.restore(restore)
            self.skipped = self.runner.skipped_checkpoints

    def batch(self, records: list[dict[str, Any]]) -> str:
        for r in records:
            self.runner.process(r)
        return self.runner.checkpoint()

    def end(self) -> None:
        self.runner.close()


class SparkRun:
    def __init__(self, session: Any, conf: dict[str, Any], job_id: str, restore: str | None) -> None:
        self.session = session
        stream = keyed(session.createDataFrame([], SCHEMA), "url").process(
            CountUrls, OUTPUT, job_id=job_id, config=conf
        )
        # The driver of one query run, as start() keeps it: it outlives its micro-batches.
        ship_by_value(CountUrls)
        self.driver = MicroBatchDriver(stream._spec, session, restore=restore or "latest")

    def batch(self, records: list[dict[str, Any]]) -> str:
        latest = self.driver.latest()
        props = latest.metadata.properties if latest is not None else {}
        batch_id = int(props[BATCH_PROPERTY]) + 1 if props.get(QUERY_PROPERTY) == STATIC_QUERY else 0
        df = self.session.createDataFrame(records, SCHEMA)
        info = self.driver.process_batch(df, batch_id, STATIC_QUERY)
        assert not info.skipped and info.location is not None
        return info.location

    def end(self) -> None:
        self.driver.fence.end()


Runs = Callable[..., Run]


@pytest.fixture(params=["local", "spark"])
def runs(request: pytest.FixtureRequest, tmp_path: Path, job_id: str) -> Iterator[Runs]:
    """Makes runs of one job on the runner under test: ``runs(restore=None, conf=None)``."""
    session = request.getfixturevalue("session") if request.param == "spark" else None
    base = {
        "statekit.checkpoints.dir": str(tmp_path / "ckpt"),
        "statekit.parallelism": 2,
        "statekit.max-parallelism": 128,
        "statekit.checkpoints.retained": 10,
        "statekit.checkpoint.storage.filesystem.inline-threshold": 0,  # every state in a file
    }
    made: list[Run] = []

    def make(restore: str | None = None, conf: dict[str, Any] | None = None) -> Run:
        keys = {**base, **(conf or {})}
        if keys.get("statekit.backend", "heap") == "heap":  # canonical files, which tests damage
            keys.setdefault("statekit.checkpoint.format", "canonical")
        if session is None:
            run: Run = LocalRun(keys, job_id, restore)
        else:
            run = SparkRun(session, keys, job_id, restore)
        made.append(run)
        return run

    make.runner = request.param  # type: ignore[attr-defined]
    yield make
    for run in made:
        if isinstance(run, LocalRun):
            run.runner.close()


def _storage(tmp_path: Path) -> FileSystemCheckpointStorage:
    return FileSystemCheckpointStorage(str(tmp_path / "ckpt"))


def _names(locations: list[str]) -> list[str]:
    return [loc.rstrip("/").rsplit("/", 1)[1] for loc in locations]


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_ids_go_above_every_completed_checkpoint_also_after_restoring_an_older_one(
    runs: Runs, tmp_path: Path, job_id: str
) -> None:
    first = runs()
    assert _names([first.batch(PARTS[0]), first.batch(PARTS[1])]) == ["chk-1", "chk-2"]
    first.end()
    storage = _storage(tmp_path)
    chk2 = _files(tmp_path / "ckpt" / job_id / "chk-2")
    older = storage.list_checkpoints(job_id)[0]
    # A run from the older checkpoint never writes into chk-2, which exists: it numbers above it.
    again = runs(restore=older)
    assert _names([again.batch(PARTS[1])]) == ["chk-3"]
    again.end()
    assert _files(tmp_path / "ckpt" / job_id / "chk-2") == chk2
    assert _names(storage.list_checkpoints(job_id)) == ["chk-1", "chk-2", "chk-3"]
    assert_exact_state(storage, job_id, PARTS[0] + PARTS[1])


def test_a_run_after_one_that_did_not_end_skips_the_id_it_may_be_writing(
    runs: Runs, tmp_path: Path, job_id: str
) -> None:
    gone = runs()
    assert _names([gone.batch(PARTS[0])]) == ["chk-1"]
    # ``gone`` never records its end (a killed process): it may be writing chk-2 right now.
    newer = runs(restore="latest")
    assert _names([newer.batch(PARTS[1])]) == ["chk-3"]
    newer.end()
    assert_exact_state(_storage(tmp_path), job_id, PARTS[0] + PARTS[1])


def test_a_fenced_older_run_completes_nothing_and_deletes_nothing(
    runs: Runs, tmp_path: Path, job_id: str
) -> None:
    older = runs()
    older.batch(PARTS[0])
    newer = runs(restore="latest")
    newer.batch(PARTS[1])
    before = _files(tmp_path / "ckpt" / job_id)
    with pytest.raises(FencedError, match="is fenced off: a newer run"):
        older.batch(PARTS[2])
    assert _files(tmp_path / "ckpt" / job_id) == before
    newer.batch(PARTS[2])
    newer.end()
    assert _names(_storage(tmp_path).list_checkpoints(job_id)) == ["chk-1", "chk-3", "chk-4"]
    assert_exact_state(_storage(tmp_path), job_id, PARTS[0] + PARTS[1] + PARTS[2])


def _referenced_shared(storage: FileSystemCheckpointStorage, job_id: str) -> set[str]:
    names = set()
    for location in storage.list_checkpoints(job_id):
        for desc in load_checkpoint(storage, location).metadata.shared_handles():
            names.add(os.path.basename(str(desc["path"])))
    return names


def test_retention_keeps_the_newest_n_and_the_shared_files_they_reference(
    runs: Runs, tmp_path: Path, job_id: str
) -> None:
    run = runs(conf={"statekit.backend": "rocksdb", "statekit.checkpoints.retained": 2})
    for part in PARTS:
        run.batch(part)
    run.end()
    storage = _storage(tmp_path)
    kept = storage.list_checkpoints(job_id)
    assert _names(kept) == ["chk-3", "chk-4"]
    for location in kept:
        assert verify_checkpoint(storage, location, deep=True) == []  # every file there, whole
    shared = {p.name for p in (tmp_path / "ckpt" / job_id / "shared").iterdir()}
    referenced = _referenced_shared(storage, job_id)
    # Incremental: chk-4 still references files chk-1..3 uploaded; those stay, nothing else does.
    assert referenced and shared == referenced
    assert_exact_state(storage, job_id, RECORDS)


def test_a_damaged_newest_checkpoint_is_handled_by_the_runners_policy(
    runs: Runs, tmp_path: Path, job_id: str
) -> None:
    first = runs()
    first.batch(PARTS[0])
    first.batch(PARTS[1])
    first.end()
    damaged = next((tmp_path / "ckpt" / job_id / "chk-2").glob("process-1.keyed*"))
    damaged.unlink()
    storage = _storage(tmp_path)
    if runs.runner == "local":  # type: ignore[attr-defined]
        with pytest.raises(CorruptCheckpointError, match="statekit.restore.fallback is off") as refused:
            runs(restore="latest", conf={"statekit.restore.fallback": False})
        # statekit.restore.fallback (on by default): the next older retained checkpoint, with a warning.
        with pytest.warns(RuntimeWarning, match="restore skipped"):
            again = runs(restore="latest")
        skipped = again.skipped  # type: ignore[attr-defined]
        assert [loc for loc, _ in skipped] == [storage.list_checkpoints(job_id)[1]]
        assert damaged.name in skipped[0][1]
        assert _names([again.batch(PARTS[2])]) == ["chk-3"]  # above the damaged one, which stays
        again.end()
        assert_exact_state(storage, job_id, PARTS[0] + PARTS[2])
    else:
        # Spark never falls back: its offset log must match the checkpoint it continues from. The
        # damage is found where the LocalRunner finds it (start_point), at start, before any batch.
        with pytest.raises(CorruptCheckpointError, match="A Spark query never falls back") as refused:
            runs(restore="latest")
        assert _names(storage.list_checkpoints(job_id)) == ["chk-1", "chk-2"]
    assert damaged.name in str(refused.value)


def _uploaders(storage: FileSystemCheckpointStorage, location: str) -> set[int]:
    """The checkpoints that uploaded the native files ``location`` references."""
    cp = load_checkpoint(storage, location)
    return {f.checkpoint_id for h in cp.native_handles("process", KeyGroupRange.of(0, 127)) for f in h.files}


def test_a_checkpoint_that_never_completed_is_never_referenced_and_its_files_go(
    runs: Runs, tmp_path: Path, job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Native snapshots hear of a checkpoint's completion only after ``_metadata`` exists."""
    run = runs(conf={"statekit.backend": "rocksdb"})
    run.batch(PARTS[0])
    complete = _coordinator.complete_checkpoint
    monkeypatch.setattr(_coordinator, "complete_checkpoint", _fails_once(complete))
    with pytest.raises(OSError, match="the metadata store fails"):
        run.batch(PARTS[1])  # every subtask wrote checkpoint 2, which never completes
    job = tmp_path / "ckpt" / job_id
    assert not (job / "chk-2").exists()  # aborted: its directory and native uploads are gone
    # The LocalRunner's state holds PARTS[1] (only the checkpoint failed); Spark runs the batch again.
    location = run.batch([] if runs.runner == "local" else PARTS[1])  # type: ignore[attr-defined]
    run.end()
    storage = _storage(tmp_path)
    assert _names([location]) == ["chk-3"]
    assert _uploaders(storage, location) <= {1, 3}
    assert {p.name for p in (job / "shared").iterdir()} == _referenced_shared(storage, job_id)
    assert_exact_state(storage, job_id, PARTS[0] + PARTS[1])


def _fails_once(complete: Callable[..., str]) -> Callable[..., str]:
    failed: list[bool] = []

    def fail_once(*args: Any, **kwargs: Any) -> str:
        if not failed:
            failed.append(True)
            raise OSError("the metadata store fails")
        return complete(*args, **kwargs)

    return fail_once


def test_a_spark_batch_whose_checkpoint_completed_before_it_failed_is_skipped_when_run_again(
    session: Any, tmp_path: Path, job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver knows its newest checkpoint without listing, except after a failed batch: then it looks."""
    conf = {"statekit.checkpoints.dir": str(tmp_path / "ckpt"), "statekit.parallelism": 2}
    run = SparkRun(session, conf, job_id, None)
    run.batch(PARTS[0])
    driver = run.driver
    complete = driver.coordinator.complete

    def completes_then_fails(*args: Any, **kwargs: Any) -> str:
        complete(*args, **kwargs)  # _metadata is written: checkpoint 2 exists
        raise OSError("a completion hook fails")

    monkeypatch.setattr(driver.coordinator, "complete", completes_then_fails)
    df = session.createDataFrame(PARTS[1], SCHEMA)
    with pytest.raises(OSError, match="a completion hook fails"):
        driver.process_batch(df, 1, STATIC_QUERY)
    monkeypatch.undo()
    again = driver.process_batch(df, 1, STATIC_QUERY)  # Spark runs the batch again: it was done
    assert again.skipped and _names([str(again.location)]) == ["chk-2"]
    assert _names([run.batch(PARTS[2])]) == ["chk-3"]
    run.end()
    assert_exact_state(_storage(tmp_path), job_id, PARTS[0] + PARTS[1] + PARTS[2])
