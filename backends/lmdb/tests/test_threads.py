"""LMDB's single-writer rule: subtasks of one process, and snapshot threads reading while the task writes."""

from __future__ import annotations

import io
import queue
import threading
import time
from pathlib import Path
from typing import Any

from statekit import ValueStateDescriptor
from statekit.backend_api import KeyGroupRange, key_group_for_bytes
from statekit.serializers import StrSerializer
from statekit.snapshot_codec import BytesStreamHandle, KeyedStateHandle
from statekit.testing import KitNativeOutput, decode_canonical, snapshot_handle

VALUE = ValueStateDescriptor("v", str)
SMALL = {"initial-map-size": 256 << 10}


def content(handle: Any) -> dict[str, Any]:
    return {e.key: e.stored for e in decode_canonical(handle)}


def write(b: Any, keys: range, tag: str) -> None:
    s = b.get_state(VALUE)
    for i in keys:
        b.set_current_key(f"key-{i}")
        s.update(f"{tag}{i}".ljust(120, "."))


def expect(keys: range, tag: str) -> dict[str, str]:
    return {f"key-{i}": f"{tag}{i}".ljust(120, ".") for i in keys}


def test_two_subtasks_of_one_process_write_and_snapshot_at_once(make_backend: Any, tmp_path: Path) -> None:
    """An environment per subtask: each has its own writer lock, so neither waits for the other."""
    local = tmp_path / "shared-local-dir"  # both subtasks are given the same parent directory
    a = make_backend(KeyGroupRange.of(0, 63), options=SMALL, local_dir=local)
    b = make_backend(KeyGroupRange.of(64, 127), options=SMALL, local_dir=local)
    assert a.instance_dir != b.instance_dir
    owned = {id(x): [i for i in range(6000) if _kg(f"key-{i}") in x.key_group_range] for x in (a, b)}
    results: dict[int, Any] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def task(x: Any) -> None:
        try:
            keys = owned[id(x)]
            start.wait()
            for n in range(3):
                s = x.get_state(VALUE)
                for i in keys:
                    x.set_current_key(f"key-{i}")
                    s.update(f"r{n}-{i}".ljust(120, "."))
                snap = x.snapshot()
                x.set_current_key(f"key-{keys[0]}")
                s.update("after")  # not in the snapshot
                results[id(x), n] = content(snap.to_handle())
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=task, args=(x,)) for x in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for x in (a, b):
        keys = owned[id(x)]
        for n in range(3):
            assert results[id(x), n] == {f"key-{i}": f"r{n}-{i}".ljust(120, ".") for i in keys}
        assert x.map_growths >= 1  # both grew their own maps meanwhile


def _kg(key: str) -> int:
    return key_group_for_bytes(StrSerializer().serialize(key), 128)


def test_a_snapshot_thread_reads_while_the_task_writes_and_grows_the_map(make_backend: Any) -> None:
    """Lock step: after each key group the snapshot thread writes, the task writes enough to grow the map."""
    b = make_backend(options=SMALL)
    write(b, range(300), "old-")
    snap = b.snapshot()
    turn: queue.Queue[int] = queue.Queue()
    ack: queue.Queue[None] = queue.Queue()
    result: dict[str, Any] = {}

    def progress(done: int, total: int) -> None:
        turn.put(done)
        ack.get(timeout=60)

    def writer() -> None:
        try:
            buf = io.BytesIO()
            w = snap.write(buf, progress=progress)
            result["handle"] = KeyedStateHandle(
                BytesStreamHandle(buf.getvalue()), b.key_group_range, w.offsets, w.header_length
            )
        except BaseException as e:
            result["error"] = e
            turn.put(-1)

    t = threading.Thread(target=writer)
    t.start()
    n = 0
    for _ in range(128):
        if turn.get(timeout=60) < 0:
            break
        write(b, range(300 + 40 * n, 300 + 40 * (n + 1)), "new-")  # new keys: the map keeps growing
        write(b, range(0, 300, 7), f"changed{n}-")  # and keys the snapshot holds change
        b.kv_write_buffered()
        n += 1
        ack.put(None)
    t.join(timeout=60)
    assert "error" not in result, result.get("error")
    assert b.map_growths >= 2 and b.frozen_views == 1  # frozen once, at the first growth
    assert content(result["handle"]) == expect(range(300), "old-")


def test_a_native_snapshot_is_copied_on_another_thread_while_the_task_writes(make_backend: Any) -> None:
    b = make_backend(options=SMALL)
    write(b, range(2000), "old-")
    snap = b.native_snapshot(1)
    out = KitNativeOutput(1)
    done: dict[str, Any] = {}

    def upload() -> None:
        try:
            done["handle"] = snap.write(out)
        except BaseException as e:
            done["error"] = e

    t = threading.Thread(target=upload)
    t.start()
    for n in range(5):  # the task goes on meanwhile, growing the map
        write(b, range(0, 4000), f"w{n}-")
    t.join(timeout=60)
    assert "error" not in done, done.get("error")
    assert b.map_growths >= 1
    target = make_backend()
    target.restore_native([done["handle"]])
    assert content(snapshot_handle(target)) == expect(range(2000), "old-")
    assert content(snapshot_handle(b)) == expect(range(4000), "w4-")


def test_another_writer_on_the_environment_makes_the_backend_wait(make_backend: Any) -> None:
    """LMDB has one writer per environment: a commit waits for a write transaction of another thread.

    The backend never keeps one open between calls, so nothing of its own blocks another thread.
    """
    b = make_backend(options={"write-batch-size": 1})
    s = b.get_state(VALUE)
    col = b.kv_column("v")
    held = threading.Event()
    release = threading.Event()

    def foreign() -> None:
        with b.env.begin(write=True, db=col.engine.db) as txn:
            held.set()
            release.wait(timeout=30)
            txn.put(b"foreign", b"x")

    t = threading.Thread(target=foreign)
    t.start()
    assert held.wait(timeout=30)
    threading.Timer(0.3, release.set).start()
    t0 = time.monotonic()
    b.set_current_key("a")
    s.update("mine")  # commits at once (batch size 1): waits for the foreign transaction
    waited = time.monotonic() - t0
    t.join(timeout=30)
    assert waited >= 0.25
    with b.env.begin(db=col.engine.db) as txn:
        assert txn.get(b"foreign") == b"x"
    assert s.value() == "mine"
