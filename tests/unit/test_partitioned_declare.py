"""Declaring `pulsar.partitioned_topics` at start: a node that loses a race with another
declaring node reads the count again and accepts any count at least its own; a proxy whose
brokers cannot answer yet asks again in the background."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from mop.messaging import BackendError
from mop.partitioned import PartitionsExist, PartitionsRefused
from mop.partitioned_declare import declare_count, declare_until_done

TOPIC = "persistent://public/default/orders"


class Brokers:
    """Partitioned topics where another node gets each change in first (`others`: the count
    it sets just before ours), or that cannot answer for the first `down` questions."""

    def __init__(self, *, current: int = 0, others: list[int] | None = None, down: int = 0):
        self.count = current
        self.others = list(others or [])
        self.down = down
        self.asked = 0

    async def partitions(self, topic: str) -> int:
        await trio.lowlevel.checkpoint()
        self.asked += 1
        if self.asked <= self.down:
            raise BackendError("no broker answers", reason="unavailable")
        return self.count

    async def create(self, topic: str, count: int) -> None:
        await trio.lowlevel.checkpoint()
        if self.others:
            self.count = self.others.pop(0)
        if self.count:
            raise PartitionsExist(topic)
        self.count = count

    async def grow(self, topic: str, count: int) -> None:
        await trio.lowlevel.checkpoint()
        if self.others:
            self.count = self.others.pop(0)
        if count <= self.count:
            raise PartitionsRefused(topic, reason="fewer_partitions")
        self.count = count

    async def delete(self, topic: str, *, force: bool = False) -> bool:
        raise AssertionError("never deleted")

    async def names(self, namespace: str, domain: str = "persistent") -> list[str]:
        raise AssertionError("never listed")


@pytest.mark.parametrize(("theirs", "ends_with"), [(3, 3), (8, 8), (2, 3)])
async def test_a_create_that_lost_a_race_is_settled_by_the_count(
    theirs: int, ends_with: int
) -> None:
    brokers = Brokers(others=[theirs])
    await declare_count(brokers, TOPIC, 3)
    assert brokers.count == ends_with


async def test_a_grow_that_lost_a_race_is_settled_by_the_count() -> None:
    brokers = Brokers(current=2, others=[5])
    await declare_count(brokers, TOPIC, 4)
    assert brokers.count == 5


async def test_a_topic_with_more_partitions_keeps_them(caplog: pytest.LogCaptureFixture) -> None:
    brokers = Brokers(current=6)
    with caplog.at_level(logging.WARNING):
        await declare_count(brokers, TOPIC, 4)
    assert brokers.count == 6
    assert "more than 4: kept" in caplog.text


async def test_a_proxy_asks_again_until_the_brokers_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    brokers = Brokers(down=2)
    with caplog.at_level(logging.INFO):
        await declare_until_done(brokers, {TOPIC: 3}, delays=(0.01,))
    assert brokers.count == 3
    assert "not declared yet (the brokers cannot answer)" in caplog.text
    assert f"{TOPIC} has at least 3 partitions" in caplog.text


async def test_a_refusal_is_logged_and_not_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    class Refusing(Brokers):
        async def create(self, topic: str, count: int) -> None:
            await trio.lowlevel.checkpoint()
            raise PartitionsRefused(f"{topic}: no", reason="invalid_partitions")

    brokers = Refusing()
    with caplog.at_level(logging.ERROR):
        await declare_until_done(brokers, {TOPIC: 3}, delays=(60.0,))
    assert "not declared" in caplog.text
    assert brokers.asked == 1
