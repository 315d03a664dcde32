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

The same helper holds ``StatekitSource``, statekit's source in the driver's
metrics system (:mod:`._metrics`), which :func:`load_helper_class` loads.

The classes ship compiled, in the ``statekit-core`` wheel, as PySpark ships
its jars and Apache Sedona its own: the wheel's build hook
(``core/hatch_build.py``, see :mod:`._jvm_build`) compiles them against the
PySpark of the build, and installs the jar with a manifest recording its
SHA-256 and that Spark version as package data (``statekit/spark/jvm/``).
Here the driver checks the installed jar against the manifest, and the
running Spark's major.minor version against the one the jar was compiled
for, before it loads the jar through its own class loader and ships it to
the executors with ``SparkContext.addJar``. A class loader asks its parent
first, so a jar with the same class names on Spark's classpath (``spark.jars``,
``--jars``, ``spark.driver.extraClassPath``) would run instead of the checked
one: the driver checks where each class it loads came from (its code source
is the checked jar) and that no jar Spark ships to the executors holds
``io/statekit/spark/`` classes; else the helper is not used, and locality is
off with the reason. Nothing is compiled at run time,
nothing is written, and a JRE is all a cluster needs. An editable install
(``pip install -e ./core``) has no built jar: it compiles one on first use
into its own source tree (``core/build/jvm/``, private to the user), which
needs a JDK there.

``statekit.spark.locality``: ``auto`` (the default) uses the helper when it
loads and says once, as a warning and in every ``BatchInfo.locality``, why
not when it does not; ``on`` makes that an error; ``off`` never asks for a
location. Spark Connect clients have no JVM gateway: there the value is
``"off: Spark Connect"`` and tasks go where Spark puts them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from .._errors import ConfigurationError, UnsafeLocalPathError
from .._localfs import private_dir, settled_before
from ._jvm_build import (
    MANIFEST_NAME,
    SOURCES,
    HelperBuildError,
    build_helper,
    find_javac,
    find_spark_jars,
    sources_digest,
)
from ._sparkconf import app_setting

__all__ = ["Helper", "JvmLocality", "LocalityUnavailable", "helper_jar", "load_helper_class"]

_PACKAGE = "io.statekit.spark"
_LOCK = threading.Lock()
#: Where an installed wheel keeps the jar and its manifest (package data).
_INSTALLED = Path(__file__).resolve().parent / "jvm"
_OFF = "set statekit.spark.locality=off to run without task locality"


class LocalityUnavailable(ConfigurationError):
    """The locality helper could not be loaded; the message says why and what to do."""


@dataclass(frozen=True)
class Helper:
    """The helper's jar, checked against its manifest, and the Spark version it was compiled against."""

    jar: str
    spark_version: str
    manifest: str


def _source_tree() -> Path | None:
    """``core/`` when statekit runs from its source tree (an editable install), else None."""
    here = Path(__file__).resolve()  # core/src/statekit/spark/_jvm.py
    src, core = here.parents[2], here.parents[3]
    if src.name == "src" and (core / "hatch_build.py").is_file() and (core / "pyproject.toml").is_file():
        return core
    return None


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])


def _verified(manifest_path: Path, running: str) -> Helper:
    """The helper that ``manifest_path`` describes, if it fits Spark ``running`` and its digest.

    Raises:
        LocalityUnavailable: If the manifest says there is no jar, the jar was
            compiled for another Spark major.minor, or its bytes are not the ones
            the build recorded.
    """
    try:
        manifest = json.loads(manifest_path.read_text())
        name = manifest["jar"]
        if name is None:  # a wheel built without a JDK says so
            unavailable = str(manifest["unavailable"])
        else:
            built, recorded = str(manifest["spark_version"]), str(manifest["sha256"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise LocalityUnavailable(
            f"statekit.spark.locality: the locality helper's manifest {manifest_path} cannot be read "
            f"({e}); reinstall statekit-core, or {_OFF}"
        ) from e
    if name is None:
        raise LocalityUnavailable(f"statekit.spark.locality: {unavailable}; {_OFF}")
    if not isinstance(name, str) or os.path.basename(name) != name:
        raise LocalityUnavailable(
            f"statekit.spark.locality: the manifest {manifest_path} names no jar next to it ({name!r}); "
            f"reinstall statekit-core, or {_OFF}"
        )
    jar = manifest_path.parent / name
    if _major_minor(built) != _major_minor(running):
        raise LocalityUnavailable(
            f"statekit.spark.locality: the locality helper {jar} was compiled against Spark {built}, and "
            f"this driver runs Spark {running}. Install the PySpark it was built for "
            f"(pip install 'pyspark=={'.'.join(_major_minor(built))}.*'), or a statekit-core wheel "
            f"built against Spark {'.'.join(_major_minor(running))} (make wheels with that PySpark "
            f"installed), or {_OFF}"
        )
    try:
        actual = hashlib.sha256(jar.read_bytes()).hexdigest()
    except OSError as e:
        raise LocalityUnavailable(
            f"statekit.spark.locality: the locality helper {jar} cannot be read ({e}); reinstall "
            f"statekit-core, or {_OFF}"
        ) from e
    if actual != recorded:
        raise LocalityUnavailable(
            f"statekit.spark.locality: the locality helper {jar} is not the jar its build recorded in "
            f"{manifest_path} (SHA-256 {actual}, recorded {recorded}), so it is not loaded. Reinstall "
            f"statekit-core, or {_OFF}"
        )
    return Helper(str(jar), built, str(manifest_path))


def _built_in_tree(core: Path) -> Path:
    """The manifest of the helper compiled for this source tree and PySpark, compiled now if missing.

    Editable installs only: the jar goes under ``core/build/jvm/<digest>/`` (private
    to the user), keyed by the sources and the Spark version, never into a cache
    shared with anything else.
    """
    try:
        jars, spark_version = find_spark_jars()
        key = hashlib.sha256(f"{sources_digest(SOURCES)}\0{spark_version}".encode()).hexdigest()[:16]
        out = Path(
            private_dir(core / "build" / "jvm" / key, base=core, what="the locality helper's build directory")
        )
        manifest = out / MANIFEST_NAME
        if manifest.is_file():
            return manifest
        with _LOCK, open(out / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one compile for all drivers of this tree at once
            if not manifest.is_file():
                build_helper(out, javac=find_javac(), jars=jars, spark_version=spark_version)
        return manifest
    except (HelperBuildError, UnsafeLocalPathError) as e:
        raise LocalityUnavailable(
            f"statekit.spark.locality: this editable install of statekit-core ({core}) compiles its "
            f"locality helper on first use, and could not: {str(e).rstrip('.')}. Or {_OFF}"
        ) from e


#: helper_jar's answers, by where it looked, with the files they were read from as they were then.
_CHECKED: dict[tuple[str, ...], tuple[Helper, tuple[tuple[int, ...], ...]]] = {}


def _signature(paths: list[Path]) -> tuple[tuple[int, ...], ...]:
    """What changes when any of ``paths`` is written, replaced, moved, or its owner or mode changes."""
    out = []
    for path in paths:
        st = os.stat(path)
        out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid))
    return tuple(out)


def helper_jar(spark_version: str) -> Helper:
    """The installed helper's jar, checked against its manifest and Spark ``spark_version``.

    An installed wheel has it in ``statekit/spark/jvm/``; an editable install
    compiles it on first use into its source tree's ``build/jvm/``.

    A helper once checked in this process is not read and hashed again while
    its manifest and jar (and, in an editable install, its Java sources) are
    the same files, unchanged (device, inode, size, times, mode, owner): a
    query's start asks for it several times. As for local copies, a check is
    remembered only if the files were last written well before it
    (:func:`statekit._localfs.settled_before`): a write right after it could
    leave a coarse file time as it was.

    Raises:
        LocalityUnavailable: If there is none, or it does not fit (see :func:`_verified`).
    """
    core = _source_tree()
    where = (spark_version, str(_INSTALLED), str(core), os.environ.get("SPARK_HOME", ""))
    sources = _java_sources_of(core)
    known = _CHECKED.get(where)
    if known is not None:
        helper, signature = known
        with contextlib.suppress(OSError):
            if _signature([Path(helper.manifest), Path(helper.jar), *sources]) == signature:
                return helper
    checked_at = time.time_ns()
    helper = _helper_jar(spark_version, core)
    with contextlib.suppress(OSError):
        after = _signature([Path(helper.manifest), Path(helper.jar), *sources])
        if all(settled_before(mtime_ns, checked_at) for _, _, _, mtime_ns, *_ in after):
            _CHECKED[where] = (helper, after)
    return helper


def _java_sources_of(core: Path | None) -> list[Path]:
    """The helper's Java sources an editable install compiles (none for a wheel's jar)."""
    if core is None or (_INSTALLED / MANIFEST_NAME).is_file():
        return []
    return sorted(SOURCES.rglob("*.java"))


def _helper_jar(spark_version: str, core: Path | None) -> Helper:
    manifest = _INSTALLED / MANIFEST_NAME
    if manifest.is_file():
        return _verified(manifest, spark_version)
    if core is not None:
        return _verified(_built_in_tree(core), spark_version)
    raise LocalityUnavailable(
        f"statekit.spark.locality: this installation of statekit-core has no locality helper ({manifest} "
        "is missing): it was not installed from a wheel its build hook built. Reinstall statekit-core "
        f"from a wheel (make wheels builds one, see docs/spark.md), or {_OFF}"
    )


class JvmLocality:
    """The driver's side of task locality for one query: where each subtask ran, and the next preference.

    Raises:
        LocalityUnavailable: From the constructor, if the helper does not fit or cannot be loaded.
    """

    def __init__(self, session: SparkSession) -> None:
        sc = session.sparkContext
        jar = helper_jar(str(sc.version)).jar
        jvm: Any = sc._jvm
        gateway: Any = sc._gateway
        try:
            cls = _load_class(sc, jar, "Locality")
        except LocalityUnavailable:
            raise
        except Exception as e:  # Py4J errors carry the Java exception as text
            raise LocalityUnavailable(
                f"statekit.spark.locality: loading the helper {jar} into the driver failed: {e}; "
                "set statekit.spark.locality=off to run without task locality"
            ) from e
        self._jvm, self._gateway, self._cls = jvm, gateway, cls
        self._acc: Any = None  # one accumulator per query run, reset before each batch
        # A local master has one executor, which runs every task: nothing to prefer (see prefer).
        self._single: str | None = _single_executor(sc)
        self._parallelism = 0
        self._methods: dict[str, Any] = {}  # the helper's static methods, by name, as found
        #: subtask -> the executor location ("executor_<host>_<id>") that ran it last.
        self.last: dict[int, str] = {}

    @property
    def single_executor(self) -> bool:
        """Whether one executor runs every task (a local master): there is nothing to prefer."""
        return self._single is not None

    def _static(self, name: str, *args: Any) -> Any:
        """Calls the helper's static method ``name`` (found once: listing them costs a Py4J call each)."""
        method = self._methods.get(name)
        if method is None:
            for m in self._cls.getMethods():
                if m.getName() == name:
                    method = self._methods[name] = m
                    break
            else:
                raise LocalityUnavailable(f"statekit.spark.locality: the helper has no method {name}")
        params = self._gateway.new_array(self._jvm.java.lang.Object, len(args))
        for i, a in enumerate(args):
            params[i] = a
        return method.invoke(None, params)

    def prefer(self, df: DataFrame, parallelism: int) -> DataFrame:
        """``df`` (routed: partition i holds subtask i) with subtask i preferring where it ran last.

        Under a local master (``local``, ``local[n]``) the one executor runs
        every task, so ``df`` is returned as it is: wrapping it would plan the
        routed query a second time (``toRdd``), 30-90 ms of the driver's time
        per batch, for a preference the scheduler always meets.
        """
        if self._single is not None:
            self._parallelism = parallelism
            return df
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
        Under a local master: the one executor, for every partition.
        """
        if self._single is not None:
            everywhere = dict.fromkeys(range(self._parallelism), self._single)
            self.last.update(everywhere)
            return everywhere
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


def _single_executor(sc: Any) -> str | None:
    """The location of the one executor of a local master (``executor_<host>_driver``), else None.

    ``local-cluster[...]`` starts executors of its own and is not one.
    """
    master = str(sc.master)
    if master != "local" and not master.startswith("local["):
        return None
    # The driver's block manager is that executor: its id is "driver", its host the driver's.
    return f"executor_{app_setting(sc, 'spark.driver.host')}_driver"


#: One class loader per JVM (gateway) and jar: Py4J caches the methods it calls by class
#: name, so a class loaded twice (two queries) would be called with the other's method.
_LOADERS: dict[tuple[int, str], Any] = {}


#: The classes _load_class checked, per SparkContext (a new one must ship the jar again), jar and name.
_CLASSES: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], Any]] = weakref.WeakKeyDictionary()


def _load_class(sc: Any, jar: str, name: str) -> Any:
    """Class ``name`` of the helper ``jar``, through the JVM's one loader of that jar (Py4J errors raise).

    Once per SparkContext, jar and class: loading and checking it again costs
    some ten Py4J calls, and a query's start loads several classes.
    """
    with _LOCK:
        known = _CLASSES.get(sc, {}).get((jar, name))
    if known is not None:
        return known
    cls = _load_and_check(sc, jar, name)
    with _LOCK:
        _CLASSES.setdefault(sc, {})[(jar, name)] = cls
    return cls


def _load_and_check(sc: Any, jar: str, name: str) -> Any:
    jvm: Any = sc._jvm
    gateway: Any = sc._gateway
    jsc: Any = sc._jsc.sc()
    if not any(str(j).endswith("/" + os.path.basename(jar)) for j in _scala_iterable(jsc.listJars())):
        jsc.addJar(jar)
    with _LOCK:
        loader = _LOADERS.get((id(gateway), jar))
        if loader is None:
            _check_no_other_jar(sc, jar)
            urls = gateway.new_array(jvm.java.net.URL, 1)
            urls[0] = jvm.java.io.File(jar).toURI().toURL()
            parent = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
            loader = _LOADERS[(id(gateway), jar)] = jvm.java.net.URLClassLoader(urls, parent)
    # Not initialized until its code source is checked: another jar's static initializer never runs.
    cls = jvm.java.lang.Class.forName(f"{_PACKAGE}.{name}", False, loader)
    _check_code_source(jvm, cls, jar)
    return jvm.java.lang.Class.forName(f"{_PACKAGE}.{name}", True, loader)


def _unchecked(what: str, jar: str, other: str) -> LocalityUnavailable:
    return LocalityUnavailable(
        f"statekit.spark.locality: {what} {other}, not from the checked helper {jar}: a jar with statekit's "
        f"class names is on Spark's classpath, and a class loader takes its parent's classes first, so "
        f"the classes that would run are not the ones whose SHA-256 was checked. Remove {other} from "
        f"spark.jars (or --jars, spark.driver.extraClassPath, spark.executor.extraClassPath), or {_OFF}"
    )


def _check_code_source(jvm: Any, cls: Any, jar: str) -> None:
    """Raise unless class ``cls`` was loaded from ``jar`` (its protection domain's code source)."""
    source = cls.getProtectionDomain().getCodeSource()
    location = None if source is None else source.getLocation()
    if location is None:
        raise _unchecked(f"the class {cls.getName()} comes from", jar, "an unknown place (no code source)")
    if str(location.getProtocol()) == "file":
        where = str(jvm.java.io.File(location.toURI()).getCanonicalPath())
        if where == os.path.realpath(jar):
            return
    else:
        where = str(location)
    raise _unchecked(f"the class {cls.getName()} that Spark loads comes from", jar, where)


def _check_no_other_jar(sc: Any, jar: str) -> None:
    """Raise if a jar Spark ships to the executors (``spark.jars``) holds classes of statekit's package.

    The executors load a task's classes parent-first from the jars Spark
    ships, in the order added: such a jar would run there instead of ``jar``.
    Jars given by a URL that is not a local file cannot be looked into here;
    the driver's code-source check still sees one that is on its classpath.
    """
    import zipfile

    listed = app_setting(sc, "spark.jars") or ""
    prefix = _PACKAGE.replace(".", "/") + "/"
    mine = os.path.realpath(jar)
    for entry in filter(None, (j.strip() for j in listed.split(","))):
        path = entry.removeprefix("file://") if entry.startswith(("file:/", "/")) else None
        if entry.startswith("file:") and path is not None and not path.startswith("/"):
            path = entry.removeprefix("file:")
        if path is None or os.path.realpath(path) == mine or not os.path.isfile(path):
            continue
        try:
            with zipfile.ZipFile(path) as z:
                names = [n for n in z.namelist() if n.startswith(prefix)]
                clash = next((n for n in names if n.endswith(".class")), names[0] if names else None)
        except (OSError, zipfile.BadZipFile):
            continue
        if clash is not None:
            raise _unchecked(f"spark.jars ships {clash} to the executors from", jar, path)


def load_helper_class(session: SparkSession, name: str) -> Any:
    """Class ``name`` of the JVM helper (``io.statekit.spark.<name>``), loaded into the driver.

    Raises:
        LocalityUnavailable: If the helper does not fit (see :func:`helper_jar`) or does not load.
    """
    sc = session.sparkContext
    jar = helper_jar(str(sc.version)).jar
    try:
        return _load_class(sc, jar, name)
    except LocalityUnavailable:
        raise
    except Exception as e:  # Py4J errors carry the Java exception as text
        raise LocalityUnavailable(f"loading the JVM helper {jar} into the driver failed: {e}") from e


def _scala_iterable(obj: Any) -> list[Any]:
    """The elements of a Java collection or a Scala collection returned through Py4J."""
    it = obj.iterator()
    out = []
    while it.hasNext():
        out.append(it.next())
    return out
