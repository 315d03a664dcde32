"""The plugin registry: backends and checkpoint storages found by name.

Plugins are modules (or objects) with pluggy ``@hookimpl`` functions, named by an
entry point in the group ``"statekit"``. Registration is light: a spec names its
factory as a ``"module:attribute"`` string, imported only when a backend or
storage is created, so listing plugins never imports an engine.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any, ClassVar

import pluggy

from .._errors import PluginConflictError, PluginError, UnknownPluginError, install_hint
from ._config import PLUGIN_KEY_PREFIXES, ConfigOption, PluginKind, parse_plugin_options

__all__ = [
    "KNOWN_EXTRAS", "STRICT_PLUGINS_ENV", "BackendSpec", "PluginLoadFailure", "PluginLoadWarning",
    "PluginRegistry", "RegisteredPlugin", "StatekitHookspecs", "StorageSpec", "default_registry",
    "hookimpl", "hookspec", "reset_default_registry",
]  # fmt: skip

hookspec = pluggy.HookspecMarker("statekit")
hookimpl = pluggy.HookimplMarker("statekit")

#: Set to ``1`` to make a plugin that fails to load an error instead of a warning.
STRICT_PLUGINS_ENV = "STATEKIT_STRICT_PLUGINS"

#: What to ``pip install`` for the plugins we know of, by kind and name.
KNOWN_EXTRAS: Mapping[PluginKind, Mapping[str, str]] = MappingProxyType({
    "backend": {"heap": "statekit-heap", "rocksdb": "statekit[rocksdb]", "lmdb": "statekit[lmdb]"},
    "storage": {"jobmanager": "statekit-storage", "filesystem": "statekit-storage"},
})  # fmt: skip

Factory = Callable[[dict[str, Any]], Any]
_NO_OPTIONS: Mapping[str, object] = MappingProxyType({})
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")


class PluginLoadWarning(UserWarning):
    """An installed plugin could not be loaded and was skipped."""


@dataclass(frozen=True)
class PluginLoadFailure:
    """Records an installed plugin that could not be loaded and was skipped.

    Attributes:
        entry_point: The entry point's name in the group ``"statekit"``.
        value: What the entry point names (``"module"`` or ``"module:object"``).
        distribution: The distribution that declares the entry point.
        version: Its version.
        error: What loading raised.
    """

    entry_point: str
    value: str
    distribution: str
    version: str
    error: Exception

    @property
    def where(self) -> str:
        """The plugin, as messages name it: entry point, what it names, distribution and version."""
        return f"plugin {self.entry_point!r} = {self.value!r} of {self.distribution} {self.version}".rstrip()


@dataclass(frozen=True)
class _PluginSpec:
    kind: ClassVar[PluginKind]
    name: str
    factory: str | Factory
    options: tuple[ConfigOption, ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        # Names end up inside dotted configuration keys, so they may not hold dots.
        if not _NAME.fullmatch(self.name):
            raise PluginError(
                f"invalid {self.kind} name {self.name!r}: use lower-case letters, digits, '-' and '_'"
            )
        if isinstance(self.factory, str) and ":" not in self.factory:
            raise PluginError(
                f"factory of {self.kind} '{self.name}' must be 'module:attribute', not {self.factory!r}"
            )
        object.__setattr__(self, "options", tuple(self.options))
        names = [option.name for option in self.options]
        if len(set(names)) != len(names):
            raise PluginError(f"{self.kind} '{self.name}' declares an option twice: {names}")

    def load_factory(self) -> Factory:
        """Returns the factory, importing it first if it is named by a string.

        Raises:
            ModuleNotFoundError: If the factory's module (or its engine) is missing.
            PluginError: If the module has no such attribute.
        """
        if not isinstance(self.factory, str):
            return self.factory
        module_name, _, attribute = self.factory.partition(":")
        target: Any = importlib.import_module(module_name)
        try:
            for part in attribute.split("."):
                target = getattr(target, part)
        except AttributeError as exc:
            raise PluginError(
                f"factory {self.factory!r} of {self.kind} '{self.name}' does not exist"
            ) from exc
        return target  # type: ignore[no-any-return]


@dataclass(frozen=True)
class BackendSpec(_PluginSpec):
    """Declares a keyed state backend: its name, factory, options and description.

    A complete plugin, ``my_backend/_plugin.py``, named by an entry point::

        # pyproject.toml: [project.entry-points.statekit] mydb = "my_backend._plugin"
        from statekit.backend_api import BackendSpec, ConfigOption, hookimpl

        @hookimpl
        def statekit_register_backends(register):
            register(BackendSpec(
                name="mydb",
                factory="my_backend._backend:MyBackend",  # imported on first use
                options=(ConfigOption("cache-size", int, 1 << 20, "Bytes of cache.", byte_size=True),),
                description="My database as a keyed state backend.",
            ))

    ``MyBackend({"cache-size": 1048576})`` is then called with the validated
    options when ``statekit.backend=mydb``. The factory may also be a callable.
    """

    kind: ClassVar[PluginKind] = "backend"


@dataclass(frozen=True)
class StorageSpec(_PluginSpec):
    """Declares a checkpoint storage; shaped and registered like :class:`BackendSpec`.

    Registered from ``statekit_register_storages(register)``; options live under
    ``statekit.checkpoint.storage.<name>.<option>``.
    """

    kind: ClassVar[PluginKind] = "storage"


@dataclass(frozen=True)
class RegisteredPlugin:
    """Records an installed backend or storage and the distribution that provides it."""

    spec: BackendSpec | StorageSpec
    kind: PluginKind
    distribution: str
    version: str

    @property
    def provider(self) -> str:
        """The distribution and its version, for messages."""
        return f"{self.distribution} {self.version}".strip()


class StatekitHookspecs:
    """The hooks a statekit plugin may implement (all optional)."""

    @hookspec
    def statekit_register_backends(self, register: Callable[[BackendSpec], None]) -> None:
        """Registers keyed state backends by calling ``register(BackendSpec(...))``."""

    @hookspec
    def statekit_register_storages(self, register: Callable[[StorageSpec], None]) -> None:
        """Registers checkpoint storages by calling ``register(StorageSpec(...))``."""

    @hookspec
    def statekit_checkpoint_completed(self, job_id: str, checkpoint_id: int, location: str) -> None:
        """Observes a checkpoint that has been completed (its ``_metadata`` is written)."""

    @hookspec
    def statekit_restore_done(
        self, job_id: str, checkpoint_id: int | None, subtask_index: int, parallelism: int
    ) -> None:
        """Observes a subtask that finished restoring (``checkpoint_id`` None: fresh start)."""


class PluginRegistry:
    """Knows the installed backends and storages, and creates them by name.

    Example::

        registry = PluginRegistry.load()
        backend = registry.create_backend("rocksdb", {"block-cache-size": "64mb"})
        registry.hook.statekit_checkpoint_completed(job_id="j", checkpoint_id=3, location=url)
    """

    def __init__(self) -> None:
        """Creates an empty registry; use :meth:`load` for the installed plugins."""
        self._pm = pluggy.PluginManager("statekit")
        self._pm.add_hookspecs(StatekitHookspecs)
        self._plugins: dict[PluginKind, dict[str, RegisteredPlugin]] = {"backend": {}, "storage": {}}
        self._failures: list[PluginLoadFailure] = []

    @classmethod
    def load(cls, group: str = "statekit", *, strict: bool = False) -> PluginRegistry:
        """Loads every plugin named by an entry point in ``group``.

        A plugin that fails to load is skipped with a :class:`PluginLoadWarning`,
        so one broken package does not stop jobs that do not use it; it is kept in
        :attr:`load_failures`, so that a configuration with
        ``statekit.plugins.strict`` can fail later (:meth:`require_all_loaded`).

        ``strict`` (or ``STATEKIT_STRICT_PLUGINS=1``) raises instead.

        Raises:
            PluginError: In strict mode, if a plugin fails to load.
            PluginConflictError: If two plugins claim one name.
        """
        strict = strict or os.environ.get(STRICT_PLUGINS_ENV) == "1"
        registry = cls()
        # Sorted, so that which of two conflicting plugins is named first does not vary.
        for ep in sorted(
            entry_points(group=group), key=lambda ep: (ep.dist.name if ep.dist else "", ep.name)
        ):
            distribution, version = (ep.dist.name, ep.dist.version) if ep.dist else ("<unknown>", "")
            try:
                registry.register_plugin(
                    ep.load(), distribution, version, plugin_name=f"{distribution}:{ep.name}"
                )
            except PluginConflictError:
                raise
            except Exception as exc:  # any failure of third-party code is the plugin's
                failure = PluginLoadFailure(ep.name, ep.value, distribution, version, exc)
                if strict:
                    raise PluginError(f"cannot load {failure.where}: {exc!r}") from exc
                registry._failures.append(failure)
                warnings.warn(
                    f"skipped {failure.where}: {exc!r} (set {STRICT_PLUGINS_ENV}=1 or "
                    "statekit.plugins.strict=true to fail instead)",
                    PluginLoadWarning,
                    stacklevel=2,
                )
        return registry

    @property
    def load_failures(self) -> tuple[PluginLoadFailure, ...]:
        """The installed plugins :meth:`load` skipped because they failed to load."""
        return tuple(self._failures)

    def require_all_loaded(self, reason: str = "strict plugin loading") -> None:
        """Fails if any installed plugin failed to load: ``statekit.plugins.strict``.

        Args:
            reason: Why every plugin must load, ending the message.

        Raises:
            PluginError: Naming each plugin that failed, its distribution and the
                error; the first error is the cause.
        """
        if not self._failures:
            return
        failed = "; ".join(f"{f.where}: {f.error!r}" for f in self._failures)
        raise PluginError(f"cannot load {failed} ({reason})") from self._failures[0].error

    def register_plugin(
        self, plugin: object, dist_name: str = "<local>", version: str = "", *, plugin_name: str | None = None
    ) -> None:
        """Registers an in-process plugin: a module or object with ``@hookimpl`` functions.

        Either all of its backends and storages are registered, or none.

        Raises:
            PluginError: If the plugin's hooks or specs are invalid.
            PluginConflictError: If it claims a name another plugin has.
        """

        def invalid(exc: Exception) -> PluginError:
            return PluginError(f"invalid plugin {plugin_name or plugin!r} of {dist_name}: {exc}")

        try:
            self._pm.register(plugin, name=plugin_name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            raise invalid(exc) from exc
        try:
            self._pm.check_pending()  # earlier plugins passed, so a failure is this one's
            found = self._collect(plugin, dist_name, version)
            merged = {kind: dict(table) for kind, table in self._plugins.items()}
            for record in found:
                existing = merged[record.kind].get(record.spec.name)
                if existing is not None:
                    raise PluginConflictError(
                        f"{record.kind} '{record.spec.name}' is provided by both {existing.provider} and "
                        f"{record.provider}; uninstall one of them"
                    )
                merged[record.kind][record.spec.name] = record
        except BaseException as exc:
            self._pm.unregister(plugin)
            if isinstance(exc, pluggy.PluginValidationError):
                raise invalid(exc) from exc
            raise
        self._plugins = merged

    def _collect(self, plugin: object, dist_name: str, version: str) -> list[RegisteredPlugin]:
        found: list[RegisteredPlugin] = []
        others = [p for p in self._pm.get_plugins() if p is not plugin]
        spec_types: tuple[type[BackendSpec | StorageSpec], ...] = (BackendSpec, StorageSpec)
        for expected in spec_types:
            hook_name = f"statekit_register_{expected.kind}s"

            def register(spec: object, expected: type[BackendSpec | StorageSpec] = expected) -> None:
                if not isinstance(spec, expected):
                    raise PluginError(
                        f"{expected.kind}s must be registered as {expected.__name__}, got {spec!r}"
                    )
                found.append(RegisteredPlugin(spec, spec.kind, dist_name, version))

            # Only this plugin's hooks: the others were collected when they were registered.
            self._pm.subset_hook_caller(hook_name, remove_plugins=others)(register=register)
        return found

    @property
    def hook(self) -> pluggy.HookRelay:
        """The pluggy hook relay; call lifecycle hooks on it with keyword arguments."""
        return self._pm.hook

    def backends(self) -> dict[str, RegisteredPlugin]:
        """Returns the installed backends by name, sorted."""
        return dict(sorted(self._plugins["backend"].items()))

    def storages(self) -> dict[str, RegisteredPlugin]:
        """Returns the installed checkpoint storages by name, sorted."""
        return dict(sorted(self._plugins["storage"].items()))

    def backend_spec(self, name: str) -> BackendSpec:
        """Returns the spec of an installed backend.

        Raises:
            UnknownPluginError: If none is installed under ``name``; says what to install.
        """
        spec = self._lookup("backend", name).spec
        assert isinstance(spec, BackendSpec)
        return spec

    def storage_spec(self, name: str) -> StorageSpec:
        """Returns the spec of an installed checkpoint storage; see :meth:`backend_spec`."""
        spec = self._lookup("storage", name).spec
        assert isinstance(spec, StorageSpec)
        return spec

    def create_backend(self, name: str, raw_options: Mapping[str, object] = _NO_OPTIONS) -> Any:
        """Creates a backend from its raw options (short names), validated and defaulted.

        Raises:
            UnknownPluginError: If the backend is not installed.
            ConfigurationError: If an option is unknown or ill-typed.
            PluginError: If its engine is not installed.
        """
        return self._create("backend", name, raw_options)

    def create_storage(self, name: str, raw_options: Mapping[str, object] = _NO_OPTIONS) -> Any:
        """Creates a checkpoint storage; see :meth:`create_backend`."""
        return self._create("storage", name, raw_options)

    def _lookup(self, kind: PluginKind, name: str) -> RegisteredPlugin:
        record = self._plugins[kind].get(name)
        if record is not None:
            return record
        installed = sorted(self._plugins[kind])
        message = f"{kind} '{name}' is not installed. Installed {kind}s: {', '.join(installed) or 'none'}."
        # Names are case-sensitive; the suggestion is not ('RocksDB' means 'rocksdb').
        folded = {n.casefold(): n for n in installed}
        if name.casefold() in folded:
            raise UnknownPluginError(
                f"{message} Did you mean '{folded[name.casefold()]}'? ({kind} names are case-sensitive)"
            )
        close = difflib.get_close_matches(name.casefold(), list(folded), n=1)
        if close:
            message += f" Did you mean '{folded[close[0]]}'?"
        if self._failures:  # the plugin may be one of them
            message += f" Installed but failed to load: {', '.join(f.where for f in self._failures)}."
        known = {n.casefold(): n for n in KNOWN_EXTRAS[kind]}
        real = known.get(name.casefold(), name)
        requirement = KNOWN_EXTRAS[kind].get(real)
        if real != name and requirement:
            # 'RocksDB' while rocksdb is not installed: its real name, and what provides it.
            message += f" Did you mean '{real}'? ({kind} names are case-sensitive)"
        if requirement:
            message += f" Install it with: {install_hint(requirement)}"
        else:
            message += (
                f" No known package provides it; a plugin provides {kind}s with a @hookimpl "
                f"statekit_register_{kind}s in a module named by an entry point in the group 'statekit'."
            )
        raise UnknownPluginError(message)

    def _create(self, kind: PluginKind, name: str, raw_options: Mapping[str, object]) -> Any:
        record = self._lookup(kind, name)
        prefix = f"{PLUGIN_KEY_PREFIXES[kind]}{name}."
        options = parse_plugin_options(
            record.spec.options, raw_options, f"{kind} '{name}'", key_prefix=prefix
        )
        try:
            return record.spec.load_factory()(options)
        except ModuleNotFoundError as exc:  # the engine is an optional dependency
            requirement = KNOWN_EXTRAS[kind].get(name)
            advice = (
                f"Install it with: {install_hint(requirement)}" if requirement
                else f"Install the package that provides it (see the documentation of {record.distribution})"
            )  # fmt: skip
            raise PluginError(
                f"{kind} '{name}' of {record.provider} needs module '{exc.name}', which is not installed. "
                + advice
            ) from exc


_default: PluginRegistry | None = None
_default_lock = threading.Lock()


def default_registry() -> PluginRegistry:
    """Returns the process-wide registry of installed plugins, loading it on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = PluginRegistry.load()
        return _default


def reset_default_registry() -> None:
    """Forgets the process-wide registry, so the next use loads the plugins again (tests)."""
    global _default
    with _default_lock:
        _default = None
