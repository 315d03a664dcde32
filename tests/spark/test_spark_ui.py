"""The Statekit tab of the Spark UI, in a real headless browser (issue 43).

A driver of its own (``ui_driver.py``, the UI on 127.0.0.1) counts URLs over
three micro-batches and keeps its UI up; Debian's ``chromium``, headless,
loads ``/statekit/``: the page it rendered (its DOM) shows the numbers of
every ``BatchInfo`` the driver got, and its screenshot is a page, not a blank
or an error (the test reads the PNG's pixels). Nightly: a driver and a
browser of their own take about a minute.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import time
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from sparkutil import driver_env, write_inputs

from jobs import make_records

pytestmark = pytest.mark.nightly

HERE = Path(__file__).resolve().parent
RECORDS = make_records(600, urls=25)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WIDTH, HEIGHT = 1400, 2400


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """Headless Debian chromium with a fresh profile and nothing of its own talking to the network."""
    assert CHROMIUM is not None
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
        f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}",
    ]  # fmt: skip
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, timeout=180, check=True)


class Cells(HTMLParser):
    """The number cells of the page: per table id, rows of ``{data-field: data-value}`` and row attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[dict[str, str]]] = {}
        self.failure = ""
        self._table: str | None = None
        self._in_failure = False
        self.jobs: list[dict[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "div" and "statekit-job" in a.get("class", ""):
            self.jobs.append(a)
        elif tag == "table" and "id" in a:
            self._table = a["id"]
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append({f"@{k}": v for k, v in a.items()})
        elif tag == "td" and self._table is not None and "data-field" in a and self.tables[self._table]:
            self.tables[self._table][-1][a["data-field"]] = a.get("data-value", "-")
        elif tag == "pre" and a.get("id") == "last-failure":
            self._in_failure = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table = None
        elif tag == "pre":
            self._in_failure = False

    def handle_data(self, data: str) -> None:
        if self._in_failure:
            self.failure += data


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the unfiltered rows of an 8-bit RGB or RGBA PNG (what chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    height = depth = color = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert depth == 8 and color in (2, 6), (depth, color)
    bpp = 3 if color == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytes(width * bpp)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, ul = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + left) & 0xFF
            elif f == 2:
                line[i] = (line[i] + up) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif f == 4:
                p = left + up - ul
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - ul)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else ul)) & 0xFF
        rows.append(bytes(line))
        prev = rows[-1]
    return width, height, [bytes(r[i] for i in range(len(r)) if i % bpp < 3) for r in rows]


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_the_statekit_tab_shows_what_batch_info_says(tmp_path: Path) -> None:
    write_inputs(tmp_path / "in", RECORDS, 3)
    report, done = tmp_path / "report.json", tmp_path / "done"
    driver = subprocess.Popen(
        [sys.executable, str(HERE / "ui_driver.py"), "--input", str(tmp_path / "in"),
         "--spark-checkpoint", str(tmp_path / "spark"), "--checkpoints-dir", str(tmp_path / "statekit"),
         "--job-id", "urls", "--report", str(report), "--done", str(done)],
        env=driver_env(),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not report.exists() and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert report.exists(), f"the driver ended ({driver.returncode}) without a report"
        r = json.loads(report.read_text())
        url = r["ui"].rstrip("/") + "/statekit/"
        dom = chromium(tmp_path / "profile-dom", "--dump-dom", url).stdout.decode()
        shot = tmp_path / "statekit.png"
        chromium(tmp_path / "profile-shot", f"--screenshot={shot}", url)
    finally:
        done.touch()
        driver.wait(timeout=120)
    batches: list[dict[str, Any]] = r["batches"]
    assert [b["records"] for b in batches] == [200, 200, 200]

    page = Cells()
    page.feed(dom)
    assert [(j["data-job"], j["data-operator"]) for j in page.jobs] == [("urls", "process")]
    assert ">Statekit<" in dom  # Spark's tab bar names the tab
    last = batches[-1]
    stats = last["checkpoint_stats"]
    state = {k: v for row in page.tables["state"] for k, v in row.items() if not k.startswith("@")}
    for field, key in [("checkpoint_id", "checkpoint_id"), ("state_entries", "state_entries"),
                       ("state_bytes", "state_bytes"), ("operator_state_bytes", "operator_state_bytes"),
                       ("checkpoint_bytes_written", "bytes_written")]:  # fmt: skip
        assert int(state[field]) == stats[key], field
    assert f'data-exact="{int(stats["state_entries_exact"])}"' in dom  # the "(exact)" label, for scripts
    # Per state where BatchInfo knows it: canonical snapshots and the heap's base and deltas (this driver's
    # default), not RocksDB's or LMDB's native ones (no table then).
    per_state = {row["@data-state"]: row for row in page.tables.get("states", []) if "@data-state" in row}
    assert set(per_state) == {"bytes", "count", "last_methods"}
    assert {n: int(row["entries"]) for n, row in per_state.items()} == {
        n: s["entries"] for n, s in stats["states"].items()
    }
    assert {n: int(row["bytes"]) for n, row in per_state.items()} == {
        n: s["bytes"] for n, s in stats["states"].items()
    }

    shown = {int(row["batch"]): row for row in page.tables["batches"] if "batch" in row}
    assert sorted(shown) == [b["batch_id"] for b in batches]
    for b in batches:
        row = shown[b["batch_id"]]
        assert int(row["checkpoint_id"]) == b["checkpoint_id"]
        assert (int(row["records_in"]), int(row["records_out"])) == (b["records"], b["outputs"])
        assert int(row["dead_letters"]) == b["bad_records"]
        assert int(row["subtasks_reused"]) == b["reused_subtasks"]
        assert int(row["subtasks_handed_off"]) == b["handed_off"]
        assert int(row["subtasks_restored_locally"]) == b["restored_locally"]
        assert int(row["subtasks_restored_remotely"]) == b["restored_remotely"]
        assert int(row["bytes_downloaded"]) == b["bytes_downloaded"]
        assert float(row["checkpoint_seconds"]) == b["checkpoint_seconds"]
        assert float(row["checkpoint_duration_seconds"]) == b["checkpoint_timing"]["duration"]

    history = {
        int(row["@data-checkpoint"]): row for row in page.tables["history"] if "@data-checkpoint" in row
    }
    for b in batches:
        row, t = history[b["checkpoint_id"]], b["checkpoint_timing"]
        ms = {k: round(t[k] * 1000) for k in ("snapshot", "upload", "metadata", "duration")}
        assert {k: int(row[f"{k}_ms"]) for k in ms} == ms
        assert int(row["batch_id"]) == b["batch_id"]
        assert (
            int(row["full_bytes"])
            == b["checkpoint_stats"]["state_bytes"] + b["checkpoint_stats"]["operator_state_bytes"]
        )
    assert page.failure.strip() == "none"

    # The screenshot is the page: the size asked for, Spark's page frame and text, not one colour.
    width, height, rows = png_pixels(shot.read_bytes())
    assert (width, height) == (WIDTH, HEIGHT)
    colours = {row[i : i + 3] for row in rows[:900:3] for i in range(0, len(row), 9)}
    assert len(colours) > 20, "the screenshot is blank or nearly so"
    top = {rows[y][x * 3 : x * 3 + 3] for y in range(0, 60, 2) for x in range(0, width, 7)}
    assert len(top) > 3, "no header bar at the top of the screenshot"
