"""Tests of plugin discovery, registration and creation by name."""

from __future__ import annotations

import sys
import textwrap
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from statekit import KeyedProcessFunction, LocalRunner, ProcessContext, RecordSource
from statekit._errors import (
    ConfigurationError,
    PluginConflictError,
    PluginError,
    UnknownPluginError,
    install_hint,
)
from statekit.plugins._config import ConfigOption, Configuration
from statekit.plugins._registry import (
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
from statekit.plugins._config import ConfigOption
from statekit.plugins._registry import BackendSpec, StorageSpec, hookimpl

CALLS = []

@hookimpl
def statekit_register_backends(register):
    register(BackendSpec(
        "{name}", "{engine}:make",
        options=(ConfigOption("cache-size", int, 1024, "Bytes of cache.", byte_size=True),),
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
        "from statekit.plugins._registry import hookimpl\n"
        "@hookimpl\ndef statekit_register_backend(register): pass\n"
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
    import statekit.plugins._registry as registry_module

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
    wanted = 'pip install --find-links wheelhouse -c wheelhouse/constraints.txt "statekit[foundationdb]"'
    assert f"Install it with: {wanted}" in message
    assert message.endswith("`make wheels` in a statekit checkout builds the wheelhouse, see its README)")


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


def test_a_name_in_other_case_gets_the_real_name(make_dist: MakeDist) -> None:
    """Names are case-sensitive; 'FakeDB' is refused, naming 'fakedb' (issue 33: 'RocksDB')."""
    make_dist("fakeplugin")
    with pytest.raises(UnknownPluginError) as info:
        PluginRegistry.load().backend_spec("FakeDB")
    message = str(info.value)
    assert message.endswith("Did you mean 'fakedb'? (backend names are case-sensitive)")
    assert "No known package" not in message  # it is installed, under its real name


def test_a_known_name_in_other_case_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """'RocksDB' where rocksdb is not installed: the real name and what provides it."""
    import statekit.plugins._registry as registry_module

    known = {**registry_module.KNOWN_EXTRAS["backend"], "foundationdb": "statekit[foundationdb]"}
    monkeypatch.setattr(registry_module, "KNOWN_EXTRAS", {**registry_module.KNOWN_EXTRAS, "backend": known})
    with pytest.raises(UnknownPluginError) as info:
        PluginRegistry().backend_spec("FoundationDB")
    message = str(info.value)
    assert "Did you mean 'foundationdb'? (backend names are case-sensitive)" in message
    assert message.endswith(f"Install it with: {install_hint('statekit[foundationdb]')}")


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
        PluginError,
        match=r"module 'no_such_engine_xyz'.*pip install --find-links wheelhouse "
        r"-c wheelhouse/constraints.txt \"statekit\[rocksdb\]\"",
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


class _Echo(KeyedProcessFunction):
    def process(self, record: Any, ctx: ProcessContext) -> Iterable[Any]:
        yield record


def _runner(config: dict[str, object], registry: PluginRegistry | None = None) -> LocalRunner:
    return LocalRunner(_Echo, key_selector=lambda r: r, config=config, registry=registry)


@pytest.mark.parametrize("strict", [True, "true", "1", "on"])
@pytest.mark.parametrize("which", ["default", "explicit"])
def test_plugins_strict_fails_a_local_run_naming_the_broken_plugin(
    make_dist: MakeDist, strict: object, which: str
) -> None:
    make_dist("brokenplugin", "raise RuntimeError('boom')\n", name="broken", version="0.3")
    reset_default_registry()
    try:
        with pytest.warns(PluginLoadWarning, match="brokenplugin"):
            registry = default_registry() if which == "default" else PluginRegistry.load()
        with pytest.raises(PluginError) as info:
            _runner({"statekit.plugins.strict": strict}, None if which == "default" else registry)
    finally:
        reset_default_registry()
    message = str(info.value)
    assert "plugin 'broken'" in message and "brokenplugin 0.3" in message
    assert "RuntimeError('boom')" in message and "statekit.plugins.strict" in message
    assert isinstance(info.value.__cause__, RuntimeError)


def test_without_strict_a_broken_plugin_is_skipped_and_the_job_runs(make_dist: MakeDist) -> None:
    make_dist("brokenplugin", "raise RuntimeError('boom')\n", name="broken")
    with pytest.warns(PluginLoadWarning, match="statekit.plugins.strict=true to fail instead"):
        registry = PluginRegistry.load()
    [failure] = [f for f in registry.load_failures if f.distribution == "brokenplugin"]
    assert (failure.entry_point, failure.version, repr(failure.error)) == (
        "broken", "1.0", "RuntimeError('boom')"
    )  # fmt: skip
    for strict in (False, "false", None):
        config = {} if strict is None else {"statekit.plugins.strict": strict}
        with _runner(config, registry) as runner:
            assert runner.run(RecordSource(["a", "b"])).records == 2


def test_strict_validation_is_what_the_spark_driver_runs(make_dist: MakeDist) -> None:
    make_dist("brokenplugin", "import no_such_module_xyz\n", name="broken")
    with pytest.warns(PluginLoadWarning):
        registry = PluginRegistry.load()
    conf = Configuration({"spark.statekit.plugins.strict": "true"})
    with pytest.raises(PluginError, match=r"plugin 'broken' = .* of brokenplugin 1\.0: ModuleNotFoundError"):
        conf.validate(registry)  # the Coordinator's call: conf.validate(self.registry)
    Configuration({"spark.statekit.plugins.strict": "false"}).validate(registry)


def test_require_all_loaded_names_every_failure(make_dist: MakeDist) -> None:
    make_dist("brokenone", "raise RuntimeError('one')\n", name="one")
    make_dist("brokentwo", "raise ValueError('two')\n", name="two")
    with pytest.warns(PluginLoadWarning):
        registry = PluginRegistry.load()
    with pytest.raises(PluginError) as info:
        registry.require_all_loaded("because")
    message = str(info.value)
    assert "brokenone 1.0: RuntimeError('one')" in message
    assert "brokentwo 1.0: ValueError('two')" in message
    assert message.endswith("(because)")
    PluginRegistry().require_all_loaded()  # nothing failed: nothing to say


def test_an_unknown_name_mentions_plugins_that_failed_to_load(make_dist: MakeDist) -> None:
    make_dist("brokenplugin", "raise RuntimeError('boom')\n", name="mydb")
    with pytest.warns(PluginLoadWarning):
        registry = PluginRegistry.load()
    with pytest.raises(
        UnknownPluginError, match=r"Installed but failed to load: plugin 'mydb' .*brokenplugin"
    ):
        registry.backend_spec("mydb")
