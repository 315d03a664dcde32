"""Keyed and operator state: descriptors, handles, TTL, and the bases every backend builds on.

What it holds: ``_state`` (descriptors and the user-facing handles),
``_ttl`` (time-to-live wrappers), ``_slots`` (handles over one stored value
per key and namespace), ``_registered`` (a state as a backend stores it),
``_keyed`` (``KeyedBackendBase``: the current key, state handles) with
``_keyed_snapshots`` (its canonical snapshots and restores, and the
migrations a restore runs), ``_migration`` (restore plans for changed
declarations), ``_kvlayout``, ``_kvcolumn``, ``_kvttl`` and ``_kvstate`` (the
key layout, columns, TTL sweeps and handles of ordered key-value engines:
``OrderedKVBackendBase``), ``_operator`` (operator state and its
redistribution on rescale), ``_timerstate`` (the reserved names of the
keyed states that hold timers) and ``_parameters`` (``KeyedBackendParameters``:
what a subtask's keyed backend is made from).

What it may import: ``snapshots``, ``serialization`` and ``statekit._errors``.
Not ``_contracts`` (which names these types), ``timers``, ``checkpoints`` or
anything above: backend authors reach this package through
:mod:`statekit.backend_api`.
"""
