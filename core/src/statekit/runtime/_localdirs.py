"""Working directories of on-disk backends: owned by a process, removed when it is gone.

A backend removes its directory when it closes; a process killed with
SIGKILL cannot. Each directory therefore names its owner (process id and
host) in a small file, and creating a directory removes the siblings of the
same prefix whose owner on this host is dead, so killed runs do not
accumulate directories across restarts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile

from .._errors import BackendIOError

__all__ = ["OWNER_FILE", "create_instance_dir", "local_write_error", "remove_stale_instance_dirs"]

#: The file in each working directory that names its owner: ``<pid> <host>``.
OWNER_FILE = ".statekit-owner"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def remove_stale_instance_dirs(parent: str, prefix: str) -> list[str]:
    """Remove the directories ``<parent>/<prefix>*`` whose owner process on this host is dead.

    Directories without an owner file, or owned on another host, are left alone.
    Returns the removed paths.
    """
    host = socket.gethostname()
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    for name in names:
        if not name.startswith(prefix):
            continue
        path = os.path.join(parent, name)
        try:
            with open(os.path.join(path, OWNER_FILE)) as f:
                pid_text, _, owner_host = f.read().strip().partition(" ")
            pid = int(pid_text)
        except (OSError, ValueError):
            continue
        if owner_host == host and pid != os.getpid() and not _alive(pid):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def create_instance_dir(parent: str | None, prefix: str) -> str:
    """A new directory ``<parent>/<prefix><random>`` owned by this process (parent: the temp dir).

    Stale siblings with the same prefix (their owner process died) are removed first.
    """
    parent = parent or tempfile.gettempdir()
    os.makedirs(parent, exist_ok=True)
    remove_stale_instance_dirs(parent, prefix)
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    try:
        with open(os.path.join(path, OWNER_FILE), "w") as f:
            f.write(f"{os.getpid()} {socket.gethostname()}\n")
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(path)
        raise
    return path


def local_write_error(backend: str, directory: str, cause: BaseException) -> BackendIOError:
    """The error for a write ``backend``'s engine could not make in ``directory``; raise it ``from cause``.

    Example (in a backend's write path)::

        try:
            db.write(batch)
        except EngineIOError as e:
            raise local_write_error("mydb", self.instance_dir, e) from e
    """
    try:
        free = f"{shutil.disk_usage(directory).free:,} bytes are free on its disk"
    except OSError:
        free = "its free space is unknown"
    return BackendIOError(
        f"the {backend} backend cannot write its state in {directory}: {cause} ({free}). Free space on "
        "that disk, or set statekit.local-dir to a directory on a larger one, then restart the job from "
        "its latest checkpoint (restore='latest'): the local files are a working copy, nothing "
        "checkpointed is lost"
    )
