"""statekit on Apache Spark: keyed state for PySpark streaming and batch DataFrames.

Install with ``pip install "statekit[spark]"``. A job is a
:class:`~statekit.KeyedProcessFunction`, written once against the core API and
run unchanged here or on the embedded :class:`~statekit.LocalRunner`::

    from statekit.spark import keyed

    query = (
        keyed(spark.readStream.json("logs/"), "url")          # like df.groupBy("url")
        .process(CountPerUrl, "url string, count long", job_id="url-count")
        .write_files("/data/url-counts")                       # idempotent per batch id
        .start(checkpoint_location="/data/spark-checkpoints/url-count")
    )

Backend, checkpoint storage and their options come from Spark's configuration
(``spark.statekit.backend``, ``spark.statekit.checkpoints.dir``, …). Every
micro-batch ends in a checkpoint (its id above every earlier one) that holds
the state after it; it completes after the sink has the batch's outputs, so
state reflects every input record exactly once, whatever Spark retries. Restarting a query with another
``spark.statekit.parallelism`` redistributes the state by key group.

:func:`read_logs` reads log files that grow and rotate as a stream, exactly once,
with the position in Spark's offset log (Spark's own file source reads a file
once, when it appears, and misses what is appended later).

:func:`register_state_source` makes any checkpoint or savepoint readable as a
DataFrame: ``spark.read.format("statekit-state").option("state", "count").load(location)``;
:func:`write_savepoint` writes DataFrames into a savepoint a job starts from,
in parallel by key group.
See ``docs/spark.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .._errors import install_hint

try:
    import pyarrow  # type: ignore[import-untyped]  # noqa: F401
    import pyspark  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installation
    raise ModuleNotFoundError(
        f"statekit.spark needs {exc.name}, which is not installed. Install it with: "
        + install_hint("statekit[spark]"),
        name=exc.name,
    ) from exc

if TYPE_CHECKING:
    from ._api import KeyedDataFrame, ProcessedStream, keyed
    from ._batchinfo import BatchInfo
    from ._bootstrap import write_savepoint
    from ._log_source import LOG_SOURCE_NAME, read_logs, register_log_source
    from ._recent import batch_info_for
    from ._sparkconf import spark_configuration
    from ._state_source import register_state_source

# The public names, imported on first use: a Spark worker imports this package to unpickle its
# task (``._task``) and needs none of the driver's modules these pull in.
_LAZY = {
    "KeyedDataFrame": "._api",
    "ProcessedStream": "._api",
    "keyed": "._api",
    "BatchInfo": "._batchinfo",
    "write_savepoint": "._bootstrap",
    "LOG_SOURCE_NAME": "._log_source",
    "read_logs": "._log_source",
    "register_log_source": "._log_source",
    "batch_info_for": "._recent",
    "spark_configuration": "._sparkconf",
    "register_state_source": "._state_source",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "LOG_SOURCE_NAME",
    "BatchInfo",
    "KeyedDataFrame",
    "ProcessedStream",
    "batch_info_for",
    "keyed",
    "read_logs",
    "register_log_source",
    "register_state_source",
    "spark_configuration",
    "write_savepoint",
]
