"""A state backend from its declared options and its keyed backend class: the factory, once.

Every backend plugin had the same factory: take the options by short name,
fill in the defaults, check them, and pass them with the runner's parameters
to a keyed backend per subtask; operator state in core's in-memory backend.
:class:`DeclaredStateBackend` is that factory::

    OPTIONS = (ConfigOption("cache-size", int, 64 << 20, "Bytes of read cache.", byte_size=True),)

    class MyStateBackend(DeclaredStateBackend):
        name = "mydb"
        declared_options = OPTIONS           # the same tuple the plugin's BackendSpec registers
        keyed_backend = MyKeyedBackend       # made as MyKeyedBackend(parameters, options)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from .._errors import ConfigurationError
from ..plugins._config import ConfigOption
from ._operator import OperatorStateBackendImpl
from ._parameters import KeyedBackendParameters, parameters_from_keywords

__all__ = ["DeclaredStateBackend"]


class DeclaredStateBackend:
    """A :class:`~statekit.StateBackend` whose options are declared once and passed to its keyed backends.

    Subclasses set :attr:`name`, :attr:`declared_options` and :attr:`keyed_backend`.
    ``__init__(options)`` takes the options by short name as the registry passes
    them (parsed), or raw (a test's ``{"cache-size": "1mb"}``: each is parsed by
    its :class:`~statekit.backend_api.ConfigOption`), fills in the defaults and
    refuses unknown names; :attr:`options` holds the result.
    ``create_keyed_backend`` makes ``keyed_backend(parameters, options)`` with
    the runner's :class:`~statekit.state._parameters.KeyedBackendParameters`
    (``local_dir`` replaced by a ``local-dir`` option when one is declared and set).
    """

    #: The backend's name (``statekit.backend=<name>``).
    name: str = ""
    #: The plugin's options: the tuple its ``BackendSpec`` registers.
    declared_options: ClassVar[Sequence[ConfigOption]] = ()
    #: The keyed backend class, made as ``keyed_backend(parameters, options)``.
    keyed_backend: ClassVar[Callable[..., Any]]

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        """Take the options by short name; defaults for those left out.

        Raises:
            ConfigurationError: Naming the option, for an unknown name or a value out of range.
        """
        given = dict(options or {})
        declared = {o.name: o for o in self.declared_options}
        unknown = sorted(set(given) - set(declared))
        if unknown:
            raise ConfigurationError(
                f"the {self.name} backend has no options {unknown}; it declares {sorted(declared)}"
            )
        self.options: dict[str, Any] = {}
        for name, opt in declared.items():
            if name in given and given[name] is not None:
                self.options[name] = opt.parse(given[name], f"statekit.backend.{self.name}.{name}")
            else:
                self.options[name] = opt.default

    def create_keyed_backend(
        self, parameters: KeyedBackendParameters | None = None, /, **keywords: Any
    ) -> Any:
        """A keyed backend for one subtask: ``keyed_backend(self.keyed_parameters(parameters), options)``.

        The keyword form of earlier releases (``key_serializer=..., ...``) is
        accepted until statekit 0.2.0, with a DeprecationWarning.
        """
        where = f"{type(self).__name__}.create_keyed_backend"
        parameters = parameters_from_keywords(parameters, keywords, where)
        return self.keyed_backend(self.keyed_parameters(parameters), self.options)

    def keyed_parameters(self, parameters: KeyedBackendParameters) -> KeyedBackendParameters:
        """``parameters`` with ``local_dir`` replaced by the ``local-dir`` option, when declared and set."""
        local_dir = self.options.get("local-dir")
        return parameters.in_dir(local_dir) if local_dir else parameters

    def create_operator_backend(self) -> OperatorStateBackendImpl:
        """Operator state is small and kept in memory by core's backend, as in Flink."""
        return OperatorStateBackendImpl()
