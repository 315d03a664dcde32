"""Configuration and plugins: typed options, the registry of backends and storages, secrets.

What it holds: ``_config`` (``ConfigOption``, ``Configuration``, the core
keys and plugin options), ``_registry`` (the pluggy hooks, entry points and
the registry that creates backends and storages by name) and ``_secrets``
(keeping credentials out of messages, reprs and listings).

What it may import: the standard library, pluggy and ``statekit._errors``;
nothing of state, snapshots or checkpoints (a plugin is found by name and
imported only when used). ``_config`` sits below ``_registry``: it names what
it asks of the installed plugins as a protocol (``InstalledPlugins``).
"""
