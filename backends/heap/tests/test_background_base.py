"""Bases encoded in the background: a due base costs its checkpoint no more than a delta.

When a base is due, the checkpoint writes a delta, and a base of the state at
that checkpoint is encoded on a thread of its own from a pinned snapshot; the
first checkpoint after it finished uploads it and lists it first, followed by
the deltas of later checkpoints. Each case checks the chain's shape and that
every checkpoint restores exactly the model.

The encoding is held at its first key group by the ``gate`` fixture where a
case needs it running while records are written; a case never waits on time,
only on events (with a generous bound).
"""

from __future__ import annotations

import logging
import random
import threading
from typing import Any

import pytest

from statekit import ValueStateDescriptor
from statekit.backend_api import KeyGroupRange
from statekit.checkpointing import key_group_range_for_operator
from statekit.snapshot_codec import NativeStateHandle
from statekit.state import _materialize
from statekit.state._keyed_snapshots import KeyedSnapshot
from statekit.testing import KitNativeOutput
from statekit_heap import HeapKeyedStateBackend

VALUE = ValueStateDescriptor("v", int)
MAXP = 128
#: How long a case waits for an event that must come (a busy machine is slow, never this slow).
BOUND = 120.0

Model = dict[str, int]


class Gate:
    """Holds every background encoding after its first key group until opened."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.reached = threading.Event()

    def __call__(self, job: _materialize.Materialization, done: int, total: int) -> None:
        self.reached.set()
        assert self.open.wait(BOUND), "the gate was never opened"
        _ORIGINAL_PROGRESS(job, done, total)


_ORIGINAL_PROGRESS = _materialize.Materialization._progress


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Any:
    g = Gate()

    def progress(job: _materialize.Materialization, done: int, total: int) -> None:
        g(job, done, total)

    monkeypatch.setattr(_materialize.Materialization, "_progress", progress)
    yield g
    g.open.set()  # never leave a thread waiting


def backend(
    make_backend: Any, max_deltas: int = 2, kgr: KeyGroupRange | None = None
) -> HeapKeyedStateBackend:
    b = make_backend(key_group_range=kgr or KeyGroupRange.of(0, MAXP - 1))
    b.delta_max_deltas = max_deltas
    b.delta_max_ratio = 1000.0  # bases by count of deltas only
    return b


def write(b: HeapKeyedStateBackend, model: Model, rng: random.Random, n: int, keys: int = 300) -> None:
    """``n`` random updates and removals of owned keys, mirrored in ``model``."""
    v = b.get_state(VALUE)
    own = b.key_group_range
    for _ in range(n):
        key = f"k{rng.randrange(keys)}"
        try:
            b.set_current_key(key)
        except Exception:  # noqa: BLE001 - another subtask's key
            continue
        assert b.current_key_group in own
        if rng.random() < 0.2:
            v.clear()
            model.pop(key, None)
        else:
            model[key] = rng.randrange(1000)
            v.update(model[key])


def checkpoint(b: HeapKeyedStateBackend, cid: int, *, complete: bool = True) -> NativeStateHandle:
    h = b.native_snapshot(cid).write(KitNativeOutput(cid))
    if complete:
        b.notify_checkpoint_complete(cid)
    else:
        b.notify_checkpoint_aborted(cid)
    return h


def start(b: HeapKeyedStateBackend, model: Model, rng: random.Random, n: int = 300) -> NativeStateHandle:
    """``n`` writes, then checkpoint 1 (a base), confirmed."""
    write(b, model, rng, n)
    return checkpoint(b, 1)


def deltas(
    b: HeapKeyedStateBackend, model: Model, rng: random.Random, cids: tuple[int, ...]
) -> NativeStateHandle:
    """Per checkpoint of ``cids``, 20 writes and the checkpoint, confirmed; the last one's handle."""
    for cid in cids:
        write(b, model, rng, 20)
        h = checkpoint(b, cid)
    return h


def read_back(make_backend: Any, handles: list[NativeStateHandle], keys: int = 300) -> Model:
    r = make_backend(key_group_range=KeyGroupRange.of(0, MAXP - 1))
    r.restore_native(handles)
    v = r.get_state(VALUE)
    out = {}
    for i in range(keys):
        r.set_current_key(f"k{i}")
        if v.value() is not None:
            out[f"k{i}"] = v.value()
    return out


def chain(h: NativeStateHandle) -> list[tuple[str, int]]:
    return [(link["kind"], link["checkpoint_id"]) for link in h.meta["chain"]]


def uploaded(h: NativeStateHandle) -> list[str]:
    return sorted(f.name for f in h.files if f.checkpoint_id == h.checkpoint_id)


def job_done(b: HeapKeyedStateBackend) -> None:
    job = b._delta_base_job
    assert job is not None, "no base is being encoded"
    assert job.wait(BOUND)


def test_a_due_base_is_encoded_aside_while_records_go_on_and_the_next_checkpoint_adopts_it(
    make_backend, gate
):
    rng = random.Random(1)
    b = backend(make_backend)
    model: Model = {}
    write(b, model, rng, 400)
    assert chain(checkpoint(b, 1)) == [("base", 1)]
    write(b, model, rng, 30)
    checkpoint(b, 2)
    write(b, model, rng, 30)
    checkpoint(b, 3)
    write(b, model, rng, 30)
    at_4 = dict(model)
    h4 = checkpoint(b, 4)  # two deltas: a base is due, and is encoded aside; this is a delta
    assert chain(h4) == [("base", 1), ("delta", 2), ("delta", 3), ("delta", 4)]
    assert uploaded(h4) == ["delta-4"]
    assert gate.reached.wait(BOUND)
    # Records go on while the base of checkpoint 4 is encoded: overwrites, removals, new keys.
    write(b, model, rng, 200)
    h5 = checkpoint(b, 5)  # not finished: a delta on the old chain
    assert chain(h5)[-1] == ("delta", 5) and chain(h5)[0] == ("base", 1)
    gate.open.set()
    job_done(b)
    write(b, model, rng, 30)
    h6 = checkpoint(b, 6)
    assert chain(h6) == [("base", 4), ("delta", 5), ("delta", 6)]
    assert uploaded(h6) == ["base-4", "delta-6"]
    assert b._delta_base_job is None, "confirmed: its bytes are let go"
    assert read_back(make_backend, [h4]) == at_4
    assert read_back(make_backend, [h6]) == model
    write(b, model, rng, 30)
    h7 = checkpoint(b, 7)
    assert chain(h7) == [("base", 4), ("delta", 5), ("delta", 6), ("delta", 7)]
    assert uploaded(h7) == ["delta-7"]
    assert read_back(make_backend, [h7]) == model


def test_a_base_adopted_by_an_aborted_checkpoint_is_uploaded_by_the_next(make_backend):
    rng = random.Random(2)
    b = backend(make_backend, max_deltas=1)
    model: Model = {}
    start(b, model, rng)
    assert chain(deltas(b, model, rng, (2, 3))) == [("base", 1), ("delta", 2), ("delta", 3)]  # due at 3
    job_done(b)
    write(b, model, rng, 20)
    h4 = checkpoint(b, 4, complete=False)
    assert chain(h4) == [("base", 3), ("delta", 4)] and uploaded(h4) == ["base-3", "delta-4"]
    write(b, model, rng, 20)
    h5 = checkpoint(b, 5)  # 4 never completed: its upload is never referenced, 5 uploads its own
    assert chain(h5) == [("base", 3), ("delta", 5)] and uploaded(h5) == ["base-3", "delta-5"]
    assert read_back(make_backend, [h5]) == model


def test_a_chain_at_twice_the_bound_waits_for_the_base(make_backend, gate):
    rng = random.Random(3)
    b = backend(make_backend, max_deltas=2)
    model: Model = {}
    start(b, model, rng)
    h5 = deltas(b, model, rng, (2, 3, 4, 5))  # the base is due at 4 and held; 5 is still a delta
    assert chain(h5) == [("base", 1), ("delta", 2), ("delta", 3), ("delta", 4), ("delta", 5)]
    write(b, model, rng, 20)
    got: list[NativeStateHandle] = []
    t = threading.Thread(target=lambda: got.append(checkpoint(b, 6)))
    t.start()
    assert gate.reached.wait(BOUND)
    t.join(0.5)
    assert t.is_alive(), "four deltas, twice max-deltas: checkpoint 6 waits for the base of 4"
    gate.open.set()
    t.join(BOUND)
    assert not t.is_alive()
    (h6,) = got
    assert chain(h6) == [("base", 4), ("delta", 5), ("delta", 6)]
    assert read_back(make_backend, [h6]) == model


def test_a_failed_background_base_makes_the_next_checkpoint_write_one_itself(
    make_backend, monkeypatch, caplog
):
    rng = random.Random(4)
    b = backend(make_backend, max_deltas=1)
    model: Model = {}
    start(b, model, rng)
    real = KeyedSnapshot.write
    failures = []

    def fail_once(self: KeyedSnapshot, out: Any, **kw: Any) -> Any:
        if not failures:
            failures.append(1)
            raise MemoryError("no room for the base")
        return real(self, out, **kw)

    monkeypatch.setattr(KeyedSnapshot, "write", fail_once)
    deltas(b, model, rng, (2, 3))  # the base is due at 3
    job_done(b)
    write(b, model, rng, 20)
    with caplog.at_level(logging.WARNING, logger="statekit.state"):
        h4 = checkpoint(b, 4)
    assert chain(h4) == [("base", 4)]
    (record,) = [r for r in caplog.records if "background" in r.getMessage()]
    msg = record.getMessage()
    assert "checkpoint 3" in msg and "MemoryError: no room for the base" in msg and "checkpoint 4" in msg
    assert read_back(make_backend, [h4]) == model


def test_a_schema_change_and_a_close_give_the_base_up(make_backend, gate):
    rng = random.Random(5)
    b = backend(make_backend, max_deltas=1)
    model: Model = {}
    start(b, model, rng)
    deltas(b, model, rng, (2, 3))  # the base is due at 3
    assert gate.reached.wait(BOUND)
    job = b._delta_base_job
    assert job is not None
    b._delta_forget_chain()  # what a restored state declared with another schema does
    assert b._delta_base_job is None
    gate.open.set()
    assert job.wait(BOUND) and job.data is None and job.error is None
    assert not any(t.pins[kg] for t in b._tables.values() for kg in t.kgr), "its pins are released"
    h4 = checkpoint(b, 4)
    assert chain(h4) == [("base", 4)]
    deltas(b, model, rng, (5, 6))  # due again at 6
    job = b._delta_base_job
    assert job is not None
    b.close()
    assert job.wait(BOUND) and job.data is None


def test_a_claimed_rescale_encodes_a_base_of_its_own_from_its_second_checkpoint(make_backend):
    """After 2 → 1, the chain lists both old subtasks' files; the first checkpoint (the restart's) is a
    delta and nothing more, the second starts a base of its own, which the third adopts: restores then
    read one base instead of both old chains."""
    rng = random.Random(6)
    model: Model = {}
    two = [backend(make_backend, 10, key_group_range_for_operator(MAXP, 2, i)) for i in range(2)]
    for b in two:
        write(b, model, rng, 300)
    handles = [checkpoint(b, 1) for b in two]
    one = backend(make_backend, 10)
    one.restore_native(handles)
    one.notify_checkpoint_complete(1)
    h2 = deltas(one, model, rng, (2,))
    assert [k for k, _ in chain(h2)] == ["base", "base", "delta"]
    assert one._delta_base_job is None, "the restart's checkpoint starts nothing"
    h3 = deltas(one, model, rng, (3,))
    assert [k for k, _ in chain(h3)] == ["base", "base", "delta", "delta"]
    job_done(one)
    h4 = deltas(one, model, rng, (4,))
    assert chain(h4) == [("base", 3), ("delta", 4)]
    assert not any("key_groups" in link for link in h4.meta["chain"])
    assert read_back(make_backend, [h4]) == model


def test_off_the_due_checkpoint_writes_the_base(make_backend):
    rng = random.Random(7)
    b = backend(make_backend, max_deltas=1)
    b.delta_background = False
    model: Model = {}
    start(b, model, rng)
    h3 = deltas(b, model, rng, (2, 3))
    assert chain(h3) == [("base", 3)] and b._delta_base_job is None
    assert read_back(make_backend, [h3]) == model


def test_the_option_reaches_the_backend():
    from statekit.plugins._registry import default_registry

    on = default_registry().create_backend("heap", {})
    off = default_registry().create_backend("heap", {"base-in-background": False})
    kw = {"key_group_range": KeyGroupRange.of(0, MAXP - 1), "max_parallelism": MAXP}
    from statekit.backend_api import KeyedBackendParameters
    from statekit.serializers import StrSerializer

    params = KeyedBackendParameters(key_serializer=StrSerializer(), **kw)
    a, b = on.create_keyed_backend(params), off.create_keyed_backend(params)
    try:
        assert a.delta_background is True and b.delta_background is False
    finally:
        a.close()
        b.close()


def test_while_a_task_runs_the_encoding_waits_unless_a_checkpoint_waits_for_it(make_backend, monkeypatch):
    """The Spark runner marks its tasks (``tasks_running``): an encoding advances between them only,
    so the records keep the interpreter; a checkpoint that waits for it lets it run all the same."""
    encoded: list[int] = []
    blocks = KeyedSnapshot._blocks

    def counted(self: KeyedSnapshot, kg: int) -> Any:
        encoded.append(kg)
        return blocks(self, kg)

    monkeypatch.setattr(KeyedSnapshot, "_blocks", counted)
    rng = random.Random(8)
    b = backend(make_backend, max_deltas=1)
    model: Model = {}
    start(b, model, rng, 600)
    deltas(b, model, rng, (2,))
    write(b, model, rng, 20)
    encoded.clear()
    with _materialize.tasks_running():
        checkpoint(b, 3)  # due: started, and held before its first key group while the task runs
        job = b._delta_base_job
        assert job is not None
        assert not job._done.wait(0.3), "it advanced while a task ran"
        assert not encoded, "it encoded a key group while a task ran"
    assert job._done.wait(BOUND), "the task ended: it runs"
    write(b, model, rng, 20)
    h4 = checkpoint(b, 4)
    assert chain(h4) == [("base", 3), ("delta", 4)]
    write(b, model, rng, 20)
    with _materialize.tasks_running():
        checkpoint(b, 5)  # due again; held
        write(b, model, rng, 20)
        h6 = checkpoint(b, 6)  # twice the bound: it waits for the base, which runs inside the task
    assert chain(h6) == [("base", 5), ("delta", 6)]
    assert read_back(make_backend, [h6]) == model


def test_instances_restored_at_every_checkpoint_never_let_the_chain_pass_twice_the_bound(make_backend):
    """A base started by an instance dies with it; if every checkpoint is taken by a newly restored
    (claimed) instance, none is ever adopted: at twice the bound the checkpoint writes the base itself."""
    rng = random.Random(9)
    model: Model = {}
    b = backend(make_backend, max_deltas=2)
    h = start(b, model, rng)
    longest = 0
    for cid in range(2, 14):
        nxt = backend(make_backend, max_deltas=2)
        nxt.restore_native([h])
        nxt.notify_checkpoint_complete(h.checkpoint_id)  # the runner's claim
        h = deltas(nxt, model, rng, (cid,))
        nxt.close()
        kinds = [k for k, _ in chain(h)]
        assert kinds.count("base") == 1
        longest = max(longest, kinds.count("delta"))
        assert kinds.count("delta") <= 4, chain(h)
        assert read_back(make_backend, [h]) == model
    assert longest == 4, "the chain reached twice max-deltas before the base"
