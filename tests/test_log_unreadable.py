"""A log file or directory made unreadable mid-run (issue 44): an error naming it, the position, the way out.

Root reads a ``chmod 000`` file all the same, so the reads run as the second
local user (``conftest.second_user``) by switching the effective user id of
this process for the read only (root can switch back): the permission
failure is the kernel's own, not a mock. Everything the read imports is
imported before the switch (``/root`` is closed to the second user).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from statekit import LogSource
from statekit.errors import SourceError


@contextmanager
def as_user(user: Any) -> Iterator[None]:
    """This process with ``user``'s effective ids, until the block ends (only root can do this)."""
    os.setegid(user.gid)
    os.seteuid(user.uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


@pytest.fixture
def logs(second_user: Any) -> Iterator[Path]:
    """A log directory (0755, under /tmp) the second user can read, with a.log (5 lines) then b.log (3)."""
    top = Path(tempfile.mkdtemp(prefix="statekit-unreadable-", dir="/tmp"))
    top.chmod(0o755)
    logs = top / "logs"
    logs.mkdir(mode=0o755)
    logs.chmod(0o755)
    for name, n, when in (("a.log", 5, 1_000_000), ("b.log", 3, 2_000_000)):
        path = logs / name
        path.write_text("".join(json.dumps({"url": f"/{name}/{i}"}) + "\n" for i in range(n)))
        path.chmod(0o644)
        os.utime(path, (when, when))  # a.log is read first
    list(LogSource(str(logs) + "/", parse=json.loads).read(None))  # imports all a read needs, as root
    yield logs
    shutil.rmtree(top)


def _source(logs: Path) -> LogSource:
    return LogSource(str(logs) + "/", parse=json.loads)


def test_a_file_made_unreadable_mid_read_is_named_with_its_position_and_the_way_out(
    logs: Path, second_user: Any
) -> None:
    reading = _source(logs).read(None)
    with as_user(second_user):
        first = [next(reading) for _ in range(5)]  # all of a.log
    assert [r["url"] for r, _ in first] == [f"/a.log/{i}" for i in range(5)]
    (logs / "b.log").chmod(0o000)
    with as_user(second_user), pytest.raises(SourceError) as info:
        next(reading)
    message = str(info.value)
    assert message.startswith(
        f"{logs / 'b.log'} (not read yet: the source reads it from byte 0) cannot be read: "
    )
    assert "Permission denied (EACCES)" in message
    assert (
        f"(statekit-probe, user id {second_user.uid})" in message
        and f"`chmod a+r {logs / 'b.log'}`" in message
    )
    assert "restore='latest'" in message and isinstance(info.value.__cause__, PermissionError)


def test_a_file_made_unreadable_between_reads_says_how_far_it_was_read(logs: Path, second_user: Any) -> None:
    source = _source(logs)
    with as_user(second_user):
        *_, (_, position) = source.read(None)
    with open(logs / "a.log", "a") as f:
        f.write(json.dumps({"url": "/a.log/5"}) + "\n")
    size = (logs / "a.log").stat().st_size
    (logs / "a.log").chmod(0o000)
    with as_user(second_user), pytest.raises(SourceError) as info:
        list(source.read(position))
    read_to = size - len(json.dumps({"url": "/a.log/5"})) - 1
    assert str(info.value).startswith(
        f"{logs / 'a.log'} (read to byte {read_to}, line 5: the source goes on from there) cannot be read"
    )
    (logs / "a.log").chmod(0o644)  # the way out: read access, and the run goes on exactly
    with as_user(second_user):
        assert [r["url"] for r, _ in source.read(position)] == ["/a.log/5"]


def test_a_watched_directory_made_unreadable_is_named_with_the_way_out(logs: Path, second_user: Any) -> None:
    source = _source(logs)
    logs.chmod(0o311)  # others may enter but not list
    with as_user(second_user), pytest.raises(SourceError) as info:
        list(source.read(None))
    message = str(info.value)
    assert message.startswith(f"{logs} (a watched directory) cannot be read: Permission denied (EACCES)")
    assert f"`chmod a+rx {logs}`" in message
