"""A LocalRunner that is never closed leaves no working directory behind.

Its docstring's example calls ``run`` and never ``close`` (no ``with``), and a
process can make many runners (a notebook, a test harness, a service). The
on-disk backends' directories (rocksdb, lmdb), and the heap's empty ones, are
removed when the runner is collected, and when the interpreter exits with one
still referenced; a killed process's are removed by the next run (see
``core/tests/test_localdirs.py``).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jobs import CountUrls, make_records
from statekit import LocalRunner, RecordSource

RECORDS = make_records(300, urls=20, seed=3)


def _runner(backend: str, local_dir: Path, checkpoints: Path) -> LocalRunner:
    return LocalRunner(
        CountUrls,
        key_selector=lambda r: r["url"],
        config={
            "statekit.backend": backend,
            "statekit.parallelism": 2,
            "statekit.local-dir": str(local_dir),
            "statekit.checkpoints.dir": str(checkpoints),
            "statekit.checkpoint.interval-records": 100,
        },
    )


@pytest.mark.parametrize("backend", ["heap", "rocksdb", "lmdb"])
def test_a_runner_dropped_without_close_removes_its_directory_when_collected(
    backend: str, tmp_path: Path
) -> None:
    local_dir = tmp_path / "local"
    for i in range(3):
        runner = _runner(backend, local_dir, tmp_path / f"ckpt-{i}")
        result = runner.run(RecordSource(RECORDS))
        assert result.records == len(RECORDS)
        assert len(os.listdir(local_dir)) == 1  # this runner's, while it is referenced
        del runner, result
        gc.collect()  # the runner and its subtasks form cycles: the collector frees them
        assert os.listdir(local_dir) == []
    # What the runs checkpointed is whole: a new runner restores the last one and closes.
    with _runner(backend, local_dir, tmp_path / "ckpt-2") as again:
        assert again.restore() is not None
        assert again.run(RecordSource([])).records == 0
    assert os.listdir(local_dir) == []


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_a_runner_still_referenced_at_exit_removes_its_directory(backend: str, tmp_path: Path) -> None:
    local_dir = tmp_path / "local"
    child = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_unclosed_runner import RECORDS, _runner
        from pathlib import Path
        from statekit import RecordSource
        RUNNER = _runner({backend!r}, Path({str(local_dir)!r}), Path({str(tmp_path / "ckpt")!r}))
        RUNNER.run(RecordSource(RECORDS))
        print(len(list(Path({str(local_dir)!r}).iterdir())))
        """
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"  # there while the runner lived
    assert done.stderr == ""
    assert os.listdir(local_dir) == []


def test_a_forked_child_leaves_its_parents_directory_alone(tmp_path: Path) -> None:
    local_dir = tmp_path / "local"
    child = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_unclosed_runner import RECORDS, _runner
        from pathlib import Path
        from statekit import RecordSource
        local = Path({str(local_dir)!r})
        runner = _runner("rocksdb", local, Path({str(tmp_path / "ckpt")!r}))
        runner.run(RecordSource(RECORDS))
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # the interpreter's exit runs the finalizers: the directory is the parent's
        os.waitpid(pid, 0)
        print(len(list(local.iterdir())))
        runner.process(RECORDS[0])
        assert runner.checkpoint() is not None  # a native checkpoint of its files: all there
        runner.close()
        print(len(list(local.iterdir())))
        """
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "0"]
