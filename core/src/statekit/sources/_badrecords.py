"""Bad records: what a record that cannot be processed carries, and the policy that decides its fate.

A record is bad when its line is not valid UTF-8 or does not parse, when its
key cannot be computed or has the wrong type, when its event time cannot be
read, or when its columns clash with the other records of an Arrow batch.
Errors in the user's function are no bad records: they may have changed state
half-way, and fail the job as before.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import BadRecordError, ConfigurationError
from ._deadletters import StagedDeadLetters

__all__ = ["RAW_TEXT_LIMIT", "BadRecord", "BadRecordPolicy", "bad_record_error"]

#: Characters of the raw line shown in an error message (dead letters keep the whole line).
RAW_TEXT_LIMIT = 200
#: Kinds of bad record (stage, error type) a policy tallies for its share error; later new kinds are not.
_KINDS_KEPT = 32


@dataclass(frozen=True, slots=True)
class BadRecord:
    """A record that could not be processed, and where it came from.

    Attributes:
        stage: What failed: ``decode`` (invalid UTF-8), ``parse``, ``key`` (the
            key selector, or a key its serializer refuses), ``event-time``, ``arrow``.
        error: The error, as ``Type: message``.
        file: The file the line was read from (None for a source without files).
        offset: The byte offset of the line's start in ``file``.
        line: The line's number in ``file``, from 1 (for other sources, the
            record's position, when known).
        raw: The line's text without its newline; invalid UTF-8 bytes are kept
            as surrogate escapes (``"\\udcff"`` in JSON), so
            ``raw.encode("utf-8", "surrogateescape")`` gives the bytes back.
            For a record without a line, its ``repr``.
        batch: The Spark micro-batch the record came in (None elsewhere); with
            ``file`` the place Spark gives a row of a file source, which knows
            no offset or line.
    """

    stage: str
    error: str
    file: str | None = None
    offset: int | None = None
    line: int | None = None
    raw: str = ""
    batch: int | None = None

    @classmethod
    def from_line(
        cls, stage: str, exc: BaseException, file: str, offset: int, line: int, raw: bytes
    ) -> BadRecord:
        """A bad line of a file: ``raw`` is its bytes without the newline."""
        return cls(stage, _describe(exc), file, offset, line, raw.decode("utf-8", "surrogateescape"))

    def place(self) -> str:
        """Where the record came from, in words: ``access.log, byte 120, line 3``."""
        parts = [] if self.batch is None else [f"micro-batch {self.batch}"]
        if self.file or self.batch is None:
            parts.append(self.file or "input")
        if self.offset is not None:
            parts.append(f"byte {self.offset}")
        if self.line is not None:
            parts.append(f"line {self.line}")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """The dead letter: every field, JSON-able (``batch`` only when set)."""
        out: dict[str, Any] = {
            "stage": self.stage,
            "error": self.error,
            "file": self.file,
            "offset": self.offset,
            "line": self.line,
            "raw": self.raw,
        }
        if self.batch is not None:
            out["batch"] = self.batch
        return out


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _shown(raw: str) -> str:
    return repr(raw if len(raw) <= RAW_TEXT_LIMIT else raw[:RAW_TEXT_LIMIT] + "…")


def bad_record_error(bad: BadRecord, why: str = "") -> BadRecordError:
    """The error that stops a job on ``bad``, naming its place and its text."""
    hint = why or (
        "set statekit.bad-records.policy=dead-letter to skip such records into dead letters "
        "(docs/operations.md#input-files)"
    )
    return BadRecordError(
        f"bad record ({bad.stage}) at {bad.place()}: {bad.error}; the line: {_shown(bad.raw)}. {hint}", bad
    )


class BadRecordPolicy:
    """Applies ``statekit.bad-records.*``: fail on a bad record, or skip it into dead letters.

    Dead letters go into a directory of JSON-lines files (``dead-letter-path``,
    see :mod:`statekit.sources._deadletters`) and/or to a callback, each with
    :meth:`BadRecord.to_json`'s fields and the job id. The budget counts the
    bad records of one run: more than ``max``, or more than ``max_ratio`` of
    the records read when it is checked (at each periodic checkpoint and at
    the end of the input), fails the job.

    The files are exactly once: the letters are staged, and a runner
    publishes them with the checkpoint that covers their input (a run
    restarted from a checkpoint writes again only the letters after it, which
    no published file holds). The callback is called as each bad record is
    met, so at least once: after a restart, again for those after the
    restored checkpoint (``file`` and ``offset`` tell them apart).

    Args:
        policy: ``fail`` or ``dead-letter``.
        dead_letter_path: The dead-letter directory (made with mode 0700;
            an existing one must be private to the running user).
        sink: Called with every dead letter.
        max_bad: The run's count budget.
        max_ratio: The run's share budget.
        job_id: Written into every letter, and part of every file name.
        letters: The staged files to write into (a runner keeps one across
            its runs); None: made from ``dead_letter_path``.
    """

    def __init__(
        self,
        *,
        policy: str = "fail",
        dead_letter_path: str | os.PathLike[str] | None = None,
        sink: Callable[[BadRecord], None] | None = None,
        max_bad: int | None = None,
        max_ratio: float | None = None,
        job_id: str | None = None,
        letters: StagedDeadLetters | None = None,
    ) -> None:
        if policy not in ("fail", "dead-letter"):
            raise ConfigurationError(
                f"statekit.bad-records.policy must be fail or dead-letter, not {policy!r}"
            )
        if policy == "dead-letter" and dead_letter_path is None and sink is None and letters is None:
            raise ConfigurationError(
                "statekit.bad-records.policy=dead-letter needs somewhere to put them: set "
                "statekit.bad-records.dead-letter-path (a directory), or give the runner a dead_letter_sink"
            )
        if max_bad is not None and max_bad < 0:
            raise ConfigurationError(f"statekit.bad-records.max must be at least 0, not {max_bad}")
        if max_ratio is not None and not 0 <= max_ratio <= 1:
            raise ConfigurationError(f"statekit.bad-records.max-ratio must be in [0, 1], not {max_ratio}")
        self.policy = policy
        self.dead_letter_path = os.fspath(dead_letter_path) if dead_letter_path is not None else None
        self.sink = sink
        self.max_bad = max_bad
        self.max_ratio = max_ratio
        self.job_id = job_id
        self.count = 0
        """Bad records met since this policy was made (one run)."""
        self._kinds: dict[tuple[str, str], list[Any]] = {}  # (stage, error type): [count, first one]
        if letters is None and self.dead_letter_path is not None and policy == "dead-letter":
            letters = StagedDeadLetters(self.dead_letter_path, job_id or "job")
        self.letters = letters
        """Where dead letters are staged (None: only the callback takes them)."""
        self._lock = threading.Lock()

    @classmethod
    def from_config(
        cls,
        config: Any,
        *,
        sink: Callable[[BadRecord], None] | None = None,
        job_id: str | None = None,
        letters: StagedDeadLetters | None = None,
    ) -> BadRecordPolicy:
        """The policy ``config`` (a :class:`~statekit.Configuration`) sets."""
        return cls(
            policy=str(config.get("statekit.bad-records.policy")),
            dead_letter_path=config.get("statekit.bad-records.dead-letter-path"),
            sink=sink,
            max_bad=config.get("statekit.bad-records.max"),
            max_ratio=config.get("statekit.bad-records.max-ratio"),
            job_id=job_id,
            letters=letters,
        )

    def handle(self, bad: BadRecord) -> None:
        """Fail on ``bad`` or dead-letter it, then check the count budget.

        Raises:
            BadRecordError: Under the fail policy, or once more than ``max`` were met.
        """
        self.count += 1
        if self.policy == "fail":
            raise bad_record_error(bad)
        kind = (bad.stage, bad.error.partition(":")[0])
        seen = self._kinds.get(kind)
        if seen is not None:
            seen[0] += 1
        elif len(self._kinds) < _KINDS_KEPT:
            self._kinds[kind] = [1, bad]
        if self.max_bad is not None and self.count > self.max_bad:
            raise bad_record_error(
                bad,
                f"{self.count} bad records in this run, more than statekit.bad-records.max={self.max_bad}: "
                "the job stops (the earlier ones are dead letters, published with the checkpoint that "
                "covers them)",
            )
        self._dead_letter(bad)

    def check_ratio(self, records: int) -> None:
        """Fail if more than ``max_ratio`` of ``records`` (good and bad, this run) were bad.

        Raises:
            BadRecordError: If the ratio is exceeded.
        """
        if self.max_ratio is None or not self.count:
            return
        if self.count > self.max_ratio * records:
            raise BadRecordError(
                f"{self.count} bad records of {records} read in this run, more than "
                f"statekit.bad-records.max-ratio={self.max_ratio}: the job stops (the bad records that a "
                "completed checkpoint covers are in the dead letters; the run that goes on from that "
                f"checkpoint reads the others again). {self._most_common()}"
            )

    def _most_common(self) -> str:
        """The commonest kind of bad record met (stage and error type), its first one, and the ways out."""
        if not self._kinds:
            return ""
        (stage, _), (n, first) = max(self._kinds.items(), key=lambda kv: kv[1][0])
        share = "all of them" if n == self.count else f"{n} of them"
        return (
            f"The commonest ({share}): stage {stage}, {first.error}, the first at {first.place()}. "
            "When most bad records share one error, the job's code (its parser or key selector) is "
            "the likelier cause: fix it and run again, from the last checkpoint completed before them; "
            "if the input is that bad, raise statekit.bad-records.max-ratio"
        )

    def letter(self, bad: BadRecord) -> dict[str, Any]:
        """The dead letter of ``bad``: its fields, the job id and the time."""
        return {"job_id": self.job_id, "time": time.time(), **bad.to_json()}

    def _dead_letter(self, bad: BadRecord) -> None:
        if self.letters is not None:
            letter: Mapping[str, Any] = self.letter(bad)
            with self._lock:
                self.letters.write(letter)
        if self.sink is not None:
            self.sink(bad)

    def close(self) -> None:
        """Close the open staging file, if any; its letters stay staged for the next checkpoint."""
        with self._lock:
            if self.letters is not None:
                self.letters.close()
