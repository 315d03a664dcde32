"""statekit's conformance kit, run against the sqlite backend: the whole contract in a few lines."""

from __future__ import annotations

import pytest

from statekit.testing import StateBackendTests
from statekit_sqlite import SqliteStateBackend


class TestSqliteConformance(StateBackendTests):
    """Every semantic test and named property of statekit.testing, on SQLite files."""

    @pytest.fixture
    def backend_factory(self):
        return lambda: SqliteStateBackend({"synchronous": "off"})
