"""The storage's store errors: taken from the modules imported, never importing a client."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def test_a_local_checkpoint_imports_no_object_store_client(tmp_path: Path) -> None:
    # aiohttp and botocore are what s3fs raises through: a process that only writes and reads local
    # files (a Spark worker restoring) does not import them (an eighth of a second).
    code = f"""
import sys
from statekit_storage import FileSystemCheckpointStorage
from statekit_storage._handles import fs_errors
storage = FileSystemCheckpointStorage({str(tmp_path)!r})
w = storage.begin_checkpoint("j", 1)
out = w.create_stream("s")
out.write(b"abc" * 100_000)
assert out.close_and_get_handle().read(1, 2) == b"bc"
assert fs_errors() == (OSError,), fs_errors()
assert "aiohttp" not in sys.modules and "botocore" not in sys.modules, "a client was imported"
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_object_store_errors_are_caught_once_their_client_is_imported() -> None:
    aiohttp = pytest.importorskip("aiohttp")
    botocore_exceptions = pytest.importorskip("botocore.exceptions")
    from statekit_storage._handles import fs_errors

    errors = fs_errors()
    assert OSError in errors
    assert aiohttp.ClientError in errors and botocore_exceptions.BotoCoreError in errors
    assert issubclass(aiohttp.ServerDisconnectedError, errors)
    assert issubclass(botocore_exceptions.EndpointConnectionError, errors)
