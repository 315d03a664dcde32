"""A task's rows without a key group: bad records of stage ``key``, by ``statekit.bad-records.*``.

A row whose key is null, or which the key serializer refuses, is routed to
no subtask (see :mod:`._routing`); every such row of a micro-batch lands in
one task, which hands each to the bad-records policy with the micro-batch,
the file Spark read it from (when it knows) and the row's values. Under the
``dead-letter`` policy the task writes them as one file per micro-batch when
it ends, so a retried task or a batch run again replaces it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..sources._badrecords import BadRecord, BadRecordPolicy
from ..sources._deadletters import DeadLetterDir, file_part
from ._arrow_values import Unconvertible
from ._plan import TaskPlan

__all__ = ["BadKeys"]


class BadKeys:
    """The rows of one task attempt that have no key group, and how many rows it read in all."""

    def __init__(self, plan: TaskPlan) -> None:
        self.plan = plan
        self.letters: list[BadRecord] = []  # this task's rows without a key, under the dead-letter policy
        self.rows_read = 0  # every row but the markers, for statekit.bad-records.max-ratio
        self._policy: BadRecordPolicy | None = None

    def reject(self, record: Mapping[str, Any], place: str | None) -> None:
        """A row routed to no subtask (its key is null, not a Python value, or refused): a bad record.

        It goes to ``statekit.bad-records.policy`` with the micro-batch, the
        file Spark read it from (when it knows) and the row's values.

        Raises:
            BadRecordError: Under the ``fail`` policy, or past the task's ``max`` budget.
        """
        plan = self.plan
        key = record.get(plan.key_column)
        error: Exception = ValueError(f"null key in column {plan.key_column!r}: every record needs a key")
        if isinstance(key, Unconvertible):
            error = key.describe(plan.key_column)
        elif key is not None:
            try:
                plan.key_serializer.serialize(key)
                error = ValueError(f"key {key!r} of column {plan.key_column!r} has no key group")
            except Exception as e:  # noqa: BLE001 - what the serializer says is the record's error
                error = e
        if self._policy is None:
            conf = plan.config
            self._policy = BadRecordPolicy(
                policy=str(conf.get("statekit.bad-records.policy")),
                sink=self.letters.append,
                max_bad=conf.get("statekit.bad-records.max"),
                max_ratio=conf.get("statekit.bad-records.max-ratio"),
                job_id=plan.job_id,
            )
        file = place.removeprefix("file://") if place and place.startswith("file:///") else place
        bad = BadRecord(
            "key", f"{type(error).__name__}: {error}", file, raw=repr(dict(record)), batch=plan.batch_id
        )
        self._policy.handle(bad)

    def commit(self) -> int:
        """Check the task's bad-record share, then write its dead letters; how many there were.

        One file per micro-batch (every row without a key group lands in one
        partition), named by query and batch: a retried task, or the batch run
        again after a failure, replaces it.
        """
        policy = self._policy
        if policy is None:
            return 0
        policy.check_ratio(self.rows_read)
        if self.letters:
            plan = self.plan
            path = plan.config.get("statekit.bad-records.dead-letter-path")
            assert path is not None  # the driver refuses dead-letter without a path
            name = (
                f"part-{file_part(plan.job_id)}-{file_part(plan.operator_id)}-{file_part(plan.query_id)}"
                f"-batch-{plan.batch_id:012d}.json"
            )
            extra = {"query_id": plan.query_id, "operator_id": plan.operator_id}
            DeadLetterDir(str(path)).publish(name, ({**policy.letter(b), **extra} for b in self.letters))
        return policy.count
