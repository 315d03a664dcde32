"""The run records of a job (``<job>/runs/run-<epoch>-<run id>.json``), for fencing.

Of two runs of one job, only the newest completes checkpoints
(:class:`statekit.backend_api.SupportsRunFencing`): each run writes a record here with an
epoch one above the highest, and the coordinator asks which is the newest.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from statekit.errors import CheckpointError

from ._files import Files, list_names
from ._handles import fs_errors
from ._paths import join_url
from ._publishing import has_directories, publish

__all__ = ["RUNS_DIR", "RunRecords"]

#: ``<job>/runs/``: one record per run of the job, for fencing (see ``register_run``).
RUNS_DIR = "runs"
_RUN_RECORD = re.compile(r"run-([1-9][0-9]{0,17})-([0-9a-f]{1,64})\.json")
_MAX_RUN_RECORD = 64 << 10


class RunRecords:
    """Writes and reads the run records under ``<job dir>/runs`` for a storage."""

    def __init__(self, files: Files, job_dir: Callable[[str], str]) -> None:
        self._files = files
        self._job_dir = job_dir

    def _runs(self, job_id: str) -> tuple[Any, str, list[tuple[int, str]]]:
        """The filesystem, the ``<job>/runs`` path and the ``(epoch, run id)`` of each record there."""
        runs = join_url(self._job_dir(job_id), RUNS_DIR)
        fs, path = self._files.open(runs)
        try:
            names = list_names(fs, path)
        except fs_errors() as exc:
            raise CheckpointError(f"cannot list the runs of job {job_id!r} in {runs}: {exc}") from exc
        return fs, path, sorted((int(m[1]), m[2]) for n in names if (m := _RUN_RECORD.fullmatch(n)))

    def register_run(self, job_id: str, run_id: str, description: Mapping[str, Any]) -> int:
        """Writes ``<job>/runs/run-<epoch>-<run id>.json``, ``epoch`` one above the highest there."""
        if not re.fullmatch(r"[0-9a-f]{1,64}", run_id):
            raise CheckpointError(f"invalid run id {run_id!r}: expected up to 64 lowercase hex digits")
        fs, path, runs = self._runs(job_id)
        epoch = (runs[-1][0] if runs else 0) + 1
        record = f"{path}/run-{epoch}-{run_id}.json"
        data = json.dumps({**description, "run_id": run_id, "epoch": epoch}, sort_keys=True).encode()
        try:
            publish(fs, record, data, exclusive=False, has_directories=has_directories(fs))
        except fs_errors() as exc:
            where = fs.unstrip_protocol(record)
            raise CheckpointError(f"cannot record a run of job {job_id!r} at {where}: {exc}") from exc
        for old_epoch, old_run in runs:
            if old_epoch < epoch - 1:
                with contextlib.suppress(*fs_errors()):
                    fs.rm_file(f"{path}/run-{old_epoch}-{old_run}.json")
        fs.invalidate_cache(path)
        return epoch

    def newest_run(self, job_id: str) -> tuple[int, str, dict[str, Any]] | None:
        """``(epoch, run id, description)`` of the highest ``(epoch, run id)`` under ``<job>/runs``."""
        fs, path, runs = self._runs(job_id)
        if not runs:
            return None
        epoch, run_id = runs[-1]
        return epoch, run_id, self._read_run(fs, f"{path}/run-{epoch}-{run_id}.json")

    def _read_run(self, fs: Any, record: str) -> dict[str, Any]:
        # Only for naming the run: an unreadable record still is the newest.
        try:
            obj = json.loads(bytes(fs.cat_file(record, start=0, end=_MAX_RUN_RECORD)))
        except FileNotFoundError:
            return {"runner": "a run whose record was deleted"}
        except fs_errors() as exc:
            return {"runner": f"a run whose record {fs.unstrip_protocol(record)} cannot be read ({exc})"}
        except ValueError:
            return {"runner": f"a run whose record {fs.unstrip_protocol(record)} is damaged"}
        return obj if isinstance(obj, dict) else {}

    def end_run(self, job_id: str, run_id: str) -> None:
        """Adds ``ended_ms`` to run ``run_id``'s record, if it is still there."""
        fs, path, runs = self._runs(job_id)
        for epoch, rid in runs:
            if rid == run_id:
                record = f"{path}/run-{epoch}-{rid}.json"
                description = {**self._read_run(fs, record), "ended_ms": time.time_ns() // 1_000_000}
                data = json.dumps(description, sort_keys=True).encode()
                try:
                    publish(fs, record, data, exclusive=False, has_directories=has_directories(fs))
                except fs_errors() as exc:
                    raise CheckpointError(f"cannot record the end of a run at {record}: {exc}") from exc
