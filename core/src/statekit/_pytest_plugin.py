"""The pytest plugin of ``statekit-core``: the conformance kit's assertions show their values.

pytest rewrites ``assert`` statements only in test files and in modules it
was told about before they are imported. The kit's semantic tests live in an
installed package (:mod:`statekit.testing`), so without this plugin a failing
kit test would say ``AssertionError`` and nothing else. The ``pytest11``
entry point of ``statekit-core`` names this module; pytest imports it before
any test module (and so before :mod:`statekit.testing`), and it registers the
kit for rewriting.

This module stays outside :mod:`statekit.testing` on purpose: importing a
module of that package would import the package, and with it every kit
module, before they could be registered.
"""

from __future__ import annotations

import pytest

__all__: list[str] = []

# Whatever pytest already marks for a plugin's distribution (all of ``statekit`` in a
# regular install, the entry point's package in an editable one), the kit is marked here
# explicitly, so its failures show values with any pytest version the kit supports.
pytest.register_assert_rewrite("statekit.testing")
