"""The ``_metadata`` of a checkpoint or savepoint: its bytes, its JSON, and what each subtask wrote.

A checkpoint of a job with ``p`` subtasks per operator is complete once its
metadata is stored (last, atomically, by the storage). The metadata names,
per operator and subtask, the key-group range, where the keyed snapshot lies
(with the offset and digest of every key group's block) and where the
operator state lies. :meth:`CheckpointMetadata.from_bytes` checks everything a
restore relies on before any state is read.

A metadata file is bound to its identity: it records its job id, checkpoint
id and kind (``checkpoint``, or ``savepoint`` with its ``origin``: converted from
a checkpoint, or taken by a running job), and :func:`metadata_at` checks them
against where the file sits (:func:`identity_problem`): the ``_metadata`` of
``<dir>/<job>/chk-<n>`` must be checkpoint ``n`` of job ``<job>``. Another job's
or another checkpoint's metadata copied there is refused as damage is
(``restore="latest"`` falls back past it, ``checkpoints verify`` flags it),
never restored as this job's state. Savepoints are relocatable: any directory
holds one, but only a savepoint (a checkpoint's metadata outside its
``chk-<n>`` is refused), and one still named as statekit names it
(``savepoint-<job[:6]>-<hex>``) must name that job. Metadata of the earliest
0.1 builds, which did not record its kind, is taken as a checkpoint's at a
``chk-<n>`` (its job and id are checked, as always recorded) and accepted
elsewhere with its kind unchecked, which ``checkpoints verify`` says.
"""

from __future__ import annotations

import contextlib
import json
import re
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._errors import (
    CorruptCheckpointError,
    CorruptSnapshotError,
)
from ..serialization._keygroups import KeyGroupRange, key_group_range_for_operator

__all__ = [
    "METADATA_VERSION",
    "CheckpointMetadata",
    "SubtaskState",
    "identity_problem",
    "metadata_at",
    "naming_damage",
    "typed",
]

_MAGIC = b"STKMETA1"
_U32 = struct.Struct("<I")
#: The version written when a subtask holds raw state (a statekit before it would drop it unread);
#: metadata without raw state is written as version 1, readable by every statekit.
METADATA_VERSION = 2


@dataclass
class SubtaskState:
    """What one subtask of one operator contributes to a checkpoint (JSON-able)."""

    operator_id: str
    subtask_index: int
    key_group_range: KeyGroupRange
    keyed: dict[str, Any] | None = None
    operator: dict[str, Any] | None = None
    states: list[dict[str, Any]] = field(default_factory=list)
    raw: dict[str, Any] | None = None
    """The subtask's raw state file (see ``checkpoints/_raw.py``), if it wrote any."""

    def to_json(self) -> dict[str, Any]:
        """The subtask's entry in the metadata."""
        out: dict[str, Any] = {
            "operator_id": self.operator_id,
            "subtask_index": self.subtask_index,
            "key_group_range": [self.key_group_range.start, self.key_group_range.end],
            "keyed": self.keyed,
            "operator": self.operator,
            "states": self.states,
        }
        if self.raw is not None:  # absent otherwise: the bytes of version 1, as before raw state
            out["raw"] = self.raw
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SubtaskState:
        """Parse :meth:`to_json` output."""
        s, e = obj["key_group_range"]
        return cls(
            str(obj["operator_id"]),
            typed(obj["subtask_index"], int, "subtask_index"),
            KeyGroupRange.of(typed(s, int, "key group"), typed(e, int, "key group")),
            obj.get("keyed"),
            obj.get("operator"),
            [_checked_state_entry(m) for m in typed(obj.get("states") or [], list, "states")],
            obj.get("raw"),
        )


@dataclass
class CheckpointMetadata:
    """The ``_metadata`` of a checkpoint or savepoint."""

    job_id: str
    checkpoint_id: int
    max_parallelism: int
    operators: dict[str, list[SubtaskState]]
    kind: str = "checkpoint"
    backend: str = ""
    timestamp_ms: int = 0
    properties: dict[str, Any] = field(default_factory=dict)
    kind_recorded: bool = True
    """False for metadata of the earliest 0.1 builds, which did not record its kind."""

    @property
    def origin(self) -> dict[str, Any] | None:
        """Where a savepoint comes from: converted from a checkpoint (which), or taken by a running job."""
        if self.kind != "savepoint":
            return None
        source = self.properties.get("converted_from")
        if isinstance(source, str):
            return {"from": "checkpoint", "location": source, "checkpoint_id": self.checkpoint_id}
        return {"from": "running job", "checkpoint_id": self.checkpoint_id}

    def parallelism(self, operator_id: str) -> int:
        """The number of subtasks ``operator_id`` had."""
        return len(self.operators[operator_id])

    def shared_handles(self) -> list[dict[str, Any]]:
        """Descriptions of the shared files this checkpoint references."""
        out: list[dict[str, Any]] = []
        for subtasks in self.operators.values():
            for st in subtasks:
                for part in (st.keyed, st.operator):
                    shared = part.get("shared") if part else None  # from_bytes checked: a dict or None
                    if isinstance(shared, list):
                        out.extend(d for d in shared if isinstance(d, dict))
        return out

    def to_bytes(self) -> bytes:
        """The metadata file: magic, JSON, CRC-32."""
        has_raw = any(st.raw is not None for sts in self.operators.values() for st in sts)
        body = json.dumps(
            {
                "version": METADATA_VERSION if has_raw else 1,
                "job_id": self.job_id,
                "checkpoint_id": self.checkpoint_id,
                "kind": self.kind,
                "max_parallelism": self.max_parallelism,
                "backend": self.backend,
                "timestamp_ms": self.timestamp_ms,
                "properties": self.properties,
                "operators": {op: [st.to_json() for st in sts] for op, sts in self.operators.items()},
                **({"origin": self.origin} if self.kind == "savepoint" else {}),
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode()
        return _MAGIC + body + _U32.pack(zlib.crc32(body))

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "_metadata") -> CheckpointMetadata:
        """Parse and check metadata bytes.

        Everything a restore relies on is checked here, so a damaged or crafted
        file is refused before any state is read: the checksum, the version, the
        JSON's shape, and that each operator's subtasks are ``0..p-1`` owning
        exactly the key groups Flink's formula gives them.

        Raises:
            CorruptSnapshotError: Naming ``where``, if anything is wrong.
        """
        if len(data) < len(_MAGIC) + 4 or data[: len(_MAGIC)] != _MAGIC:
            raise CorruptSnapshotError(f"{where}: not a statekit checkpoint metadata file")
        body = data[len(_MAGIC) : -4]
        if zlib.crc32(body) != _U32.unpack(data[-4:])[0]:
            raise CorruptSnapshotError(f"{where}: checksum mismatch; the metadata file is corrupt")
        try:
            obj = json.loads(body)
            version = obj.get("version")
            if not isinstance(version, int) or not 1 <= version <= METADATA_VERSION:
                raise CorruptSnapshotError(
                    f"metadata version {version!r} is not one this statekit reads "
                    f"(1 to {METADATA_VERSION}); a newer statekit wrote it (upgrade), or the file is corrupt"
                )
            meta = cls(
                job_id=typed(obj["job_id"], str, "job_id"),
                checkpoint_id=typed(obj["checkpoint_id"], int, "checkpoint_id"),
                max_parallelism=typed(obj["max_parallelism"], int, "max_parallelism"),
                operators={
                    typed(op, str, "operator id"): sorted(
                        (SubtaskState.from_json(typed(s, dict, "subtask")) for s in typed(sts, list, op)),
                        key=lambda s: s.subtask_index,
                    )
                    for op, sts in typed(obj["operators"], dict, "operators").items()
                },
                kind=typed(obj.get("kind", "checkpoint"), str, "kind"),
                backend=typed(obj.get("backend", ""), str, "backend"),
                timestamp_ms=typed(obj.get("timestamp_ms", 0), int, "timestamp_ms"),
                properties=typed(obj.get("properties") or {}, dict, "properties"),
                kind_recorded="kind" in obj,
            )
            if meta.kind not in ("checkpoint", "savepoint"):
                raise CorruptSnapshotError(f"kind {meta.kind!r} is neither 'checkpoint' nor 'savepoint'")
            meta._check_layout()
        except CorruptSnapshotError as e:  # raised without the file's name: add it
            raise CorruptSnapshotError(f"{where}: {e}") from None
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError) as e:
            # RecursionError: JSON nested too deeply for the parser (a crafted file).
            raise CorruptSnapshotError(
                f"{where}: malformed metadata ({type(e).__name__}: {str(e)[:200]}); the file is corrupt"
            ) from None
        return meta

    def _check_layout(self) -> None:
        """Refuse subtask lists and key-group ranges a runner could not have written."""
        if self.checkpoint_id < 0 or not 1 <= self.max_parallelism <= 32768:
            raise CorruptSnapshotError(
                f"checkpoint id {self.checkpoint_id} or max parallelism {self.max_parallelism} "
                "is out of range"
            )
        for op, sts in self.operators.items():
            p = len(sts)
            if [s.subtask_index for s in sts] != list(range(p)) or p > self.max_parallelism:
                raise CorruptSnapshotError(
                    f"operator {op!r}: subtasks {[s.subtask_index for s in sts]} are not 0..{p - 1}"
                )
            for st in sts:
                for part in (st.keyed, st.operator, st.raw):
                    if part is not None and not isinstance(part, dict):
                        raise CorruptSnapshotError(
                            f"operator {op!r} subtask {st.subtask_index}: malformed entry"
                        )
                if st.keyed is None and st.raw is None:
                    continue
                want = key_group_range_for_operator(self.max_parallelism, p, st.subtask_index)
                if st.key_group_range != want:
                    # A narrower range would silently restore only part of the key groups.
                    raise CorruptSnapshotError(
                        f"operator {op!r} subtask {st.subtask_index} of {p} claims key groups "
                        f"{st.key_group_range}, but owns {want} at max parallelism {self.max_parallelism}"
                    )


def typed(value: Any, kind: type[Any], what: str) -> Any:
    """``value`` if it is a ``kind`` (a bool is no int here), else a CorruptSnapshotError."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CorruptSnapshotError(f"{what} is {type(value).__name__}, expected {kind.__name__}")
    return value


def _checked_state_entry(meta: Any) -> dict[str, Any]:
    """One entry of a subtask's ``states`` (a state's descriptor as stored), its shape checked.

    Every reader of an entry (restore, the schema checks, the state processor,
    ``inspect``) may then rely on the types of its fields: a crafted or damaged
    entry is a CorruptSnapshotError here, never a Python error deeper down.
    """
    entry: dict[str, Any] = typed(meta, dict, "a state's entry")
    name = typed(entry.get("name"), str, "a state's name")
    typed(entry.get("kind"), str, f"state {name!r}: its kind")
    _checked_schema(entry, f"state {name!r}")
    for key in ("stored_serializer", "namespace_serializer"):
        if entry.get(key) is not None:
            typed(entry[key], dict, f"state {name!r}: its {key}")
    lineage = entry.get("lineage")
    steps = typed(lineage, list, f"state {name!r}: its lineage") if lineage is not None else []
    for i, step in enumerate(steps):
        what = f"state {name!r}, lineage entry {i}"
        _checked_schema(typed(step, dict, what), what)
    return entry


def _checked_schema(schema: Mapping[str, Any], what: str) -> None:
    """The fields a schema (an entry or a lineage step) has: serializer, TTL, version."""
    if schema.get("serializer") is not None:
        typed(schema["serializer"], dict, f"{what}: its serializer")
    if schema.get("schema_version") is not None:
        typed(schema["schema_version"], int, f"{what}: its schema_version")
    ttl = schema.get("ttl")
    if ttl is not None:
        ttl = typed(ttl, dict, f"{what}: its ttl")
        typed(ttl.get("ttl_ms"), int, f"{what}: its ttl_ms")
        typed(ttl.get("update_type"), str, f"{what}: its TTL update_type")
        typed(ttl.get("visibility"), str, f"{what}: its TTL visibility")


@contextlib.contextmanager
def naming_damage(location: str) -> Iterator[None]:
    """Turn a :class:`CorruptSnapshotError` raised inside into a ``CorruptCheckpointError`` of ``location``.

    So every corruption error of a checkpoint reads ``checkpoint <location>:
    <file>: <what is wrong>``, wherever the damaged bytes were found.
    """
    try:
        yield
    except CorruptCheckpointError:
        raise
    except CorruptSnapshotError as e:
        raise CorruptCheckpointError(location, str(e)) from e


_CHECKPOINT_DIR = re.compile(r"chk-(0|[1-9][0-9]*)")
_SAVEPOINT_DIR = re.compile(r"savepoint-(.{1,6})-[0-9a-f]{12}")


def identity_problem(meta: CheckpointMetadata, location: str) -> str | None:
    """What the metadata read at ``location`` records that does not fit where it sits; None if it fits.

    See the module doc: at ``<dir>/<job>/chk-<n>`` checkpoint ``n`` of job
    ``<job>``; elsewhere a savepoint (of the job its statekit-given name names).
    """
    path = location.rstrip("/")
    path = path.removesuffix("/_metadata")
    parts = path.rsplit("/", 2)
    name, parent = parts[-1], (parts[-2] if len(parts) > 1 else "")
    checkpoint = _CHECKPOINT_DIR.fullmatch(name)
    if checkpoint is not None:
        n = int(checkpoint[1])
        wrong = []
        if meta.kind != "checkpoint":
            wrong.append(f"kind {meta.kind!r}")
        if meta.job_id != parent:
            wrong.append(f"job {meta.job_id!r}")
        if meta.checkpoint_id != n:
            wrong.append(f"checkpoint id {meta.checkpoint_id}")
        if not wrong:
            return None
        return (
            f"it sits as checkpoint {n} of job {parent!r} but records {', '.join(wrong)}: it is the "
            f"metadata of {meta.kind} {meta.checkpoint_id} of job {meta.job_id!r}, copied or moved here, "
            "and is never restored as this one. Ways out: restore an older checkpoint or a savepoint of "
            "this job; delete this chk directory once you know how it came here"
        )
    if meta.kind == "checkpoint" and meta.kind_recorded:
        return (
            f"it is the metadata of checkpoint {meta.checkpoint_id} of job {meta.job_id!r} outside that "
            f"checkpoint's directory (.../{meta.job_id}/chk-{meta.checkpoint_id}); a checkpoint is not "
            "relocatable (its shared files belong to its job): restore it where it was written, or "
            "convert it into a savepoint (statekit savepoint convert), which is"
        )
    named = _SAVEPOINT_DIR.fullmatch(name)
    if named is not None and meta.job_id[:6] != named[1]:
        return (
            f"its directory is named as statekit names savepoints of jobs starting {named[1]!r}, but it "
            f"records job {meta.job_id!r}: another savepoint's metadata copied here"
        )
    return None


def metadata_at(location: str, data: bytes) -> CheckpointMetadata:
    """Parse the ``_metadata`` bytes of the checkpoint at ``location``, checking its identity there.

    Raises:
        CorruptCheckpointError: Naming ``<location>/_metadata``, if they are damaged, or
            record another checkpoint than the one at ``location`` (:func:`identity_problem`).
    """
    where = f"{location.rstrip('/')}/_metadata"
    with naming_damage(location):
        meta = CheckpointMetadata.from_bytes(data, where)
        problem = identity_problem(meta, location)
        if problem is not None:
            raise CorruptSnapshotError(f"{where}: {problem}")
    return meta
