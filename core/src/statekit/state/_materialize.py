"""A base of a delta chain encoded on a thread of its own, while checkpoints go on writing deltas.

Flink's changelog state backend (FLIP-158) materializes state in the
background and Spark's HDFS-backed store snapshots its deltas in a
maintenance thread: neither makes the checkpoint that is due for a full copy
pay for it. :class:`Materialization` does the same for
:class:`~statekit.state._delta.DeltaKeyedBackendBase`: it takes a pinned
snapshot (copy-on-write per key group, :meth:`KeyedSnapshots.snapshot`) at a
checkpoint's sync point and encodes it into bytes on a daemon thread. The
first checkpoint taken after it finished uploads those bytes as the chain's
new base. Imports only :mod:`statekit.state` and the snapshot format.

In CPython the encoding shares the interpreter with the task thread (the
GIL): what it saves is the wait, not the work. A runner whose tasks come and
go (the Spark runner) marks them with :func:`tasks_running`, and encodings
then advance only while no task runs in the process (between micro-batches,
while the JVM reads and shuffles), unless a checkpoint waits for one; under
the embedded runner, which processes without pause, they interleave with the
records.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..snapshots._snapshot import SnapshotWriteResult
from ._keyed_snapshots import KeyedSnapshot

__all__ = ["Materialization", "tasks_running"]

#: Guards :data:`_tasks`; encodings wait on it while tasks run.
_cond = threading.Condition()
#: Tasks of a runner that marks them (:func:`tasks_running`) running in this process now.
_tasks = 0


@contextmanager
def tasks_running() -> Iterator[None]:
    """While it lasts, background encodings of this process wait (unless a checkpoint waits for them)."""
    global _tasks
    with _cond:
        _tasks += 1
    try:
        yield
    finally:
        with _cond:
            _tasks -= 1
            _cond.notify_all()


class _Stopped(Exception):
    """Raised inside the encoding when the materialization is given up."""


class Materialization:
    """A base of every entry as it was at checkpoint ``checkpoint_id``'s sync point, being encoded."""

    def __init__(self, checkpoint_id: int, snapshot: KeyedSnapshot) -> None:
        self.checkpoint_id = checkpoint_id
        self._snapshot = snapshot
        self._stop = False
        self._urgent = False  # a checkpoint waits for it: it runs whether tasks run or not
        self._lock = threading.Lock()  # between the end of the encoding and give_up
        self._done = threading.Event()
        #: The encoded base, once finished without error.
        self.data: bytes | None = None
        self.result: SnapshotWriteResult | None = None
        #: What the encoding raised (not when it was given up).
        self.error: BaseException | None = None
        #: Seconds from start to end of the encoding.
        self.seconds = 0.0
        self._thread = threading.Thread(
            target=self._run, name=f"statekit-base-of-checkpoint-{checkpoint_id}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        started = time.perf_counter()
        buf = io.BytesIO()
        try:
            self._progress(0, 0)  # started inside a task: not a key group before it ends
            result = self._snapshot.write(buf, progress=self._progress)
            with self._lock:
                if not self._stop:
                    self.result, self.data = result, buf.getvalue()
        except _Stopped:
            pass
        except BaseException as e:  # noqa: BLE001 - kept for the checkpoint that would adopt it
            if not self._stop:
                self.error = e
        finally:
            self._snapshot.release()  # write releases too; given up before it started, this does
            self.seconds = time.perf_counter() - started
            self._done.set()

    def _progress(self, done: int, total: int) -> None:
        """Before the first key group and after each: stop if given up; wait while tasks run, unless a
        checkpoint waits."""
        with _cond:
            while _tasks and not self._urgent and not self._stop:
                _cond.wait()
        if self._stop:
            raise _Stopped

    @property
    def finished(self) -> bool:
        """True once the encoding ended: with :attr:`data`, with :attr:`error`, or given up."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the encoding ended (it runs meanwhile, tasks or not); False if ``timeout`` passed."""
        with _cond:
            self._urgent = True
            _cond.notify_all()
        return self._done.wait(timeout)

    def give_up(self) -> None:
        """Stop at the next key group and release the snapshot (its bytes are never used)."""
        with self._lock:
            self._stop = True
            self.data = None
        with _cond:
            _cond.notify_all()
