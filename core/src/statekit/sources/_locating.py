"""Where a LogSource's files are now: known files bound to their content, new files, and lost input.

Each known file (:class:`~statekit.sources._files.Tracked`) is found again by
identity (device, inode, the fingerprint of its first bytes), or through a
copy of it (``copytruncate``), or reported lost (:class:`LostInput`,
:class:`InputLostWarning`) when something of it was not read. Files not
known yet follow, in the order found. :class:`FileLocator` is the part of
:class:`~statekit.sources._logsource.LogSource` that does it.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .._errors import SourceError
from ._files import (
    PARTIAL_END,
    Candidate,
    Tracked,
    UnreadableFileError,
    Watch,
    check_watches,
    compressed_head,
    count_lines,
    decompressed_length,
    decompressible,
    find_compressed,
    find_copy,
    find_prefix_copy,
    fingerprint,
    head_of,
    is_copy,
    list_candidates,
    list_compressed,
    matched_head,
    watches_for,
)

__all__ = ["FileLocator", "InputLostWarning", "LostInput", "unreadable_at"]

_log = logging.getLogger("statekit.sources")


class InputLostWarning(RuntimeWarning):
    """Lines may have been lost: a file was moved away or changed before it was read to its end."""


@dataclass(frozen=True, slots=True)
class LostInput:
    """A file the source had not finished and can no longer read.

    Attributes:
        path: Where the file was.
        offset: How far it was read (bytes).
        line: How far it was read (lines; None when not known at ``offset``).
        reason: What happened to it.
        end: Where the bytes known not to have been read end (they are
            ``offset`` to ``end``); None when the source cannot know whether
            anything was written after ``offset``.
        progress: How the source got to ``offset``: ``read to``, or
            ``planned to`` (Spark's driver, which plans ranges that tasks read);
            empty for a file the source never had (nothing of it was read).
    """

    path: str
    offset: int
    line: int | None
    reason: str
    end: int | None = None
    progress: str = "read to"

    def __str__(self) -> str:
        line = "" if self.line is None else f", line {self.line}"
        if self.end is not None:
            unread = f"bytes {self.offset}-{self.end} ({self.end - self.offset} bytes) were not read"
        else:
            unread = "lines written to it after that point, if any, were not read"
        where = f" ({self.progress} byte {self.offset}{line})" if self.progress else ""
        return f"{self.path}{where} {self.reason}; {unread}"


class FileLocator:
    """Finds a source's files: the watched paths, known files where they are now, new ones, lost ones.

    A base of :class:`~statekit.sources._logsource.LogSource`, which sets the
    attributes below.
    """

    paths: list[str]
    pattern: str
    follow_symlinks: bool
    on_lost: str
    lost: list[LostInput]
    _progress = "read to"  # how LostInput describes the offset; the Spark driver's plans
    #: The compressed files (:attr:`CompressedFile.identity`) the last scan of the position listed;
    #: None where not known (no position yet, or one of a statekit before it kept them).
    compressed_seen: set[tuple[int, int, int]] | None = None
    #: What this scan listed, for the next position.
    compressed_now: list[tuple[int, int, int]]

    def watches(self) -> list[Watch]:
        """What the source watches, from its paths and pattern."""
        return watches_for(self.paths, self.pattern)

    # --- finding the files ----------------------------------------------------------

    def locate_files(self, tracked: list[Tracked]) -> list[tuple[Tracked, Candidate]]:
        """Where each known file is now, then the new files, in the order a read takes them.

        What :meth:`read` does before reading, for readers that keep their
        position elsewhere (the Spark source plans its micro-batches with it).
        Each entry of ``tracked`` is re-bound to the file that holds it now
        (its path, and its inode for a ``copytruncate`` copy, are updated);
        new files follow at offset 0. Files that cannot be found are left out
        and reported as by :meth:`read` (:attr:`lost`, a warning, or
        :class:`~statekit.errors.SourceError` under ``on_lost="fail"``).
        """
        self.lost = []
        try:
            return self._scan(tracked)
        except UnreadableFileError as e:
            raise unreadable_at(e, tracked) from e.__cause__

    def _scan(self, tracked: list[Tracked]) -> list[tuple[Tracked, Candidate]]:
        """Binds each known file to the file that holds it now; lists new files; reports lost ones.

        In order: a known file on its own inode with its content whole; else
        its copy under another inode (what ``copytruncate`` leaves), finished
        from the offset; else a copy of less than was read (everything in it
        was read), or the file is gone and reported if anything of it was not
        read. Then the files not bound so far: a copy of a file that is still
        whole, known or new (between ``copytruncate``'s copy and its
        truncation), is not read, since the original holds the same lines; the
        rest are new files, in the order found (by modification time).
        """
        watches = self.watches()
        check_watches(watches, tracked)
        known = {(t.fp_len, t.fp) for t in tracked}  # what the source has read: the heads it saw
        explained: set[str] = set()  # compressed files found to hold a known file's content
        cands, by_inode, claimed, bound, heads, copies = self._bind(tracked, watches)
        for i, c in copies.items():
            t = tracked[i]
            if c.size < t.size:
                self._lose(LostInput(
                    t.path, c.size, None,
                    f"was truncated after its copy {c.path} was made, and what was written to it in "
                    "between (as logrotate's copytruncate loses it) was truncated away",
                    end=t.size, progress="as last seen, up to",
                ))  # fmt: skip
            t.dev, t.ino = c.dev, c.ino
        for i, t in enumerate(tracked):
            if i in bound:
                continue
            p = find_prefix_copy(t, cands, claimed)
            if p is not None:
                self._fully_read_copy(t, p)
                bound[i] = p
                claimed.add((p.dev, p.ino))
                continue
            z = self._gone(t, by_inode.get((t.dev, t.ino)), watches)
            if z is not None:
                explained.add(z)
        plan: list[tuple[Tracked, Candidate]] = []
        for i, t in enumerate(tracked):
            found = bound.get(i)
            if found is not None:
                t.path, t.size = found.path, found.size
                plan.append((t, found))
        # Known files still whole, then new files, longest first: a copy is never longer than its
        # original, which is then already here to compare it with (the original and its copy can
        # both be new: a job that starts between copytruncate's copy and its truncation).
        owners = [(bound[i], head, tracked[i]) for i, head in heads.items() if head is not None]
        new = _new_files(cands, claimed, owners)
        known.update((t.fp_len, t.fp) for t, _ in new)
        self._compressed_unseen(watches, known, explained)
        return plan + new

    def _compressed_unseen(
        self, watches: Sequence[Watch], known: set[tuple[int, str]], explained: set[str]
    ) -> None:
        """Reports a compressed file new since the position whose content is no file the source has had.

        Its lines were written, rotated and compressed between two scans (the
        log's new generation was empty at the last one, so not tracked): the
        one trace left of them. A compressed file is new when its
        :attr:`~statekit.sources._files.CompressedFile.identity` was not listed
        by the position's scan (:attr:`compressed_seen`); it is a known file's
        when its decompressed first bytes carry a fingerprint of a file the
        source has tracked. Only the formats the standard library reads
        (``.gz``, ``.bz2``, ``.xz``) can be looked into.
        """
        listed = list_compressed(watches)
        seen = self.compressed_seen
        if seen is None:  # no earlier listing to compare with: what is here now is where the source starts
            self.compressed_now = [c.identity for c in listed]
            return
        self.compressed_now = []
        longest = max((n for n, _ in known), default=0)
        for c in listed:
            if c.identity in seen or c.path in explained or not decompressible(c.path):
                self.compressed_now.append(c.identity)
                continue
            head = compressed_head(c.path, max(longest, 1))
            if head is None:
                continue  # gone, damaged or still being written: looked into again at the next scan
            self.compressed_now.append(c.identity)
            if not head or any(len(head) >= n and fingerprint(head[:n]) == fp for n, fp in known):
                continue
            size = decompressed_length(c.path)
            self._lose(LostInput(
                c.path, 0, None,
                "appeared, compressed, since the source last looked, and holds lines of no file the source "
                "has read: they were written, rotated and compressed between two reads (compressed files "
                "are not read; decompress it into a file the source watches under a new name to read "
                "them, and run the job at least once between two rotations)",
                end=size, progress="",
            ))  # fmt: skip

    def _bind(self, tracked: list[Tracked], watches: Sequence[Watch]) -> _Binding:
        """Lists the files and binds the known ones found whole or copied; lists again if some are missing.

        A known file is taken as missing (gone, or truncated with no copy found) only from a
        listing taken after it was first found missing. Its check reads the file after the
        listing was taken, so it can fail on a truncation that came after the listing, which then
        shows the copy half written or not yet made. logrotate truncates (and deletes a file it
        compressed) only once the copy is complete, so a listing taken after the failure shows
        where the content is, at its full length. Each file is first found missing once, so this
        takes at most one listing more than there are known files; usually one, or two when a
        file has gone.
        """
        missing_before: set[int] = set()  # known files found missing in an earlier listing
        while True:
            cands = list_candidates(watches, follow_symlinks=self.follow_symlinks)
            by_inode = {(c.dev, c.ino): c for c in cands}
            claimed: set[tuple[int, int]] = set()
            bound: dict[int, Candidate] = {}
            heads: dict[int, bytes | None] = {}  # the first bytes of a file bound on its own inode
            for i, t in enumerate(tracked):
                c = by_inode.get((t.dev, t.ino))
                if c is not None and (head := matched_head(c, t)) is not None:
                    bound[i], heads[i] = c, head
                    claimed.add((c.dev, c.ino))
            copies: dict[int, Candidate] = {}
            for i, t in enumerate(tracked):
                if i in bound:
                    continue
                # A copy of what was read under another inode: what copytruncate leaves.
                c = find_copy(t, cands, claimed | {(t.dev, t.ino)})
                if c is not None:
                    bound[i] = copies[i] = c
                    claimed.add((c.dev, c.ino))
            missing = set(range(len(tracked))) - bound.keys()
            if missing <= missing_before:
                return _Binding(cands, by_inode, claimed, bound, heads, copies)
            missing_before |= missing

    def _fully_read_copy(self, t: Tracked, p: Candidate) -> None:
        """Moves ``t`` to ``p``, a copy of its first bytes, as read to its end: ``t`` was read past its end.

        ``t`` stays the same entry (the Spark source keeps its id), now for ``p``.
        """
        counted = count_lines(p, p.size)
        head = head_of(p) or b""
        lines, ends_with_newline = counted if counted is not None else (0, True)
        if t.size > t.offset:
            self._lose(LostInput(
                t.path, t.offset, t.line,
                f"was truncated (as by logrotate's copytruncate) and its copy {p.path} holds only its first "
                f"{p.size} bytes, less than was read",
                end=t.size, progress=self._progress,
            ))  # fmt: skip
        else:
            _log.debug("%s was read to its end; its copy %s holds less, all of it read", t.describe(), p.path)
        t.dev, t.ino, t.fp_len, t.fp = p.dev, p.ino, len(head), fingerprint(head)
        t.offset, t.line = p.size, lines + (not ends_with_newline)
        t.flags = 0 if ends_with_newline else PARTIAL_END

    def _gone(self, t: Tracked, same: Candidate | None, watches: Sequence[Watch]) -> str | None:
        """Reports ``t``, found nowhere, if anything of it was not read; returns where it went compressed.

        That is the compressed file that holds its content, None if none does.
        """
        if same is not None and same.path == t.path:
            reason = (
                "was truncated or rewritten in place (as by logrotate's copytruncate), with no copy of it "
                "among the watched files"
            )
            again = min(same.size, t.offset)
            if again > 0:
                # Read again from its start as new content: what a truncation to a non-zero length
                # kept of what was read is then read twice. Its first bytes cannot tell (the
                # fingerprint covers more than is left), so the range is named exactly.
                reason += (
                    f"; it is read again from its start as new content, so its bytes 0-{again} (its "
                    f"first {again} bytes now) are counted twice if the truncation kept them (a file "
                    "truncated to a non-zero length, then appended to)"
                )
        elif same is not None:
            reason = (
                f"was deleted or moved out, and its inode number now belongs to another file, {same.path}"
            )
        else:
            reason = "is no longer among the watched files (moved out or deleted)"
        z = find_compressed(t, watches)
        if z is not None:
            if z.size > t.offset:
                self._lose(LostInput(
                    t.path, t.offset, t.line,
                    f"was compressed to {z.path} before it was read to its end (compressed files are "
                    "not read)",
                    end=z.size, progress=self._progress,
                ))  # fmt: skip
            else:
                _log.debug("%s was read to its end, then compressed to %s", t.describe(), z.path)
            return z.path
        if t.size > t.offset:
            self._lose(LostInput(
                t.path, t.offset, t.line, f"{reason}; it was {t.size} bytes long when the source last looked",
                end=t.size, progress=self._progress,
            ))  # fmt: skip
        elif t.size < 0 or (same is not None and same.path == t.path):
            # No length on record (a position of an earlier statekit), or a file truncated in place
            # whose copy went elsewhere: whatever was written after the last look is not known.
            self._lose(LostInput(t.path, t.offset, t.line, reason, progress=self._progress))
        else:
            _log.debug(
                "%s was read to its end as last seen, then %s", t.describe(), reason.removeprefix("is ")
            )
        return None

    def _lose(self, lost: LostInput) -> None:
        self.lost.append(lost)
        if self.on_lost == "fail":
            raise SourceError(
                f"input lost: {lost}. To accept the loss and go on, run once with on_lost='warn'"
            )
        warnings.warn(f"input lost: {lost}", InputLostWarning, stacklevel=5)


def unreadable_at(e: UnreadableFileError, tracked: Sequence[Tracked]) -> UnreadableFileError:
    """``e`` saying how far its file was read (from ``tracked``), if it does not say so already."""
    if e.where:
        return e
    t = next((t for t in tracked if t.path == e.path), None)
    if t is None or (t.offset == 0 and not t.flags):
        return e.at("not read yet: the source reads it from byte 0")
    return e.at(f"read to byte {t.offset}, line {t.line}: the source goes on from there")


class _Binding(NamedTuple):
    """What a listing found of the known files: each bound one's file, the copies among them."""

    cands: list[Candidate]
    by_inode: dict[tuple[int, int], Candidate]
    claimed: set[tuple[int, int]]
    bound: dict[int, Candidate]
    heads: dict[int, bytes | None]
    copies: dict[int, Candidate]


def _new_files(
    cands: list[Candidate],
    claimed: set[tuple[int, int]],
    owners: list[tuple[Candidate, bytes, Tracked]],
) -> list[tuple[Tracked, Candidate]]:
    """The files no known file is bound to, in the order found; a copy of a file still whole is left out."""
    new: list[tuple[Tracked, Candidate]] = []
    for c in sorted((c for c in cands if (c.dev, c.ino) not in claimed), key=lambda c: (-c.size, c.path)):
        head = head_of(c)
        if not head:
            continue  # gone since the listing
        original = next((o for o, oh, ot in owners if is_copy(c, head, o, oh, ot)), None)
        if original is not None:
            _log.debug("%s is a copy of %s, which is still whole: not read again", c.path, original.path)
            continue
        t = Tracked(c.path, c.dev, c.ino, len(head), fingerprint(head), size=c.size)
        owners.append((c, head, t))
        new.append((t, c))
    return sorted(new, key=lambda tc: (tc[1].mtime_ns, tc[1].path))
