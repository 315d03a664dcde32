"""PySpark's Python daemon, with PySpark imported from its installed package instead of ``pyspark.zip``.

Use it by building the session with ``spark.python.daemon.module=statekit_spark_daemon``
(Spark's setting for the module that runs its Python daemon; it must be set
before the application's first Python task, so on the session's builder or in
``spark-defaults.conf``). It changes how fast Python workers start and what a
worker collects after each task, nothing of what tasks run.

**Why.** Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on its Python
workers' path; with a pip-installed PySpark, ``SPARK_HOME`` is the package
itself, which ships that zip beside its own modules. A zip holds sources only
and Python writes no bytecode cache for a zip's modules, so the daemon, and
then every worker it forks, compiles PySpark's modules afresh at each start.
Measured on this project's machines: the daemon's imports 0.57 s from the zip
against 0.14 s from the installed package, and a worker's ``pyspark.worker``
0.59 s against 0.10 s. A fresh application pays it before its first Python
task runs (a restarted streaming query, on the restart's critical path); Spark's
own JVM operators pay none of it.

**What it does.** Before the daemon imports anything, it looks for a directory
on the path, after the zip, holding an installed ``pyspark`` whose files that
speak with the JVM (:data:`COMPARED`) are byte for byte the zip's, and imports
the ``pyspark`` package from there; its submodules then come from the same
directory (a package's submodules are found on its own ``__path__``), compiled
once and cached. Where there is no such directory (a Spark distribution's
workers without a pip-installed PySpark, another PySpark version, a directory
already before the zip), the path is left as it is and the daemon runs as
``pyspark.daemon`` does. Then it runs ``pyspark.daemon``'s own manager.

**Collections after a task follow the task.** PySpark's daemon runs a full
garbage collection (``gc.collect()``) in a reused worker after every task. A
full collection walks every object the worker tracks, whatever the task did:
the modules it imported (PySpark, pyarrow, pandas: about 84,000 objects, 30 ms
on this project's machines) and every container kept between tasks, such as a
backend's open state (about 100 ms more per million lists or tuples). A
micro-batch's task pays it once more per batch, on cores the batch's other
tasks and the JVM are using. Under this daemon the collection after a task is
of the young generations (``gc.collect(1)``): what the task allocated and left
unreachable. Objects that lived through the task's own collections are
collected by Python's full collections, which run on their own when the
objects kept since the last one grow by a quarter, so their cost follows what
the worker allocates. :func:`young_collections_after_tasks` says what changed;
PySpark's own behaviour comes back with ``spark.python.daemon.module=pyspark.daemon``.

It imports nothing else before the daemon forks its workers: PySpark's daemon
must fork with no thread running, and pyarrow and pandas start threads when
imported. So this package depends on nothing but the standard library, and
never imports ``statekit``.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
import zipfile
from collections.abc import Sequence
from importlib.machinery import PathFinder
from types import ModuleType
from typing import Any

__all__ = ["COMPARED", "installed_pyspark", "use_installed_pyspark", "young_collections_after_tasks"]

#: The modules of PySpark whose bytes must agree: its version, and the daemon and worker side of
#: the protocol the JVM speaks with its Python workers.
COMPARED = (
    "pyspark/version.py",
    "pyspark/daemon.py",
    "pyspark/worker.py",
    "pyspark/worker_util.py",
    "pyspark/serializers.py",
)


def installed_pyspark(path: Sequence[str]) -> str | None:
    """The directory of ``path`` to import ``pyspark`` from instead of the zip Python would use; or None.

    None unless the first entry of ``path`` that provides ``pyspark`` is a
    ``pyspark.zip`` and a later directory holds a ``pyspark`` whose
    :data:`COMPARED` files equal the zip's.
    """
    for i, entry in enumerate(path):
        if entry.endswith(".zip") and os.path.basename(entry) == "pyspark.zip":
            zipped = _zipped(entry)
            if zipped is None:
                continue  # not a zip that provides pyspark: Python goes on looking
            for later in path[i + 1 :]:
                if os.path.isdir(os.path.join(later, "pyspark")):
                    return later if _same(later, zipped) else None
            return None
        if os.path.isdir(os.path.join(entry or ".", "pyspark")):
            return None  # Python imports an installed pyspark already
    return None


def use_installed_pyspark() -> str | None:
    """Import ``pyspark`` from :func:`installed_pyspark` of ``sys.path``: that directory, or None."""
    if "pyspark" in sys.modules:
        return None
    directory = installed_pyspark(sys.path)
    if directory is None:
        return None
    spec = PathFinder.find_spec("pyspark", [directory])
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pyspark"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["pyspark"]
        raise
    return directory


class _YoungCollections:
    """The ``gc`` module as PySpark's daemon sees it: ``collect()`` collects the young generations.

    Every other name is the ``gc`` module's own. A collection of a named
    generation collects at most generation 1; Python's automatic collections,
    full ones included, are not touched.
    """

    def collect(self, generation: int = 2) -> int:
        """``gc.collect`` of the young generations (0 and 1), however old the generation asked for."""
        return gc.collect(min(generation, 1))

    def __getattr__(self, name: str) -> Any:
        return getattr(gc, name)


def young_collections_after_tasks(daemon: ModuleType) -> bool:
    """Make the collection PySpark's ``daemon`` runs after each task one of the young generations.

    Replaces the daemon module's global ``gc`` (the daemon's ``gc.collect()``
    after a task in a reused worker) with :class:`_YoungCollections`. Returns
    False, changing nothing, where the module has no ``gc`` global (a PySpark
    that collects otherwise, or not at all).
    """
    if getattr(daemon, "gc", None) is not gc:
        return False
    daemon.gc = _YoungCollections()  # type: ignore[attr-defined]
    return True


def _zipped(zip_path: str) -> dict[str, bytes] | None:
    """The :data:`COMPARED` members of ``zip_path``; None if it is unreadable or lacks one."""
    try:
        with zipfile.ZipFile(zip_path) as z:
            return {name: z.read(name) for name in COMPARED}
    except (OSError, KeyError, zipfile.BadZipFile):
        return None


def _same(directory: str, zipped: dict[str, bytes]) -> bool:
    """Whether ``directory``'s :data:`COMPARED` files are ``zipped``'s, byte for byte."""
    for name, data in zipped.items():
        try:
            with open(os.path.join(directory, name), "rb") as f:
                if f.read() != data:
                    return False
        except OSError:
            return False
    return True
