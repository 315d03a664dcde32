"""What the driver tells every task of a micro-batch: the plan, and how the restore metadata travels.

The :class:`TaskPlan` is pickled into every task of one micro-batch, or, where
the routing and the tasks are part of the streaming query's own plan (see
:mod:`._driver`), into the query's function once: each micro-batch's part of it
(its checkpoint, restore, watermark, token) then travels in the Spark local
property :data:`PLAN_PROPERTY`, which Spark hands to every task of the jobs the
batch runs (:func:`batch_property`, :func:`batch_plan`). The
metadata of the checkpoint the batch starts from travels beside it: inside
the task (:class:`InlineMetadata`), as a Spark broadcast, or, from a Spark
Connect driver (which has no broadcast), left in the checkpoint storage for
the task to read (:class:`StoredMetadata`). The internal output schema (the
user's columns, late rows, the handle column that carries each subtask's
report) is the contract between the tasks and the driver.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import types as T

from .._contracts import CheckpointStorage
from .._errors import CheckpointError
from ..plugins._config import Configuration
from ..runtime._function import KeyedProcessFunction
from ..serialization._serializers import TypeSerializer
from ..timers import MIN_WATERMARK
from ..timers._eventtime import EventTime

__all__ = [
    "HANDLE_COLUMN",
    "LATE_COLUMN",
    "LATE_PREFIX",
    "PLAN_PROPERTY",
    "TASK_PHASES",
    "InlineMetadata",
    "StoredMetadata",
    "TaskPlan",
    "batch_plan",
    "batch_property",
    "internal_schema",
]

#: The column of the internal output that carries each subtask's snapshot description.
HANDLE_COLUMN = "__statekit_handle"
#: True on the internal output's late rows (present only with a late-records sink).
LATE_COLUMN = "__statekit_late"
#: Late rows carry the input column ``c`` as ``LATE_PREFIX + c``.
LATE_PREFIX = "__statekit_late_"
#: The Spark local property carrying a micro-batch's part of the plan (see :func:`batch_property`).
PLAN_PROPERTY = "statekit.batch.plan"
#: What a task reports it spent its time on (seconds), see ``BatchInfo.phases``.
TASK_PHASES = ("input", "restore", "convert", "records", "output", "timers", "snapshot", "upload")


@dataclass(frozen=True)
class TaskPlan:
    """What the driver tells every task of one micro-batch (pickled into the task)."""

    job_id: str
    operator_id: str
    run_id: str
    checkpoint_id: int
    token: str
    restore_location: str | None
    restore_token: str | None
    restore_attempts: Mapping[int, str]
    parallelism: int
    max_parallelism: int
    config: Configuration
    function_factory: Callable[[], KeyedProcessFunction]
    key_column: str
    key_serializer: TypeSerializer
    input_columns: tuple[str, ...]
    output_schema: T.StructType
    timezone: str | None = None
    spark_local_dir: str | None = None
    event_time: EventTime | None = None
    watermark: int = MIN_WATERMARK
    batch_timestamp_ms: int = 0
    end_of_input: bool = False
    late_schema: T.StructType | None = None
    """The input schema, when late rows go to a late-records sink."""
    vectorized: bool = False
    """The function is a :class:`~statekit.KeyedBatchFunction`: one call per key and batch."""
    columns: bool = False
    """The function is a :class:`~statekit.KeyedColumnsFunction`: one call per arriving batch and subtask."""
    restore_claimed: bool = False
    """The restore checkpoint is a completed checkpoint of this job in this storage: a restored
    native instance may reference its files (``notify_checkpoint_complete`` after the restore)."""
    batch_id: int = 0
    """Spark's micro-batch (for ``run()``, the batch id it was given or chose): named in bad records."""
    query_id: str = ""
    """The streaming query (``static`` for ``run()``): with the batch, names the dead-letter file."""
    partition_subtask: bool = False
    """The routing is in the streaming query's plan: partition ``i`` is subtask ``i``, which its task
    serves even when no row came (there are no marker rows), and the batch's part of this plan comes
    in :data:`PLAN_PROPERTY`."""


#: The fields of a :class:`TaskPlan` that change from one micro-batch to the next.
_PER_BATCH = (
    "checkpoint_id",
    "token",
    "restore_location",
    "restore_token",
    "watermark",
    "batch_timestamp_ms",
    "end_of_input",
    "restore_claimed",
    "batch_id",
    "query_id",
)


def batch_property(plan: TaskPlan, metadata: InlineMetadata | StoredMetadata) -> str:
    """``plan``'s per-batch fields and the restore metadata, as :data:`PLAN_PROPERTY`'s value (JSON)."""
    fields: dict[str, Any] = {name: getattr(plan, name) for name in _PER_BATCH}
    fields["run_id"] = plan.run_id
    fields["restore_attempts"] = [[i, a] for i, a in plan.restore_attempts.items()]
    if isinstance(metadata, InlineMetadata):
        fields["metadata"] = base64.b64encode(metadata.value).decode("ascii")
    else:
        fields["stored_metadata"] = [metadata.location, metadata.sha256]
    return json.dumps(fields, separators=(",", ":"))


def batch_plan(query_plan: TaskPlan, text: str | None) -> tuple[TaskPlan, InlineMetadata | StoredMetadata]:
    """The plan of the micro-batch a task runs in: ``query_plan`` with the fields ``text`` carries.

    Raises:
        CheckpointError: If the task's job carries no plan of this query run: its action did not
            run on the thread that ``foreach_batch`` called the sink on.
    """
    fields: dict[str, Any] = json.loads(text) if text else {}
    if fields.get("run_id") != query_plan.run_id:
        raise CheckpointError(
            f"statekit job {query_plan.job_id!r}: a task of its streaming query ran in a Spark job that "
            f"does not carry the micro-batch's plan (local property {PLAN_PROPERTY} "
            f"{'missing' if not fields else 'of another query run'}); nothing was processed. The sink "
            "must run its actions on the thread foreach_batch calls it on, or on a "
            "pyspark.InheritableThread, which carries Spark's local properties"
        )
    del fields["run_id"]
    fields["restore_attempts"] = {int(i): a for i, a in fields["restore_attempts"]}
    stored = fields.pop("stored_metadata", None)
    metadata: InlineMetadata | StoredMetadata = (
        StoredMetadata(stored[0], stored[1])
        if stored is not None
        else InlineMetadata(base64.b64decode(fields.pop("metadata")))
    )
    return dataclasses.replace(query_plan, **fields), metadata


def internal_schema(output_schema: T.StructType, late_schema: T.StructType | None = None) -> T.StructType:
    """The user's output columns (made nullable), late-row columns if any, then the handle column."""
    fields = [T.StructField(f.name, f.dataType, True, f.metadata) for f in output_schema.fields]
    if late_schema is not None:
        fields.append(T.StructField(LATE_COLUMN, T.BooleanType(), True))
        fields += [
            T.StructField(LATE_PREFIX + f.name, f.dataType, True, f.metadata) for f in late_schema.fields
        ]
    return T.StructType([*fields, T.StructField(HANDLE_COLUMN, T.StringType(), True)])


@dataclass(frozen=True)
class InlineMetadata:
    """The restore checkpoint's metadata shipped inside the task, read as a broadcast's ``value``."""

    value: bytes


@dataclass(frozen=True)
class StoredMetadata:
    """The restore checkpoint's metadata left in the checkpoint storage, for the task to read.

    How a Spark Connect driver ships metadata too large to travel inside every
    task: it has no broadcast. ``sha256`` is of the bytes the driver read,
    so a task never restores from other metadata than the driver planned with.
    """

    location: str
    sha256: str

    def read(self, storage: CheckpointStorage) -> bytes:
        """The metadata bytes, read through ``storage`` (the one the plan's configuration names).

        Raises:
            CheckpointError: If they differ from the bytes the driver read.
        """
        data = storage.read_metadata(self.location)
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise CheckpointError(
                f"checkpoint {self.location}: its metadata changed after the driver planned this batch"
            )
        return data
