"""statekit from Spark Connect clients, against a real Connect server (one per test session).

Every client is a process of its own (``connect_client.py``), so a client can
be killed and started again as a user's would be; the server is killed and
restarted in the test of a driver lost mid-query.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from connectserver import START_ATTEMPTS, ConnectServer
from sparkutil import (
    assert_exact_outputs,
    assert_exact_state,
    driver_env,
    latest_batch,
    restored_state,
    wait_until,
    write_inputs,
)

from jobs import make_records, model_state
from statekit_storage import FileSystemCheckpointStorage

HERE = Path(__file__).resolve().parent
CLIENT = HERE / "connect_client.py"
README = HERE.parents[1] / "README.md"


def start_client(server: ConnectServer, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """The test client in a process group of its own; it reports into ``<log>.jsonl``."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, str(CLIENT), *args, "--remote", server.url, "--report", f"{log}.jsonl"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=driver_env(),
            start_new_session=True,
        )


def finish(proc: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> list[dict[str, Any]]:
    """Wait for the client; what it reported."""
    proc.wait(timeout=timeout)
    assert proc.returncode == 0, f"client failed ({proc.returncode}); see {log}:\n{log.read_text()[-3000:]}"
    return [json.loads(line) for line in Path(f"{log}.jsonl").read_text().splitlines()]


def stop_with_savepoint_cli(checkpoints: Path, job_id: str, target: Path, timeout: int) -> dict[str, Any]:
    """``statekit savepoint trigger --stop --json``, as an operator runs it: its answer (exit 0 asserted)."""
    done = subprocess.run(
        [sys.executable, "-m", "statekit", "savepoint", "trigger", str(checkpoints), "--job", job_id,
         "--target", str(target), "--stop", "--timeout", str(timeout), "--json"],
        capture_output=True, text=True, env=driver_env(), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def completed(checkpoints: Path, job_id: str) -> list[int]:
    """The ids of the job's completed checkpoints (those with ``_metadata``)."""
    return sorted(int(p.parent.name[4:]) for p in (checkpoints / job_id).glob("chk-*/_metadata"))


def subtasks_of_latest(checkpoints: Path, job_id: str) -> int:
    from statekit.checkpointing import load_checkpoint
    from statekit_storage import FileSystemCheckpointStorage

    storage = FileSystemCheckpointStorage(str(checkpoints))
    latest = storage.latest_checkpoint(job_id)
    assert latest is not None
    return len(load_checkpoint(storage, latest).metadata.operators["process"])


def run_records(checkpoints: Path, job_id: str) -> list[dict[str, Any]]:
    """The job's run records (``<job>/runs/run-<epoch>-<run id>.json``), oldest first."""
    paths = (checkpoints / job_id / "runs").glob("run-*.json")
    return [json.loads(p.read_text()) for p in sorted(paths, key=lambda p: int(p.name.split("-")[1]))]


def wait_for_run_end(checkpoints: Path, job_id: str) -> None:
    """Until the job's newest run record says the run ended: Spark ends the query's server-side
    process (whose handler records it) shortly after the query terminated, not before the client returns."""
    wait_until(
        lambda: "ended_ms" in run_records(checkpoints, job_id)[-1], f"job {job_id!r}'s run to record its end"
    )


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def wait_for(condition: Any, proc: subprocess.Popen[bytes], log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"client ended ({proc.returncode}); see {log}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out; see {log}"
        time.sleep(0.2)


def test_client_killed_then_restarted_with_another_parallelism_counts_exactly(
    connect_server: ConnectServer, tmp_path: Path
) -> None:
    """A client dies while its query runs on; a new client restarts the query rescaled, exactly."""
    records = make_records(800, seed=21)
    write_inputs(tmp_path / "in", records[:600], 3)
    checkpoints = tmp_path / "statekit"
    args = [
        "stream", "--input", str(tmp_path / "in"), "--out", str(tmp_path / "out"),
        "--spark-checkpoint", str(tmp_path / "spark"), "--job-id", "restarted",
        "--checkpoints-dir", str(checkpoints),
    ]  # fmt: skip

    # 1. A client starts a query that runs until stopped, and is killed after two batches.
    log = tmp_path / "client-1.log"
    first = start_client(connect_server, [*args, "--parallelism", "2", "--trigger", "continuous"], log)
    wait_for(lambda: latest_batch(checkpoints, "restarted") >= 1, first, log)
    kill_group(first)
    assert subtasks_of_latest(checkpoints, "restarted") == 2

    # 2. A new client starts the query again with three subtasks. Spark stops the run the dead client
    #    left on the server; the new run restores the state by key group. More logs arrive once it
    #    runs (so that the old run cannot take them), and it stops once it has processed them.
    log = tmp_path / "client-2.log"
    stop = tmp_path / "stop"
    more = ["--parallelism", "3", "--trigger", "continuous", "--stop-file", str(stop)]
    second = start_client(connect_server, [*args, *more], log)
    wait_for(lambda: Path(f"{log}.jsonl").exists(), second, log)
    write_inputs(tmp_path / "in", records[600:], 1, start=10)
    wait_for(lambda: latest_batch(checkpoints, "restarted") == 3, second, log)

    # 3. Issue 43: the query is idle (no new input, no micro-batch). A stop-with-savepoint request is
    #    answered by the watcher of the server-side process, with the newest checkpoint (no input came,
    #    so no batch ran to answer it), and the query stops: the client's loop ends without its stop file.
    answer = stop_with_savepoint_cli(checkpoints, "restarted", tmp_path / "sp", timeout=300)
    assert answer["status"] == "completed" and answer["batch_id"] == 3 and answer["stopped"], answer
    assert "done" in finish(second, log)[-1]
    assert not stop.exists()
    assert subtasks_of_latest(checkpoints, "restarted") == 3
    assert latest_batch(checkpoints, "restarted") == 3  # nothing processed after the savepoint

    from statekit.checkpointing import load_checkpoint
    from statekit_storage import FileSystemCheckpointStorage

    storage = FileSystemCheckpointStorage(str(checkpoints))
    saved = load_checkpoint(storage, answer["location"]).metadata
    assert saved.kind == "savepoint" and saved.properties["spark_batch_id"] == 3
    assert_exact_state(storage, "restarted", records)
    assert_exact_outputs(tmp_path / "out", records)
    # Stopped between micro-batches, the run records its end when Spark ends its server-side process.
    wait_for_run_end(checkpoints, "restarted")

    # 4. The query restarted on its location with no new input: Spark runs no batch, and the process it
    #    starts for the query (the driver side) answers a stop-with-savepoint at once all the same.
    log = tmp_path / "client-3.log"
    third = start_client(connect_server, [*args, *more], log)
    wait_for(lambda: Path(f"{log}.jsonl").exists(), third, log)
    idle = stop_with_savepoint_cli(checkpoints, "restarted", tmp_path / "sp-idle", timeout=240)
    assert idle["status"] == "completed" and idle["batch_id"] == 3 and idle["stopped"], idle
    assert "done" in finish(third, log)[-1]
    assert not stop.exists()
    assert latest_batch(checkpoints, "restarted") == 3 and not (tmp_path / "out" / "batch_id=4").exists()
    assert restored_state(storage, "restarted", location=idle["location"]) == model_state(records)


@pytest.mark.nightly  # two more Connect clients (~30 s): tests/spark covers the path in ci
def test_a_savepoint_restored_from_a_connect_client_continues_after_its_source_position(
    connect_server: ConnectServer, tmp_path: Path
) -> None:
    """A checkpoint converted into a savepoint carries its query's file-source position; a new query
    started from a Connect client with ``restore=`` on a new location reads only the files after it."""
    from statekit.checkpoints._convert import convert_to_savepoint
    from statekit_storage import FileSystemCheckpointStorage

    records = make_records(500, seed=23)
    write_inputs(tmp_path / "in", records[:300], 2)
    checkpoints = tmp_path / "statekit"
    base = ["stream", "--input", str(tmp_path / "in"), "--checkpoints-dir", str(checkpoints)]
    log = tmp_path / "client-1.log"
    first = [*base, "--out", str(tmp_path / "out-1"), "--spark-checkpoint", str(tmp_path / "spark-1")]
    finish(start_client(connect_server, [*first, "--job-id", "before"], log), log)
    storage = FileSystemCheckpointStorage(str(checkpoints))
    savepoint = convert_to_savepoint(storage, storage.latest_checkpoint("before"), str(tmp_path / "sp"))
    write_inputs(tmp_path / "in", records[300:], 1, start=2)  # after the savepoint
    log = tmp_path / "client-2.log"
    second = [*base, "--out", str(tmp_path / "out-2"), "--spark-checkpoint", str(tmp_path / "spark-2")]
    finish(start_client(connect_server, [*second, "--job-id", "after", "--restore", savepoint], log), log)
    assert_exact_state(storage, "after", records)


@pytest.mark.nightly  # three Connect clients (~40 s): tests/spark covers the driver's refusal in ci
def test_restore_latest_from_a_connect_client_on_a_relative_location_is_refused_at_its_first_batch(
    connect_server: ConnectServer, tmp_path: Path
) -> None:
    """``start(restore='latest')`` from a client given a relative location (the server's): the client
    cannot seed it with the checkpoint's source position, so Spark would read every file again; the
    server's driver refuses the first batch before any state is touched, saying what to give instead."""
    records = make_records(500, seed=25)
    write_inputs(tmp_path / "in", records[:300], 2)
    checkpoints = tmp_path / "statekit"
    base = ["stream", "--input", str(tmp_path / "in"), "--checkpoints-dir", str(checkpoints), "--job-id", "l"]
    log = tmp_path / "client-1.log"
    first = [*base, "--out", str(tmp_path / "out-1"), "--spark-checkpoint", str(tmp_path / "spark-1")]
    finish(start_client(connect_server, first, log), log)
    write_inputs(tmp_path / "in", records[300:], 1, start=2)
    relative = os.path.relpath(tmp_path / "spark-2", connect_server.workdir)
    log = tmp_path / "client-2.log"
    refused = start_client(
        connect_server,
        [*base, "--out", str(tmp_path / "out-2"), "--spark-checkpoint", relative, "--restore", "latest"],
        log,
    )
    assert refused.wait(timeout=300) != 0
    text = log.read_text()
    assert (
        "runs micro-batch 0 of query" in text and "absolute path or a URL that the client reaches" in text
    ), text[-3000:]
    assert_exact_state(FileSystemCheckpointStorage(str(checkpoints)), "l", records[:300])
    log = tmp_path / "client-3.log"
    third = [*base, "--out", str(tmp_path / "out-3"), "--spark-checkpoint", str(tmp_path / "spark-3")]
    finish(start_client(connect_server, [*third, "--restore", "latest"], log), log)
    assert_exact_state(FileSystemCheckpointStorage(str(checkpoints)), "l", records)


def test_server_killed_between_sink_and_checkpoint_then_restarted_counts_exactly(
    connect_server: ConnectServer, tmp_path: Path
) -> None:
    """The Connect server (the Spark driver) dies mid-query, at the worst moment; restarted, exact."""
    records = make_records(600, seed=22)
    write_inputs(tmp_path / "in", records, 3)
    checkpoints, markers = tmp_path / "statekit", tmp_path / "markers"
    markers.mkdir()
    args = [
        "stream", "--input", str(tmp_path / "in"), "--out", str(tmp_path / "out"),
        "--spark-checkpoint", str(tmp_path / "spark"), "--job-id", "server-killed",
        "--checkpoints-dir", str(checkpoints), "--hold-in-sink", "1", "--marker-dir", str(markers),
    ]  # fmt: skip

    log = tmp_path / "client-1.log"
    first = start_client(connect_server, args, log)
    # The sink of batch 1 wrote its outputs; checkpoint 2, which would hold batch 1, is not complete.
    wait_for(lambda: (markers / "in-sink-1").exists(), first, log)
    connect_server.restart()
    first.wait(timeout=120)  # its server is gone: the client fails
    assert first.returncode != 0
    assert completed(checkpoints, "server-killed")[-1] == 1
    assert (tmp_path / "out" / "batch_id=1" / "_SUCCESS").exists()

    log = tmp_path / "client-2.log"
    finish(start_client(connect_server, args, log), log)
    # Batches 1 and 2 again, then the end; read from the checkpoint, not its id: the new
    # query skips the one id the killed driver (which never recorded its end) might still write.
    assert latest_batch(checkpoints, "server-killed") == 2
    # The second run, done with its input, records its end; the first, killed in a batch, none.
    wait_for_run_end(checkpoints, "server-killed")
    assert ["ended_ms" in r for r in run_records(checkpoints, "server-killed")] == [False, True]

    from statekit_storage import FileSystemCheckpointStorage

    assert_exact_state(FileSystemCheckpointStorage(str(checkpoints)), "server-killed", records)
    assert_exact_outputs(tmp_path / "out", records)


def test_static_runs_savepoint_and_state_source_from_a_connect_client(
    connect_server: ConnectServer, tmp_path: Path
) -> None:
    """``run()``, ``write_savepoint`` and ``statekit-state`` from a Connect client."""
    records = make_records(400, seed=23)
    write_inputs(tmp_path / "in", records, 4)
    log = tmp_path / "client.log"
    args = [
        "static", "--input", str(tmp_path / "in"), "--job-id", "static",
        "--checkpoints-dir", str(tmp_path / "statekit"), "--savepoints-dir", str(tmp_path / "savepoints"),
    ]  # fmt: skip
    report = finish(start_client(connect_server, args, log), log)[-1]
    assert "error" not in report, report
    runs = report["runs"]
    assert [r["skipped"] for r in runs] == [False, False, True]
    assert sum(r["records"] for r in runs) == len(records)
    # No JVM gateway on a Connect client: no task locality, and BatchInfo says so.
    assert runs[0]["locality"].startswith("off: Spark Connect"), runs[0]["locality"]
    counts = Counter(r["url"] for r in records)
    assert report["read"] == dict(counts)
    assert Path(report["savepoint"]).is_dir()
    first_half = Counter(r["url"] for r in records[: len(records) // 2])
    assert report["from_savepoint"]["restored_from"] == report["savepoint"]
    assert report["after"] == {u: n + first_half[u] for u, n in counts.items()}
    # What Connect cannot do is refused before the query starts, saying what to use instead.
    refused = report["jobmanager_refused"]
    assert refused.startswith("ConfigurationError: a streaming query started from a Spark Connect client")
    assert "spark.statekit.checkpoints.dir" in refused


def readme_spark_code() -> str:
    """The README's Spark snippet, as written."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## On Spark\n") :]
    match = re.search(r"```python[^\n]*\n(.*?)```", section, re.DOTALL)
    assert match is not None
    return match.group(1)


def quickstart_function() -> str:
    """``CountPerUrl`` as the README's Quickstart defines it."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Quickstart\n") :]
    match = re.search(r"```python[^\n]*\n(.*?)```", section, re.DOTALL)
    assert match is not None
    code = match.group(1)
    start = code.index("class CountPerUrl")
    return code[start : code.index("\ncounts = ", start)]


def test_a_connect_servers_default_parallelism_is_read_from_a_scan(connect_server: ConnectServer) -> None:
    """Without ``statekit.parallelism`` or ``spark.default.parallelism`` (this server sets it, so the
    scan is called directly), a query's parallelism is the partitions of a ``range`` scan: the query
    runs on the server (Spark 4.3 refused its first form, an aggregate of ``spark_partition_id()``)."""
    script = (
        "from pyspark.sql import SparkSession\n"
        "from statekit.spark._sparkconf import scanned_parallelism\n"
        f"spark = SparkSession.builder.remote({connect_server.url!r}).getOrCreate()\n"
        "print(scanned_parallelism(spark))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=driver_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "2"  # local[2,4]: two cores, spark.default.parallelism 2


def test_the_readmes_spark_job_from_a_connect_client(connect_server: ConnectServer, tmp_path: Path) -> None:
    """The README's Spark snippet, changed only to a remote session, counts exactly across a restart.

    The server's working directory is not the client's, so the snippet's relative
    paths are made absolute (a Connect server resolves paths on its own side).
    """
    snippet = readme_spark_code()
    paths = ("logs/", "out/counts", "spark-checkpoints/urlcount", "state/spark", "state/spark-dead-letters")
    for rel in paths:
        assert f'"{rel}"' in snippet, rel
        snippet = snippet.replace(f'"{rel}"', f'"{tmp_path / rel}"')
    script = "\n".join(
        [
            "from statekit import KeyedProcessFunction, ValueStateDescriptor",
            "from pyspark.sql import SparkSession",
            f"spark = SparkSession.builder.remote({connect_server.url!r}).getOrCreate()",
            quickstart_function(),
            snippet,
            "query.processAllAvailable()",
            "query.stop()",
        ]
    )
    (tmp_path / "job.py").write_text(script)
    logs = tmp_path / "logs"
    records = make_records(600, seed=24)
    write_inputs(logs, records[:400], 2)
    for part in (records[:400], records):  # the second run: a new client, more logs
        done = subprocess.run(
            [sys.executable, "job.py"], cwd=tmp_path, env=driver_env(), capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        latest: dict[str, int] = {}
        table = ds.dataset(str(tmp_path / "out" / "counts"), format="parquet", partitioning="hive").to_table()
        for url, n in zip(table.column("url").to_pylist(), table.column("count").to_pylist()):
            latest[url] = max(latest.get(url, 0), n)
        assert latest == dict(Counter(r["url"] for r in part))
        if part is not records:
            write_inputs(logs, records[400:], 1, start=5)


@pytest.mark.nightly  # the README's Spark job from a Connect client (ci) takes the same path
def test_the_demo_from_a_connect_client(connect_server: ConnectServer, tmp_path: Path) -> None:
    """``statekit-urlcount demo --remote``: both runs on the Connect server, every check passes."""
    done = subprocess.run(
        [
            sys.executable, "-m", "statekit_urlcount", "demo", "--remote", connect_server.url,
            "--workdir", "demo", "--records", "2000", "--files", "1", "--more-records", "500",
            "--more-files", "1", "--urls", "100", "--no-progress",
        ],
        cwd=tmp_path, env=driver_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    printed = " ".join(done.stdout.split())  # rich wraps lines
    assert "all checks passed" in printed
    assert "✔ second run resumed from the checkpoint" in printed
    # The batches the server-side sink reported reached the client: one per run.
    assert "read 500 new lines in 1 batch" in printed


def late_args(tmp_path: Path, job_id: str) -> list[str]:
    return [
        "stream", "--input", str(tmp_path / "in"), "--out", str(tmp_path / "out"),
        "--spark-checkpoint", str(tmp_path / "spark"), "--job-id", job_id, "--trigger", "available-now",
        "--checkpoints-dir", str(tmp_path / "statekit"),
    ]  # fmt: skip


def test_a_query_whose_foreach_batch_process_starts_late_starts_all_the_same(
    connect_server: ConnectServer, tmp_path: Path
) -> None:
    """Spark gives the server-side process of a query's ``foreachBatch`` ten seconds (fixed) to connect
    back; on a busy server it takes longer and ``writeStream.start()`` fails before any query exists.
    statekit's ``start()`` starts it again, says so, and the query counts exactly."""
    records = make_records(300, seed=24)
    write_inputs(tmp_path / "in", records, 2)
    connect_server.delay_next_foreach_batch_process(11)
    log = tmp_path / "client.log"
    finish(start_client(connect_server, late_args(tmp_path, "late"), log), log)
    # The server's own configuration sets the attempts (ConnectServer.START_ATTEMPTS): the client reads it.
    said = log.read_text()
    assert f"did not connect back within Spark's ten seconds (attempt 1 of {START_ATTEMPTS}" in said
    storage = FileSystemCheckpointStorage(str(tmp_path / "statekit"))
    assert_exact_state(storage, "late", records)
    assert_exact_outputs(tmp_path / "out", records)


@pytest.mark.nightly  # three late processes (~40 s); the test above covers one in ci
def test_a_query_whose_foreach_batch_process_is_always_late_is_not_started_and_says_why(
    connect_server: ConnectServer, tmp_path: Path
) -> None:
    """After as many late processes as ``statekit.spark.connect.start-attempts`` allows (three here, set
    on the client's session over the server's eight), ``start()`` raises Spark's error with what happened
    and what to do; nothing was written, and the same start once the server keeps up counts exactly."""
    records = make_records(300, seed=25)
    write_inputs(tmp_path / "in", records, 2)
    connect_server.delay_next_foreach_batch_process(11, times=3)
    log = tmp_path / "client-1.log"
    attempts = ["--conf", "spark.statekit.spark.connect.start-attempts=3"]
    proc = start_client(connect_server, [*late_args(tmp_path, "always-late"), *attempts], log)
    proc.wait(timeout=300)
    said = log.read_text()
    assert proc.returncode != 0, said
    assert "Python worker failed to connect back" in said
    assert "statekit asked the Spark Connect server 3 times to start the query" in said, said[-3000:]
    assert "attempt 2 of 3" in said and "No query started and no state was touched" in said
    assert completed(tmp_path / "statekit", "always-late") == [] and not (tmp_path / "out").exists()
    log = tmp_path / "client-2.log"
    finish(start_client(connect_server, late_args(tmp_path, "always-late"), log), log)
    storage = FileSystemCheckpointStorage(str(tmp_path / "statekit"))
    assert_exact_state(storage, "always-late", records)
    assert_exact_outputs(tmp_path / "out", records)
