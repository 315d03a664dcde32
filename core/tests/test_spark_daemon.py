"""statekit_spark_daemon: where the daemon imports pyspark from, what it collects after a task (no Spark)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import types
import weakref
import zipfile
from pathlib import Path
from typing import Any

import pytest

from statekit_spark_daemon import COMPARED, installed_pyspark, young_collections_after_tasks


def _zip(path: Path, files: dict[str, bytes]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return str(path)


def _tree(root: Path, files: dict[str, bytes]) -> str:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return str(root)


FILES = {name: f"# {name}\n".encode() for name in COMPARED}


def test_the_installed_package_is_chosen_where_its_files_are_the_zips(tmp_path: Path) -> None:
    zipped = _zip(tmp_path / "lib" / "pyspark.zip", FILES)
    site = _tree(tmp_path / "site", FILES)
    other = _tree(tmp_path / "other", {"x.py": b""})
    assert installed_pyspark([zipped, other, site]) == site


@pytest.mark.parametrize("name", COMPARED)
def test_a_single_differing_file_keeps_the_zip(tmp_path: Path, name: str) -> None:
    zipped = _zip(tmp_path / "lib" / "pyspark.zip", FILES)
    site = _tree(tmp_path / "site", {**FILES, name: FILES[name] + b"# another build\n"})
    assert installed_pyspark([zipped, site]) is None


def test_a_missing_file_keeps_the_zip(tmp_path: Path) -> None:
    zipped = _zip(tmp_path / "lib" / "pyspark.zip", FILES)
    site = _tree(tmp_path / "site", {n: d for n, d in FILES.items() if n != "pyspark/worker.py"})
    assert installed_pyspark([zipped, site]) is None


def test_nothing_to_do_without_the_zip_or_with_a_package_before_it(tmp_path: Path) -> None:
    zipped = _zip(tmp_path / "lib" / "pyspark.zip", FILES)
    site = _tree(tmp_path / "site", FILES)
    assert installed_pyspark([site]) is None  # no zip: Python imports the installed one already
    assert installed_pyspark([site, zipped]) is None  # the directory comes first: the same
    assert installed_pyspark([zipped]) is None  # nothing installed beside it


def test_the_first_directory_after_the_zip_decides(tmp_path: Path) -> None:
    """Python would import the first ``pyspark`` after the zip: that one is compared, no later one."""
    zipped = _zip(tmp_path / "lib" / "pyspark.zip", FILES)
    stale = _tree(tmp_path / "stale", {**FILES, "pyspark/version.py": b'__version__ = "0"\n'})
    site = _tree(tmp_path / "site", FILES)
    assert installed_pyspark([zipped, stale, site]) is None


def test_a_zip_without_pyspark_is_passed_over(tmp_path: Path) -> None:
    empty = _zip(tmp_path / "a" / "pyspark.zip", {"readme.txt": b""})
    broken = tmp_path / "b" / "pyspark.zip"
    broken.parent.mkdir()
    broken.write_bytes(b"not a zip")
    zipped = _zip(tmp_path / "lib" / "pyspark.zip", FILES)
    site = _tree(tmp_path / "site", FILES)
    assert installed_pyspark([str(empty), str(broken), zipped, site]) == site


def test_a_worker_path_of_the_installed_pyspark_imports_it_from_the_package() -> None:
    """The real PySpark: its shipped zip equals its package; the daemon's imports come from the package."""
    pyspark = pytest.importorskip("pyspark")
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    zips = sorted(str(p) for p in lib.glob("*.zip"))
    if not any(z.endswith("pyspark.zip") for z in zips):
        pytest.skip(f"this PySpark ships no pyspark.zip in {lib}")
    zips.sort(key=lambda z: not z.endswith("pyspark.zip"))  # as Spark orders a worker's path
    code = (
        "import os, statekit_spark_daemon as d; chosen = d.use_installed_pyspark(); import pyspark.daemon; "
        "threads = len(os.listdir('/proc/self/task')) if os.path.isdir('/proc/self/task') else 1; "
        "import pyspark.worker; print(chosen); print(pyspark.worker.__file__); print(threads)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(zips)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    chosen, worker, threads = done.stdout.split()
    assert chosen == str(Path(pyspark.__file__).parent.parent)
    assert worker == str(Path(pyspark.__file__).parent / "worker.py")
    assert threads == "1"  # what the daemon has when it forks: no thread besides its own
    # Without it, the same path imports from the zip: what the daemon module changes.
    plain = subprocess.run(
        [sys.executable, "-c", "import pyspark.worker; print(pyspark.worker.__file__)"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "pyspark.zip" in plain.stdout


@pytest.mark.parametrize(
    ("key", "refused"),
    [
        ("spark.python.deamon.module", True),
        ("spark.pyhton.daemon.module", True),
        ("spark.python.daemon.modules", True),
        ("Spark.Python.Daemon.Module", True),
        ("spark.python.daemon.module", False),  # the key itself
        ("spark.python.worker.module", False),  # Spark's other keys near it
        ("spark.python.use.daemon", False),
        ("spark.python.daemon.workerModule", False),
        ("spark.statekit.backend", False),
    ],
)
def test_near_misses_of_the_daemon_module_key_are_refused_and_spark_s_own_keys_are_not(
    key: str, refused: bool
) -> None:
    pytest.importorskip("pyspark")
    from statekit.errors import ConfigurationError
    from statekit.spark._sparkconf import _refuse_misspelt_daemon_key

    if refused:
        with pytest.raises(ConfigurationError, match=rf"unknown Spark setting {key}; Did you mean "):
            _refuse_misspelt_daemon_key(["spark.app.name", key])
    else:
        _refuse_misspelt_daemon_key(["spark.app.name", key])


class _Cycle:
    """An object in a reference cycle of its own: only a collection frees it."""

    def __init__(self) -> None:
        self.me = self


def _old_cycle() -> weakref.ref[_Cycle]:
    """A cycle that lived through a full collection (in the oldest generation), no longer referenced."""
    held = _Cycle()
    gc.collect()
    ref = weakref.ref(held)
    del held
    return ref


def test_the_daemon_s_collection_after_a_task_is_of_the_young_generations() -> None:
    daemon = types.ModuleType("fake_daemon")
    daemon.gc = gc  # type: ignore[attr-defined]  # as pyspark.daemon imports it
    assert young_collections_after_tasks(daemon)
    shim: Any = daemon.gc  # type: ignore[attr-defined]
    assert shim is not gc
    assert shim.get_threshold() == gc.get_threshold()  # every other name is gc's own
    automatic = gc.isenabled()
    gc.disable()  # no automatic collection may run between the steps below
    try:
        old = _old_cycle()
        young = _Cycle()
        young_ref = weakref.ref(young)
        del young
        shim.collect()  # what the daemon runs after a task: gc.collect()
        assert young_ref() is None  # the task's garbage is collected
        assert old() is not None  # what lived through a full collection waits for the next full one
        gc.collect()
        assert old() is None
    finally:
        if automatic:
            gc.enable()


def test_a_daemon_without_a_gc_global_is_left_as_it_is() -> None:
    daemon = types.ModuleType("fake_daemon")
    assert not young_collections_after_tasks(daemon)
    assert not hasattr(daemon, "gc")
    daemon.gc = object()  # type: ignore[attr-defined]  # something else under that name: not ours to replace
    assert not young_collections_after_tasks(daemon)
