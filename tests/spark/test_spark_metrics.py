"""Where a Spark query's statekit numbers show up: the metrics system, job descriptions, the log line.

The in-process tests use the shared session (its UI is off): they read the
metrics source from the driver's metrics system through Py4J, and the job
descriptions the sink's jobs and the tasks run under (what the UI and its REST
API show). The nightly test starts a driver of its own with the UI and
Spark's Prometheus servlet on (127.0.0.1) and scrapes them.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming import StreamingQueryListener
from sparkutil import OUTPUT, driver_env, run_to_end, stream_of, write_inputs

from jobs import CountUrls, make_records
from statekit.cli._cli import main as cli_main
from statekit.spark import BatchInfo, batch_info_for, keyed
from statekit.spark._jvm import load_helper_class
from statekit.spark._metrics import invoke_static
from statekit.state_processor import SavepointReader

HERE = Path(__file__).resolve().parent
RECORDS = make_records(900, urls=40)
STATES = ("bytes", "count", "last_methods")


def configure(session: Any, values: dict[str, Any]) -> None:
    for k, v in values.items():
        session.conf.set(k, str(v))


class DescribedCount(CountUrls):
    """:class:`CountUrls` noting, once per task, the description of the Spark job that runs it."""

    def __init__(self, notes: str) -> None:
        self.notes = notes

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        from pyspark import TaskContext

        tc = TaskContext.get()
        with open(self.notes, "a") as f:
            f.write(f"{tc.getLocalProperty('spark.job.description') if tc else None}\n")


def start(session: Any, tmp_path: Path, job_id: str, infos: list[BatchInfo], notes: list[str]) -> Any:
    """The URL count over three files (three micro-batches), run to its end.

    ``notes`` gets the job description each sink call sees; ``tmp_path/tasks.txt`` the tasks'.
    """
    write_inputs(tmp_path / "in", RECORDS, 3)

    def sink(df: Any, _: int) -> None:
        notes.append(df.sparkSession.sparkContext.getLocalProperty("spark.job.description"))
        df.count()

    processed = (
        keyed(stream_of(session, tmp_path / "in"), "url")
        .process(
            functools.partial(DescribedCount, str(tmp_path / "tasks.txt")), OUTPUT, job_id=job_id,
            on_batch=infos.append,
        )
        .foreach_batch(sink)
    )  # fmt: skip
    return run_to_end(processed, tmp_path / "spark")


def entries_read(location: str) -> dict[str, int]:
    """(key, namespace) entries per state, as the state processor reads them from the checkpoint."""
    with SavepointReader.open(location) as reader:
        out = {}
        for name in STATES:
            table = reader.read_table("process", name)
            cols = [c for c in ("key", "namespace") if c in table.column_names]
            out[name] = len(set(zip(*(table.column(c).to_pylist() for c in cols))))
        return out


def source_values(session: Any, name: str) -> dict[str, Any]:
    """The gauges' values and counters' counts of metrics source ``name`` in the driver's metrics system."""
    cls = load_helper_class(session, "StatekitSource")
    values = invoke_static(session.sparkContext, cls, "values", name)
    return {str(k): values[k] for k in values}


def log_lines(caplog: pytest.LogCaptureFixture, job_id: str) -> list[dict[str, str]]:
    """The key=value fields of each ``statekit checkpoint`` line of ``job_id``."""
    out = []
    for rec in caplog.records:
        text = rec.getMessage()
        if rec.name == "statekit" and text.startswith(f"statekit checkpoint job={job_id} "):
            out.append(dict(kv.split("=", 1) for kv in text.split()[2:]))
    return out


class BatchInfoListener(StreamingQueryListener):
    """Looks up statekit's BatchInfo of every progress event it is given, as a user's listener would."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int, BatchInfo | None]] = []

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        p = event.progress
        self.seen.append((str(p.id), p.batchId, p.numInputRows, batch_info_for(p)))

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def test_each_batch_reaches_the_metrics_system_the_log_and_the_ui(
    session: Any,
    tmp_path: Path,
    job_id: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure(
        session,
        {
            "spark.statekit.checkpoints.dir": tmp_path / "statekit",
            "spark.statekit.backend": "heap",
            # Canonical files: each state's entries and bytes by name, every byte the checkpoint's own
            # (the heap's native deltas count entries exactly too: tests/test_runner_metrics.py).
            "spark.statekit.checkpoint.format": "canonical",
            "spark.statekit.parallelism": 2,
            "spark.statekit.checkpoints.retained": 3,
        },
    )
    infos: list[BatchInfo] = []
    notes: list[str] = []
    listener = BatchInfoListener()
    session.streams.addListener(listener)
    try:
        with caplog.at_level(logging.INFO, logger="statekit"):
            query = start(session, tmp_path, job_id, infos, notes)
        deadline = time.monotonic() + 60  # the listener bus delivers after the batch, asynchronously
        while len(listener.seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        session.streams.removeListener(listener)
    assert [i.records for i in infos] == [300, 300, 300]

    # A StreamingQueryListener finds each progress event's BatchInfo by the event's ids.
    assert [(q, b) for q, b, _, _ in listener.seen] == [(str(query.id), b) for b in range(3)]
    assert [found for _, _, _, found in listener.seen] == infos
    assert all(rows == found.records for _, _, rows, found in listener.seen if found is not None)
    assert batch_info_for(query_id=str(query.id), batch_id=2) is infos[2]
    assert batch_info_for(query_id=str(query.id), batch_id=3) is None

    # The state's size, from the checkpoint's metadata, is what the state processor reads there.
    for info in infos:
        stats = info.checkpoint_stats
        assert stats is not None and info.location is not None
        read = entries_read(info.location)
        assert stats.state_entries_exact
        assert {n: s.entries for n, s in stats.states.items()} == read
        assert stats.state_entries == sum(read.values())
        assert stats.state_bytes > 0 and stats.bytes_written >= stats.state_bytes
        assert stats.bytes_referenced == 0  # canonical: every file is the checkpoint's own
        assert info.checkpoint_seconds > 0

    # The metrics source holds the last batch; its counters the whole run.
    last = infos[-1]
    assert last.checkpoint_stats is not None
    values = source_values(session, f"statekit.{job_id}.process")
    assert values["state_entries"] == last.checkpoint_stats.state_entries == 3 * 40
    assert values["state.count.entries"] == 40
    assert values["state_entries_exact"] == 1
    assert values["records_in"] == 300 and values["records_in_total"] == 900
    assert values["batches_total"] == 3 and values["batch"] == last.batch_id
    assert values["checkpoint_id"] == last.checkpoint_id
    assert values["checkpoint_bytes_written"] == last.checkpoint_stats.bytes_written

    # One log line per batch, with the metrics' names and values.
    lines = log_lines(caplog, job_id)
    assert [int(f["batch"]) for f in lines] == [0, 1, 2]
    for f, info in zip(lines, infos):
        assert info.checkpoint_stats is not None
        assert int(f["records_in"]) == info.records
        assert int(f["state_entries"]) == info.checkpoint_stats.state_entries
        assert int(f["state.last_methods.entries"]) == info.checkpoint_stats.states["last_methods"].entries
        assert f["checkpoint_id"] == str(info.checkpoint_id)
    assert int(lines[-1]["records_in"]) == values["records_in"]

    # A checkpoint's time, one meaning everywhere (issue 43): its phases in BatchInfo, the metrics
    # source, the log line, and the history as `statekit checkpoints history --json` prints it.
    capsys.readouterr()
    assert cli_main(["checkpoints", "history", str(tmp_path / "statekit"), "--job", job_id, "--json"]) == 0
    history = {a["checkpoint_id"]: a for a in json.loads(capsys.readouterr().out)}
    for f, info in zip(lines, infos):
        t = info.checkpoint_timing
        assert t is not None and t.snapshot > 0 and t.upload > 0 and t.metadata > 0
        assert info.checkpoint_seconds == pytest.approx(t.snapshot + t.upload + t.metadata)
        assert t.duration > info.phases["tasks"]  # the whole batch: its tasks, sink and _metadata
        a = history[info.checkpoint_id]
        assert {k: a[k] for k in ("snapshot_ms", "upload_ms", "metadata_ms", "duration_ms")} == t.to_ms()
        assert a["batch_id"] == info.batch_id
        for phase in ("snapshot", "upload", "metadata", "duration"):
            assert float(f[f"checkpoint_{phase}_seconds"]) == round(getattr(t, phase), 6)
        assert float(f["checkpoint_seconds"]) == round(info.checkpoint_seconds, 6)
    assert last.checkpoint_timing is not None
    assert values["checkpoint_upload_seconds"] == pytest.approx(round(last.checkpoint_timing.upload, 6))
    assert values["checkpoint_duration_seconds"] == pytest.approx(round(last.checkpoint_timing.duration, 6))

    # The Spark UI names statekit's jobs (the description travels with every job and task).
    # The sink's count runs the tasks (one job per batch), so they see the same description.
    assert notes == [f"statekit {job_id} batch {b}: tasks and sink" for b in range(3)]
    tasks = set((tmp_path / "tasks.txt").read_text().splitlines())
    assert tasks <= {f"statekit {job_id} batch {b}: tasks and sink" for b in range(3)} and tasks

    # What Spark does not let a foreachBatch sink report (docs/spark.md says so): if Spark
    # starts to, this fails and the docs must change.
    progress = json.loads(query.lastProgress.json)
    assert progress.get("observedMetrics", {}) == {} and progress["stateOperators"] == []
    assert progress["sink"]["numOutputRows"] == -1


def test_native_snapshots_count_their_entries_exactly(
    session: Any, tmp_path: Path, job_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    configure(
        session,
        {
            "spark.statekit.checkpoints.dir": tmp_path / "statekit",
            "spark.statekit.backend": "rocksdb",
            "spark.statekit.parallelism": 2,
            "spark.statekit.checkpoints.retained": 3,
        },
    )
    infos: list[BatchInfo] = []
    with caplog.at_level(logging.INFO, logger="statekit"):
        start(session, tmp_path, job_id, infos, [])
    for info in infos:
        stats = info.checkpoint_stats
        assert stats is not None
        assert stats.state_entries_exact and stats.states == {}  # counted on write (issue 43)
        assert info.location is not None and stats.state_entries == sum(entries_read(info.location).values())
        # Every byte of the snapshot is either written now or referenced from before.
        assert stats.bytes_written + stats.bytes_referenced == stats.state_bytes + stats.operator_state_bytes
    assert [f["state_entries_exact"] for f in log_lines(caplog, job_id)] == ["1", "1", "1"]
    values = source_values(session, f"statekit.{job_id}.process")
    assert values["state_entries_exact"] == 1
    assert not [k for k in values if k.startswith("state.")]


def test_metrics_off_leave_spark_and_the_log_alone(
    session: Any, tmp_path: Path, job_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    configure(
        session,
        {
            "spark.statekit.checkpoints.dir": tmp_path / "statekit",
            "spark.statekit.parallelism": 2,
            "spark.statekit.metrics.enabled": "false",
        },
    )
    infos: list[BatchInfo] = []
    notes: list[str] = []
    with caplog.at_level(logging.INFO, logger="statekit"):
        start(session, tmp_path, job_id, infos, notes)
    assert [i.records for i in infos] == [300, 300, 300]
    assert infos[-1].checkpoint_stats is not None  # BatchInfo carries the numbers either way
    assert log_lines(caplog, job_id) == []
    assert source_values(session, f"statekit.{job_id}.process") == {}
    assert not [d for d in notes if d and d.startswith("statekit ")]


def _samples(text: str, name: str) -> dict[str, float]:
    """Prometheus samples whose name contains ``name``, by their full name."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\S+)\{[^}]*\} (\S+)$", line)
        if m and name in m.group(1):
            out[m.group(1)] = float(m.group(2))
    return out


@pytest.mark.nightly
def test_prometheus_servlet_and_rest_api_show_statekit(tmp_path: Path) -> None:
    """A driver of its own, UI on 127.0.0.1, the default backend and checkpoint format (the heap's base
    and deltas): the scrape's state entries match the checkpoint, every state's as well."""
    write_inputs(tmp_path / "in", RECORDS, 3)
    report = tmp_path / "report.json"
    subprocess.run(
        [sys.executable, str(HERE / "metrics_driver.py"), "--input", str(tmp_path / "in"),
         "--spark-checkpoint", str(tmp_path / "spark"), "--checkpoints-dir", str(tmp_path / "statekit"),
         "--job-id", "urls", "--report", str(report)],
        env=driver_env(), check=True, timeout=600,
    )  # fmt: skip
    r = json.loads(report.read_text())
    assert r["ui"].startswith("http://127.0.0.1:")
    prefix = "metrics_stk_driver_statekit_urls_process_"
    gauges = _samples(r["prometheus"], prefix)
    last = r["batches"][-1]
    read = entries_read(last["location"])
    assert gauges[prefix + "state_entries_Value"] == sum(read.values())
    for name in STATES:  # the per-state gauges of the Prometheus example in docs/spark.md
        assert gauges[prefix + f"state_{name}_entries_Value"] == read[name]
        assert gauges[prefix + f"state_{name}_bytes_Value"] > 0
    per_state_bytes = sum(gauges[prefix + f"state_{name}_bytes_Value"] for name in STATES)
    assert per_state_bytes < gauges[prefix + "state_bytes_Value"]  # the files' headers and index besides
    assert gauges[prefix + "records_in_total_Count"] == len(RECORDS)
    described = {j.get("description") for j in r["jobs"]}
    assert {f"statekit urls batch {b}: tasks and sink" for b in range(3)} <= described
    assert not any(str(d).endswith(": routing") for d in described)  # the routing values need no job
    assert r["listener_progress"] and all(p.get("observedMetrics", {}) == {} for p in r["listener_progress"])


def test_a_failing_metrics_source_is_turned_off_not_the_batch(recwarn: pytest.WarningsRecorder) -> None:
    """An update that fails after the checkpoint completed warns once and turns the source off."""
    from statekit.spark._metrics import QueryMetrics
    from statekit.spark._ui import QueryPage

    class Broken:
        calls = 0

        def update(self, text: str) -> None:
            Broken.calls += 1
            raise RuntimeError("py4j: connection reset")

    metrics = object.__new__(QueryMetrics)
    metrics.enabled, metrics.job_id, metrics.operator_id = True, "j", "process"
    metrics._source, metrics.status = Broken(), "on"
    metrics.page = QueryPage("j", "process", None)  # no UI page: only the source fails
    info = BatchInfo(0, 1, "/chk-1", False, None, 2, records=5)
    with pytest.warns(RuntimeWarning, match="updating its metrics source failed .*connection reset"):
        metrics.report(info)
    metrics.report(info)  # off now: no second call, no second warning
    assert Broken.calls == 1 and metrics.status.startswith("off: py4j")
