"""Dead-letter files on a shared machine (issue 32): a private directory, files never written through a link.

Dead letters used to go to a predictable temporary name opened with ``"w"``:
another user who could write the directory planted a symlink there and had
statekit overwrite the link's target, and the final ``part-…json`` was the
planted link. Now the directory statekit makes is 0700, an existing one must
be the running user's and not group- or other-writable, and every file is
created exclusively under a fresh name and renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from logfiles import CountJob, LogDir
from statekit._errors import ConfigurationError
from statekit.errors import UnsafeLocalPathError
from statekit.sources._deadletters import DeadLetterDir


def dead_letter_job(logs: LogDir, path: Path) -> CountJob:
    conf = {"statekit.bad-records.policy": "dead-letter", "statekit.bad-records.dead-letter-path": str(path)}
    return CountJob(logs, conf, interval=5)


@pytest.fixture
def logs(tmp_path: Path) -> LogDir:
    logs = LogDir(tmp_path / "in")
    logs.write("a.log", 12)
    logs.write_raw("a.log", b"not json\n")
    logs.write("a.log", 3)
    return logs


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user may write, as /tmp is (sticky, 1777), where the second user reaches it."""
    top = Path(tempfile.mkdtemp(prefix="statekit-dead-letters-", dir="/tmp"))
    top.chmod(0o755)
    shared = top / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    yield shared
    shutil.rmtree(top)


def test_the_directory_statekit_makes_is_private(logs: LogDir, tmp_path: Path) -> None:
    dead = tmp_path / "out" / "dead"
    dead_letter_job(logs, dead).run()
    assert stat.S_IMODE(os.stat(dead).st_mode) == 0o700
    (part,) = dead.iterdir()
    assert part.name == "part-logs-chk-000000000003-0.json"  # checkpoints at 5, 10, 15: the bad line is 13th
    assert stat.S_IMODE(os.lstat(part).st_mode) == 0o600 and not part.is_symlink()
    assert [json.loads(x)["raw"] for x in part.read_text().splitlines()] == ["not json"]


def test_a_symlink_planted_as_the_directory_is_refused(logs: LogDir, shared: Path, second_user: Any) -> None:
    victim = shared.parent / "victim"
    victim.mkdir(mode=0o700)
    second_user.run("ln", "-s", str(victim), str(shared / "dead"))
    with pytest.raises(UnsafeLocalPathError) as info:
        dead_letter_job(logs, shared / "dead").run()
    message = str(info.value)
    assert f"{shared / 'dead'} is a symlink (to {str(victim)!r}) that statekit did not make" in message
    assert "Remove the symlink" in message
    assert list(victim.iterdir()) == []  # nothing written through it


def test_a_directory_of_another_user_is_refused(logs: LogDir, shared: Path, second_user: Any) -> None:
    second_user.run("mkdir", "-m", "0755", str(shared / "dead"))
    with pytest.raises(UnsafeLocalPathError) as info:
        dead_letter_job(logs, shared / "dead").run()
    message = str(info.value)
    assert f"the dead-letter directory (statekit.bad-records.dead-letter-path) {shared / 'dead'}" in message
    assert f"belongs to user id {second_user.uid}" in message and "Choose a directory of your own" in message


def test_a_symlink_of_another_user_at_a_parent_is_refused(
    logs: LogDir, shared: Path, second_user: Any
) -> None:
    """The probe one step up: the link is a parent of the dead-letter path, not the path itself."""
    victim = shared.parent / "victim"
    victim.mkdir(mode=0o700)
    second_user.run("ln", "-s", str(victim), str(shared / "out"))
    with pytest.raises(UnsafeLocalPathError) as info:
        dead_letter_job(logs, shared / "out" / "dead").run()
    message = str(info.value)
    assert f"{shared / 'out' / 'dead'} lies below {shared / 'out'}, which is a symlink of user id" in message
    assert info.value.path == str(shared / "out")
    assert list(victim.iterdir()) == []  # nothing written through it


def test_a_parent_another_user_owns_is_refused(logs: LogDir, shared: Path, second_user: Any) -> None:
    """Its owner could rename the 0700 directory statekit made away and put their own in its place."""
    second_user.run("mkdir", "-m", "0755", str(shared / "theirs"))
    with pytest.raises(UnsafeLocalPathError) as info:
        dead_letter_job(logs, shared / "theirs" / "dead").run()
    message = str(info.value)
    assert f"lies below {shared / 'theirs'}, which belongs to user id {second_user.uid}" in message
    assert not (shared / "theirs" / "dead").exists()


def test_a_directory_others_may_write_is_refused(logs: LogDir, tmp_path: Path) -> None:
    dead = tmp_path / "dead"
    dead.mkdir()
    dead.chmod(0o777)
    with pytest.raises(UnsafeLocalPathError, match=rf"mode 0777\).*Run `chmod go-w {dead}`"):
        dead_letter_job(logs, dead).run()


def test_publishing_replaces_a_planted_symlink_and_never_writes_its_target(tmp_path: Path) -> None:
    """Also the names statekit used before (``.<name>.<pid>.tmp``): a link there is left alone."""
    dead = DeadLetterDir(tmp_path / "dead")
    target = tmp_path / "precious"
    target.write_text("keep me")
    name = "part-abc-1-2-000000000000-000000000100.json"
    os.symlink(target, tmp_path / "dead" / name)
    os.symlink(target, tmp_path / "dead" / f".{name}.{os.getpid()}.tmp")
    dead.publish(name, [{"stage": "parse", "raw": "x"}])
    final = tmp_path / "dead" / name
    assert not final.is_symlink() and json.loads(final.read_text()) == {"stage": "parse", "raw": "x"}
    assert target.read_text() == "keep me"


def test_the_old_dead_letter_file_is_refused_with_the_way_out(logs: LogDir, tmp_path: Path) -> None:
    old = tmp_path / "dead-letters.jsonl"
    old.write_text('{"stage": "parse"}\n')
    with pytest.raises(
        ConfigurationError, match=r"dead-letters\.jsonl is a file: dead letters go into a directory"
    ):
        dead_letter_job(logs, old).run()
    assert old.read_text() == '{"stage": "parse"}\n'


def test_a_relative_path_on_spark_connect_is_refused_and_on_a_driver_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pyspark")
    from statekit import Configuration
    from statekit.spark._jobspec import resolve_dead_letters

    conf = Configuration.from_mapping(
        {
            "spark.statekit.bad-records.policy": "dead-letter",
            "spark.statekit.bad-records.dead-letter-path": "dl",
        }
    )
    with pytest.raises(ConfigurationError, match="'dl' is relative: from a Spark Connect client"):
        resolve_dead_letters(conf, connect=True)
    monkeypatch.chdir(tmp_path)
    resolved = resolve_dead_letters(conf, connect=False)
    assert resolved.get("statekit.bad-records.dead-letter-path") == str(tmp_path / "dl")
    assert stat.S_IMODE(os.stat(tmp_path / "dl").st_mode) == 0o700
