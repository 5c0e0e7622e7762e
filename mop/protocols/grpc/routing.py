"""Which partition of a partitioned topic a produced message goes to, as Pulsar's Java client
routes by default: a message with a key to the partition its key's hash names (Java's
String.hashCode, the client's JavaStringHash), so that one key keeps its order; a message
without one to the next partition in turn.
"""

from __future__ import annotations

from typing import Final

_MASK32: Final = 0xFFFFFFFF
_INT_MAX: Final = 0x7FFFFFFF


def java_string_hash(key: str) -> int:
    """Java's `String.hashCode()` of `key` (over its UTF-16 code units), as a signed 32-bit
    number."""
    value = 0
    data = key.encode("utf-16-be", "surrogatepass")
    for index in range(0, len(data), 2):
        value = (31 * value + (data[index] << 8 | data[index + 1])) & _MASK32
    return value - (1 << 32) if value > _INT_MAX else value


class PartitionRouter:
    """Picks the partition of each message of one producer."""

    __slots__ = ("_count", "_next")

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"a partitioned topic has at least one partition, not {count}")
        self._count = count
        self._next = 0

    def partition(self, key: str | None) -> int:
        if key is not None:
            return (java_string_hash(key) & _INT_MAX) % self._count
        index = self._next
        self._next = (index + 1) % self._count
        return index


__all__ = ["PartitionRouter", "java_string_hash"]
