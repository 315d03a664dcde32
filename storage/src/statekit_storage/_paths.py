"""Paths of the filesystem storages: directories, locations, and the names streams and jobs may take.

:func:`normalize_dir` and :func:`location_dir` make the forms a user writes
(local paths, a trailing slash, ``.../_metadata``) one; :func:`check_job_id`
and :func:`check_name` refuse names that would leave their directory;
:func:`contained_path` keeps a path read from ``_metadata`` inside the
checkpoint's job directory or the savepoint.
"""

from __future__ import annotations

import os
import posixpath
import re

from fsspec.core import split_protocol  # type: ignore[import-untyped]

from statekit.errors import CheckpointError

__all__ = [
    "CHECKPOINT_DIR",
    "METADATA_FILE",
    "check_job_id",
    "check_name",
    "contained_path",
    "join_url",
    "location_dir",
    "normalize_dir",
    "protocol_of",
    "root_of",
]

#: The file whose presence makes a directory a completed checkpoint or savepoint.
METADATA_FILE = "_metadata"
#: The name of a checkpoint's directory, ``chk-<n>``.
CHECKPOINT_DIR = re.compile(r"chk-(0|[1-9][0-9]*)")


def protocol_of(url: str) -> str:
    protocol, _ = split_protocol(url)
    return str(protocol or "file")


def normalize_dir(url: str) -> str:
    """Makes local paths absolute and drops a trailing slash (but not from ``memory://``)."""
    url = os.fspath(url)
    if split_protocol(url)[0] is None:
        return os.path.abspath(os.path.expanduser(url))
    stripped = url.rstrip("/")
    return url if stripped.endswith(":") else stripped


def location_dir(location: str) -> str:
    """A location without a trailing slash or ``/_metadata``."""
    location = normalize_dir(location)
    suffix = "/" + METADATA_FILE
    return location[: -len(suffix)] if location.endswith(suffix) else location


def join_url(base: str, *parts: str) -> str:
    return base + ("" if base.endswith("/") else "/") + "/".join(parts)


def check_job_id(job_id: str) -> str:
    if not job_id or job_id.startswith(".") or "/" in job_id or "\\" in job_id:
        raise CheckpointError(
            f"invalid job id {job_id!r}: it names a directory, so it may not be empty, "
            "start with '.' or hold '/' or '\\'"
        )
    return job_id


def check_name(name: str) -> str:
    if (
        not name
        or "\\" in name
        or name == METADATA_FILE
        or any(part in ("", ".", "..") for part in name.split("/"))
    ):
        raise CheckpointError(
            f"invalid stream name {name!r}: use a relative path without empty, '.' or '..' parts, "
            f"other than {METADATA_FILE}"
        )
    return name


def root_of(location: str) -> str:
    """The directory a checkpoint's (its job's) or a savepoint's (its own) files must lie in."""
    return posixpath.dirname(location) if CHECKPOINT_DIR.fullmatch(posixpath.basename(location)) else location


def contained_path(base: str, relative: object) -> str | None:
    """``base/relative`` normalized, or None if it is no plain relative path inside the allowed root.

    ``base`` is the path of a checkpoint (``.../<job>/chk-<n>``: the root is the job's
    directory) or of a savepoint (the root is the savepoint itself). Absolute paths,
    URLs (another bucket, another scheme) and ``..`` past the root are refused.
    """
    if (
        not isinstance(relative, str)
        or not relative
        or relative.startswith(("/", "~"))
        or "://" in relative
        or any(c in relative for c in ("\\", "\x00"))
    ):
        return None
    root = root_of(base)
    path = posixpath.normpath(f"{base}/{relative}")
    return path if path.startswith(root.rstrip("/") + "/") else None
