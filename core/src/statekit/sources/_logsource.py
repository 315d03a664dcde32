"""The rotation-safe log source: lines of files that grow, rotate, move and appear, read exactly once.

The position, kept in statekit's checkpoints, is JSON::

    ["statekit.LogSource/1", files, cur, offset, line]

``files`` lists every watched file the source knows, in the order it found
them, each ``[path, dev, ino, fp_len, fp, offset, line, flags]``
(:class:`~statekit.sources._files.Tracked`); ``cur`` is the index of the file
being read, whose ``offset`` (bytes) and ``line`` (lines) are the last two
elements (``-1``: none). One ``files`` list is shared by the positions of a
file's records, so a record costs one small list.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import SourceError
from ._badrecords import BadRecord, bad_record_error
from ._files import (
    FINGERPRINT_BYTES,
    PARTIAL_END,
    Candidate,
    Tracked,
    find_copy,
    fingerprint,
    list_candidates,
    matches,
    watches_for,
)

__all__ = ["POSITION_TAG", "InputLostWarning", "LogSource", "LostInput"]

#: The first element of a :class:`LogSource` position.
POSITION_TAG = "statekit.LogSource/1"

_BACK = 1 << 16  # how far back locate() looks for the start of a line
_BLOCK = 1 << 20  # bytes read at once


class InputLostWarning(RuntimeWarning):
    """Lines may have been lost: a file was moved away or changed before it was read to its end."""


@dataclass(frozen=True, slots=True)
class LostInput:
    """A file the source had not finished and can no longer read.

    Attributes:
        path: Where the file was.
        offset: How far it was read (bytes).
        line: How far it was read (lines).
        reason: What happened to it.
    """

    path: str
    offset: int
    line: int
    reason: str

    def __str__(self) -> str:
        return (
            f"{self.path} (read to byte {self.offset}, line {self.line}) {self.reason}; "
            "any lines written to it after that point were not read"
        )


class LogSource:
    """Lines of log files that rotate, read exactly once; the position lives in the checkpoint.

    ``paths`` is a directory (every regular file in it, except hidden and
    compressed ones, filtered by ``pattern``), a file (that file and its
    rotations: every file of its directory whose name starts with its name,
    ``access.log.1``, ``access.log-20250102``), or a sequence of both.
    ``parse`` turns a line (``str``, strict UTF-8, without its newline) into a
    record. Example::

        source = LogSource("/var/log/nginx/access.log", parse=json.loads)
        runner.run(source, restore="latest")

    What it follows (see docs/operations.md#input-files):

    - appends; rename rotation (``access.log`` → ``access.log.1``, or a dated
      name): the renamed file is finished from its offset, by identity, before
      the new one starts; copytruncate: the copy is finished from the offset,
      the truncated file is read from its start, never from the middle of a line;
    - new files in the order they are found (by modification time among files
      found together), whatever their names;
    - a file moved out, deleted or truncated before it was read to its end
      (with no copy in the directory): what was read is kept; the loss is
      reported (:class:`InputLostWarning` and :attr:`lost`), or fails the
      read with ``on_lost="fail"``;
    - a last line without a newline is read once the file has not been
      modified for ``inactive_after`` seconds; until then it waits for its newline.

    A line that is not valid UTF-8 or that ``parse`` rejects raises
    :class:`~statekit.BadRecordError` naming the file, byte offset, line
    number and text; the :class:`~statekit.LocalRunner` applies its
    bad-records policy instead (``statekit.bad-records.*``).

    Args:
        paths: What to watch.
        parse: Line to record; ``str`` keeps the line.
        pattern: A glob file names must match.
        inactive_after: Seconds without modification after which a file's
            last line is read even without a newline.
        on_lost: ``"warn"`` or ``"fail"`` when input is lost.
        clock: Seconds since the epoch, for the inactivity rule (tests pass their own).
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        parse: Callable[[str], Any] = str,
        pattern: str = "*",
        inactive_after: float = 300.0,
        on_lost: str = "warn",
        clock: Callable[[], float] = time.time,
    ) -> None:
        if on_lost not in ("warn", "fail"):
            raise ValueError(f"on_lost must be 'warn' or 'fail', not {on_lost!r}")
        given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        self.paths = [os.fspath(p) for p in given]
        self.parse = parse
        self.pattern = pattern
        self.inactive_after = float(inactive_after)
        self.on_lost = on_lost
        self.clock = clock
        self.lost: list[LostInput] = []
        """What the last :meth:`read` found lost (also warned about)."""

    # --- reading ------------------------------------------------------------------

    def read(self, position: Any) -> Iterator[tuple[Any, Any]]:
        """Records after ``position`` (None: from the start), each with the position after it.

        Raises:
            BadRecordError: On a line that is not UTF-8 or that ``parse`` rejects.
            SourceError: If ``position`` cannot be followed, or input is lost under ``on_lost="fail"``.
        """
        return self._read(position, mark_bad=False)

    def read_marked(self, position: Any) -> Iterator[tuple[Any, Any]]:
        """:meth:`read`, but a bad line comes as ``(BadRecord, position after it)`` instead of an error.

        The runners use it to apply their bad-records policy and still move
        the position past the bad line.
        """
        return self._read(position, mark_bad=True)

    def _read(self, position: Any, *, mark_bad: bool) -> Iterator[tuple[Any, Any]]:
        self.lost = []
        plan = self._scan(self._load(position))
        tracked = [t for t, _ in plan]
        for i, (t, c) in enumerate(plan):
            if c.size > t.offset:
                yield from self._read_file(tracked, i, mark_bad)

    def _read_file(self, tracked: list[Tracked], i: int, mark_bad: bool) -> Iterator[tuple[Any, Any]]:
        t = tracked[i]
        files = [x.to_json() for x in tracked]
        try:
            f = open(t.path, "rb")  # noqa: SIM115 - closed by the with below, across yields
        except FileNotFoundError:
            return  # renamed or removed since the scan: the next read finds it by identity
        with f:
            st = os.fstat(f.fileno())
            if (st.st_dev, st.st_ino) != (t.dev, t.ino):
                return  # replaced since the scan: the next read sorts it out
            parse = self.parse
            tag = POSITION_TAG
            offset, line = t.offset, t.line
            f.seek(offset)
            pending = b""  # the start of a line the block ended in
            # Whole blocks, decoded at once and split in C: a line then costs little
            # more than the plain loop's. Offsets count bytes, which an ASCII block's
            # characters are; another block goes line by line.
            while block := f.read(_BLOCK):
                if pending:
                    block = pending + block
                cut = block.rfind(b"\n")
                if cut < 0:
                    pending = block
                    continue
                pending = block[cut + 1 :]
                body = block[:cut]
                if body.isascii():
                    for text in body.decode("ascii").split("\n"):
                        offset += len(text) + 1
                        line += 1
                        try:
                            record = parse(text)
                        except Exception as exc:  # any parse failure is a bad record
                            bad = BadRecord.from_line(
                                "parse", exc, t.path, offset - len(text) - 1, line, text.encode("ascii")
                            )
                            if not mark_bad:
                                raise bad_record_error(bad) from exc
                            yield bad, [tag, files, i, offset, line]
                            continue
                        yield record, [tag, files, i, offset, line]
                else:
                    for raw in body.split(b"\n"):
                        offset += len(raw) + 1
                        line += 1
                        try:
                            record = parse(raw.decode())
                        except Exception as exc:  # invalid UTF-8 or any parse failure: a bad record
                            bad = BadRecord.from_line(
                                "decode" if isinstance(exc, UnicodeDecodeError) else "parse",
                                exc,
                                t.path,
                                offset - len(raw) - 1,
                                line,
                                raw,
                            )
                            if not mark_bad:
                                raise bad_record_error(bad) from exc
                            yield bad, [tag, files, i, offset, line]
                            continue
                        yield record, [tag, files, i, offset, line]
            t.offset, t.line = offset, line
            if pending and self.clock() - os.fstat(f.fileno()).st_mtime >= self.inactive_after:
                # A last line without its newline, in a file idle long enough: read it as a line.
                offset += len(pending)
                line += 1
                t.offset, t.line, t.flags = offset, line, t.flags | PARTIAL_END
                position = [tag, [x.to_json() for x in tracked], -1, 0, 0]
                yield from self._one(pending, offset, line, t.path, position, mark_bad)

    def _one(
        self, raw: bytes, end: int, line: int, path: str, position: Any, mark_bad: bool
    ) -> Iterator[tuple[Any, Any]]:
        """The record of one line that has no newline (the file's last, read once the file is idle)."""
        try:
            record = self.parse(raw.decode())
        except Exception as exc:  # any parse failure is a bad record
            bad = BadRecord.from_line(
                "decode" if isinstance(exc, UnicodeDecodeError) else "parse",
                exc,
                path,
                end - len(raw),
                line,
                raw,
            )
            if not mark_bad:
                raise bad_record_error(bad) from exc
            yield bad, position
            return
        yield record, position

    # --- positions ------------------------------------------------------------------

    def _load(self, position: Any) -> list[Tracked]:
        if position is None:
            return []
        if isinstance(position, list) and len(position) == 5 and position[0] == POSITION_TAG:
            try:
                tracked = [Tracked.from_json(e) for e in position[1]]
                cur, offset, line = int(position[2]), int(position[3]), int(position[4])
            except (TypeError, ValueError) as e:
                raise SourceError(f"a damaged LogSource position: {e}") from e
            if cur >= 0:
                t = tracked[cur]
                t.offset, t.line, t.flags = offset, line, t.flags & ~PARTIAL_END
            return tracked
        if (
            isinstance(position, list)
            and len(position) == 2
            and isinstance(position[0], str)
            and isinstance(position[1], int)
        ):
            return self._from_file_source(position[0], position[1])
        raise SourceError(
            f"not a position of a LogSource or of the FileSource before it: {str(position)[:200]}; "
            "was the checkpoint taken with another source?"
        )

    def _from_file_source(self, name: str, offset: int) -> list[Tracked]:
        """The files of a position ``[file name, byte offset]`` of the FileSource before statekit 0.2.

        That source read files in name order: those named before ``name`` had
        been read (they are taken as read to their current end), ``name`` to
        ``offset``, the rest not at all.

        Raises:
            SourceError: If no watched file has that name, or the offset is not a line end in it.
        """
        cands = sorted(list_candidates(watches_for(self.paths, self.pattern)), key=lambda c: c.path)
        named = [c for c in cands if os.path.basename(c.path) == name]
        if len(named) != 1:
            raise SourceError(
                f"the checkpoint holds a FileSource position [{name!r}, {offset}] and "
                f"{'no' if not named else 'more than one'} watched file is named {name!r}: the files read "
                "before it cannot be told apart from the rest. Restore it with the files as they were, or "
                "start the job afresh (without restore)"
            )
        tracked: list[Tracked] = []
        for c in cands:
            base = os.path.basename(c.path)
            if base > name:
                continue
            end = offset if base == name else c.size
            with open(c.path, "rb") as f:
                head = f.read(FINGERPRINT_BYTES)
                f.seek(0)
                prefix = f.read(end)
            if len(prefix) != end or (end and not prefix.endswith(b"\n")):
                raise SourceError(
                    f"the checkpoint holds a FileSource position [{name!r}, {offset}] but {c.path} has "
                    f"{c.size} bytes and no line ends at byte {end}: the file changed since the checkpoint"
                )
            tracked.append(
                Tracked(c.path, c.dev, c.ino, len(head), fingerprint(head), end, prefix.count(b"\n"))
            )
        warnings.warn(
            f"restored a FileSource position [{name!r}, {offset}]: files named before {name!r} are taken "
            "as read to their end, as that source did; from now on the position follows files by identity",
            RuntimeWarning,
            stacklevel=3,
        )
        return tracked

    # --- finding the files ----------------------------------------------------------

    def locate_files(self, tracked: list[Tracked]) -> list[tuple[Tracked, Candidate]]:
        """Where each known file is now, then the new files, in the order a read takes them.

        What :meth:`read` does before reading, for readers that keep their
        position elsewhere (the Spark source plans its micro-batches with it).
        Each entry of ``tracked`` is re-bound to the file that holds it now
        (its path, and its inode for a ``copytruncate`` copy, are updated);
        new files follow at offset 0. Files that cannot be found are left out
        and reported as by :meth:`read` (:attr:`lost`, a warning, or
        :class:`~statekit.SourceError` under ``on_lost="fail"``).
        """
        self.lost = []
        return self._scan(tracked)

    def _scan(self, tracked: list[Tracked]) -> list[tuple[Tracked, Candidate]]:
        """Binds each known file to the file that holds it now; lists new files; reports lost ones."""
        cands = list_candidates(watches_for(self.paths, self.pattern))
        by_inode = {(c.dev, c.ino): c for c in cands}
        claimed: set[tuple[int, int]] = set()
        bound: dict[int, Candidate] = {}
        for i, t in enumerate(tracked):
            c = by_inode.get((t.dev, t.ino))
            if c is not None and matches(c, t):
                bound[i] = c
                claimed.add((c.dev, c.ino))
        for i, t in enumerate(tracked):
            if i in bound:
                continue
            same = by_inode.get((t.dev, t.ino))
            # A copy of what was read under another inode: what copytruncate leaves.
            c = find_copy(t, cands, claimed | {(t.dev, t.ino)})
            if c is not None:
                bound[i] = c
                claimed.add((c.dev, c.ino))
                t.dev, t.ino = c.dev, c.ino
            else:
                reason = (
                    "was truncated or rewritten in place (as by logrotate's copytruncate), with no copy of "
                    "it among the watched files"
                    if same is not None
                    else "is no longer among the watched files (moved or deleted)"
                )
                self._lose(LostInput(t.path, t.offset, t.line, reason))
        plan: list[tuple[Tracked, Candidate]] = []
        for i, t in enumerate(tracked):
            c = bound.get(i)
            if c is not None:
                t.path = c.path
                plan.append((t, c))
        new = sorted((c for c in cands if (c.dev, c.ino) not in claimed), key=lambda c: (c.mtime_ns, c.path))
        for c in new:
            try:
                with open(c.path, "rb") as f:
                    head = f.read(FINGERPRINT_BYTES)
            except FileNotFoundError:
                continue
            if head:
                plan.append((Tracked(c.path, c.dev, c.ino, len(head), fingerprint(head)), c))
        return plan

    def _lose(self, lost: LostInput) -> None:
        self.lost.append(lost)
        if self.on_lost == "fail":
            raise SourceError(
                f"input lost: {lost}. To accept the loss and go on, run once with on_lost='warn'"
            )
        warnings.warn(f"input lost: {lost}", InputLostWarning, stacklevel=4)

    # --- error places -----------------------------------------------------------------

    def locate(self, position: Any) -> BadRecord | None:
        """The place of the record that ends at ``position``: file, offset, line, raw text.

        For error messages about a record read earlier (a key that cannot be
        computed, a column that clashes); ``stage`` and ``error`` are empty.
        None when the position says nothing of a file.
        """
        if not (isinstance(position, list) and len(position) == 5 and position[0] == POSITION_TAG):
            return None
        files, cur, end, line = position[1], position[2], position[3], position[4]
        if cur < 0:
            partial = [e for e in files if e[7] & PARTIAL_END]
            if not partial:
                return None
            entry = partial[-1]
            path, end, line = entry[0], entry[5], entry[6]
        else:
            path = files[cur][0]
        try:
            with open(path, "rb") as f:
                start = max(0, end - _BACK)
                f.seek(start)
                data = f.read(end - start)
        except OSError:
            return BadRecord("", "", path, None, line, "")
        body = data[:-1] if data.endswith(b"\n") else data
        cut = body.rfind(b"\n")
        return BadRecord(
            "", "", path, start + cut + 1 if cut >= 0 or start == 0 else None, line,
            body[cut + 1 :].decode("utf-8", "surrogateescape"),
        )  # fmt: skip
