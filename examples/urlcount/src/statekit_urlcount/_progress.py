"""The live progress display and the final table, drawn with rich.

On a terminal the display redraws in place; elsewhere (a pipe, CI) it prints
one line per micro-batch instead, and a status line while a batch runs long.
"""

from __future__ import annotations

import contextlib
import time
from types import TracebackType
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from statekit.errors import StateError

from ._job import BatchStats, JobSettings, StateSummary, checkpoint_info

__all__ = ["STATUS_EVERY", "ProgressDisplay", "top_urls_table", "top_windows_table"]

#: Seconds between status lines off a terminal while a batch runs.
STATUS_EVERY = 15.0


def _age(timestamp_ms: int) -> str:
    if not timestamp_ms:
        return ""
    seconds = max(0.0, time.time() - timestamp_ms / 1000)
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


class ProgressDisplay:
    """Batches, records/s, state size and the last checkpoint of a running job.

    Use as a context manager around :func:`~statekit_urlcount.run_job`, passing
    :meth:`on_batch` and :meth:`on_poll` as its callbacks.
    """

    def __init__(
        self, console: Console, settings: JobSettings, *, title: str = "", enabled: bool = True
    ) -> None:
        self.console = console
        self.settings = settings
        self.title = title or f"statekit-urlcount: {settings.logs_dir}"
        self.enabled = enabled
        self.batches = 0
        self.records = 0
        self.requests = 0
        self.malformed = 0
        self.late = 0
        self.windows = 0
        self.last: BatchStats | None = None
        self.status = "starting"
        self.checkpoint = StateSummary()
        self._t0 = time.perf_counter()
        self._live: Live | None = None
        self._noted = 0.0  # when the last status line was printed off a terminal

    def __enter__(self) -> ProgressDisplay:
        self._t0 = time.perf_counter()
        if self.enabled and self.console.is_terminal:
            self._live = Live(self.render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._refresh_checkpoint()
        self.status = "failed" if exc is not None else "done"
        if self._live is not None:
            self._live.update(self.render())
            self._live.__exit__(exc_type, exc, tb)
            self._live = None

    def _refresh_checkpoint(self) -> None:
        # Retention may remove a checkpoint between listing and reading it: keep the previous one.
        with contextlib.suppress(StateError, OSError):
            self.checkpoint = checkpoint_info(self.settings)

    @property
    def rate(self) -> float:
        """Records per second since the display started."""
        return self.records / max(time.perf_counter() - self._t0, 1e-9)

    def on_batch(self, stats: BatchStats) -> None:
        """Records a finished micro-batch."""
        self.batches += 1
        self.records += stats.records
        self.requests += stats.requests
        self.malformed += stats.malformed
        self.late += stats.late
        self.windows += stats.windows
        self.last = stats
        self._refresh_checkpoint()
        if self._live is not None:
            self._live.update(self.render())
        elif self.enabled:
            self.console.print(self.line(), highlight=False)

    def on_poll(self, query: Any) -> None:
        """Picks up the query's status message between batches.

        Off a terminal (a pipe, CI) it prints a status line now and then, so
        a long batch does not look like a hang: when the message changes,
        and every :data:`STATUS_EVERY` seconds.
        """
        before = self.status
        try:
            self.status = str(query.status.get("message", "")) or self.status
        except Exception:  # noqa: BLE001 - a display must never fail the job
            return
        if self._live is not None:
            self._live.update(self.render())
        elif self.enabled:
            now = time.perf_counter()
            if self.status != before or now - self._noted >= STATUS_EVERY:
                self._noted = now
                elapsed = now - self._t0
                self.console.print(
                    f"{elapsed:.0f} s: {self.status} ({self.batches} batches done)", highlight=False
                )

    def line(self) -> str:
        """One line for non-terminal output."""
        cp = self.checkpoint
        last_rate = self.last.records / self.last.seconds if self.last and self.last.seconds else 0.0
        return (
            f"batch {self.last.batch_id if self.last else '-'}: {self.records:,} records "
            f"({self.malformed:,} malformed{self._windowed_part()}), {self.rate:,.0f} records/s "
            f"(last batch {last_rate:,.0f}), "
            f"state {cp.entries:,} entries, checkpoint {cp.checkpoint_id or '-'}"
        )

    def _windowed_part(self) -> str:
        if self.last is None or self.last.watermark is None:
            return ""
        return f", {self.late:,} late, {self.windows:,} windows emitted"

    def render(self) -> Panel:
        """The display's current picture."""
        cp = self.checkpoint
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        last_rate = self.last.records / self.last.seconds if self.last and self.last.seconds else 0.0
        grid.add_row("batches", f"{self.batches}" + (f" (last id {self.last.batch_id})" if self.last else ""))
        grid.add_row(
            "records",
            f"{self.records:,}  ({self.requests:,} requests, {self.malformed:,} malformed → dead letters)",
        )
        if self.last is not None and self.last.watermark is not None:
            grid.add_row("windows", f"{self.windows:,} emitted, {self.late:,} late lines → late output")
        grid.add_row("records/s", f"{self.rate:,.0f}  (last batch {last_rate:,.0f})")
        grid.add_row("state size", f"{cp.entries:,} entries" if cp.location else "-")
        grid.add_row(
            "last checkpoint",
            f"chk-{cp.checkpoint_id}  {_age(cp.timestamp_ms)}\n{cp.location}" if cp.location else "none yet",
        )
        grid.add_row("status", Text(self.status, style="dim"))
        return Panel(grid, title=self.title, expand=False)


def top_urls_table(state: StateSummary, n: int = 10, *, title: str = "") -> Group:
    """A table of the ``n`` most requested URLs from the job's state, with totals."""
    total = sum(state.counts.values())
    table = Table(title=title or f"Top {n} URLs")
    table.add_column("#", justify="right")
    table.add_column("url")
    table.add_column("requests", justify="right")
    table.add_column("share", justify="right")
    for rank, (url, count) in enumerate(state.top(n), 1):
        table.add_row(str(rank), url, f"{count:,}", f"{100 * count / total:.1f}%" if total else "-")
    footer = Text(
        f"{total:,} requests over {len(state.counts):,} URLs; {state.malformed:,} malformed lines "
        f"(dead-lettered); read from statekit checkpoint {state.location}",
        style="dim",
    )
    return Group(table, footer)


def top_windows_table(windows: list[dict[str, Any]], n: int = 10, *, title: str = "") -> Group:
    """A table of the ``n`` busiest (URL, window) rows of the windowed job's output, with totals."""
    from ._windowed import format_time_ms

    total = sum(int(w["requests"]) for w in windows)
    table = Table(title=title or f"Top {n} URL-minutes")
    table.add_column("#", justify="right")
    table.add_column("url")
    table.add_column("window (UTC)")
    table.add_column("requests", justify="right")
    busiest = sorted(windows, key=lambda w: (-int(w["requests"]), w["window_start"], w["url"]))[:n]
    for rank, w in enumerate(busiest, 1):
        span = f"{format_time_ms(w['window_start'])} - {format_time_ms(w['window_end'])[11:]}"
        table.add_row(str(rank), w["url"], span, f"{int(w['requests']):,}")
    footer = Text(f"{len(windows):,} windows emitted so far, {total:,} requests in them", style="dim")
    return Group(table, footer)
