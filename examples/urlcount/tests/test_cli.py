"""The command line and the progress display, without Spark."""

from __future__ import annotations

import io
import os

from rich.console import Console

from statekit_urlcount import BatchStats, JobSettings, StateSummary, generate_logs
from statekit_urlcount._cli import main, next_file_index
from statekit_urlcount._progress import ProgressDisplay, top_urls_table


def test_generate_appends_new_files(tmp_path, capsys):
    out = tmp_path / "logs"
    assert main(["generate", "--out", str(out), "--records", "1000", "--files", "2"]) == 0
    assert main(["generate", "--out", str(out), "--records", "500", "--files", "1"]) == 0
    assert sorted(os.listdir(out)) == ["access-00000.log", "access-00001.log", "access-00002.log"]
    assert next_file_index(str(out)) == 3
    # Appending is the same as generating everything at once.
    whole = generate_logs(tmp_path / "whole", records=1000, files=2)
    assert open(whole.paths[1], "rb").read() == open(out / "access-00001.log", "rb").read()
    assert "wrote 1,000 lines in 2 files" in capsys.readouterr().out


def test_generate_refuses_values_out_of_range_with_the_option_named(tmp_path, capsys):
    for option, value, said in [
        ("--malformed", "3", "from 0 to 1"),
        ("--late", "-0.5", "from 0 to 1"),
        ("--records", "-5", "must be 0 or more"),
        ("--files", "0", "must be at least 1"),
        ("--urls", "0", "must be at least 1"),
        ("--first-file", "-1", "must be 0 or more"),
    ]:
        try:
            main(["generate", "--out", str(tmp_path / "logs"), option, value])
        except SystemExit as exc:
            assert exc.code == 2
        else:
            raise AssertionError(f"{option} {value} was taken")
        err = capsys.readouterr().err
        assert f"argument {option}" in err and said in err and "Traceback" not in err
    assert not (tmp_path / "logs").exists()


def test_next_file_index_of_a_missing_or_foreign_directory(tmp_path):
    assert next_file_index(str(tmp_path / "nope")) == 0
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "access-00007.log").write_text("")
    assert next_file_index(str(tmp_path)) == 8


def test_run_without_logs_fails_with_a_hint(tmp_path, capsys):
    assert main(["run", "--logs", str(tmp_path / "missing"), "--state", str(tmp_path / "s")]) == 2
    assert "statekit-urlcount generate" in capsys.readouterr().out


def test_demo_refuses_a_foreign_directory(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    try:
        main(["demo", "--workdir", str(tmp_path), "--no-progress"])
    except SystemExit as exc:
        assert "not a demo directory" in str(exc)
    else:
        raise AssertionError("demo overwrote a foreign directory")
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_progress_prints_a_line_per_batch_off_a_terminal(tmp_path):
    out = io.StringIO()
    settings = JobSettings(logs_dir=str(tmp_path), state_dir=str(tmp_path / "state"))
    with ProgressDisplay(Console(file=out, width=200), settings) as display:
        display.on_batch(BatchStats(0, 1000, 990, 10, 50, 0.5, 1, "/x/chk-1"))
        display.on_batch(BatchStats(1, 500, 500, 0, 40, 0.25, 2, "/x/chk-2"))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("batch 1: 1,500 records (10 malformed)")
    assert "last batch 2,000" in lines[1]
    assert display.render() is not None  # the terminal picture renders too


def test_top_urls_table():
    state = StateSummary("/x/chk-3", 3, {"/a": 5, "/b": 7, "/c": 7, "/d": 1}, malformed=2)
    assert state.top(3) == [("/b", 7), ("/c", 7), ("/a", 5)]
    out = io.StringIO()
    Console(file=out, width=200).print(top_urls_table(state, 2))
    text = out.getvalue()
    assert "/b" in text and "/c" in text and "/a" not in text
    assert "20 requests over 4 URLs; 2 malformed lines" in text


def test_windowed_without_logs_fails_with_a_hint(tmp_path, capsys):
    assert main(["windowed", "--logs", str(tmp_path / "missing"), "--state", str(tmp_path / "s")]) == 2
    assert "statekit-urlcount generate" in capsys.readouterr().out


def test_top_windows_table():
    from statekit_urlcount._progress import top_windows_table

    rows = [
        {"url": "/a", "window_start": 1555545600000, "window_end": 1555545660000, "requests": 3},
        {"url": "/b", "window_start": 1555545660000, "window_end": 1555545720000, "requests": 9},
    ]
    out = io.StringIO()
    Console(file=out, width=200).print(top_windows_table(rows, 1))
    text = out.getvalue()
    assert "/b" in text and "2019-04-18T00:01:00Z - 00:02:00Z" in text and "/a" not in text
    assert "2 windows emitted so far, 12 requests in them" in text


def test_each_command_offers_the_trigger_option_its_source_honours(capsys):
    """Issue 33: demo's help said "--files-per-trigger ... default 1", yet its 4 files ran as one batch."""
    from statekit_urlcount._cli import build_parser

    for command, shown, absent in (
        ("demo", "--lines-per-trigger", "--files-per-trigger"),
        ("run", "--lines-per-trigger", "--files-per-trigger"),
        ("windowed", "--files-per-trigger", "--lines-per-trigger"),
    ):
        text = build_parser()._subparsers._group_actions[0].choices[command].format_help()
        assert shown in text and absent not in text, command
    demo = build_parser().parse_args(["demo"])
    assert demo.lines_per_trigger == 50_000
    assert build_parser().parse_args(["run"]).lines_per_trigger is None


def test_progress_says_what_runs_while_a_batch_takes_long_off_a_terminal(tmp_path, monkeypatch):
    import statekit_urlcount._progress as progress

    class Query:  # what on_poll reads of a StreamingQuery: its status
        status = {"message": "Processing new data"}

    clock = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])
    out = io.StringIO()
    settings = JobSettings(logs_dir=str(tmp_path), state_dir=str(tmp_path / "state"))
    with ProgressDisplay(Console(file=out, width=200), settings) as display:
        display.on_poll(Query())  # a new status: said at once
        clock[0] += 5
        display.on_poll(Query())  # the same, soon after: quiet
        clock[0] += progress.STATUS_EVERY
        display.on_poll(Query())  # the same, a while later: said again
    assert out.getvalue().splitlines() == [
        "0 s: Processing new data (0 batches done)",
        f"{5 + progress.STATUS_EVERY:.0f} s: Processing new data (0 batches done)",
    ]


def test_a_statekit_error_is_one_message_and_exit_status_2_not_a_traceback(tmp_path, capsys, monkeypatch):
    """A typo in a backend's name (or any statekit error) reads as statekit's message, the way out in it."""
    from statekit.errors import UnknownPluginError
    from statekit_urlcount import _cli

    def refused(args, console):
        raise UnknownPluginError("backend 'rockdb' is not installed.\n Did you mean 'rocksdb'?")

    monkeypatch.setattr(_cli, "_run", refused)
    assert main(["run", "--logs", str(tmp_path), "--backend", "rockdb"]) == 2
    err = capsys.readouterr().err
    assert err == "statekit-urlcount: error: backend 'rockdb' is not installed. Did you mean 'rocksdb'?\n"
