"""Working directories of on-disk backends: owned by a process, removed when it is gone, private.

A backend removes its directory when it closes; a process killed with
SIGKILL cannot. Each directory therefore names its owner (process id and
host) in a small file, and creating a directory removes the siblings of the
same prefix whose owner on this host is dead, so killed runs do not
accumulate directories across restarts.

The directories hold state, so they are confined to the running user
(:mod:`statekit._localfs`): each is created fresh with mode 0700, and the
parent it is created in (``statekit.local-dir``, a backend's ``local-dir``)
must be a real directory of this user that no one else may write; statekit
creates it with mode 0700 if it is missing. Without a parent they go straight
into the system's temporary directory, each under a fresh name only this user
can enter. Only directories of this user are ever removed as stale.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile

from ._errors import BackendIOError
from ._localfs import private_dir, read_no_follow, write_atomically

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
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue  # a symlink, a file, another user's: never ours to remove
            text = read_no_follow(os.path.join(path, OWNER_FILE), 256).decode("ascii")
            pid_text, _, owner_host = text.strip().partition(" ")
            pid = int(pid_text)
        except (OSError, ValueError):
            continue
        if owner_host == host and pid != os.getpid() and not _alive(pid):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def create_instance_dir(parent: str | None, prefix: str) -> str:
    """A new directory ``<parent>/<prefix><random>`` owned by this process (parent: the temp dir).

    The directory is created exclusively with mode 0700. ``parent`` is created
    with mode 0700 if missing; if it exists it must be a real directory of the
    running user without group or other write (the system's temporary
    directory, used when ``parent`` is None, is trusted as it is). Stale
    siblings with the same prefix (their owner process died) are removed first.

    Raises:
        UnsafeLocalPathError: If ``parent`` is a symlink, another user's, or
            group- or other-writable; the message names it and the way out.
    """
    if parent is None:
        parent = tempfile.gettempdir()
    else:
        parent = private_dir(
            parent,
            what="the local directory of on-disk backends",
            otherwise="Or set statekit.local-dir (or the backend's local-dir) to a directory of your own.",
        )
    remove_stale_instance_dirs(parent, prefix)
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)  # O_EXCL and mode 0700, under a fresh name
    try:
        write_atomically(os.path.join(path, OWNER_FILE), f"{os.getpid()} {socket.gethostname()}\n".encode())
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
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
