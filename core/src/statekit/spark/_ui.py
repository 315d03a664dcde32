"""statekit's page in the Spark UI: the "Statekit" tab, as Flink's web UI has a Checkpoints tab.

Per job and operator the page shows what an operator reads there in Flink:
the state (entries, exact or estimated, and bytes, per state when known),
the checkpoint history with each attempt's phases and sizes (the job's
:class:`~statekit.checkpoints._history.CheckpointHistory`, the numbers of
``statekit checkpoints history``), how each recent micro-batch came by its
state (reused, handed off, restored locally or remotely, bytes downloaded)
with its records and dead letters, and the last failure.

The driver renders its job's section here, as well-formed XHTML whose
number cells carry ``data-field`` names (those of the metrics and
``BatchInfo``), and hands it to ``StatekitUiTab`` of the JVM helper
(``jvm/``) in one Py4J call after each batch and after a failed one; the tab
(attached once per application to the driver's ``SparkUI``, at
``/statekit/``) puts the sections inside Spark's page frame. Nothing is
served when the UI is off (``spark.ui.enabled=false``), on Spark Connect (no
JVM gateway), or when the helper does not load (the metrics' status says
why).
"""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

from ..checkpoints._history import FAILED, CheckpointAttempt
from ._batchinfo import BatchInfo

__all__ = ["QueryPage", "render_section"]

#: Micro-batches the page lists, newest first.
RECENT_BATCHES = 20
#: Checkpoint attempts the page lists, newest first (the history keeps more).
RECENT_ATTEMPTS = 30


_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _e(value: object) -> str:
    """``value`` as XHTML text: escaped, without the characters XML 1.0 cannot hold."""
    return escape(_NOT_XML.sub("\ufffd", str(value)), quote=True)


def _num(field: str, value: int | float | None, text: str | None = None) -> str:
    """A number cell named by ``field``; ``-`` where there is no value."""
    if value is None:
        return f'<td data-field="{field}">-</td>'
    shown = text if text is not None else (f"{value:,}" if isinstance(value, int) else f"{value:.3f}")
    return f'<td data-field="{field}" data-value="{_e(value)}">{_e(shown)}</td>'


def _table(caption: str, table_id: str, head: Sequence[str], rows: Iterable[str]) -> str:
    cells = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join(rows) or f'<tr><td colspan="{len(head)}">none yet</td></tr>'
    return (
        f'<h5>{_e(caption)}</h5><table id="{table_id}" class="table table-bordered table-sm">'
        f"<thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"
    )


def _when(ms: int) -> str:
    """A time as ``statekit checkpoints history`` prints it: UTC, named (not the driver's zone)."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def _state(info: BatchInfo) -> str:
    stats = info.checkpoint_stats
    if stats is None:
        return "<p>No checkpoint yet.</p>"
    label = "exact" if stats.state_entries_exact else "estimate (native snapshot: the engine's count)"
    summary = (
        '<table id="state" class="table table-bordered table-sm"><tbody>'
        f"<tr><th>checkpoint</th>{_num('checkpoint_id', stats.checkpoint_id)}</tr>"
        f"<tr><th>state entries ({_e(label)})</th>"
        # data-exact: the metric state_entries_exact, for scripts (the heading says it in words)
        + _num("state_entries", stats.state_entries).replace(
            "<td ", f'<td data-exact="{int(stats.state_entries_exact)}" ', 1
        )
        + "</tr>"
        f"<tr><th>keyed state bytes</th>{_num('state_bytes', stats.state_bytes)}</tr>"
        f"<tr><th>operator state bytes</th>{_num('operator_state_bytes', stats.operator_state_bytes)}</tr>"
        f"<tr><th>bytes written by the checkpoint</th>"
        f"{_num('checkpoint_bytes_written', stats.bytes_written)}</tr>"
        f"<tr><th>bytes referenced from earlier ones</th>"
        f"{_num('checkpoint_bytes_referenced', stats.bytes_referenced)}</tr>"
        "</tbody></table>"
    )
    per_state = [
        f'<tr data-state="{_e(name)}"><td>{_e(name)}</td>'
        f"{_num('entries', size.entries)}{_num('bytes', size.bytes)}</tr>"
        for name, size in stats.states.items()
    ]
    if not per_state:
        return summary
    return summary + _table("Per state", "states", ("state", "entries", "bytes"), per_state)


def _history_rows(attempts: Sequence[CheckpointAttempt]) -> list[str]:
    rows = []
    for a in list(reversed(attempts))[:RECENT_ATTEMPTS]:
        s = a.sizes
        where = a.failure if a.status == FAILED and a.failure else a.location
        rows.append(
            f'<tr data-checkpoint="{a.checkpoint_id}" data-kind="{_e(a.kind)}">'
            f"<td>{a.checkpoint_id}</td><td>{_e(a.kind)}</td><td>{_e(a.status)}</td>"
            f"<td>{_e(_when(a.trigger_ms))}</td>"
            + _num("duration_ms", a.duration_ms)
            + _num("snapshot_ms", a.snapshot_ms)
            + _num("upload_ms", a.upload_ms)
            + _num("metadata_ms", a.metadata_ms)
            + _num("full_bytes", s.full)
            + _num("written_bytes", s.written)
            + _num("uploaded_bytes", s.uploaded)
            + _num("referenced_bytes", s.referenced)
            + _num("batch_id", a.batch_id)
            + f"<td>{_e(where)}</td></tr>"
        )
    return rows


def _batch_rows(batches: Sequence[BatchInfo]) -> list[str]:
    rows = []
    for b in reversed(batches):
        t = b.checkpoint_timing
        rows.append(
            f'<tr data-batch="{b.batch_id}">'
            + _num("batch", b.batch_id)
            + _num("checkpoint_id", b.checkpoint_id)
            + (
                '<td data-field="skipped">skipped (done before)</td>'
                if b.skipped
                else f'<td data-field="restored_from">{_e(b.restored_from or "-")}</td>'
            )
            + _num("records_in", b.records)
            + _num("records_out", b.outputs)
            + _num("dead_letters", b.bad_records)
            + _num("late_records", b.late_records)
            + _num("subtasks_reused", b.reused_subtasks)
            + _num("subtasks_handed_off", b.handed_off)
            + _num("subtasks_restored_locally", b.restored_locally)
            + _num("subtasks_restored_remotely", b.restored_remotely)
            + _num("bytes_downloaded", b.bytes_downloaded)
            + _num("checkpoint_seconds", b.checkpoint_seconds if not b.skipped else None)
            + _num("checkpoint_duration_seconds", t.duration if t is not None else None)
            + f'<td data-field="locality">{_e(b.locality)}</td>'
            + "</tr>"
        )
    return rows


def render_section(
    job_id: str,
    operator_id: str,
    batches: Sequence[BatchInfo],
    attempts: Sequence[CheckpointAttempt],
    failure: str | None,
) -> str:
    """One job's operator on the page: well-formed XHTML (the tab parses it as XML)."""
    last = next((b for b in reversed(batches) if not b.skipped), None)
    failed = [a for a in attempts if a.status == FAILED and a.failure]
    last_failure = failure
    if last_failure is None and failed:
        a = failed[-1]
        what = "checkpoint" if a.kind == "checkpoint" else f"{a.kind} of checkpoint"
        last_failure = f"{what} {a.checkpoint_id}: {a.failure}"
    history_head = (
        "id", "kind", "status", "triggered", "duration ms", "snapshot ms", "upload ms", "metadata ms",
        "bytes", "written", "uploaded", "referenced", "batch", "location or failure",
    )  # fmt: skip
    batch_head = ("batch", "checkpoint", "started from", "records in", "records out", "dead letters", "late",
                  "reused", "handed off", "restored locally", "restored remotely", "bytes downloaded",
                  "checkpoint s", "duration s", "locality")  # fmt: skip
    parts = [
        f'<div class="statekit-job" data-job="{_e(job_id)}" data-operator="{_e(operator_id)}">',
        f"<h4>job {_e(job_id)} · operator {_e(operator_id)}</h4>",
        "<h5>State</h5>",
        _state(last) if last is not None else "<p>No micro-batch processed yet.</p>",
        _table("Checkpoint history (newest first)", "history", history_head, _history_rows(attempts)),
        _table(
            "Micro-batches since the query started (newest first)",
            "batches",
            batch_head,
            _batch_rows(batches),
        ),
        "<h5>Last failure</h5>",
        f'<pre id="last-failure">{_e(last_failure or "none")}</pre>',
        "</div>",
    ]
    return "".join(parts)


class QueryPage:
    """One query run's section of the Statekit tab: what it keeps, and publishing it to the JVM.

    ``publish`` is the Py4J call of ``StatekitUiTab.publish`` (None: the page is off).
    """

    def __init__(self, job_id: str, operator_id: str, publish: Any) -> None:
        self.job_id, self.operator_id = job_id, operator_id
        self._publish = publish
        self._batches: collections.deque[BatchInfo] = collections.deque(maxlen=RECENT_BATCHES)
        self._failure: str | None = None

    def batch(self, info: BatchInfo, attempts: Sequence[CheckpointAttempt]) -> None:
        """After a micro-batch (processed or skipped)."""
        self._batches.append(info)
        self._show(attempts)

    def failed(self, batch_id: int, error: BaseException, attempts: Sequence[CheckpointAttempt]) -> None:
        """After a micro-batch failed with ``error``."""
        self._failure = f"batch {batch_id}: {type(error).__name__}: {error}"[:4000]
        self._show(attempts)

    def _show(self, attempts: Sequence[CheckpointAttempt]) -> None:
        if self._publish is None:
            return
        section = render_section(self.job_id, self.operator_id, list(self._batches), attempts, self._failure)
        self._publish(f"{self.job_id}\x00{self.operator_id}", section)
