"""A merged node's partitioned topics: kept in a table of its broker, created once, grown and
never shrunk, deleted with their partitions (not while one has clients, unless forced), and
listed by namespace."""

from __future__ import annotations

import pytest

from mop.backends.local import LocalBackend
from mop.backends.local.partitioned import PARTITIONED_TABLE
from mop.message import Message
from mop.messaging import BackendError, StartPosition, SubscriptionSpec, TopicBusy
from mop.partitioned import PartitionsExist, PartitionsRefused

TOPIC = "persistent://public/default/orders"


async def test_create_grow_and_list(backend: LocalBackend) -> None:
    partitioned = backend.partitioned
    assert await partitioned.partitions(TOPIC) == 0
    await partitioned.create(TOPIC, 2)
    assert await partitioned.partitions(TOPIC) == 2
    assert backend.table(PARTITIONED_TABLE).get(TOPIC) == b"2"  # durable as a table entry
    with pytest.raises(PartitionsExist):
        await partitioned.create(TOPIC, 3)
    await partitioned.grow(TOPIC, 3)
    with pytest.raises(PartitionsRefused) as refused:
        await partitioned.grow(TOPIC, 3)
    assert refused.value.reason == "fewer_partitions"
    with pytest.raises(BackendError) as missing:
        await partitioned.grow("persistent://public/default/none", 3)
    assert missing.value.reason == "not_found"
    await partitioned.create("persistent://public/other/t", 1)
    assert await partitioned.names("public/default") == [TOPIC]
    assert await partitioned.names("public/other") == ["persistent://public/other/t"]


async def test_an_ordinary_topic_of_the_name_is_refused(backend: LocalBackend) -> None:
    await backend.publish(TOPIC, Message(b"x", qos=1))
    with pytest.raises(PartitionsExist, match="non-partitioned"):
        await backend.partitioned.create(TOPIC, 2)


async def test_delete_removes_the_partitions_then_the_metadata(backend: LocalBackend) -> None:
    partitioned = backend.partitioned
    await partitioned.create(TOPIC, 2)
    for index in range(2):
        await backend.publish(f"{TOPIC}-partition-{index}", Message(b"m", qos=1))
    consumer = await backend.subscribe(
        SubscriptionSpec(
            name="s", selectors=frozenset({f"{TOPIC}-partition-1"}), start=StartPosition.EARLIEST
        )
    )
    with pytest.raises(TopicBusy):
        await partitioned.delete(TOPIC)
    assert await partitioned.partitions(TOPIC) == 2  # kept: the delete can be asked again
    assert await partitioned.delete(TOPIC, force=True)
    assert await partitioned.partitions(TOPIC) == 0
    assert not [t for t in await backend.topics("public/default") if t.startswith(TOPIC)]
    assert not await partitioned.delete(TOPIC)
    await consumer.close()
