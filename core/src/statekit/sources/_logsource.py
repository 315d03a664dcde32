"""The rotation-safe log source: lines of files that grow, rotate, move and appear, read exactly once.

The position, kept in statekit's checkpoints, is JSON::

    ["statekit.LogSource/1", files, cur, offset, line, compressed]

``files`` lists every watched file the source knows, in the order it found
them, each ``[path, dev, ino, fp_len, fp, offset, line, flags, size]``
(:class:`~statekit.sources._files.Tracked`); ``cur`` is the index of the file
being read, whose ``offset`` (bytes) and ``line`` (lines) are the next two
elements (``-1``: none). ``compressed`` lists the compressed files the read's
scan found, each ``[dev, ino, mtime_ns]``, so that the next read can tell one
that appeared since (a position of a statekit before it has five elements,
and no such list). The two lists are shared by the positions of a read's
records, so a record costs one small list.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .._errors import SourceError
from ._badrecords import BadRecord, bad_record_error
from ._files import (
    FINGERPRINT_BYTES,
    IN_LONG_LINE,
    MAX_LINE_BYTES,
    PARTIAL_END,
    Candidate,
    LineReader,
    LongLine,
    Tracked,
    UnreadableFileError,
    compressed_identities,
    fingerprint,
    holds,
    list_candidates,
    open_candidate,
    open_regular,
)
from ._locating import FileLocator, LostInput, unreadable_at

__all__ = [
    "FOLLOW_SYMLINKS_KEY",
    "MAX_LINE_BYTES_KEY",
    "POSITION_TAG",
    "LogSource",
]

#: The first element of a :class:`LogSource` position.
POSITION_TAG = "statekit.LogSource/1"

#: The configuration key of :class:`LogSource`'s ``max_line_bytes``.
MAX_LINE_BYTES_KEY = "statekit.source.max-line-bytes"
#: The configuration key of :class:`LogSource`'s ``follow_symlinks``.
FOLLOW_SYMLINKS_KEY = "statekit.source.follow-symlinks"

_BACK = 1 << 16  # how far back locate() looks for the start of a line


class LogSource(FileLocator):
    """Lines of log files that rotate, read exactly once; the position lives in the checkpoint.

    ``paths`` is a directory (every regular file in it, except hidden and
    compressed ones, filtered by ``pattern``), a file (that file and its
    rotations: every file of its directory whose name starts with its name,
    ``access.log.1``, ``access.log-20250102``), or a sequence of both. A path
    that does not exist is an error naming it (and a near name), also for a
    job restored from a checkpoint. ``parse`` turns a line (``str``, strict
    UTF-8, without its newline) into a record. Example::

        source = LogSource("/var/log/nginx/access.log", parse=json.loads)
        runner.run(source, restore="latest")

    It reads only what it was pointed at: a symlink that leaves the watched
    files (unless ``follow_symlinks``), a FIFO, a socket, a device or a
    directory among the watched names is refused with a
    :class:`~statekit.errors.SourceError` naming it; files are opened so that no open
    blocks on a special file.

    What it follows (see docs/operations.md#input-files):

    - appends; rename rotation (``access.log`` → ``access.log.1``, or a dated
      name): the renamed file is finished from its offset, by identity, before
      the new one starts; copytruncate: the copy is finished from the offset,
      the truncated file is read from its start, never from the middle of a
      line; a copy seen before the original is truncated is not read again;
    - new files in the order they are found (by modification time among files
      found together), whatever their names;
    - a file moved out, deleted, compressed or truncated before it was read to
      its end (with no copy in the directory): what was read is kept; the
      loss is reported (:class:`InputLostWarning` and :attr:`lost`, with the
      bytes not read when they are known), or fails the read with
      ``on_lost="fail"``. A file read to its end (as the source last saw it)
      and then deleted or compressed is no loss (logged at debug level);
    - a compressed file (``.gz``, ``.bz2``, ``.xz``) that appeared since the
      position's read and holds no file the source has tracked: lines
      written, rotated and compressed between two reads, reported as above;
    - a last line without a newline is read once the file has not been
      modified for ``inactive_after`` seconds; until then it waits for its newline;
    - a line longer than ``max_line_bytes`` is a bad record (stage
      ``too-long``, its first 64 KiB kept): the rest of it is skipped, in time
      linear in its length and memory bounded by the limit.

    A line that is not valid UTF-8, that ``parse`` rejects or that is too
    long raises :class:`~statekit.errors.BadRecordError` naming the file, byte
    offset, line number and text; the :class:`~statekit.LocalRunner` applies
    its bad-records policy instead (``statekit.bad-records.*``).

    Args:
        paths: What to watch.
        parse: Line to record; ``str`` keeps the line.
        pattern: A glob file names must match.
        inactive_after: Seconds without modification after which a file's
            last line is read even without a newline.
        on_lost: ``"warn"`` or ``"fail"`` when input is lost.
        clock: Seconds since the epoch, for the inactivity rule (tests pass their own).
        max_line_bytes: The longest line read as a record (bytes, without its
            newline). None: ``statekit.source.max-line-bytes`` of the job's
            configuration (default 4 MiB).
        follow_symlinks: Read the files symlinks among the watched names point
            to, wherever they are. None: ``statekit.source.follow-symlinks``
            (default false: such a symlink is refused, unless it points to
            another watched file or is the very path given).
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
        max_line_bytes: int | None = None,
        follow_symlinks: bool | None = None,
    ) -> None:
        if on_lost not in ("warn", "fail"):
            raise ValueError(f"on_lost must be 'warn' or 'fail', not {on_lost!r}")
        if max_line_bytes is not None and max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be at least 1, not {max_line_bytes}")
        given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        self.paths = [os.fspath(p) for p in given]
        self.parse = parse
        self.pattern = pattern
        self.inactive_after = float(inactive_after)
        self.on_lost = on_lost
        self.clock = clock
        self._given = (max_line_bytes, follow_symlinks)
        self.max_line_bytes = MAX_LINE_BYTES if max_line_bytes is None else int(max_line_bytes)
        """The longest line read as a record (bytes)."""
        self.follow_symlinks = bool(follow_symlinks)
        """Whether symlinks are followed out of the watched files."""
        self.lost: list[LostInput] = []
        """What the last :meth:`read` found lost (also warned about)."""
        self._compressed: list[list[int]] = []  # the positions' compressed files, from the last scan

    def configure(self, config: Any) -> None:
        """Take ``statekit.source.*`` from a job's configuration, for what the constructor was not given.

        The runners call it with their :class:`~statekit.Configuration` (any
        object whose ``get(key)`` returns the typed value) before reading.
        """
        max_line, follow = self._given
        if max_line is None:
            self.max_line_bytes = int(config.get(MAX_LINE_BYTES_KEY))
        if follow is None:
            self.follow_symlinks = bool(config.get(FOLLOW_SYMLINKS_KEY))

    # --- reading ------------------------------------------------------------------

    def read(self, position: Any) -> Iterator[tuple[Any, Any]]:
        """Records after ``position`` (None: from the start), each with the position after it.

        A read takes each file up to the length it had when the read began.

        Raises:
            BadRecordError: On a line that is not UTF-8, that ``parse`` rejects, or that is too long.
            SourceError: If a watched path does not exist or holds what may not be read (a
                symlink out, a FIFO, ...), if ``position`` cannot be followed, or input is lost
                under ``on_lost="fail"``.
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
        known = self._load(position)
        tracked = known
        try:
            plan = self._scan(known)
            self._compressed = [list(c) for c in self.compressed_now]
            tracked = [t for t, _ in plan]
            for i, (t, c) in enumerate(plan):
                if c.size > t.offset:
                    yield from self._read_file(tracked, i, c, mark_bad)
        except UnreadableFileError as e:  # chmod 000 mid-run: name the file, how far it was read, the way out
            raise unreadable_at(e, tracked) from e.__cause__

    def _read_file(
        self, tracked: list[Tracked], i: int, c: Candidate, mark_bad: bool
    ) -> Iterator[tuple[Any, Any]]:
        t = tracked[i]
        files = [x.to_json() for x in tracked]
        gz = self._compressed
        f = open_candidate(c)
        if f is None:
            return  # renamed, removed or replaced since the scan: the next read finds it by identity
        with f:
            if not holds(f, t):
                return  # truncated since the scan: the next read finds its copy
            parse = self.parse
            tag = POSITION_TAG
            limit = self.max_line_bytes
            line = t.line
            reader = LineReader(
                f, t.offset, max_line=limit, end=c.size, skipping=bool(t.flags & IN_LONG_LINE)
            )
            # Whole blocks, decoded at once and split in C: a line then costs little
            # more than the plain loop's. Offsets count bytes, which an ASCII block's
            # characters are; another block goes line by line.
            for piece in reader:
                if piece.__class__ is LongLine:
                    assert isinstance(piece, LongLine)
                    line += 1
                    yield self._too_long(piece, tracked, files, i, line, mark_bad)
                    continue
                offset, body = piece  # type: ignore[misc]
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
                            yield bad, [tag, files, i, offset, line, gz]
                            continue
                        yield record, [tag, files, i, offset, line, gz]
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
                            yield bad, [tag, files, i, offset, line, gz]
                            continue
                        yield record, [tag, files, i, offset, line, gz]
            yield from self._finish_file(f, reader, tracked, t, line, mark_bad)

    def _too_long(
        self, piece: LongLine, tracked: list[Tracked], files: list[Any], i: int, line: int, mark_bad: bool
    ) -> tuple[BadRecord, Any]:
        """The bad record of a line longer than the limit, with its position; raised unless ``mark_bad``."""
        t = tracked[i]
        if piece.ended:
            position: Any = [POSITION_TAG, files, i, piece.offset + piece.length + 1, line, self._compressed]
        else:  # no newline yet: the rest of it is skipped when it comes
            t.offset, t.line = piece.offset + piece.length, line
            t.flags = (t.flags | IN_LONG_LINE) & ~PARTIAL_END
            position = [POSITION_TAG, [x.to_json() for x in tracked], -1, 0, 0, self._compressed]
        bad = BadRecord(
            "too-long", piece.describe(self.max_line_bytes), t.path, piece.offset, line,
            piece.head.decode("utf-8", "surrogateescape"),
        )  # fmt: skip
        if not mark_bad:
            raise bad_record_error(bad)
        return bad, position

    def _finish_file(
        self, f: Any, reader: LineReader, tracked: list[Tracked], t: Tracked, line: int, mark_bad: bool
    ) -> Iterator[tuple[Any, Any]]:
        """Moves ``t`` to where the read ended; reads a last line without newline once the file is idle."""
        if reader.offset != t.offset:
            t.flags &= ~(PARTIAL_END | IN_LONG_LINE)
        t.offset, t.line = reader.offset, line
        if reader.skipping:
            t.flags |= IN_LONG_LINE
            return
        pending = reader.tail
        st = os.fstat(f.fileno())
        if pending and st.st_size == reader.pos and self.clock() - st.st_mtime >= self.inactive_after:
            # A last line without its newline, in a file idle long enough: read it as a line.
            line += 1
            t.offset, t.line, t.flags = reader.offset + len(pending), line, t.flags | PARTIAL_END
            position = [POSITION_TAG, [x.to_json() for x in tracked], -1, 0, 0, self._compressed]
            yield from self._one(pending, t.offset, line, t.path, position, mark_bad)

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
        """The known files of ``position``; sets :attr:`compressed_seen` from it."""
        self.compressed_seen = None
        if position is None:
            return []
        if isinstance(position, list) and len(position) in (5, 6) and position[0] == POSITION_TAG:
            try:
                tracked = [Tracked.from_json(e) for e in position[1]]
                cur, offset, line = int(position[2]), int(position[3]), int(position[4])
                if len(position) == 6:
                    self.compressed_seen = compressed_identities(position[5])
            except (TypeError, ValueError) as e:
                raise SourceError(f"a damaged LogSource position: {e}") from e
            if cur >= 0:
                t = tracked[cur]
                t.offset, t.line, t.flags = offset, line, t.flags & ~(PARTIAL_END | IN_LONG_LINE)
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
        cands = sorted(
            list_candidates(self.watches(), follow_symlinks=self.follow_symlinks), key=lambda c: c.path
        )
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
            f = open_candidate(c)
            if f is None:
                raise SourceError(f"{c.path} changed while the FileSource position was restored: try again")
            with f:
                head = f.read(FINGERPRINT_BYTES)
                f.seek(0)
                prefix = f.read(end)
            if len(prefix) != end or (end and not prefix.endswith(b"\n")):
                raise SourceError(
                    f"the checkpoint holds a FileSource position [{name!r}, {offset}] but {c.path} has "
                    f"{c.size} bytes and no line ends at byte {end}: the file changed since the checkpoint"
                )
            tracked.append(
                Tracked(
                    c.path, c.dev, c.ino, len(head), fingerprint(head), end, prefix.count(b"\n"), 0, c.size
                )
            )
        warnings.warn(
            f"restored a FileSource position [{name!r}, {offset}]: files named before {name!r} are taken "
            "as read to their end, as that source did; from now on the position follows files by identity",
            RuntimeWarning,
            stacklevel=3,
        )
        return tracked

    # --- error places -----------------------------------------------------------------

    def locate(self, position: Any) -> BadRecord | None:
        """The place of the record that ends at ``position``: file, offset, line, raw text.

        For error messages about a record read earlier (a key that cannot be
        computed, a column that clashes); ``stage`` and ``error`` are empty.
        None when the position says nothing of a file.
        """
        if not (isinstance(position, list) and len(position) in (5, 6) and position[0] == POSITION_TAG):
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
            with open_regular(path) as f:
                start = max(0, end - _BACK)
                f.seek(start)
                data = f.read(end - start)
        except (OSError, SourceError):
            return BadRecord("", "", path, None, line, "")
        body = data[:-1] if data.endswith(b"\n") else data
        cut = body.rfind(b"\n")
        return BadRecord(
            "", "", path, start + cut + 1 if cut >= 0 or start == 0 else None, line,
            body[cut + 1 :].decode("utf-8", "surrogateescape"),
        )  # fmt: skip
