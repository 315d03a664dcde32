"""A job killed with SIGKILL anywhere in checkpointing restarts with exactly-once state."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import CountUrls, make_records, model_state
from statekit import LocalRunner, default_registry
from statekit.checkpointing import load_checkpoint

CHILD = Path(__file__).with_name("crash_child.py")
RECORDS = make_records(1200, urls=40, seed=11)
# The default backend, and the engines on disk with native checkpoints.
BACKENDS = [b for b in ("heap", "rocksdb", "lmdb") if b in default_registry().backends()]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def workdir(tmp_path: Path, backend: str) -> Path:
    with open(tmp_path / "input.jsonl", "w") as f:
        for r in RECORDS:
            f.write(json.dumps(r) + "\n")
    (tmp_path / "backend").write_text(backend)
    return tmp_path


def run_child(workdir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(CHILD),
            str(workdir / "ckpt"),
            str(workdir / "input.jsonl"),
            str(workdir / "result.json"),
            "--backend",
            (workdir / "backend").read_text(),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def latest_restores(workdir: Path) -> str | None:
    """Whatever checkpoint is selected as latest must restore completely."""
    r = LocalRunner(
        CountUrls,
        key_selector=lambda x: x["url"],
        config={
            "statekit.checkpoints.dir": str(workdir / "ckpt"),
            "statekit.parallelism": 2,
            "statekit.backend": (workdir / "backend").read_text(),
        },
    )
    loc = r.restore("latest")
    if loc is not None:
        cp = load_checkpoint(r.storage, loc)
        parts = [st.keyed for st in cp.metadata.operators["process"] if st.keyed]
        restored = sum(ctx.keyed_backend.num_entries() for ctx in r.subtasks)
        if all("native" not in p for p in parts):
            assert restored == sum(int(p["entries"]) for p in parts)
        else:  # native snapshots carry the engine's estimate; every file was read and checked
            assert restored > 0
    r.close()
    return loc


def finish(workdir: Path) -> None:
    done = run_child(workdir)
    assert done.returncode == 0, done.stderr
    assert json.loads((workdir / "result.json").read_text()) == {
        k: list(v) for k, v in model_state(RECORDS).items()
    }


@pytest.mark.parametrize("kill_at", [1, 2, 3, 4, 5, 6, 7, 9, 12, 17, 26, 40])
def test_sigkill_at_each_checkpoint_io_event(workdir: Path, kill_at: int) -> None:
    killed = run_child(workdir, "--kill-at", str(kill_at))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    latest_restores(workdir)
    finish(workdir)


def test_repeated_sigkills_at_random_times(workdir: Path) -> None:
    rng = random.Random(5)
    kills = 0
    for _ in range(6):
        proc = run_child(workdir, "--kill-after", f"{rng.uniform(0.3, 1.2):.3f}")
        if proc.returncode == 0:
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        kills += 1
        latest_restores(workdir)
    assert kills >= 1, "the job finished before any kill: lengthen it"
    finish(workdir)


def test_dead_letters_are_exactly_once_across_sigkills(tmp_path: Path) -> None:
    """Kills anywhere (in checkpoint I/O, between _metadata and publishing, at random): each letter once."""
    rng = random.Random(23)
    malformed: list[int] = []  # byte offsets of the lines that are no JSON
    with open(tmp_path / "input.jsonl", "wb") as f:
        for i, r in enumerate(RECORDS):
            if i % 19 == 7:
                malformed.append(f.tell())
                f.write(b'{"url": "/broken' + str(i).encode() + b"\n")
            f.write(json.dumps(r).encode() + b"\n")
    (tmp_path / "backend").write_text("heap")
    letters = tmp_path / "dead-letters"
    kills = 0
    kill_points = (
        ["--kill-at", "12"],  # in the first checkpoint's I/O: nothing published, the letters come again
        ["--kill-at-publish", "2"],  # checkpoint complete, its letters staged: the next run publishes them
        ["--kill-at", "40"],
        ["--kill-at-publish", "3"],
        *(["--kill-after", f"{rng.uniform(0.3, 1.0):.3f}"] for _ in range(3)),
    )
    for extra in kill_points:
        proc = run_child(tmp_path, "--dead-letters", str(letters), *extra)
        if proc.returncode == 0:
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        kills += 1
        # What a reader sees meanwhile: whole published files only, no letter twice.
        seen = [
            json.loads(x)["offset"] for p in letters.glob("part-*.json") for x in p.read_text().splitlines()
        ]
        assert len(seen) == len(set(seen)) and set(seen) <= set(malformed)
    assert kills >= 4
    done = run_child(tmp_path, "--dead-letters", str(letters))
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "result.json").read_text()) == {
        k: list(v) for k, v in model_state(RECORDS).items()
    }
    published = [json.loads(x) for p in letters.glob("part-*.json") for x in p.read_text().splitlines()]
    assert sorted(x["offset"] for x in published) == malformed  # every one, exactly once
    assert all(x["stage"] == "parse" and x["file"] == str(tmp_path / "input.jsonl") for x in published)
    assert [p.name for p in letters.iterdir() if not p.name.startswith("part-")] == []  # nothing staged left
