"""Shipping the user's function to the executors.

PySpark pickles classes and functions by reference to their module, so
executors must be able to import that module. Installed packages are; a
function defined in a module of a project checkout, a test suite or a folder
next to the script usually is not. Such modules are pickled *by value*
(cloudpickle's ``register_pickle_by_value``), like functions of ``__main__``,
so the job needs no ``--py-files`` for them.
"""

from __future__ import annotations

import functools
import inspect
import os
import site
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["ship_by_value"]

_OURS = ("statekit", "pyspark", "py4j")


def _installed_roots() -> list[str]:
    """Directories executors import from without help: the stdlib, site dirs, their .pth paths, PYTHONPATH."""
    roots = {sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    sites = [*site.getsitepackages(), site.getusersitepackages()]
    roots.update(sites)
    for directory in sites:
        for pth in Path(directory).glob("*.pth") if os.path.isdir(directory) else ():
            try:
                lines = pth.read_text().splitlines()
            except OSError:
                continue
            roots.update(
                line.strip() for line in lines if line.strip() and not line.startswith(("#", "import"))
            )
    roots.update(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
    return sorted({os.path.realpath(r) for r in roots if r})


def _modules(obj: Any, seen: set[int]) -> Iterator[ModuleType]:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, functools.partial):
        for part in (obj.func, *obj.args, *obj.keywords.values()):
            yield from _modules(part, seen)
        return
    if inspect.isclass(obj):
        for klass in obj.__mro__:
            module = sys.modules.get(klass.__module__)
            if module is not None:
                yield module
        return
    if callable(obj):
        module = sys.modules.get(getattr(obj, "__module__", "") or "")
        if module is not None:
            yield module
        if not inspect.isfunction(obj) and not inspect.ismethod(obj):
            yield from _modules(type(obj), seen)


def ship_by_value(function: Any) -> list[str]:
    """Register the modules that define ``function`` (its class and base classes) for pickling by value,
    unless executors can import them (stdlib, installed or on ``PYTHONPATH``). Returns their names."""
    from pyspark import cloudpickle

    roots = _installed_roots()
    shipped = []
    for module in _modules(function, set()):
        name = module.__name__
        file = getattr(module, "__file__", None)
        if name == "__main__" or not file or name.split(".")[0] in _OURS:
            continue
        path = os.path.realpath(file)
        if any(path.startswith(root + os.sep) for root in roots):
            continue
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
        shipped.append(name)
    return shipped
