"""Kit tests of snapshots and restores on any backend: round trips, refused restores,
corruption, isolation from later writes (also from another thread), rescaling."""

from __future__ import annotations

import dataclasses
import io
import operator
import queue
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar

import pytest
from hypothesis import settings

from .._contracts import SupportsNativeSnapshot
from .._errors import (
    CorruptSnapshotError,
    IncompatibleSerializerError,
    MaxParallelismMismatchError,
    SnapshotCancelledError,
    StateAccessError,
    StateMigrationError,
)
from ..serialization._keygroups import (
    KeyGroupRange,
    key_group_for_bytes,
    key_group_range_for_operator,
    operator_index_for_key_group,
)
from ..serialization._serializers import IntSerializer, StrSerializer, serializer_for
from ..snapshots._snapshot import BytesStreamHandle, KeyedStateHandle
from ..state._delta import DeltaKeyedBackendBase
from ..state._state import (
    VOID_NAMESPACE,
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from ._job import KitNativeOutput, NativeCheckpoints, native_snapshot_handle, snapshot_handle, write_snapshot
from ._model import SumCount
from ._semantics_state import Mean, batch_update_or_skip

__all__ = ["SnapshotSemantics"]

MAXP = 128
INT_NS = serializer_for(int)
NAMESPACES = [VOID_NAMESPACE, 1, 2, 3, 4]
HOUR = StateTtlConfig(timedelta(hours=1))
KINDS = ["value", "list", "reducing", "aggregating", "map"]


def descriptors(ttl: StateTtlConfig | None = None) -> dict[str, StateDescriptor]:
    """One state of each kind, named after its kind."""
    return {
        "value": ValueStateDescriptor("value", int, ttl=ttl),
        "list": ListStateDescriptor("list", int, ttl=ttl),
        "reducing": ReducingStateDescriptor("reducing", operator.add, int, ttl=ttl),
        "aggregating": AggregatingStateDescriptor("aggregating", Mean(), tuple[int, int], ttl=ttl),
        "map": MapStateDescriptor("map", str, int, ttl=ttl),
    }


def sampled_positions(parts: list[tuple[int, int]], budget: int) -> list[int]:
    """About ``budget`` byte positions covering every ``(offset, length)`` part: its edges and a stride.

    The first and last 8 bytes of each part, then an even stride through each in
    proportion to its length; deterministic, so a failure reproduces.
    """
    edge = 8
    chosen: set[int] = set()
    for start, length in parts:
        chosen.update(range(start, start + min(edge, length)))
        chosen.update(range(max(start, start + length - edge), start + length))
    room = max(0, budget - len(chosen))
    total = sum(length for _, length in parts) or 1
    for start, length in parts:
        share = max(1, room * length // total)
        chosen.update(range(start, start + length, max(1, length // share)))
    return sorted(chosen)


def declare(backend: Any, ttl: StateTtlConfig | None = None) -> dict[str, Any]:
    """Declare every state of :func:`descriptors` with int namespaces."""
    return {n: backend.get_state(d, namespace_serializer=INT_NS) for n, d in descriptors(ttl).items()}


def write_key(states: dict[str, Any], i: int) -> None:
    """Write key number ``i``'s state, in the void namespace and, for even keys, another one."""
    for ns in (VOID_NAMESPACE, i % 4 + 1) if i % 2 == 0 else (VOID_NAMESPACE,):
        for s in states.values():
            s.set_current_namespace(ns)
        x = i if ns is VOID_NAMESPACE else -i
        states["value"].update(x)
        states["list"].add_all([x, x + 1])
        states["reducing"].add(x)
        states["reducing"].add(1)
        states["aggregating"].add(x)
        states["map"].put_all({"a": x, "none": None})
    for s in states.values():
        s.set_current_namespace(VOID_NAMESPACE)


def expected_of(i: int) -> dict[tuple[str, Any], Any]:
    """What key number ``i`` holds after :func:`write_key`: (state, namespace) -> read."""
    out: dict[tuple[str, Any], Any] = {}
    for ns in (VOID_NAMESPACE, i % 4 + 1) if i % 2 == 0 else (VOID_NAMESPACE,):
        x = i if ns is VOID_NAMESPACE else -i
        out.update(
            {
                ("value", ns): x,
                ("list", ns): [x, x + 1],
                ("reducing", ns): x + 1,
                ("aggregating", ns): float(x),
                ("map", ns): {"a": x, "none": None},
            }
        )
    return out


def populate(backend: Any, keys: list[str], ttl: StateTtlConfig | None = None) -> dict[str, Any]:
    """Declare every state and write every key."""
    states = declare(backend, ttl)
    for i, k in enumerate(keys):
        backend.set_current_key(k)
        write_key(states, i)
    return states


def read(kind: str, s: Any) -> Any:
    """What a state holds for the current key and namespace."""
    if kind == "value":
        return s.value()
    if kind == "map":
        return dict(s.items())
    return s.get()


def dump(backend: Any, states: dict[str, Any]) -> dict[tuple[str, Any, Any], Any]:
    """Everything ``backend`` holds in ``states``: (state, namespace, key) -> what a read returns."""
    out = {}
    for kind, s in states.items():
        for ns in NAMESPACES:
            for key in list(backend.keys(kind, ns)):
                backend.set_current_key(key)
                s.set_current_namespace(ns)
                out[(kind, ns, key)] = read(kind, s)
        s.set_current_namespace(VOID_NAMESPACE)
    return out


def keys_of(n: int) -> list[str]:
    """``key-0`` .. ``key-<n-1>``."""
    return [f"key-{i}" for i in range(n)]


def key_group(key: str) -> int:
    """The key group of a ``str`` key at max parallelism 128."""
    return key_group_for_bytes(StrSerializer().serialize(key), MAXP)


def flipped(handle: KeyedStateHandle, pos: int) -> KeyedStateHandle:
    """``handle`` with byte ``pos`` inverted."""
    data = bytearray(handle.stream.read())
    data[pos] ^= 0xFF
    return dataclasses.replace(handle, stream=BytesStreamHandle(bytes(data)))


@dataclasses.dataclass(frozen=True, eq=False)
class RecordingStream:
    """A stream handle that records the byte ranges read from it."""

    inner: Any
    reads: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    @property
    def size(self) -> int:
        """The inner size."""
        return int(self.inner.size)

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        """Reads and records."""
        data: bytes = self.inner.read(offset, length)
        self.reads.append((offset, len(data)))
        return data

    def discard(self) -> None:
        """Nothing."""

    def to_json(self) -> dict[str, Any]:
        """The inner description."""
        out: dict[str, Any] = self.inner.to_json()
        return out


# Copy-on-write cases: states whose values or accumulators user code may change in place.
def cow_descriptors() -> dict[str, StateDescriptor]:
    """States of mutable and immutable values, changed by later writes and in place."""
    return {
        "int": ValueStateDescriptor("int", int),
        "dict": ValueStateDescriptor("dict", dict[str, int]),
        "ints": ValueStateDescriptor("ints", list[int]),
        "list": ListStateDescriptor("list", int),
        "map": MapStateDescriptor("map", str, int),
        "sumcount": AggregatingStateDescriptor("sumcount", SumCount(), list[int]),
        "sum": ReducingStateDescriptor("sum", operator.add, int),
    }


def cow_read(name: str, s: Any) -> Any:
    """What state ``name`` holds."""
    if name in ("int", "dict", "ints"):
        return s.value()
    if name == "map":
        return dict(s.items())
    return s.get()


def cow_write(states: dict[str, Any], i: int) -> None:
    """Initial values of key ``i``."""
    states["int"].update(i)
    states["dict"].update({"n": i})
    states["ints"].update([i])
    states["list"].add(i)
    states["map"].put("n", i)
    states["sumcount"].add(i)
    states["sum"].add(i)


def cow_mutate(states: dict[str, Any], i: int) -> None:
    """Change key ``i``'s state of every kind the way user code does (read, change, write back)."""
    d = states["dict"].value()
    d["n"] += 1000
    d["new"] = 1
    states["dict"].update(d)
    xs = states["ints"].value()
    xs.append(1000)
    states["ints"].update(xs)
    states["int"].update(i + 1000)
    states["list"].add(1000)
    states["map"].put("n", i + 1000)
    states["map"].put("new", 1)
    states["sumcount"].add(1000)
    states["sum"].add(1000)


def cow_expected(i: int, mutated: bool) -> dict[str, Any]:
    """What key ``i`` holds before and after :func:`cow_mutate`."""
    if not mutated:
        return {
            "int": i,
            "dict": {"n": i},
            "ints": [i],
            "list": [i],
            "map": {"n": i},
            "sumcount": (i, 1),
            "sum": i,
        }
    return {
        "int": i + 1000,
        "dict": {"n": i + 1000, "new": 1},
        "ints": [i, 1000],
        "list": [i, 1000],
        "map": {"n": i + 1000, "new": 1},
        "sumcount": (i + 1000, 2),
        "sum": i + 1000,
    }


class SnapshotSemantics:
    """Canonical (and native) snapshots: exact round trips, refused restores, isolation, rescaling.

    Long on purpose: a test suite class, one short test per rule, grouped by the
    ``# ---`` sections below. A plugin's test class inherits every test from the
    kit classes at once, so splitting this one would only scatter the rules of
    one subject over several files.
    """

    #: :meth:`test_checkpoint_bytes_follow_the_change`'s bound: this many bytes, plus ...
    CHANGE_CONSTANT: ClassVar[int] = 16 << 10
    #: ... this many per changed (key, namespace) entry of a state.
    CHANGE_PER_ENTRY: ClassVar[int] = 128

    # --- round trips ------------------------------------------------------------------------------

    @pytest.mark.parametrize("declare_first", [True, False], ids=["declared-before", "declared-after"])
    @pytest.mark.parametrize("ttl", [None, HOUR], ids=["plain", "ttl"])
    def test_round_trip_of_all_kinds(
        self, make_backend: Any, backend: Any, declare_first: bool, ttl: StateTtlConfig | None
    ) -> None:
        states = populate(backend, keys_of(120), ttl)
        expected = dump(backend, states)
        assert len(expected) == 5 * (120 + 60)
        handle = snapshot_handle(backend)
        assert handle.entries == backend.num_entries()
        target = make_backend()
        if declare_first:
            restored = declare(target, ttl)
            target.restore([handle])
        else:
            target.restore([handle])
            assert target.num_entries() == backend.num_entries()  # restored, not yet declared
            restored = declare(target, ttl)
        assert dump(target, restored) == expected
        for kind in KINDS:
            assert target.num_entries(kind) == backend.num_entries(kind)
        assert dump(backend, states) == expected  # the source is unchanged

    def test_native_round_trip(self, make_backend: Any, backend: Any) -> None:
        if not isinstance(backend, SupportsNativeSnapshot):
            pytest.skip("this backend has no native snapshot format (SupportsNativeSnapshot)")
        keyed: Any = backend
        states = populate(keyed, keys_of(60), HOUR)
        expected = dump(keyed, states)
        handle = snapshot_handle(keyed, native=True)
        assert handle.format == backend.native_format
        target = make_backend()
        assert isinstance(target, SupportsNativeSnapshot)
        target.restore_native([handle])
        assert dump(target, declare(target, HOUR)) == expected

    def test_native_references_only_completed_uploads(self, make_backend: Any, backend: Any) -> None:
        """The incremental contract: uploads of aborted or unconfirmed checkpoints are never referenced.

        Checkpoints complete, abort, or fail without the backend being told,
        some after writes and some without; the uploads of the failed ones are
        deleted at once (a storage may), so a snapshot referencing them breaks
        the property and its restore. Every completed one restores exactly.
        """
        if not isinstance(backend, SupportsNativeSnapshot):
            pytest.skip("this backend has no native snapshot format (SupportsNativeSnapshot)")
        keyed: Any = backend
        cps = NativeCheckpoints()
        states = populate(keyed, keys_of(80))
        expected = {}
        rounds = [
            ("complete", True),
            ("abort", True),
            ("complete", False),  # unchanged since the aborted one: its uploads must not be reused
            ("lost", True),
            ("complete", False),
            ("complete", False),
        ]
        for n, (outcome, change) in enumerate(rounds):
            if change:
                keyed.set_current_key(f"key-{n}")
                states["value"].update(10_000 + n)
                keyed.set_current_key(f"new-{n}")
                states["map"].put(f"n{n}", n)
            handle, _ = native_snapshot_handle(keyed, cps, outcome=outcome)
            assert handle.format == backend.native_format and handle.checkpoint_id == n + 1
            if outcome == "complete":
                expected[n + 1] = (handle, dump(keyed, states))
        for handle, state in expected.values():
            target = make_backend()
            assert isinstance(target, SupportsNativeSnapshot)
            target.restore_native([handle])
            assert dump(target, declare(target)) == state

    def test_checkpoint_bytes_follow_the_change(self, make_backend: Any, backend: Any) -> None:
        """A backend declaring ``checkpoint_bytes_follow_change`` checkpoints the change, not the state.

        Two backends hold 300 and 3000 keys; each takes a confirmed native
        checkpoint, then twice 12 keys change (a value updated, a list
        appended, a map entry put, a key cleared) and a checkpoint is taken.
        What each uploads is bounded by the change plus a constant:
        ``CHANGE_CONSTANT`` bytes plus ``CHANGE_PER_ENTRY`` per changed entry,
        on both, whatever the state's size (heap's deltas, the key-group
        deltas of ordered engines: Spark's HDFS store, Flink's FLIP-151). The
        last one, two changes after a full one, restores exactly.
        """
        if not getattr(backend, "checkpoint_bytes_follow_change", False):
            pytest.skip("this backend does not declare checkpoint_bytes_follow_change")
        rounds = [keys_of(12), [f"key-{i}" for i in range(40, 52)]]
        uploads: dict[int, list[int]] = {}
        for n in (300, 3000):
            keyed: Any = make_backend()
            cps = NativeCheckpoints()
            states = populate(keyed, keys_of(n))
            full, _ = native_snapshot_handle(keyed, cps)
            uploads[n] = []
            for r, changed in enumerate(rounds):
                for i, k in enumerate(changed):
                    keyed.set_current_key(k)
                    if i % 4 == 3:
                        for s in states.values():
                            s.clear()
                        continue
                    states["value"].update(-1 - i - 100 * r)
                    states["list"].add(i)
                    states["map"].put(f"changed-{r}-{i}", i)
                handle, _ = native_snapshot_handle(keyed, cps)
                uploads[n].append(handle.uploaded_size)
                entries = len(changed) * len(states) * 2  # every state, in up to two namespaces
                bound = self.CHANGE_CONSTANT + self.CHANGE_PER_ENTRY * entries
                assert handle.uploaded_size <= bound, (
                    f"{type(keyed).__name__} declares checkpoint_bytes_follow_change, but after "
                    f"{len(changed)} of {n} keys changed its checkpoint {handle.checkpoint_id} uploaded "
                    f"{handle.uploaded_size} bytes (the full one {full.uploaded_size}), over the bound "
                    f"{bound} (a constant {self.CHANGE_CONSTANT} plus {self.CHANGE_PER_ENTRY} per changed "
                    "entry)"
                )
            expected = dump(keyed, states)
            target: Any = make_backend()
            target.restore_native([handle])
            assert dump(target, declare(target)) == expected, (
                f"checkpoint {handle.checkpoint_id}, {len(rounds)} changes after a full one, does not "
                "restore what the backend held"
            )
            keyed.close()
        for r, (small, large) in enumerate(zip(uploads[300], uploads[3000])):
            assert large <= small + self.CHANGE_CONSTANT // 4, (
                f"change {r + 1}: the same change uploaded {small} bytes over 300 keys and {large} over "
                "3000: checkpoint bytes grow with the state, not with the change"
            )

    def test_a_base_encoded_in_the_background_restores_exactly(self, make_backend: Any, backend: Any) -> None:
        """A :class:`~statekit.backend_api.DeltaKeyedBackendBase` encodes a due base on a thread of its own.

        With ``max_deltas`` 1, the third checkpoint is due: it writes a delta,
        and a base of the state at that checkpoint is encoded from the
        backend's snapshot (:meth:`snapshot`, written on another thread) while
        records go on changing, removing and adding entries. The first
        checkpoint after it finished lists it first and uploads it; that
        checkpoint and the due one restore exactly what the backend held.
        """
        if not isinstance(backend, DeltaKeyedBackendBase) or not backend.delta_background:
            pytest.skip("bases are encoded in the background by DeltaKeyedBackendBase backends only")
        keyed: Any = make_backend()
        keyed.delta_max_deltas = 1
        keyed.delta_max_ratio = 1000.0
        cps = NativeCheckpoints()
        keys = keys_of(300)
        states = populate(keyed, keys)
        native_snapshot_handle(keyed, cps)
        for r in range(2):
            for i in range(12):
                keyed.set_current_key(keys[(37 * r + 5 * i) % len(keys)])
                states["value"].update(-1 - i - 100 * r)
                states["map"].put(f"changed-{r}-{i}", i)
            due, _ = native_snapshot_handle(keyed, cps)
        expected_due = dump(keyed, states)
        job = keyed._delta_base_job
        assert job is not None, (
            f"{type(keyed).__name__}: checkpoint {due.checkpoint_id} was due for a base (max_deltas 1), "
            "but none is being encoded in the background"
        )
        assert [link["kind"] for link in due.meta["chain"]][-1] == "delta"
        n = 0
        while not job.finished or n < 600:  # records go on while it is encoded, at least these
            keyed.set_current_key(keys[n % len(keys)] if n % 3 else f"new-{n}")
            if n % 7 == 0:
                for st in states.values():
                    st.clear()
            else:
                states["value"].update(n)
                states["list"].add(n)
            n += 1
        assert job.wait(120.0)
        assert job.error is None, f"encoding the base in the background raised {job.error!r}"
        adopting, _ = native_snapshot_handle(keyed, cps)
        first = adopting.meta["chain"][0]
        assert (first["kind"], first["checkpoint_id"]) == ("base", due.checkpoint_id), adopting.meta["chain"]
        assert first["file"] in {f.name for f in adopting.files if f.checkpoint_id == adopting.checkpoint_id}
        for handle, want in ((due, expected_due), (adopting, dump(keyed, states))):
            target = make_backend()
            target.restore_native([handle])
            assert dump(target, declare(target)) == want, (
                f"checkpoint {handle.checkpoint_id} does not restore what the backend held"
            )

    def test_native_restore_references_restored_files_only_when_claimed(
        self, make_backend: Any, backend: Any
    ) -> None:
        """The completion contract's claim: restored files are referenced only after it.

        After ``restore_native(handles)``, ``notify_checkpoint_complete(c)`` of the
        restored checkpoint ``c`` lets the instance reference the files of those
        handles it still holds; without it the first checkpoint after the restore
        uploads every file. Either way the next checkpoint restores exactly.
        """
        if not isinstance(backend, SupportsNativeSnapshot):
            pytest.skip("this backend has no native snapshot format (SupportsNativeSnapshot)")
        keyed: Any = backend
        cps = NativeCheckpoints()
        populate(keyed, keys_of(60))
        first, _uploads = native_snapshot_handle(keyed, cps)
        for claimed in (False, True):
            target: Any = make_backend()
            target.restore_native([first])
            if claimed:
                target.notify_checkpoint_complete(first.checkpoint_id)
            states = declare(target)
            target.set_current_key("after-restore")
            states["value"].update(7)
            expected = dump(target, states)
            handle, _ = native_snapshot_handle(target, cps)
            uploaded_by = {f.checkpoint_id for f in handle.files}
            if not claimed:
                assert uploaded_by == {handle.checkpoint_id}, (
                    f"the first checkpoint after an unclaimed restore references files of checkpoints "
                    f"{sorted(uploaded_by - {handle.checkpoint_id})}: it must upload every file (a "
                    "savepoint may live elsewhere; only notify_checkpoint_complete of the restored "
                    "checkpoint claims it)"
                )
            else:
                assert uploaded_by <= {first.checkpoint_id, handle.checkpoint_id}, uploaded_by
            again: Any = make_backend()
            again.restore_native([handle])
            assert dump(again, declare(again)) == expected

    def test_native_restore_refuses_another_format_before_any_change(
        self, make_backend: Any, backend: Any
    ) -> None:
        if not isinstance(backend, SupportsNativeSnapshot):
            pytest.skip("this backend has no native snapshot format (SupportsNativeSnapshot)")
        keyed: Any = backend
        populate(keyed, keys_of(20))
        handle = snapshot_handle(keyed, native=True)
        alien = dataclasses.replace(handle, format=handle.format + "-other")
        target = make_backend()
        with pytest.raises(CorruptSnapshotError, match="format"):
            target.restore_native([alien])
        assert target.num_entries() == 0
        wrong_maxp = dataclasses.replace(handle, max_parallelism=MAXP * 2)
        with pytest.raises(MaxParallelismMismatchError):
            target.restore_native([wrong_maxp])
        assert target.num_entries() == 0
        target.restore_native([handle])  # still restorable
        assert target.num_entries() == keyed.num_entries()

    def test_restored_state_stays_usable(self, make_backend: Any, backend: Any) -> None:
        populate(backend, keys_of(10))
        target = make_backend()
        target.restore([snapshot_handle(backend)])
        s = declare(target)
        target.set_current_key("key-1")
        s["list"].add(100)
        s["reducing"].add(100)
        s["map"].put("b", 2)
        assert s["list"].get() == [1, 2, 100]
        assert s["reducing"].get() == 102
        assert dict(s["map"].items()) == {"a": 1, "none": None, "b": 2}

    def test_undeclared_restored_state_survives_another_snapshot(
        self, make_backend: Any, backend: Any
    ) -> None:
        states = populate(backend, keys_of(50))
        expected = dump(backend, states)
        middle = make_backend()
        middle.restore([snapshot_handle(backend)])
        handle = snapshot_handle(middle)  # nothing declared: the states are only pending
        target = make_backend()
        target.restore([handle])
        assert dump(target, declare(target)) == expected

    @pytest.mark.parametrize("declared", [False, True], ids=["nothing-declared", "states-declared"])
    def test_empty_snapshot_restores_to_empty(self, make_backend: Any, backend: Any, declared: bool) -> None:
        if declared:
            declare(backend)
        handle = snapshot_handle(backend)
        assert handle.entries == 0
        assert dict(handle.offsets) == {}
        target = make_backend()
        restored = declare(target) if declared else {}
        target.restore([handle])
        assert target.num_entries() == 0
        assert dump(target, restored) == {}

    def test_cleared_states_are_not_written(self, make_backend: Any, backend: Any) -> None:
        states = populate(backend, keys_of(10))
        for k in keys_of(10):
            backend.set_current_key(k)
            for s in states.values():
                for ns in NAMESPACES:
                    s.set_current_namespace(ns)
                    s.clear()
                s.set_current_namespace(VOID_NAMESPACE)
        assert backend.num_entries() == 0
        handle = snapshot_handle(backend)
        assert handle.entries == 0
        target = make_backend()
        target.restore([handle])
        assert target.num_entries() == 0

    def test_restore_into_a_backend_holding_state_raises(self, make_backend: Any, backend: Any) -> None:
        populate(backend, keys_of(5))
        target = make_backend()
        populate(target, keys_of(1))
        with pytest.raises(StateAccessError):
            target.restore([snapshot_handle(backend)])

    # --- refused restores -------------------------------------------------------------------------

    CHANGED_TYPES: ClassVar[dict[str, Callable[[], StateDescriptor]]] = {
        "value": lambda: ValueStateDescriptor("value", str),
        "list": lambda: ListStateDescriptor("list", str),
        "reducing": lambda: ReducingStateDescriptor("reducing", operator.add, str),
        "aggregating": lambda: AggregatingStateDescriptor("aggregating", Mean(), tuple[int, str]),
        "map": lambda: MapStateDescriptor("map", str, str),
    }

    @pytest.mark.parametrize("kind", KINDS)
    def test_wrong_value_serializer_declared_before_restore(
        self, make_backend: Any, backend: Any, kind: str
    ) -> None:
        populate(backend, keys_of(30))
        handle = snapshot_handle(backend)
        target = make_backend()
        others = {
            n: target.get_state(d, namespace_serializer=INT_NS) for n, d in descriptors().items() if n != kind
        }
        target.get_state(self.CHANGED_TYPES[kind](), namespace_serializer=INT_NS)
        with pytest.raises(IncompatibleSerializerError) as e:
            target.restore([handle])
        assert isinstance(e.value, StateMigrationError)
        assert target.num_entries() == 0  # not even the other, compatible states
        assert dump(target, others) == {}

    @pytest.mark.parametrize("kind", KINDS)
    def test_wrong_value_serializer_declared_after_restore(
        self, make_backend: Any, backend: Any, kind: str
    ) -> None:
        populate(backend, keys_of(30))
        count = backend.num_entries(kind)
        target = make_backend()
        target.restore([snapshot_handle(backend)])
        with pytest.raises(IncompatibleSerializerError):
            target.get_state(self.CHANGED_TYPES[kind](), namespace_serializer=INT_NS)
        assert target.num_entries(kind) == count
        s = target.get_state(descriptors()[kind], namespace_serializer=INT_NS)
        target.set_current_key("key-3")
        assert read(kind, s) == expected_of(3)[(kind, VOID_NAMESPACE)]

    def test_wrong_key_serializer_raises(self, make_backend: Any, backend: Any) -> None:
        populate(backend, keys_of(30))
        handle = snapshot_handle(backend)
        for declare_first in (True, False):
            target = make_backend(key_serializer=IntSerializer())
            if declare_first:
                declare(target)
            with pytest.raises(IncompatibleSerializerError):
                target.restore([handle])
            assert target.num_entries() == 0

    def test_wrong_namespace_serializer_raises(self, make_backend: Any, backend: Any) -> None:
        populate(backend, keys_of(30))
        handle = snapshot_handle(backend)
        target = make_backend()
        target.get_state(descriptors()["list"], namespace_serializer=serializer_for(str))
        with pytest.raises(StateMigrationError):
            target.restore([handle])
        assert target.num_entries() == 0

    @pytest.mark.parametrize("maxp", [64, 256])
    def test_changed_max_parallelism_raises(self, make_backend: Any, backend: Any, maxp: int) -> None:
        populate(backend, keys_of(30))
        handle = snapshot_handle(backend)
        target = make_backend(max_parallelism=maxp, key_group_range=KeyGroupRange.of(0, maxp - 1))
        with pytest.raises(MaxParallelismMismatchError):
            target.restore([handle])
        assert target.num_entries() == 0

    # --- corruption -------------------------------------------------------------------------------

    def _corrupt_positions(
        self, make_backend: Any, handle: KeyedStateHandle, positions: Any, declare_first: bool
    ) -> list[Any]:
        """The flipped positions that are not refused with CorruptSnapshotError, or leave state behind."""
        bad = []
        for pos in positions:
            target = make_backend()
            if declare_first:
                declare(target)
            try:
                target.restore([flipped(handle, pos)])
            except CorruptSnapshotError:
                if target.num_entries():
                    bad.append((pos, "state left behind"))
            except Exception as e:  # noqa: BLE001 - reported
                bad.append((pos, f"{type(e).__name__}: {e}"))
            else:
                bad.append((pos, "no error"))
            target.close()
        return bad

    #: Bytes flipped per run of :meth:`test_every_flipped_byte_raises_corrupt_and_restores_nothing`
    #: (each restored into a new backend): the edges of the header and of every block, and an even
    #: stride through each. The nightly profile flips every byte (:meth:`test_every_byte_flipped_nightly`).
    flipped_bytes: ClassVar[int] = 160

    @staticmethod
    def _parts(handle: KeyedStateHandle) -> list[tuple[int, int]]:
        """``(offset, length)`` of the header and of every key group's block, in file order."""
        return [(0, handle.header_length), *sorted(handle.offsets.values())]

    @pytest.mark.parametrize("declare_first", [True, False], ids=["declared-before", "declared-after"])
    def test_every_flipped_byte_raises_corrupt_and_restores_nothing(
        self, make_backend: Any, backend: Any, declare_first: bool
    ) -> None:
        """A single byte inverted anywhere in the header or a block is refused, and nothing is restored.

        Every part of the file is hit: the first and last bytes of the header and
        of each block (lengths, magic, checksums) and an even stride through each,
        about :attr:`flipped_bytes` positions, the same on every run; each flip
        restores into a new backend, so this bounds how many the test creates. The
        nightly profile flips every byte.
        """
        populate(backend, keys_of(6))
        handle = snapshot_handle(backend)
        assert len(handle.offsets) >= 3
        positions = sampled_positions(self._parts(handle), self.flipped_bytes)
        assert self._corrupt_positions(make_backend, handle, positions, declare_first) == []

    @pytest.mark.nightly
    def test_every_byte_flipped_nightly(self, make_backend: Any, backend: Any) -> None:
        """Each single byte of the header and of every block, inverted in turn (nightly profile only)."""
        if settings.get_current_profile_name() != "nightly":
            pytest.skip("every byte flipped: --hypothesis-profile=nightly (ci flips a sample of them)")
        populate(backend, keys_of(6))
        handle = snapshot_handle(backend)
        positions = [p for off, ln in self._parts(handle) for p in range(off, off + ln)]
        for declare_first in (True, False):
            assert self._corrupt_positions(make_backend, handle, positions, declare_first) == []

    def test_truncated_snapshot_raises_corrupt(self, make_backend: Any, backend: Any) -> None:
        populate(backend, keys_of(6))
        handle = snapshot_handle(backend)
        data = handle.stream.read()
        last_off, last_len = max(handle.offsets.values())
        for cut in (0, 5, handle.header_length - 1, last_off + last_len // 2):
            target = make_backend()
            declare(target)
            with pytest.raises(CorruptSnapshotError):
                target.restore([dataclasses.replace(handle, stream=BytesStreamHandle(data[:cut]))])
            assert target.num_entries() == 0, cut

    def test_corrupt_second_handle_restores_nothing_of_the_first(self, make_backend: Any) -> None:
        halves = []
        for i in range(2):
            src = make_backend(key_group_range=key_group_range_for_operator(MAXP, 2, i))
            states = declare(src)
            for j, k in enumerate(keys_of(200)):
                if key_group(k) in src.key_group_range:
                    src.set_current_key(k)
                    write_key(states, j)
            halves.append(snapshot_handle(src))
        last_block = max(halves[1].offsets.values())
        target = make_backend()
        declare(target)
        with pytest.raises(CorruptSnapshotError):
            target.restore([halves[0], flipped(halves[1], last_block[0] + 10)])
        assert target.num_entries() == 0

    # --- isolation from later writes --------------------------------------------------------------

    def _cow_setup(self, backend: Any, n: int) -> tuple[list[str], dict[str, Any]]:
        keys = keys_of(n)
        states = {name: backend.get_state(d) for name, d in cow_descriptors().items()}
        for i, k in enumerate(keys):
            backend.set_current_key(k)
            cow_write(states, i)
        return keys, states

    def _cow_state(self, backend: Any, states: dict[str, Any], keys: list[str]) -> dict[str, dict[str, Any]]:
        out = {}
        for k in keys:
            backend.set_current_key(k)
            out[k] = {n: cow_read(n, s) for n, s in states.items()}
        return out

    def _restored_cow_state(
        self, make_backend: Any, handle: KeyedStateHandle, keys: list[str]
    ) -> dict[str, Any]:
        target = make_backend()
        states = {n: target.get_state(d) for n, d in cow_descriptors().items()}
        target.restore([handle])
        return self._cow_state(target, states, keys)

    def test_snapshot_is_unaffected_by_later_writes(self, make_backend: Any, backend: Any) -> None:
        keys, states = self._cow_setup(backend, 40)
        snap = backend.snapshot()
        for i, k in enumerate(keys):
            backend.set_current_key(k)
            cow_mutate(states, i)
        restored = self._restored_cow_state(make_backend, write_snapshot(snap, backend), keys)
        live = self._cow_state(backend, states, keys)
        for i, k in enumerate(keys):
            assert restored[k] == cow_expected(i, mutated=False), k
            assert live[k] == cow_expected(i, mutated=True), k

    @pytest.mark.parametrize("name", ["dict", "ints"])
    def test_snapshot_is_unaffected_by_changing_a_read_value_in_place(
        self, make_backend: Any, backend: Any, name: str
    ) -> None:
        """User code may change a value it read without writing it back; a pending snapshot keeps its own."""
        keys, states = self._cow_setup(backend, 40)
        snap = backend.snapshot()
        for k in keys:
            backend.set_current_key(k)
            v = states[name].value()
            if name == "dict":
                v["n"] = -1
            else:
                v.append(-1)
        restored = self._restored_cow_state(make_backend, write_snapshot(snap, backend), keys)
        assert [restored[k][name] for k in keys] == [cow_expected(i, False)[name] for i in range(len(keys))]

    def test_two_pending_snapshots_each_keep_their_point(self, make_backend: Any, backend: Any) -> None:
        keys, states = self._cow_setup(backend, 30)
        first = backend.snapshot()
        for i, k in enumerate(keys):
            backend.set_current_key(k)
            states["int"].update(i + 1000)
            states["list"].add(1000)
        second = backend.snapshot()
        for k in keys:
            backend.set_current_key(k)
            states["int"].update(-1)
            states["list"].add(-1)
        h2 = write_snapshot(second, backend)
        h1 = write_snapshot(first, backend)
        r1 = self._restored_cow_state(make_backend, h1, keys)
        r2 = self._restored_cow_state(make_backend, h2, keys)
        for i, k in enumerate(keys):
            assert (r1[k]["int"], r1[k]["list"]) == (i, [i])
            assert (r2[k]["int"], r2[k]["list"]) == (i + 1000, [i, 1000])

    def test_a_snapshot_pending_at_close_is_cancelled(self, make_backend: Any) -> None:
        """close() cancels pending snapshots, canonical and native: writing one raises SnapshotCancelledError.

        The error is a statekit error of its own, whatever the backend.
        """
        b = make_backend()
        states = declare(b)
        b.set_current_key("a")
        write_key(states, 1)
        done = b.snapshot()
        write_snapshot(done, b)  # written before close: nothing to cancel
        canonical = b.snapshot()
        native = b.native_snapshot(1) if isinstance(b, SupportsNativeSnapshot) else None
        b.close()
        assert b.closed
        with pytest.raises(SnapshotCancelledError, match="pending when its backend closed"):
            canonical.write(io.BytesIO())
        if native is not None:
            with pytest.raises(SnapshotCancelledError, match="pending when its backend closed"):
                native.write(KitNativeOutput(1))
            native.release()  # still allowed
        canonical.release()

    def test_writes_after_a_written_snapshot_still_protect_the_next(
        self, make_backend: Any, backend: Any
    ) -> None:
        keys, states = self._cow_setup(backend, 30)
        snapshot_handle(backend)
        for i, k in enumerate(keys):
            backend.set_current_key(k)
            states["int"].update(i + 1000)
        snap = backend.snapshot()
        for k in keys:
            backend.set_current_key(k)
            states["int"].update(-1)
            states["list"].add(-1)
        restored = self._restored_cow_state(make_backend, write_snapshot(snap, backend), keys)
        assert [restored[k]["int"] for k in keys] == [i + 1000 for i in range(len(keys))]
        assert [restored[k]["list"] for k in keys] == [[i] for i in range(len(keys))]

    def test_update_batch_does_not_touch_a_pending_snapshot(self, make_backend: Any, backend: Any) -> None:
        keys, states = self._cow_setup(backend, 40)
        batch = {name: batch_update_or_skip(states[name]) for name in ("int", "ints", "dict")}
        snap = backend.snapshot()
        batch["int"].update_batch(keys, lambda v: v + 1000)
        batch["ints"].update_batch(keys, lambda v: [*v, 1000])
        batch["dict"].update_batch(keys, lambda v: (v.update(n=-1), v)[1])  # changed in place
        restored = self._restored_cow_state(make_backend, write_snapshot(snap, backend), keys)
        live = self._cow_state(backend, states, keys)
        for i, k in enumerate(keys):
            assert (restored[k]["int"], restored[k]["ints"], restored[k]["dict"]) == (i, [i], {"n": i}), k
            assert (live[k]["int"], live[k]["ints"], live[k]["dict"]) == (i + 1000, [i, 1000], {"n": -1}), k

    def _write_in_thread(
        self,
        snap: Any,
        backend: Any,
        progress: Callable[[int, int], None] | None = None,
        on_error: Callable[[], None] | None = None,
    ) -> tuple[threading.Thread, dict[str, Any]]:
        """Starts writing ``snap`` on a thread of its own; :meth:`_join` returns the handle."""
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                buf = io.BytesIO()
                w = snap.write(buf, progress=progress)
                result["handle"] = KeyedStateHandle(
                    BytesStreamHandle(buf.getvalue()), backend.key_group_range, w.offsets, w.header_length
                )
            except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
                result["error"] = e
                if on_error is not None:
                    on_error()

        t = threading.Thread(target=run)
        t.start()
        return t, result

    def _join(self, t: threading.Thread, result: dict[str, Any]) -> KeyedStateHandle:
        t.join(timeout=60)
        assert not t.is_alive(), "the writer thread hung"
        if "error" in result:
            raise result["error"]
        handle: KeyedStateHandle = result["handle"]
        return handle

    def test_snapshot_written_by_another_thread_while_processing_goes_on(
        self, make_backend: Any, backend: Any
    ) -> None:
        """The writer thread and the task thread run freely, as in a job."""
        keys, states = self._cow_setup(backend, 2000)
        snap = backend.snapshot()
        t, result = self._write_in_thread(snap, backend)
        for i, k in enumerate(keys):
            backend.set_current_key(k)
            cow_mutate(states, i)
        restored = self._restored_cow_state(make_backend, self._join(t, result), keys)
        live = self._cow_state(backend, states, keys)
        for i, k in enumerate(keys):
            assert restored[k] == cow_expected(i, mutated=False), k
            assert live[k] == cow_expected(i, mutated=True), k

    def test_snapshot_written_by_another_thread_in_lock_step(self, make_backend: Any, backend: Any) -> None:
        """After each key group the writer thread writes, the task thread changes a slice of the keys."""
        keys, states = self._cow_setup(backend, 300)
        snap = backend.snapshot()
        turn: queue.Queue[int] = queue.Queue()
        ack: queue.Queue[None] = queue.Queue()

        def progress(done: int, total: int) -> None:
            turn.put(done)
            ack.get(timeout=60)

        t, result = self._write_in_thread(snap, backend, progress, on_error=lambda: turn.put(-1))
        total = len(backend.key_group_range)
        mutated: set[int] = set()
        for _ in range(total):
            done = turn.get(timeout=60)
            if done < 0:
                break
            for i in range(done - 1, len(keys), total):  # written and unwritten key groups alike
                backend.set_current_key(keys[i])
                cow_mutate(states, i)
                mutated.add(i)
            ack.put(None)
        handle = self._join(t, result)
        restored = self._restored_cow_state(make_backend, handle, keys)
        live = self._cow_state(backend, states, keys)
        for i, k in enumerate(keys):
            assert restored[k] == cow_expected(i, mutated=False), k
            assert live[k] == cow_expected(i, mutated=i in mutated), k

    # --- rescaling --------------------------------------------------------------------------------

    @pytest.mark.parametrize(("p", "p2"), [(1, 4), (1, 77), (4, 2), (3, 128), (77, 15)])
    def test_rescale_moves_every_key_to_its_new_owner_only(self, make_backend: Any, p: int, p2: int) -> None:
        keys = keys_of(600)
        index = {k: i for i, k in enumerate(keys)}
        subtasks = [make_backend(key_group_range=key_group_range_for_operator(MAXP, p, i)) for i in range(p)]
        states = [declare(b) for b in subtasks]
        for i, k in enumerate(keys):
            j = operator_index_for_key_group(MAXP, p, key_group(k))
            subtasks[j].set_current_key(k)
            write_key(states[j], i)
        handles = [snapshot_handle(b) for b in subtasks]
        seen: dict[str, int] = {}
        for j in range(p2):
            target = make_backend(key_group_range=key_group_range_for_operator(MAXP, p2, j))
            target.restore(handles)
            got = dump(target, declare(target))
            owned = {k for k in keys if operator_index_for_key_group(MAXP, p2, key_group(k)) == j}
            assert {k for (_, _, k) in got} == owned
            for k in owned:
                assert {(kind, ns): v for (kind, ns, kk), v in got.items() if kk == k} == expected_of(
                    index[k]
                ), k
            assert target.num_entries() == len(got)
            for k in owned:
                assert k not in seen, f"{k} restored at subtasks {seen[k]} and {j}"
                seen[k] = j
            target.close()
        assert len(seen) == len(keys)

    @pytest.mark.parametrize("i", [0, 1, 2])
    def test_restoring_some_key_groups_reads_no_other_block(self, make_backend: Any, i: int) -> None:
        src = make_backend()
        states = declare(src)
        for j, k in enumerate(keys_of(1000)):
            src.set_current_key(k)
            write_key(states, j)
        full = snapshot_handle(src)
        assert len(full.offsets) == MAXP
        rec = RecordingStream(full.stream)
        owned = key_group_range_for_operator(MAXP, 3, i)
        target = make_backend(key_group_range=owned)
        declare(target)
        target.restore([dataclasses.replace(full, stream=rec)])
        assert target.num_entries() > 0
        for kg, (off, ln) in full.offsets.items():
            if kg in owned:
                continue
            touched = [(o, n) for o, n in rec.reads if o < off + ln and off < o + n]
            assert not touched, (
                f"read {touched}, which overlaps the block of key group {kg} ({owned} is owned)"
            )

    def test_rescale_does_not_read_snapshots_it_does_not_need(self, make_backend: Any) -> None:
        """Scaling 4 -> 8, subtask 3 owns part of old subtask 1's range and reads no other snapshot."""
        keys = keys_of(600)
        old = [make_backend(key_group_range=key_group_range_for_operator(MAXP, 4, i)) for i in range(4)]
        states = [declare(b) for b in old]
        for i, k in enumerate(keys):
            j = operator_index_for_key_group(MAXP, 4, key_group(k))
            old[j].set_current_key(k)
            write_key(states[j], i)
        recorded = [(h, RecordingStream(h.stream)) for h in (snapshot_handle(b) for b in old)]
        owned = key_group_range_for_operator(MAXP, 8, 3)
        target = make_backend(key_group_range=owned)
        target.restore([dataclasses.replace(h, stream=rec) for h, rec in recorded])
        for j, (_, rec) in enumerate(recorded):
            if j != 1:
                assert rec.reads == [], f"read old subtask {j}'s snapshot, which holds none of {owned}"
        got = dump(target, declare(target))
        assert {k for (_, _, k) in got} == {k for k in keys if key_group(k) in owned}
