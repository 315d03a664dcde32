"""The checks that enforce the conformance kit's named properties.

The properties' names and :class:`PropertyViolation` live in ``_violation``
(re-exported here), below the harness (``_job``), which raises them too. Each
check raises :class:`PropertyViolation` naming its property and saying, in
terms of key groups, keys, namespaces and subtasks, what the backend holds and
what it should hold. The state machines call them at the right moments; a
failing run is then reported by Hypothesis with the shortest sequence of
operations it found.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ..serialization._keygroups import key_group_range_for_operator, operator_index_for_key_group
from ._job import DecodedEntry, Job, decode_canonical, snapshot_handle
from ._model import NAMESPACES, KeyedModel, OperatorModel, Slot
from ._violation import (
    AGREES_WITH_MODEL,
    BROADCAST_REDISTRIBUTION,
    CLEAR_SCOPE,
    EVEN_SPLIT_REDISTRIBUTION,
    NATIVE_REFERENCES_COMPLETED,
    PROPERTIES,
    RESCALE_KEY_GROUP_OWNERSHIP,
    RULES,
    SAVEPOINT_PORTABILITY,
    SCHEMA_EVOLUTION,
    SNAPSHOT_ISOLATION,
    SNAPSHOT_RESTORE_ROUND_TRIP,
    STORAGE_ROUND_TRIP,
    TTL_NEVER_RETURNS_EXPIRED,
    TTL_UPDATE_TYPE,
    UNION_REDISTRIBUTION,
    PropertyViolation,
)

__all__ = [
    "AGREES_WITH_MODEL",
    "BROADCAST_REDISTRIBUTION",
    "CLEAR_SCOPE",
    "EVEN_SPLIT_REDISTRIBUTION",
    "NATIVE_REFERENCES_COMPLETED",
    "PROPERTIES",
    "RESCALE_KEY_GROUP_OWNERSHIP",
    "RULES",
    "SAVEPOINT_PORTABILITY",
    "SCHEMA_EVOLUTION",
    "SNAPSHOT_ISOLATION",
    "SNAPSHOT_RESTORE_ROUND_TRIP",
    "STORAGE_ROUND_TRIP",
    "TTL_NEVER_RETURNS_EXPIRED",
    "TTL_UPDATE_TYPE",
    "UNION_REDISTRIBUTION",
    "PropertyViolation",
    "check_keyed",
    "check_keyed_counts",
    "check_operator",
    "check_redistribution",
    "check_same_entries",
]

_SHOWN = 8  # differences listed per violation


def _ns(ns: Any) -> str:
    return "VOID" if not isinstance(ns, int) else str(ns)


def _where(job: Job, key: Any) -> str:
    kg = job.key_group(key)
    i = operator_index_for_key_group(job.max_parallelism, job.parallelism, kg)
    r = key_group_range_for_operator(job.max_parallelism, job.parallelism, i)
    return f"key group {kg}, owned by subtask {i} of {job.parallelism} ([{r.start}, {r.end}])"


def _differences(
    job: Job, name: str, got: Mapping[Slot, Any], want: Mapping[Slot, Any]
) -> list[tuple[int, str, str]]:
    """``(key group, "lost" | "extra" | "changed", description)`` of each differing entry."""
    out = []
    for slot in sorted(set(got) | set(want), key=repr):
        if slot in got and slot in want and got[slot] == want[slot]:
            continue
        key, ns = slot
        kind = "lost" if slot not in got else "extra" if slot not in want else "changed"
        g, w = got.get(slot, "<absent>"), want.get(slot, "<absent>")
        out.append(
            (
                job.key_group(key),
                kind,
                f"state {name!r}, key {key!r} ({_where(job, key)}), namespace {_ns(ns)}: "
                f"backend holds {g!r}, expected {w!r}",
            )
        )
    return out


def check_keyed(
    job: Job,
    model: KeyedModel,
    *,
    prop: str,
    context: str,
    decoded: Sequence[Sequence[DecodedEntry]] | None = None,
    expected: Mapping[str, Mapping[Slot, Any]] | None = None,
    now: int | None = None,
    skip_empty: bool = False,
) -> list[list[DecodedEntry]]:
    """Check that the job's keyed state, read from canonical snapshots, is the model's.

    Also checks where each entry lives: in its key group's block, at the subtask
    owning that key group, on one subtask only; and that the subtasks' key group
    ranges cover every key group once. Returns the decoded entries.

    Args:
        job: The job to read.
        model: The expected state.
        prop: The property reported on failure.
        context: What just happened, for the message.
        decoded: Entries already decoded from snapshots (default: snapshot now).
        expected: Expected entries per state (default: the model's own, as a snapshot now shows them).
        now: The time of the snapshot ``decoded`` comes from.
        skip_empty: Do not snapshot subtasks whose ``num_entries()`` is 0 (the per-step
            check does this: their counts are checked against the model separately).
    """
    now = job.clock() if now is None else now
    problems = _layout_problems(job)
    if decoded is not None:
        entries = [list(x) for x in decoded]
    elif skip_empty:
        entries = []
        for subtask in job.subtasks:
            empty = not subtask.keyed.num_entries()
            entries.append([] if empty else decode_canonical(snapshot_handle(subtask.keyed)))
    else:
        entries = job.decoded()
    got = _held(job, model, entries, problems)
    want_all = expected if expected is not None else model.snapshot_view(model.entries, now)
    lost_slots: list[tuple[str, Any, Any]] = []
    for name in model.specs:
        want = model.comparable(name, want_all.get(name, {}), now)
        have = model.comparable(name, got.get(name, {}), now)
        problems.extend(_differences(job, name, have, want))
        lost_slots.extend((name, key, ns) for key, ns in want if (key, ns) not in have)
    for name in set(got) - set(model.specs):
        problems.append((-1, "extra", f"unexpected state {name!r} with {len(got[name])} entries"))
    if problems:
        lost = sorted({kg for kg, kind, _ in problems if kind == "lost"})
        summary = f"key groups that lost entries: {lost}\n" if lost else ""
        lines = "\n".join(f"  - {p}" for _, _, p in problems[:_SHOWN])
        more = f"\n  ... and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        violation = PropertyViolation(prop, f"after {context} (now {job}):\n{summary}{lines}{more}")
        violation.lost = lost_slots
        raise violation
    return entries


def _layout_problems(job: Job) -> list[tuple[int, str, str]]:
    """Subtasks whose key group range is not Flink's, and key groups owned twice or not at all."""
    problems: list[tuple[int, str, str]] = []
    covered: dict[int, int] = {}
    for st in job.subtasks:
        want_range = key_group_range_for_operator(job.max_parallelism, job.parallelism, st.index)
        if st.keyed.key_group_range != want_range:
            problems.append(
                (-1, "layout", f"subtask {st.index} owns {st.keyed.key_group_range}, expected {want_range}")
            )
        for kg in st.keyed.key_group_range:
            if kg in covered:
                problems.append(
                    (kg, "layout", f"key group {kg} is owned by subtasks {covered[kg]} and {st.index}")
                )
            covered[kg] = st.index
    missing = [kg for kg in range(job.max_parallelism) if kg not in covered]
    if missing:
        problems.append((missing[0], "layout", f"key groups {missing} are owned by no subtask"))
    return problems


def _held(
    job: Job,
    model: KeyedModel,
    entries: Sequence[Sequence[DecodedEntry]],
    problems: list[tuple[int, str, str]],
) -> dict[str, dict[Slot, Any]]:
    """Each state's stored values by (key, namespace); misplaced or doubled entries go to ``problems``."""
    got: dict[str, dict[Slot, Any]] = {name: {} for name in model.specs}
    for st, subtask_entries in zip(job.subtasks, entries):
        for e in subtask_entries:
            kg = job.key_group(e.key)
            if e.key_group != kg:
                problems.append(
                    (
                        kg,
                        "misplaced",
                        f"key {e.key!r} of key group {kg} is stored in the block of key group {e.key_group}",
                    )
                )
            if kg not in st.keyed.key_group_range:
                problems.append(
                    (kg, "misplaced", f"key {e.key!r} ({_where(job, e.key)}) is held by subtask {st.index}")
                )
            table = got.setdefault(e.state, {})
            if (e.key, e.namespace) in table:
                problems.append(
                    (
                        kg,
                        "duplicate",
                        f"state {e.state!r} key {e.key!r} namespace {_ns(e.namespace)} is held twice",
                    )
                )
            table[(e.key, e.namespace)] = e.stored
    return got


def check_keyed_counts(job: Job, model: KeyedModel, *, prop: str, context: str) -> None:
    """``num_entries`` and ``keys`` of every state agree with the model (without side effects)."""
    now = job.clock()
    for name, spec in model.specs.items():
        table = model.entries[name]
        live = model.comparable(name, table, now)
        counts = [st.keyed.num_entries(name) for st in job.subtasks]
        count = sum(counts)
        low, high = (len(live), len(table)) if spec.cleans_incrementally else (len(table), len(table))
        if not low <= count <= high:
            raise PropertyViolation(
                prop,
                f"after {context} ({job}): num_entries({name!r}) summed over subtasks is {count}, "
                f"the model holds {len(table)} entries"
                + (f" ({len(live)} live)" if spec.cleans_incrementally else ""),
            )
        for ns in NAMESPACES:
            keys: list[Any] = []
            for st, n in zip(job.subtasks, counts):
                if n:  # a subtask without entries of the state lists no keys (checked where it has some)
                    keys.extend(st.keyed.keys(name, ns))
            want_all = {k for (k, n) in table if n == ns}
            want_live = {k for (k, n) in live if n == ns}
            got = set(keys)
            ok = want_live <= got <= want_all if spec.cleans_incrementally else got == want_all
            if not ok or len(keys) != len(got):
                raise PropertyViolation(
                    prop,
                    f"after {context} ({job}): keys({name!r}, namespace {_ns(ns)}) over all subtasks are "
                    f"{sorted(keys, key=repr)}, the model has {sorted(want_all, key=repr)}",
                )


def check_same_entries(
    before: Sequence[Sequence[DecodedEntry]],
    after: Sequence[Sequence[DecodedEntry]],
    *,
    prop: str,
    context: str,
) -> None:
    """Two decodings of the same job (same parallelism) hold the same entries, subtask by subtask."""
    for i, (b, a) in enumerate(zip(before, after)):
        bd = {(e.state, e.key, e.namespace): (e.key_group, e.stored) for e in b}
        ad = {(e.state, e.key, e.namespace): (e.key_group, e.stored) for e in a}
        if bd != ad:
            diff = [
                f"  - state {s!r}, key {k!r}, namespace {_ns(n)}: before {bd.get((s, k, n), '<absent>')!r}, "
                f"after {ad.get((s, k, n), '<absent>')!r}"
                for (s, k, n) in sorted(set(bd) | set(ad), key=repr)
                if bd.get((s, k, n)) != ad.get((s, k, n))
            ]
            raise PropertyViolation(prop, f"{context}: subtask {i} differs:\n" + "\n".join(diff[:_SHOWN]))


def check_operator(job: Job, model: OperatorModel, *, prop: str, context: str) -> None:
    """The job's operator state, read through its handles, is the model's."""
    split, union, broadcast = job.operator_state()
    for what, got, want in (
        ("even-split list", split, model.split),
        ("union list", union, model.union),
        ("broadcast map", broadcast, model.broadcast),
    ):
        if got != want:
            raise PropertyViolation(
                prop, f"after {context} ({job}): the {what} of each subtask is {got}, expected {want}"
            )


def check_redistribution(
    job: Job,
    old: OperatorModel,
    *,
    context: str,
    checks: Collection[str] = (EVEN_SPLIT_REDISTRIBUTION, UNION_REDISTRIBUTION, BROADCAST_REDISTRIBUTION),
) -> None:
    """After a restore at a new parallelism, operator state was redistributed as DESIGN.md §4 says.

    ``checks`` names the redistribution properties to check.
    """
    split, union, broadcast = job.operator_state()
    p = job.parallelism
    want = old.redistributed(p)
    if EVEN_SPLIT_REDISTRIBUTION in checks and split != want.split:
        raise PropertyViolation(
            EVEN_SPLIT_REDISTRIBUTION,
            f"after {context} ({job}): the old subtasks' lists {old.split} (p={old.parallelism}) became "
            f"{split}; expected {want.split} (sizes {[len(x) for x in want.split]}, order kept)",
        )
    concat = [x for lst in old.union for x in lst]
    bad = [i for i, lst in enumerate(union) if lst != concat]
    if UNION_REDISTRIBUTION in checks and bad:
        raise PropertyViolation(
            UNION_REDISTRIBUTION,
            f"after {context} ({job}): subtasks {bad} hold union lists {[union[i] for i in bad]}; "
            f"every subtask must hold the concatenation {concat} of the old lists {old.union}",
        )
    if BROADCAST_REDISTRIBUTION in checks and (
        broadcast != want.broadcast or any(m != broadcast[0] for m in broadcast)
    ):
        raise PropertyViolation(
            BROADCAST_REDISTRIBUTION,
            f"after {context} ({job}): the broadcast maps are {broadcast}; every subtask must hold "
            f"{want.broadcast[0] if want.broadcast else {}} (old subtasks held {old.broadcast})",
        )
