"""The ``filesystem`` checkpoint storage: checkpoints as files under any fsspec URL.

Layout::

    <checkpoints dir>/<job id>/chk-<n>/_metadata   written last: checkpoint n exists once it does
    <checkpoints dir>/<job id>/chk-<n>/<name>      the exclusive files of checkpoint n
    <checkpoints dir>/<job id>/shared/<name>       files later checkpoints may reference too
    <checkpoints dir>/<job id>/taskowned/          state owned by tasks rather than checkpoints
    <checkpoints dir>/<job id>/runs/               one record per run of the job, for fencing
    <checkpoints dir>/<job id>/files/              the job's small files: checkpoint history, savepoint
                                                   requests and their answers (each replaced whole)
    <savepoints dir>/savepoint-<job[:6]>-<hex>/    _metadata, files and shared/<name>: self-contained

Handle descriptions in ``_metadata`` hold paths relative to the directory that
holds it (``"op-0.bin"``, ``"../shared/abc"``), so a savepoint folder can be
copied anywhere and restored from there. Every URL takes the same fsspec path;
only how ``_metadata`` is made atomic depends on the protocol (see
:meth:`FileWriter.complete`).

The steps live in modules of their own: ``_paths`` (directories, locations,
names), ``_options`` (storage options), ``_files`` (opening URLs, listing,
reading ``_metadata`` and handles), ``_streams`` (output streams),
``_publishing`` (a file whole or not at all), ``_writer`` (one checkpoint's
files, then ``_metadata``), ``_runs`` (the run records for fencing) and
``_jobfiles`` (the job's small files). This
module is the storage class that puts them together.
"""

from __future__ import annotations

import contextlib
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from statekit.backend_api import CheckpointWriter, redact_urls
from statekit.errors import CheckpointError, ConfigurationError
from statekit.snapshot_codec import StreamStateHandle

from ._files import Files, list_names, remove_tree
from ._handles import FileStreamHandle, fs_errors
from ._jobfiles import JobFiles
from ._options import parse_storage_options
from ._paths import (
    CHECKPOINT_DIR,
    METADATA_FILE,
    check_job_id,
    contained_path,
    join_url,
    location_dir,
    normalize_dir,
)
from ._plugin import DEFAULT_INLINE_THRESHOLD
from ._runs import RunRecords
from ._writer import FileWriter, begin_savepoint

__all__ = ["FileSystemCheckpointStorage", "find_latest_checkpoint"]


class FileSystemCheckpointStorage:
    """Checkpoints and savepoints as files under any fsspec URL.

    Local paths, ``file://``, ``memory://``, ``s3://`` (``statekit[s3]``) and
    ``hdfs://`` (``statekit[hdfs]``) all work alike. Streams of at most
    ``inline_threshold`` bytes are inlined into ``_metadata``.

    Example::

        storage = FileSystemCheckpointStorage("s3://bucket/checkpoints")
        writer = storage.begin_checkpoint("job-1", 7)
        out = writer.create_stream("keyed-op-0.bin")
        out.write(data)
        description = out.close_and_get_handle().to_json()
        location = writer.complete(metadata)            # "s3://bucket/checkpoints/job-1/chk-7"
        storage.resolve_handle(location, description).read(0, 10)

    Attributes:
        checkpoints_dir: Where checkpoints are kept (local paths made absolute).
        savepoints_dir: The default parent of new savepoints, or None.
    """

    name = "filesystem"
    max_state_size: int | None = None

    def __init__(
        self,
        checkpoints_dir: str,
        *,
        savepoints_dir: str | None = None,
        inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
        storage_options: Mapping[str, Any] | None = None,
        local_permissions: str = "private",
    ) -> None:
        """Creates the storage; fails now if the URL's filesystem is not installed.

        On local disks, directories are created 0700 and files 0600 unless
        ``local_permissions="umask"`` (see :mod:`statekit_storage._localfiles`).

        Raises:
            ConfigurationError: On a negative threshold or a protocol without implementation.
        """
        self.checkpoints_dir = normalize_dir(checkpoints_dir)
        self.savepoints_dir = None if savepoints_dir is None else normalize_dir(savepoints_dir)
        dirs = (self.checkpoints_dir, self.savepoints_dir)
        self._files = Files(
            storage_options or {}, dirs, inline_threshold, local_permissions=local_permissions
        )
        self._files.open(self.checkpoints_dir)
        self._prepared: set[str] = set()
        self._run_records = RunRecords(self._files, self.job_dir)
        self._job_files = JobFiles(self._files, self.job_dir)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> FileSystemCheckpointStorage:
        """The registry's factory: builds the storage from its parsed options.

        Raises:
            ConfigurationError: If ``checkpoints-dir`` is unset or an option is invalid.
        """
        checkpoints_dir = options.get("checkpoints-dir")
        if not checkpoints_dir:
            raise ConfigurationError(
                "the filesystem checkpoint storage needs a directory: set statekit.checkpoints.dir "
                "(e.g. s3://bucket/checkpoints or /data/checkpoints)"
            )
        return cls(
            checkpoints_dir,
            savepoints_dir=options.get("savepoints-dir"),
            inline_threshold=options.get("inline-threshold", DEFAULT_INLINE_THRESHOLD),
            storage_options=parse_storage_options(
                options.get("storage-options"), cls.name, options.get("secret-storage-options")
            ),
            local_permissions=options.get("local-permissions", "private"),
        )

    def __repr__(self) -> str:
        """Names the checkpoints directory."""
        return f"FileSystemCheckpointStorage({redact_urls(self.checkpoints_dir)!r})"

    @property
    def inline_threshold(self) -> int:
        """Streams of at most this many bytes become inline handles."""
        return self._files.inline_threshold

    def job_dir(self, job_id: str) -> str:
        """``<checkpoints dir>/<job id>``."""
        return join_url(self.checkpoints_dir, check_job_id(job_id))

    def task_owned_dir(self, job_id: str) -> str:
        """``<checkpoints dir>/<job id>/taskowned``, for state owned by tasks, not checkpoints."""
        return join_url(self.job_dir(job_id), "taskowned")

    def begin_checkpoint(self, job_id: str, checkpoint_id: int) -> CheckpointWriter:
        """A writer for ``<job id>/chk-<checkpoint id>``; shared streams go to ``<job id>/shared``."""
        if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int) or checkpoint_id < 0:
            raise CheckpointError(f"invalid checkpoint id {checkpoint_id!r}: expected an integer >= 0")
        job = self.job_dir(job_id)
        writer = FileWriter(self._files, join_url(job, f"chk-{checkpoint_id}"), shared_dir="../shared")
        if writer.has_directories:  # object stores have no empty directories to create
            writer.make_dirs(".", *(() if job in self._prepared else ("../shared", "../taskowned")))
            self._prepared.add(job)
        return writer

    def begin_savepoint(self, job_id: str, target_dir: str | None = None) -> CheckpointWriter:
        """A writer for ``<target_dir or savepoints dir>/savepoint-<job[:6]>-<random hex>``.

        Raises:
            ConfigurationError: If neither ``target_dir`` nor a savepoints dir is set.
        """
        parent = target_dir if target_dir is not None else self.savepoints_dir
        return begin_savepoint(self._files, job_id, parent)

    def list_jobs(self) -> list[str]:
        """The ids of the jobs with at least one completed checkpoint, sorted."""
        fs, root = self._files.open(self.checkpoints_dir)
        try:
            names = list_names(fs, root)
        except fs_errors() as exc:
            raise CheckpointError(f"cannot list {self.checkpoints_dir}: {exc}") from exc
        return [
            name
            for name in names
            if not name.startswith(".") and self._files.completed(join_url(self.checkpoints_dir, name))
        ]

    def list_checkpoints(self, job_id: str) -> list[str]:
        """Locations of the completed checkpoints of ``job_id``, oldest first.

        A ``chk-<n>`` directory without ``_metadata`` (a crash before completion) is left out.
        """
        return self._files.completed(self.job_dir(job_id))

    def latest_checkpoint(self, job_id: str) -> str | None:
        """The location of the newest completed checkpoint of ``job_id``, if any."""
        done = self.list_checkpoints(job_id)
        return done[-1] if done else None

    def read_metadata(self, location: str) -> bytes:
        """The ``_metadata`` bytes of the checkpoint or savepoint at ``location``.

        Raises:
            CheckpointNotFoundError: If there is no ``_metadata`` at ``location``.
        """
        return self._files.read_metadata(location)

    def resolve_handle(self, location: str, description: Mapping[str, Any]) -> StreamStateHandle:
        """The handle a ``to_json()`` description in the metadata at ``location`` stands for."""
        return self._files.resolve_handle(location, description)

    def discard_checkpoint(self, location: str) -> None:
        """Deletes a checkpoint's ``_metadata`` (first) and exclusive files; never shared files.

        Raises:
            CheckpointError: If ``location`` is no ``chk-<n>`` directory, e.g. a savepoint.
        """
        location = location_dir(location)
        if not CHECKPOINT_DIR.fullmatch(posixpath.basename(location)):
            raise CheckpointError(
                f"refusing to discard {location}: not a checkpoint directory (chk-<n>); "
                "savepoints are never deleted by a storage, delete them yourself"
            )
        fs, path = self._files.open(location)
        try:
            # Metadata first: from that moment on the checkpoint no longer exists.
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(f"{path}/{METADATA_FILE}")
            remove_tree(fs, path)
        except fs_errors() as exc:
            raise CheckpointError(f"cannot discard {location}: {exc}") from exc

    def discard_shared(self, location: str, description: Mapping[str, Any]) -> None:
        """Deletes one shared file (in ``<job id>/shared/``) of the checkpoint at ``location``.

        Raises:
            CheckpointError: If the description is no shared file of a checkpoint.
        """
        if description.get("type") == "inline":
            return
        location = location_dir(location)
        handle = self._files.resolve_handle(location, description)
        _, path = self._files.open(location)
        shared = posixpath.normpath(f"{path}/../shared")
        if not (
            CHECKPOINT_DIR.fullmatch(posixpath.basename(location))
            and isinstance(handle, FileStreamHandle)
            and handle.path.startswith(shared + "/")
        ):
            raise CheckpointError(
                f"refusing to delete {description.get('path')!r} of {location}: only shared files of a "
                "checkpoint (in <job id>/shared/) are deleted this way"
            )
        handle.discard()

    def discard_orphans(self, job_id: str, referenced: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
        """Deletes what failed checkpoints of ``job_id`` left behind (see ``SupportsOrphanCleanup``).

        That is every ``chk-<n>`` directory without ``_metadata`` older than the
        newest completed checkpoint, and every file under ``<job id>/shared/`` that
        no ``(location, description)`` of ``referenced`` names. Call it only when
        no checkpoint of the job is in flight (retention does).

        Raises:
            CheckpointError: If the store fails (what was deleted so far stays deleted).
        """
        job = self.job_dir(job_id)
        dirs = self._files.checkpoint_dirs(job)
        complete = [i for i, done in dirs if done]
        if not complete:
            return []
        fs, job_path = self._files.open(job)
        # One open per kept checkpoint, not per file: an incremental job references many,
        # and with skip_instance_cache every open builds a new filesystem.
        bases = {loc: self._files.open(location_dir(loc))[1] for loc in {loc for loc, _ in referenced}}
        keep = {
            path
            for location, description in referenced
            if description.get("type") == "file"
            and (path := contained_path(bases[location], description.get("path"))) is not None
        }
        deleted: list[str] = []
        try:
            for i, done in dirs:
                if not done and i < complete[-1]:
                    remove_tree(fs, f"{job_path}/chk-{i}")
                    deleted.append(join_url(job, f"chk-{i}"))
            shared = f"{job_path}/shared"
            fs.invalidate_cache(shared)
            try:
                files = [posixpath.normpath(str(f)) for f in fs.find(shared)]
            except FileNotFoundError:
                files = []
            for path in files:
                if path not in keep:
                    with contextlib.suppress(FileNotFoundError):
                        fs.rm_file(path)
                    deleted.append(str(fs.unstrip_protocol(path)))
        except fs_errors() as exc:
            raise CheckpointError(f"cannot delete what failed checkpoints left in {job}: {exc}") from exc
        return deleted

    # --- fencing (statekit.backend_api.SupportsRunFencing) --------------------------------------------

    def register_run(self, job_id: str, run_id: str, description: Mapping[str, Any]) -> int:
        """Writes ``<job>/runs/run-<epoch>-<run id>.json``, ``epoch`` one above the highest there.

        Records older than the run this one displaces are deleted (best effort).
        See :class:`statekit.backend_api.SupportsRunFencing`.

        Raises:
            CheckpointError: If the store fails.
        """
        return self._run_records.register_run(job_id, run_id, description)

    def newest_run(self, job_id: str) -> tuple[int, str, dict[str, Any]] | None:
        """``(epoch, run id, description)`` of the highest ``(epoch, run id)`` under ``<job>/runs``.

        Raises:
            CheckpointError: If the store fails.
        """
        return self._run_records.newest_run(job_id)

    def end_run(self, job_id: str, run_id: str) -> None:
        """Adds ``ended_ms`` to run ``run_id``'s record, if it is still there.

        Raises:
            CheckpointError: If the store fails.
        """
        self._run_records.end_run(job_id, run_id)

    # --- a job's small files (statekit.backend_api.SupportsJobFiles) ----------------------------------

    def write_job_file(self, job_id: str, name: str, data: bytes) -> None:
        """Replaces ``<job>/files/<name>`` with ``data``, whole or not at all.

        Raises:
            CheckpointError: If the name is invalid or the store fails (the old file stays).
        """
        self._job_files.write(job_id, name, data)

    def create_job_file(self, job_id: str, name: str, data: bytes) -> bool:
        """Creates ``<job>/files/<name>`` holding ``data`` unless it exists; whether it was created.

        Exclusive on local disks and S3 (see ``_publishing.publish``), so of two
        writers racing, one creates it and the other is told it exists.

        Raises:
            CheckpointError: If the name is invalid or the store fails.
        """
        return self._job_files.create(job_id, name, data)

    def read_job_file(self, job_id: str, name: str) -> bytes | None:
        """The bytes of ``<job>/files/<name>``, or None if there is none.

        Raises:
            CheckpointError: If the name is invalid or the store fails.
        """
        return self._job_files.read(job_id, name)

    def delete_job_file(self, job_id: str, name: str) -> None:
        """Deletes ``<job>/files/<name>`` if it is there.

        Raises:
            CheckpointError: If the name is invalid or the store fails.
        """
        self._job_files.delete(job_id, name)


def find_latest_checkpoint(directory: str, *, storage_options: Mapping[str, Any] | None = None) -> str | None:
    """The newest completed checkpoint in a job's directory, or in a checkpoints dir of one job.

    Args:
        directory: ``<checkpoints dir>/<job id>`` or ``<checkpoints dir>``.
        storage_options: fsspec storage options for ``directory``.

    Returns:
        The checkpoint's location, or None if there is none.

    Raises:
        CheckpointError: If ``directory`` holds checkpoints of several jobs.
    """
    storage = FileSystemCheckpointStorage(directory, storage_options=storage_options)
    own = storage._files.completed(storage.checkpoints_dir)
    if own:
        return own[-1]
    jobs = storage.list_jobs()
    if len(jobs) > 1:
        raise CheckpointError(
            f"{directory} holds checkpoints of several jobs ({', '.join(jobs)}); name one job's directory"
        )
    return storage.latest_checkpoint(jobs[0]) if jobs else None
