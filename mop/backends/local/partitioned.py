"""`LocalPartitionedTopics`: the partitioned topics of a merged node (or of one broker of a mop
cluster: those whose names it owns), kept in a table of the colocated broker, so that they
survive restarts; their partitions are the broker's ordinary topics."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from mop.messaging import BackendError, TopicBusy
from mop.partitioned import (
    OtherMembers,
    PartitionsExist,
    check_count,
    decode_count,
    encode_count,
    partitions_of,
)
from mop.processor.backend import Table
from mop.topic_names import namespace_of

__all__ = ["PARTITIONED_TABLE", "LocalPartitionedTopics"]

log = logging.getLogger(__name__)

# The table that holds them: full topic name -> count.
PARTITIONED_TABLE = "partitioned-topics"


class LocalPartitionedTopics:
    """See `mop.partitioned.PartitionedTopics`. `table` opens the table (on first use: the
    broker must be running), `topics` lists a namespace's ordinary topics, `in_use` tells
    whether a topic has consumers or producers connected, `declare` makes topics exist (those
    this broker owns: the others are made by their owners, when first used) and
    `delete_topic` deletes one, as the backend does. In a cluster of several members `owns`
    tells the partitions this broker holds, and `others` reaches the other members to delete
    theirs (None: they are left to them, with a warning). `delete_schema` forgets the
    partitioned topic's schema when it is deleted."""

    def __init__(
        self,
        table: Callable[[], Table],
        topics: Callable[[str], Awaitable[list[str]]],
        delete_topic: Callable[[str, bool], Awaitable[bool]],
        *,
        in_use: Callable[[str], bool] = lambda topic: False,
        declare: Callable[[list[str]], Awaitable[None]] | None = None,
        owns: Callable[[str], bool] = lambda topic: True,
        others: OtherMembers | None = None,
        delete_schema: Callable[[str], Awaitable[object]] | None = None,
    ) -> None:
        self._open_table = table
        self._topics = topics
        self._delete_topic = delete_topic
        self._in_use = in_use
        self._declare = declare
        self._owns = owns
        self.others = others
        self._delete_schema = delete_schema
        # Every change reads the count, awaits, then writes it: one change at a time, so that
        # two creates cannot both succeed and a count never shrinks under a racing change.
        self._changing = trio.Lock()

    def _table(self) -> Table:
        return self._open_table()

    async def partitions(self, topic: str) -> int:
        await trio.lowlevel.checkpoint()
        return decode_count(self._table().get(topic))

    async def create(self, topic: str, count: int) -> None:
        check_count(topic, count)
        async with self._changing:
            table = self._table()
            if decode_count(table.get(topic)):
                raise PartitionsExist(f"partitioned topic {topic} already exists")
            if topic in await self._topics(namespace_of(topic)):
                raise PartitionsExist(f"{topic} already exists as a non-partitioned topic")
            await table.put(topic, encode_count(count))
            await self._declare_partitions(topic, 0, count)

    async def grow(self, topic: str, count: int) -> None:
        async with self._changing:
            table = self._table()
            current = decode_count(table.get(topic))
            if not current:
                raise BackendError(f"partitioned topic {topic} does not exist", reason="not_found")
            check_count(topic, count, current=current)
            await table.put(topic, encode_count(count))
            await self._declare_partitions(topic, current, count)

    async def _declare_partitions(self, topic: str, current: int, count: int) -> None:
        """As Pulsar does, the new partitions of a persistent topic exist at once: listings
        and pattern consumers see them before any producer opens them."""
        if self._declare is not None and topic.startswith("persistent://"):
            await self._declare(partitions_of(topic, count)[current:])

    async def delete(self, topic: str, *, force: bool = False) -> bool:
        async with self._changing:
            table = self._table()
            count = decode_count(table.get(topic))
            if not count:
                await trio.lowlevel.checkpoint()
                return False
            existing = set(await self._topics(namespace_of(topic)))
            every = partitions_of(topic, count)
            here = [p for p in every if self._owns(p) and p in existing]
            elsewhere = [p for p in every if not self._owns(p)]
            others = self.others
            # Every partition idle first (unless `force`): a busy one refuses the delete
            # before any partition or the metadata is gone, so it can be asked again.
            if not force:
                busy = [partition for partition in here if self._in_use(partition)]
                if others is not None:
                    busy += [p for p in elsewhere if await others.in_use(p)]
                if busy:
                    raise TopicBusy(f"{topic}: partition {busy[0]} has consumers or producers")
            for partition in here:
                await self._delete_topic(partition, force)
            if others is not None:
                for partition in elsewhere:
                    await others.delete(partition, force=force)
            elif elsewhere:
                log.warning(
                    "partitioned topic %s deleted: the other members' partitions (%s...) stay"
                    " with them (set cluster.admin_url on the brokers to delete them too)",
                    topic,
                    elsewhere[0],
                )
            await table.put(topic, None)
            # The partitions' shared schema goes with them, as in Pulsar.
            if self._delete_schema is not None:
                await self._delete_schema(topic)
            return True

    async def names(self, namespace: str, domain: str = "persistent") -> list[str]:
        """The partitioned topics of `namespace` in `domain` ("persistent" or
        "non-persistent")."""
        await trio.lowlevel.checkpoint()
        prefix = f"{domain}://{namespace.rstrip('/')}/"
        return sorted(
            topic
            for topic, value in self._table().items()
            if topic.startswith(prefix)
            and topic[len(prefix) :].count("/") == 0
            and decode_count(value)
        )
