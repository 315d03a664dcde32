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
* every component between a *base* (a directory the user or the platform
  chose: the temp dir, Spark's local dir, a configured path's parent) and the
  directory is checked the same way, so no component may be a symlink
  statekit did not make;
* the base and every directory above it, from ``/``, must be one no other
  user controls: owned by root or by the running user, and not writable by
  its group or others unless sticky (as ``/tmp``: there no one can rename or
  remove another's entries). A symlink on the way is followed only if root
  or the running user owns it. Otherwise the owner of a parent could rename
  statekit's private directory away, or swap a symlink in, between the check
  and the use;
* the walk opens each directory relative to its checked parent's descriptor
  (``openat`` with ``O_NOFOLLOW | O_DIRECTORY``) and checks what it opened, so
  no component can be swapped between its check and the next step; since
  every component is then one only root or this user can change, the path
  checked is the path used;
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
    "HASH_SETTLE_NS",
    "check_private_dir",
    "create_exclusive",
    "open_exclusive",
    "private_dir",
    "read_no_follow",
    "replace_atomically",
    "settled_before",
    "write_atomically",
]

#: How long before a file was hashed it must have last changed for the hash to stand for the file
#: while it stays the same file: file times tick coarsely (a few ms), so a write right after the
#: hash could leave them as they were.
HASH_SETTLE_NS = 2_000_000_000


def settled_before(changed_ns: int, hashed_at_ns: int) -> bool:
    """Whether a file last changed at ``changed_ns`` did so well before ``hashed_at_ns``."""
    return hashed_at_ns - changed_ns > HASH_SETTLE_NS


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


_MAX_LINKS = 40  # symlinks followed on the way to a base, as the kernel's limit


def _trusted_problem(st: os.stat_result) -> str | None:
    """Why a directory on the way to a base is not trusted (None if it is): its owner, or its write bits."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid not in (0, os.geteuid()):
        return f"belongs to user id {st.st_uid}, neither root nor the running user ({os.geteuid()})"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        mode = stat.S_IMODE(st.st_mode)
        return f"can be written by its group or by others and is not sticky (mode {mode:04o})"
    return None


def _refuse_parent(
    target: str, component: str, problem: str, fix: str, what: str, otherwise: str
) -> UnsafeLocalPathError:
    message = (
        f"{what} {target} lies below {component}, which {problem}, so another user could rename "
        f"{what.removeprefix('the ')} away or put their own in its place. {fix}"
    )
    return UnsafeLocalPathError(f"{message} {otherwise}" if otherwise else message, path=component)


def _parent_fix(component: str, problem: str) -> str:
    if problem.startswith("belongs"):
        return (
            f"Choose a directory whose parents all belong to root or to you (as /tmp, your home directory "
            f"or Spark's local directory do), not one below {component}."
        )
    if problem.startswith("can be written"):
        return f"Run `chmod go-w {component}` (or `chmod +t {component}`, sticky as /tmp), or choose another."
    return f"Choose a directory whose every parent is a real directory, not below {component}."


def _open_trusted(path: str, what: str, otherwise: str, target: str, *, create: bool) -> int:
    """A descriptor of directory ``path`` (absolute), walked from ``/`` with every component trusted.

    Each component is opened relative to its parent's descriptor without
    following a symlink and checked on the descriptor opened (see the module
    doc); a symlink is followed only if root or the running user owns it.
    Missing components are created with mode 0700 if ``create``.
    """
    fd = os.open("/", _DIR_FLAGS)
    try:
        problem = _trusted_problem(os.fstat(fd))
        if problem is not None:
            raise _refuse_parent(target, "/", problem, _parent_fix("/", problem), what, otherwise)
        todo = [p for p in path.split("/") if p not in ("", ".")]
        current = "/"
        links = 0
        while todo:
            name = todo.pop(0)
            shown = os.path.normpath(os.path.join(current, name))
            if create and name != "..":
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o700, dir_fd=fd)
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                raise
            except OSError as e:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):
                    raise _refuse_parent(
                        target, shown, "is not a directory", _parent_fix(shown, "not"), what, otherwise
                    ) from e
                if st.st_uid not in (0, os.geteuid()):
                    problem = f"is a symlink of user id {st.st_uid} (to {os.readlink(name, dir_fd=fd)!r})"
                    fix = f"Name the real directory, not a path through {shown}."
                    raise _refuse_parent(target, shown, problem, fix, what, otherwise) from None
                links += 1
                if links > _MAX_LINKS:
                    raise _refuse_parent(
                        target, shown, f"leads through more than {_MAX_LINKS} symlinks",
                        "Name the real directory.", what, otherwise,
                    ) from None  # fmt: skip
                link = os.readlink(name, dir_fd=fd)
                todo[:0] = [p for p in link.split("/") if p not in ("", ".")]
                if link.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _DIR_FLAGS)
                    current = "/"
                continue
            st = os.fstat(child)
            problem = _trusted_problem(st)
            if problem is not None:
                os.close(child)
                raise _refuse_parent(target, shown, problem, _parent_fix(shown, problem), what, otherwise)
            os.close(fd)
            fd, current = child, shown
        return fd
    except BaseException:
        os.close(fd)
        raise


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
    ``base`` and every directory above it are created (0700) if missing and
    must be ones no other user controls: owned by root or this user, not
    writable by group or others unless sticky, symlinks only of root or this
    user (see the module doc). Each directory is opened relative to its
    checked parent, so nothing can be swapped in between a check and the next step.

    Args:
        path: The directory statekit writes into.
        base: An ancestor of ``path`` the user or the platform chose.
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
    if rel == os.curdir:  # the base is the directory itself: private, not only trusted
        root, rel = os.path.split(target)
    parts = rel.split(os.sep)
    fd = _open_trusted(root, what, otherwise, target, create=True)
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

    Its parents, from ``/``, must be ones no other user controls, as for
    :func:`private_dir`'s base. ``what`` and ``otherwise`` as for :func:`private_dir`.

    Raises:
        UnsafeLocalPathError: If it is a symlink, someone else's, or group- or other-writable;
            or a parent is another user's, writable by others without the sticky bit, or another's symlink.
        FileNotFoundError: If it does not exist.
    """
    p = os.path.abspath(os.fspath(path))
    parent, name = os.path.split(p)
    fd = _open_trusted(parent, what, otherwise, p, create=False)
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            raise _refuse(
                os.fspath(path),
                f"is a symlink (to {os.readlink(name, dir_fd=fd)!r}) that statekit did not make",
                "Remove the symlink, or point statekit at the real directory.",
                what,
                otherwise,
            )
        _check_stat(st, os.fspath(path), what, otherwise)
    finally:
        os.close(fd)


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
