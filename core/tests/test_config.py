"""Tests of typed options, the core keys and Configuration."""

from __future__ import annotations

import pickle
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from statekit import KeyedProcessFunction, LocalRunner, ProcessContext
from statekit._errors import ConfigurationError, UnknownPluginError
from statekit.plugins._config import CORE_OPTIONS, ConfigOption, Configuration, parse_plugin_options
from statekit.plugins._registry import BackendSpec, PluginRegistry, StorageSpec, default_registry, hookimpl

SIZE = ConfigOption("x-size", int, byte_size=True)
COUNT = ConfigOption("x-count", int)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("5", 5), (" 7 ", 7), (12, 12), ("0", 0), ("1kb", 1024), ("1k", 1024), ("64mb", 64 << 20),
     ("5 MiB", 5 << 20), ("2GiB", 2 << 30), ("2g", 2 << 30), ("10b", 10)],
)  # fmt: skip
def test_byte_size_accepts_plain_integers_and_binary_sizes(raw: object, expected: int) -> None:
    assert SIZE.parse(raw, "k") == expected


@pytest.mark.parametrize("raw", ["", "abc", "1.5", "1.5mb", "5 pb", "mb", "-3", "-1k", True, 2.0])
def test_byte_size_rejects_others_naming_key_value_and_type(raw: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        SIZE.parse(raw, "statekit.backend.x.x-size")
    message = str(info.value)
    assert "statekit.backend.x.x-size" in message
    assert repr(raw) in message
    assert "size" in message


def test_a_negative_byte_size_is_out_of_range() -> None:
    with pytest.raises(ConfigurationError, match=r"^k must be at least 0, not -3$"):
        SIZE.parse(-3, "k")


@pytest.mark.parametrize(("raw", "expected"), [("5", 5), (" 7 ", 7), ("-3", -3), ("+4", 4), (12, 12)])
def test_count_accepts_plain_integers(raw: object, expected: int) -> None:
    assert COUNT.parse(raw, "k") == expected


@pytest.mark.parametrize("raw", ["1k", "1kb", "64mb", "10b", "5 MiB", "1_000", "1e3", "", "١", True, 2.0])
def test_count_refuses_size_suffixes_and_other_text(raw: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        COUNT.parse(raw, "statekit.x-count")
    assert str(info.value) == (
        f"invalid value {raw!r} for statekit.x-count: expected an integer (no size suffix: this is a count)"
    )


def test_count_accepts_integral_numbers_of_other_types() -> None:
    class Integral(int):
        pass

    assert COUNT.parse(Integral(3), "k") == 3
    numpy = pytest.importorskip("numpy")
    parsed = COUNT.parse(numpy.int64(4), "k")
    assert parsed == 4 and type(parsed) is int


def test_minimum_bounds_ints_and_floats() -> None:
    positive = ConfigOption("n", int, 1, minimum=1)
    assert positive.parse("1", "k") == 1
    for raw in ("0", 0, "-1", -1):
        with pytest.raises(ConfigurationError, match=rf"^k must be at least 1, not {raw!r}$"):
            positive.parse(raw, "k")
    ratio = ConfigOption("r", float, minimum=0.5)
    assert ratio.parse("0.5", "k") == 0.5
    with pytest.raises(ConfigurationError, match="k must be at least 0.5, not '0.25'"):
        ratio.parse("0.25", "k")


def test_maximum_bounds_from_above() -> None:
    share = ConfigOption("r", float, None, minimum=0.0, maximum=1.0)
    assert [share.parse(raw, "k") for raw in ("0", "1", 0.5)] == [0.0, 1.0, 0.5]
    with pytest.raises(ConfigurationError, match=r"^k must be at most 1.0, not '1.5'$"):
        share.parse("1.5", "k")
    with pytest.raises(ConfigurationError, match=r"^k must be at least 0.0, not -0.1$"):
        share.parse(-0.1, "k")
    assert share.type_name == "float >= 0.0 <= 1.0"
    capped = ConfigOption("n", int, 0, maximum=10, off=0)
    assert capped.parse("off", "k") == 0
    with pytest.raises(ConfigurationError, match=r"^k must be at most 10 or off, not 11$"):
        capped.parse(11, "k")


@pytest.mark.parametrize("raw", ["nan", "NaN", float("nan"), "inf", float("-inf")])
def test_float_refuses_what_no_range_check_can_judge(raw: object) -> None:
    with pytest.raises(ConfigurationError, match="expected a number"):
        ConfigOption("r", float, minimum=0.0).parse(raw, "k")


def test_off_is_a_word_and_a_value_exempt_from_the_minimum() -> None:
    interval = ConfigOption("i", int, 0, minimum=1, off=0)
    assert [interval.parse(raw, "k") for raw in ("off", " OFF ", "0", 0, "1", 7)] == [0, 0, 0, 0, 1, 7]
    with pytest.raises(ConfigurationError, match=r"^k must be at least 1 or off, not -5$"):
        interval.parse(-5, "k")
    with pytest.raises(ConfigurationError, match="expected an integer .* or off"):
        interval.parse("never", "k")
    with pytest.raises(ConfigurationError, match="expected an integer"):
        COUNT.parse("off", "k")  # only where declared


@pytest.mark.parametrize(
    ("option", "type_name"),
    [(COUNT, "int"), (SIZE, "size"), (ConfigOption("n", int, minimum=1), "int >= 1"),
     (ConfigOption("i", int, 0, minimum=1, off=0), "int >= 1 | off"),
     (ConfigOption("s", int, byte_size=True, minimum=1), "size >= 1"), (ConfigOption("b", bool), "bool")],
)  # fmt: skip
def test_type_name_says_kind_and_range(option: ConfigOption, type_name: str) -> None:
    assert option.type_name == type_name


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({"type": str, "minimum": 1}, "option x: minimum cannot apply to an option of type str"),
     ({"type": float, "byte_size": True}, "byte_size cannot apply to an option of type float"),
     ({"type": bool, "off": 0}, "off cannot apply to an option of type bool"),
     ({"type": int, "choices": ("a",)}, "choices cannot apply to an option of type int"),
     ({"type": int, "byte_size": True, "minimum": -1}, "a negative minimum cannot apply"),
     ({"type": str, "maximum": 1}, "maximum cannot apply to an option of type str"),
     ({"type": int, "minimum": 2, "maximum": 1}, "option x: minimum 2 > maximum 1"),
     ({"type": int, "default": 0, "minimum": 1}, "x must be at least 1, not 0"),
     ({"type": int, "default": "1k"}, "invalid value '1k' for x")],
)  # fmt: skip
def test_inconsistent_declarations_are_refused(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(fragment)):
        ConfigOption("x", **kwargs)


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
    assert conf.get(ConfigOption("statekit.backend.x.cache-size", int, 0, byte_size=True)) == 1024
    with pytest.raises(ConfigurationError, match="plugin_options"):
        conf.get(ConfigOption("cache-size", int, 0))


def test_ill_typed_core_value() -> None:
    with pytest.raises(ConfigurationError, match=r"'many' for statekit.checkpoints.retained"):
        Configuration({"statekit.checkpoints.retained": "many"}).get("statekit.checkpoints.retained")


def test_parse_plugin_options_fills_defaults_and_lists_valid_names() -> None:
    options = (
        ConfigOption("cache-size", int, 1024, "c", byte_size=True),
        ConfigOption("sync", bool, False, "s"),
    )
    assert parse_plugin_options(options, {"cache-size": "1kb"}, "backend 'x'") == {
        "cache-size": 1024,
        "sync": False,
    }
    with pytest.raises(ConfigurationError) as info:
        parse_plugin_options(options, {"cache_size": 1}, "backend 'x'", key_prefix="statekit.backend.x.")
    assert str(info.value) == (
        "unknown option statekit.backend.x.cache_size; Did you mean statekit.backend.x.cache-size? "
        "valid options of backend 'x': cache-size (size, default 1024), sync (bool, default False)"
    )
    with pytest.raises(ConfigurationError) as info:
        parse_plugin_options(options, {"zzz": 1}, "backend 'x'", key_prefix="statekit.backend.x.")
    assert "Did you mean" not in str(info.value)


class _FakePlugin:
    @hookimpl
    def statekit_register_backends(self, register: Any) -> None:
        register(BackendSpec("heap", dict, (ConfigOption("cache-size", int, 1, "c", byte_size=True),)))
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
        ({"statekit.backend": "rocksdb"}, UnknownPluginError,
         'pip install --find-links wheelhouse -c wheelhouse/constraints.txt "statekit[rocksdb]"'),
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


# --- One validation on every runner: what the LocalRunner refuses --------------------------------


class _Echo(KeyedProcessFunction):
    def process(self, record: Any, ctx: ProcessContext) -> Iterable[Any]:
        yield record


def _runner(config: dict[str, object], **kwargs: Any) -> LocalRunner:
    return LocalRunner(_Echo, key_selector=lambda r: r, config=config, **kwargs)


@pytest.mark.parametrize("typo", ["statekit.checkpoint.dir", "statekit.checkpoints.dirr"])
@pytest.mark.parametrize("objects", [False, True])
def test_a_local_runner_refuses_a_misspelled_checkpoints_dir(
    tmp_path: Path, typo: str, objects: bool
) -> None:
    kwargs: dict[str, Any] = {}
    if objects:  # backend and storage given as objects: the keys are checked all the same
        registry = default_registry()
        kwargs = {
            "backend": registry.create_backend("heap"),
            "storage": registry.create_storage("jobmanager"),
        }
    with pytest.raises(ConfigurationError) as info:
        _runner({typo: str(tmp_path)}, **kwargs)
    assert str(info.value).startswith(f"unknown option {typo}; Did you mean statekit.checkpoints.dir?")


@pytest.mark.parametrize(
    ("key", "raw", "message"),
    [("statekit.parallelism", 0, "statekit.parallelism must be at least 1, not 0"),
     ("statekit.parallelism", "0", "statekit.parallelism must be at least 1, not '0'"),
     ("statekit.parallelism", "1k", "invalid value '1k' for statekit.parallelism: expected an integer"),
     ("statekit.parallelism", "2.0", "invalid value '2.0' for statekit.parallelism"),
     ("statekit.parallelism", True, "invalid value True for statekit.parallelism"),
     ("statekit.checkpoints.retained", 0, "statekit.checkpoints.retained must be at least 1, not 0"),
     ("statekit.checkpoints.retained", -1, "statekit.checkpoints.retained must be at least 1, not -1"),
     ("statekit.checkpoints.retained", "1k", "invalid value '1k' for statekit.checkpoints.retained"),
     ("statekit.checkpoint.interval-records", -5,
      "statekit.checkpoint.interval-records must be at least 1 or off, not -5"),
     ("statekit.checkpoint.interval-records", "1k",
      "invalid value '1k' for statekit.checkpoint.interval-records"),
     ("statekit.checkpoint.interval-records", "never",
      "invalid value 'never' for statekit.checkpoint.interval-records: expected an integer (no size suffix: "
      "this is a count) or off"),
     ("statekit.max-parallelism", 0, "statekit.max-parallelism must be at least 1, not 0"),
     ("statekit.max-parallelism", "128k", "invalid value '128k' for statekit.max-parallelism"),
     ("statekit.plugins.strict", "maybe",
      "invalid value 'maybe' for statekit.plugins.strict: expected a boolean"),
     ("statekit.plugins.strict", 1, "invalid value 1 for statekit.plugins.strict: expected a boolean"),
     ("statekit.batch-size", 0, "statekit.batch-size must be at least 1, not 0"),
     ("statekit.key-cache-size", 0, "statekit.key-cache-size must be at least 1, not 0"),
     ("statekit.key-cache-size", "128k", "invalid value '128k' for statekit.key-cache-size"),
     ("statekit.checkpoint.tolerable-failures", -1,
      "statekit.checkpoint.tolerable-failures must be at least 0, not -1"),
     ("statekit.checkpoint.format", "Native", "invalid value 'Native' for statekit.checkpoint.format"),
     ("statekit.backend.rocksdb.write-buffer-count", "1k",
      "invalid value '1k' for statekit.backend.rocksdb.write-buffer-count"),
     ("statekit.backend.rocksdb.write-batch-size", 0,
      "statekit.backend.rocksdb.write-batch-size must be at least 1, not 0"),
     ("statekit.checkpoint.storage.filesystem.inline-threshold", -1,
      "statekit.checkpoint.storage.filesystem.inline-threshold must be at least 0, not -1"),
     ("statekit.checkpoint.storage.jobmanager.max-state-size", "0",
      "statekit.checkpoint.storage.jobmanager.max-state-size must be at least 1, not '0'")],
)  # fmt: skip
def test_a_local_runner_coerces_nothing(key: str, raw: object, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        _runner({key: raw})
    assert str(info.value).startswith(message)


def test_a_parallelism_argument_of_zero_is_refused_not_read_as_one() -> None:
    with pytest.raises(ConfigurationError, match="parallelism 0 is out of range"):
        _runner({}, parallelism=0)


def test_a_local_runner_reads_valid_counts_and_off() -> None:
    config = {
        "statekit.parallelism": "3",
        "statekit.checkpoints.retained": "2",
        "statekit.max-parallelism": 64,
    }
    with _runner({**config, "statekit.checkpoint.interval-records": " Off "}) as runner:
        assert (runner.parallelism, runner.retained, runner.max_parallelism) == (3, 2, 64)
        assert runner.checkpoint_interval == 0
    for interval, expected in ((0, 0), ("0", 0), ("off", 0), (1, 1), ("250", 250)):
        with _runner({"statekit.checkpoint.interval-records": interval}) as runner:
            assert runner.checkpoint_interval == expected


def test_sizes_keep_their_suffixes_on_a_local_runner() -> None:
    config = {"statekit.checkpoint.storage.jobmanager.max-state-size": "4kb"}
    with _runner(config) as runner:
        assert runner.storage.max_state_size == 4096  # type: ignore[attr-defined]


def _documented_keys() -> set[str]:
    """Every key docs/configuration.md lists: the core table and each plugin's table of options."""
    page = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
    if not page.exists():
        pytest.skip("docs are not part of this checkout")
    keys: set[str] = set()
    prefixes: list[str] = []
    by_storage = False
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            heading = (
                re.search(r"\(`(statekit\.[a-z.<>-]+)\.\*`\)", line) if line.startswith("### ") else None
            )
            by_storage = heading is not None and "<name>" in heading[1]
            prefixes = [] if heading is None else [heading[1] + "."]
            continue
        row = re.match(r"\| `([a-z][a-z0-9.-]*)` \|(?: ([a-z, ]+) \|)?", line)
        if row is None:
            continue
        if row[1].startswith("statekit."):
            keys.add(row[1])
        elif by_storage:
            names = ("filesystem", "jobmanager") if row[2].strip() == "both" else (row[2].strip(),)
            keys.update(prefixes[0].replace("<name>", name) + row[1] for name in names)
        else:
            keys.update(prefix + row[1] for prefix in prefixes)
    return keys


def _typos(key: str) -> set[str]:
    """A dropped, a doubled, and two swapped characters, at every position; and a wrong case."""
    typos = {key[:i] + key[i + 1 :] for i in range(len(key))}
    typos |= {key[:i] + key[i] + key[i:] for i in range(len(key))}
    typos |= {key[:i] + key[i + 1] + key[i] + key[i + 2 :] for i in range(len(key) - 1)}
    typos |= {key.title(), key.upper()}
    return typos


def test_docs_list_the_plugins_keys_too() -> None:
    keys = _documented_keys()
    assert {"statekit.backend", "statekit.checkpoints.dir", "statekit.plugins.strict"} <= keys
    assert {"statekit.backend.rocksdb.block-cache-size", "statekit.backend.lmdb.max-map-size"} <= keys
    assert "statekit.checkpoint.storage.filesystem.inline-threshold" in keys
    assert "statekit.checkpoint.storage.jobmanager.max-state-size" in keys
    assert "statekit.checkpoint.storage.jobmanager.inline-threshold" not in keys
    # What the docs list is what exists: every documented key alone passes validation.
    for key in keys:
        Configuration({key: None}).validate(default_registry())


def test_a_local_runner_refuses_a_typo_of_every_documented_key() -> None:
    keys = _documented_keys()
    accepted: list[str] = []
    for key in sorted(keys):
        for typo in sorted(_typos(key) - keys):
            try:
                _runner({typo: "1"})
            except ConfigurationError as exc:  # UnknownPluginError too
                assert "unknown option" in str(exc) or "is not installed" in str(exc), str(exc)
            else:
                accepted.append(typo)
    assert accepted == []


def test_a_near_miss_of_the_namespace_is_refused_and_other_keys_ignored() -> None:
    for typo, meant in [
        ("StateKit.backend", "statekit.backend"),
        ("statekti.parallelism", "statekit.parallelism"),
        ("statekitbackend", "statekit.backend"),
        ("sprak.statekit.parallelism", "statekit.parallelism"),
        ("spark.tatekit.backend.rocksdb.wal", "statekit.backend.rocksdb.wal"),
    ]:
        with pytest.raises(ConfigurationError, match=re.escape(f"Did you mean {meant}?")):
            _runner({typo: "1"})
    ignored = {"spark.sql.shuffle.partitions": "8", "state.x": 1, "stage": 2, "spark.statestore.x": 3}
    assert len(Configuration(ignored)) == 0
    with _runner(ignored):
        pass
