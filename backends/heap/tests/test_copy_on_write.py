"""Copy-on-write of the heap backend under a pending snapshot, beyond the conformance kit.

Isolation of snapshots from later writes, also from another thread, is the kit's
(``statekit.testing``), run against every installed backend by
``tests/test_conformance.py``. This case reaches into the heap backend's own
pin counting: a release of one snapshot racing a write must not unprotect the next.
"""

from __future__ import annotations

import linecache
import queue
import sys
import threading

from statekit import ValueStateDescriptor


def test_release_racing_a_write_does_not_unprotect_the_next_snapshot(make_backend, backend):
    """The writer thread releases snapshot A while the main thread writes the same key group.

    The writer is paused (by a trace hook, no sleeping) on the line of
    ``_release_snapshot`` that decrements a key group's pin count, after its check
    passed; the main thread's write then unshares that key group. A later
    snapshot B must still be protected from writes made while it is pending.
    """
    s = backend.get_state(ValueStateDescriptor("v", int))
    backend.set_current_key("key-0")
    s.update(0)
    kg = backend.current_key_group
    snap_a = backend.snapshot()
    events: queue.Queue[str] = queue.Queue()
    resume = threading.Event()

    def local_trace(frame, event, arg):
        if (
            event == "line"
            and not resume.is_set()
            and frame.f_locals.get("kg") == kg
            and "-= 1" in linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        ):
            events.put("paused")
            resume.wait(timeout=30)
        return local_trace

    def trace(frame, event, arg):
        return local_trace if frame.f_code.co_name == "_release_snapshot" else None

    def run():
        sys.settrace(trace)
        try:
            snap_a.to_handle()
        finally:
            sys.settrace(None)
            events.put("done")

    t = threading.Thread(target=run)
    t.start()
    first = events.get(timeout=30)
    s.update(1)  # while A's release is paused (or after it finished, if it never pauses)
    resume.set()
    t.join(timeout=30)
    assert not t.is_alive()
    assert first in ("paused", "done")

    snap_b = backend.snapshot()
    s.update(2)
    restored = make_backend()
    rs = restored.get_state(ValueStateDescriptor("v", int))
    restored.restore([snap_b.to_handle()])
    restored.set_current_key("key-0")
    assert rs.value() == 1
    assert s.value() == 2
