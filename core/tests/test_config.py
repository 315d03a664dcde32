"""Tests of typed options, the core keys and Configuration."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from statekit._config import CORE_OPTIONS, ConfigOption, Configuration, parse_plugin_options
from statekit._errors import ConfigurationError, UnknownPluginError
from statekit._registry import BackendSpec, PluginRegistry, StorageSpec, hookimpl


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("5", 5), (" 7 ", 7), (12, 12), ("-3", -3), ("1kb", 1024), ("1k", 1024), ("64mb", 64 << 20),
     ("5 MiB", 5 << 20), ("2GiB", 2 << 30), ("2g", 2 << 30), ("10b", 10)],
)  # fmt: skip
def test_int_accepts_plain_integers_and_binary_sizes(raw: object, expected: int) -> None:
    assert ConfigOption("x-size", int).parse(raw, "k") == expected


@pytest.mark.parametrize("raw", ["", "abc", "1.5", "1.5mb", "5 pb", "mb", True, 2.0])
def test_int_rejects_others_naming_key_value_and_type(raw: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        ConfigOption("x-size", int).parse(raw, "statekit.backend.x.x-size")
    message = str(info.value)
    assert "statekit.backend.x.x-size" in message
    assert repr(raw) in message
    assert "integer" in message


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("true", True), ("FALSE", False), ("1", True), ("0", False), ("yes", True), ("off", False),
     (True, True), (False, False)],
)  # fmt: skip
def test_bool_parsing(raw: object, expected: bool) -> None:
    assert ConfigOption("b", bool).parse(raw, "k") is expected


@pytest.mark.parametrize("raw", ["maybe", "", 1, 0])
def test_bool_rejects_others(raw: object) -> None:
    with pytest.raises(ConfigurationError, match="expected a boolean"):
        ConfigOption("b", bool).parse(raw, "k")


def test_float_str_and_choices() -> None:
    assert ConfigOption("f", float).parse("2.5", "k") == 2.5
    assert ConfigOption("f", float).parse(3, "k") == 3.0
    with pytest.raises(ConfigurationError, match="expected a number"):
        ConfigOption("f", float).parse("fast", "k")
    assert ConfigOption("s", str).parse(Path("/tmp/x"), "k") == "/tmp/x"
    with pytest.raises(ConfigurationError, match="expected a string"):
        ConfigOption("s", str).parse(5, "k")
    compression = ConfigOption("c", str, "lz4", choices=("none", "lz4"))
    assert compression.parse("none", "k") == "none"
    assert compression.type_name == "none | lz4"
    with pytest.raises(ConfigurationError, match="expected one of none, lz4"):
        compression.parse("zstd", "k")


def test_none_yields_the_default() -> None:
    assert ConfigOption("x", int, 42).parse(None, "k") == 42


def test_core_defaults() -> None:
    conf = Configuration()
    assert conf.backend_name == "heap"
    assert conf.storage_name == "jobmanager"
    assert conf.get("statekit.checkpoints.retained") == 1
    assert conf.get("statekit.checkpoint.interval-records") == 0
    assert conf.get("statekit.key-cache-size") == 131072
    assert conf.get("statekit.plugins.strict") is False
    assert conf.get("statekit.max-parallelism") is None
    assert all(option.doc and option.name.startswith("statekit.") for option in CORE_OPTIONS)


def test_storage_default_rule() -> None:
    assert Configuration({"statekit.checkpoints.dir": "s3://b/c"}).storage_name == "filesystem"
    explicit = {"statekit.checkpoints.dir": "/tmp/c", "statekit.checkpoint.storage": "jobmanager"}
    assert Configuration(explicit).storage_name == "jobmanager"


def test_spark_prefix_is_stripped_and_other_keys_ignored() -> None:
    conf = Configuration.from_mapping(
        {
            "spark.statekit.backend": "rocksdb",
            "spark.statekit.checkpoints.retained": "3",
            "spark.sql.shuffle.partitions": "8",
            "statekit.backend.rocksdb.block-cache-size": "64mb",
            "spark.app.name": "x",
        }
    )
    assert set(conf) == {
        "statekit.backend",
        "statekit.checkpoints.retained",
        "statekit.backend.rocksdb.block-cache-size",
    }
    assert conf.backend_name == "rocksdb"
    assert conf.get("statekit.checkpoints.retained") == 3
    assert conf["statekit.checkpoints.retained"] == "3"
    assert conf.plugin_options("backend", "rocksdb") == {"block-cache-size": "64mb"}
    assert conf.plugin_options("storage", "filesystem") == {}


def test_configuration_pickles_for_spark_executors() -> None:
    conf = Configuration({"spark.statekit.backend": "lmdb", "statekit.backend.lmdb.map-size": "1gb"})
    copy = pickle.loads(pickle.dumps(conf))
    assert (
        copy.as_dict()
        == conf.as_dict()
        == {"statekit.backend": "lmdb", "statekit.backend.lmdb.map-size": "1gb"}
    )


def test_same_key_with_and_without_prefix_must_agree() -> None:
    assert len(Configuration({"spark.statekit.backend": "heap", "statekit.backend": "heap"})) == 1
    with pytest.raises(ConfigurationError, match="set twice"):
        Configuration({"spark.statekit.backend": "heap", "statekit.backend": "lmdb"})


def test_with_options_overrides_and_leaves_the_original() -> None:
    base = Configuration({"statekit.backend": "heap"})
    assert base.with_options({"spark.statekit.backend": "lmdb"}).backend_name == "lmdb"
    assert base.backend_name == "heap"


def test_get_of_unknown_core_key_suggests_and_lists_valid_ones() -> None:
    with pytest.raises(ConfigurationError) as info:
        Configuration().get("statekit.checkpoints.dirr")
    message = str(info.value)
    assert "Did you mean statekit.checkpoints.dir?" in message
    assert "statekit.savepoints.dir" in message


def test_get_refuses_short_plugin_option_names() -> None:
    conf = Configuration({"statekit.backend.x.cache-size": "1k"})
    assert conf.get(ConfigOption("statekit.backend.x.cache-size", int, 0)) == 1024
    with pytest.raises(ConfigurationError, match="plugin_options"):
        conf.get(ConfigOption("cache-size", int, 0))


def test_ill_typed_core_value() -> None:
    with pytest.raises(ConfigurationError, match=r"'many' for statekit.checkpoints.retained"):
        Configuration({"statekit.checkpoints.retained": "many"}).get("statekit.checkpoints.retained")


def test_parse_plugin_options_fills_defaults_and_lists_valid_names() -> None:
    options = (ConfigOption("cache-size", int, 1024, "c"), ConfigOption("sync", bool, False, "s"))
    assert parse_plugin_options(options, {"cache-size": "1kb"}, "backend 'x'") == {
        "cache-size": 1024,
        "sync": False,
    }
    with pytest.raises(ConfigurationError) as info:
        parse_plugin_options(options, {"cache_size": 1}, "backend 'x'", key_prefix="statekit.backend.x.")
    assert str(info.value) == (
        "unknown option statekit.backend.x.cache_size; valid options of backend 'x': "
        "cache-size (int, default 1024), sync (bool, default False)"
    )


class _FakePlugin:
    @hookimpl
    def statekit_register_backends(self, register: Any) -> None:
        register(BackendSpec("heap", dict, (ConfigOption("cache-size", int, 1, "c"),)))
        register(BackendSpec("other", dict))

    @hookimpl
    def statekit_register_storages(self, register: Any) -> None:
        register(StorageSpec("jobmanager", dict))


@pytest.fixture
def registry() -> PluginRegistry:
    registry = PluginRegistry()
    registry.register_plugin(_FakePlugin())
    return registry


def test_validate_accepts_known_keys(registry: PluginRegistry) -> None:
    values = {
        "spark.statekit.backend": "heap",
        "statekit.backend.heap.cache-size": "2kb",
        "statekit.parallelism": "4",
    }
    Configuration(values).validate(registry)


@pytest.mark.parametrize(
    ("values", "error", "fragment"),
    [
        ({"statekit.backend.heap.foo": 1}, ConfigurationError,
         "unknown option statekit.backend.heap.foo; valid options of backend 'heap': cache-size"),
        ({"statekit.backend.heap.cache-size": "lots"}, ConfigurationError, "'lots' for statekit.backend"),
        ({"statekit.backend.heap": 1}, ConfigurationError, "unknown option statekit.backend.heap;"),
        ({"statekit.bakend": "heap"}, ConfigurationError, "Did you mean statekit.backend?"),
        ({"statekit.parallelism": "four"}, ConfigurationError, "statekit.parallelism"),
        ({"statekit.backend": "rocksdb"}, UnknownPluginError, 'pip install "statekit[rocksdb]"'),
        ({"statekit.backend.lmdb.map-size": "1gb"}, UnknownPluginError, "backend 'lmdb' is not installed"),
        ({"statekit.checkpoints.dir": "/tmp/c"}, UnknownPluginError, "storage 'filesystem' is not installed"),
    ],
)  # fmt: skip
def test_validate_rejects(
    registry: PluginRegistry, values: dict[str, object], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error) as info:
        Configuration(values).validate(registry)
    assert fragment in str(info.value)


def test_every_core_key_is_documented() -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
    if not page.exists():
        pytest.skip("docs are not part of this checkout")
    text = page.read_text()
    missing = [o.name for o in CORE_OPTIONS if f"| `{o.name}` |" not in text]
    assert missing == []
