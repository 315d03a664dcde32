"""statekit's configuration as Spark holds it: ``spark.statekit.*`` keys."""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping

from pyspark.sql import SparkSession

from ..plugins._config import Configuration, is_statekit_key
from ..plugins._secrets import SPARK_DEFAULT_REDACTION, secret_keys_in

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
    spark_conf = session.sparkContext.getConf()
    app = {k: v for k, v in spark_conf.getAll() if _ours(k)}
    runtime_conf = session.conf.getAll
    runtime = runtime_conf() if callable(runtime_conf) else runtime_conf
    runtime = {k: v for k, v in runtime.items() if _ours(k)}
    _warn_of_shown_secrets(
        {**app, **runtime}, spark_conf.get("spark.redaction.regex", SPARK_DEFAULT_REDACTION)
    )
    conf = Configuration.from_mapping(app).with_options(runtime)
    if overrides:
        extra = overrides.as_dict() if isinstance(overrides, Configuration) else dict(overrides)
        conf = conf.with_options(extra)
    return conf


def _warn_of_shown_secrets(values: Mapping[str, object], redaction_regex: str) -> None:
    """Warn (naming keys, never values) of credentials under keys Spark's UI shows in clear.

    Access key ids count: Spark's default regex hides ``access.key`` and ``secret``,
    but not s3fs's ``key``, so ``{"key": "AKIA…"}`` alone would be shown.
    """
    try:
        hidden = re.compile(redaction_regex)
    except re.error:  # a Java-only regex: judge by Spark's default
        hidden = re.compile(SPARK_DEFAULT_REDACTION)
    for key, value in sorted(values.items()):
        # As Spark's Utils.redact: a match in the key or anywhere in the value hides the value.
        if hidden.search(key) or hidden.search(str(value)):
            continue
        found = secret_keys_in(value)
        if found:
            warnings.warn(
                f"{key} holds credentials ({', '.join(found)}); Spark shows this key's value in clear on "
                "its UI's Environment page and in event logs, since neither the key nor the value "
                "matches spark.redaction.regex. Move them to a key it hides (for the storages: "
                "...storage.<name>.secret-storage-options), to ${env:NAME} references, or out of "
                "the configuration altogether (the fsspec/boto credential chain); "
                "see docs/configuration.md#secrets",
                RuntimeWarning,
                stacklevel=3,
            )


def _ours(key: str) -> bool:
    # Near misses too (spark.statekti.…), so that validation refuses them as the LocalRunner does.
    return is_statekit_key(key.removeprefix("spark."))
