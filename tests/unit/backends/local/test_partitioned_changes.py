"""`LocalPartitionedTopics` under concurrent changes: one change at a time, so that racing
creates do not both succeed and a count never shrinks; and a delete that is refused because
a partition is busy leaves every partition and the metadata in place."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio
import trio.lowlevel

from mop.backends.local.partitioned import LocalPartitionedTopics
from mop.messaging import TopicBusy
from mop.partitioned import PartitionsExist, partitions_of

TOPIC = "persistent://public/default/orders"


class SlowTable:
    """A table whose writes take a while (a storage sync), as the broker's do."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    @property
    def name(self) -> str:
        return "partitioned-topics"

    def get(self, key: str) -> bytes | None:
        return self.values.get(key)

    def items(self) -> Iterator[tuple[str, bytes]]:
        return iter(list(self.values.items()))

    async def put(self, key: str, value: bytes | None) -> None:
        await trio.sleep(0.01)
        if value is None:
            self.values.pop(key, None)
        else:
            self.values[key] = value


class Topics:
    """The broker's ordinary topics, as far as the partitioned topics see them."""

    def __init__(self) -> None:
        self.existing: set[str] = set()
        self.busy: set[str] = set()

    async def list(self, namespace: str) -> list[str]:
        await trio.sleep(0.01)  # the gap a racing change used to slip through
        return sorted(self.existing)

    async def declare(self, topics: list[str]) -> None:
        await trio.sleep(0.01)
        self.existing.update(topics)

    async def delete(self, topic: str, force: bool) -> bool:
        await trio.lowlevel.checkpoint()
        if topic in self.busy and not force:
            raise TopicBusy(topic)
        self.existing.discard(topic)
        return True


def _partitioned(table: SlowTable, topics: Topics) -> LocalPartitionedTopics:
    return LocalPartitionedTopics(
        lambda: table,  # type: ignore[arg-type,return-value]
        topics.list,
        topics.delete,
        in_use=lambda topic: topic in topics.busy,
        declare=topics.declare,
    )


async def test_of_two_racing_creates_one_is_refused() -> None:
    table, topics = SlowTable(), Topics()
    partitioned = _partitioned(table, topics)
    outcomes: dict[int, str] = {}

    async def create(count: int) -> None:
        try:
            await partitioned.create(TOPIC, count)
        except PartitionsExist:
            outcomes[count] = "refused"
        else:
            outcomes[count] = "created"

    async with trio.open_nursery() as nursery:
        nursery.start_soon(create, 8)
        nursery.start_soon(create, 2)
    assert sorted(outcomes.values()) == ["created", "refused"]
    (created,) = (count for count, outcome in outcomes.items() if outcome == "created")
    assert await partitioned.partitions(TOPIC) == created
    # The partitions exist from the create on, as in Pulsar.
    assert topics.existing == set(partitions_of(TOPIC, created))


async def test_a_delete_racing_a_grow_leaves_nothing_behind() -> None:
    table, topics = SlowTable(), Topics()
    partitioned = _partitioned(table, topics)
    await partitioned.create(TOPIC, 2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partitioned.grow, TOPIC, 4)
        await trio.lowlevel.checkpoint()
        nursery.start_soon(partitioned.delete, TOPIC)
    assert await partitioned.partitions(TOPIC) == 0
    assert topics.existing == set()


async def test_a_busy_partition_refuses_the_delete_before_anything_goes() -> None:
    table, topics = SlowTable(), Topics()
    partitioned = _partitioned(table, topics)
    await partitioned.create(TOPIC, 3)
    topics.busy.add(partitions_of(TOPIC, 3)[2])
    with pytest.raises(TopicBusy):
        await partitioned.delete(TOPIC)
    assert await partitioned.partitions(TOPIC) == 3
    assert topics.existing == set(partitions_of(TOPIC, 3))
    assert await partitioned.delete(TOPIC, force=True)
    assert topics.existing == set()
    assert await partitioned.partitions(TOPIC) == 0


async def test_the_listing_keeps_to_its_domain() -> None:
    table, topics = SlowTable(), Topics()
    partitioned = _partitioned(table, topics)
    await partitioned.create(TOPIC, 1)
    await partitioned.create("non-persistent://public/default/ticks", 2)
    await partitioned.create("persistent://public/other/orders", 1)
    assert await partitioned.names("public/default") == [TOPIC]
    assert await partitioned.names("public/default", "non-persistent") == [
        "non-persistent://public/default/ticks"
    ]
    # Non-persistent partitions live while used, as in Pulsar: none is made ahead.
    assert not any(topic.startswith("non-persistent") for topic in topics.existing)
