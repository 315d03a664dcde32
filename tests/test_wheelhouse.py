"""The wheelhouse (issue #33): ``make wheels``, then ``pip install --find-links`` into a fresh virtualenv.

statekit is not on PyPI, so ``pip install "statekit[rocksdb]"`` finds nothing:
``make wheels`` builds every distribution's wheel into a directory, and pip
installs any extras from it. statekit-core's wheel ships the JVM locality
helper compiled (its build hook needs a JDK), so the installed package runs
with a JRE only: here a runtime image made with ``jlink`` that has no
``javac``, and a ``PATH`` without one, on a standalone cluster.

Nightly: building eight wheels, a JRE image and a virtualenv with PySpark
takes minutes (about six on the two-core development machine); pip needs the
package index for the third-party requirements.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.nightly

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = [
    "statekit",
    "statekit_core",
    "statekit_heap",
    "statekit_lmdb",
    "statekit_rocksdb",
    "statekit_sqlite",
    "statekit_storage",
    "statekit_urlcount",
]
HELPER = "statekit/spark/jvm/statekit-spark-locality.jar"
MANIFEST = "statekit/spark/jvm/statekit-spark-locality.json"
# Modules of a JDK that a JRE has not: the compiler and the tools around it.
JDK_ONLY = {
    "jdk.compiler", "jdk.javadoc", "jdk.jshell", "jdk.jdeps", "jdk.jlink", "jdk.jpackage", "jdk.jartool",
    "jdk.editpad", "jdk.internal.ed", "jdk.internal.le", "jdk.internal.opt", "jdk.jconsole", "jdk.jdi",
    "jdk.hotspot.agent", "jdk.jstatd", "jdk.jcmd",
}  # fmt: skip


def _javac() -> Path:
    from statekit.spark._jvm_build import HelperBuildError, find_javac

    try:
        return Path(find_javac()).resolve()
    except HelperBuildError:
        pytest.skip("building statekit-core's wheel needs a JDK's javac")


def _path_without_a_jdk(directory: Path) -> str:
    """A PATH of links to everything in /usr/bin and /bin but the JDK's tools (Debian links javac there)."""
    directory.mkdir(parents=True, exist_ok=True)
    for bin_dir in ("/usr/local/bin", "/usr/bin", "/bin"):
        for entry in sorted(Path(bin_dir).iterdir()) if Path(bin_dir).is_dir() else []:
            link = directory / entry.name
            if link.exists() or link.is_symlink() or "/jvm/" in str(entry.resolve()):
                continue
            link.symlink_to(entry)
    return str(directory)


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _javac()
    out = tmp_path_factory.mktemp("wheelhouse")
    subprocess.run(
        ["make", "--no-print-directory", "wheels", f"WHEELHOUSE={out}", f"PYTHON={sys.executable}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return out


@pytest.fixture(scope="module")
def jre(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Java runtime image without a compiler (jlink of the JDK's modules minus its tools)."""
    jdk = _javac().parent.parent
    jlink = jdk / "bin" / "jlink"
    if not jlink.exists() or not (jdk / "jmods").is_dir():
        pytest.skip(f"needs jlink and the JDK's jmods to make a JRE-only runtime ({jdk})")
    listed = subprocess.run(
        [str(jdk / "bin" / "java"), "--list-modules"], capture_output=True, text=True, check=True
    )
    modules = sorted({m.split("@")[0] for m in listed.stdout.split()} - JDK_ONLY)
    out = tmp_path_factory.mktemp("jre") / "jre"
    subprocess.run(
        [str(jlink), "--add-modules", ",".join(modules), "--output", str(out), "--strip-debug",
         "--no-man-pages", "--no-header-files"],
        check=True, capture_output=True,
    )  # fmt: skip
    assert not (out / "bin" / "javac").exists()
    return out


def test_make_wheels_builds_every_distribution_and_core_ships_the_helper(wheelhouse: Path) -> None:
    wheels = sorted(p.name for p in wheelhouse.glob("*.whl"))
    assert [w.split("-")[0] for w in wheels] == DISTRIBUTIONS, wheels
    with zipfile.ZipFile(next(wheelhouse.glob("statekit_core-*.whl"))) as core:
        names = core.namelist()
        assert HELPER in names and MANIFEST in names
        assert not [n for n in names if n.endswith(".java")]  # the sources stay in the sdist
        manifest = json.loads(core.read(MANIFEST))
        import hashlib

        assert manifest["jar"] == "statekit-spark-locality.jar"
        assert manifest["sha256"] == hashlib.sha256(core.read(HELPER)).hexdigest()
        assert manifest["spark_version"].startswith("4.") and manifest["java_release"] == 17


def test_the_wheels_install_with_extras_and_run_on_a_cluster_with_a_jre_only(
    wheelhouse: Path, jre: Path, tmp_path: Path
) -> None:
    """pip install --find-links <wheelhouse> "statekit[rocksdb,spark]"; locality on with no javac anywhere."""
    with zipfile.ZipFile(next(wheelhouse.glob("statekit_core-*.whl"))) as core:
        built_for = json.loads(core.read(MANIFEST))["spark_version"]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # The PySpark the helper was compiled against (pip would take the newest otherwise).
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(f"pyspark=={built_for}\n")
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--find-links", str(wheelhouse), "-c", str(constraints),
         "statekit[rocksdb,spark]"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    path = _path_without_a_jdk(tmp_path / "bin")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_", "PYTHON"))},
        "JAVA_HOME": str(jre),
        "PATH": f"{venv / 'bin'}:{jre / 'bin'}:{path}",
    }
    done = subprocess.run(
        [str(python), str(ROOT / "tests" / "wheelhouse_driver.py"), str(tmp_path / "work")],
        env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    site = str(venv / "lib")
    assert report["statekit"].startswith(site) and report["helper"].startswith(site), report
    assert report["helper"].endswith(HELPER) and report["javac_on_path"] is None
    assert report["java_home"] == str(jre) and report["jvm_java_home"] == str(jre)
    batches = report["batches"]
    assert [b["locality"] for b in batches] == ["on", "on", "on"], batches
    assert all(set(b["subtask_locations"]) == {"0", "1"} for b in batches), batches
    assert batches[-1]["reused_subtasks"] >= 1, batches  # the tasks went where the state was open
    assert report["state_exact"] is True


def test_without_a_jdk_the_core_wheel_fails_to_build_or_says_it_has_no_helper(tmp_path: Path) -> None:
    _javac()
    path = _path_without_a_jdk(tmp_path / "bin")
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = f"{Path(sys.executable).parent}:{path}"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path / "out"), str(ROOT / "core")]
    failed = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert failed.returncode != 0
    assert "needs a JDK 17+ (javac), and there is none" in failed.stdout + failed.stderr
    assert "STATEKIT_BUILD_WITHOUT_JDK=1" in failed.stdout + failed.stderr
    done = subprocess.run(cmd, env={**env, "STATEKIT_BUILD_WITHOUT_JDK": "1"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    with zipfile.ZipFile(next((tmp_path / "out").glob("statekit_core-*.whl"))) as core:
        assert HELPER not in core.namelist()
        manifest = json.loads(core.read(MANIFEST))
    assert manifest["jar"] is None
    assert manifest["unavailable"].startswith("this statekit-core wheel was built without a JDK")


def test_every_install_command_of_the_docs_runs_as_written_in_a_fresh_virtualenv(
    wheelhouse: Path, tmp_path: Path
) -> None:
    """Issue 43: each ``pip install --find-links wheelhouse …`` of README.md and docs/, as written.

    They run one after the other in one fresh virtualenv, from a folder whose
    ``wheelhouse/`` is the one ``make wheels`` built; then the Quickstart's
    example package is there (its command, its module) and so are the backends.
    """
    sys.path.insert(0, str(ROOT / "tests"))
    from docblocks import pip_commands

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    work = tmp_path / "work"
    work.mkdir()
    (work / "wheelhouse").symlink_to(wheelhouse)
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYSPARK_", "SPARK_", "PYTHON", "VIRTUAL_ENV"))
        },
        "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}",
    }
    ran = set()
    for where, command in pip_commands():
        if command in ran:
            continue
        ran.add(command)
        done = subprocess.run(
            ["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=1200
        )
        assert done.returncode == 0, f"{where}: {command}\n{done.stderr[-3000:]}"
    assert len(ran) >= 7, ran
    python = str(venv / "bin" / "python")
    check = "import statekit_urlcount, statekit_rocksdb, statekit_lmdb, statekit.spark, pyarrow; print('ok')"
    assert (
        subprocess.run([python, "-c", check], env=env, capture_output=True, text=True).stdout.strip() == "ok"
    )
    done = subprocess.run(["statekit-urlcount", "--help"], cwd=work, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "generate" in done.stdout, done.stderr
