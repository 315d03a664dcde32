"""The runners' report of a restore: migration progress lines, and the states no longer declared."""

from __future__ import annotations

import logging

import pytest

from statekit.runtime._migration_log import MigrationProgressLog, merge_undeclared, warn_of_undeclared


def test_progress_is_logged_at_start_every_n_entries_or_seconds_and_at_the_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    calls: list[tuple[str, int, int]] = []
    log = MigrationProgressLog(
        "subtask 1", lambda *a: calls.append(a), every=100, seconds=5, clock=lambda: now[0]
    )
    with caplog.at_level(logging.INFO, logger="statekit.state"):
        log("visits", 0, 250)
        log("visits", 50, 250)  # neither 100 entries nor 5 seconds since the last line
        log("visits", 120, 250)  # 100 entries
        now[0] = 6.0
        log("visits", 130, 250)  # 5 seconds
        log("visits", 140, 250)
        now[0] = 7.5
        log("visits", 250, 250)  # the end
        log("empty", 0, 0)  # nothing to migrate: started and done
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "subtask 1: migrating state 'visits': 250 entries",
        "subtask 1: migrating state 'visits': 120 of 250 entries",
        "subtask 1: migrating state 'visits': 130 of 250 entries",
        "subtask 1: migrated state 'visits': 250 entries in 7.5 s",
        "subtask 1: migrating state 'empty': 0 entries",
        "subtask 1: migrated state 'empty': 0 entries in 0.0 s",
    ]
    assert all(r.levelno == logging.INFO for r in caplog.records)
    # The job's callback gets every report, not only the logged ones.
    assert [c[1] for c in calls] == [0, 50, 120, 130, 140, 250, 0]


def test_undeclared_states_are_merged_by_kind_and_named_in_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    merged = merge_undeclared([{"keyed": ["b", "a"]}, {}, {"keyed": ["a"], "operator": ["offsets"]}])
    assert merged == {"keyed": ["a", "b"], "operator": ["offsets"]}
    with caplog.at_level(logging.WARNING, logger="statekit.state"):
        warn_of_undeclared("job 'j'", "/ckpt/chk-3", merged)
        warn_of_undeclared("job 'j'", "/ckpt/chk-3", {})
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "/ckpt/chk-3 holds keyed state 'a', 'b'; operator state 'offsets'" in record.getMessage()
    assert "Kept and carried into every checkpoint" in record.getMessage()


def test_an_unknown_total_logs_entries_so_far_and_the_end_once_known(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An ordered engine counts as it goes: None until the last report, which has done == total."""
    now = [0.0]
    seen: list[tuple[str, int, int | None]] = []
    log = MigrationProgressLog(
        "operator 'p' subtask 0", lambda *a: seen.append(a), every=10, clock=lambda: now[0]
    )
    with caplog.at_level(logging.INFO, logger="statekit.state"):
        log("s", 0, None)
        log("s", 10, None)
        log("s", 12, 12)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "operator 'p' subtask 0: migrating state 's': entries counted as it goes",
        "operator 'p' subtask 0: migrating state 's': 10 entries",
        "operator 'p' subtask 0: migrated state 's': 12 entries in 0.0 s",
    ]
    assert seen == [("s", 0, None), ("s", 10, None), ("s", 12, 12)]
