"""Which files a :class:`~statekit.sources.LogSource` watches, and how it knows a file again.

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
  which is then finished from the saved offset.

This is what Vector (fingerprints) and Filebeat (device and inode) each learned
half of; see docs/operations.md#input-files.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "COMPRESSED_SUFFIXES",
    "FINGERPRINT_BYTES",
    "Candidate",
    "Tracked",
    "Watch",
    "find_copy",
    "fingerprint",
    "list_candidates",
    "matches",
    "watches_for",
]

#: Bytes at the start of a file that make its fingerprint (fewer while the file is shorter).
FINGERPRINT_BYTES = 8192

#: Names ending so are never read as text: logrotate's compressed rotations.
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".zip", ".lz4", ".Z")

# Entry flags, kept in the position.
PARTIAL_END = 1
"""The saved offset ends a last line that had no newline (read after the inactivity time)."""


def fingerprint(data: bytes) -> str:
    """The fingerprint of a file's first bytes: 16 hex digits of BLAKE2b."""
    return hashlib.blake2b(data, digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class Watch:
    """One watched place: every file of a directory, or a file and its rotations.

    Attributes:
        directory: The directory listed.
        prefix: Names must start with it (a file's name: ``access.log`` also
            takes ``access.log.1`` and ``access.log-20250102``); empty for a directory.
        pattern: A glob names must match (``*`` for any).
    """

    directory: str
    prefix: str
    pattern: str

    def takes(self, name: str) -> bool:
        """Whether a file named ``name`` in :attr:`directory` is watched."""
        return (
            name.startswith(self.prefix)
            and not name.startswith(".")
            and not name.endswith(COMPRESSED_SUFFIXES)
            and fnmatch.fnmatchcase(name, self.pattern)
        )


def watches_for(paths: Iterable[str], pattern: str) -> list[Watch]:
    """The watches for paths given to a LogSource: a directory, or a file (that may not exist yet)."""
    out: list[Watch] = []
    for p in paths:
        p = os.path.abspath(p)
        if os.path.isdir(p):
            out.append(Watch(p, "", pattern))
        else:
            out.append(Watch(os.path.dirname(p), os.path.basename(p), pattern))
    return out


@dataclass(frozen=True, slots=True)
class Candidate:
    """A watched file as listed now."""

    path: str
    dev: int
    ino: int
    size: int
    mtime_ns: int


def list_candidates(watches: Sequence[Watch]) -> list[Candidate]:
    """Every regular, non-empty watched file, once each (by inode), listed now."""
    seen: dict[tuple[int, int], Candidate] = {}
    for w in watches:
        try:
            names = os.listdir(w.directory)
        except FileNotFoundError:
            continue
        for name in names:
            if not w.takes(name):
                continue
            path = os.path.join(w.directory, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue  # removed since the listing
            if not _is_regular(st.st_mode) or st.st_size == 0:
                continue  # an empty file has nothing to read, nor a fingerprint yet
            key = (st.st_dev, st.st_ino)
            if key not in seen:
                seen[key] = Candidate(path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    return list(seen.values())


def _is_regular(mode: int) -> bool:
    import stat

    return stat.S_ISREG(mode)


@dataclass(slots=True)
class Tracked:
    """A file the source has read (or is about to): identity, fingerprint and progress.

    Its JSON form, in the position, is ``[path, dev, ino, fp_len, fp, offset, line, flags]``.
    """

    path: str
    dev: int
    ino: int
    fp_len: int
    fp: str
    offset: int = 0
    line: int = 0
    flags: int = 0

    def to_json(self) -> list[Any]:
        """The JSON-able form kept in checkpoints."""
        return [self.path, self.dev, self.ino, self.fp_len, self.fp, self.offset, self.line, self.flags]

    @classmethod
    def from_json(cls, data: Any) -> Tracked:
        """The tracked file of :meth:`to_json`'s form.

        Raises:
            ValueError: If ``data`` is not of that form.
        """
        if not isinstance(data, list) or len(data) != 8:
            raise ValueError(f"not a tracked file: {data!r}")
        path, dev, ino, fp_len, fp, offset, line, flags = data
        if not isinstance(path, str) or not isinstance(fp, str):
            raise ValueError(f"not a tracked file: {data!r}")
        return cls(path, int(dev), int(ino), int(fp_len), fp, int(offset), int(line), int(flags))

    def describe(self) -> str:
        """Where reading got to, for messages."""
        return f"{self.path} (read to byte {self.offset}, line {self.line})"


def matches(c: Candidate, t: Tracked, *, extend_to: int = FINGERPRINT_BYTES) -> bool:
    """Whether file ``c`` holds what was read of ``t``: its fingerprint, its size, a line end at the offset.

    On a match, ``t``'s fingerprint is extended to the first ``extend_to``
    bytes (fewer if the file is shorter), so a file that was small when first
    seen is recognised by more of its content later.
    """
    if c.size < t.offset or c.size < t.fp_len:
        return False
    try:
        with open(c.path, "rb") as f:
            st = os.fstat(f.fileno())
            if (st.st_dev, st.st_ino) != (c.dev, c.ino):
                return False  # replaced since it was listed: the next run sees it as it is then
            head = f.read(max(t.fp_len, extend_to))
            if fingerprint(head[: t.fp_len]) != t.fp:
                return False
            if t.offset > 0 and not t.flags & PARTIAL_END:
                f.seek(t.offset - 1)
                if f.read(1) != b"\n":
                    return False
    except FileNotFoundError:
        return False
    if len(head) > t.fp_len:
        t.fp_len, t.fp = len(head), fingerprint(head)
    return True


def find_copy(
    t: Tracked, cands: Sequence[Candidate], exclude: Container[tuple[int, int]] = ()
) -> Candidate | None:
    """The file, under another inode, that holds what was read of ``t``: what ``copytruncate`` leaves.

    Rotations of ``t``'s own name come first, then the largest file; files
    whose ``(dev, ino)`` is in ``exclude`` (``t``'s own inode, files already
    bound to others) are not considered. The LogSource's scan and the Spark
    source's tasks share it, so both find a file again by the same rule.
    """
    stem = os.path.basename(t.path)
    others = sorted(
        (c for c in cands if (c.dev, c.ino) not in exclude),
        key=lambda c: (not os.path.basename(c.path).startswith(stem), -c.size),
    )
    for c in others:
        if matches(c, t):
            return c
    return None
