"""Dead-letter files: a private directory, files created exclusively, and letters committed with checkpoints.

A dead-letter directory holds JSON-lines files named ``part-….json``, each
complete when it appears (written under a hidden name, created with
``O_CREAT | O_EXCL | O_NOFOLLOW``, then renamed into place): a reader of the
directory (``cat part-*.json``, ``spark.read.json(dir)``, which skips hidden
files) never sees a file half-written, and a symlink or file someone planted
under any name statekit uses is never written through. The directory is made
with mode 0700; an existing one must be a real directory of the running user
that its group and others cannot write (:mod:`statekit._localfs`).

On the :class:`~statekit.LocalRunner` the letters of a run are exactly once,
like its state: :class:`StagedDeadLetters` writes them into a hidden staging
file as they are met; a checkpoint seals the staging files written since the
previous one and names them in its metadata, and once the checkpoint is
complete they are renamed to ``part-<job>-chk-<checkpoint id>-<n>.json``. A
run killed before the checkpoint completes leaves only hidden staging files,
which the next run deletes (it replays their input and writes the letters
again); one killed after it completes but before the rename has its staged
files renamed by the next run, which restores that checkpoint and finds them
named in its metadata. A restore of an older checkpoint of the job withdraws
the letters of the newer ones: their input is read again.

What it may import: ``statekit._errors`` and ``statekit._localfs`` (the
sources package imports nothing else of statekit).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

from .._errors import ConfigurationError
from .._localfs import create_exclusive, private_dir, write_atomically

__all__ = ["DEAD_LETTERS_PROPERTY", "DeadLetterDir", "StagedDeadLetters", "file_part"]

#: The checkpoint metadata property naming the staged dead-letter files a checkpoint covers.
DEAD_LETTERS_PROPERTY = "dead_letters"
_WHAT = "the dead-letter directory (statekit.bad-records.dead-letter-path)"
_STAGED = ".inprogress"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def file_part(text: str) -> str:
    """``text`` as part of a file name: letters, digits, ``._-`` kept, anything else folded into a hash.

    Two job ids never share a part (an id that had to change gets a hash of
    itself), and no part starts with a dot (a hidden file).
    """
    safe = _SAFE.sub("_", text)
    if safe != text or not safe or safe.startswith("."):
        safe = f"{safe.lstrip('.')}~{hashlib.blake2b(text.encode(), digest_size=4).hexdigest()}"
    return safe


class DeadLetterDir:
    """A dead-letter directory, created 0700 or checked private, into which whole files are published.

    Args:
        path: The directory (``statekit.bad-records.dead-letter-path``); a
            relative path is taken from the working directory.

    Raises:
        ConfigurationError: If ``path`` is a URL, or an existing regular file
            (the JSON-lines file earlier versions appended to).
        UnsafeLocalPathError: If it is a symlink, another user's, or writable
            by its group or others; naming it and the way out.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        text = os.fspath(path)
        if "://" in text:
            raise ConfigurationError(
                f"statekit.bad-records.dead-letter-path {text!r} is a URL: dead letters are written to "
                "a local directory (on a cluster, one every executor mounts)"
            )
        self.path = os.path.abspath(text)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISREG(os.lstat(self.path).st_mode):
                raise ConfigurationError(
                    f"statekit.bad-records.dead-letter-path {self.path} is a file: dead letters go into a "
                    "directory, one file per checkpoint (docs/operations.md#input-files). Move the file "
                    "away, or name a directory"
                )
        private_dir(self.path, what=_WHAT)

    def check(self) -> None:
        """Check again that the directory is private (before each file is published into it)."""
        private_dir(self.path, what=_WHAT)

    def publish(self, name: str, letters: Iterable[Mapping[str, Any]]) -> str:
        """Write ``letters`` as the JSON-lines file ``name``, replacing one of that name whole; its path.

        The file is written under an exclusively created hidden name, synced,
        and renamed: a retry that writes the same name replaces it, never
        appends to it.
        """
        self.check()
        data = "".join(json.dumps(letter) + "\n" for letter in letters).encode("utf-8")
        final = os.path.join(self.path, name)
        write_atomically(final, data, fsync=True)
        return final


class StagedDeadLetters:
    """The dead letters of one :class:`~statekit.LocalRunner`'s job, committed with its checkpoints.

    :meth:`write` appends to a hidden staging file; :meth:`seal` closes it
    before a checkpoint and returns the staged files the checkpoint covers (a
    checkpoint that fails leaves them for the next); :meth:`publish` renames
    them once the checkpoint completed; :meth:`recover` makes a restarted run
    consistent with the checkpoint it restored. See the module doc.

    Args:
        path: The dead-letter directory.
        job_id: The job whose letters these are (part of every file name).
    """

    def __init__(self, path: str | os.PathLike[str], job_id: str) -> None:
        self.dir = DeadLetterDir(path)
        self.job = file_part(job_id)
        self._file: IO[bytes] | None = None
        self._name: str | None = None
        self._sealed: list[str] = []  # staged files closed and waiting for a checkpoint to complete
        self._staged = re.compile(rf"\.{re.escape(self.job)}\.[0-9a-f]{{16}}{re.escape(_STAGED)}")
        self._published = re.compile(rf"part-{re.escape(self.job)}-chk-(\d{{12}})-\d+\.json")

    @property
    def path(self) -> str:
        """The directory's absolute path."""
        return self.dir.path

    def write(self, letter: Mapping[str, Any]) -> None:
        """Stage one letter; it is on disk (not synced) when this returns, published with a checkpoint."""
        if self._file is None:
            self.dir.check()
            fd, staged = create_exclusive(self.dir.path, f".{self.job}.", _STAGED)
            self._file = os.fdopen(fd, "wb")
            self._name = os.path.basename(staged)
        self._file.write(json.dumps(letter).encode("utf-8") + b"\n")
        self._file.flush()

    def seal(self) -> list[str]:
        """Close the open staging file (synced); the staged files not yet published, for a checkpoint."""
        if self._file is not None:
            assert self._name is not None
            try:
                os.fsync(self._file.fileno())
            finally:
                self._file.close()
            self._sealed.append(self._name)
            self._file = self._name = None
        return list(self._sealed)

    def publish(self, checkpoint_id: int, names: Sequence[str]) -> None:
        """Rename ``names`` (staged files a completed checkpoint covers) to the checkpoint's part files."""
        for k, name in enumerate(names):
            staged = os.path.join(self.dir.path, name)
            final = os.path.join(self.dir.path, f"part-{self.job}-chk-{checkpoint_id:012d}-{k}.json")
            with contextlib.suppress(FileNotFoundError):  # published already (a recovery, a retry)
                os.replace(staged, final)
        done = set(names)
        self._sealed = [n for n in self._sealed if n not in done]

    def recover(self, checkpoint_id: int | None, names: Sequence[str]) -> None:
        """Before a run reads: publish what checkpoint ``checkpoint_id`` covers, drop what no checkpoint does.

        ``checkpoint_id`` and ``names`` are those of the checkpoint of this job
        the runner restored (None and empty for a start from empty state or a
        savepoint). Staged files of this job that no completed checkpoint
        names are deleted (a killed run's: their input is read again); with a
        restored checkpoint, the published letters of this job's later
        checkpoints are withdrawn too (their input is read again as well).
        """
        self.close()
        self._sealed = []
        if checkpoint_id is not None:
            self.publish(checkpoint_id, names)
        for entry in os.listdir(self.dir.path):
            if self._staged.fullmatch(entry):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.dir.path, entry))
                continue
            later = self._published.fullmatch(entry)
            if later is not None and checkpoint_id is not None and int(later[1]) > checkpoint_id:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.dir.path, entry))

    def close(self) -> None:
        """Close the open staging file (its letters stay staged, for the next checkpoint)."""
        if self._file is not None:
            self.seal()
