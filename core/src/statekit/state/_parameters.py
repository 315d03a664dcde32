"""What a subtask's keyed backend is made from: one frozen parameter object.

As Flink's ``KeyedStateBackendParameters``, every runner (the LocalRunner,
a Spark task, the kit's job harness, the tools that open a native
checkpoint) describes the keyed backend it wants with one
:class:`KeyedBackendParameters`, declared here once; ``_contracts``
forwards it to :meth:`StateBackend.create_keyed_backend
<statekit.StateBackend.create_keyed_backend>`, whose keyword arguments stay
what third-party backends implement.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..serialization._keygroups import KeyGroupRange, key_group_range_for_operator
from ..serialization._serializers import TypeSerializer
from ._ttl import Clock

__all__ = ["DEFAULT_KEY_CACHE_SIZE", "KeyedBackendParameters"]

#: Keys whose key group (and serialized form) a keyed backend remembers (``statekit.key-cache-size``).
DEFAULT_KEY_CACHE_SIZE = 131072


@dataclass(frozen=True)
class KeyedBackendParameters:
    """Everything a keyed backend of one subtask is created with.

    Attributes:
        key_serializer: Serializes the keys (and fixes their key groups).
        key_group_range: The key groups the subtask owns.
        max_parallelism: The number of key groups of the job.
        clock: Processing time for TTL (None: the system clock).
        key_cache_size: Keys whose key group the backend remembers.
        local_dir: Where an on-disk backend keeps its files (None: it chooses).
    """

    key_serializer: TypeSerializer
    key_group_range: KeyGroupRange
    max_parallelism: int
    clock: Clock | None = None
    key_cache_size: int = DEFAULT_KEY_CACHE_SIZE
    local_dir: str | None = None

    @classmethod
    def of_subtask(
        cls,
        index: int,
        parallelism: int,
        *,
        key_serializer: TypeSerializer,
        max_parallelism: int,
        clock: Clock | None = None,
        key_cache_size: int = DEFAULT_KEY_CACHE_SIZE,
        local_dir: str | None = None,
    ) -> KeyedBackendParameters:
        """The parameters of subtask ``index`` of ``parallelism``: it owns Flink's key-group range for it."""
        return cls(
            key_serializer,
            key_group_range_for_operator(max_parallelism, parallelism, index),
            max_parallelism,
            clock,
            key_cache_size,
            local_dir,
        )

    def in_dir(self, local_dir: str | None) -> KeyedBackendParameters:
        """These parameters with another working directory."""
        return dataclasses.replace(self, local_dir=local_dir)
