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
