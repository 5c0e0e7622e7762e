"""Partitioned topics, in Pulsar's model: a partitioned topic `T` of N partitions is metadata
(its name and N) over N ordinary topics `T-partition-0` ... `T-partition-{N-1}`, which hold
the messages. Pure: the partitions' names, the rules of a count, the errors that refuse a
change, and the interface every backend offers to keep the metadata (`PartitionedTopics`).
"""

from __future__ import annotations

from typing import Final, Protocol

from mop.messaging import BackendError

__all__ = [
    "MAX_PARTITIONS",
    "OtherMembers",
    "PARTITION_SUFFIX",
    "PartitionedTopics",
    "PartitionsExist",
    "PartitionsRefused",
    "check_count",
    "decode_count",
    "encode_count",
    "partition_index",
    "partition_topic",
    "partitions_of",
]

PARTITION_SUFFIX: Final = "-partition-"
# Every partition is a topic of its own: a bound that keeps one request from creating a
# million of them.
MAX_PARTITIONS: Final = 4096


class PartitionsExist(BackendError):
    """A partitioned topic (or an ordinary topic of that name) is there already."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="already_exists")


class PartitionsRefused(BackendError):
    """A count that may not be set: not positive or over the bound (reason
    "invalid_partitions"), or not more than there are ("fewer_partitions"); or a name that
    contains "-partition-" ("partition_name")."""

    def __init__(self, message: str, *, reason: str = "invalid_partitions") -> None:
        super().__init__(message, reason=reason)


def partition_topic(topic: str, index: int) -> str:
    """The name of partition `index` of partitioned topic `topic` (a full name)."""
    return f"{topic}{PARTITION_SUFFIX}{index}"


def partitions_of(topic: str, count: int) -> list[str]:
    """The names of the `count` partitions of `topic`, in order."""
    return [partition_topic(topic, index) for index in range(count)]


def partition_index(topic: str) -> tuple[str, int] | None:
    """(the partitioned topic, the index) when `topic` is named as a partition, else None."""
    base, suffix, index = topic.rpartition(PARTITION_SUFFIX)
    if not suffix or not base or not index.isascii() or not index.isdigit():
        return None
    if index != str(int(index)):  # "-partition-01" is an ordinary name
        return None
    return base, int(index)


def check_count(topic: str, count: int, *, current: int = 0) -> None:
    """PartitionsRefused unless `count` partitions may be set for `topic` that has `current`
    now (0: none): positive, at most MAX_PARTITIONS, and never fewer than there are (Pulsar
    cannot take partitions away: their messages would be lost to the topic)."""
    if PARTITION_SUFFIX in topic.partition("://")[2]:
        # Pulsar refuses any such name (412), not only one that ends as a partition's does.
        raise PartitionsRefused(
            f"{topic}: the name of a partitioned topic cannot contain {PARTITION_SUFFIX!r}",
            reason="partition_name",
        )
    if count <= 0 or count > MAX_PARTITIONS:
        raise PartitionsRefused(
            f"{topic}: the number of partitions must be between 1 and {MAX_PARTITIONS}, not {count}"
        )
    if current and count <= current:
        raise PartitionsRefused(
            f"{topic}: the number of partitions can only grow: it is {current},"
            f" {count} is not more",
            reason="fewer_partitions",
        )


def encode_count(count: int) -> bytes:
    """A count as a table stores it."""
    return str(count).encode()


def decode_count(value: bytes | None) -> int:
    """A stored count (0: none, or a value that is not one)."""
    if value is None:
        return 0
    try:
        count = int(value.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return 0
    return count if 0 < count <= MAX_PARTITIONS else 0


class PartitionedTopics(Protocol):
    """The partitioned topics of a deployment, kept by its backend (a merged node's broker; a
    separated proxy asks its brokers). Topics are full names."""

    async def partitions(self, topic: str) -> int:
        """How many partitions `topic` has; 0 when it is not partitioned (or unknown)."""
        ...

    async def create(self, topic: str, count: int) -> None:
        """Make `topic` a partitioned topic of `count` partitions; PartitionsExist when it is
        one already, PartitionsRefused for a count that may not be set."""
        ...

    async def grow(self, topic: str, count: int) -> None:
        """Raise the partitions of `topic` to `count` (more than now); BackendError with
        reason "not_found" when it is not partitioned, PartitionsRefused for fewer."""
        ...

    async def delete(self, topic: str, *, force: bool = False) -> bool:
        """Delete the partitions of `topic` (their messages and positions) and then its
        metadata; TopicBusy while a partition has clients, unless `force`. False when it was
        not partitioned."""
        ...

    async def names(self, namespace: str, domain: str = "persistent") -> list[str]:
        """The partitioned topics of `namespace` ("tenant/namespace") in `domain`
        ("persistent" or "non-persistent"), sorted."""
        ...


class OtherMembers(Protocol):
    """The other members of a mop broker cluster, as the member that keeps a partitioned
    topic's metadata reaches them (their HTTP admin) to delete the partitions they hold."""

    async def in_use(self, topic: str) -> bool:
        """Whether `topic` has consumers or producers connected at the member that owns it
        (False when it has no such topic)."""
        ...

    async def delete(self, topic: str, *, force: bool) -> bool:
        """Delete `topic` at the member that owns it; False when it has no such topic."""
        ...

    async def aclose(self) -> None: ...
