"""statekit's configuration as Spark holds it (``spark.statekit.*`` keys), and what a session tells.

Classic sessions and Spark Connect sessions both answer here: a Connect session
has no ``sparkContext`` (no SparkConf object, no broadcast, no py4j), so what
the driver side needs of Spark is read through what both kinds offer:
``spark.conf`` (a Connect server's session configuration holds its SparkConf
too) and the DataFrame API.
"""

from __future__ import annotations

import difflib
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pyspark import SparkContext
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from .._errors import ConfigurationError
from ..plugins._config import Configuration, is_statekit_key
from ..plugins._secrets import SPARK_DEFAULT_REDACTION, secret_keys_in

__all__ = [
    "app_setting",
    "application",
    "default_parallelism",
    "is_connect",
    "local_dir",
    "scanned_parallelism",
    "spark_configuration",
]


def spark_configuration(
    session: SparkSession, overrides: Mapping[str, object] | Configuration | None = None
) -> Configuration:
    """statekit's configuration read from Spark, later sources overriding earlier ones.

    1. the application's configuration (``spark-submit --conf spark.statekit.…``,
       ``SparkSession.builder.config``);
    2. the session's runtime configuration (``spark.conf.set("spark.statekit.…", …)``);
    3. ``overrides``, with or without the ``spark.`` prefix.

    Keys are the same as outside Spark, prefixed with ``spark.``; nothing is
    validated here (see :meth:`Configuration.validate`), but a near miss of
    ``spark.python.daemon.module`` is refused: Spark ignores it without a word.

    Raises:
        ConfigurationError: If one source sets a key with and without ``spark.`` to different values,
            or a key is a misspelling of ``spark.python.daemon.module``.
    """
    if is_connect(session):
        # The server's session configuration starts as a copy of its SparkConf: one source holds both.
        app: dict[str, str] = {}
        redaction = session.conf.get("spark.redaction.regex", SPARK_DEFAULT_REDACTION)
    else:
        # The JVM's copy (SparkContext.getConf() would copy it entry by entry first).
        jconf = session.sparkContext._jsc.getConf()
        app = _app_settings(jconf)
        redaction = jconf.get("spark.redaction.regex", SPARK_DEFAULT_REDACTION)
    runtime = _runtime_settings(session)
    _warn_of_shown_secrets({**app, **runtime}, redaction or SPARK_DEFAULT_REDACTION)
    conf = Configuration.from_mapping(app).with_options(runtime)
    if overrides:
        extra = overrides.as_dict() if isinstance(overrides, Configuration) else dict(overrides)
        conf = conf.with_options(extra)
    return conf


def _app_settings(jconf: Any) -> dict[str, str]:
    """statekit's keys of a classic application's SparkConf (the JVM's copy), near misses included.

    Its keys come in one Py4J call (``toDebugString``, whose values Spark
    redacts, hence a call per statekit key for its value), where reading every
    entry costs three calls each (some 60 in a small application, 40 ms warm
    and twice that in the cold JVM of a restart). Should the keys not read back
    exactly (a value with a line break, a key with ``=``), every entry is read.
    """
    count = len(jconf.getAll())
    text = str(jconf.toDebugString())
    keys = [line.partition("=")[0] for line in text.split("\n")] if text else []
    found = _by_keys(keys, count, jconf.contains, jconf.get)
    if found is not None:
        return found
    entries = [(str(e._1()), str(e._2())) for e in jconf.getAll()]
    _refuse_misspelt_daemon_key(k for k, _ in entries)
    return {k: v for k, v in entries if _ours(k)}


def _by_keys(
    keys: list[str], count: int, contains: Callable[[str], Any], get: Callable[[str], Any]
) -> dict[str, str] | None:
    """statekit's keys among ``keys`` with their values, read one by one, or None.

    None where ``keys``, split from one string, are not exactly the ``count``
    keys held (a line break or an ``=`` misplaced one).
    """
    if len(keys) != count or len(set(keys)) != count:
        return None
    ours = [k for k in keys if _ours(k)]
    if not all(contains(k) for k in ours):
        return None
    _refuse_misspelt_daemon_key(keys)
    return {k: str(get(k)) for k in ours}


def _runtime_settings(session: SparkSession) -> dict[str, str]:
    """statekit's keys of ``session``'s runtime configuration (``spark.conf``), near misses included.

    On a classic session, the keys come in one Py4J call and each statekit
    key's value in one more (``spark.conf.getAll`` reads every entry with
    several calls); keys that do not read back exactly (a line break in one)
    fall back to that.
    """
    if not is_connect(session):
        jruntime = session._jsparkSession.conf()
        settings = jruntime.getAll()
        count = int(settings.size())
        text = str(settings.keys().mkString("\n"))
        keys = text.split("\n") if text else []
        found = _by_keys(keys, count, jruntime.contains, jruntime.get)
        if found is not None:
            return found
    runtime_conf = session.conf.getAll
    runtime = runtime_conf() if callable(runtime_conf) else runtime_conf
    _refuse_misspelt_daemon_key(runtime)
    return {k: v for k, v in runtime.items() if _ours(k)}


def is_connect(session: SparkSession) -> bool:
    """Whether ``session`` is a Spark Connect client's session (no SparkContext, no py4j).

    Judged by its class's module, so that a client without the Connect
    packages installed (grpcio…) never imports them to find out.
    """
    return type(session).__module__.startswith("pyspark.sql.connect")


def default_parallelism(session: SparkSession) -> int:
    """Spark's default parallelism: a classic session's SparkContext says, a Connect server's scans show.

    On Connect, ``spark.default.parallelism`` if set; else the number of
    partitions of a ``range`` scan without an explicit count, which Spark
    sizes by the same default (or ``spark.sql.leafNodeDefaultParallelism``).
    That costs one small job, once per query run that has no
    ``statekit.parallelism`` and no checkpoint to take it from.
    """
    if not is_connect(session):
        return int(session.sparkContext.defaultParallelism)
    configured = session.conf.get("spark.default.parallelism", None)
    if configured:
        return int(configured)
    return scanned_parallelism(session)


def scanned_parallelism(session: SparkSession) -> int:
    """The number of partitions of a ``range`` scan without an explicit count: one small job.

    The partition id is projected first, then aggregated: Spark 4.3's analyzer
    refuses it as an aggregate's argument (``AGGREGATE_FUNCTION_WITH_NONDETERMINISTIC_EXPRESSION``).
    """
    scan = session.range(0, 1 << 16).select(F.spark_partition_id().alias("partition"))
    row = scan.agg(F.max("partition").alias("last")).first()
    return int(row["last"]) + 1 if row is not None and row["last"] is not None else 1


def application(session: SparkSession) -> str:
    """Who runs a job, for fencing messages: the Spark application (and that it is a Connect server's)."""
    if is_connect(session):
        app_id = session.conf.get("spark.app.id", None) or "?"
        name = session.conf.get("spark.app.name", None) or "?"
        return f"Spark Connect server's driver, app {app_id} ({name})"
    sc = session.sparkContext
    return f"Spark driver of app {sc.applicationId} ({sc.appName})"


def local_dir(session: SparkSession) -> str | None:
    """The driver's ``spark.local.dir``, if set (tasks fall back to it for their backends' files)."""
    if is_connect(session):
        value = session.conf.get("spark.local.dir", None)
    else:
        value = app_setting(session.sparkContext, "spark.local.dir")
    return str(value) if value else None


def app_setting(sc: SparkContext, key: str, default: str | None = None) -> str | None:
    """One setting of a classic application's SparkConf, or ``default``: two Py4J calls.

    ``SparkContext.getConf()`` copies the whole configuration across Py4J,
    three calls per entry (some 200 in a small application, 15 ms warm and
    several times that in the cold JVM of a restart); this asks the JVM's own
    copy for the one key.
    """
    value = sc._jsc.getConf().get(key, default)
    return None if value is None else str(value)


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


#: Spark's setting for the module its Python daemon runs (docs/spark.md#python-daemon).
DAEMON_MODULE_KEY = "spark.python.daemon.module"


def _refuse_misspelt_daemon_key(keys: Iterable[str]) -> None:
    """Refuse a near miss of :data:`DAEMON_MODULE_KEY`, which Spark would ignore without a word."""
    for key in keys:
        if key == DAEMON_MODULE_KEY or abs(len(key) - len(DAEMON_MODULE_KEY)) > 3:
            continue
        if difflib.SequenceMatcher(None, key.lower(), DAEMON_MODULE_KEY).ratio() >= 0.9:
            raise ConfigurationError(
                f"unknown Spark setting {key}; Did you mean {DAEMON_MODULE_KEY}? Spark ignores keys it "
                "does not know without a word, so its Python workers would start without the daemon "
                "module set there (statekit_spark_daemon: slower first tasks, nothing else). Correct "
                "the key where the session is built (see docs/spark.md#python-daemon)"
            )


def _ours(key: str) -> bool:
    # Near misses too (spark.statekti.…), so that validation refuses them as the LocalRunner does.
    return is_statekit_key(key.removeprefix("spark."))
