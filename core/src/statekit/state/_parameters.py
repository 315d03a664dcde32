"""What a subtask's keyed backend is made from: one frozen parameter object.

As Flink's ``KeyedStateBackendParameters``, every runner (the LocalRunner,
a Spark task, the kit's job harness, the tools that open a native
checkpoint) describes the keyed backend it wants with one
:class:`KeyedBackendParameters`, declared here once, and hands it whole to
:meth:`StateBackend.create_keyed_backend <statekit.backend_api.StateBackend.create_keyed_backend>`
(``create_keyed_backend(parameters)``), as Flink passes its
``KeyedStateBackendParameters``. The keyword form of earlier releases
(``create_keyed_backend(key_serializer=..., ...)``) still works until
statekit 0.2.0, with a DeprecationWarning (:func:`parameters_from_keywords`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .._errors import warn_deprecated
from ..plugins._config import DEFAULT_KEY_CACHE_SIZE
from ..serialization._keygroups import KeyGroupRange, key_group_range_for_operator
from ..serialization._serializers import TypeSerializer
from ._ttl import Clock

__all__ = ["DEFAULT_KEY_CACHE_SIZE", "KeyedBackendParameters", "parameters_from_keywords"]


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
        exact_entries: Count (key, namespace) entries exactly on write, where the backend
            would have to (ordered key-value engines; ``statekit.metrics.exact-entries``).
            False: no counting, the engine's estimate is reported, labelled.
    """

    key_serializer: TypeSerializer
    key_group_range: KeyGroupRange
    max_parallelism: int
    clock: Clock | None = None
    key_cache_size: int = DEFAULT_KEY_CACHE_SIZE
    local_dir: str | None = None
    exact_entries: bool = True

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
        exact_entries: bool = True,
    ) -> KeyedBackendParameters:
        """The parameters of subtask ``index`` of ``parallelism``: it owns Flink's key-group range for it."""
        return cls(
            key_serializer,
            key_group_range_for_operator(max_parallelism, parallelism, index),
            max_parallelism,
            clock,
            key_cache_size,
            local_dir,
            exact_entries,
        )

    def in_dir(self, local_dir: str | None) -> KeyedBackendParameters:
        """These parameters with another working directory."""
        return dataclasses.replace(self, local_dir=local_dir)


def parameters_from_keywords(
    parameters: KeyedBackendParameters | None, keywords: dict[str, Any], where: str
) -> KeyedBackendParameters:
    """``parameters``, or (deprecated) the same made from the keyword form ``where`` was called with.

    For a ``create_keyed_backend(self, parameters=None, /, **keywords)`` that
    still accepts the spread keywords of earlier releases until statekit 0.2.0.

    Raises:
        TypeError: For both forms at once, or neither.
    """
    if parameters is not None:
        if keywords:
            raise TypeError(f"{where}: pass the KeyedBackendParameters or keyword arguments, not both")
        return parameters
    if not keywords:
        raise TypeError(f"{where}: pass the KeyedBackendParameters (create_keyed_backend(parameters))")
    warn_deprecated(
        f"{where}(key_serializer=..., ...), the keyword form,",
        "pass one KeyedBackendParameters (statekit.backend_api) instead: "
        f"{where}(KeyedBackendParameters(key_serializer=..., key_group_range=..., max_parallelism=...))",
        stacklevel=4,
    )
    return KeyedBackendParameters(**keywords)
