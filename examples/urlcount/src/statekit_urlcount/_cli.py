"""The ``statekit-urlcount`` command: ``generate``, ``run``, ``windowed`` and ``demo``.

::

    statekit-urlcount generate --out logs --records 100000
    statekit-urlcount run --logs logs --state state
    statekit-urlcount windowed --logs logs --state windowed-state --delay "10 seconds"
    statekit-urlcount demo                 # generate, run, add logs, resume, check
    statekit-urlcount demo --remote sc://localhost:15002   # the same on a Spark Connect server
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from statekit.errors import StateError

from ._generate import GenerateResult, generate_logs
from ._job import JobSettings, RunReport, run_job
from ._progress import ProgressDisplay, top_urls_table, top_windows_table
from ._remote import remote_spark_session, run_job_remote
from ._session import active_spark_session, local_spark_session
from ._windowed import (
    PendingWindows,
    WindowedSettings,
    format_time_ms,
    pending_windows,
    read_output,
    run_windowed_job,
)

__all__ = ["DemoReport", "build_parser", "demo", "main", "next_file_index", "windowed_summary"]

_DEMO_MARKER = ".statekit-urlcount-demo"


def next_file_index(logs_dir: str) -> int:
    """The index after the highest ``access-NNNNN.log`` in ``logs_dir`` (0 when there is none)."""
    if not os.path.isdir(logs_dir):
        return 0
    indexes = [
        int(name[7:12])
        for name in os.listdir(logs_dir)
        if name.startswith("access-") and name.endswith(".log") and name[7:12].isdigit()
    ]
    return max(indexes, default=-1) + 1


def _add_generate_options(p: argparse.ArgumentParser, *, records: int, files: int) -> None:
    p.add_argument(
        "--records", type=_non_negative, default=records, help=f"log lines to write (default {records:,})"
    )
    p.add_argument(
        "--files", type=_positive, default=files, help=f"files to spread them over (default {files})"
    )
    p.add_argument("--urls", type=_positive, default=1000, help="distinct URLs (default 1000)")
    p.add_argument(
        "--malformed", type=_fraction, default=0.001, help="fraction of malformed lines (default 0.001)"
    )
    p.add_argument(
        "--late",
        type=_fraction,
        default=0.01,
        help="fraction of lines stamped 1-5 minutes late (default 0.01)",
    )
    p.add_argument("--seed", type=int, default=42, help="random seed (default 42)")


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def _non_negative(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {n}")
    return n


def _fraction(text: str) -> float:
    x = float(text)
    if not 0 <= x <= 1:
        raise argparse.ArgumentTypeError(f"a fraction of the lines, from 0 to 1 (0.01 is 1 %), not {text}")
    return x


def _add_run_options(
    p: argparse.ArgumentParser, *, windowed: bool = False, lines_per_trigger: int | None = None
) -> None:
    if windowed:  # the windowed job reads through Spark's text source, the others through read_logs
        p.add_argument(
            "--files-per-trigger",
            type=_positive,
            default=1,
            help="log files per micro-batch: Spark's file source reads them (maxFilesPerTrigger; default 1)",
        )
    else:
        default = "all new lines in one batch" if lines_per_trigger is None else f"{lines_per_trigger:,}"
        p.add_argument(
            "--lines-per-trigger",
            type=_positive,
            default=lines_per_trigger,
            metavar="N",
            help="log lines per micro-batch at most: statekit's log source reads the files, so a batch "
            f"ends after N lines, wherever they are (default: {default})",
        )
    p.add_argument("--parallelism", type=int, default=2, help="statekit subtasks (default 2)")
    p.add_argument(
        "--backend",
        default="heap",
        help="statekit state backend by name: heap (default), rocksdb, or any installed one",
    )
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--top", type=int, default=10, help="URLs in the final table (default 10)")
    p.add_argument("--no-progress", action="store_true", help="no live display")


def _add_vectorized_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--vectorized",
        action="store_true",
        help="count with the vectorized function (a URL's lines of a micro-batch at once); same output",
    )


def _add_remote_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--remote",
        default=None,
        metavar="sc://HOST:PORT",
        help="run on a Spark Connect server instead of a local Spark (needs statekit[spark-connect]; "
        "paths are the server's, and the server's Python needs statekit and statekit-urlcount)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``statekit-urlcount``."""
    parser = argparse.ArgumentParser(
        prog="statekit-urlcount",
        description="Count nginx access-log requests per URL on Spark, with statekit state.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    g = sub.add_parser("generate", help="write deterministic access logs (JSON lines)")
    g.add_argument("--out", default="logs", help="directory to write into (default ./logs)")
    g.add_argument(
        "--first-file",
        type=_non_negative,
        default=None,
        help="index of the first file (default: after the files already there, so new files are added)",
    )
    _add_generate_options(g, records=100_000, files=4)

    r = sub.add_parser("run", help="count requests per URL over a directory of logs, resuming if possible")
    r.add_argument("--logs", default="logs", help="directory of log files (default ./logs)")
    r.add_argument(
        "--state", default="urlcount-state", help="checkpoints and output (default ./urlcount-state)"
    )
    r.add_argument("--output", default=None, help="counts and dead letters (default <state>/output)")
    _add_run_options(r)
    _add_vectorized_option(r)
    _add_remote_option(r)

    w = sub.add_parser(
        "windowed",
        help="count requests per URL per minute of @timestamp, late lines to a side output, resuming",
    )
    w.add_argument("--logs", default="logs", help="directory of log files (default ./logs)")
    w.add_argument(
        "--state",
        default="urlcount-windowed-state",
        help="checkpoints and output (default ./urlcount-windowed-state)",
    )
    w.add_argument(
        "--output", default=None, help="windows, late lines and dead letters (default <state>/output)"
    )
    w.add_argument("--window", default="1 minute", help="tumbling window size (default '1 minute')")
    w.add_argument(
        "--delay",
        default="10 seconds",
        help="allowed out-of-orderness: the watermark trails the newest @timestamp by this "
        "(default '10 seconds')",
    )
    _add_run_options(w, windowed=True)

    d = sub.add_parser("demo", help="generate logs, run, add more logs, resume from the checkpoint, check")
    d.add_argument(
        "--workdir", default="urlcount-demo", help="the demo's directory (default ./urlcount-demo)"
    )
    d.add_argument("--more-records", type=int, default=50_000, help="lines added before the second run")
    d.add_argument("--more-files", type=int, default=2, help="files added before the second run")
    _add_generate_options(d, records=200_000, files=4)
    _add_run_options(d, lines_per_trigger=50_000)
    _add_vectorized_option(d)
    _add_remote_option(d)
    return parser


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}{'es' if word.endswith('ch') else 's'}"


def _print_generated(console: Console, result: GenerateResult, where: str) -> None:
    console.print(
        f"wrote {_plural(result.lines, 'line')} in {_plural(len(result.paths), 'file')} to {where} "
        f"({result.malformed_total:,} malformed, {result.delayed:,} stamped late, "
        f"{len(result.counts):,} URLs)",
        highlight=False,
    )


def _generate(args: argparse.Namespace, console: Console) -> int:
    first = next_file_index(args.out) if args.first_file is None else args.first_file
    result = generate_logs(
        args.out,
        records=args.records,
        files=args.files,
        first_file=first,
        n_urls=args.urls,
        malformed_fraction=args.malformed,
        late_fraction=args.late,
        seed=args.seed,
    )
    _print_generated(console, result, args.out)
    return 0


def _settings(args: argparse.Namespace, logs: str, state: str, output: str | None = None) -> JobSettings:
    return JobSettings(
        logs_dir=logs,
        state_dir=state,
        output_dir=output,
        parallelism=args.parallelism,
        backend=args.backend,
        vectorized=args.vectorized,
        lines_per_trigger=args.lines_per_trigger,
    )


def _run_displayed(
    args: argparse.Namespace, console: Console, settings: Any, title: str, run: Callable[..., RunReport]
) -> RunReport:
    """``run(spark, settings, ...)`` on a local (or Connect) Spark session, with the live progress display."""
    remote = getattr(args, "remote", None)
    if not args.no_progress:
        # Starting Spark takes a while on a small machine; say so rather than print nothing.
        console.print(f"{title}: starting Spark ({remote or args.master}) ...", highlight=False)
    # A session that runs already (a notebook's, a test suite's) is used, and left running.
    own = remote is not None or active_spark_session() is None
    spark = remote_spark_session(remote) if remote else local_spark_session(master=args.master)
    try:
        with ProgressDisplay(console, settings, title=title, enabled=not args.no_progress) as display:
            return run(spark, settings, on_batch=display.on_batch, on_poll=display.on_poll)
    finally:
        if own:
            spark.stop()


def _run_once(args: argparse.Namespace, console: Console, settings: JobSettings, title: str) -> RunReport:
    run = run_job_remote if getattr(args, "remote", None) else run_job
    report = _run_displayed(args, console, settings, title, run)
    verb = "resumed from its checkpoint and read" if report.resumed else "read"
    console.print(
        f"{title}: {verb} {_plural(report.records, 'new line')} in {_plural(len(report.batches), 'batch')}, "
        f"{report.seconds:.1f} s; {report.malformed:,} malformed lines written to "
        f"{settings.dead_letter_dir}",
        highlight=False,
    )
    for lost in (x for b in report.batches for x in b.input_lost):
        console.print(f"{title}: input lost: {lost}", highlight=False)
    done = [b for b in report.batches if b.state_entries is not None]
    if done:
        last = done[-1]
        exact = "" if last.state_entries_exact else " (the backend's estimate)"
        console.print(
            f"{title}: statekit's state holds {last.state_entries:,} entries{exact}; its checkpoints "
            f"wrote {sum(b.checkpoint_bytes for b in done):,} bytes in "
            f"{sum(b.checkpoint_seconds for b in done):.2f} s (the same numbers are logged at INFO "
            "and, on Spark, in its metrics system)",
            highlight=False,
        )
    return report


def _run(args: argparse.Namespace, console: Console) -> int:
    if not os.path.isdir(args.logs):
        console.print(f"statekit-urlcount: no log directory {args.logs!r}; try `statekit-urlcount generate`")
        return 2
    settings = _settings(args, args.logs, args.state, args.output)
    report = _run_once(args, console, settings, "run")
    console.print(top_urls_table(report.state, args.top))
    return 0


def _windowed(args: argparse.Namespace, console: Console) -> int:
    if not os.path.isdir(args.logs):
        console.print(f"statekit-urlcount: no log directory {args.logs!r}; try `statekit-urlcount generate`")
        return 2
    settings = WindowedSettings(
        logs_dir=args.logs,
        state_dir=args.state,
        output_dir=args.output,
        files_per_trigger=args.files_per_trigger,
        parallelism=args.parallelism,
        backend=args.backend,
        window=args.window,
        delay=args.delay,
    )
    report = _run_displayed(args, console, settings, "windowed", run_windowed_job)
    console.print(windowed_summary(report, settings, pending_windows(settings)), highlight=False)
    console.print(top_windows_table(read_output(settings.windows_dir), args.top))
    return 0


def windowed_summary(report: RunReport, settings: WindowedSettings, pending: PendingWindows) -> str:
    """The ``windowed`` command's closing line: what the run read and emitted, and what is still open.

    The watermark shown is the one the latest checkpoint holds (the next
    batch's). Spark fires a window in the batch after the one whose rows
    moved the watermark past its end, so windows ending before that watermark
    may still be open: the line counts them from the checkpoint instead of
    implying they were emitted.
    """
    verb = "resumed from its checkpoint and read" if report.resumed else "read"
    line = (
        f"windowed: {verb} {_plural(report.records, 'new line')} in {_plural(len(report.batches), 'batch')}, "
        f"{report.seconds:.1f} s; emitted {_plural(report.windows, 'window')} to {settings.windows_dir}; "
        f"{report.late:,} late lines written to {settings.late_dir}; {report.malformed:,} malformed lines "
        f"written to {settings.dead_letter_dir}; watermark now {format_time_ms(pending.watermark)}; "
    )
    if not pending.ends:
        return line + "no window is open"
    later = len(pending.ends) - pending.due
    parts = []
    if pending.due:
        parts.append(
            f"{pending.due:,} ending at or before it, emitted by the first batch of the next run (Spark "
            "runs one once newer logs arrive)"
        )
    if later:
        parts.append(f"{later:,} ending after it, emitted once newer logs move the watermark past their end")
    opened = _plural(len(pending.ends), "window")
    return f"{line}{opened} open in statekit's state, not emitted yet: {'; '.join(parts)}"


@dataclass
class DemoReport:
    """The demo's two runs, what the generator wrote for each, and the checks."""

    first: RunReport
    second: RunReport
    generated_first: GenerateResult
    generated_more: GenerateResult
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every check passed."""
        return all(ok for _, ok, _ in self.checks)


def _count_json_lines(directory: str) -> int:
    n = 0
    for root, _, names in os.walk(directory):
        for name in names:
            if name.endswith(".json"):
                with open(os.path.join(root, name), "rb") as f:
                    n += sum(1 for _ in f)
    return n


def _diff(expected: Counter[str], actual: dict[str, int]) -> str:
    wrong = sorted(u for u in set(expected) | set(actual) if expected.get(u, 0) != actual.get(u, 0))
    if not wrong:
        return f"{len(expected):,} URLs, {sum(expected.values()):,} requests"
    u = wrong[0]
    return f"{len(wrong)} URLs differ, e.g. {u}: expected {expected.get(u, 0)}, got {actual.get(u, 0)}"


def _fresh_workdir(work: str) -> None:
    """Empties the demo's directory (only one the demo made: it holds the marker) or makes it."""
    if os.path.isdir(work) and os.listdir(work):
        if not os.path.exists(os.path.join(work, _DEMO_MARKER)):
            raise SystemExit(
                f"statekit-urlcount: {work!r} is not empty and not a demo directory; choose another"
            )
        shutil.rmtree(work)
    os.makedirs(work, exist_ok=True)
    open(os.path.join(work, _DEMO_MARKER), "w").close()


def _checks(report: DemoReport, settings: JobSettings) -> list[tuple[str, bool, str]]:
    """``(name, passed, detail)`` of each thing the demo proves: exact counts, a resumed run, dead letters."""
    first, second = report.first, report.second
    first_gen, more = report.generated_first, report.generated_more
    both = first_gen.merge(more)
    checks: list[tuple[str, bool, str]] = []
    checks.append(
        (
            "first run: counts equal the generator's",
            first.state.counts == dict(first_gen.counts),
            _diff(first_gen.counts, first.state.counts),
        )
    )
    checks.append(
        (
            "first run: malformed lines counted",
            first.state.malformed == first_gen.malformed_total,
            f"{first.state.malformed:,} dead letters, {first_gen.malformed_total:,} generated",
        )
    )
    checks.append(
        (
            "second run resumed from the checkpoint",
            not first.resumed and second.restored_from == first.state.location,
            f"the first run started empty, the second from {second.restored_from}",
        )
    )
    checks.append(
        (
            "second run read only the new lines",
            second.records == more.lines,
            f"{second.records:,} read, {more.lines:,} added",
        )
    )
    checks.append(
        (
            "counts continue exactly",
            second.state.counts == dict(both.counts),
            _diff(both.counts, second.state.counts),
        )
    )
    checks.append(
        (
            "malformed total continues exactly",
            second.state.malformed == both.malformed_total,
            f"{second.state.malformed:,} dead letters, {both.malformed_total:,} generated",
        )
    )
    dead = _count_json_lines(settings.dead_letter_dir)
    checks.append(
        (
            "every malformed line is in the dead-letter output",
            dead == both.malformed_total,
            f"{dead:,} dead letters under {settings.dead_letter_dir}",
        )
    )
    return checks


def demo(args: argparse.Namespace, console: Console) -> DemoReport:
    """Generates logs, runs, adds logs, runs again from the checkpoint, and checks every count.

    The second run is a new SparkSession (a restart): statekit restores the
    counts from its checkpoint and Spark's file source reads only the new
    files, so the final counts must equal the generator's counts over all
    files exactly, and the second run must read exactly the added lines.
    """
    started = time.perf_counter()
    work = args.workdir
    _fresh_workdir(work)
    logs, state = os.path.join(work, "logs"), os.path.join(work, "state")
    settings = _settings(args, logs, state)

    def gen(records: int, files: int, first_file: int) -> GenerateResult:
        return generate_logs(
            logs,
            records=records,
            files=files,
            first_file=first_file,
            n_urls=args.urls,
            malformed_fraction=args.malformed,
            late_fraction=args.late,
            seed=args.seed,
        )

    console.rule("1. generate logs and count them")
    first_gen = gen(args.records, args.files, 0)
    _print_generated(console, first_gen, logs)
    first = _run_once(args, console, settings, "first run")
    console.print(top_urls_table(first.state, args.top))

    console.rule("2. more logs arrive; a new Spark session resumes from the checkpoint")
    more = gen(args.more_records, args.more_files, args.files)
    _print_generated(console, more, logs)
    second = _run_once(args, console, settings, "second run")
    console.print(top_urls_table(second.state, args.top))

    report = DemoReport(first, second, first_gen, more)
    report.checks.extend(_checks(report, settings))

    console.rule("3. check")
    for name, ok, detail in report.checks:
        mark = "[green]✔[/green]" if ok else "[red]✘[/red]"
        console.print(f"{mark} {name}: {detail}", highlight=False)
    console.print("[bold green]all checks passed[/]" if report.ok else "[bold red]a check failed[/]")
    console.print(f"the demo took {time.perf_counter() - started:.0f} s", highlight=False)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``statekit-urlcount`` and returns its exit status."""
    args = build_parser().parse_args(argv)
    if getattr(args, "remote", None):
        # A Connect server resolves relative paths against its own working directory.
        for name in ("workdir", "logs", "state", "output"):
            if getattr(args, name, None):
                setattr(args, name, os.path.abspath(getattr(args, name)))
    console = Console()
    try:
        if args.command == "generate":
            return _generate(args, console)
        if args.command == "run":
            return _run(args, console)
        if args.command == "windowed":
            return _windowed(args, console)
        return 0 if demo(args, console).ok else 1
    except StateError as exc:  # statekit's message names what was wrong and the way out: no traceback
        print(f"statekit-urlcount: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
