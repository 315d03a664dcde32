"""Working directories of on-disk backends: owned by a process, removed once it died."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from statekit.backend_api import OWNER_FILE, create_instance_dir, remove_stale_instance_dirs


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
