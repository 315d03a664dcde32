"""Bytes and key groups: serializers, and the key-group arithmetic every layer above relies on.

What it holds: ``_serializers`` (how keys, namespaces and values become bytes;
serializer configs, so a restore can check them) and ``_keygroups`` (Flink's
key-group formulas: the hash, the operator of a key group, the ranges).

What it may import: the standard library and ``statekit._errors``. Every
other package may import it; the public names are re-exported by
:mod:`statekit.serializers` and :mod:`statekit`.
"""
