"""The conformance kit's named properties, and the error that says one was broken.

The lowest module of the kit: the harness (``_job``) raises
:class:`PropertyViolation` while it snapshots and restores, and the checks
(``_properties``) and state machines raise it when a backend disagrees with
the model; both import it from here.
"""

from __future__ import annotations

from collections.abc import Mapping

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
]

AGREES_WITH_MODEL = "backend_agrees_with_model"
SNAPSHOT_RESTORE_ROUND_TRIP = "snapshot_restore_round_trip"
RESCALE_KEY_GROUP_OWNERSHIP = "rescale_key_group_ownership"
EVEN_SPLIT_REDISTRIBUTION = "even_split_redistribution"
UNION_REDISTRIBUTION = "union_redistribution"
BROADCAST_REDISTRIBUTION = "broadcast_redistribution"
SAVEPOINT_PORTABILITY = "savepoint_portability"
TTL_NEVER_RETURNS_EXPIRED = "ttl_never_returns_expired"
SNAPSHOT_ISOLATION = "snapshot_isolation"
STORAGE_ROUND_TRIP = "storage_round_trip"
NATIVE_REFERENCES_COMPLETED = "native_references_only_completed_uploads"
SCHEMA_EVOLUTION = "schema_evolution"

PROPERTIES: Mapping[str, str] = {
    AGREES_WITH_MODEL: "after every operation, the backend holds and returns what the model says",
    SNAPSHOT_RESTORE_ROUND_TRIP: "restore(snapshot(s)) == s, canonical and native",
    RESCALE_KEY_GROUP_OWNERSHIP: "after a rescale every key group is owned by exactly one subtask, "
    "and the subtasks' keyed state together equals the model",
    EVEN_SPLIT_REDISTRIBUTION: "even-split lists keep their order and their sizes differ by at most one",
    UNION_REDISTRIBUTION: "union lists are the concatenation of the old ones on every subtask",
    BROADCAST_REDISTRIBUTION: "broadcast state is equal on every subtask",
    SAVEPOINT_PORTABILITY: "a savepoint taken on any backend restores into every backend with the same state",
    TTL_NEVER_RETURNS_EXPIRED: "under never_return_expired, an expired entry is never returned",
    SNAPSHOT_ISOLATION: "a snapshot is unaffected by writes made after it was taken",
    STORAGE_ROUND_TRIP: "a checkpoint or savepoint restores the state it was taken of, and retention "
    "keeps exactly the newest checkpoints",
    NATIVE_REFERENCES_COMPLETED: "a native snapshot references only files that checkpoints the backend was "
    "told completed uploaded; an upload of an aborted (or never confirmed) checkpoint is never referenced",
    SCHEMA_EVOLUTION: "a state written in schema A and restored in a compatible schema B reads as the "
    "model's migration of it, and its schema history records A; an incompatible B is refused with nothing "
    "changed",
}
"""Every named property with what it says."""

CLEAR_SCOPE = "clear_scope"
TTL_UPDATE_TYPE = "ttl_update_type"

RULES: Mapping[str, str] = {
    CLEAR_SCOPE: "clear() removes the entry of the current key and namespace only: other namespaces of the "
    "key, and other keys, keep theirs",
    TTL_UPDATE_TYPE: "under OnCreateAndWrite only writes refresh an entry's TTL timestamp, a read never does "
    "(under OnReadAndWrite reads do too)",
}
"""The specific rules a property's failure may name (as the plain kit tests of the same rule do)."""


class PropertyViolation(AssertionError):
    """A backend or storage broke a named property of the conformance kit.

    Attributes:
        property: The property's name (a key of :data:`PROPERTIES`).
        rule: The specific rule broken (a key of :data:`RULES`), when the kit can tell; else None.
        lost: ``(state, key, namespace)`` of the entries the model holds and the backend lost,
            when the check compared entries (empty otherwise).
    """

    def __init__(self, prop: str, message: str, *, rule: str | None = None) -> None:
        """Names the property (and the rule, when known) and what broke it."""
        head = f"[{prop}] {PROPERTIES.get(prop, '')}"
        if rule is not None:
            head = f"[{rule}] {RULES.get(rule, '')}\n(a rule of {head})"
        super().__init__(f"{head}\n{message}")
        self.property = prop
        self.rule = rule
        self.lost: list[tuple[str, object, object]] = []
