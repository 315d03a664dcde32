"""Writing one checkpoint or savepoint: its streams into its directory, then ``_metadata``, atomically."""

from __future__ import annotations

import posixpath
import secrets

from statekit.backend_api import CheckpointOutputStream
from statekit.errors import CheckpointError, ConfigurationError

from ._files import Files, remove_tree
from ._handles import fs_errors
from ._paths import METADATA_FILE, check_job_id, check_name, join_url, normalize_dir
from ._publishing import has_directories, publish
from ._streams import FileOutputStream

__all__ = ["FileWriter", "begin_savepoint"]


class FileWriter:
    """Writes one checkpoint's or savepoint's files into its directory, then its ``_metadata``."""

    def __init__(self, files: Files, url: str, shared_dir: str) -> None:
        self._files = files
        self._url = url
        self._fs, self._path = files.open(url)
        self._shared_dir = shared_dir
        self.has_directories = has_directories(self._fs)
        self._open_checked = False

    @property
    def location(self) -> str:
        """The directory that holds (or will hold) ``_metadata``."""
        return self._url

    def make_dirs(self, *relative: str) -> None:
        """Creates directories, relative to :attr:`location`, on filesystems that have them."""
        for rel in relative:
            path = posixpath.normpath(f"{self._path}/{rel}")
            try:
                self._fs.makedirs(path, exist_ok=True)
            except fs_errors() as exc:
                raise CheckpointError(f"cannot create {self._fs.unstrip_protocol(path)}: {exc}") from exc

    def create_stream(self, name: str, *, shared: bool = False) -> CheckpointOutputStream:
        """A stream for file ``name`` (in the shared directory if ``shared``).

        Raises:
            CheckpointError: If the checkpoint is already complete: its files are never written again.
        """
        relative = f"{self._shared_dir}/{check_name(name)}" if shared else check_name(name)
        if not self._open_checked:
            # Once per writer: a stream written into a completed checkpoint would damage it.
            self._check_not_complete()
            self._open_checked = True
        path = posixpath.normpath(f"{self._path}/{relative}")
        return FileOutputStream(
            self._fs, path, relative, self._files.inline_threshold, make_dirs=self.has_directories
        )

    def _check_not_complete(self) -> None:
        meta = f"{self._path}/{METADATA_FILE}"
        try:
            self._fs.invalidate_cache(self._path)
            complete = bool(self._fs.exists(meta))
        except fs_errors() as exc:
            raise CheckpointError(f"cannot read {join_url(self._url, METADATA_FILE)}: {exc}") from exc
        if complete:
            raise CheckpointError(
                f"{self._url} is a completed checkpoint: its files are never written again (a checkpoint "
                "id is used once; the runner numbers new checkpoints above every existing one)"
            )

    def complete(self, metadata: bytes) -> str:
        """Writes ``_metadata`` atomically; returns :attr:`location`.

        Where rename is atomic (local files, HDFS), a temporary file in the same
        directory is renamed; on object stores one put makes the object appear
        whole or not at all.

        Raises:
            CheckpointError: If it is already complete or the write fails.
        """
        fs, meta = self._fs, f"{self._path}/{METADATA_FILE}"
        fs.invalidate_cache(self._path)
        already = CheckpointError(f"{self._url} is already complete; its {METADATA_FILE} is never replaced")
        try:
            if fs.exists(meta):
                raise already
            # Exclusive: of two writers completing one checkpoint (two runs of a job), one fails.
            publish(fs, meta, bytes(metadata), exclusive=True, has_directories=self.has_directories)
        except FileExistsError:
            raise already from None
        except fs_errors() as exc:
            raise CheckpointError(f"cannot write {join_url(self._url, METADATA_FILE)}: {exc}") from exc
        finally:
            fs.invalidate_cache(self._path)
        self._open_checked = False  # a stream asked of this writer now finds _metadata and is refused
        return self._url

    def abort(self) -> None:
        """Deletes the directory of this unfinished checkpoint (never shared files).

        Best effort when the store fails (an outage is often why a checkpoint is
        aborted): what stays is no checkpoint (it has no ``_metadata``) and is
        deleted by the cleanup after the next completed checkpoint.

        Raises:
            CheckpointError: If it is complete (see ``discard_checkpoint``).
        """
        try:
            self._fs.invalidate_cache(self._path)
            if self._fs.exists(f"{self._path}/{METADATA_FILE}"):
                raise CheckpointError(f"{self._url} is complete; abort() deletes only unfinished ones")
            remove_tree(self._fs, self._path)
        except fs_errors():
            pass


def begin_savepoint(files: Files, job_id: str, parent: str | None) -> FileWriter:
    """A writer for ``<parent>/savepoint-<job[:6]>-<random hex>/``.

    Raises:
        ConfigurationError: If ``parent`` is None.
    """
    check_job_id(job_id)
    if parent is None:
        raise ConfigurationError(
            "no savepoints directory: set statekit.savepoints.dir or pass a target directory"
        )
    url = join_url(normalize_dir(parent), f"savepoint-{job_id[:6]}-{secrets.token_hex(6)}")
    writer = FileWriter(files, url, shared_dir="shared")
    if writer.has_directories:
        writer.make_dirs(".")
    return writer
