"""Registration through entry points, options, and errors for missing filesystem packages."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from statekit.backend_api import CheckpointStorage, PluginRegistry
from statekit.errors import ConfigurationError
from statekit_storage import FileSystemCheckpointStorage, JobManagerCheckpointStorage


@pytest.fixture(scope="module")
def registry() -> PluginRegistry:
    with warnings.catch_warnings():  # other plugins of the workspace may be mid-edit
        warnings.simplefilter("ignore")
        return PluginRegistry.load()


def test_entry_points_register_both_storages(registry: PluginRegistry) -> None:
    storages = registry.storages()
    assert {"filesystem", "jobmanager"} <= set(storages)
    assert {storages[n].distribution for n in ("filesystem", "jobmanager")} == {"statekit-storage"}


def test_registration_is_light() -> None:
    code = (
        "import sys, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "from statekit import PluginRegistry\n"
        "PluginRegistry.load().storages()['filesystem']\n"
        "print('fsspec' in sys.modules, 'statekit_storage._filesystem' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_create_by_name(registry: PluginRegistry, tmp_path: Path) -> None:
    fs_storage = registry.create_storage(
        "filesystem",
        {"checkpoints-dir": str(tmp_path), "inline-threshold": "1k", "savepoints-dir": str(tmp_path / "sp")},
    )
    assert isinstance(fs_storage, FileSystemCheckpointStorage) and isinstance(fs_storage, CheckpointStorage)
    assert fs_storage.inline_threshold == 1024 and fs_storage.max_state_size is None
    assert fs_storage.savepoints_dir == str(tmp_path / "sp")
    jm = registry.create_storage("jobmanager", {"max-state-size": "10mb"})
    assert isinstance(jm, JobManagerCheckpointStorage) and isinstance(jm, CheckpointStorage)
    assert jm.max_state_size == 10 << 20
    assert registry.create_storage("jobmanager").max_state_size == 5 << 20


def test_unknown_and_bad_options(registry: PluginRegistry, tmp_path: Path) -> None:
    unknown = (
        r"unknown option .*filesystem\.inline-treshold; Did you mean .*filesystem\.inline-threshold\? "
        r"valid options .*checkpoints-dir"
    )
    with pytest.raises(ConfigurationError, match=unknown):
        registry.create_storage("filesystem", {"checkpoints-dir": str(tmp_path), "inline-treshold": 1})
    with pytest.raises(ConfigurationError, match="unknown option .*checkpoints-dir.*max-state-size"):
        registry.create_storage("jobmanager", {"checkpoints-dir": str(tmp_path)})
    with pytest.raises(ConfigurationError, match=r"set statekit\.checkpoints\.dir"):
        registry.create_storage("filesystem")
    with pytest.raises(ConfigurationError, match="inline-threshold"):
        registry.create_storage("filesystem", {"checkpoints-dir": str(tmp_path), "inline-threshold": "lots"})
    with pytest.raises(ConfigurationError, match="filesystem.inline-threshold must be at least 0, not -1"):
        registry.create_storage("filesystem", {"checkpoints-dir": str(tmp_path), "inline-threshold": -1})
    with pytest.raises(ConfigurationError, match=r"filesystem\.storage-options: not JSON"):
        registry.create_storage("filesystem", {"checkpoints-dir": str(tmp_path), "storage-options": "{nope"})
    with pytest.raises(ConfigurationError, match=r"jobmanager\.storage-options: expected a JSON object"):
        registry.create_storage("jobmanager", {"storage-options": "[1]"})
    with pytest.raises(ConfigurationError, match="cannot open nosuch://x"):
        registry.create_storage("filesystem", {"checkpoints-dir": "nosuch://x"})


def test_storage_options_reach_s3(registry: PluginRegistry, s3_endpoint: dict[str, str], job_id: str) -> None:
    url = f"s3://{s3_endpoint['bucket']}/by-name"
    options = f'{{"client_kwargs": {{"endpoint_url": "{s3_endpoint["endpoint_url"]}"}}}}'
    storage = registry.create_storage("filesystem", {"checkpoints-dir": url, "storage-options": options})
    location = storage.begin_checkpoint(job_id, 1).complete(b"via options")
    assert storage.read_metadata(location) == b"via options"
    storage.discard_checkpoint(location)


def test_aws_endpoint_url_env(
    s3_endpoint: dict[str, str], monkeypatch: pytest.MonkeyPatch, job_id: str
) -> None:
    """botocore (so s3fs) honours AWS_ENDPOINT_URL: no storage options needed."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint["endpoint_url"])
    url = f"s3://{s3_endpoint['bucket']}/by-env"
    # A fresh s3fs instance, so that it reads the environment now.
    storage = FileSystemCheckpointStorage(url, storage_options={"skip_instance_cache": True})
    location = storage.begin_checkpoint(job_id, 1).complete(b"via env")
    assert storage.read_metadata(location) == b"via env"
    storage.discard_checkpoint(location)


def _hide(monkeypatch: pytest.MonkeyPatch, protocols: tuple[str, ...], modules: tuple[str, ...]) -> None:
    registry: Any = importlib.import_module("fsspec.registry")._registry  # classes already imported
    for protocol in protocols:
        monkeypatch.delitem(registry, protocol, raising=False)
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed


def test_s3_without_s3fs_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch, ("s3", "s3a"), ("s3fs",))
    with pytest.raises(
        ConfigurationError, match=r'Install it with: pip install --find-links wheelhouse "statekit\[s3\]"'
    ):
        FileSystemCheckpointStorage("s3://bucket/checkpoints")


def test_hdfs_without_pyarrow_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch, ("hdfs", "arrow_hdfs"), ("pyarrow", "pyarrow.fs"))
    with pytest.raises(
        ConfigurationError, match=r'Install it with: pip install --find-links wheelhouse "statekit\[hdfs\]"'
    ):
        FileSystemCheckpointStorage("hdfs://namenode:8020/checkpoints")


def test_hdfs_without_hadoop_points_to_the_readme() -> None:
    pytest.importorskip("pyarrow.fs")
    with pytest.raises(ConfigurationError, match="cannot open hdfs://.*JAVA_HOME.*README"):
        FileSystemCheckpointStorage("hdfs://127.0.0.1:1/checkpoints")


def test_secret_storage_options_merge_and_env_references_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    from statekit_storage._options import parse_storage_options

    monkeypatch.setenv("STATEKIT_TEST_TOKEN", "from-the-environment")
    options = parse_storage_options(
        '{"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}, "anon": false}',
        "filesystem",
        '{"client_kwargs": {"region_name": "x"}, "token": "${env:STATEKIT_TEST_TOKEN}",'
        ' "list": ["${env:STATEKIT_TEST_TOKEN}"]}',
    )
    assert options == {
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9", "region_name": "x"},
        "anon": False,
        "token": "from-the-environment",
        "list": ["from-the-environment"],
    }
    assert parse_storage_options('{"a": "not ${env:STATEKIT_TEST_TOKEN}"}', "filesystem") == {
        "a": "not ${env:STATEKIT_TEST_TOKEN}"  # only a whole value refers to a variable
    }
    monkeypatch.delenv("STATEKIT_TEST_TOKEN")
    with pytest.raises(
        ConfigurationError, match="environment variable STATEKIT_TEST_TOKEN, which is not set"
    ):
        parse_storage_options(None, "filesystem", '{"token": "${env:STATEKIT_TEST_TOKEN}"}')
