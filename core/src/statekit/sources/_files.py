"""Which files a :class:`~statekit.LogSource` watches, how it opens them, how it knows them again.

What is watched is only what the source was pointed at: regular files in the
watched directories. A symlink that leads anywhere but to another watched file
(unless the source follows symlinks), a FIFO, a socket, a device or a
directory taken by the watch is refused with a :class:`~statekit.errors.SourceError`
naming it and what it is, never skipped in silence; a watched path that does
not exist is an error too (with a near name, if one exists). Files are opened
with ``O_NOFOLLOW | O_NONBLOCK`` and checked to be regular on the open
descriptor, so no open blocks on a FIFO that replaced a log between listing
and opening.

A file is known by its device and inode *and* by a fingerprint of its first
bytes (up to :data:`FINGERPRINT_BYTES`), checked together:

- the inode says which file: two files with the same first lines (a header,
  or log lines that repeat) are still two files, and a renamed file is the
  same file whatever its new name;
- the fingerprint, and a newline right before the saved offset, say that its
  content is still what was read: a file truncated in place (logrotate's
  ``copytruncate``) or whose inode was reused after a deletion no longer
  matches, so the source never seeks into the middle of a line of new content;
- when the inode no longer matches, the fingerprint finds the content again
  under another inode: the copy ``copytruncate`` left (``access.log.1``),
  which is then finished from the saved offset;
- while the original is still whole (between ``copytruncate``'s copy and its
  truncation), a new file that holds a prefix of it is its copy, not a new
  file (:func:`is_copy`): it is not read, since the original holds the same lines.

This is what Vector (fingerprints) and Filebeat (device and inode) each learned
half of; see docs/operations.md#input-files.

Lines are read by :class:`LineReader`: whole blocks, split in C, with a line
longer than the limit (:data:`MAX_LINE_BYTES` by default) reported as a
:class:`LongLine` (its first bytes and its length) and the rest of it skipped
unread into memory, in time linear in its length.
"""

from __future__ import annotations

import bz2
import difflib
import errno
import fnmatch
import gzip
import hashlib
import lzma
import os
import stat
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from .._errors import SourceError

__all__ = [
    "COMPRESSED_SUFFIXES",
    "FINGERPRINT_BYTES",
    "IN_LONG_LINE",
    "LONG_LINE_HEAD",
    "MAX_LINE_BYTES",
    "PARTIAL_END",
    "Candidate",
    "CompressedCopy",
    "CompressedFile",
    "LineReader",
    "LongLine",
    "Tracked",
    "UnreadableFileError",
    "Watch",
    "check_watches",
    "compressed_head",
    "compressed_identities",
    "count_lines",
    "decompressed_length",
    "decompressible",
    "find_compressed",
    "find_copy",
    "find_prefix_copy",
    "fingerprint",
    "head_of",
    "holds",
    "is_copy",
    "list_candidates",
    "list_compressed",
    "matched_head",
    "matches",
    "open_candidate",
    "open_regular",
    "watches_for",
]

#: Bytes at the start of a file that make its fingerprint (fewer while the file is shorter).
FINGERPRINT_BYTES = 8192

#: Names ending so are never read as text: logrotate's compressed rotations.
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".zip", ".lz4", ".Z")

#: The longest line read as a record, by default (``statekit.source.max-line-bytes``).
MAX_LINE_BYTES = 4 << 20

#: Bytes of a longer line kept in its dead letter (fewer if the limit is lower).
LONG_LINE_HEAD = 64 << 10

_T = TypeVar("_T")

_BLOCK = 1 << 20  # bytes read at once
_TAIL = 4096  # bytes at a copy's end compared with its original's at the same offset

# Entry flags, kept in the position.
PARTIAL_END = 1
"""The saved offset ends a last line that had no newline (read after the inactivity time)."""
IN_LONG_LINE = 2
"""The saved offset is inside a line longer than the limit, already reported: skip to its newline."""

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
_FOLLOW_HINT = "LogSource(follow_symlinks=True), or statekit.source.follow-symlinks=true"

# The compressed formats the standard library reads: where a file's content went when
# logrotate compressed it, so a loss can name that file and say exactly what was not read.
_OPENERS: dict[str, Callable[[IO[bytes]], Any]] = {
    ".gz": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    ".bz2": lambda raw: bz2.BZ2File(raw, "rb"),
    ".xz": lambda raw: lzma.LZMAFile(raw, "rb"),  # noqa: SIM115 - the caller closes it
}


def fingerprint(data: bytes) -> str:
    """The fingerprint of a file's first bytes: 16 hex digits of BLAKE2b."""
    return hashlib.blake2b(data, digest_size=8).hexdigest()


# --- opening -------------------------------------------------------------------------------


def _kind(mode: int) -> str:
    """What a file of ``mode`` is, in words."""
    for test, what in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return what
    return "not a regular file"


class UnreadableFileError(SourceError):
    """A watched file or directory the running user may not read: names it, where reading got, the way out.

    Raised where a file is opened or a directory listed (a file made
    unreadable mid-run: ``chmod 000``, an ACL, an ``EIO``); the LogSource and
    the Spark source's planning add how far the file was read (:meth:`at`).
    """

    def __init__(self, path: str, reason: str, where: str = "", *, directory: bool = False) -> None:
        self.path, self.reason, self.where, self.directory = path, reason, where, directory
        at = f" ({where})" if where else ""
        try:
            import pwd

            user = f"{pwd.getpwuid(os.geteuid()).pw_name}, user id {os.geteuid()}"
        except (ImportError, KeyError):
            user = f"user id {os.geteuid()}"
        access = f"`chmod a+rx {path}`" if directory else f"`chmod a+r {path}`"
        super().__init__(
            f"{path}{at} cannot be read: {reason}. A LogSource stops rather than skip it. Give the user that "
            f"runs the job ({user}) read access to it (e.g. {access}, or an ACL) and run the job again "
            "(restore='latest'): it goes on from where it stopped, nothing lost. Or move it out of the "
            "watched files, or exclude it with pattern= (what it holds past that point is then reported lost)"
        )

    def at(self, where: str) -> UnreadableFileError:
        """The same error, saying how far the file was read."""
        return UnreadableFileError(self.path, self.reason, where, directory=self.directory)

    def __reduce__(self) -> Any:
        return (_unreadable, (self.path, self.reason, self.where, self.directory))


def _unreadable(path: str, reason: str, where: str, directory: bool) -> UnreadableFileError:
    return UnreadableFileError(path, reason, where, directory=directory)


def _reason(e: OSError) -> str:
    name = errno.errorcode.get(e.errno or 0, "")
    return f"{e.strerror or e}" + (f" ({name})" if name else "")


def _not_regular(path: str, what: str, where: str | None = None) -> SourceError:
    place = f", move it out of {where}," if where else ""
    return SourceError(
        f"{path} is {what}, not a regular file: a LogSource reads only regular files, and refuses this "
        f"one rather than skip it in silence or block on it. Remove it{place} or exclude it with pattern="
    )


def open_regular(path: str, *, follow: bool = False) -> IO[bytes]:
    """``path`` open for reading, if it is a regular file; never blocks on, nor reads, anything else.

    ``O_NONBLOCK`` makes the open of a FIFO (or of a device) return at once
    instead of waiting for a writer; the descriptor is then checked to be a
    regular file and made blocking again. Without ``follow``,
    ``O_NOFOLLOW`` refuses a symlink as the last component.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        SourceError: If it is not a regular file (naming what it is), or a symlink without ``follow``.
    """
    try:
        fd = os.open(path, _READ_FLAGS | (0 if follow else _NOFOLLOW))
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise SourceError(
                f"{path} is a symlink (to {os.path.realpath(path)}) where a regular file was listed: a "
                f"LogSource does not follow it. Remove the link, or let the source follow symlinks "
                f"({_FOLLOW_HINT})"
            ) from None
        if e.errno == errno.ENXIO:  # a socket, or a FIFO without a reader on some systems
            raise _not_regular(path, _kind(os.lstat(path).st_mode)) from None
        if not isinstance(e, FileNotFoundError):  # EACCES after a chmod 000, EPERM, EIO, ...
            raise UnreadableFileError(path, _reason(e)) from e
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, _kind(st.st_mode))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


# --- what is watched -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Watch:
    """One watched place: every file of a directory, or a file and its rotations.

    Attributes:
        directory: The directory listed (absolute).
        prefix: Names must start with it (a file's name: ``access.log`` also
            takes ``access.log.1`` and ``access.log-20250102``); empty for a directory.
        pattern: A glob names must match (``*`` for any).
        given: The path as the user gave it, for messages.
        real: ``directory`` with its symlinks resolved: where a symlink's target must be.
    """

    directory: str
    prefix: str
    pattern: str
    given: str = ""
    real: str = ""

    def takes(self, name: str) -> bool:
        """Whether a file named ``name`` in :attr:`directory` is watched."""
        return (
            name.startswith(self.prefix)
            and not name.startswith(".")
            and not name.endswith(COMPRESSED_SUFFIXES)
            and fnmatch.fnmatchcase(name, self.pattern)
        )

    def holds(self, path: str) -> bool:
        """Whether ``path`` (a file the source tracks) is in this watch's directory under its name."""
        return os.path.dirname(path) == self.directory and os.path.basename(path).startswith(self.prefix)


def watches_for(paths: Iterable[str], pattern: str) -> list[Watch]:
    """The watches for paths given to a LogSource: a directory (also one given with a trailing
    separator that does not exist: :func:`check_watches` says so), or a file and its rotations."""
    out: list[Watch] = []
    for given in paths:
        p = os.path.abspath(given)
        if given.endswith(("/", os.sep)) or os.path.isdir(p):
            out.append(Watch(p, "", pattern, given, os.path.realpath(p)))
        else:
            d = os.path.dirname(p)
            out.append(Watch(d, os.path.basename(p), pattern, given, os.path.realpath(d)))
    return out


def _prefix_names_a_directory(w: Watch, name: str) -> SourceError:
    """The error for a directory that a watch of a file and its rotations takes (``LogSource("log")``)."""
    given = w.given or os.path.join(w.directory, w.prefix)
    folder = os.path.join(os.path.dirname(given), name) + "/"
    as_folder = given.rstrip("/" + os.sep) + "/"
    also = "" if os.path.isdir(os.path.join(w.directory, w.prefix)) else ", which does not exist"
    return SourceError(
        f"{given} was read as a file-name prefix (the file {w.prefix} and its rotations, every name in "
        f"{w.directory} that starts with {w.prefix!r}), and {folder} is a directory whose name starts with "
        f"it: a LogSource reads only regular files. To read the files in that folder, name it with a "
        f"trailing '/': LogSource({folder!r}) ({as_folder!r} would name the folder {as_folder}{also}); "
        f"to read the file {w.prefix} and its rotations only, exclude the folder with pattern="
    )


def _near(name: str, directory: str) -> str | None:
    """A name in ``directory`` close to ``name`` (with a trailing ``/`` for a directory), if any."""
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    if not close:
        return None
    return close[0] + ("/" if os.path.isdir(os.path.join(directory, close[0])) else "")


def _missing(w: Watch) -> SourceError:
    """The error for a watch whose path does not exist: the first missing component, and a near name."""
    given = w.given or os.path.join(w.directory, w.prefix)
    path = os.path.abspath(given)
    if os.path.exists(path) and not os.path.isdir(path):
        return SourceError(f"{given} is not a directory (it is given with a trailing {os.sep!r})")
    missing = path
    while not os.path.exists(os.path.dirname(missing)) and os.path.dirname(missing) != missing:
        missing = os.path.dirname(missing)
    near = _near(os.path.basename(missing), os.path.dirname(missing))
    if missing == path:
        message = f"{given} does not exist"
        if near is not None:
            message += f" (did you mean {os.path.join(os.path.dirname(given.rstrip('/' + os.sep)), near)}?)"
    else:
        message = f"{given} does not exist: {missing} does not exist"
        if near is not None:
            message += f" (did you mean {os.path.join(os.path.dirname(missing), near)}?)"
    message += "."
    if w.prefix and missing == path:
        directory = os.path.dirname(given) or "."
        message += (
            " To read a file that is yet to be created, watch its directory: "
            f"LogSource({directory!r}, pattern={w.prefix + '*'!r})"
        )
    return SourceError(message)


def check_watches(watches: Sequence[Watch], tracked: Sequence[Tracked] | None) -> None:
    """Fail on a watched path that does not exist, before a scan could take it for an empty one.

    A watched directory must exist. A watched file must exist, or one of its
    rotations (any name that starts with its name, compressed ones included),
    or it must be where a file the source tracks was (``tracked``: everything
    may have rotated away for a moment). ``tracked=None`` checks directories only.

    Raises:
        SourceError: Naming the path, the first missing component and a near name ("did you mean logs/?").
    """
    for w in watches:
        if not os.path.isdir(w.directory):
            raise _missing(w)
        if not w.prefix or tracked is None:
            continue
        try:
            names = os.listdir(w.directory)
        except OSError:
            continue  # unreadable: the listing says why
        if any(n.startswith(w.prefix) for n in names) or any(w.holds(t.path) for t in tracked):
            continue
        raise _missing(w)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A watched file as listed now.

    Attributes:
        link: Whether ``path`` is a symlink the source may follow (to this file).
    """

    path: str
    dev: int
    ino: int
    size: int
    mtime_ns: int
    link: bool = False


def _listed(w: Watch, name: str, follow_symlinks: bool) -> Candidate | None:
    """The candidate ``name`` of ``w`` is, None if there is nothing to read; refuses what may not be read."""
    path = os.path.join(w.directory, name)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None  # removed since the listing
    link = stat.S_ISLNK(st.st_mode)
    if link:
        target = os.path.realpath(path)
        inside = os.path.dirname(target) == w.real
        if not follow_symlinks and name != w.prefix:
            if inside and w.takes(os.path.basename(target)):
                return None  # another name of a watched file, which is read under its own name
            where = (
                "which is not one of the watched files"
                if inside
                else f"outside the watched directory {w.directory}"
            )
            raise SourceError(
                f"{path} is a symlink to {target}, {where}: a LogSource reads only the files it was pointed "
                f"at. Remove the link, exclude it with pattern=, or let the source follow symlinks "
                f"({_FOLLOW_HINT})"
            )
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None  # a link to nothing: nothing to read
    if stat.S_ISDIR(st.st_mode) and w.prefix and not link:
        raise _prefix_names_a_directory(w, name)
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, _kind(st.st_mode), w.directory)
    if st.st_size == 0:
        return None  # an empty file has nothing to read, nor a fingerprint yet
    return Candidate(path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, link)


def list_candidates(watches: Sequence[Watch], *, follow_symlinks: bool = False) -> list[Candidate]:
    """Every non-empty watched file, once each (by inode), listed now.

    Raises:
        SourceError: On an entry the watch takes that may not be read: a
            symlink out of the watched files (without ``follow_symlinks``), a
            FIFO, socket, device or directory.
    """
    seen: dict[tuple[int, int], Candidate] = {}
    for w in watches:
        try:
            names = os.listdir(w.directory)
        except FileNotFoundError:
            continue  # removed since check_watches: the next scan says so
        except OSError as e:
            raise UnreadableFileError(w.directory, _reason(e), "a watched directory", directory=True) from e
        for name in sorted(names):
            if not w.takes(name):
                continue
            c = _listed(w, name, follow_symlinks)
            if c is not None and (c.dev, c.ino) not in seen:
                seen[(c.dev, c.ino)] = c
    return list(seen.values())


def open_candidate(c: Candidate) -> IO[bytes] | None:
    """``c`` open for reading; None if it is gone or another file has its path since it was listed.

    Raises:
        SourceError: If its path is now a FIFO, a socket, a device or a symlink (see :func:`open_regular`).
    """
    try:
        f = open_regular(c.path, follow=c.link)
    except FileNotFoundError:
        return None
    st = os.fstat(f.fileno())
    if (st.st_dev, st.st_ino) != (c.dev, c.ino):
        f.close()
        return None
    return f


def head_of(c: Candidate, n: int = FINGERPRINT_BYTES) -> bytes | None:
    """The first ``n`` bytes of ``c`` (fewer if it is shorter); None if it is gone or replaced."""
    f = open_candidate(c)
    if f is None:
        return None
    with f:
        return f.read(n)


def _read_at(c: Candidate, offset: int, n: int) -> bytes | None:
    """``n`` bytes of ``c`` at ``offset``; None if it is gone, replaced or shorter now."""
    f = open_candidate(c)
    if f is None:
        return None
    with f:
        f.seek(offset)
        data = f.read(n)
    return data if len(data) == n else None


# --- what the source knows of a file ---------------------------------------------------------


@dataclass(slots=True)
class Tracked:
    """A file the source has read (or is about to): identity, fingerprint and progress.

    Its JSON form, in the position, is ``[path, dev, ino, fp_len, fp, offset, line, flags, size]``
    (``size``: how long the file was when the source last looked; -1 when unknown,
    as in positions written before statekit recorded it).
    """

    path: str
    dev: int
    ino: int
    fp_len: int
    fp: str
    offset: int = 0
    line: int = 0
    flags: int = 0
    size: int = -1

    def to_json(self) -> list[Any]:
        """The JSON-able form kept in checkpoints."""
        t = self
        return [t.path, t.dev, t.ino, t.fp_len, t.fp, t.offset, t.line, t.flags, t.size]

    @classmethod
    def from_json(cls, data: Any) -> Tracked:
        """The tracked file of :meth:`to_json`'s form (or the 8-element form without ``size``).

        Raises:
            ValueError: If ``data`` is not of that form.
        """
        if not isinstance(data, list) or len(data) not in (8, 9):
            raise ValueError(f"not a tracked file: {data!r}")
        path, dev, ino, fp_len, fp, offset, line, flags = data[:8]
        if not isinstance(path, str) or not isinstance(fp, str):
            raise ValueError(f"not a tracked file: {data!r}")
        size = int(data[8]) if len(data) == 9 else -1
        return cls(path, int(dev), int(ino), int(fp_len), fp, int(offset), int(line), int(flags), size)

    def describe(self) -> str:
        """Where reading got to, for messages."""
        return f"{self.path} (read to byte {self.offset}, line {self.line})"


def _check(c: Candidate, t: Tracked, extend_to: int) -> bytes | None:
    """:func:`matches`, returning the head read (the first ``max(fp_len, extend_to)`` bytes) on a match."""
    if c.size < t.offset or c.size < t.fp_len:
        return None
    f = open_candidate(c)
    if f is None:
        return None  # replaced since it was listed: the next scan sees it as it is then
    with f:
        head = f.read(max(t.fp_len, extend_to))
        if fingerprint(head[: t.fp_len]) != t.fp:
            return None
        if t.offset > 0 and not t.flags & (PARTIAL_END | IN_LONG_LINE):
            f.seek(t.offset - 1)
            if f.read(1) != b"\n":
                return None
    if len(head) > t.fp_len:
        t.fp_len, t.fp = len(head), fingerprint(head)
    return head


def holds(f: IO[bytes], t: Tracked) -> bool:
    """Whether open file ``f`` still holds what was read of ``t``: its fingerprint, a line end at the offset.

    Checked again on the descriptor a read then uses, so a file truncated and
    written again since it was listed is not read from the middle of a line.
    """
    if os.fstat(f.fileno()).st_size < max(t.offset, t.fp_len):
        return False
    f.seek(0)
    if fingerprint(f.read(t.fp_len)) != t.fp:
        return False
    if t.offset > 0 and not t.flags & (PARTIAL_END | IN_LONG_LINE):
        f.seek(t.offset - 1)
        return f.read(1) == b"\n"
    return True


def matched_head(c: Candidate, t: Tracked) -> bytes | None:
    """:func:`matches`, returning the first :data:`FINGERPRINT_BYTES` of ``c`` on a match, else None."""
    return _check(c, t, FINGERPRINT_BYTES)


def matches(c: Candidate, t: Tracked, *, extend_to: int = FINGERPRINT_BYTES) -> bool:
    """Whether file ``c`` holds what was read of ``t``: its fingerprint, its size, a line end at the offset.

    On a match, ``t``'s fingerprint is extended to the first ``extend_to``
    bytes (fewer if the file is shorter), so a file that was small when first
    seen is recognised by more of its content later.
    """
    return _check(c, t, extend_to) is not None


def _rotations_first(t: Tracked, cands: Iterable[Candidate]) -> list[Candidate]:
    stem = os.path.basename(t.path)
    return sorted(cands, key=lambda c: (not os.path.basename(c.path).startswith(stem), -c.size))


def find_copy(
    t: Tracked, cands: Sequence[Candidate], exclude: Container[tuple[int, int]] = ()
) -> Candidate | None:
    """The file, under another inode, that holds what was read of ``t``: what ``copytruncate`` leaves.

    Rotations of ``t``'s own name come first, then the largest file; files
    whose ``(dev, ino)`` is in ``exclude`` (``t``'s own inode, files already
    bound to others) are not considered. The LogSource's scan and the Spark
    source's tasks share it, so both find a file again by the same rule.
    """
    for c in _rotations_first(t, (c for c in cands if (c.dev, c.ino) not in exclude)):
        if matches(c, t):
            return c
    return None


def find_prefix_copy(
    t: Tracked, cands: Sequence[Candidate], exclude: Container[tuple[int, int]] = ()
) -> Candidate | None:
    """A file that holds the first bytes of ``t``'s content but less than was read of it.

    What ``copytruncate`` leaves when the source read the original past the
    point its copy ended (lines appended between the copy and the truncation):
    everything in it was read. Recognised by ``t``'s fingerprint, so it must
    be at least as long as the fingerprint (see :func:`is_copy`, which keeps
    the fingerprint that short while such a copy exists).
    """
    for c in _rotations_first(t, (c for c in cands if (c.dev, c.ino) not in exclude)):
        if t.fp_len <= c.size < t.offset:
            head = head_of(c, t.fp_len)
            if head is not None and len(head) == t.fp_len and fingerprint(head) == t.fp:
                return c
    return None


def is_copy(c: Candidate, head: bytes, original: Candidate, original_head: bytes, t: Tracked) -> bool:
    """Whether ``c`` (first bytes ``head``) copies a prefix of ``original``, the whole file ``t`` is bound to.

    What logrotate's ``copytruncate`` (or ``copy``) makes before the original is
    truncated: the copy's bytes are the original's at the same offsets, and it
    is no longer than the original. Checked by the first bytes and by the
    last :data:`_TAIL` bytes of the copy against the original's at the same
    offset, so a file that merely starts with the same header is no copy. The
    lengths compared are the files' lengths now, not the listing's: a listing
    takes the original's length before the copy's, and the copy can pass that
    length in between (the writer appending, the copy catching up). If the
    original was truncated or rewritten in the meantime (its first bytes are
    no longer ``original_head``), the first bytes decide.

    On a copy shorter than ``t``'s fingerprint, the fingerprint is cut to the
    copy's length: once the original is truncated, the copy is still recognised
    (:func:`find_prefix_copy`), also if it holds less than was read.
    """
    if head != original_head[: len(head)]:
        return False
    # The copy's length first, then the original's: a copy being made never passes its original.
    end = _end_of(c, len(head))
    if end is None:
        return False  # gone since the listing
    size, mine = end
    whole = _whole_at(original, original_head, size - len(mine), len(mine))
    if whole is not None:  # the original as it is now: the copy is no longer, and ends as it does there
        now, theirs = whole
        if size > now or (theirs is not None and theirs != mine):
            return False  # (theirs None: truncated since, the first bytes decide)
    if len(head) < t.fp_len:
        t.fp_len, t.fp = len(head), fingerprint(head)
    return True


def _end_of(c: Candidate, head_len: int) -> tuple[int, bytes] | None:
    """``c``'s length now and its last bytes after the first ``head_len`` (at most :data:`_TAIL`).

    None if it is gone, replaced, or shorter by the time they are read.
    """
    f = open_candidate(c)
    if f is None:
        return None
    with f:
        size = os.fstat(f.fileno()).st_size
        n = min(_TAIL, max(0, size - head_len))
        f.seek(size - n)
        data = f.read(n)
    return (size, data) if len(data) == n else None


def _whole_at(c: Candidate, head: bytes, offset: int, n: int) -> tuple[int, bytes | None] | None:
    """``c``'s length now and its ``n`` bytes at ``offset`` (None if shorter), if it begins with ``head``.

    None if it is gone, truncated or rewritten: no longer beginning with ``head``.
    The length is taken before the head is read, so a truncation after it shows in the head.
    """
    f = open_candidate(c)
    if f is None:
        return None
    with f:
        size = os.fstat(f.fileno()).st_size
        if f.read(len(head)) != head:
            return None
        f.seek(offset)
        data = f.read(n)
    return size, data if len(data) == n else None


def count_lines(c: Candidate, end: int) -> tuple[int, bool] | None:
    """Newlines in the first ``end`` bytes of ``c`` and whether those end in one; None if it is gone."""
    f = open_candidate(c)
    if f is None:
        return None
    n = pos = 0
    last = b""
    with f:
        while pos < end and (block := f.read(min(_BLOCK, end - pos))):
            n += block.count(b"\n")
            pos += len(block)
            last = block[-1:]
    return n, last == b"\n"


# --- where a file's content went when it was compressed ---------------------------------------


@dataclass(frozen=True, slots=True)
class CompressedCopy:
    """A compressed file that holds a tracked file's content: its path and the content's length."""

    path: str
    size: int


def find_compressed(t: Tracked, watches: Sequence[Watch]) -> CompressedCopy | None:
    """The compressed file (``.gz``, ``.bz2``, ``.xz``) in the watched directories that holds ``t``'s content.

    logrotate's ``compress`` turns a rotation into ``access.log.1.gz`` and
    removes it: the decompressed first bytes carry ``t``'s fingerprint, and
    the decompressed length says whether everything was read. Only files
    whose name starts with a watch's prefix are looked into; each is
    decompressed as a stream (memory bounded by a block), once for each file
    the source finds gone.
    """
    for c in list_compressed(watches):
        if decompressible(c.path) and (size := _decompressed_size(c.path, t)) is not None:
            return CompressedCopy(c.path, size)
    return None


@dataclass(frozen=True, slots=True)
class CompressedFile:
    """A compressed file among the watched ones (a name of a watch's, with a compressed suffix), as listed.

    ``identity`` tells it from any other: a rename (logrotate's ``.2.gz`` to
    ``.3.gz``) keeps it; a new file made on the inode of one deleted (which
    ext4 hands out again at once) has another modification time.
    """

    path: str
    dev: int
    ino: int
    mtime_ns: int

    @property
    def identity(self) -> tuple[int, int, int]:
        """Device, inode and modification time (ns)."""
        return (self.dev, self.ino, self.mtime_ns)


def list_compressed(watches: Sequence[Watch]) -> list[CompressedFile]:
    """The compressed files in the watched directories whose names start with a watch's prefix, by path.

    Symlinks and what is not a regular file are left out (logrotate writes
    neither), as is a name that starts with a dot.
    """
    found: dict[str, CompressedFile] = {}
    for w in watches:
        try:
            names = os.listdir(w.directory)
        except OSError:
            continue  # unreadable: the listing of the files to read says why
        for name in names:
            if (
                name.startswith(".")
                or not name.startswith(w.prefix)
                or not name.endswith(COMPRESSED_SUFFIXES)
            ):
                continue
            path = os.path.join(w.directory, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue  # removed since the listing
            if stat.S_ISREG(st.st_mode):
                found[path] = CompressedFile(path, st.st_dev, st.st_ino, st.st_mtime_ns)
    return [found[p] for p in sorted(found)]


def compressed_identities(data: Any) -> set[tuple[int, int, int]]:
    """The identities of a position's list of compressed files (``[[dev, ino, mtime_ns], ...]``).

    Raises:
        ValueError: If ``data`` is not of that form.
    """
    if not isinstance(data, list):
        raise ValueError(f"not a list of compressed files: {str(data)[:200]}")
    out: set[tuple[int, int, int]] = set()
    for e in data:
        if not (isinstance(e, list) and len(e) == 3 and all(type(x) is int for x in e)):
            raise ValueError(f"not a compressed file's identity: {e!r}")
        out.add((e[0], e[1], e[2]))
    return out


def decompressible(path: str) -> bool:
    """Whether ``path``'s compression is one the standard library reads (``.gz``, ``.bz2``, ``.xz``)."""
    return os.path.splitext(path)[1] in _OPENERS


def compressed_head(path: str, n: int) -> bytes | None:
    """The first ``n`` bytes of ``path`` decompressed (fewer if it holds fewer).

    None for a format the standard library does not read (``.zst``, ``.zip``,
    ``.lz4``, ``.Z``), a file gone or replaced by what is not a regular file,
    and one damaged or still being written.
    """
    head: bytes | None = _decompressing(path, lambda z: z.read(n))
    return head


def decompressed_length(path: str) -> int | None:
    """How many bytes ``path`` holds decompressed (a stream: memory bounded by a block); None as above."""
    return _decompressing(path, _length_of_rest)


def _decompressed_size(path: str, t: Tracked) -> int | None:
    """The decompressed length of ``path`` if its first bytes carry ``t``'s fingerprint, else None."""

    def size(z: Any) -> int | None:
        head = z.read(t.fp_len)
        if len(head) != t.fp_len or fingerprint(head) != t.fp:
            return None
        return len(head) + _length_of_rest(z)

    return _decompressing(path, size)


def _decompressing(path: str, read: Callable[[Any], _T]) -> _T | None:
    """``read`` of ``path``'s decompressed stream; None where :func:`compressed_head` says."""
    opener = _OPENERS.get(os.path.splitext(path)[1])
    if opener is None:
        return None
    try:
        raw = open_regular(path)
    except (OSError, SourceError):
        return None  # gone, a symlink, or not a regular file: not where logrotate put the content
    try:
        with raw, opener(raw) as z:
            return read(z)
    except (OSError, EOFError, lzma.LZMAError, ValueError):
        return None  # damaged, or still being written


def _length_of_rest(z: Any) -> int:
    """The bytes left in the stream ``z``, read a block at a time."""
    size = 0
    while block := z.read(_BLOCK):
        size += len(block)
    return size


# --- reading lines ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LongLine:
    """A line longer than the limit, reported instead of read.

    Attributes:
        offset: Where it starts (bytes).
        head: Its first bytes (up to :data:`LONG_LINE_HEAD`, or the limit if lower).
        length: Its length in bytes, without the newline.
        ended: False if reading stopped before its newline (it is at least ``length`` bytes).
    """

    offset: int
    head: bytes
    length: int
    ended: bool = True

    def describe(self, limit: int) -> str:
        """What is wrong with it, for its bad record."""
        size = f"{self.length} bytes" if self.ended else f"at least {self.length} bytes (no newline yet)"
        return (
            f"LineTooLong: a line of {size}, more than statekit.source.max-line-bytes={limit}; "
            f"its first {len(self.head)} bytes are kept, the rest was skipped"
        )


class LineReader:
    """The lines of an open file from an offset, in blocks; a line longer than ``max_line`` comes cut short.

    Iterating yields ``(offset, body)``, complete lines joined by newlines
    (without the last one; every line at most ``max_line`` bytes), and a
    :class:`LongLine` for each longer line, whose rest is skipped without
    being kept: time linear in the bytes read, memory bounded by ``max_line``
    plus a block, whatever the lines are.

    Args:
        f: The file, open in binary mode.
        offset: Where to start: a line start, or inside a long line already
            reported (``skipping``).
        max_line: The longest line read whole (bytes, without its newline).
        end: Where to stop (None: the end of the file).
        skipping: Start inside a long line: skip to its newline first.

    After the iteration: :attr:`offset` is where the next line starts (or,
    while :attr:`skipping`, how far the long line was skipped), :attr:`tail`
    the last line if it has no newline yet (at most ``max_line`` bytes, from
    :attr:`offset`), :attr:`pos` how far the file was read.
    """

    def __init__(
        self, f: IO[bytes], offset: int, *, max_line: int, end: int | None = None, skipping: bool = False
    ) -> None:
        if max_line < 1:
            raise ValueError(f"max_line must be at least 1, not {max_line}")
        self.f = f
        self.offset = offset
        self.pos = offset
        self.max_line = max_line
        self.end = end
        self.skipping = skipping
        self.tail = b""

    def __iter__(self) -> Iterator[tuple[int, bytes] | LongLine]:
        f, end, max_line = self.f, self.end, self.max_line
        cap = min(LONG_LINE_HEAD, max_line)
        pos = self.offset
        f.seek(pos)
        pending = bytearray()  # the start of an unfinished line, at most max_line bytes
        start = pos  # where the unfinished (or long) line starts
        head: bytes | None = None  # the first bytes of a long line that started in this read
        length = 0  # bytes of the long line so far
        skipping = self.skipping
        while True:
            want = _BLOCK if end is None else min(_BLOCK, end - pos)
            if want <= 0:
                break
            block = f.read(want)
            if not block:
                break
            base = pos
            pos += len(block)
            i = 0
            if skipping or pending:
                nl = block.find(b"\n")
                if skipping:
                    if nl < 0:
                        length += len(block)
                        continue
                    skipping = False
                    if head is not None:
                        yield LongLine(start, head, length + nl)
                        head = None
                elif nl < 0:
                    if len(pending) + len(block) > max_line:
                        skipping, length = True, len(pending) + len(block)
                        head = bytes(pending[:cap]) + block[: max(0, cap - len(pending))]
                        pending = bytearray()
                    else:
                        pending += block
                    continue
                elif len(pending) + nl > max_line:
                    yield LongLine(
                        start, bytes(pending[:cap]) + block[: max(0, cap - len(pending))], len(pending) + nl
                    )
                    pending = bytearray()
                else:
                    pending += block[:nl]
                    yield start, bytes(pending)
                    pending = bytearray()
                i = nl + 1
                self.offset = base + i
            cut = block.rfind(b"\n", i)
            if cut >= 0:
                body = block[i:cut]
                if len(body) > max_line:
                    yield from self._split(base + i, body)
                else:
                    yield base + i, body
                i = cut + 1
                self.offset = base + i
            start = base + i
            if len(block) - i > max_line:
                skipping, length, head = True, len(block) - i, block[i : i + cap]
            elif i < len(block):
                pending = bytearray(memoryview(block)[i:])
        self.pos = pos
        self.skipping = skipping
        if skipping:
            if head is not None:
                yield LongLine(start, head, length, ended=False)
            self.offset = pos
        self.tail = bytes(pending)

    def _split(self, start: int, body: bytes) -> Iterator[tuple[int, bytes] | LongLine]:
        """``body``'s lines as bodies of lines within the limit and the long lines between them."""
        pieces = body.split(b"\n")
        if max(map(len, pieces)) <= self.max_line:
            yield start, body
            return
        cap = min(LONG_LINE_HEAD, self.max_line)
        run: list[bytes] = []
        run_start = pos = start
        for piece in pieces:
            if len(piece) > self.max_line:
                if run:
                    yield run_start, b"\n".join(run)
                    run = []
                yield LongLine(pos, piece[:cap], len(piece))
            else:
                if not run:
                    run_start = pos
                run.append(piece)
            pos += len(piece) + 1
        if run:
            yield run_start, b"\n".join(run)
