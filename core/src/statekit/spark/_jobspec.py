"""What the driver knows of a job, and what it checks before any task runs.

:class:`JobSpec` is everything :class:`~statekit.spark.ProcessedStream` knows
of the job; the checks refuse a key column that is missing or of another type
than the key serializer's, reserved column names, and dead-letter paths no
executor would find; :func:`driver_storage` keeps one checkpoint storage per
configuration in the driver process (the ``jobmanager`` storage lives there).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import types as T

from .._contracts import CheckpointStorage
from .._errors import ConfigurationError
from ..plugins._config import Configuration
from ..plugins._registry import PluginRegistry
from ..runtime._configured import checkpoint_storage_from_config
from ..runtime._function import KeyedProcessFunction
from ..serialization._serializers import TypeSerializer
from ..sources._deadletters import DeadLetterDir
from ..timers._eventtime import EventTime
from ._batchinfo import BatchInfo

__all__ = [
    "JobSpec",
    "Sink",
    "check_columns",
    "check_key_type",
    "driver_storage",
    "resolve_dead_letters",
]

Sink = Callable[[DataFrame, int], None]

_DRIVER_STORAGES: dict[str, CheckpointStorage] = {}
_DRIVER_LOCK = threading.Lock()


@dataclass(frozen=True)
class JobSpec:
    """Everything :class:`ProcessedStream` knows about the job (driver side)."""

    df: DataFrame
    key_column: str
    key_serializer: TypeSerializer
    function_factory: Callable[[], KeyedProcessFunction]
    output_schema: T.StructType
    job_id: str
    operator_id: str
    config: Configuration | None
    allow_non_restored_state: bool
    on_batch: Callable[[BatchInfo], None] | None
    sink: Sink | None
    event_time: EventTime | None = None
    late_sink: Sink | None = None


def _storage_key(conf: Configuration) -> str:
    name = conf.storage_name
    return json.dumps(
        [
            name,
            conf.plugin_options("storage", name),
            conf.get("statekit.checkpoints.dir"),
            conf.get("statekit.savepoints.dir"),
        ],
        sort_keys=True,
        default=str,
    )


def driver_storage(conf: Configuration, registry: PluginRegistry | None = None) -> CheckpointStorage:
    """The driver's checkpoint storage for ``conf``: one object per storage configuration and process.

    The ``jobmanager`` storage keeps completed checkpoints in this object, so a
    query restarted in the same driver process finds them, as a Flink job finds
    its checkpoints in the JobManager.
    """
    key = _storage_key(conf)
    with _DRIVER_LOCK:
        storage = _DRIVER_STORAGES.get(key)
        if storage is None:
            storage = _DRIVER_STORAGES[key] = checkpoint_storage_from_config(conf, registry)
        return storage


def resolve_dead_letters(conf: Configuration, *, connect: bool, check: bool = True) -> Configuration:
    """``conf`` with its local paths absolute, as the driver sees them, and the dead-letter directory checked.

    Executors write the dead letters and the checkpoint files; a relative path
    would land in each executor's working directory, so it is taken from the
    driver's working directory when the query starts. From a Spark Connect
    client the driver is the server, whose working directory the client does
    not know: a relative dead-letter path is refused there (a relative
    checkpoints directory stays the server's, as before). With ``check``, the
    dead-letter directory is made (mode 0700) or checked private here, before
    any task runs.

    Raises:
        ConfigurationError: If ``dead-letter`` has no path, or the path is relative under Spark Connect.
        UnsafeLocalPathError: If the directory is a symlink, someone else's, or group- or other-writable.
    """
    if not connect:
        local = {}
        for key in ("statekit.checkpoints.dir", "statekit.savepoints.dir"):
            value = conf.get(key)
            if value and "://" not in str(value) and not os.path.isabs(str(value)):
                local[key] = os.path.abspath(str(value))
        if local:
            conf = conf.with_options(local)
    if conf.get("statekit.bad-records.policy") != "dead-letter":
        return conf
    path = conf.get("statekit.bad-records.dead-letter-path")
    if path is None:
        raise ConfigurationError(
            "statekit.bad-records.policy=dead-letter needs somewhere to put them on Spark: set "
            "spark.statekit.bad-records.dead-letter-path to a directory every executor reaches"
        )
    text = str(path)
    if not os.path.isabs(text) and "://" not in text:
        if connect:
            raise ConfigurationError(
                f"spark.statekit.bad-records.dead-letter-path {text!r} is relative: from a Spark Connect "
                "client it would be taken from the server's working directory, which this client does not "
                "know. Give an absolute path the server's executors reach"
            )
        text = os.path.abspath(text)
    if check:
        DeadLetterDir(text)  # a URL, a file, a symlink or someone else's directory fail here
    return conf.with_options({"statekit.bad-records.dead-letter-path": text})


def check_columns(df: DataFrame, key_column: str) -> None:
    """Raise a clear error if the key column is missing or a reserved column name is taken."""
    from ._routing import RESERVED_COLUMNS

    if key_column not in df.columns:
        raise ConfigurationError(f"key column {key_column!r} is not a column of the DataFrame: {df.columns}")
    taken = [c for c in df.columns if c in RESERVED_COLUMNS or c.startswith("__statekit_")]
    if taken:
        raise ConfigurationError(f"column names {taken} are reserved by statekit.spark; rename them")


def check_key_type(serializer: TypeSerializer, data_type: T.DataType, key_column: str) -> None:
    """Refuse, before anything runs, a ``str`` or ``int`` key type over a column of another type."""
    from ..serialization._serializers import IntSerializer, StrSerializer
    from ._routing import supports_sql_routing

    if type(serializer) in (StrSerializer, IntSerializer) and not supports_sql_routing(serializer, data_type):
        kind = "str" if type(serializer) is StrSerializer else "int"
        raise ConfigurationError(
            f"key column {key_column!r} is {data_type.simpleString()}, not a {kind} column: pass the "
            "key_type that matches its values (str for string columns, int for integer columns, "
            "bytes for binary ones)"
        )
