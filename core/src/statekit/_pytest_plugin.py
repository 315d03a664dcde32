"""The pytest plugin of ``statekit-core``: the kit's failures name their invariant and show values.

pytest rewrites ``assert`` statements only in test files and in modules it
was told about before they are imported. The kit's semantic tests live in an
installed package (:mod:`statekit.testing`), so without this plugin a failing
kit test would say ``AssertionError`` and nothing else. The ``pytest11``
entry point of ``statekit-core`` names this module; pytest imports it before
any test module (and so before :mod:`statekit.testing`), and it registers the
kit for rewriting.

A rewritten assert shows values (``assert 3 == 5``) but not what they were
meant to keep; a kit test that fails on a plain assert therefore gets its
invariant put in front of the message: the test's docstring, or its name in
words, and the write buffer it ran with (the kit runs every test with a
buffering backend's buffer at its default and at 1). Property violations name
their property already and are left as they are.

It also registers the Hypothesis profiles the kit's docs name, ``ci`` (15
examples per property) and ``nightly`` (2000), so that
``--hypothesis-profile=nightly`` works in a plugin's own repository; a
``conftest.py`` registering a profile of the same name later wins.

This module stays outside :mod:`statekit.testing` on purpose: importing a
module of that package would import the package, and with it every kit
module, before they could be registered.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

__all__: list[str] = []

# Whatever pytest already marks for a plugin's distribution (all of ``statekit`` in a
# regular install, the entry point's package in an editable one), the kit is marked here
# explicitly, so its failures show values with any pytest version the kit supports.
pytest.register_assert_rewrite("statekit.testing")

#: Examples per property of each profile the kit's docs name (docs/writing-a-backend.md).
KIT_PROFILES = {"ci": 15, "nightly": 2000}

try:  # Hypothesis comes with the ``testing`` extra; without it there is no kit to run
    from hypothesis import HealthCheck, settings
except ImportError:  # pragma: no cover - the kit's own tests always have it
    pass
else:
    for _name, _examples in KIT_PROFILES.items():
        settings.register_profile(
            _name, max_examples=_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow]
        )

_KIT_PACKAGE = "statekit.testing."


def kit_invariant(item: pytest.Item) -> str | None:
    """What kit test ``item`` holds a backend to, in words; None for a test that is not the kit's."""
    fn: Any = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
    if not str(getattr(fn, "__module__", "")).startswith(_KIT_PACKAGE):
        return None
    name = str(getattr(item, "originalname", item.name))
    doc = (fn.__doc__ or "").strip().split("\n\n")[0]
    text = " ".join(doc.split()) or name.removeprefix("test_").replace("_", " ")
    callspec = getattr(item, "callspec", None)
    buffer = callspec.params.get("kit_write_buffer") if callspec is not None else None
    variant = "" if buffer is None else f", write buffer at {buffer}"
    return f"statekit kit invariant ({name}{variant}): {text}"


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    """Put the invariant of a failing kit test in front of its assertion message."""
    try:
        return (yield)
    except AssertionError as e:
        invariant = kit_invariant(pyfuncitem)
        if invariant is not None and type(e).__name__ != "PropertyViolation":
            message = str(e.args[0]) if e.args else ""
            e.args = (f"{invariant}\n{message}" if message else invariant, *e.args[1:])
        raise


def pytest_configure(config: pytest.Config) -> None:
    """Registers the ``nightly`` marker the kit puts on its depth beyond ``ci`` (run under that profile)."""
    config.addinivalue_line(
        "markers", "nightly: depth that runs under the nightly Hypothesis profile only (skipped under ci)"
    )
