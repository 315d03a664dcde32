"""The checkpoint lifecycle never damages itself: ids only go up, the newest good checkpoint is restored.

On real files and on a real S3 endpoint (moto's server on 127.0.0.1), with the
heap and the RocksDB backend (whose native checkpoints share files).
"""

from __future__ import annotations

import json
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fsspec.core import url_to_fs

from jobs import count_urls_runner, make_records, model_state, state_of_runner
from statekit import LocalRunner, RecordSource
from statekit.checkpointing import load_checkpoint
from statekit.errors import CheckpointError, CorruptCheckpointError, MaxParallelismMismatchError

RECORDS = make_records(3000, urls=80, seed=11)
INTERVAL = {"statekit.checkpoint.interval-records": 500, "statekit.checkpoints.retained": 10}


class Place:
    """A checkpoints directory on one kind of store, and raw access to its files."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        self.url = url
        self.options = options
        self.fs, self.root = url_to_fs(url, **options)

    def conf(self, backend: str, **extra: Any) -> dict[str, Any]:
        # "heap/canonical": heap writing canonical keyed files (chk-<n>/process-<i>.keyed), which the
        # damage tests below damage; plain "heap" writes its deltas, as by default.
        name, _, fmt = backend.partition("/")
        conf: dict[str, Any] = {**INTERVAL, "statekit.backend": name, **extra}
        conf["statekit.checkpoint.format"] = fmt or "native"
        if self.options:
            conf["statekit.checkpoint.storage.filesystem.storage-options"] = json.dumps(self.options)
        return conf

    def runner(self, backend: str, **extra: Any) -> LocalRunner:
        return count_urls_runner(self.url, self.conf(backend, **extra))

    def files(self, under: str = "job") -> dict[str, bytes]:
        """Every file below ``<dir>/<under>`` but the run records, by path relative to the job."""
        base = f"{self.root}/{under}"
        self.fs.invalidate_cache()
        return {p[len(base) + 1 :]: self.fs.cat_file(p) for p in self.fs.find(base) if "/runs/" not in p}

    def path(self, relative: str) -> str:
        return f"{self.root}/job/{relative}"

    def damage(self, relative: str, at: int | None = None, *, flips: int = 4) -> None:
        """Flip ``flips`` bytes of a file (in the middle unless ``at``)."""
        data = bytearray(self.fs.cat_file(self.path(relative)))
        start = len(data) // 2 if at is None else at
        for i in range(start, min(start + flips, len(data))):
            data[i] ^= 0xFF
        self.fs.pipe_file(self.path(relative), bytes(data))
        self.fs.invalidate_cache()

    def truncate(self, relative: str, by: int) -> None:
        self.fs.pipe_file(self.path(relative), self.fs.cat_file(self.path(relative))[:-by])
        self.fs.invalidate_cache()

    def remove(self, relative: str) -> None:
        self.fs.rm_file(self.path(relative))
        self.fs.invalidate_cache()

    def location(self, n: int) -> str:
        return self.fs.unstrip_protocol(self.path(f"chk-{n}")) if self.options else self.path(f"chk-{n}")


@pytest.fixture(params=["local", "s3"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    if request.param == "local":
        return Place(str(tmp_path / "ckpt"), {})
    s3 = request.getfixturevalue("s3_endpoint")
    # Cached s3fs instances (no outage here): a fresh client per call costs ten times the test.
    options = {"client_kwargs": {"endpoint_url": s3["endpoint_url"]}}
    return Place(f"s3://{s3['bucket']}/lifecycle-{uuid.uuid4().hex[:8]}", options)


def three_checkpoints(place: Place, backend: str) -> list[str]:
    """Checkpoints 1, 2 and 3 of the job, after 500, 1000 and 1500 records."""
    with place.runner(backend) as r:
        result = r.run(RecordSource(RECORDS), max_records=1500)
    assert [loc.rsplit("/", 1)[1] for loc in result.checkpoints] == ["chk-1", "chk-2", "chk-3"]
    return result.checkpoints


def final_state(place: Place, backend: str, parallelism: int) -> dict[str, tuple[int, int, int]]:
    with place.runner(backend, **{"statekit.parallelism": parallelism}) as r:
        assert r.restore("latest") is not None
        return state_of_runner(r)


# --- 1. checkpoint ids only go up ---------------------------------------------------------


# Every parallelism on local files; on S3 one rescale per backend (the store changes nothing else).
@pytest.mark.parametrize(
    ("backend", "parallelism"),
    [("heap", 1), ("heap", 2), ("heap", 3), ("rocksdb", 1), ("rocksdb", 3)],
)
def test_restoring_an_older_checkpoint_never_touches_the_newer_ones(
    place: Place, backend: str, parallelism: int
) -> None:
    if place.options and (backend, parallelism) not in {("heap", 3), ("rocksdb", 1)}:
        pytest.skip("covered on local files; S3 runs one rescale per backend")
    locations = three_checkpoints(place, backend)
    before = place.files()
    newer = {p: b for p, b in before.items() if p.startswith(("chk-2/", "chk-3/"))}
    assert newer
    with place.runner(backend, **{"statekit.parallelism": parallelism}) as r:
        result = r.run(RecordSource(RECORDS), restore=locations[0])
    assert result.restored_from == locations[0]
    assert result.records == len(RECORDS) - 500
    names = [loc.rsplit("/", 1)[1] for loc in result.checkpoints]
    assert names == [f"chk-{n}" for n in range(4, 4 + len(names))] and len(names) == 5
    after = place.files()
    # Every byte of chk-2 and chk-3 is as it was, and so is every file they reference.
    assert {p: after.get(p) for p in newer} == newer
    shared = {p: b for p, b in before.items() if p.startswith("shared/")}
    assert {p: after.get(p) for p in shared} == shared
    assert final_state(place, backend, 2) == model_state(RECORDS)


def test_a_run_without_restore_numbers_above_the_existing_checkpoints(place: Place) -> None:
    three_checkpoints(place, "heap")
    before = place.files()
    with place.runner("heap") as r:  # a fresh start over the same directory: no restore
        result = r.run(RecordSource(RECORDS[:600]))
    assert [loc.rsplit("/", 1)[1] for loc in result.checkpoints] == ["chk-4", "chk-5"]
    after = place.files()
    assert {p: after.get(p) for p in before if p.startswith("chk-")} == {
        p: b for p, b in before.items() if p.startswith("chk-")
    }


def test_leftovers_of_a_checkpoint_that_never_completed_are_replaced_not_mixed_in(tmp_path: Path) -> None:
    place = Place(str(tmp_path / "ckpt"), {})
    three_checkpoints(place, "heap/canonical")
    # A run at parallelism 3 killed while writing chk-4: its files, no _metadata.
    place.fs.makedirs(place.path("chk-4"), exist_ok=True)
    for name in ("process-0.keyed", "process-1.keyed", "process-2.keyed", "stray.bin"):
        place.fs.pipe_file(place.path(f"chk-4/{name}"), b"half-written")
    with place.runner("heap/canonical") as r:
        result = r.run(RecordSource(RECORDS), restore="latest")
    assert result.checkpoints[0].endswith("chk-4")
    names = {p.name for p in Path(place.path("chk-4")).iterdir()}
    assert "stray.bin" not in names and "process-2.keyed" not in names, names
    assert {"_metadata", "process-0.keyed", "process-1.keyed"} <= names
    assert Path(place.path("chk-4/process-0.keyed")).read_bytes() != b"half-written"
    assert final_state(place, "heap", 2) == model_state(RECORDS)


def test_a_writer_refuses_to_write_into_a_completed_checkpoint(place: Place) -> None:
    locations = three_checkpoints(place, "heap")
    with place.runner("heap") as r:
        writer = r.storage.begin_checkpoint("job", 2)
        with pytest.raises(CheckpointError, match="completed checkpoint"):
            writer.create_stream("process-0.keyed")
        with pytest.raises(CheckpointError, match="complete"):
            writer.abort()
    assert load_checkpoint(r.storage, locations[1]).checkpoint_id == 2


# --- 2. restore the newest restorable checkpoint ----------------------------------------------


def restore_latest(place: Place, backend: str, **conf: Any) -> tuple[LocalRunner, Any, list[str]]:
    """Run the job to the end from ``restore="latest"``; returns the runner, result and warnings."""
    r = place.runner(backend, **conf)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = r.run(RecordSource(RECORDS), restore="latest")
    return r, result, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


DAMAGES: dict[str, tuple[str, Callable[[Place, str], None]]] = {
    "metadata flipped": ("chk-3/_metadata", Place.damage),
    "keyed block flipped": ("chk-3/process-1.keyed", Place.damage),
    "keyed file missing": ("chk-3/process-0.keyed", Place.remove),
    "operator file truncated": ("chk-3/process-1.operator", lambda p, f: p.truncate(f, 3)),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_newest_checkpoint_falls_back_to_the_next_older_one(place: Place, damage: str) -> None:
    three_checkpoints(place, "heap/canonical")
    bad, do = DAMAGES[damage]
    do(place, bad)
    r, result, warned = restore_latest(place, "heap/canonical")
    with r:
        assert result.restored_from == place.location(2)
        assert [loc for loc, _ in result.skipped_checkpoints] == [place.location(3)]
        reason = result.skipped_checkpoints[0][1]
        # One form: checkpoint <dir>: <full path of the file>: <what is wrong>.
        assert reason.startswith(f"checkpoint {place.location(3)}: "), reason
        assert bad.rsplit("/", 1)[1] in reason and place.root in reason, reason
        assert any(place.location(3) in w and "next older" in w for w in warned), warned
        assert result.records == len(RECORDS) - 1000
        # Above the damaged one too: chk-3 is never written into.
        assert result.checkpoints[0].endswith("chk-4")
    assert final_state(place, "heap/canonical", 3) == model_state(RECORDS)


@pytest.mark.parametrize(("backend", "suffix"), [("rocksdb", ".sst"), ("heap", "delta-3")])
def test_a_damaged_native_file_falls_back_too(tmp_path: Path, backend: str, suffix: str) -> None:
    place = Place(str(tmp_path / "ckpt"), {})
    files = {
        "statekit.checkpoint.storage.filesystem.inline-threshold": 0,  # heap's deltas are small
        # Every key changes between checkpoints here: without this, heap writes a base each time.
        **({"statekit.backend.heap.max-delta-ratio": 100.0} if backend == "heap" else {}),
    }
    with place.runner(backend, **files) as r:
        r.run(RecordSource(RECORDS), max_records=1500)
    meta = load_checkpoint(place.runner(backend).storage, place.location(3)).metadata
    assert (
        backend != "heap"
        or meta.operators["process"][0].keyed["native"]["meta"]["chain"][0]["kind"] == "base"
    )
    uploaded = [
        f["handle"]["path"]
        for st in meta.operators["process"]
        for f in st.keyed["native"]["files"]  # type: ignore[index]
        if f["checkpoint_id"] == 3 and f["handle"]["type"] == "file" and f["name"].endswith(suffix)
    ]
    assert uploaded
    victim = str(Path(place.path("chk-3"), uploaded[0]).resolve().relative_to(Path(place.path(""))))
    place.damage(victim)
    r, result, _ = restore_latest(place, backend)
    r.close()
    assert result.restored_from == place.location(2)
    assert Path(victim).name in result.skipped_checkpoints[0][1]
    assert final_state(place, backend, 2) == model_state(RECORDS)


def test_with_fallback_off_the_damaged_file_is_named_and_nothing_is_restored(place: Place) -> None:
    three_checkpoints(place, "heap/canonical")
    place.damage("chk-3/process-0.keyed")
    r = place.runner("heap/canonical", **{"statekit.restore.fallback": False})
    with pytest.raises(CorruptCheckpointError) as info:
        r.restore("latest")
    assert info.value.location == place.location(3)
    assert str(info.value).startswith(f"checkpoint {place.location(3)}: ")
    assert "process-0.keyed" in str(info.value) and "statekit.restore.fallback is off" in str(info.value)
    assert r.position is None and all(ctx.keyed_backend.num_entries() == 0 for ctx in r.subtasks)
    r.close()


def test_when_every_retained_checkpoint_is_damaged_each_is_named(tmp_path: Path) -> None:
    place = Place(str(tmp_path / "ckpt"), {})
    three_checkpoints(place, "heap/canonical")
    for n in (1, 2, 3):
        place.damage(f"chk-{n}/process-1.keyed")
    r = place.runner("heap/canonical")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CorruptCheckpointError) as info:
            r.restore("latest")
    text = str(info.value)
    assert all(f"chk-{n}/process-1.keyed" in text for n in (1, 2, 3)), text
    assert "savepoint" in text
    assert r.position is None
    r.close()


def test_an_incompatible_restore_fails_at_once_without_falling_back(tmp_path: Path) -> None:
    place = Place(str(tmp_path / "ckpt"), {})
    three_checkpoints(place, "heap")
    r = place.runner("heap", **{"statekit.max-parallelism": 256})
    with pytest.raises(MaxParallelismMismatchError):
        r.restore("latest")
    assert r.skipped_checkpoints == []
    r.close()


def test_an_explicit_location_never_falls_back(tmp_path: Path) -> None:
    place = Place(str(tmp_path / "ckpt"), {})
    three_checkpoints(place, "heap/canonical")
    place.damage("chk-3/process-1.keyed")
    r = place.runner("heap/canonical")
    with pytest.raises(CorruptCheckpointError, match=r"chk-3/process-1\.keyed"):
        r.restore(place.location(3))
    r.close()
