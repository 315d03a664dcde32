"""Private local directories and exclusive files (statekit._localfs), on real paths and a second user."""

from __future__ import annotations

import os
import pickle
import shutil
import stat
import tempfile
from typing import Any

import pytest

from statekit._localfs import (
    check_private_dir,
    create_exclusive,
    private_dir,
    read_no_follow,
    write_atomically,
)
from statekit.errors import StateError, UnsafeLocalPathError


def _mode(path: str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_creates_every_missing_component_0700(tmp_path: os.PathLike[str]) -> None:
    base = os.fspath(tmp_path)
    target = os.path.join(base, "a", "b", "c")
    assert private_dir(target, base=base) == target
    for p in (os.path.join(base, "a"), os.path.join(base, "a", "b"), target):
        assert _mode(p) == 0o700
    assert private_dir(target, base=base) == target  # idempotent


def test_umask_cannot_widen_the_mode(tmp_path: os.PathLike[str]) -> None:
    old = os.umask(0o002)
    try:
        target = private_dir(os.path.join(os.fspath(tmp_path), "x"))
    finally:
        os.umask(old)
    assert _mode(target) == 0o700


def test_a_planted_symlink_is_refused_and_its_target_untouched(tmp_path: os.PathLike[str]) -> None:
    base = os.fspath(tmp_path)
    victim = os.path.join(base, "victim")
    os.mkdir(victim, 0o700)
    with open(os.path.join(victim, "precious"), "w") as f:
        f.write("keep")
    os.mkdir(os.path.join(base, "job"), 0o700)
    os.symlink(victim, os.path.join(base, "job", "files"))
    with pytest.raises(UnsafeLocalPathError) as e:
        private_dir(
            os.path.join(base, "job", "files", "deeper"), base=base, what="the local-recovery directory"
        )
    message = str(e.value)
    assert "the local-recovery directory" in message and "symlink" in message
    assert os.path.join(base, "job", "files") in message and "Remove the symlink" in message
    assert e.value.path == os.path.join(base, "job", "files")
    assert os.listdir(victim) == ["precious"]
    assert isinstance(e.value, PermissionError) and isinstance(e.value, StateError)


def test_group_or_other_writable_is_refused_with_the_fix(tmp_path: os.PathLike[str]) -> None:
    base = os.fspath(tmp_path)
    shared = os.path.join(base, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o777)
    with pytest.raises(UnsafeLocalPathError, match=r"mode 0777.*chmod go-w"):
        private_dir(os.path.join(shared, "mine"), base=base)
    with pytest.raises(UnsafeLocalPathError, match="chmod go-w"):
        check_private_dir(shared)
    os.chmod(shared, 0o755)
    private_dir(os.path.join(shared, "mine"), base=base)  # fine once fixed


def test_the_base_itself_is_trusted(tmp_path: os.PathLike[str]) -> None:
    base = os.path.join(os.fspath(tmp_path), "world")
    os.mkdir(base)
    os.chmod(base, 0o1777)  # like /tmp: the platform's choice, not statekit's
    private_dir(os.path.join(base, "statekit-0"), base=base)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_directory_of_another_owner_is_refused(tmp_path: os.PathLike[str]) -> None:
    other = os.path.join(os.fspath(tmp_path), "other")
    os.mkdir(other, 0o700)
    os.chown(other, 4242, 4242)
    with pytest.raises(UnsafeLocalPathError, match="belongs to user id 4242"):
        private_dir(other)


def test_not_a_directory(tmp_path: os.PathLike[str]) -> None:
    f = os.path.join(os.fspath(tmp_path), "f")
    open(f, "w").close()
    with pytest.raises(UnsafeLocalPathError, match="is not a directory"):
        private_dir(os.path.join(f, "x"), base=os.fspath(tmp_path))


def test_error_pickles_with_its_path() -> None:
    e = UnsafeLocalPathError("bad place", path="/x")
    back = pickle.loads(pickle.dumps(e))
    assert str(back) == "bad place" and back.path == "/x"


def test_exclusive_create_never_follows_a_planted_symlink(tmp_path: os.PathLike[str]) -> None:
    d = os.fspath(tmp_path)
    fd, path = create_exclusive(d, ".part-", ".json")
    os.close(fd)
    assert _mode(path) == 0o600
    os.unlink(path)
    target = os.path.join(d, "target")
    with open(target, "w") as f:
        f.write("untouched")
    final = os.path.join(d, "part-0.json")
    os.symlink(target, final)
    write_atomically(final, b"new bytes")
    assert not os.path.islink(final)
    with open(final, "rb") as f:
        assert f.read() == b"new bytes"
    with open(target) as f:
        assert f.read() == "untouched"
    assert sorted(os.listdir(d)) == ["part-0.json", "target"]


def test_second_user_cannot_prepare_our_directory(second_user: Any) -> None:
    """As another local user, plant a symlink to a root-only directory where statekit will write."""
    # The fixture's object, by duck type: which conftest module is importable as "conftest" depends
    # on which test directories a run collects.
    top = tempfile.mkdtemp(prefix="statekit-localfs-", dir="/tmp")
    os.chmod(top, 0o755)  # the second user must reach it
    shared = os.path.join(top, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o1777)  # a shared, sticky directory like /tmp
    secret = os.path.join(top, "secret")
    os.mkdir(secret, 0o700)
    with open(os.path.join(secret, "keep"), "w") as f:
        f.write("x")
    second_user.run("mkdir", "-p", os.path.join(shared, "local-recovery", "job"))
    second_user.run("ln", "-s", secret, os.path.join(shared, "local-recovery", "job", "files"))
    with pytest.raises(UnsafeLocalPathError, match=f"belongs to user id {second_user.uid}"):
        private_dir(os.path.join(shared, "local-recovery", "job", "files"), base=shared)
    assert os.listdir(secret) == ["keep"]
    shutil.rmtree(top)


def test_the_callers_way_out_ends_the_message(tmp_path: os.PathLike[str]) -> None:
    shared = os.path.join(os.fspath(tmp_path), "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o775)
    with pytest.raises(UnsafeLocalPathError) as e:
        private_dir(shared, what="the hand-off directory", otherwise="Or set TMPDIR for the executors.")
    assert str(e.value).startswith(f"the hand-off directory {shared} can be written by its group")
    assert str(e.value).endswith("choose a directory only you can write. Or set TMPDIR for the executors.")
    link = os.path.join(os.fspath(tmp_path), "link")
    os.symlink(shared, link)
    with pytest.raises(UnsafeLocalPathError, match=r"is a symlink .* Or use another\.$"):
        check_private_dir(link, otherwise="Or use another.")


def test_read_no_follow_refuses_symlinks_and_what_is_not_a_file(tmp_path: os.PathLike[str]) -> None:
    d = os.fspath(tmp_path)
    real = os.path.join(d, "owner")
    with open(real, "wb") as f:
        f.write(b"123 attempt-1")
    assert read_no_follow(real) == b"123 attempt-1"
    assert read_no_follow(real, 3) == b"123"
    link = os.path.join(d, "planted")
    os.symlink(real, link)
    with pytest.raises(OSError):
        read_no_follow(link)
    fifo = os.path.join(d, "fifo")
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        read_no_follow(fifo)  # and it did not block waiting for a writer
    with pytest.raises(FileNotFoundError):
        read_no_follow(os.path.join(d, "missing"))


def _reachable_top() -> str:
    """A fresh directory under /tmp (root's 0755) that the second user can reach."""
    top = tempfile.mkdtemp(prefix="statekit-localfs-", dir="/tmp")
    os.chmod(top, 0o755)
    return top


def test_a_parent_another_user_owns_is_refused_naming_it(second_user: Any) -> None:
    """The owner of a parent could rename statekit's 0700 directory away between its check and its use."""
    top = _reachable_top()
    try:
        shared = os.path.join(top, "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o1777)
        theirs = os.path.join(shared, "theirs")
        second_user.run("mkdir", "-m", "0755", theirs)
        local = os.path.join(theirs, "local")
        with pytest.raises(UnsafeLocalPathError) as e:
            private_dir(local, what="the local directory of on-disk backends", otherwise="Or set X.")
        message = str(e.value)
        assert message.startswith(f"the local directory of on-disk backends {local} lies below {theirs}")
        assert f"belongs to user id {second_user.uid}, neither root nor the running user" in message
        assert message.endswith("Or set X.") and e.value.path == theirs
        assert not os.path.exists(local)  # nothing created in their directory
        with pytest.raises(UnsafeLocalPathError, match=f"lies below {theirs}"):  # deeper, and with a base
            private_dir(os.path.join(local, "a", "b"), base=local)
        with pytest.raises(UnsafeLocalPathError, match=f"lies below {theirs}"):
            check_private_dir(local)
    finally:
        shutil.rmtree(top)


def test_a_symlink_of_another_user_on_the_way_is_refused_and_its_target_untouched(second_user: Any) -> None:
    top = _reachable_top()
    try:
        shared = os.path.join(top, "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o1777)  # sticky, like /tmp: anyone may add a name
        victim = os.path.join(top, "victim")
        os.mkdir(victim, 0o700)
        link = os.path.join(shared, "statekit")
        second_user.run("ln", "-s", victim, link)
        with pytest.raises(UnsafeLocalPathError) as e:
            private_dir(os.path.join(link, "dead-letters"), what="the dead-letter directory")
        assert f"lies below {link}, which is a symlink of user id {second_user.uid}" in str(e.value)
        assert e.value.path == link and os.listdir(victim) == []
    finally:
        shutil.rmtree(top)


def test_symlinks_of_root_or_this_user_on_the_way_are_followed(tmp_path: os.PathLike[str]) -> None:
    """As /tmp -> /private/tmp on macOS: a link only root or this user can change is no risk."""
    real = os.path.join(os.fspath(tmp_path), "real")
    os.mkdir(real, 0o755)
    os.symlink(real, os.path.join(os.fspath(tmp_path), "abs"))
    os.symlink("real/../real", os.path.join(os.fspath(tmp_path), "rel"))
    for via in ("abs", "rel"):
        target = private_dir(os.path.join(os.fspath(tmp_path), via, f"x-{via}", "y"))
        assert os.path.isdir(os.path.join(real, f"x-{via}", "y")) and target.endswith(f"{via}/x-{via}/y")
    loop = os.path.join(os.fspath(tmp_path), "loop")
    os.symlink(loop, loop)
    with pytest.raises(UnsafeLocalPathError, match="more than 40 symlinks"):
        private_dir(os.path.join(loop, "x", "y"))


def test_a_parent_others_may_write_is_refused_unless_sticky(tmp_path: os.PathLike[str]) -> None:
    open_ = os.path.join(os.fspath(tmp_path), "open")
    os.mkdir(open_)
    os.chmod(open_, 0o777)
    with pytest.raises(
        UnsafeLocalPathError, match=r"lies below .*/open, which can be written by .* not sticky"
    ):
        private_dir(os.path.join(open_, "mine", "x"))
    os.chmod(open_, 0o1777)
    private_dir(os.path.join(open_, "mine", "x"))  # sticky, as /tmp: no one else renames our entries


def test_the_walk_opens_each_directory_relative_to_its_checked_parent(tmp_path: os.PathLike[str]) -> None:
    """A parent swapped for a symlink after it was checked: the next step does not follow it."""
    import statekit._localfs as localfs

    base = os.fspath(tmp_path)
    victim = os.path.join(base, "victim")
    os.mkdir(victim, 0o700)
    os.mkdir(os.path.join(base, "a"), 0o700)
    real_open = os.open
    swapped = []

    def open_then_swap(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        if path == "a" and not swapped:  # "a" checked: now make its name a link elsewhere
            os.rename(os.path.join(base, "a"), os.path.join(base, "a-moved"))
            os.symlink(victim, os.path.join(base, "a"))
            swapped.append(True)
        return fd

    localfs.os.open = open_then_swap  # type: ignore[assignment]
    try:
        private_dir(os.path.join(base, "a", "b"))
    finally:
        localfs.os.open = real_open  # type: ignore[assignment]
    assert swapped and os.listdir(victim) == []  # b went into the directory that was checked
    assert os.listdir(os.path.join(base, "a-moved")) == ["b"]
