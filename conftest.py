"""Hypothesis profiles for the whole suite (``ci``, the default, and ``nightly``) and shared fixtures.

Depth that ci does not need runs under the ``nightly`` profile only:

* ``@pytest.mark.nightly`` (on a test or on a ``pytest.param``) skips a case unless the
  nightly profile is loaded; use it for a parametrization that repeats a path other cases
  of the same test already take.
* A conformance kit class of a plugin package that the matrix of tests/test_conformance.py
  runs again, on the same backend with the same options, is skipped test by test where the
  matrix's identical case is collected in the same run (see ``KIT_CLASSES_IN_THE_MATRIX``).
  Run alone (``pytest examples/statekit-sqlite/tests``) or nightly, it runs whole.
* The matrix's write-buffer-at-1 variants (``[<backend>-buffer-1-...]``) run under ci on
  ``lmdb`` only (``BUFFER_1_IN_CI``): the buffer is ``OrderedKVBackendBase``'s, the same
  code on every ordered engine, and what differs per engine (its ``kv_write``) runs at the
  default buffer under ci too. Nightly runs them on every backend; a plugin author's own
  kit run (the installed kit) always runs both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# ci stays lean: every backend (heap, rocksdb, lmdb, sqlite) runs the kit against every storage.
settings.register_profile("ci", max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "nightly", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))  # --hypothesis-profile overrides

#: Kit classes of plugin packages, by node id, and the matrix row that runs the same kit on the
#: same backend: the registry's ``sqlite`` is ``SqliteStateBackend`` with the options that
#: TestSqliteConformance passes (``synchronous`` "off", the default cache size).
KIT_CLASSES_IN_THE_MATRIX = {
    "examples/statekit-sqlite/tests/test_conformance.py::TestSqliteConformance": (
        "tests/test_conformance.py::TestBackendConformance",
        "sqlite",
    ),
}
#: The matrix's backends whose write-buffer-at-1 variants run under ci (all of them nightly).
BUFFER_1_IN_CI = {"lmdb"}
_MATRIX = "tests/test_conformance.py::TestBackendConformance::"

#: The kit's guard checks the class it runs in: never a duplicate of another class's.
_OWN_CLASS_TESTS = {"test_kit_tests_are_present_and_unchanged"}


def nightly() -> bool:
    """Whether the ``nightly`` profile is loaded (after --hypothesis-profile was applied)."""
    return settings.get_current_profile_name() == "nightly"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "nightly: depth that runs under the nightly Hypothesis profile only (skipped under ci)"
    )
    if not hasattr(config, "workerinput"):  # once, in the process that starts the test processes
        import jvmarchive  # tests/, on pytest's pythonpath

        path, said, making = jvmarchive.ensure()
        _JVM_ARCHIVE.update(said=said, making=making)
        if path is not None:
            jvmarchive.use(path)  # the test processes inherit the environment


#: What :mod:`jvmarchive` did for this run: the header's line, and the archive's making if it ran.
_JVM_ARCHIVE: dict[str, Any] = {}


def pytest_report_header(config: pytest.Config) -> str | None:
    return f"Spark JVM class-data archive: {_JVM_ARCHIVE['said']}" if _JVM_ARCHIVE else None


def pytest_terminal_summary(terminalreporter: Any) -> None:
    making = _JVM_ARCHIVE.get("making")
    if making is not None:  # made during this run: say how it went (a failure only slows the JVMs)
        terminalreporter.write_line(f"Spark JVM class-data archive: {making.wait(600)}")


@pytest.hookimpl(trylast=True)  # after -k and -m deselected: a twin must be in the run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if nightly():
        return
    depth = pytest.mark.skip(reason="depth beyond ci: runs under --hypothesis-profile=nightly")
    ids = {item.nodeid for item in items}
    for item in items:
        if item.get_closest_marker("nightly") is not None:
            item.add_marker(depth)
            continue
        if item.nodeid.startswith(_MATRIX) and "-buffer-1" in item.nodeid:
            backend = item.nodeid.partition("[")[2].partition("-buffer-1")[0]
            if backend not in BUFFER_1_IN_CI:
                item.add_marker(depth)
                continue
        cls, _, test = item.nodeid.rpartition("::")
        if cls not in KIT_CLASSES_IN_THE_MATRIX:
            continue
        name, _, params = test.partition("[")
        if name in _OWN_CLASS_TESTS:
            continue
        matrix, backend = KIT_CLASSES_IN_THE_MATRIX[cls]
        twin = f"{matrix}::{name}[{backend}{'-' + params.rstrip(']') if params else ''}]"
        if twin in ids:
            item.add_marker(pytest.mark.skip(reason=f"the same kit test on the same backend runs as {twin}"))


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[dict[str, str]]:
    """A real S3 API on 127.0.0.1 for the whole session: moto's server in a thread.

    Sets dummy AWS credentials in the environment, creates a bucket and yields
    ``{"endpoint_url": "http://127.0.0.1:<port>", "bucket": <name>}``. Pass the
    endpoint to s3fs as ``client_kwargs={"endpoint_url": ...}``.
    """
    moto_server = pytest.importorskip("moto.server", reason="needs moto[server]")
    boto3 = pytest.importorskip("boto3")
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {key: os.environ.get(key) for key in [*env, "NO_PROXY", "no_proxy"]}
    os.environ.update(env)
    for key in ("NO_PROXY", "no_proxy"):  # a configured proxy must not see loopback traffic
        os.environ[key] = ",".join(filter(None, [os.environ.get(key), "127.0.0.1"]))
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        bucket = "statekit-test"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
        yield {"endpoint_url": endpoint, "bucket": bucket}
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class SecondUser:
    """Another local user of this machine, made with ``useradd`` for tests of confinement."""

    def __init__(self, name: str) -> None:
        import pwd

        entry = pwd.getpwnam(name)
        self.name = name
        self.uid = entry.pw_uid
        self.gid = entry.pw_gid

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as this user (``setpriv``: no login shell, no environment of ours but PATH)."""
        cmd = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--", *argv]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/"}
        return subprocess.run(cmd, check=check, capture_output=True, text=True, env=env)


@pytest.fixture(scope="session")
def second_user() -> SecondUser:
    """A second local user (``statekit-probe``), created with ``useradd`` once; skipped unless root."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second local user with useradd (CI runs the suite as root)")
    if shutil.which("useradd") is None or shutil.which("setpriv") is None:
        pytest.skip("needs useradd and setpriv (Debian's passwd and util-linux) to make a second user")
    name = "statekit-probe"
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        useradd = ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name]
        made = subprocess.run(useradd, check=False)
        # Another test process (make pytest runs two) may have made it meanwhile: then it exists now.
        if made.returncode != 0:
            pwd.getpwnam(name)
    return SecondUser(name)
