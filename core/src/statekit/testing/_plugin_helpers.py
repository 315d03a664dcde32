"""Scaffolding for a backend plugin's own tests, besides the kit's test classes.

The kit's classes (:class:`~statekit.testing.StateBackendTests`) hold every
backend to the same contract. A plugin's own tests check what is its engine's:
what it puts on disk, its local directories, its native checkpoints. These
helpers are what such tests of different plugins share, so that each plugin
imports them from here rather than copying them, or reaching into the kit's
private modules::

    @pytest.fixture
    def make_backend(clock, tmp_path):
        with keyed_backends(MyStateBackend, local_dir=tmp_path / "local", clock=clock) as make:
            yield make

    def test_a_native_snapshot_restores(make_backend):
        src = make_backend()
        ...
        target = make_backend(KeyGroupRange.of(0, 63))
        target.restore_native([snapshot_handle(src, native=True)])
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .._contracts import StateBackend, create_keyed_backend
from ..checkpoints._restore import load_checkpoint
from ..runtime._runner import LocalRunner
from ..serialization._keygroups import KeyGroupRange
from ..serialization._serializers import StrSerializer, TypeSerializer
from ..state._parameters import KeyedBackendParameters
from ..state._state import ValueStateDescriptor
from ..state._ttl import Clock
from ._job import DecodedEntry, KitNativeOutput, decode_canonical, snapshot_handle

__all__ = [
    "DecodedEntry",
    "KitNativeOutput",
    "decode_canonical",
    "keyed_backends",
    "keyed_checkpoint_part",
    "run_killed_job",
    "snapshot_handle",
    "value_state_contents",
]


@contextlib.contextmanager
def keyed_backends(
    state_backend: Callable[[Mapping[str, Any] | None], StateBackend],
    *,
    local_dir: str | os.PathLike[str],
    clock: Clock | None = None,
    max_parallelism: int = 128,
    key_serializer: TypeSerializer | None = None,
) -> Iterator[Callable[..., Any]]:
    """A factory of keyed backends of one plugin; every backend it made is closed on exit.

    ``make(key_group_range=None, options=None, local_dir=None)`` creates
    ``state_backend(options)`` (the plugin's options by short name) and asks it
    for a keyed backend owning ``key_group_range`` (default: every key group),
    with str keys unless ``key_serializer`` says otherwise, ``clock``, and its
    files under ``local_dir`` (default: the one given here).
    """
    made: list[Any] = []
    default_range = KeyGroupRange.of(0, max_parallelism - 1)
    default_dir = local_dir

    def make(
        key_group_range: KeyGroupRange | None = None,
        options: Mapping[str, Any] | None = None,
        local_dir: str | os.PathLike[str] | None = None,
    ) -> Any:
        b = create_keyed_backend(
            state_backend(options),
            KeyedBackendParameters(
                key_serializer=key_serializer or StrSerializer(),
                key_group_range=default_range if key_group_range is None else key_group_range,
                max_parallelism=max_parallelism,
                clock=clock,
                local_dir=os.fspath(local_dir or default_dir),
            ),
        )
        made.append(b)
        return b

    try:
        yield make
    finally:
        for b in made:
            b.close()


def value_state_contents(runner: LocalRunner, descriptor: ValueStateDescriptor[Any]) -> dict[Any, Any]:
    """Every key's value of a value state (in VOID_NAMESPACE), over all subtasks of ``runner``."""
    out = {}
    for ctx in runner.subtasks:
        kb = ctx.keyed_backend
        s = kb.get_state(descriptor)
        for k in kb.keys(descriptor.name):
            kb.set_current_key(k)
            out[k] = s.value()
    return out


def keyed_checkpoint_part(
    runner: LocalRunner, location: str, subtask: int = 0, operator: str = "process"
) -> dict[str, Any]:
    """The keyed part of one subtask's state in the metadata of the checkpoint at ``location``."""
    part = load_checkpoint(runner.storage, location).metadata.operators[operator][subtask].keyed
    assert part is not None, f"subtask {subtask} of {operator!r} has no keyed state at {location}"
    return part


_KILLED_JOB = """
import os, signal, sys
from statekit import LocalRunner, ValueStateDescriptor, KeyedProcessFunction

class C(KeyedProcessFunction):
    def open(self, ctx):
        self.c = ctx.get_state(ValueStateDescriptor("count", int, default=0))
    def process(self, record, ctx):
        self.c.update(self.c.value() + 1)

backend, local_dir, parallelism, records = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
r = LocalRunner(C, key_selector=lambda x: x, config={
    "statekit.backend": backend, "statekit.local-dir": local_dir, "statekit.parallelism": parallelism})
for i in range(records):
    r.process(f"k{i}")
os.kill(os.getpid(), signal.SIGKILL)
"""


def run_killed_job(
    backend: str,
    local_dir: str | os.PathLike[str],
    *,
    parallelism: int = 2,
    records: int = 100,
    timeout: float = 120,
) -> subprocess.CompletedProcess[bytes]:
    """Run a job on ``backend`` in a child process that SIGKILLs itself after ``records`` records.

    The job counts records per key with ``parallelism`` subtasks, their local
    directories under ``local_dir``; nothing can clean them up. Returns the
    finished process (its ``returncode`` is ``-signal.SIGKILL`` unless the job
    failed first; ``stderr`` says why).
    """
    return subprocess.run(
        [sys.executable, "-c", _KILLED_JOB, backend, os.fspath(local_dir), str(parallelism), str(records)],
        capture_output=True,
        timeout=timeout,
    )
