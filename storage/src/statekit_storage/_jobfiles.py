"""A job's small files (``<job>/files/<name>``): the checkpoint history, savepoint requests and answers.

See :class:`statekit.backend_api.SupportsJobFiles`. Each file is replaced
whole (:func:`~statekit_storage._publishing.publish`): a reader sees the old
bytes or the new ones, and a writer killed mid-write leaves the old file.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable

from statekit.errors import CheckpointError

from ._files import Files
from ._handles import fs_errors
from ._paths import join_url
from ._publishing import has_directories, publish

__all__ = ["JOB_FILES_DIR", "MAX_JOB_FILE", "JobFiles", "check_job_file_name"]

#: ``<job>/files/``: the job's small files (history, savepoint requests and answers).
JOB_FILES_DIR = "files"
#: The largest job file read back: they are small by contract (a bounded history, a request).
MAX_JOB_FILE = 16 << 20
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")


def check_job_file_name(name: str) -> str:
    """``name`` if it is a valid job file name, else a CheckpointError."""
    if not _NAME.fullmatch(name):
        raise CheckpointError(
            f"invalid job file name {name!r}: expected lowercase letters, digits, '.', '_' or '-' "
            "(at most 100, not starting with a punctuation mark)"
        )
    return name


class JobFiles:
    """Writes, reads and deletes the files under ``<job dir>/files`` for a storage."""

    def __init__(self, files: Files, job_dir: Callable[[str], str]) -> None:
        self._files = files
        self._job_dir = job_dir

    def _url(self, job_id: str, name: str) -> str:
        return join_url(self._job_dir(job_id), JOB_FILES_DIR, check_job_file_name(name))

    def write(self, job_id: str, name: str, data: bytes) -> None:
        """Replace ``<job>/files/<name>`` with ``data``, whole or not at all."""
        url = self._url(job_id, name)
        fs, path = self._files.open(url)
        try:
            publish(fs, path, data, exclusive=False, has_directories=has_directories(fs))
        except fs_errors() as exc:
            raise CheckpointError(f"cannot write {url}: {exc}") from exc
        with contextlib.suppress(*fs_errors()):
            fs.invalidate_cache(path)

    def create(self, job_id: str, name: str, data: bytes) -> bool:
        """Create ``<job>/files/<name>`` holding ``data`` unless it exists; whether it was created.

        Exclusive where the store allows it (a hard link on local disks, a
        conditional put on S3); elsewhere a check right before the write.
        """
        url = self._url(job_id, name)
        fs, path = self._files.open(url)
        try:
            publish(fs, path, data, exclusive=True, has_directories=has_directories(fs))
        except FileExistsError:
            return False
        except fs_errors() as exc:
            raise CheckpointError(f"cannot create {url}: {exc}") from exc
        finally:
            with contextlib.suppress(*fs_errors()):
                fs.invalidate_cache(path)
        return True

    def read(self, job_id: str, name: str) -> bytes | None:
        """The bytes of ``<job>/files/<name>``, or None."""
        url = self._url(job_id, name)
        fs, path = self._files.open(url)
        try:
            data = bytes(fs.cat_file(path, start=0, end=MAX_JOB_FILE + 1))
        except FileNotFoundError:
            return None
        except fs_errors() as exc:
            raise CheckpointError(f"cannot read {url}: {exc}") from exc
        if len(data) > MAX_JOB_FILE:
            raise CheckpointError(
                f"{url} is over {MAX_JOB_FILE:,} bytes: not a file statekit wrote; move it away"
            )
        return data

    def delete(self, job_id: str, name: str) -> None:
        """Delete ``<job>/files/<name>`` if it is there."""
        url = self._url(job_id, name)
        fs, path = self._files.open(url)
        try:
            fs.rm_file(path)
        except FileNotFoundError:
            pass
        except fs_errors() as exc:
            raise CheckpointError(f"cannot delete {url}: {exc}") from exc
