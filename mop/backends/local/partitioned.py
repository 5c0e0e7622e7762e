"""`LocalPartitionedTopics`: the partitioned topics of a merged node (or of one broker of a mop
cluster: those whose names it owns), kept in a table of the colocated broker, so that they
survive restarts; their partitions are the broker's ordinary topics."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from mop.messaging import BackendError
from mop.partitioned import (
    PartitionsExist,
    check_count,
    decode_count,
    encode_count,
    namespace_of,
    partitions_of,
)
from mop.processor.backend import Table

__all__ = ["PARTITIONED_TABLE", "LocalPartitionedTopics"]

# The table that holds them: full topic name -> count.
PARTITIONED_TABLE = "partitioned-topics"


class LocalPartitionedTopics:
    """See `mop.partitioned.PartitionedTopics`. `table` opens the table (on first use: the
    broker must be running), `topics` lists a namespace's ordinary topics and `delete_topic`
    deletes one, as the backend does."""

    def __init__(
        self,
        table: Callable[[], Table],
        topics: Callable[[str], Awaitable[list[str]]],
        delete_topic: Callable[[str, bool], Awaitable[bool]],
    ) -> None:
        self._open_table = table
        self._topics = topics
        self._delete_topic = delete_topic

    def _table(self) -> Table:
        return self._open_table()

    async def partitions(self, topic: str) -> int:
        await trio.lowlevel.checkpoint()
        return decode_count(self._table().get(topic))

    async def create(self, topic: str, count: int) -> None:
        check_count(topic, count)
        table = self._table()
        if decode_count(table.get(topic)):
            raise PartitionsExist(f"partitioned topic {topic} already exists")
        if topic in await self._topics(namespace_of(topic)):
            raise PartitionsExist(f"{topic} already exists as a non-partitioned topic")
        await table.put(topic, encode_count(count))

    async def grow(self, topic: str, count: int) -> None:
        table = self._table()
        current = decode_count(table.get(topic))
        if not current:
            raise BackendError(f"partitioned topic {topic} does not exist", reason="not_found")
        check_count(topic, count, current=current)
        await table.put(topic, encode_count(count))

    async def delete(self, topic: str, *, force: bool = False) -> bool:
        table = self._table()
        count = decode_count(table.get(topic))
        if not count:
            await trio.lowlevel.checkpoint()
            return False
        # The partitions first (those that hold anything): when one is busy (and not `force`),
        # the metadata stays, so the delete can be asked again.
        existing = set(await self._topics(namespace_of(topic)))
        for partition in partitions_of(topic, count):
            if partition in existing:
                await self._delete_topic(partition, force)
        await table.put(topic, None)
        return True

    async def names(self, namespace: str) -> list[str]:
        await trio.lowlevel.checkpoint()
        prefix = namespace.rstrip("/") + "/"
        return sorted(
            topic
            for topic, value in self._table().items()
            if topic.partition("://")[2].startswith(prefix)
            and topic.partition("://")[2].count("/") == 2
            and decode_count(value)
        )
