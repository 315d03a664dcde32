"""Task-local recovery on the shared Spark session: a local copy is used only if it is the recorded file.

Issue #32's reproduction: another checkpoint's bytes written over a subtask's
local copy, under the copy's own name. The restore rejects the copy (its
SHA-256 is not the one the checkpoint records), reads that file from the
checkpoint storage, says so in ``BatchInfo``, and the state is exact. (A
local-recovery directory another user prepared is refused in
``test_spark_task.py``, in the test process: it needs ``statekit.local-dir`` of
its own, which tests on the shared session's workers leave unset, since a
worker's hand-off server serves the local directory it started under.)
"""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any

import pytest
from sparkutil import OUTPUT, SCHEMA, assert_exact_state

from jobs import CountUrls, make_records
from statekit.checkpointing import load_checkpoint
from statekit.snapshots._digest import recorded_digest
from statekit.spark import BatchInfo, keyed

RECORDS = make_records(1800)
_RUNS = itertools.count()


def configure(session: Any, values: dict[str, Any]) -> None:
    for key, value in values.items():
        session.conf.set(key, str(value))


def run(session: Any, job_id: str, records: list[dict[str, Any]]) -> BatchInfo:
    """One static run of the job: its subtasks restore (locally if they can), never reuse open state.

    A restart reuses the open state of the run before when nothing it was made for
    changed; each run here changes the configuration a little, so that it restores.
    """
    session.conf.set("spark.statekit.key-cache-size", str(4096 + len(records) + next(_RUNS)))
    df = session.createDataFrame(records, SCHEMA)
    return keyed(df, "url").process(CountUrls, OUTPUT, job_id=job_id).run()


def storage_of(session: Any, job_id: str) -> Any:
    df = session.createDataFrame(RECORDS[:1], SCHEMA)
    return keyed(df, "url").process(CountUrls, OUTPUT, job_id=job_id).checkpoint_storage()


@pytest.mark.parametrize(
    ("backend", "fmt"),
    [("heap", "canonical"), ("rocksdb", "native"), ("heap", "native")],
    ids=["canonical", "native", "heap-delta"],
)
def test_a_local_copy_swapped_from_another_checkpoint_is_rejected_and_the_state_exact(
    session: Any, tmp_path: Path, job_id: str, backend: str, fmt: str
) -> None:
    configure(session, {"spark.statekit.checkpoints.dir": tmp_path / "statekit",
                        "spark.statekit.checkpoint.storage.filesystem.inline-threshold": 0,
                        "spark.statekit.parallelism": 2, "spark.statekit.backend": backend,
                        # heap writes a base then deltas natively, canonical keyed files with "canonical"
                        "spark.statekit.checkpoint.format": fmt,
                        })  # fmt: skip
    first = run(session, job_id, RECORDS[:600])
    assert first.local_recovery == "on" and first.local_copies_rejected == 0
    storage = storage_of(session, job_id)
    old = load_checkpoint(storage, first.location).metadata.operators["process"][0]
    second = run(session, job_id, RECORDS[600:1200])
    assert second.restored_locally == 2 and second.local_copies_rejected == 0, second
    new = load_checkpoint(storage, second.location).metadata.operators["process"][0]

    def digest(st: Any) -> str:
        """The digest naming subtask 0's keyed file's copy (native: the file chk uploaded last)."""
        keyed_part = st.keyed
        if "native" not in keyed_part:
            recorded = recorded_digest(keyed_part)
            assert recorded is not None
            return recorded.name
        files = keyed_part["native"]["files"]
        if backend == "heap":  # the file this checkpoint wrote: chk-1's base, chk-2's delta
            return str(max(files, key=lambda f: f["checkpoint_id"])["sha256"])
        ours = [f for f in files if f["name"].startswith("MANIFEST")]
        return str(ours[0]["sha256"])

    # The executor's local directory: Spark's (statekit.local-dir stays unset, as a worker's hand-off
    # server, once started, serves the local directory it started under).
    local = Path(session.sparkContext.getConf().get("spark.local.dir", tempfile.gettempdir()))
    (files,) = local.glob(f"*/statekit/local-recovery/{job_id}/process/files")
    victim = files / digest(new)
    assert victim.exists() and (files / digest(old)).exists()
    victim.write_bytes((files / digest(old)).read_bytes())  # chk-1's bytes under chk-2's name

    third = run(session, job_id, RECORDS[1200:1800])
    assert third.local_copies_rejected == 1, third
    (reason,) = third.local_copy_rejections
    assert "bytes are not the ones the checkpoint records" in reason
    assert reason.startswith(str(tmp_path / "statekit" / job_id)), reason
    assert (third.restored_locally, third.restored_remotely) == (1, 1) and third.bytes_downloaded > 0
    assert_exact_state(storage, job_id, RECORDS)
