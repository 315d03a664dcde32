"""Key groups: the unit in which keyed state is assigned, snapshotted and rescaled.

The formulas are Flink's (``KeyGroupRangeAssignment``). Only the hash of a key
differs: Flink hashes ``key.hashCode()``; statekit hashes the key's canonical
serialized bytes with CRC-32 (``zlib.crc32``, IEEE polynomial), read as a signed
32-bit integer. CRC-32 of bytes is identical on every machine, process and
Python version, unlike :func:`hash`, which is salted per process for ``str`` and
``bytes``. The result then goes through Flink's ``MathUtils.murmurHash(int)``
exactly, so the spread over key groups is Flink's.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from .._errors import ConfigurationError

__all__ = [
    "DEFAULT_LOWER_MAX_PARALLELISM",
    "UPPER_MAX_PARALLELISM",
    "KeyGroupRange",
    "assign_to_key_group",
    "compute_default_max_parallelism",
    "key_group_for_bytes",
    "key_group_range_for_operator",
    "murmur_hash",
    "operator_index_for_key_group",
    "stable_hash",
    "validate_parallelism",
]

DEFAULT_LOWER_MAX_PARALLELISM = 128
UPPER_MAX_PARALLELISM = 32768
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def murmur_hash(code: int) -> int:
    """Flink's ``MathUtils.murmurHash(int)``: a non-negative 32-bit spread of ``code``.

    >>> murmur_hash(0), murmur_hash(1)
    (593689054, 68075478)
    """
    c = code & _M32
    c = (c * 0xCC9E2D51) & _M32
    c = _rotl(c, 15)
    c = (c * 0x1B873593) & _M32
    c = _rotl(c, 13)
    c = (c * 5 + 0xE6546B64) & _M32
    c ^= 4
    c ^= c >> 16
    c = (c * 0x85EBCA6B) & _M32
    c ^= c >> 13
    c = (c * 0xC2B2AE35) & _M32
    c ^= c >> 16
    if c >= 0x80000000:  # as a Java int: negative
        c -= 0x100000000
        # Math.abs(Integer.MIN_VALUE) overflows; Flink maps it to 0.
        return 0 if c == -0x80000000 else -c
    return c


def stable_hash(key_bytes: bytes) -> int:
    """The key's 32-bit hash: CRC-32 of its canonical bytes as a signed int."""
    h = zlib.crc32(key_bytes)
    return h - 0x100000000 if h >= 0x80000000 else h


def key_group_for_bytes(key_bytes: bytes, max_parallelism: int) -> int:
    """The key group of a key, given its canonical serialized bytes."""
    return murmur_hash(zlib.crc32(key_bytes)) % max_parallelism


def assign_to_key_group(key_bytes: bytes, max_parallelism: int) -> int:
    """Alias of :func:`key_group_for_bytes`, named as in Flink."""
    return key_group_for_bytes(key_bytes, max_parallelism)


def operator_index_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """The subtask (0-based) that owns ``key_group`` at ``parallelism``."""
    return key_group * parallelism // max_parallelism


def validate_parallelism(parallelism: int, max_parallelism: int) -> None:
    """Raise :class:`ConfigurationError` unless ``0 < parallelism <= max_parallelism``."""
    if not 0 < max_parallelism <= UPPER_MAX_PARALLELISM:
        raise ConfigurationError(
            f"max parallelism {max_parallelism} is out of range: it must be between 1 and "
            f"{UPPER_MAX_PARALLELISM}"
        )
    if not 0 < parallelism <= max_parallelism:
        raise ConfigurationError(
            f"parallelism {parallelism} is out of range: it must be between 1 and the max "
            f"parallelism {max_parallelism}; raise statekit.max-parallelism before the first "
            "checkpoint if you need more subtasks"
        )


def _round_up_to_power_of_two(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def compute_default_max_parallelism(parallelism: int) -> int:
    """Flink's default: ``min(max(pow2ceil(p + p // 2), 128), 32768)``."""
    return min(
        max(_round_up_to_power_of_two(parallelism + parallelism // 2), DEFAULT_LOWER_MAX_PARALLELISM),
        UPPER_MAX_PARALLELISM,
    )


@dataclass(frozen=True, slots=True)
class KeyGroupRange:
    """An inclusive range ``[start, end]`` of key groups; empty when ``end < start``."""

    start: int
    end: int

    @classmethod
    def empty(cls) -> KeyGroupRange:
        """The range that holds no key group."""
        return cls(0, -1)

    @classmethod
    def of(cls, start: int, end: int) -> KeyGroupRange:
        """The range ``[start, end]``, both inclusive."""
        if start < 0:
            raise ValueError(f"key group range start must be >= 0, got {start}")
        return cls(start, end) if end >= start else cls.empty()

    def __len__(self) -> int:
        return max(0, self.end - self.start + 1)

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.start <= key_group <= self.end

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    def intersection(self, other: KeyGroupRange) -> KeyGroupRange:
        """The key groups in both ranges."""
        return KeyGroupRange.of(max(self.start, other.start), min(self.end, other.end))

    def __str__(self) -> str:
        return f"KeyGroupRange[{self.start}, {self.end}]" if len(self) else "KeyGroupRange[]"


def key_group_range_for_operator(
    max_parallelism: int, parallelism: int, operator_index: int
) -> KeyGroupRange:
    """The key groups subtask ``operator_index`` owns at ``parallelism``.

    >>> [str(key_group_range_for_operator(128, 3, i)) for i in range(3)]
    ['KeyGroupRange[0, 42]', 'KeyGroupRange[43, 85]', 'KeyGroupRange[86, 127]']
    """
    validate_parallelism(parallelism, max_parallelism)
    if not 0 <= operator_index < parallelism:
        raise ValueError(f"operator index {operator_index} is not in [0, {parallelism})")
    start = (operator_index * max_parallelism + parallelism - 1) // parallelism
    end = ((operator_index + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange.of(start, end)
