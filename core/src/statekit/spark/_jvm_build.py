"""Compiling the JVM locality helper: what the wheel's build hook runs, and an editable install on first use.

The helper is a few Java classes (``jvm/``) compiled against Spark's own jars:
``javac --release 17`` with ``<spark>/jars/*`` on the class path, as any Spark
library is compiled against Spark's ``provided`` API. The result is a jar and
a small manifest next to it (JSON) recording the jar's SHA-256, the Spark
version it was compiled against, and a digest of the sources::

    {"format": 1, "jar": "statekit-spark-locality.jar", "sha256": "…",
     "spark_version": "4.3.0", "java_release": 17, "sources_sha256": "…",
     "javac": "javac 17.0.15"}

``core/hatch_build.py`` (the wheel's build hook) puts both into the wheel as
``statekit/spark/jvm/``; :mod:`statekit.spark._jvm` loads the jar from the
installed package after checking it against the manifest. A wheel built with
``STATEKIT_BUILD_WITHOUT_JDK=1`` has a manifest whose ``jar`` is null and whose
``unavailable`` says why, so locality is off with that reason.

This module imports nothing but the standard library (and ``pyspark``, only
to find its jars): the build hook loads it by its path, before statekit is
installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path
from typing import Any

__all__ = [
    "JAR_NAME",
    "JAVA_RELEASE",
    "MANIFEST_NAME",
    "SOURCES",
    "WITHOUT_JDK_ENV",
    "HelperBuildError",
    "build_helper",
    "find_javac",
    "find_spark_jars",
    "sources_digest",
    "write_unavailable",
]

#: The jar's name in the wheel (``statekit/spark/jvm/``), and its manifest's.
JAR_NAME = "statekit-spark-locality.jar"
MANIFEST_NAME = "statekit-spark-locality.json"
#: Spark 4 runs on Java 17 and later: the classes must load on 17.
JAVA_RELEASE = 17
#: The Java sources, in this package.
SOURCES = Path(__file__).resolve().parent / "jvm"
#: Set to 1 to build a wheel without a JDK: its Spark queries run without task locality.
WITHOUT_JDK_ENV = "STATEKIT_BUILD_WITHOUT_JDK"
# Fixed time stamps make the jar's bytes (and so its SHA-256) depend on the classes only.
_EPOCH = (1980, 1, 1, 0, 0, 0)
_SPARK_CORE = re.compile(r"spark-core_[0-9.]+-([0-9][0-9A-Za-z.+-]*)\.jar")


class HelperBuildError(Exception):
    """The helper cannot be compiled here; the message says what is missing and what to do."""


def _java_sources(sources: Path) -> list[Path]:
    return sorted(sources.rglob("*.java"))


def sources_digest(sources: Path = SOURCES) -> str:
    """SHA-256 over the Java sources' relative paths and bytes."""
    digest = hashlib.sha256()
    for src in _java_sources(sources):
        digest.update(src.relative_to(sources).as_posix().encode() + b"\0" + src.read_bytes() + b"\0")
    return digest.hexdigest()


def find_javac() -> str:
    """A JDK's ``javac``: ``$JAVA_HOME/bin/javac``, else the one on ``PATH``.

    Raises:
        HelperBuildError: If there is none.
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", "javac")
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("javac")
    if found:
        return found
    raise HelperBuildError(
        f"compiling statekit's JVM locality helper needs a JDK {JAVA_RELEASE}+ (javac), and there is "
        "none in $JAVA_HOME/bin or on PATH (running the helper needs only a JRE)"
    )


def find_spark_jars() -> tuple[Path, str]:
    """Spark's jars to compile against and their Spark version: ``$SPARK_HOME/jars``, else PySpark's.

    Raises:
        HelperBuildError: If neither has Spark's jars.
    """
    homes = []
    if os.environ.get("SPARK_HOME"):
        homes.append(Path(os.environ["SPARK_HOME"]))
    try:
        import pyspark

        homes.append(Path(pyspark.__file__).resolve().parent)
    except ImportError:
        pass
    for home in homes:
        jars = home / "jars"
        if not jars.is_dir():
            continue
        for jar in sorted(jars.iterdir()):
            match = _SPARK_CORE.fullmatch(jar.name)
            if match:
                return jars, match[1]
    raise HelperBuildError(
        "compiling statekit's JVM locality helper needs Spark's jars (a spark-core_*.jar), and there "
        f"are none in {' or '.join(str(h / 'jars') for h in homes) or '$SPARK_HOME/jars (unset)'}. "
        "Build with PySpark installed (it is a build requirement of statekit-core), or set SPARK_HOME"
    )


def _javac_version(javac: str) -> str:
    done = subprocess.run([javac, "-version"], capture_output=True, text=True, check=False)
    return (done.stdout or done.stderr).strip()


def build_helper(out: Path, *, javac: str, jars: Path, spark_version: str, jar_name: str = JAR_NAME) -> Path:
    """Compile the helper into ``out``: the jar ``jar_name``, then its manifest; returns the manifest's path.

    Both files are written under fresh names and renamed into place, the
    manifest last, so a reader finds no manifest or a manifest whose jar is
    whole.

    Raises:
        HelperBuildError: If javac fails.
    """
    sources = _java_sources(SOURCES)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=out) as tmp:
        classes = Path(tmp) / "classes"
        cmd = [javac, "--release", str(JAVA_RELEASE), "-nowarn", "-d", str(classes), "-cp", str(jars / "*")]
        done = subprocess.run([*cmd, *map(str, sources)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise HelperBuildError(
                f"compiling statekit's JVM locality helper with {javac} against Spark {spark_version} "
                f"({jars}) failed (exit {done.returncode}):\n{done.stderr.strip()[-2000:]}"
            )
        staged = Path(tmp) / jar_name
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as z:
            manifest_mf = zipfile.ZipInfo("META-INF/MANIFEST.MF", _EPOCH)
            z.writestr(
                manifest_mf, "Manifest-Version: 1.0\r\nCreated-By: statekit\r\n\r\n", zipfile.ZIP_DEFLATED
            )
            for path in sorted(classes.rglob("*.class")):
                info = zipfile.ZipInfo(path.relative_to(classes).as_posix(), _EPOCH)
                z.writestr(info, path.read_bytes(), zipfile.ZIP_DEFLATED)
        manifest: dict[str, Any] = {
            "format": 1,
            "jar": jar_name,
            "sha256": hashlib.sha256(staged.read_bytes()).hexdigest(),
            "spark_version": spark_version,
            "java_release": JAVA_RELEASE,
            "sources_sha256": sources_digest(),
            "javac": _javac_version(javac),
        }
        staged_manifest = Path(tmp) / MANIFEST_NAME
        staged_manifest.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        os.replace(staged, out / jar_name)
        os.replace(staged_manifest, out / MANIFEST_NAME)
    return out / MANIFEST_NAME


def write_unavailable(out: Path, reason: str) -> Path:
    """A manifest without a jar, saying why (a wheel built without a JDK); returns its path."""
    path = out / MANIFEST_NAME
    path.write_text(json.dumps({"format": 1, "jar": None, "unavailable": reason}, indent=2) + "\n")
    return path
