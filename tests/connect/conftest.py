"""The Connect tests' one Spark Connect server (see ``connectserver.py``), for the whole test session.

Connect clients run in processes of their own (``connect_client.py``): a
Connect session in this process would switch PySpark here to Connect mode
(``SPARK_CONNECT_MODE_ENABLED``), under the classic tests' feet.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
for p in (str(HERE), str(TESTS), str(TESTS / "spark")):
    if p not in sys.path:
        sys.path.insert(0, p)

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError:  # without statekit[spark-connect] installed, these tests are not collected
    collect_ignore_glob = ["test_*.py"]

from connectserver import ConnectServer  # noqa: E402 - after the path set-up


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """The test session's Spark Connect server; stopped (killed: it holds no state) at the end."""
    server = ConnectServer(tmp_path_factory.mktemp("connect-server"))
    server.start()
    try:
        yield server
    finally:
        server.kill()
