"""Working directories of on-disk backends: owned by a process, removed once it died, private to the user."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from statekit.errors import UnsafeLocalPathError
from statekit.ordered_kv import OWNER_FILE, create_instance_dir, remove_stale_instance_dirs


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_new_directory_removes_siblings_whose_owner_died(tmp_path: Path) -> None:
    stale = tmp_path / "rocksdb-stale"
    stale.mkdir()
    (stale / OWNER_FILE).write_text(f"{dead_pid()} {socket.gethostname()}\n")
    (stale / "000012.sst").write_bytes(b"x" * 100)
    other_host = tmp_path / "rocksdb-remote"
    other_host.mkdir()
    (other_host / OWNER_FILE).write_text(f"{dead_pid()} another-host\n")
    unowned = tmp_path / "rocksdb-unowned"
    unowned.mkdir()
    living = Path(create_instance_dir(str(tmp_path), "rocksdb-"))
    assert (living / OWNER_FILE).read_text().split()[0] == str(os.getpid())
    assert not stale.exists()  # its process is gone
    assert other_host.exists() and unowned.exists()  # not provably dead: kept
    second = Path(create_instance_dir(str(tmp_path), "rocksdb-"))
    assert living.exists() and second.exists()  # this process is alive
    assert remove_stale_instance_dirs(str(tmp_path), "lmdb-") == []


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_parent_is_made_private_and_each_directory_is_0700(tmp_path: Path) -> None:
    parent = tmp_path / "local" / "backends"
    path = create_instance_dir(str(parent), "rocksdb-")
    assert _mode(parent) == 0o700 and _mode(path) == 0o700
    assert Path(path).parent == parent and _mode(os.path.join(path, OWNER_FILE)) == 0o600


@pytest.mark.parametrize("problem", ["group-writable", "symlink"])
def test_a_parent_others_could_change_is_refused_naming_it_and_the_way_out(
    tmp_path: Path, problem: str
) -> None:
    real = tmp_path / "real"
    real.mkdir()
    parent = real
    if problem == "group-writable":
        os.chmod(real, 0o770)
    else:
        parent = tmp_path / "link"
        parent.symlink_to(real)
    with pytest.raises(UnsafeLocalPathError) as e:
        create_instance_dir(str(parent), "lmdb-")
    message = str(e.value)
    assert message.startswith(f"the local directory of on-disk backends {parent} ")
    assert message.endswith(
        "Or set statekit.local-dir (or the backend's local-dir) to a directory of your own."
    )
    assert os.listdir(real) == []  # nothing was created in it


def _shared_top() -> str:
    """A directory under /tmp that the second user can reach (pytest's tmp_path is root's alone)."""
    top = tempfile.mkdtemp(prefix="statekit-localdirs-", dir="/tmp")
    os.chmod(top, 0o755)
    return top


def test_a_parent_the_second_user_prepared_is_refused(second_user: Any) -> None:
    top = _shared_top()
    try:
        shared = os.path.join(top, "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o1777)
        local = os.path.join(shared, "statekit-local")
        second_user.run("mkdir", "-m", "0755", local)  # ready before statekit ever runs
        with pytest.raises(UnsafeLocalPathError, match=f"{local} belongs to user id {second_user.uid}"):
            create_instance_dir(local, "rocksdb-")
        assert os.listdir(local) == []
    finally:
        shutil.rmtree(top)


def test_stale_directories_of_another_user_are_never_removed(
    second_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the shared temp dir, a directory that looks stale but is not ours stays (root could remove it)."""
    top = _shared_top()
    try:
        tmp = os.path.join(top, "tmp")
        os.mkdir(tmp)
        os.chmod(tmp, 0o1777)  # like /tmp
        monkeypatch.setattr(tempfile, "tempdir", tmp)
        theirs = os.path.join(tmp, "rocksdb-theirs")
        second_user.run("mkdir", theirs)
        second_user.run("sh", "-c", f'echo "{dead_pid()} {socket.gethostname()}" > {theirs}/{OWNER_FILE}')
        ours = Path(tmp) / "rocksdb-ours"
        ours.mkdir()
        (ours / OWNER_FILE).write_text(f"{dead_pid()} {socket.gethostname()}\n")
        link = Path(tmp) / "rocksdb-link"
        victim = Path(top) / "victim"
        victim.mkdir()
        (victim / OWNER_FILE).write_text(f"{dead_pid()} {socket.gethostname()}\n")
        link.symlink_to(victim)
        path = create_instance_dir(None, "rocksdb-")
        assert Path(path).parent == Path(tmp) and _mode(path) == 0o700
        assert os.path.isdir(theirs) and not ours.exists()  # only our own dead directory went
        assert link.is_symlink() and (victim / OWNER_FILE).exists()
    finally:
        shutil.rmtree(top)


def test_a_local_dir_below_a_directory_of_another_user_is_refused(second_user: Any) -> None:
    """statekit.local-dir one level below the second user's directory: its owner controls the parent."""
    top = _shared_top()
    try:
        shared = os.path.join(top, "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o1777)
        theirs = os.path.join(shared, "theirs")
        second_user.run("mkdir", "-m", "0755", theirs)
        with pytest.raises(UnsafeLocalPathError) as e:
            create_instance_dir(os.path.join(theirs, "statekit-local"), "rocksdb-")
        assert f"lies below {theirs}, which belongs to user id {second_user.uid}" in str(e.value)
        assert "Or set statekit.local-dir" in str(e.value) and os.listdir(theirs) == []
    finally:
        shutil.rmtree(top)
