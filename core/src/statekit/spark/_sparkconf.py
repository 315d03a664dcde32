"""statekit's configuration as Spark holds it: ``spark.statekit.*`` keys."""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import SparkSession

from .._config import Configuration

__all__ = ["spark_configuration"]


def spark_configuration(
    session: SparkSession, overrides: Mapping[str, object] | Configuration | None = None
) -> Configuration:
    """statekit's configuration read from Spark, later sources overriding earlier ones.

    1. the application's configuration (``spark-submit --conf spark.statekit.…``,
       ``SparkSession.builder.config``);
    2. the session's runtime configuration (``spark.conf.set("spark.statekit.…", …)``);
    3. ``overrides``, with or without the ``spark.`` prefix.

    Keys are the same as outside Spark, prefixed with ``spark.``; nothing is
    validated here (see :meth:`Configuration.validate`).

    Raises:
        ConfigurationError: If one source sets a key with and without ``spark.`` to different values.
    """
    app = {k: v for k, v in session.sparkContext.getConf().getAll() if _ours(k)}
    runtime_conf = session.conf.getAll
    runtime = runtime_conf() if callable(runtime_conf) else runtime_conf
    conf = Configuration.from_mapping(app).with_options({k: v for k, v in runtime.items() if _ours(k)})
    if overrides:
        extra = overrides.as_dict() if isinstance(overrides, Configuration) else dict(overrides)
        conf = conf.with_options(extra)
    return conf


def _ours(key: str) -> bool:
    return key.removeprefix("spark.").startswith("statekit.")
