"""The Statekit tab's section, rendered without Spark: well-formed XHTML whatever it holds (issue 43).

The JVM tab parses each section as XML (``scala.xml.XML.loadString``), so a
job id, a path or a failure message with markup or control characters must
come out escaped; number cells carry the metrics' names. The browser test
(``test_spark_ui.py``, nightly) checks the page in Spark's UI.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from statekit.checkpoints._history import AttemptSizes, CheckpointAttempt
from statekit.checkpoints._timing import CheckpointTiming
from statekit.runtime._metrics import CheckpointStats, StateSize
from statekit.spark import BatchInfo
from statekit.spark._ui import QueryPage, render_section


def test_a_section_is_well_formed_and_names_its_numbers() -> None:
    stats = CheckpointStats(7, state_entries=12, state_bytes=345, states={"count": StateSize(12, 300)})
    info = BatchInfo(
        6, 7, "/ck/<job>&/chk-7", False, "/ck/chk-6", 2, records=40, bad_records=3, reused_subtasks=2,
        checkpoint_seconds=0.25, checkpoint_stats=stats,
        checkpoint_timing=CheckpointTiming(0.1, 0.1, 0.05, 1.5),
    )  # fmt: skip
    attempts = [
        CheckpointAttempt(7, "checkpoint", "completed", 1_700_000_000_000, 1500, "/ck/chk-7",
                          AttemptSizes(400, 400), batch_id=6, snapshot_ms=100, upload_ms=100, metadata_ms=50),
        CheckpointAttempt(8, "checkpoint", "failed", 1_700_000_001_000, 20, "/ck/chk-8",
                          failure="OSError: disk <full> & \x00\x07 gone"),
    ]  # fmt: skip
    published: list[tuple[str, str]] = []
    page = QueryPage('job "<x>"', "process", lambda k, x: published.append((k, x)))
    page.batch(info, attempts)
    page.failed(7, RuntimeError("boom <b>\x01"), attempts)
    assert [k for k, _ in published] == ['job "<x>"\x00process'] * 2
    root = ET.fromstring(published[-1][1])  # well-formed, as the JVM parses it
    assert root.get("data-job") == 'job "<x>"'
    cells = {td.get("data-field"): td.get("data-value") for td in root.iter("td") if td.get("data-field")}
    assert cells["state_entries"] == "12" and cells["dead_letters"] == "3" and cells["subtasks_reused"] == "2"
    entries = next(td for td in root.iter("td") if td.get("data-field") == "state_entries")
    assert entries.get("data-exact") == "1"  # the metric state_entries_exact; the heading says "(exact)"
    assert cells["snapshot_ms"] == "100" and cells["checkpoint_duration_seconds"] == "1.5"
    failure = next(e for e in root.iter("pre") if e.get("id") == "last-failure").text or ""
    assert failure.startswith("batch 7: RuntimeError: boom <b>")
    history = [tr for tr in root.iter("tr") if tr.get("data-checkpoint")]
    assert [tr.get("data-checkpoint") for tr in history] == ["8", "7"]  # newest first
    assert "disk <full> &" in "".join(history[0].itertext())
    # The words and times of the CLI's history: UTC, named, whatever the driver's zone.
    assert "2023-11-14 22:13:20 UTC" in "".join(history[1].itertext())
    heads = ["".join(th.itertext()) for th in root.iter("th")]
    assert {"duration ms", "duration s", "checkpoint s", "started from"} <= set(heads)


def test_the_last_failure_names_a_failed_savepoint_as_one() -> None:
    attempts = [
        CheckpointAttempt(4, "checkpoint", "completed", 1_700_000_000_000, 900, "/ck/chk-4",
                          AttemptSizes(10, 10)),
        CheckpointAttempt(4, "savepoint", "failed", 1_700_000_001_000, 2, "-",
                          failure="CheckpointError: full"),
    ]  # fmt: skip
    root = ET.fromstring(render_section("j", "process", [], attempts, None))
    failure = next(e for e in root.iter("pre") if e.get("id") == "last-failure").text
    assert failure == "savepoint of checkpoint 4: CheckpointError: full"


def test_a_section_before_any_batch_says_so() -> None:
    root = ET.fromstring(render_section("j", "process", [], [], None))
    assert "No micro-batch processed yet." in "".join(root.itertext())
