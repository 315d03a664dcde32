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
from statekit import LocalRunner, default_registry, load_checkpoint

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
