"""What the benchmarks share: workloads, timing, checkpoints through a storage, a run of named parts.

Not a benchmark itself; the ``bench_*.py`` scripts import it (Python puts a
script's directory on ``sys.path``, so ``python bench/bench_lmdb.py`` finds it).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import itertools
import os
import random
import shutil
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from statekit import ValueStateDescriptor
from statekit.checkpointing import complete_checkpoint, write_subtask_state

__all__ = [
    "COUNTING_HEADER",
    "best_of",
    "counting_off_on",
    "counting_row",
    "digests_off",
    "expected_counts",
    "hashing_seconds",
    "rmw_batched",
    "rmw_per_record",
    "run_parts",
    "timed",
    "write_checkpoint",
    "zipf_keys",
]


def zipf_keys(n_ops: int, n_keys: int, s: float = 1.1, seed: int = 42) -> list[str]:
    """A deterministic Zipf-like sequence of ``n_ops`` keys out of ``n_keys``."""
    rng = random.Random(seed)
    names = [f"/api/v1/resource/{i}" for i in range(n_keys)]
    rng.shuffle(names)
    cum = list(itertools.accumulate(1.0 / (r**s) for r in range(1, n_keys + 1)))
    return rng.choices(names, cum_weights=cum, k=n_ops)


def expected_counts(ops: list[str]) -> dict[str, int]:
    """How often each key occurs in ``ops``: what a read-modify-write +1 per op leaves."""
    out: dict[str, int] = {}
    for k in ops:
        out[k] = out.get(k, 0) + 1
    return out


def best_of(
    repeats: int, setup: Callable[[], object], run: Callable[[object], object]
) -> tuple[float, object]:
    """The best time of ``run(setup())`` (setup untimed, GC off while timed), and the last result."""
    best = float("inf")
    result: object = None
    for _ in range(repeats):
        ctx = setup()
        gc.collect()
        gc.disable()
        t0 = time.perf_counter()
        result = run(ctx)
        best = min(best, time.perf_counter() - t0)
        gc.enable()
    return best, result


COUNTING_HEADER = (
    f"{'round':<8}{'off cpu s':>11}{'on cpu s':>10}{'on/off':>8}"
    f"{'off wall s':>12}{'on wall s':>11}{'on/off':>8}"
)
"""The header of :func:`counting_row`'s rows."""


def counting_row(round_: int, cpu: Mapping[bool, float], wall: Mapping[bool, float]) -> str:
    """A round's best seconds with entry counting off (False) and on (True), and their ratios."""
    return (
        f"{round_:<8}{cpu[False]:>11.3f}{cpu[True]:>10.3f}{cpu[True] / cpu[False]:>8.3f}"
        f"{wall[False]:>12.3f}{wall[True]:>11.3f}{wall[True] / wall[False]:>8.3f}"
    )


def counting_off_on(
    round_: int,
    backend: Callable[[bool], Any],
    run: Callable[[Any], object],
    expected: int,
    repeats: int,
) -> str:
    """One round of exact entry counts off and on, alternating run by run: a row under COUNTING_HEADER.

    ``backend(exact)`` makes a fresh keyed backend with counting on or off
    (``KeyedBackendParameters.exact_entries``); ``run`` works on it (GC off
    while timed). Best thread-CPU and wall seconds of ``repeats`` runs each;
    every run's count is checked: ``expected`` entries exactly when on, None when off.
    """
    cpu = {False: float("inf"), True: float("inf")}
    wall = dict(cpu)
    for _ in range(repeats):  # off and on alternate run by run: the machine's load hits both
        for enabled in (False, True):
            b = backend(enabled)
            gc.collect()
            gc.disable()
            c0, w0 = time.thread_time(), time.perf_counter()
            run(b)
            c1, w1 = time.thread_time(), time.perf_counter()
            gc.enable()
            assert b.kv_exact_entries() == (expected if enabled else None)
            b.close()
            cpu[enabled] = min(cpu[enabled], c1 - c0)
            wall[enabled] = min(wall[enabled], w1 - w0)
    return counting_row(round_, cpu, wall)


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """The best time of ``fn()`` (GC collected before each run, left on), and the last result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _flush(b: Any) -> None:
    flush = getattr(b, "kv_write_buffered", None)  # ordered key-value backends buffer writes
    if flush is not None:
        flush()


def rmw_per_record(b: Any, ops: list[str], desc: ValueStateDescriptor[int]) -> Any:
    """``set_current_key(k); s.update(s.value() + 1)`` per op; buffered writes reach the engine."""
    s = b.get_state(desc)
    set_key, value, update = b.set_current_key, s.value, s.update
    for k in ops:
        set_key(k)
        update(value() + 1)
    _flush(b)
    return b


def rmw_batched(b: Any, ops: list[str], desc: ValueStateDescriptor[int], batch: int = 10_000) -> Any:
    """``s.update_batch(keys, +1)`` over batches of ``batch`` keys."""
    s = b.get_state(desc)
    inc = (1).__add__
    for i in range(0, len(ops), batch):
        s.update_batch(ops[i : i + batch], inc)
    _flush(b)
    return b


def write_checkpoint(
    storage: Any, checkpoint_id: int, backend: Any, *, native: bool = False
) -> tuple[str, int]:
    """Write ``backend`` as subtask 0 of operator ``op`` of job ``bench``; its location and keyed bytes."""
    writer = storage.begin_checkpoint("bench", checkpoint_id)
    st = write_subtask_state(
        writer, "op", 0, backend, None, native_checkpoint_id=checkpoint_id if native else None
    )
    loc = complete_checkpoint(
        writer, job_id="bench", checkpoint_id=checkpoint_id, max_parallelism=128, subtasks=[st]
    )
    assert st.keyed is not None
    return loc, int(st.keyed["size"])


def run_parts(
    args: argparse.Namespace, prefix: str, parts: Mapping[str, Callable[[argparse.Namespace, str], None]]
) -> None:
    """Run the parts named in ``args.parts`` (comma-separated), in ``parts``' order, in one scratch dir."""
    wanted = args.parts.split(",")
    scratch = tempfile.mkdtemp(prefix=prefix)
    try:
        for name, part in parts.items():
            if name in wanted:
                part(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class _NoDigest:
    """A digest that reads almost nothing: the digests' baseline.

    It is not zeros, so that files keep distinct names (local copies are named
    by their digest) and a copy is still told from another: the size and the
    first and last 64 bytes, which differ between any two checkpoint files
    (each block ends in its own CRC-32), hashed when the digest is asked for.
    """

    def __init__(self) -> None:
        self._size = 0
        self._head = b""
        self._tail = b""

    def update(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        if len(self._head) < 64:
            self._head = (self._head + bytes(view[:64]))[:64]
        self._tail = (self._tail + bytes(view[-64:]))[-64:]
        self._size += len(view)

    def hexdigest(self) -> str:
        return hashlib.sha256(self._size.to_bytes(8, "big") + self._head + self._tail).hexdigest()


class _NoHashlib:
    @staticmethod
    def sha256(data: object = b"") -> _NoDigest:
        d = _NoDigest()
        d.update(data)
        return d


class _TimedDigest:
    """A SHA-256 whose hashing CPU time is added to the process's :class:`SwitchableHashlib` total.

    CPU time of the hashing thread, not wall time: a thread that waits for the
    GIL after hashlib let it go is not hashing.
    """

    def __init__(self, owner: SwitchableHashlib, data: object) -> None:
        self._owner = owner
        t = time.thread_time()
        self._h = hashlib.sha256(data)  # type: ignore[arg-type]
        owner.spent(time.thread_time() - t)

    def update(self, data: object) -> None:
        t = time.thread_time()
        self._h.update(data)  # type: ignore[arg-type]
        self._owner.spent(time.thread_time() - t)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


class SwitchableHashlib:
    """``hashlib`` for statekit's digests, off while the file ``flag`` exists: for other processes.

    Spark's Python workers are processes of their own; a ``sitecustomize``
    (:func:`digest_switch_site`) installs this in each, and the driver creates or
    removes ``flag`` to measure with and without digests in one session.

    With ``timing``, each process also keeps the CPU seconds it spent hashing in
    ``timing/<pid>`` (8 bytes, a double, rewritten after every hash call):
    :func:`hashing_seconds` sums them. Hashing on statekit's hashing thread
    overlaps other work, so that sum bounds what hashing costs from above.
    """

    def __init__(self, flag: str, timing: str | None = None) -> None:
        self.flag = flag
        self.timing = timing
        self._pid = -1
        self._fd = -1
        self._total = 0.0
        self._lock = threading.Lock()

    def sha256(self, data: object = b"") -> Any:
        if os.path.exists(self.flag):
            return _NoHashlib.sha256(data)
        if self.timing is None:
            return hashlib.sha256(data)  # type: ignore[arg-type]
        return _TimedDigest(self, data)

    def spent(self, seconds: float) -> None:
        assert self.timing is not None
        with self._lock:
            if self._pid != os.getpid():  # a forked worker starts from zero, in a file of its own
                self._pid, self._total = os.getpid(), 0.0
                self._fd = os.open(os.path.join(self.timing, str(self._pid)), os.O_WRONLY | os.O_CREAT, 0o600)
            self._total += seconds
            os.pwrite(self._fd, struct.pack("d", self._total), 0)


def hashing_seconds(timing: Path) -> float:
    """The seconds every process that wrote into ``timing`` has spent hashing so far."""
    total = 0.0
    for f in timing.iterdir():
        data = f.read_bytes()
        if len(data) == 8:
            total += struct.unpack("d", data)[0]
    return total


def digest_switch_site(directory: Path, flag: Path, timing: Path | None = None) -> Path:
    """Write a ``sitecustomize.py`` into ``directory`` that installs :class:`SwitchableHashlib` on ``flag``.

    Put ``directory`` first on ``PYTHONPATH`` before Spark starts its workers.
    With ``timing`` (a directory), every process records its hashing seconds there.
    """
    directory.mkdir(parents=True, exist_ok=True)
    if timing is not None:
        timing.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        "from harness import SwitchableHashlib\n"
        "from statekit.snapshots import _digest\n"
        f"_digest.hashlib = SwitchableHashlib({str(flag)!r}, {None if timing is None else str(timing)!r})\n"
    )
    return directory


@contextlib.contextmanager
def digests_off() -> Iterator[None]:
    """Inside: statekit computes no SHA-256 (a digest of each file's size and ends instead): the baseline.

    Every digest of a checkpoint file goes through ``statekit.snapshots._digest``'s
    ``hashlib``; replacing it measures what the digests cost, in the same process.
    A checkpoint written inside must be read inside (its digests are zeros).
    """
    from statekit.snapshots import _digest

    real = _digest.hashlib
    _digest.hashlib = _NoHashlib  # type: ignore[assignment]
    try:
        yield
    finally:
        _digest.hashlib = real
