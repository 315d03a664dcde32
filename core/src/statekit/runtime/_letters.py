"""The LocalRunner's dead letters: staged in a private directory, published with the checkpoint covering them.

Under ``statekit.bad-records.policy=dead-letter`` with a
``statekit.bad-records.dead-letter-path``, a run stages the records it
skips; each checkpoint seals what was staged before it and records the
sealed files in its metadata, and they are published once it completed. A
restored job first makes the directory match what its checkpoint recorded
(see :class:`~statekit.sources._deadletters.StagedDeadLetters`).
"""

from __future__ import annotations

from typing import Any

from ..checkpoints._restore import CompletedCheckpoint
from ..plugins._config import Configuration
from ..sources._deadletters import DEAD_LETTERS_PROPERTY, StagedDeadLetters

__all__ = ["JobDeadLetters"]


class JobDeadLetters:
    """The dead letters of one job run by one :class:`~statekit.LocalRunner`."""

    def __init__(self, config: Configuration, job_id: str) -> None:
        self.config = config
        self.job_id = job_id
        self._staged: StagedDeadLetters | None = None  # made on first use
        # What the restored checkpoint says of them: (its id, the staged files it covers).
        self._restored: tuple[int | None, list[str]] = (None, [])
        self._recovered = False  # the first run makes the directory match the restored state

    def restored(self, cp: CompletedCheckpoint, *, claimed: bool) -> None:
        """The job was restored from ``cp`` (a completed checkpoint of this job if ``claimed``).

        A savepoint converted from a checkpoint of this job (``statekit savepoint
        trigger``, ``convert``) holds that checkpoint's state, position and
        letters exactly: restored into the same dead-letter directory, it is that
        checkpoint for the letters too (the letters of the job's later
        checkpoints are withdrawn: their input is read again), so no letter is
        written twice.
        """
        meta = cp.metadata
        props = meta.properties
        converted = meta.kind == "savepoint" and meta.job_id == self.job_id and "converted_from" in props
        self._restored = (
            (cp.checkpoint_id, [str(n) for n in props.get(DEAD_LETTERS_PROPERTY) or ()])
            if claimed or converted
            else (None, [])
        )

    def staged(self) -> StagedDeadLetters | None:
        """Where a run stages its dead letters, if ``statekit.bad-records.*`` sends them to a directory.

        The first call makes the directory match the restored state.
        """
        if self._staged is None:
            path = self.config.get("statekit.bad-records.dead-letter-path")
            if path is not None and self.config.get("statekit.bad-records.policy") == "dead-letter":
                self._staged = StagedDeadLetters(path, self.job_id)
        letters = self._staged
        if letters is not None and not self._recovered:
            letters.recover(*self._restored)
            self._recovered = True
        return letters

    def seal(self, properties: dict[str, Any]) -> list[str]:
        """Seal what was staged for the checkpoint whose ``properties`` these are (which then name it)."""
        staged = self._staged.seal() if self._staged is not None else []
        if staged:
            properties[DEAD_LETTERS_PROPERTY] = staged  # what the checkpoint commits, see recover()
        return staged

    def publish(self, checkpoint_id: int, staged: list[str]) -> None:
        """Checkpoint ``checkpoint_id``, which ``staged`` were sealed for, completed: publish them."""
        if self._staged is not None and staged:
            self._staged.publish(checkpoint_id, staged)

    def close(self) -> None:
        """Release the staging directory."""
        if self._staged is not None:
            self._staged.close()
