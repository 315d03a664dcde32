"""Tests of plugin discovery, registration and creation by name."""

from __future__ import annotations

import sys
import textwrap
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from statekit._config import ConfigOption
from statekit._errors import ConfigurationError, PluginConflictError, PluginError, UnknownPluginError
from statekit._registry import (
    BackendSpec,
    PluginLoadWarning,
    PluginRegistry,
    StorageSpec,
    default_registry,
    hookimpl,
    reset_default_registry,
)

GROUP = "statekit"

PLUGIN_SOURCE = """
from statekit._config import ConfigOption
from statekit._registry import BackendSpec, StorageSpec, hookimpl

CALLS = []

@hookimpl
def statekit_register_backends(register):
    register(BackendSpec(
        "{name}", "{engine}:make",
        options=(ConfigOption("cache-size", int, 1024, "Bytes of cache."),),
        description="A fake backend.",
    ))

@hookimpl
def statekit_register_storages(register):
    register(StorageSpec("{name}-store", "{engine}:make"))

@hookimpl
def statekit_checkpoint_completed(job_id, checkpoint_id, location):
    CALLS.append(("completed", job_id, checkpoint_id, location))

@hookimpl
def statekit_restore_done(job_id, checkpoint_id, subtask_index, parallelism):
    CALLS.append(("restored", job_id, checkpoint_id, subtask_index, parallelism))
"""

ENGINE_SOURCE = """
def make(options):
    return ("engine", options)
"""

MakeDist = Callable[..., str]


@pytest.fixture
def make_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeDist]:
    """Installs fake distributions into a fresh sys.path entry; returns the plugin module's name."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    created: list[str] = []

    def make(dist: str, source: str = PLUGIN_SOURCE, name: str = "fakedb", version: str = "1.0") -> str:
        module = f"fk_{dist.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
        engine = f"{module}_engine"
        created.extend([module, engine])
        (site / f"{module}.py").write_text(textwrap.dedent(source).format(name=name, engine=engine))
        (site / f"{engine}.py").write_text(ENGINE_SOURCE)
        info = site / f"{dist}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[{GROUP}]\n{name} = {module}\n")
        return module

    yield make
    for module in created:
        sys.modules.pop(module, None)


def test_load_finds_plugins_without_importing_their_engine(make_dist: MakeDist) -> None:
    module = make_dist("fakeplugin")
    registry = PluginRegistry.load()
    record = registry.backends()["fakedb"]
    assert (record.kind, record.distribution, record.version) == ("backend", "fakeplugin", "1.0")
    assert registry.storages()["fakedb-store"].distribution == "fakeplugin"
    assert registry.backend_spec("fakedb").description == "A fake backend."
    assert f"{module}_engine" not in sys.modules

    backend = registry.create_backend("fakedb", {"cache-size": "2kb"})
    assert backend == ("engine", {"cache-size": 2048})
    assert f"{module}_engine" in sys.modules
    assert registry.create_storage("fakedb-store") == ("engine", {})


def test_broken_plugin_is_skipped_with_a_warning_naming_it(make_dist: MakeDist) -> None:
    make_dist("fakeplugin")
    make_dist("brokenplugin", "import no_such_module_xyz\n", name="broken", version="0.3")
    with pytest.warns(PluginLoadWarning) as caught:
        registry = PluginRegistry.load()
    # Other installed plugins may warn too; this test is about ours.
    [message] = [str(w.message) for w in caught if "brokenplugin" in str(w.message)]
    assert "brokenplugin 0.3" in message
    assert "'broken'" in message
    assert "no_such_module_xyz" in message
    assert "fakedb" in registry.backends()


@pytest.mark.parametrize("how", ["env", "argument"])
def test_strict_mode_makes_a_broken_plugin_fatal(
    make_dist: MakeDist, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    make_dist("brokenplugin", "raise RuntimeError('boom')\n", name="broken")
    if how == "env":
        monkeypatch.setenv("STATEKIT_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match=r"brokenplugin.*boom"):
        PluginRegistry.load(strict=how == "argument")


def test_hook_with_a_misspelled_name_is_a_broken_Plugin(make_dist: MakeDist) -> None:
    source = (
        "from statekit._registry import hookimpl\n@hookimpl\ndef statekit_register_backend(register): pass\n"
    )
    make_dist("typoplugin", source, name="typo")
    with pytest.warns(PluginLoadWarning, match="typoplugin.*statekit_register_backend"):
        PluginRegistry.load()


def test_conflict_names_both_distributions(make_dist: MakeDist) -> None:
    make_dist("first-plugin")
    make_dist("second-plugin")
    with pytest.raises(
        PluginConflictError, match=r"backend 'fakedb' is provided by both first-plugin 1\.0 and "
    ):
        PluginRegistry.load()
    with pytest.raises(PluginConflictError, match=r"second-plugin 1\.0"):
        PluginRegistry.load()


def test_unknown_known_name_lists_installed_and_the_extra(
    make_dist: MakeDist, monkeypatch: pytest.MonkeyPatch
) -> None:
    import statekit._registry as registry_module

    make_dist("fakeplugin")
    registry = PluginRegistry.load()
    # A backend statekit knows of that is not installed here (rocksdb and lmdb are, in this repository).
    known = {**registry_module.KNOWN_EXTRAS["backend"], "foundationdb": "statekit[foundationdb]"}
    monkeypatch.setattr(registry_module, "KNOWN_EXTRAS", {**registry_module.KNOWN_EXTRAS, "backend": known})
    with pytest.raises(UnknownPluginError) as info:
        registry.create_backend("foundationdb")
    message = str(info.value)
    assert message.startswith("backend 'foundationdb' is not installed. Installed backends: ")
    assert "fakedb" in message
    assert message.endswith('Install it with: pip install "statekit[foundationdb]"')


def test_unknown_third_party_name_explains_registration() -> None:
    registry = PluginRegistry()
    with pytest.raises(UnknownPluginError) as info:
        registry.storage_spec("hdfs-magic")
    message = str(info.value)
    assert "Installed storages: none" in message
    assert "No known package provides it" in message
    assert "entry point in the group 'statekit'" in message


def test_unknown_name_suggests_a_close_one(make_dist: MakeDist) -> None:
    make_dist("fakeplugin")
    with pytest.raises(UnknownPluginError, match="Did you mean 'fakedb'"):
        PluginRegistry.load().backend_spec("fakedv")


def test_options_are_validated_before_the_factory_runs(make_dist: MakeDist) -> None:
    module = make_dist("fakeplugin")
    registry = PluginRegistry.load()
    with pytest.raises(
        ConfigurationError, match=r"unknown option statekit\.backend\.fakedb\.cache; .*cache-size"
    ):
        registry.create_backend("fakedb", {"cache": 1})
    with pytest.raises(ConfigurationError, match=r"'big' for statekit\.backend\.fakedb\.cache-size"):
        registry.create_backend("fakedb", {"cache-size": "big"})
    assert f"{module}_engine" not in sys.modules


def test_lifecycle_hooks_reach_plugins(make_dist: MakeDist) -> None:
    module = make_dist("fakeplugin")
    registry = PluginRegistry.load()
    registry.hook.statekit_checkpoint_completed(job_id="j", checkpoint_id=3, location="file:///c/j/chk-3")
    registry.hook.statekit_restore_done(job_id="j", checkpoint_id=None, subtask_index=1, parallelism=4)
    assert sys.modules[module].CALLS == [
        ("completed", "j", 3, "file:///c/j/chk-3"),
        ("restored", "j", None, 1, 4),
    ]


class _Plugin:
    def __init__(self, *specs: BackendSpec | StorageSpec) -> None:
        self.specs = specs
        self.completed: list[int] = []

    @hookimpl
    def statekit_register_backends(self, register: Any) -> None:
        for spec in self.specs:
            register(spec)

    @hookimpl
    def statekit_checkpoint_completed(self, job_id: str, checkpoint_id: int, location: str) -> None:
        self.completed.append(checkpoint_id)


def test_missing_engine_says_what_to_install() -> None:
    registry = PluginRegistry()
    registry.register_plugin(
        _Plugin(BackendSpec("rocksdb", "no_such_engine_xyz.mod:make")), "statekit-rocksdb"
    )
    registry.register_plugin(
        _Plugin(BackendSpec("exotic", "no_such_engine_xyz:make")), "exotic-backend", "2.0"
    )
    with pytest.raises(
        PluginError, match=r"module 'no_such_engine_xyz'.*pip install \"statekit\[rocksdb\]\""
    ):
        registry.create_backend("rocksdb")
    with pytest.raises(
        PluginError, match=r"exotic-backend 2\.0 needs module 'no_such_engine_xyz'.*exotic-backend"
    ):
        registry.create_backend("exotic")


def test_factory_may_be_a_callable_or_a_missing_attribute() -> None:
    registry = PluginRegistry()
    registry.register_plugin(_Plugin(BackendSpec("direct", dict), BackendSpec("gone", "json:no_such_thing")))
    assert registry.create_backend("direct") == {}
    with pytest.raises(PluginError, match="'json:no_such_thing' of backend 'gone' does not exist"):
        registry.create_backend("gone")


def test_local_plugin_registration_is_all_or_nothing() -> None:
    registry = PluginRegistry()
    accepted, rejected = (
        _Plugin(BackendSpec("a", dict)),
        _Plugin(BackendSpec("b", dict), BackendSpec("a", dict)),
    )
    registry.register_plugin(accepted, "dist-one")
    with pytest.raises(PluginConflictError, match="dist-one and dist-two"):
        registry.register_plugin(rejected, "dist-two")
    assert list(registry.backends()) == ["a"]
    registry.hook.statekit_checkpoint_completed(job_id="j", checkpoint_id=1, location="l")
    assert (accepted.completed, rejected.completed) == ([1], [])
    with pytest.raises(PluginError, match="backends must be registered as BackendSpec"):
        registry.register_plugin(_Plugin(StorageSpec("s", dict)))
    assert registry.storages() == {}


@pytest.mark.parametrize("name", ["", "Rocks", "my.db", "-x"])
def test_spec_names_must_fit_in_keys(name: str) -> None:
    with pytest.raises(PluginError, match="invalid backend name"):
        BackendSpec(name, dict)


def test_spec_checks_factory_and_options() -> None:
    with pytest.raises(PluginError, match="module:attribute"):
        StorageSpec("s", "module_without_attribute")
    with pytest.raises(PluginError, match="option twice"):
        BackendSpec("b", dict, (ConfigOption("x", int), ConfigOption("x", str)))


def test_default_registry_is_cached_until_reset(make_dist: MakeDist) -> None:
    reset_default_registry()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PluginLoadWarning)  # from unrelated installed plugins
            first = default_registry()
            assert default_registry() is first
            make_dist("fakeplugin")
            assert "fakedb" not in first.backends()
            reset_default_registry()
            assert "fakedb" in default_registry().backends()
    finally:
        reset_default_registry()
