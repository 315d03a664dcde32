"""Making the tests' Spark class-data archive (tests/jvmarchive.py) when two test runs start together."""

from __future__ import annotations

import fcntl
from pathlib import Path

import jvmarchive  # tests/, on pytest's pythonpath


def test_a_second_making_leaves_the_first_ones_files_alone(tmp_path: Path) -> None:
    """While one run holds the making's lock, another neither deletes its .tmp nor starts a JVM."""
    path = tmp_path / "spark-cds" / "spark-9.9.9-1.jsa"
    path.parent.mkdir()
    in_progress = path.parent / "spark-9.9.9-1.jsa.abc123.tmp"  # the first run's JVM writing it
    in_progress.write_bytes(b"half an archive")
    with open(path.parent / jvmarchive._LOCK_NAME, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first run's making
        making = jvmarchive.Making(path)
        said = making.wait(60)
    assert said == f"not made here: another test run is making it in {path.parent}"
    assert in_progress.read_bytes() == b"half an archive"
    assert not path.exists()


def test_a_making_after_another_finished_takes_its_archive(tmp_path: Path) -> None:
    path = tmp_path / "spark-cds" / "spark-9.9.9-1.jsa"
    path.parent.mkdir()
    path.write_bytes(b"an archive")  # made by the run that held the lock first
    assert jvmarchive.Making(path).wait(60) == str(path)
    assert path.read_bytes() == b"an archive"
