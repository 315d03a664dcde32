"""The on-disk lifecycle part of the conformance kit: what a backend leaves on local disk, and when.

A backend that keeps state in local files (RocksDB, LMDB, yours) makes one
working directory per keyed backend with
:func:`~statekit.ordered_kv.create_instance_dir` under ``statekit.local-dir``,
and deletes it when it closes. These tests hold it to that through a whole
job's life: many runs that restore, process, checkpoint and stop (cleanly or
by dropping their backends), a process killed with SIGKILL whose directories
the next run removes, and a closed backend that refuses use and keeps no file.
Subclass :class:`OnDiskLifecycleTests` and name the installed backend::

    class TestMyEngineLifecycle(OnDiskLifecycleTests):
        @pytest.fixture
        def backend_name(self):
            return "myengine"

The backend must be installed (registered by entry point: the killed job runs
in a child process that selects it by name) and creatable with its default
options. Working directories are found by their owner file
(:data:`~statekit.ordered_kv.OWNER_FILE`), whatever their prefix:
:func:`instance_dirs` lists them.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, ClassVar

import pytest

from .._contracts import SupportsNativeSnapshot, create_keyed_backend
from .._errors import StateAccessError
from .._localdirs import OWNER_FILE
from ..plugins._registry import default_registry
from ..runtime._function import KeyedProcessFunction
from ..runtime._runner import LocalRunner
from ..serialization._keygroups import KeyGroupRange
from ..serialization._serializers import StrSerializer
from ..state._parameters import KeyedBackendParameters
from ..state._state import ValueStateDescriptor
from ._plugin_helpers import run_killed_job, value_state_contents
from ._suite import GuardedTests

__all__ = ["OnDiskLifecycleTests", "instance_dirs"]

_COUNT = ValueStateDescriptor("count", int, default=0)


class _Count(KeyedProcessFunction):
    """Counts records per key: the job of every lifecycle test."""

    def open(self, ctx: Any) -> None:
        self.c = ctx.get_state(_COUNT)

    def process(self, record: Any, ctx: Any) -> None:
        self.c.update(self.c.value() + 1)


def instance_dirs(local_dir: str | os.PathLike[str]) -> list[Path]:
    """The backends' working directories under ``local_dir``, alive or left by a dead process, sorted.

    A directory is one when it holds :data:`~statekit.ordered_kv.OWNER_FILE`,
    as every directory made by :func:`~statekit.ordered_kv.create_instance_dir`
    does, and no other such directory: a runner's own directory for a job is
    owned too, and holds its subtasks' backends.
    """
    owned = {p.parent for p in Path(local_dir).rglob(OWNER_FILE)}
    return sorted(d for d in owned if not any(o != d and d in o.parents for o in owned))


class OnDiskLifecycleTests(GuardedTests):
    """The on-disk lifecycle of a backend with local working directories; see the module.

    Required fixture: ``backend_name`` (the installed backend's name).
    Class attributes: :attr:`restore_cycles`, :attr:`restore_formats`,
    :attr:`parallelism`. Kit tests cannot be overridden; declare a known failure
    in ``expected_failures``.
    """

    restore_cycles: ClassVar[int] = 20
    """Runs of :meth:`test_restore_cycles_leave_only_the_live_instances`."""
    restore_formats: ClassVar[tuple[str, ...]] = ("native", "canonical")
    """The ``statekit.checkpoint.format`` values the restore cycles run with, each in turn."""
    parallelism: ClassVar[int] = 2
    """Subtasks of every job, so one working directory each."""
    records_per_run: ClassVar[int] = 50

    @pytest.fixture
    def backend_name(self) -> str:
        """Required: the name the backend is installed under (``statekit.backend``)."""
        pytest.fail(f"{type(self).__qualname__} must define a backend_name fixture returning its name")

    def _config(self, name: str, local: Path, **more: Any) -> dict[str, Any]:
        return {"statekit.backend": name, "statekit.local-dir": str(local), **more}

    def test_restore_cycles_leave_only_the_live_instances(self, backend_name: str, tmp_path: Path) -> None:
        """Each run restores the latest checkpoint, adds to it and stops; no run leaves a directory.

        Every other run stops as a failed one does: the subtasks' backends are
        closed first, without a clean shutdown of the job. The last restore
        holds every record of every run.
        """
        for fmt in self.restore_formats:
            local = tmp_path / fmt / "local"
            conf = self._config(
                backend_name,
                local,
                **{
                    "statekit.checkpoints.dir": str(tmp_path / fmt / "chk"),
                    "statekit.parallelism": self.parallelism,
                    "statekit.checkpoint.format": fmt,
                },
            )
            for cycle in range(self.restore_cycles):
                r = LocalRunner(_Count, key_selector=lambda x: x, config=conf)
                r.restore("latest")
                for i in range(self.records_per_run):
                    r.process(f"k{i % 7}")
                r.checkpoint()
                # One directory per subtask, nothing left from earlier runs.
                assert len(instance_dirs(local)) == self.parallelism, (fmt, cycle, instance_dirs(local))
                if cycle % 2:
                    r.close()
                else:
                    for ctx in r.subtasks:
                        ctx.keyed_backend.close()
                    r.close()
                assert instance_dirs(local) == [], (fmt, cycle)
            r = LocalRunner(_Count, key_selector=lambda x: x, config=conf)
            r.restore("latest")
            total = sum(value_state_contents(r, _COUNT).values())
            r.close()
            assert total == self.restore_cycles * self.records_per_run, fmt

    def test_instances_of_a_killed_process_are_removed_by_the_next_run(
        self, backend_name: str, tmp_path: Path
    ) -> None:
        """SIGKILL leaves the directories behind; the next run on the same local dir removes them."""
        local = tmp_path / "local"
        proc = run_killed_job(backend_name, local, parallelism=self.parallelism)
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        assert len(instance_dirs(local)) == self.parallelism  # nobody could clean up
        r = LocalRunner(_Count, key_selector=lambda x: x, config=self._config(backend_name, local))
        r.process("a")
        assert len(instance_dirs(local)) == 1  # only the live one: the dead process's are gone
        r.close()
        assert instance_dirs(local) == []

    def test_a_closed_backend_refuses_use_and_releases_its_files(
        self, backend_name: str, tmp_path: Path
    ) -> None:
        """Closing deletes the working directory, with snapshots still pending; use after it fails."""
        local = tmp_path / "l"
        b = create_keyed_backend(
            default_registry().create_backend(backend_name),
            KeyedBackendParameters(StrSerializer(), KeyGroupRange.of(0, 127), 128, local_dir=str(local)),
        )
        s = b.get_state(_COUNT)
        b.set_current_key("a")
        s.update(1)
        snap = b.snapshot()  # pending while the backend closes
        native = b.native_snapshot(1) if isinstance(b, SupportsNativeSnapshot) else None
        assert len(instance_dirs(local)) == 1  # its files are under the local_dir it was given
        b.close()
        assert instance_dirs(local) == []
        with pytest.raises(StateAccessError, match="closed"):
            s.value()
        with pytest.raises(StateAccessError, match="closed"):
            b.set_current_key("b")
        snap.release()
        if native is not None:
            native.release()
        b.close()  # idempotent
        assert instance_dirs(local) == []
