"""An operator's session, by hand (issue 43): every channel statekit reports on, side by side.

Not collected by pytest. Run it from the worktree, with nothing else of yours on Spark:

    PYSPARK_PYTHON=$PWD/.venv/bin/python SPARK_LOCAL_IP=127.0.0.1 \
        .venv/bin/python tests/spark/operators_session.py --dir /tmp/ops-session

It does what docs/spark.md and the README say an operator does: a standalone
cluster on 127.0.0.1 (a master and two workers, as processes), the README's
URL-count job over logs that ``statekit-urlcount generate`` writes (malformed
lines included), read with ``read_logs`` and ``parse_request``, on ``rocksdb``
with ``filesystem`` checkpoints, several micro-batches (a log file added
before each), Spark's Prometheus servlet and UI on, a
``StreamingQueryListener`` as docs/spark.md shows it, a savepoint triggered
with the CLI while the query runs and one of the idle query. Then it reads
every channel (the servlet, the REST API, the listener, ``BatchInfo``, the
Statekit tab in headless chromium, with a screenshot, the CLI on a terminal
and through a pipe, the state read back by ``SavepointReader``), compares
their numbers with each other and with a model computed from the log files,
writes ``<dir>/report.json`` and ``<dir>/statekit.png`` and prints a table.
Exit 1 when any number differs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
BIN = Path(sys.executable).parent
JOB = "urlcount"


def sh(
    *cmd: str, pipe: str | None = None, tty: bool = False, cwd: Path | None = None
) -> tuple[int, str, str]:
    """Run a command as an operator would: into a pipe (``| cat``/``| head``) or on a pseudo-terminal."""
    line = " ".join(f"'{c}'" for c in cmd)
    if pipe:
        line = f"{line} | {pipe}"
    if tty:  # script(1) gives the command a terminal, as an operator's shell does
        line = f"script -qec {json.dumps(line)} /dev/null"
    p = subprocess.run(
        ["bash", "-o", "pipefail", "-c", line], capture_output=True, text=True, cwd=cwd, timeout=900
    )
    return p.returncode, p.stdout, p.stderr


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as r:
        return str(r.read().decode())


def model(logs: Path) -> tuple[Counter[str], int]:
    """The counts per URL and the malformed lines, from the log files themselves."""
    from statekit_urlcount import parse_request

    counts: Counter[str] = Counter()
    bad = 0
    for f in sorted(logs.iterdir()):
        for line in f.read_bytes().decode().splitlines():
            try:
                counts[parse_request(line)["url"]] += 1
            except Exception:
                bad += 1
    return counts, bad


def prometheus(text: str, job: str = JOB, op: str = "process") -> dict[str, float]:
    """The statekit source's values in the servlet's text: ``{metric: value}`` (``_Value``/``_Count``)."""
    out: dict[str, float] = {}
    pat = re.compile(rf"^metrics_\w+?_driver_statekit_{job}_{op}_(\w+?)_(Value|Count)\{{[^}}]*\}} (\S+)$")
    for line in text.splitlines():
        m = pat.match(line)
        if m:
            out[m.group(1)] = float(m.group(3))
    return out


def last_id(listed: Any) -> int:
    """The newest checkpoint's id in ``statekit checkpoints list --json``'s answer."""
    rows = listed if isinstance(listed, list) else listed.get("checkpoints", [])
    return max(int(c.get("checkpoint_id", c.get("id", -1))) for c in rows)


def main() -> int:  # noqa: C901, PLR0915 - one walk, in the order an operator takes it
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--records", type=int, default=4000)
    args = parser.parse_args()
    work: Path = args.dir.resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    os.chdir(work)  # the README's relative paths
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    report: dict[str, Any] = {"mismatches": []}
    bad: list[str] = report["mismatches"]

    def same(what: str, **channels: Any) -> None:
        values = list(channels.values())
        ok = all(v == values[0] for v in values)
        report.setdefault("compared", []).append({"what": what, **{k: repr(v) for k, v in channels.items()}})
        print(
            ("ok   " if ok else "DIFF ") + what + ": " + ", ".join(f"{k}={v!r}" for k, v in channels.items())
        )
        if not ok:
            bad.append(what)

    def generate(seed: int) -> None:
        rc, out, err = sh(
            str(BIN / "statekit-urlcount"),
            "generate",
            "--out",
            "logs",
            "--records",
            str(args.records),
            "--files",
            "1",
            "--urls",
            "300",
            "--malformed",
            "0.01",
            "--seed",
            str(seed),
            cwd=work,
        )
        assert rc == 0, err
        print(out.strip())

    from cluster import cluster_app_builder, standalone_cluster

    generate(1)
    with standalone_cluster(work / "cluster") as cluster:
        from pyspark.sql.streaming import StreamingQueryListener

        spark = (
            cluster_app_builder(cluster.master_url, "statekit-operators-session")
            .config("spark.ui.enabled", "true")
            .config("spark.ui.port", "0")
            # docs/spark.md, "The metrics system", as written
            .config("spark.ui.prometheus.enabled", "true")
            .config(
                "spark.metrics.conf.*.sink.prometheusServlet.class",
                "org.apache.spark.metrics.sink.PrometheusServlet",
            )
            .config("spark.metrics.conf.*.sink.prometheusServlet.path", "/metrics/prometheus")
            .config("spark.metrics.namespace", "urlcount")
            .config("spark.statekit.backend", "rocksdb")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("WARN")
        ui = spark.sparkContext.uiWebUrl
        app = spark.sparkContext.applicationId
        assert ui is not None
        report["ui"], report["app"] = ui, app
        print("UI", ui, "app", app)

        from statekit.spark import BatchInfo, batch_info_for, keyed, read_logs
        from statekit_urlcount import CountPerUrl, parse_request

        # The README's job, as written (its config lines, read_logs, write_files).
        spark.conf.set("spark.statekit.checkpoints.dir", "state/spark")
        spark.conf.set("spark.statekit.parallelism", "4")
        spark.conf.set("spark.statekit.bad-records.policy", "dead-letter")
        spark.conf.set("spark.statekit.bad-records.dead-letter-path", "state/spark-dead-letters")
        spark.conf.set("spark.statekit.savepoints.dir", str(work / "savepoints"))

        heard: list[tuple[int, Any]] = []

        class StateSize(StreamingQueryListener):  # docs/spark.md's listener, keeping what it prints
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                info = batch_info_for(event.progress)
                if info is not None and info.checkpoint_stats is not None:
                    print(
                        "listener:", event.progress.batchId, info.records, info.checkpoint_stats.state_entries
                    )
                    heard.append((event.progress.batchId, info))

        spark.streams.addListener(StateSize())
        import logging

        log_lines: list[str] = []

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                log_lines.append(record.getMessage())

        logging.getLogger("statekit").setLevel(logging.INFO)  # docs/spark.md: one line per batch at INFO
        logging.getLogger("statekit").addHandler(Keep())
        batches: list[BatchInfo] = []

        def start() -> Any:
            logs = read_logs(spark, "logs/", parse=parse_request, schema="url string, request string")
            return (
                keyed(logs, key="url")
                .process(
                    CountPerUrl, output_schema="url string, count long", job_id=JOB, on_batch=batches.append
                )
                .write_files("out/counts")
                .start(
                    checkpoint_location="spark-checkpoints/urlcount", trigger={"processingTime": "3 seconds"}
                )
            )

        query = start()

        def wait_batches(n: int, timeout: float = 900) -> None:
            deadline = time.monotonic() + timeout
            while len([b for b in batches if b.records or b.bad_records]) < n:
                if query.exception() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"waiting for {n} batches: {query.exception()}")
                time.sleep(0.5)

        wait_batches(1)
        for i in range(2, args.batches):
            generate(i)
            wait_batches(i)
        # A savepoint while it runs: the CLI waits for the next micro-batch, which a new file brings.
        running: dict[str, Any] = {}

        def trigger(key: str) -> None:
            t0 = time.monotonic()
            running[key] = sh(
                str(BIN / "statekit"), "savepoint", "trigger", "state/spark", "--job", JOB, "--json", cwd=work
            )
            running[key + "_seconds"] = time.monotonic() - t0

        # Triggered while a micro-batch runs, it is answered after that batch's checkpoint.
        generate(args.batches)
        deadline = time.monotonic() + 300
        while not query.status["isTriggerActive"] and time.monotonic() < deadline:
            time.sleep(0.05)
        t = threading.Thread(target=trigger, args=("running",))
        t.start()
        wait_batches(args.batches)
        t.join(timeout=900)
        print("savepoint (running):", running["running"], f"{running['running_seconds']:.1f}s")
        # The idle query: no new input. Flink's answer is immediate.
        time.sleep(8)
        trigger("idle")
        print("savepoint (idle):", running["idle"], f"{running['idle_seconds']:.1f}s")
        report["savepoints"] = running
        if running["running"][0] != 0 or running["idle"][0] != 0:
            bad.append("a savepoint trigger failed")
        if running["idle_seconds"] > 60:
            bad.append(f"the idle query's savepoint took {running['idle_seconds']:.0f} s")
        # A savepoint that fails: a file is in the way of its target.
        (work / "not-a-dir").write_text("x")
        running["failing"] = sh(
            str(BIN / "statekit"),
            "savepoint",
            "trigger",
            "state/spark",
            "--job",
            JOB,
            "--target",
            str(work / "not-a-dir" / "sp"),
            "--json",
            cwd=work,
        )
        print("savepoint (failing):", running["failing"])
        # The query stopped and started again in the same driver: its first batch restores.
        query.stop()
        report["restart_after_batch"] = len(batches)
        query = start()
        generate(args.batches + 1)
        wait_batches(args.batches + 1)
        time.sleep(5)  # the listener's last event

        # ---- every channel, while the query and its UI are up
        prom = get(ui.rstrip("/") + "/metrics/prometheus/")
        (work / "prometheus.txt").write_text(prom)
        execs = get(ui.rstrip("/") + "/metrics/executors/prometheus/")
        (work / "prometheus-executors.txt").write_text(execs)
        jobs = json.loads(get(f"{ui.rstrip('/')}/api/v1/applications/{app}/jobs"))
        page_url = ui.rstrip("/") + "/statekit/"
        from test_spark_ui import Cells, chromium

        dom = chromium(work / "profile-dom", "--dump-dom", page_url).stdout.decode()
        (work / "statekit.html").write_text(dom)
        chromium(work / "profile-shot", f"--screenshot={work / 'statekit.png'}", page_url)
        last_progress = query.lastProgress

        cli: dict[str, Any] = {}
        for name, cmd in {
            "list": ["checkpoints", "list", "state/spark", "--job", JOB],
            "history": ["checkpoints", "history", "state/spark", "--job", JOB],
            "verify": ["checkpoints", "verify", "state/spark", "--job", JOB],
        }.items():
            cli[name + "_tty"] = sh(str(BIN / "statekit"), *cmd, tty=True, cwd=work)
            cli[name + "_cat"] = sh(str(BIN / "statekit"), *cmd, pipe="cat", cwd=work)
            cli[name + "_head"] = sh(str(BIN / "statekit"), *cmd, pipe="head -3", cwd=work)
            cli[name + "_json"] = sh(str(BIN / "statekit"), *cmd, "--json", cwd=work)
        newest = json.loads(cli["list_json"][1])
        chk = str(work / "state/spark" / JOB / f"chk-{last_id(newest)}")
        cli["inspect_cat"] = sh(str(BIN / "statekit"), "checkpoints", "inspect", chk, pipe="cat", cwd=work)
        cli["inspect_json"] = sh(str(BIN / "statekit"), "checkpoints", "inspect", chk, "--json", cwd=work)
        report["cli"] = cli

        query.stop()
        from statekit.spark import register_state_source

        register_state_source(spark)  # docs/spark.md, "Reading state as a DataFrame"
        source_rows = (
            spark.read.format("statekit-state")
            .option("checkpointsDir", "state/spark")
            .option("jobId", JOB)
            .option("state", "count")
            .load()
            .collect()
        )
        spark.stop()

    # ---- the numbers, channel by channel
    counts, malformed = model(work / "logs")
    real = [b for b in batches if not b.skipped]
    last = real[-1]
    stats = last.checkpoint_stats
    timing = last.checkpoint_timing
    assert stats is not None and timing is not None
    report["batches"] = [dataclasses.asdict(b) | {"subtask_locations": {}} for b in real]
    m = prometheus(prom)
    report["prometheus"] = m
    if not m:
        bad.append("no statekit metric in the Prometheus servlet")
    page = Cells()
    page.feed(dom)
    state_row = {
        k: v for row in page.tables.get("state", []) for k, v in row.items() if not k.startswith("@")
    }
    shown = {int(r["batch"]): r for r in page.tables.get("batches", []) if "batch" in r}
    history_rows = {
        int(r["@data-checkpoint"]): r for r in page.tables.get("history", []) if "@data-checkpoint" in r
    }
    hist = json.loads(cli["history_json"][1])
    hist_rows = hist if isinstance(hist, list) else hist.get("attempts", hist)
    hist_by_id = {int(a["checkpoint_id"]): a for a in hist_rows if a["kind"] == "checkpoint"}
    saved = {int(a["checkpoint_id"]): a for a in hist_rows if a["kind"] == "savepoint"}
    heard_by_batch = {bid: info for bid, info in heard}

    # the model
    from statekit.state_processor import SavepointReader

    reader = SavepointReader.latest(str(work / "state/spark"), JOB)
    table = reader.read_table("process", "count").to_pylist()
    read_back = {r["key"]: r["value"] for r in table}
    same("counts per URL, state vs model", state=read_back == dict(counts), model=True)
    same(
        "state entries",
        model=len(counts),
        state_read_back=len(read_back),
        batch_info=stats.state_entries,
        prometheus=int(m.get("state_entries", -1)),
        page=int(state_row.get("state_entries", -1)),
        listener=heard_by_batch[last.batch_id].checkpoint_stats.state_entries
        if last.batch_id in heard_by_batch
        else None,
    )
    same(
        "counts per URL, state source vs model",
        source={r["key"]: r["value"] for r in source_rows} == dict(counts),
        model=True,
    )
    logged = {
        int(re.search(r" batch=(\d+)", x).group(1)): dict(kv.split("=", 1) for kv in x.split()[2:])  # type: ignore[union-attr]
        for x in log_lines
        if x.startswith("statekit checkpoint ")
    }
    report["log_lines"] = log_lines
    for sp_key in ("running", "idle"):
        answer = json.loads(running[sp_key][1])
        sp = SavepointReader.open(answer["location"])
        entries = sum(op.entries for op in sp.operators() if op.id == "process")
        b = next(b for b in real if b.checkpoint_id == answer["checkpoint_id"])
        same(
            f"savepoint ({sp_key}): entries, vs its checkpoint's",
            savepoint=entries,
            batch_info=b.checkpoint_stats.state_entries if b.checkpoint_stats else None,
        )
        same(
            f"savepoint ({sp_key}): batch",
            answer=answer["batch_id"],
            batch_info=b.batch_id,
            history=saved.get(answer["checkpoint_id"], {}).get("batch_id"),
        )
        report[f"savepoint_{sp_key}_batch"] = (answer["checkpoint_id"], answer["batch_id"])
    same(
        "state entries exact",
        batch_info=int(stats.state_entries_exact),
        prometheus=int(m.get("state_entries_exact", -1)),
        page=int(ex.group(1))
        if (ex := re.search(r'data-exact="(\d)" data-field="state_entries"', dom))
        else "absent",
    )
    same(
        "state bytes",
        batch_info=stats.state_bytes,
        prometheus=int(m.get("state_bytes", -1)),
        page=int(state_row.get("state_bytes", -1)),
        history=hist_by_id[last.checkpoint_id or -1]["full_bytes"] - stats.operator_state_bytes,
        cli_list=int(
            next(line for line in cli["list_cat"][1].splitlines()[1:]).split("\t")[6].replace(",", "")
        ),
    )
    letters = sum(
        1 for f in (work / "state/spark-dead-letters").rglob("*.json") for _ in f.read_text().splitlines()
    )
    # The metrics' counters are totals since the query (re)started; the model's, since the job began.
    since = [b for b in batches[report["restart_after_batch"] :] if not b.skipped]
    same(
        "dead letters, total",
        model=malformed,
        letter_files=letters,
        batch_info=sum(b.bad_records for b in real),
    )
    same(
        "dead letters, since the restart (the page's batches)",
        batch_info=sum(b.bad_records for b in since),
        page=sum(int(r["dead_letters"]) for r in shown.values()),
    )
    same(
        "micro-batches on the page (since the query started)",
        batch_info=[b.batch_id for b in since],
        page=sorted(shown),
    )
    same(
        "dead letters, since the restart",
        batch_info=sum(b.bad_records for b in since),
        prometheus=int(m.get("dead_letters_total", -1)),
    )
    same("records, total", model=sum(counts.values()), batch_info=sum(b.records for b in real))
    same(
        "records, since the restart",
        batch_info=sum(b.records for b in since),
        prometheus=int(m.get("records_in_total", -1)),
    )
    same("batches, since the restart", batch_info=len(since), prometheus=int(m.get("batches_total", -1)))
    failing = json.loads(running["failing"][1]) if running["failing"][1].strip().startswith("{") else {}
    failed = [a for a in hist_rows if a["status"] == "failed"]
    same(
        "last failure (a failed savepoint)",
        cli_answer=failing.get("failure"),
        history=failed[-1]["failure"] if failed else None,
        page=page.failure.strip().removeprefix(f"savepoint of checkpoint {failing.get('checkpoint_id')}: "),
    )
    report["failing_savepoint"] = running["failing"]
    for b in real:
        row = shown.get(b.batch_id, {})
        h = hist_by_id.get(b.checkpoint_id or -1, {})
        li = heard_by_batch.get(b.batch_id)
        t = b.checkpoint_timing
        lg = logged.get(b.batch_id, {})
        on_page: dict[str, Any] = {} if b not in since else {"page": int(row.get("dead_letters", -1))}
        same(
            f"batch {b.batch_id}: dead letters",
            batch_info=b.bad_records,
            **on_page,
            listener=li.bad_records if li else None,
            log=int(lg.get("dead_letters", -1)),
        )
        same(
            f"batch {b.batch_id}: state entries",
            batch_info=b.checkpoint_stats.state_entries if b.checkpoint_stats else None,
            log=int(lg.get("state_entries", -1)),
            listener=li.checkpoint_stats.state_entries if li and li.checkpoint_stats else None,
        )
        if t is not None:
            same(
                f"batch {b.batch_id}: checkpoint_seconds / duration (log vs BatchInfo)",
                batch_info=(round(b.checkpoint_seconds, 6), round(t.duration, 6)),
                log=(
                    float(lg.get("checkpoint_seconds", -1)),
                    float(lg.get("checkpoint_duration_seconds", -1)),
                ),
            )
        same(
            f"batch {b.batch_id}: reused/handed off/restored locally/remotely",
            batch_info=(b.reused_subtasks, b.handed_off, b.restored_locally, b.restored_remotely),
            **(
                {}
                if b not in since
                else {
                    "page": tuple(
                        int(row.get(k, -1))
                        for k in (
                            "subtasks_reused",
                            "subtasks_handed_off",
                            "subtasks_restored_locally",
                            "subtasks_restored_remotely",
                        )
                    )
                }
            ),
            listener=(li.reused_subtasks, li.handed_off, li.restored_locally, li.restored_remotely)
            if li
            else None,
        )
        if t is not None:
            ms = {k: round(getattr(t, k) * 1000) for k in ("snapshot", "upload", "metadata", "duration")}
            hr = history_rows.get(b.checkpoint_id or -1, {})
            same(
                f"batch {b.batch_id}: checkpoint phases ms",
                batch_info=ms,
                page={k: int(hr.get(f"{k}_ms", -1)) for k in ms},
                history={k: h.get(f"{k}_ms") for k in ms},
            )
    t = timing
    same(
        "last batch: checkpoint seconds (snapshot+upload+metadata)",
        batch_info=round(last.checkpoint_seconds, 6),
        prometheus=m.get("checkpoint_seconds"),
        page=round(float(shown.get(last.batch_id, {}).get("checkpoint_seconds", -1)), 6),
    )
    same(
        "last batch: phase seconds",
        batch_info=[round(t.snapshot, 6), round(t.upload, 6), round(t.metadata, 6), round(t.duration, 6)],
        prometheus=[
            m.get(k)
            for k in (
                "checkpoint_snapshot_seconds",
                "checkpoint_upload_seconds",
                "checkpoint_metadata_seconds",
                "checkpoint_duration_seconds",
            )
        ],
    )
    same(
        "newest checkpoint",
        batch_info=last.checkpoint_id,
        prometheus=int(m.get("checkpoint_id", -1)),
        page=int(state_row.get("checkpoint_id", -1)),
        cli_list=last_id(newest),
    )
    inspected = json.loads(cli["inspect_json"][1])["operators"]["process"]
    same(
        "newest checkpoint: entries, bytes, written, referenced",
        batch_info=(stats.state_entries, stats.state_bytes, stats.bytes_written, stats.bytes_referenced),
        cli_inspect=(
            inspected["entries"],
            inspected["bytes"],
            inspected["uploaded_bytes"],
            inspected["referenced_bytes"],
        ),
        prometheus=tuple(
            int(m.get(k, -1))
            for k in (
                "state_entries",
                "state_bytes",
                "checkpoint_bytes_written",
                "checkpoint_bytes_referenced",
            )
        ),
    )
    same(
        "newest checkpoint: exact",
        batch_info=stats.state_entries_exact,
        cli_inspect=not inspected["entries_estimated"],
    )
    descriptions = [j.get("description", "") for j in jobs]
    same(
        "REST API job descriptions name the batches",
        rest=sorted({d.split(":")[0] for d in descriptions if d.startswith("statekit")})[-1:],
        batch_info=[f"statekit {JOB} batch {last.batch_id}"],
    )
    report["last_progress_state_operators"] = last_progress["stateOperators"] if last_progress else None
    report["executors_statekit_lines"] = [x for x in execs.splitlines() if "statekit" in x]
    (work / "report.json").write_text(json.dumps(report, indent=1, default=str))
    print(
        f"\n{len(bad)} mismatches: {bad}\nreport: {work / 'report.json'}, screenshot: {work / 'statekit.png'}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
