"""Keyed and operator state: descriptors, handles, TTL, and the bases every backend builds on.

What it holds: ``_state`` (descriptors and the user-facing handles),
``_ttl`` (time-to-live wrappers), ``_slots`` (handles over one stored value
per key and namespace), ``_keyed`` (``KeyedBackendBase``: the current key,
registered states, canonical snapshots and restores), ``_kvlayout`` and
``_kvstate`` (the key layout and handles of ordered key-value engines:
``OrderedKVBackendBase``), ``_operator`` (operator state and its
redistribution on rescale), ``_timerstate`` (the reserved names of the
keyed states that hold timers) and ``_parameters`` (``KeyedBackendParameters``:
what a subtask's keyed backend is made from).

What it may import: ``snapshots``, ``serialization`` and ``statekit._errors``.
Not ``_contracts`` (which names these types), ``timers``, ``checkpoints`` or
anything above: backend authors reach this package through
:mod:`statekit.backend_api`.
"""
