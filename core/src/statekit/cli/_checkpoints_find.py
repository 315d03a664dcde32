"""Which checkpoints a directory named on the command line holds: one job's, every job's, or itself.

A directory that is no checkpoints directory is answered with what it is
instead (a checkpoint, one job's directory), so the message says which
command or argument would have worked.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import posixpath

from .._contracts import CheckpointStorage
from .._errors import CheckpointNotFoundError, ConfigurationError, CorruptSnapshotError, StateError
from ..checkpoints._locations import filesystem_storage, parent_location
from ._cli import CommandContext

__all__ = ["is_checkpoint", "jobs_under", "local_path", "storage_for", "verify_targets"]


def storage_for(ctx: CommandContext, directory: str, options: str | None) -> CheckpointStorage:
    return filesystem_storage(directory, storage_options=options, registry=ctx.registry)


def local_path(url: str) -> str | None:
    """The local path ``url`` names, or None for a URL of another protocol."""
    if url.startswith("file://"):
        return url[len("file://") :]
    return None if "://" in url else url


def is_checkpoint(storage: CheckpointStorage, path: str) -> bool:
    """Whether ``path`` holds a ``_metadata`` (a damaged one too): a checkpoint, not a directory of them."""
    try:
        storage.read_metadata(path)
    except CheckpointNotFoundError:
        return False
    except CorruptSnapshotError:
        return True
    return True


def jobs_under(
    ctx: CommandContext, storage: CheckpointStorage, args: argparse.Namespace, directory: str
) -> list[str]:
    """The jobs to look at under ``directory``: ``args.job``, or every job with a completed checkpoint.

    Raises:
        CheckpointNotFoundError: If there is nothing to look at: ``directory`` is
            missing or a file, ``args.job`` has no completed checkpoint there, or no job has one.
        ConfigurationError: If the storage cannot list jobs and no ``--job`` is given.
    """
    local = local_path(directory)
    if local is not None and not os.path.isdir(local):
        what = "it is a file, not a directory" if os.path.exists(local) else "it does not exist"
        raise CheckpointNotFoundError(f"no checkpoints at {directory}: {what}")
    list_jobs = getattr(storage, "list_jobs", None)
    if args.job is None and list_jobs is None:
        raise ConfigurationError("this storage cannot list jobs; pass --job")
    if args.job is not None and storage.list_checkpoints(args.job):
        return [args.job]
    # Listing the jobs reads every job's directory: only when no --job is given, or it has nothing.
    known: list[str] = [] if list_jobs is None else list(list_jobs())
    if args.job is not None:
        others = ""
        if list_jobs is not None:
            others = (
                f"; jobs with checkpoints there: {', '.join(known)}" if known else "; nor has any other job"
            )
        raise CheckpointNotFoundError(
            f"job {args.job!r} has no completed checkpoint under {directory}{others}"
        )
    if not known:
        hint = _not_a_checkpoints_directory(ctx, args, directory)
        raise CheckpointNotFoundError(f"no completed checkpoint under {directory}{hint}")
    return known


def _not_a_checkpoints_directory(ctx: CommandContext, args: argparse.Namespace, directory: str) -> str:
    """What ``directory`` is instead, when it is a checkpoint itself or one job's directory; else ""."""
    parent = storage_for(ctx, parent_location(directory), args.storage_options)
    if is_checkpoint(parent, directory):
        return f"; it is a checkpoint itself: statekit checkpoints inspect (or verify) {directory}"
    name = posixpath.basename(directory.rstrip("/"))
    with contextlib.suppress(StateError):  # a name that is no valid job id is no job's directory
        if parent.list_checkpoints(name):
            return (
                f"; it is the directory of job {name!r}: pass its parent, "
                f"{parent_location(directory)} (with --job {name})"
            )
    return ""


def verify_targets(args: argparse.Namespace, ctx: CommandContext) -> tuple[CheckpointStorage, list[str]]:
    """The storage and the checkpoints ``verify`` reads: the one at ``args.path``, or those under it."""
    if args.job is None:
        storage = storage_for(ctx, parent_location(args.path), args.storage_options)
        if is_checkpoint(storage, args.path):
            return storage, [args.path]
    storage = storage_for(ctx, args.path, args.storage_options)
    jobs = jobs_under(ctx, storage, args, args.path)
    return storage, [location for job in jobs for location in storage.list_checkpoints(job)]
