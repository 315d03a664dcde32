"""The wheel's build hook: compile the JVM locality helper and ship it as package data.

statekit's task locality on Spark needs two Java classes (``src/statekit/spark/jvm``).
They are compiled here, when the wheel is built, against the PySpark of the
build environment (a build requirement, see ``pyproject.toml``), as PySpark
ships ``pyspark/jars`` and Apache Sedona its jars: the wheel carries
``statekit/spark/jvm/statekit-spark-locality.jar`` and a manifest next to it
recording the jar's SHA-256 and the Spark version (``src/statekit/spark/_jvm_build.py``
does the work; ``statekit.spark._jvm`` checks both before it loads the jar).
Building needs a JDK 17+ (javac); running needs only the JRE Spark needs anyway.

Without a JDK the build fails, saying so, unless ``STATEKIT_BUILD_WITHOUT_JDK=1``:
then the wheel's manifest records that it was built without one, and its Spark
queries run without task locality (``BatchInfo.locality`` says why).

Editable installs (``pip install -e ./core``) build nothing here: the running
code compiles the helper on first use into ``core/build/jvm/``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def _jvm_build(root: str) -> ModuleType:
    """``statekit.spark._jvm_build`` from this source tree, loaded by path (statekit is not installed yet)."""
    path = Path(root) / "src" / "statekit" / "spark" / "_jvm_build.py"
    spec = importlib.util.spec_from_file_location("_statekit_jvm_build", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class JvmHelperBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Compiles the helper into a temporary directory and force-includes it into the wheel."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version == "editable":
            return
        jvm = _jvm_build(self.root)
        self._out = Path(tempfile.mkdtemp(prefix="statekit-jvm-helper-"))
        if os.environ.get(jvm.WITHOUT_JDK_ENV, "") not in ("", "0"):
            jvm.write_unavailable(
                self._out,
                f"this statekit-core wheel was built without a JDK ({jvm.WITHOUT_JDK_ENV}=1), so it has "
                "no locality helper. Install a statekit-core wheel built with a JDK",
            )
        else:
            try:
                javac = jvm.find_javac()
                jars, spark_version = jvm.find_spark_jars()
                jvm.build_helper(self._out, javac=javac, jars=jars, spark_version=spark_version)
            except jvm.HelperBuildError as e:
                raise RuntimeError(
                    f"statekit-core's wheel ships its JVM locality helper compiled: {e}. Install a JDK "
                    f"{jvm.JAVA_RELEASE}+ where the wheel is built (JAVA_HOME or javac on PATH), or set "
                    f"{jvm.WITHOUT_JDK_ENV}=1 to build a wheel whose Spark queries run without task "
                    "locality"
                ) from e
        for path in sorted(self._out.iterdir()):
            build_data["force_include"][str(path)] = f"statekit/spark/jvm/{path.name}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        out = getattr(self, "_out", None)
        if out is not None:
            shutil.rmtree(out, ignore_errors=True)
