"""Task locality on Spark: a small JVM helper that gives each subtask's task a preferred executor.

Nothing in PySpark sets a partition's preferred location: Spark's own state
stores do it in Scala (``StateStoreRDD.getPreferredLocations`` asks the
``StateStoreCoordinator``). statekit ships two Java classes (``jvm/``, about
a hundred lines): :class:`PreferredLocationsRDD` wraps the routed batch's RDD
without a shuffle of its own, names for partition ``i`` the executor that ran
subtask ``i`` last, and reports into an accumulator where each partition ran.
The driver keeps those reports for the next batch; the scheduler then runs the
task where its subtask's state is open, waiting up to ``spark.locality.wait``
(3 s by default) for that executor before it takes another one on the same
host, then any.

The classes are compiled once per machine against the installed PySpark
(``make install`` does it) into a cache directory: ``$STATEKIT_JVM_CACHE``, else
``$XDG_CACHE_HOME/statekit/jvm``, else ``~/.cache/statekit/jvm``, under the hash
of the sources and the Spark version. The driver loads them through its own
class loader and ships the jar to the executors with ``SparkContext.addJar``.

``statekit.spark.locality``: ``auto`` (the default) uses the helper when it can
be built and says once, as a warning and in every ``BatchInfo.locality``, why
not when it cannot; ``on`` makes a missing helper an error; ``off`` never asks
for a location. Spark Connect clients have no JVM gateway: there the value is
``"off: Spark Connect"`` and tasks go where Spark puts them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from .._errors import ConfigurationError

__all__ = ["JvmLocality", "LocalityUnavailable", "helper_jar"]

_SOURCES = Path(__file__).resolve().parent / "jvm"
_PACKAGE = "io.statekit.spark"
_LOCK = threading.Lock()


class LocalityUnavailable(ConfigurationError):
    """The locality helper could not be built or loaded; the message says why and what to do."""


def _sources() -> list[Path]:
    return sorted(_SOURCES.rglob("*.java"))


def _spark_jars() -> Path:
    import pyspark

    spark_home = os.environ.get("SPARK_HOME")
    for home in filter(None, [spark_home, os.path.dirname(pyspark.__file__)]):
        jars = Path(home) / "jars"
        if jars.is_dir():
            return jars
    raise LocalityUnavailable(
        "statekit.spark.locality: no Spark jars found (looked in $SPARK_HOME/jars and pyspark/jars); "
        "set statekit.spark.locality=off to run without task locality"
    )


def _cache_root() -> Path:
    configured = os.environ.get("STATEKIT_JVM_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "statekit" / "jvm"


def _javac() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", "javac")
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("javac")
    if found:
        return found
    raise LocalityUnavailable(
        "statekit.spark.locality: building the locality helper needs a JDK's javac (Spark itself needs "
        "only a JRE); none on PATH or in $JAVA_HOME/bin. Install a JDK 17+, or copy the cache "
        "directory of a machine with the same PySpark where it was built into $STATEKIT_JVM_CACHE, "
        "or set statekit.spark.locality=off"
    )


def helper_jar() -> str:
    """The helper's jar, compiled now if this machine's cache has none for these sources and Spark.

    Raises:
        LocalityUnavailable: If it cannot be built (no JDK, no Spark jars, a compile error).
    """
    import pyspark

    digest = hashlib.sha256(pyspark.__version__.encode())
    for src in _sources():
        digest.update(src.name.encode() + b"\0" + src.read_bytes())
    jar = _cache_root() / digest.hexdigest()[:16] / "statekit-spark-locality.jar"
    if jar.is_file():
        return str(jar)
    with _LOCK:
        if jar.is_file():
            return str(jar)
        javac = _javac()
        jar.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=jar.parent) as tmp:
            classes = os.path.join(tmp, "classes")
            cmd = [javac, "--release", "17", "-nowarn", "-d", classes, "-cp", str(_spark_jars() / "*")]
            done = subprocess.run([*cmd, *map(str, _sources())], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise LocalityUnavailable(
                    f"statekit.spark.locality: compiling the locality helper with {javac} failed "
                    f"(exit {done.returncode}):\n{done.stderr.strip()[-2000:]}\n"
                    "set statekit.spark.locality=off to run without task locality"
                )
            staged = os.path.join(tmp, jar.name)
            with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as z:
                z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: statekit\r\n\r\n")
                for path in sorted(Path(classes).rglob("*.class")):
                    z.write(path, path.relative_to(classes).as_posix())
            os.replace(staged, jar)  # atomic: a concurrent reader sees no jar or a whole one
    return str(jar)


class JvmLocality:
    """The driver's side of task locality for one query: where each subtask ran, and the next preference.

    Raises:
        LocalityUnavailable: From the constructor, if the helper cannot be built or loaded.
    """

    def __init__(self, session: SparkSession) -> None:
        jar = helper_jar()
        sc = session.sparkContext
        jvm: Any = sc._jvm
        gateway: Any = sc._gateway
        jsc: Any = sc._jsc.sc()
        try:
            url = jvm.java.io.File(jar).toURI().toURL()
            if not any(str(j).endswith("/" + os.path.basename(jar)) for j in _scala_iterable(jsc.listJars())):
                jsc.addJar(jar)
            urls = gateway.new_array(jvm.java.net.URL, 1)
            urls[0] = url
            parent = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
            loader = jvm.java.net.URLClassLoader(urls, parent)
            cls = jvm.java.lang.Class.forName(f"{_PACKAGE}.Locality", True, loader)
        except Exception as e:  # Py4J errors carry the Java exception as text
            raise LocalityUnavailable(
                f"statekit.spark.locality: loading the helper {jar} into the driver failed: {e}; "
                "set statekit.spark.locality=off to run without task locality"
            ) from e
        self._jvm, self._gateway, self._cls = jvm, gateway, cls
        self._acc: Any = None  # one accumulator per query run, reset before each batch
        #: subtask -> the executor location ("executor_<host>_<id>") that ran it last.
        self.last: dict[int, str] = {}

    def _static(self, name: str, *args: Any) -> Any:
        for method in self._cls.getMethods():
            if method.getName() == name:
                params = self._gateway.new_array(self._jvm.java.lang.Object, len(args))
                for i, a in enumerate(args):
                    params[i] = a
                return method.invoke(None, params)
        raise LocalityUnavailable(f"statekit.spark.locality: the helper has no method {name}")

    def prefer(self, df: DataFrame, parallelism: int) -> DataFrame:
        """``df`` (routed: partition i holds subtask i) with subtask i preferring where it ran last."""
        jvm, gateway = self._jvm, self._gateway
        string_array = jvm.java.lang.String
        outer = gateway.new_array(jvm.java.lang.String, parallelism, 0)
        for i in range(parallelism):
            where = self.last.get(i)
            if where is not None:
                inner = gateway.new_array(string_array, 1)
                inner[0] = where
                outer[i] = inner
        jdf: Any = df._jdf
        if self._acc is None:
            self._acc = self._static("accumulator", jdf)
        self._acc.reset()
        located = self._static("prefer", jdf, outer, self._acc)
        return DataFrame(located, df.sparkSession)

    def ran(self) -> dict[int, str]:
        """Where each partition of the last :meth:`prefer`'d batch ran; remembered for the next one.

        Spark merges the accumulator updates of a result task's first successful
        attempt only: each report names the executor of the attempt whose
        snapshot the checkpoint records, the one whose open state is reusable.
        """
        if self._acc is None:
            return {}
        reports: dict[int, str] = {}
        for entry in _scala_iterable(self._acc.value()):
            index, _, where = str(entry).partition("\t")
            with contextlib.suppress(ValueError):
                reports[int(index)] = where
        self._acc.reset()
        self.last.update(reports)
        return reports


def _scala_iterable(obj: Any) -> list[Any]:
    """The elements of a Java collection or a Scala collection returned through Py4J."""
    it = obj.iterator()
    out = []
    while it.hasNext():
        out.append(it.next())
    return out
