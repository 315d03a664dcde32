"""statekit on Spark drivers of their own: one killed mid-run, one on a standalone cluster."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster, standalone_cluster
from sparkutil import (
    assert_exact_outputs,
    assert_exact_state,
    driver_env,
    latest_batch,
    restored_state,
    write_inputs,
)

from jobs import make_records, model_state

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "spark_driver.py"


def start_driver(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """The test driver in a process group of its own (so that all of it can be killed at once).

    It reports into ``<log>.jsonl``; its output goes to ``log``.
    """
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, str(DRIVER), *args, "--report", f"{log}.jsonl"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=driver_env(),
            start_new_session=True,
        )


def finish(proc: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> list[dict[str, Any]]:
    """Wait for the driver; what it reported."""
    proc.wait(timeout=timeout)
    assert proc.returncode == 0, f"driver failed ({proc.returncode}); see {log}:\n{log.read_text()[-3000:]}"
    return [json.loads(line) for line in Path(f"{log}.jsonl").read_text().splitlines()]


def latest_id(checkpoints: Path, job_id: str) -> int:
    done = [int(p.parent.name[4:]) for p in (checkpoints / job_id).glob("chk-*/_metadata")]
    return max(done, default=0)


@pytest.mark.parametrize(
    "backend",
    # After a kill, every backend's native restore goes through the same driver and coordinator
    # steps (the heap's is native too: its delta checkpoints); rocksdb's and lmdb's own files are
    # checked by their own and the root restore tests. They run nightly, to keep ci's time (about
    # 45-60 s a driver-kill run).
    [
        "heap",
        pytest.param("rocksdb", marks=pytest.mark.nightly),
        pytest.param("lmdb", marks=pytest.mark.nightly),
    ],
)
def test_driver_killed_mid_run_then_restarted_counts_exactly(tmp_path: Path, backend: str) -> None:
    records = make_records(2400, seed=3)
    write_inputs(tmp_path / "in", records, 8)
    checkpoints = tmp_path / "statekit"
    args = [
        "--input", str(tmp_path / "in"), "--out", str(tmp_path / "out"),
        "--spark-checkpoint", str(tmp_path / "spark"), "--job-id", "killed",
        "--checkpoints-dir", str(checkpoints), "--parallelism", "2", "--backend", backend,
    ]  # fmt: skip

    # 1. The driver dies right after the sink wrote batch 1, before checkpoint 2 completes.
    first = start_driver([*args, "--kill-in-sink", "1"], tmp_path / "driver-1.log")
    first.wait(timeout=300)
    assert first.returncode == -signal.SIGKILL
    assert latest_id(checkpoints, "killed") == 1
    assert (tmp_path / "out" / "batch_id=1" / "_SUCCESS").exists()

    # 2. The restarted driver is killed from outside, at a random moment in a later batch.
    second = start_driver(args, tmp_path / "driver-2.log")
    while latest_batch(checkpoints, "killed") < 2 and second.poll() is None:
        time.sleep(0.1)
    time.sleep(random.uniform(0, 1.0))
    os.killpg(second.pid, signal.SIGKILL)
    second.wait(timeout=60)
    assert second.returncode == -signal.SIGKILL, "the driver finished before it could be killed"
    killed_at = latest_batch(checkpoints, "killed")  # the last batch a checkpoint holds
    assert 2 <= killed_at < 7

    # 3. Restarted again, it runs to the end.
    log = tmp_path / "driver-3.log"
    lines = finish(start_driver(args, log), log)
    summary = lines[-1]["summary"]
    assert summary["state_ok"] and summary["records"] == len(records)
    batches = [line["batch"] for line in lines if "batch" in line]
    # The first batch is the one after the last completed checkpoint's, or the replay of that
    # one if Spark had not committed it (then skipped).
    assert batches[0]["batch_id"] in (killed_at, killed_at + 1)
    assert batches[0]["skipped"] == (batches[0]["batch_id"] == killed_at)

    from statekit_storage import FileSystemCheckpointStorage

    assert_exact_state(FileSystemCheckpointStorage(str(checkpoints)), "killed", records)
    assert_exact_outputs(tmp_path / "out", records)


def test_windowed_driver_killed_in_the_sink_then_restarted_emits_each_window_once(tmp_path: Path) -> None:
    """Timers are state: a driver killed between sink and checkpoint neither loses nor repeats a window."""
    import datetime as dt
    from collections import Counter

    import pyarrow.dataset as ds

    records = make_records(1200, seed=5)  # one per second: 20 minutes
    write_inputs(tmp_path / "in", records, 5)
    args = [
        "--input", str(tmp_path / "in"), "--out", str(tmp_path / "out"),
        "--spark-checkpoint", str(tmp_path / "spark"), "--job-id", "windows",
        "--checkpoints-dir", str(tmp_path / "statekit"), "--parallelism", "2", "--windowed",
    ]  # fmt: skip
    first = start_driver([*args, "--kill-in-sink", "2"], tmp_path / "driver-1.log")
    first.wait(timeout=300)
    assert first.returncode == -signal.SIGKILL
    log = tmp_path / "driver-2.log"
    lines = finish(start_driver(args, log), log)
    watermark = lines[-1]["summary"]["fired_up_to"]

    def minute(r: dict[str, Any]) -> int:
        t = dt.datetime.strptime(r["@timestamp"], "%d/%b/%Y:%H:%M:%S").replace(tzinfo=dt.UTC)
        ms = int(t.timestamp() * 1000)
        return ms - ms % 60_000

    model = Counter((r["url"], minute(r)) for r in records)
    table = ds.dataset(str(tmp_path / "out"), format="parquet", partitioning="hive").to_table()
    got = list(zip(*(table.column(c).to_pylist() for c in ("url", "start", "n"))))
    assert len(got) == len({(u, s) for u, s, _ in got}), "a window was emitted twice"
    assert {(u, s): n for u, s, n in got} == {
        (u, s): n for (u, s), n in model.items() if s + 60_000 - 1 <= watermark
    }
    assert len(got) > 100


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A master and two workers on 127.0.0.1, shared by this module's cluster tests (each its own app)."""
    with standalone_cluster(tmp_path_factory.mktemp("cluster")) as c:
        yield c


def test_standalone_cluster_state_lives_in_executors(tmp_path: Path, cluster: Cluster) -> None:
    """A master and two workers on 127.0.0.1; the driver's jobmanager storage gets the snapshots."""
    records = make_records(1600, seed=5)
    write_inputs(tmp_path / "in", records, 2)
    log = tmp_path / "driver.log"
    driver = start_driver(
        [
            "--master", cluster.master_url, "--input", str(tmp_path / "in"), "--out", str(tmp_path / "out"),
            "--spark-checkpoint", str(tmp_path / "spark"), "--job-id", "cluster",
            "--parallelism", "3", "2",  # jobmanager storage; the restarted query rescales 3 -> 2
        ],
        log,
    )  # fmt: skip
    lines = finish(driver, log, timeout=400)

    summary = lines[-1]["summary"]
    assert summary["state_ok"], summary
    assert summary["parallelisms"] == [3, 3, 2, 2]  # two files, then two more
    assert summary["driver_pid"] not in summary["executor_pids"]
    assert len(summary["executor_pids"]) >= 2  # Python workers of both executors held subtasks
    all_records = records + make_records(600, seed=11)
    assert summary["records"] == len(all_records)
    assert_exact_outputs(tmp_path / "out", all_records)


@pytest.mark.nightly  # two drivers on the cluster, ~100 s: the local tests cover the path in ci
def test_standalone_cluster_a_savepoint_restored_into_a_new_query_reads_only_what_came_after(
    tmp_path: Path, cluster: Cluster
) -> None:
    """A converted checkpoint carries its file source's position; a new job on a new location (at a
    new parallelism) restored from it reads only the file that came after, on a standalone cluster."""
    from statekit.checkpoints._convert import convert_to_savepoint
    from statekit_storage import FileSystemCheckpointStorage

    records = make_records(900, seed=31)
    write_inputs(tmp_path / "in", records[:600], 2)
    ckpt = tmp_path / "statekit"
    common = ["--master", cluster.master_url, "--input", str(tmp_path / "in"), "--checkpoints-dir", str(ckpt)]
    log = tmp_path / "driver-1.log"
    first = [*common, "--out", str(tmp_path / "out-1"), "--spark-checkpoint", str(tmp_path / "spark-1")]
    assert finish(start_driver([*first, "--job-id", "before"], log), log, timeout=400)[-1]["summary"][
        "state_ok"
    ]
    storage = FileSystemCheckpointStorage(str(ckpt))
    savepoint = convert_to_savepoint(storage, storage.latest_checkpoint("before"), str(tmp_path / "sp"))
    write_inputs(tmp_path / "in", records[600:], 1, start=2)
    log = tmp_path / "driver-2.log"
    second = [*common, "--out", str(tmp_path / "out-2"), "--spark-checkpoint", str(tmp_path / "spark-2")]
    more = ["--job-id", "after", "--restore", savepoint, "--parallelism", "3"]
    summary = finish(start_driver([*second, *more], log), log, timeout=400)[-1]["summary"]
    assert summary["state_ok"] and summary["records"] == len(records), summary  # the savepoint's + file 2
    assert summary["parallelisms"] == [3]  # one micro-batch: the file after the savepoint


def _parent_of(pid: int) -> int:
    # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces, so split after its ")".
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _executor_of(python_pid: int) -> int:
    """The executor JVM (CoarseGrainedExecutorBackend) a Python worker runs under."""
    pid = python_pid
    while pid > 1:
        pid = _parent_of(pid)
        if b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    raise AssertionError(f"Python worker {python_pid} runs under no executor JVM")


def test_an_executor_killed_mid_batch_its_tasks_rerun_on_the_other_from_the_storage(
    tmp_path: Path, cluster: Cluster
) -> None:
    """SIGKILL the executor JVM running a statekit task; Spark reruns it elsewhere, counts stay exact.

    The task stalls (sparkjobs.StallOnceCountUrls) on a subtask its executor kept
    open from the previous batch, so that state exists only in the dying executor
    and in the checkpoint storage (a local directory): the rerun must restore it,
    from the storage (the other executor never held it). Task locality runs every
    subtask on the executor that ran it last, so the stall comes at batch 1, the
    first that can reuse; after the loss the subtasks settle on the executors
    left and reuse their state again.
    """
    records = make_records(2000, seed=17)
    write_inputs(tmp_path / "in", records, 6)
    markers = tmp_path / "markers"
    markers.mkdir()
    checkpoints = tmp_path / "statekit"
    log = tmp_path / "driver.log"
    driver = start_driver(
        [
            "--master", cluster.master_url, "--input", str(tmp_path / "in"), "--out", str(tmp_path / "out"),
            "--spark-checkpoint", str(tmp_path / "spark"), "--job-id", "lost",
            "--checkpoints-dir", str(checkpoints), "--parallelism", "2", "--stall-once", str(markers),
        ],
        log,
    )  # fmt: skip
    stalled = markers / "stalled.json"
    try:
        info: dict[str, Any] = {}
        while driver.poll() is None and not info:
            with contextlib.suppress(FileNotFoundError, ValueError):  # not there, or half-written
                info = json.loads(stalled.read_text())
            time.sleep(0.2)
        assert info, f"no task stalled on a subtask its executor kept open; see {log}"
        executor = _executor_of(info["pid"])
        assert _parent_of(executor) in {w.proc.pid for w in cluster.workers}  # one of our workers'
        os.kill(executor, signal.SIGKILL)
        while Path(f"/proc/{executor}").exists() and _state_of(executor) != "Z":
            time.sleep(0.1)
    finally:
        (markers / "release").touch()
    lines = finish(driver, log, timeout=400)

    summary = lines[-1]["summary"]
    assert summary["state_ok"] and summary["records"] == len(records), summary
    batches = {line["batch"]["batch_id"]: line["batch"] for line in lines if "batch" in line}
    assert info["batch"] == 1, info  # locality: batch 1 already ran where batch 0 left the state
    hit = batches[info["batch"]]
    assert not hit["skipped"] and info["pid"] not in hit["executor_pids"]
    # The killed executor held the subtask's only open copy: the rerun restored it from the storage.
    assert hit["restored_subtasks"] >= 1, hit
    assert hit["locality"] == "on"
    last = batches[max(batches)]
    assert last["reused_subtasks"] == last["parallelism"] == 2, last  # settled on the executors left
    from statekit_storage import FileSystemCheckpointStorage

    assert_exact_state(FileSystemCheckpointStorage(str(checkpoints)), "lost", records)
    assert_exact_outputs(tmp_path / "out", records)


def _state_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "X"


def test_a_second_driver_on_the_same_job_fences_off_the_first(tmp_path: Path) -> None:
    """Two real drivers, one statekit job and checkpoints directory: only the newer completes checkpoints.

    The first driver stops in its sink of batch 2 (its checkpoint 3 written but for
    ``_metadata``); the second starts meanwhile, as a new query restoring the job's
    latest checkpoint (and so its source position), and runs to its end. Then the first goes on, and
    is refused.
    """
    records = make_records(1200, seed=13)
    write_inputs(tmp_path / "in", records, 6)
    checkpoints = tmp_path / "statekit"
    common = [
        "--input", str(tmp_path / "in"), "--job-id", "twice", "--checkpoints-dir", str(checkpoints),
        "--retained", "50",
    ]  # fmt: skip
    go = tmp_path / "go"
    first_log = tmp_path / "driver-1.log"
    first = start_driver(
        [*common, "--out", str(tmp_path / "out-1"), "--spark-checkpoint", str(tmp_path / "spark-1"),
         "--wait-in-sink", "2", "--wait-for", str(go)],
        first_log,
    )  # fmt: skip
    report = Path(f"{first_log}.jsonl")
    while first.poll() is None and '"waiting_in_sink"' not in (report.read_text() if report.exists() else ""):
        time.sleep(0.2)
    assert first.poll() is None, f"the first driver ended early; see {first_log}"
    second_log = tmp_path / "driver-2.log"
    second = start_driver(
        [*common, "--out", str(tmp_path / "out-2"), "--spark-checkpoint", str(tmp_path / "spark-2"),
         "--restore", "latest"],
        second_log,
    )  # fmt: skip
    try:
        finish(second, second_log)
    finally:
        go.touch()
    first.wait(timeout=300)
    assert first.returncode == 3, f"the first driver was not refused; see {first_log}"
    error = json.loads(report.read_text().splitlines()[-1])["error"]
    assert "FencedError" in error and "is fenced off" in error, error
    newest = max((checkpoints / "twice" / "runs").iterdir(), key=lambda p: int(p.name.split("-")[1]))
    assert newest.name.startswith("run-2-")
    assert f"a newer run {newest.name.split('-')[2][:12]} (epoch 2)" in error, error
    assert f"pid {second.pid} on host" in error, error

    from statekit.checkpointing import load_checkpoint
    from statekit.spark._driver import QUERY_PROPERTY
    from statekit_storage import FileSystemCheckpointStorage

    storage = FileSystemCheckpointStorage(str(checkpoints))
    made_by = [load_checkpoint(storage, loc).metadata.properties[QUERY_PROPERTY]
               for loc in storage.list_checkpoints("twice")]  # fmt: skip
    # Checkpoints 1 and 2 by the first query, then only the second's: the first completed none after.
    # restore="latest" on a new Spark location brings the first query's source position along (its
    # location still holds it, issue 42): the second reads only the files after batch 1, 4 batches.
    assert len(set(made_by[:2])) == 1 and made_by[0] not in made_by[2:] and len(made_by) == 2 + 4
    # So the job's state is every record exactly once, with nothing of the first's batch 2 counted twice.
    restored = restored_state(storage, "twice", location=storage.list_checkpoints("twice")[1])
    assert sum(c for c, _, _ in restored.values()) == 2 * len(records) // 6
    assert restored_state(storage, "twice") == model_state(records)


# Rotation (test_spark_log_source) and a driver killed in the sink (the windowed case) each run in
# ci; this composition of both runs nightly (ci's time: about 45 s).
@pytest.mark.nightly
def test_log_source_driver_killed_in_the_sink_then_files_rotate_counts_exactly(tmp_path: Path) -> None:
    """read_logs, driver killed: offsets in Spark's log, the batch replayed, the file rotated meanwhile."""
    records = make_records(1600, seed=13)
    logs = tmp_path / "in"
    logs.mkdir()

    def append(name: str, chunk: list[dict[str, Any]], extra: str = "") -> None:
        with (logs / name).open("a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in chunk) + extra)

    append("access.log", records[:700], '{"url": "/broken"\n')
    append("access.log", records[700:900])
    checkpoints, dead = tmp_path / "statekit", tmp_path / "dead"
    args = [
        "--input", str(logs / "access.log"), "--out", str(tmp_path / "out"),
        "--spark-checkpoint", str(tmp_path / "spark"), "--job-id", "logs",
        "--checkpoints-dir", str(checkpoints), "--parallelism", "2",
        "--log-source", "--max-lines", "500", "--dead-letters", str(dead),
    ]  # fmt: skip
    first = start_driver([*args, "--kill-in-sink", "1"], tmp_path / "driver-1.log")
    first.wait(timeout=300)
    assert first.returncode == -signal.SIGKILL
    assert latest_id(checkpoints, "logs") == 1  # batch 1 is in Spark's offset log, not done

    # While the job is down: lines appended, then a rename rotation, the old file still written to.
    append("access.log", records[900:1100])
    os.rename(logs / "access.log", logs / "access.log.1")
    append("access.log", records[1100:1500])
    append("access.log.1", records[1500:])

    log = tmp_path / "driver-2.log"
    lines = finish(start_driver(args, log), log)
    summary = lines[-1]["summary"]
    assert summary["state_ok"] and summary["records"] == len(records)
    batches = [line["batch"] for line in lines if "batch" in line]
    assert batches[0]["batch_id"] == 1 and not batches[0]["skipped"]  # replayed from the offset log
    # Batch 0 held lines 1-500; batch 1 (501-1000, line 701 malformed) and the rest came again.
    assert sum(b["records"] for b in batches) == len(records) - 500

    from statekit_storage import FileSystemCheckpointStorage

    assert_exact_state(FileSystemCheckpointStorage(str(checkpoints)), "logs", records)
    assert_exact_outputs(tmp_path / "out", records)
    letters = [json.loads(x) for p in dead.iterdir() for x in p.read_text().splitlines()]
    assert [(x["raw"], x["line"]) for x in letters] == [('{"url": "/broken"', 701)]
