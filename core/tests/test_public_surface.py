"""The public surface: one home per name, and the old places of moved names, for one release."""

from __future__ import annotations

import importlib
import warnings

import pytest

import statekit

# Every public module of core (statekit.spark needs pyspark, statekit.state_processor pyarrow:
# both are installed for the tests).
PUBLIC_MODULES = [
    "statekit",
    "statekit.backend_api",
    "statekit.ordered_kv",
    "statekit.snapshot_codec",
    "statekit.checkpointing",
    "statekit.errors",
    "statekit.serializers",
    "statekit.sources",
    "statekit.spark",
    "statekit.state_processor",
    "statekit.testing",
    "statekit.timers",
    "statekit.windows",
]

# What the job author's module held before each name had one home, and where each went.
MOVED_FROM_STATEKIT = {
    "StateError": "statekit.errors",
    "CheckpointError": "statekit.errors",
    "UnsafeLocalPathError": "statekit.errors",
    "CheckpointStorage": "statekit.backend_api",
    "SupportsNativeSnapshot": "statekit.backend_api",
    "BackendSpec": "statekit.backend_api",
    "hookimpl": "statekit.backend_api",
    "PluginRegistry": "statekit.backend_api",
    "ConfigOption": "statekit.backend_api",
    "KeyGroupRange": "statekit.backend_api",
    "key_group_for_bytes": "statekit.backend_api",
    "CheckpointMetadata": "statekit.checkpointing",
    "load_checkpoint": "statekit.checkpointing",
    "TypeSerializer": "statekit.serializers",
    "serializer_for": "statekit.serializers",
}
MOVED_TO_STATEKIT = [
    ("statekit.sources", "LogSource"),
    ("statekit.sources", "BadRecordPolicy"),
    ("statekit.sources", "InputLostWarning"),
    ("statekit.timers", "EventTime"),
    ("statekit.timers", "TimeDomain"),
    ("statekit.timers", "TimerService"),
]


def test_no_name_is_exported_by_two_public_modules() -> None:
    homes: dict[str, list[str]] = {}
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        for exported in module.__all__:
            assert hasattr(module, exported), f"{name}.__all__ names {exported}, which it does not have"
            homes.setdefault(exported, []).append(name)
    twice = {n: ms for n, ms in homes.items() if len(ms) > 1 and n != "__version__"}
    assert twice == {}


def test_the_job_authors_module_exports_a_surface_one_can_hold_in_ones_head() -> None:
    assert len(statekit.__all__) <= 50
    assert statekit.__all__ == sorted(statekit.__all__, key=lambda n: (not n.isupper(), n[:1].islower(), n))


@pytest.mark.parametrize(("name", "home"), sorted(MOVED_FROM_STATEKIT.items()))
def test_a_name_moved_out_of_statekit_imports_for_a_release_with_a_warning(name: str, home: str) -> None:
    message = rf"^statekit\.{name} moved to {home}: .*from {home} import {name}"
    with pytest.warns(DeprecationWarning, match=message):
        old = getattr(statekit, name)
    assert old is getattr(importlib.import_module(home), name)
    assert name not in statekit.__all__


def test_the_from_import_form_warns_too_and_names_the_place_of_the_import() -> None:
    message = r"statekit\.CheckpointStorage moved to statekit\.backend_api"
    with pytest.warns(DeprecationWarning, match=message) as w:
        from statekit import CheckpointStorage  # noqa: F401
    assert w[0].filename == __file__


@pytest.mark.parametrize(("package", "name"), MOVED_TO_STATEKIT)
def test_a_job_authors_name_moved_into_statekit_imports_from_its_package(package: str, name: str) -> None:
    module = importlib.import_module(package)
    with pytest.warns(DeprecationWarning, match=rf"^{package}\.{name} moved to statekit: "):
        old = getattr(module, name)
    assert old is getattr(statekit, name)
    assert name not in module.__all__


@pytest.mark.parametrize("module", ["statekit", "statekit.sources", "statekit.timers"])
def test_an_unknown_name_is_still_an_attribute_error_without_a_warning(module: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match="no_such_name"):
            getattr(importlib.import_module(module), "no_such_name")


def test_the_suite_turns_statekits_own_deprecation_into_an_error() -> None:
    # pyproject's filterwarnings: a name imported from its old place anywhere in the repository fails.
    with pytest.raises(DeprecationWarning, match=r"^statekit\.StateError moved to statekit\.errors"):
        _ = statekit.StateError


def _next_minor(version: str) -> str:
    major, minor = (int(x) for x in version.split(".")[:2])
    return f"{major}.{minor + 1}.0"


def test_every_deprecation_names_the_release_that_removes_it() -> None:
    """The removal version is the next minor of core's version, and every moved name's warning says it."""
    from statekit._errors import REMOVED_IN

    assert REMOVED_IN == _next_minor(statekit.__version__)
    olds = [("statekit", n) for n in MOVED_FROM_STATEKIT] + MOVED_TO_STATEKIT
    for module, name in olds:
        with pytest.warns(DeprecationWarning) as w:
            getattr(importlib.import_module(module), name)
        assert f"removed in statekit {REMOVED_IN}" in str(w[0].message), (module, name)


def test_the_backend_authors_door_is_narrow_and_the_rooms_hold_the_rest() -> None:
    import statekit.backend_api as api

    # contracts, specs and hooks, key groups, the keyed bases (DeltaKeyedBackendBase too), handle helpers,
    # redact_urls for storages
    assert len(api.__all__) <= 33
    door = {"KeyedBackendBase", "DeclaredStateBackend", "StateBackend", "BackendSpec", "KeyGroupRange"}
    assert door <= set(api.__all__)
    kv = importlib.import_module("statekit.ordered_kv")
    codec = importlib.import_module("statekit.snapshot_codec")
    assert {"OrderedKVBackendBase", "PrefixedKVBackendBase", "KeyGroupNativeSnapshots"} <= set(kv.__all__)
    assert {"write_canonical", "iter_blocks", "NativeStateHandle"} <= set(codec.__all__)


def test_a_name_moved_out_of_backend_api_imports_until_0_2_with_a_warning_naming_its_home() -> None:
    import statekit.backend_api as api

    assert api._MOVED  # what a backend of 0.1 imported from here
    for name, home in sorted(api._MOVED.items()):
        assert name not in api.__all__
        message = rf"^statekit\.backend_api\.{name} moved to {home}: .*removed in statekit 0\.2\.0"
        with pytest.warns(DeprecationWarning, match=message):
            old = getattr(api, name)
        assert old is getattr(importlib.import_module(home), name)
    for name in sorted(api._INTERNAL):
        with pytest.warns(DeprecationWarning, match=rf"backend_api\.{name} .*removed in statekit 0\.2\.0"):
            getattr(api, name)
