"""The JVM locality helper is loaded only when its manifest vouches for it; the hand-off says when it is off.

The wheel ships the helper compiled (``statekit/spark/jvm/``: the jar and a
manifest with its SHA-256 and Spark version); here the driver's view of the
installed package is pointed at directories laid out as a wheel installs
them, holding the real jar (as this editable install built it) or a planted one.
tests/test_wheelhouse.py builds and installs the real wheels.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pyspark
import pytest
from sparkutil import OUTPUT, SCHEMA, assert_exact_state

from jobs import CountUrls, make_records
from statekit.errors import ConfigurationError
from statekit.spark import _jvm, keyed
from statekit.spark._jvm_build import JAR_NAME, MANIFEST_NAME, HelperBuildError, find_javac, find_spark_jars

RECORDS = make_records(600)


def configure(session: Any, values: dict[str, Any]) -> None:
    for key, value in values.items():
        session.conf.set(key, str(value))


@pytest.fixture(scope="module")
def real_helper() -> _jvm.Helper:
    """The helper of this (editable) installation, built in core/build/jvm on first use."""
    return _jvm.helper_jar(pyspark.__version__)


def _installed(directory: Path, jar: bytes | None, **manifest: Any) -> Path:
    """``directory`` laid out as an installed wheel's statekit/spark/jvm/: a jar and its manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    if jar is not None:
        (directory / JAR_NAME).write_bytes(jar)
    (directory / MANIFEST_NAME).write_text(json.dumps({"format": 1, "jar": JAR_NAME, **manifest}))
    return directory


def _planted_jar(tmp_path: Path, marker: Path) -> bytes:
    """A jar with statekit's entry class whose static initializer creates ``marker``: code not to run."""
    try:
        javac = find_javac()
    except HelperBuildError:
        pytest.skip("needs a JDK's javac to compile the planted class")
    src = tmp_path / "planted" / "io" / "statekit" / "spark" / "Locality.java"
    src.parent.mkdir(parents=True)
    src.write_text(
        "package io.statekit.spark;\n"
        "public final class Locality {\n"
        "  static { try { new java.io.File(" + json.dumps(str(marker)) + ").createNewFile(); }\n"
        "           catch (java.io.IOException e) { throw new RuntimeException(e); } }\n"
        "}\n"
    )
    classes = tmp_path / "planted-classes"
    subprocess.run([javac, "-d", str(classes), str(src)], check=True, capture_output=True)
    jar = tmp_path / "planted.jar"
    subprocess.run(
        [str(Path(javac).with_name("jar")), "cf", str(jar), "-C", str(classes), "."],
        check=True,
        capture_output=True,
    )
    return jar.read_bytes()


def _run(session: Any, job_id: str) -> Any:
    df = session.createDataFrame(RECORDS, SCHEMA)
    return keyed(df, "url").process(CountUrls, OUTPUT, job_id=job_id)


def test_an_installed_jar_that_is_not_the_one_its_build_recorded_is_never_loaded(
    session: Any, tmp_path: Path, job_id: str, monkeypatch: pytest.MonkeyPatch, real_helper: _jvm.Helper
) -> None:
    """Planted over the installed jar: auto runs without locality, saying why; its code never runs."""
    marker = tmp_path / "the-planted-class-ran"
    recorded = hashlib.sha256(Path(real_helper.jar).read_bytes()).hexdigest()
    package = _installed(
        tmp_path / "site-packages" / "statekit" / "spark" / "jvm",
        _planted_jar(tmp_path, marker),
        sha256=recorded,
        spark_version=pyspark.__version__,
    )
    monkeypatch.setattr(_jvm, "_INSTALLED", package)
    configure(session, {"spark.statekit.checkpoints.dir": tmp_path / "ckpt", "spark.statekit.parallelism": 2})
    processed = _run(session, job_id)
    with pytest.warns(RuntimeWarning, match="is not the jar its build recorded"):
        info = processed.run()
    assert info.locality.startswith(
        f"off: statekit.spark.locality: the locality helper {package / JAR_NAME} is not the jar its build "
        f"recorded in {package / MANIFEST_NAME} (SHA-256 "
    ), info.locality
    assert f"recorded {recorded})" in info.locality and "Reinstall statekit-core" in info.locality
    assert info.subtask_locations == {} and not marker.exists()
    assert_exact_state(processed.checkpoint_storage(), job_id, RECORDS)
    session.conf.set("spark.statekit.spark.locality", "on")
    with pytest.raises(ConfigurationError, match="is not the jar its build recorded"):
        _run(session, job_id).run()
    assert not marker.exists()
    # The control: loaded, the planted class does run its static initializer in the driver's JVM.
    jvm, gateway = session.sparkContext._jvm, session.sparkContext._gateway
    urls = gateway.new_array(jvm.java.net.URL, 1)
    urls[0] = jvm.java.io.File(str(package / JAR_NAME)).toURI().toURL()
    jvm.java.lang.Class.forName("io.statekit.spark.Locality", True, jvm.java.net.URLClassLoader(urls))
    assert marker.exists()


def test_a_jar_checked_once_is_checked_again_when_it_is_replaced_or_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_helper: _jvm.Helper
) -> None:
    """helper_jar does not hash an unchanged jar again within a process; any change is hashed."""
    jar, package, hashed = _installed_and_counted(tmp_path, monkeypatch, real_helper)
    _written_long_ago(package)  # as an installed wheel's files are
    first = _jvm.helper_jar("4.3.0")
    assert _jvm.helper_jar("4.3.0") == first and len(hashed) == 1  # unchanged: not read again
    replacement = package / "planted.jar"
    replacement.write_bytes(jar[:-1] + bytes([jar[-1] ^ 1]))  # one bit off, same size
    os.replace(replacement, package / JAR_NAME)  # a new inode under the same name
    with pytest.raises(_jvm.LocalityUnavailable, match="is not the jar its build recorded"):
        _jvm.helper_jar("4.3.0")
    (package / JAR_NAME).write_bytes(jar)  # the same inode, written back
    _written_long_ago(package)
    assert _jvm.helper_jar("4.3.0") == first
    with open(package / JAR_NAME, "r+b") as f:  # written in place, size kept
        f.seek(len(jar) - 1)
        f.write(bytes([jar[-1] ^ 1]))
    with pytest.raises(_jvm.LocalityUnavailable, match="is not the jar its build recorded"):
        _jvm.helper_jar("4.3.0")
    assert len(hashed) == 4


def test_a_jar_written_just_before_its_check_is_checked_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_helper: _jvm.Helper
) -> None:
    """File times tick coarsely: a check just after a write is not remembered (a later write may not show)."""
    jar, package, hashed = _installed_and_counted(tmp_path, monkeypatch, real_helper)
    first = _jvm.helper_jar("4.3.0")
    assert _jvm.helper_jar("4.3.0") == first and len(hashed) == 2
    _written_long_ago(package)
    assert _jvm.helper_jar("4.3.0") == first and _jvm.helper_jar("4.3.0") == first and len(hashed) == 3


def _installed_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_helper: _jvm.Helper
) -> tuple[bytes, Path, list[str]]:
    """The real helper installed as a wheel's (for Spark 4.3.0), and the list each check of it appends to."""
    jar = Path(real_helper.jar).read_bytes()
    package = _installed(tmp_path / "jvm", jar, sha256=hashlib.sha256(jar).hexdigest(), spark_version="4.3.0")
    monkeypatch.setattr(_jvm, "_INSTALLED", package)
    hashed: list[str] = []
    verified = _jvm._verified
    monkeypatch.setattr(_jvm, "_verified", lambda m, v: (hashed.append(str(m)), verified(m, v))[1])
    return jar, package, hashed


def _written_long_ago(directory: Path) -> None:
    """Set the modification time of every file in ``directory`` a minute back."""
    for path in directory.iterdir():
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 60_000_000_000))


def test_a_helper_compiled_for_another_spark_minor_version_is_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_helper: _jvm.Helper
) -> None:
    jar = Path(real_helper.jar).read_bytes()
    digest = hashlib.sha256(jar).hexdigest()
    package = _installed(tmp_path / "jvm", jar, sha256=digest, spark_version="3.5.1")
    monkeypatch.setattr(_jvm, "_INSTALLED", package)
    with pytest.raises(_jvm.LocalityUnavailable) as e:
        _jvm.helper_jar("4.3.0")
    assert str(e.value) == (
        f"statekit.spark.locality: the locality helper {package / JAR_NAME} was compiled against "
        "Spark 3.5.1, and this driver runs Spark 4.3.0. Install the PySpark it was built for (pip install "
        "'pyspark==3.5.*'), or a statekit-core wheel built against Spark 4.3 (make wheels with that PySpark "
        "installed), or set statekit.spark.locality=off to run without task locality"
    )
    # Another patch release of the same minor version fits.
    _installed(tmp_path / "jvm", jar, sha256=digest, spark_version="4.3.9")
    assert _jvm.helper_jar("4.3.0") == _jvm.Helper(
        str(package / JAR_NAME), "4.3.9", str(package / MANIFEST_NAME)
    )


def test_a_wheel_built_without_a_jdk_runs_without_locality_and_says_so(
    session: Any, tmp_path: Path, job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reason = (
        "this statekit-core wheel was built without a JDK (STATEKIT_BUILD_WITHOUT_JDK=1), so it has no helper"
    )
    package = tmp_path / "jvm"
    package.mkdir()
    (package / MANIFEST_NAME).write_text(json.dumps({"format": 1, "jar": None, "unavailable": reason}))
    monkeypatch.setattr(_jvm, "_INSTALLED", package)
    configure(session, {"spark.statekit.checkpoints.dir": tmp_path / "ckpt", "spark.statekit.parallelism": 2})
    processed = _run(session, job_id)
    with pytest.warns(RuntimeWarning, match="built without a JDK"):
        info = processed.run()
    assert (
        info.locality
        == f"off: statekit.spark.locality: {reason}; set statekit.spark.locality=off to run "
        + ("without task locality")
    )
    assert_exact_state(processed.checkpoint_storage(), job_id, RECORDS)


def test_an_installation_without_the_helper_says_how_to_get_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_jvm, "_INSTALLED", tmp_path / "jvm")
    monkeypatch.setattr(_jvm, "_source_tree", lambda: None)
    with pytest.raises(_jvm.LocalityUnavailable, match=r"has no locality helper .* \(make wheels builds one"):
        _jvm.helper_jar(pyspark.__version__)


def test_an_editable_build_directory_another_user_prepared_is_refused(
    second_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The editable install's build tree is checked as any directory statekit writes: no planted jar loads."""
    top = tempfile.mkdtemp(prefix="statekit-jvm-", dir="/tmp")
    try:
        os.chmod(top, 0o755)
        core = Path(top) / "core"
        core.mkdir()
        os.chmod(core, 0o777)  # a checkout others may write into: refused itself, as a parent
        monkeypatch.setattr(_jvm, "_INSTALLED", Path(top) / "no-wheel")
        monkeypatch.setattr(_jvm, "_source_tree", lambda: core)
        with pytest.raises(_jvm.LocalityUnavailable, match=f"lies below {core}, which can be written by"):
            _jvm.helper_jar(pyspark.__version__)
        os.chmod(core, 0o1777)  # sticky, as /tmp: no one renames another's entries; build is checked next
        second_user.run("mkdir", "-m", "0755", str(core / "build"))  # ready before the first query
        with pytest.raises(_jvm.LocalityUnavailable) as e:
            _jvm.helper_jar(pyspark.__version__)
        message = str(e.value)
        assert message.startswith(f"statekit.spark.locality: this editable install of statekit-core ({core})")
        assert (
            f"the locality helper's build directory {core / 'build'} belongs to user id {second_user.uid}"
            in (message)
        )
        assert os.listdir(core / "build") == []
    finally:
        shutil.rmtree(top)


def test_the_editable_build_compiles_against_the_installed_spark(real_helper: _jvm.Helper) -> None:
    manifest = json.loads(Path(real_helper.manifest).read_text())
    jars, version = find_spark_jars()
    assert manifest["spark_version"] == version == real_helper.spark_version
    assert manifest["sha256"] == hashlib.sha256(Path(real_helper.jar).read_bytes()).hexdigest()
    build = Path(real_helper.jar).parents[2]  # core/build/jvm/<key>/<jar>
    assert build.name == "build" and build.parent.joinpath("hatch_build.py").is_file()
    assert os.stat(Path(real_helper.jar).parent).st_mode & 0o077 == 0


def test_batch_info_says_whether_the_handoff_is_on(session: Any, tmp_path: Path, job_id: str) -> None:
    configure(session, {"spark.statekit.checkpoints.dir": tmp_path / "ckpt", "spark.statekit.parallelism": 2})
    assert _run(session, job_id).run().handoff == "on"
    session.conf.set("spark.statekit.spark.worker-handoff", "false")
    assert _run(session, job_id).run().handoff == "off: statekit.spark.worker-handoff=false"


def test_a_handoff_directory_another_user_prepared_shows_in_batch_info(
    session: Any, tmp_path: Path, job_id: str, second_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The executors' TMPDIR holds statekit-<uid> made by another user: the hand-off is off, and says why."""
    top = tempfile.mkdtemp(prefix="statekit-handoff-", dir="/tmp")
    try:
        os.chmod(top, 0o755)
        tmp = Path(top) / "tmp"
        tmp.mkdir()
        os.chmod(tmp, 0o1777)
        prepared = tmp / f"statekit-{os.getuid()}"
        second_user.run("mkdir", "-m", "0777", str(prepared))
        # What spark.executorEnv.TMPDIR does on a cluster: Python workers of their own, with this TMPDIR.
        monkeypatch.setitem(session.sparkContext.environment, "TMPDIR", str(tmp))
        configure(
            session, {"spark.statekit.checkpoints.dir": tmp_path / "ckpt", "spark.statekit.parallelism": 2}
        )
        first = _run(session, job_id).run()
        assert first.handoff.startswith(
            f"off: the hand-off directory {prepared} belongs to user id {second_user.uid}, not to the "
            "running user (0)"
        ), first.handoff
        assert "spark.executorEnv.TMPDIR" in first.handoff
        assert os.listdir(prepared) == []
        processed = _run(session, job_id)
        assert processed.run().handoff == first.handoff
        assert_exact_state(processed.checkpoint_storage(), job_id, RECORDS + RECORDS)
    finally:
        shutil.rmtree(top)


def test_a_jar_with_statekits_class_names_on_spark_jars_turns_locality_off_and_never_runs(
    tmp_path: Path, real_helper: _jvm.Helper
) -> None:
    """The classes that run must be the checked ones: a class loader asks its parent first (spark.jars)."""
    import sys

    marker = tmp_path / "the-other-class-ran"
    other = tmp_path / "other" / "statekit-spark-locality.jar"  # named like statekit's, too
    other.parent.mkdir()
    other.write_bytes(_planted_jar(tmp_path, marker))
    driver = Path(__file__).with_name("classpath_driver.py")
    done = subprocess.run(
        [sys.executable, str(driver), str(other)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    first = out["spark.jars"]
    assert first is not None and first.startswith(
        "statekit.spark.locality: spark.jars ships io/statekit/spark/Locality.class to the executors "
        f"from {other}, not from the checked helper {real_helper.jar}"
    ), first
    assert f"Remove {other} from spark.jars" in first and "statekit.spark.locality=off" in first
    # The driver's own check: the class its parent-first loader gives comes from the other jar.
    assert out["parent gives"].endswith(str(other)), out
    second = out["code source"]
    assert second is not None and second.startswith(
        f"statekit.spark.locality: the class io.statekit.spark.Locality that Spark loads comes from {other}"
    ), second
    assert not marker.exists()  # its static initializer never ran: checked before initialisation
