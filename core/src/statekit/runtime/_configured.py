"""The state backend and checkpoint storage a configuration names, as both runners create them."""

from __future__ import annotations

from .._contracts import CheckpointStorage, StateBackend
from ..plugins._config import Configuration
from ..plugins._registry import PluginRegistry, default_registry

__all__ = ["checkpoint_storage_from_config", "state_backend_from_config"]


def state_backend_from_config(config: Configuration, registry: PluginRegistry | None = None) -> StateBackend:
    """The state backend ``statekit.backend`` names, with its options."""
    reg = registry or default_registry()
    name = config.backend_name
    backend: StateBackend = reg.create_backend(name, config.plugin_options("backend", name))
    return backend


def checkpoint_storage_from_config(
    config: Configuration, registry: PluginRegistry | None = None
) -> CheckpointStorage:
    """The checkpoint storage ``statekit.checkpoint.storage`` names, with its options.

    ``statekit.checkpoints.dir`` and ``statekit.savepoints.dir`` reach the
    storage as its options ``checkpoints-dir`` and ``savepoints-dir``.
    """
    reg = registry or default_registry()
    name = config.storage_name
    opts: dict[str, object] = dict(config.plugin_options("storage", name))
    spec = reg.storage_spec(name)
    declared = {o.name for o in spec.options}
    for key, opt in (
        ("statekit.checkpoints.dir", "checkpoints-dir"),
        ("statekit.savepoints.dir", "savepoints-dir"),
    ):
        value = config.get(key)
        if value is not None and opt in declared:
            opts.setdefault(opt, value)
    storage: CheckpointStorage = reg.create_storage(name, opts)
    return storage
