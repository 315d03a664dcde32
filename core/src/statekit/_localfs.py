"""Local directories and files that only this user can change: confinement on a shared machine.

statekit writes many local files (task-local recovery copies, the hand-off
between Python workers, backends' working directories, dead letters, the JVM
helper's checks). On a machine with other users, a directory another user
prepared in advance, or a symlink planted at a name statekit will write,
would let them read state, plant state, or make statekit overwrite or delete
their chosen target. The rules, as OpenSSH applies them to key files:

* a directory statekit writes into is created with mode 0700; one that
  already exists must be a real directory (not a symlink), owned by the
  running user, with no group or other write permission;
* every component between a trusted *base* (a directory the user or the
  platform chose: the temp dir, Spark's local dir, a configured path's
  parent) and the directory is checked the same way, so no component may be
  a symlink statekit did not make;
* files are created exclusively (``O_CREAT | O_EXCL | O_NOFOLLOW``), under a
  fresh temporary name, and renamed into place: never opened by a name
  someone else could have planted.

A path that breaks a rule raises :class:`UnsafeLocalPathError`, naming the
path, what is wrong and how to fix it. Callers for whom the directory is only
a speed-up (task-local recovery) catch it and turn the speed-up off with the
reason.

What it may import: ``statekit._errors`` only (every layer, the log source
included, may use it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from typing import IO

from ._errors import UnsafeLocalPathError

__all__ = [
    "check_private_dir",
    "create_exclusive",
    "open_exclusive",
    "private_dir",
    "read_no_follow",
    "replace_atomically",
    "write_atomically",
]

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC


def _refuse(path: str, problem: str, fix: str, what: str, otherwise: str = "") -> UnsafeLocalPathError:
    message = (
        f"{what} {path} {problem}, so another user could read or replace what statekit keeps there. {fix}"
    )
    return UnsafeLocalPathError(f"{message} {otherwise}" if otherwise else message, path=path)


def _check_stat(st: os.stat_result, path: str, what: str, otherwise: str = "") -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "is not a directory", "Remove it or choose another path.", what, otherwise)
    if st.st_uid != os.geteuid():
        raise _refuse(
            path,
            f"belongs to user id {st.st_uid}, not to the running user ({os.geteuid()})",
            "Choose a directory of your own (or remove this one, and statekit creates it with mode 0700).",
            what,
            otherwise,
        )
    if st.st_mode & 0o022:
        raise _refuse(
            path,
            f"can be written by its group or by others (mode {stat.S_IMODE(st.st_mode):04o})",
            f"Run `chmod go-w {path}`, or choose a directory only you can write.",
            what,
            otherwise,
        )


def _open_component(parent_fd: int, name: str, path: str, what: str, otherwise: str, *, create: bool) -> int:
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent_fd)
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        raise
    except OSError as e:
        try:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except OSError:
            raise e from None
        if stat.S_ISLNK(st.st_mode):
            raise _refuse(
                path,
                f"is a symlink (to {os.readlink(name, dir_fd=parent_fd)!r}) that statekit did not make",
                "Remove the symlink; statekit creates the directory itself.",
                what,
                otherwise,
            ) from None
        raise _refuse(
            path, "is not a directory", "Remove it or choose another path.", what, otherwise
        ) from None
    try:
        _check_stat(os.fstat(fd), path, what, otherwise)
    except BaseException:
        os.close(fd)
        raise
    return fd


def private_dir(
    path: str | os.PathLike[str],
    *,
    base: str | os.PathLike[str] | None = None,
    what: str = "the directory",
    otherwise: str = "",
) -> str:
    """Create or check directory ``path`` as private to this user; returns its absolute path.

    Every component of ``path`` below ``base`` (default: ``path``'s parent, so
    only ``path`` itself) is created with mode 0700 if missing, and otherwise
    must be a real directory owned by this user with no group or other write.
    ``base`` itself is trusted (the user or the platform chose it) and created
    if missing, but not checked.

    Args:
        path: The directory statekit writes into.
        base: A trusted ancestor of ``path``.
        what: What the directory is, for the error (``"the local-recovery directory"``).
        otherwise: The caller's own way out, appended to the error (``"Or set
            statekit.local-dir to a directory of your own."``).

    Raises:
        UnsafeLocalPathError: Naming the first component that breaks a rule and the way out.
    """
    target = os.path.abspath(os.fspath(path))
    root = os.path.abspath(os.fspath(base)) if base is not None else os.path.dirname(target)
    rel = os.path.relpath(target, root)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
        raise ValueError(f"{target} is not below {root}")
    parts = [] if rel == os.curdir else rel.split(os.sep)
    os.makedirs(root, mode=0o700, exist_ok=True)
    if not parts:
        check_private_dir(target, what=what, otherwise=otherwise)
        return target
    fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
    try:
        current = root
        for part in parts:
            current = os.path.join(current, part)
            child = _open_component(fd, part, current, what, otherwise, create=True)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    return target


def check_private_dir(
    path: str | os.PathLike[str], *, what: str = "the directory", otherwise: str = ""
) -> None:
    """Check (never create) that ``path`` is a real directory of this user that no one else may write.

    ``what`` and ``otherwise`` as for :func:`private_dir`.

    Raises:
        UnsafeLocalPathError: If it is a symlink, someone else's, or group- or other-writable.
        FileNotFoundError: If it does not exist.
    """
    p = os.fspath(path)
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(
            p,
            f"is a symlink (to {os.readlink(p)!r}) that statekit did not make",
            "Remove the symlink, or point statekit at the real directory.",
            what,
            otherwise,
        )
    _check_stat(st, p, what, otherwise)


def create_exclusive(directory: str, prefix: str, suffix: str = "", mode: int = 0o600) -> tuple[int, str]:
    """A new file in ``directory`` under a fresh random name, created exclusively; returns (fd, path).

    The file cannot be a planted symlink or an existing file: ``O_EXCL`` with
    ``O_NOFOLLOW`` fails for either, and a fresh name is tried again.
    """
    for _ in range(100):
        path = os.path.join(directory, f"{prefix}{os.urandom(8).hex()}{suffix}")
        try:
            return os.open(path, _CREATE_FLAGS, mode), path
        except FileExistsError:
            continue
    raise FileExistsError(f"no fresh temporary name in {directory} after 100 tries")


@contextlib.contextmanager
def open_exclusive(
    directory: str, prefix: str, suffix: str = "", mode: int = 0o600
) -> Iterator[tuple[IO[bytes], str]]:
    """:func:`create_exclusive` as a binary file object; the file is removed if the block raises."""
    fd, path = create_exclusive(directory, prefix, suffix, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f, path
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def read_no_follow(path: str | os.PathLike[str], limit: int = 1 << 16) -> bytes:
    """The first ``limit`` bytes of regular file ``path``, never through a symlink.

    Raises:
        OSError: If ``path`` is missing, a symlink (``ELOOP``), or not a regular file.
    """
    fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        return f.read(limit)


def replace_atomically(staged: str, final: str) -> None:
    """Rename ``staged`` over ``final`` (same directory): readers see the old file or the new, whole."""
    os.replace(staged, final)


def write_atomically(
    path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600, fsync: bool = False
) -> None:
    """Write ``data`` to ``path`` through an exclusively created temporary file and a rename.

    The directory must already be safe (see :func:`private_dir`); whatever was
    at ``path`` (a file, or a symlink someone planted) is replaced, never
    written through.
    """
    final = os.fspath(path)
    directory, name = os.path.split(final)
    with open_exclusive(directory or ".", f".{name}.tmp-", mode=mode) as (f, staged):
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    try:
        replace_atomically(staged, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        raise
