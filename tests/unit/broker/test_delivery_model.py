"""Property test: for a durable exclusive subscription, any sequence of publishes, acks,
consumer closes, reattaches and broker restarts delivers every message at least once, and
each consumer session sees each topic's messages in publish order."""

from __future__ import annotations

from dataclasses import dataclass, field

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from mop.broker import Attachment, Broker
from mop.broker.storage import MemoryStorage
from mop.message import Delivery, MessageId

from .support import Clock, msg, subscribe, topic

TOPICS = ["m/a", "m/b", "other"]  # the subscription selects "m/+"

Op = tuple[str, int]
ops = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(0, len(TOPICS) - 1)),
        st.tuples(st.just("receive"), st.integers(1, 4)),
        st.tuples(st.just("ack"), st.integers(0, 5)),
        st.tuples(st.just("close"), st.just(0)),
        st.tuples(st.just("attach"), st.integers(1, 5)),
        st.tuples(st.just("restart"), st.just(0)),
    ),
    max_size=60,
)


@dataclass
class Model:
    published: dict[str, list[MessageId]] = field(default_factory=dict)
    acked: set[tuple[str, MessageId]] = field(default_factory=set)
    # Per consumer session and topic, the last id seen, to check the order.
    last_seen: dict[str, MessageId] = field(default_factory=dict)
    in_hand: list[Delivery] = field(default_factory=list)


class Harness:
    def __init__(self) -> None:
        self.storage = MemoryStorage()
        self.broker = Broker(self.storage, clock=Clock())
        self.att: Attachment | None = None
        self.model = Model()

    async def attach(self, capacity: int) -> None:
        if self.att is None:
            self.att = await subscribe(self.broker, "session", ["m/+"], capacity=capacity)
            self.model.last_seen.clear()
            self.model.in_hand.clear()

    async def run(self, op: str, arg: int) -> None:
        model = self.model
        if op == "publish":
            name = topic(TOPICS[arg])
            result = await self.broker.publish(name, msg("x"))
            if TOPICS[arg].startswith("m/"):
                model.published.setdefault(name, []).append(result.message_id)
        elif op == "receive" and self.att is not None:
            for delivery in self.broker.take(self.att, arg):
                self.check_order(delivery)
                model.in_hand.append(delivery)
        elif op == "ack" and self.att is not None and model.in_hand:
            delivery = model.in_hand.pop(arg % len(model.in_hand))
            self.broker.ack(self.att, [delivery])
            model.acked.add((delivery.topic, delivery.message_id))
        elif op == "close" and self.att is not None:
            self.broker.close(self.att)
            self.att = None
        elif op == "attach":
            await self.attach(arg)
        elif op == "restart":
            # The process dies: whatever the consumer held comes back from storage.
            self.broker = Broker(self.storage, clock=Clock())
            await self.broker.recover()
            self.att = None

    def check_order(self, delivery: Delivery) -> None:
        last = self.model.last_seen.get(delivery.topic)
        assert last is None or delivery.message_id > last, "per-topic order broken"
        self.model.last_seen[delivery.topic] = delivery.message_id

    async def drain(self) -> None:
        """Attach and acknowledge until nothing is left; check nothing was lost."""
        if self.att is not None:
            self.broker.close(self.att)
            self.att = None
        await self.attach(3)
        assert self.att is not None
        while deliveries := self.broker.take(self.att, 3):
            for delivery in deliveries:
                self.check_order(delivery)
                self.model.acked.add((delivery.topic, delivery.message_id))
            self.broker.ack(self.att, deliveries)
        expected = {(name, mid) for name, ids in self.model.published.items() for mid in ids}
        assert expected <= self.model.acked, "a published message was never delivered"
        self.broker.trim_acknowledged()
        assert self.storage.stats().messages == 0


@settings(max_examples=300, deadline=None)
@given(ops)
def test_durable_exclusive_is_at_least_once_and_ordered(sequence: list[Op]) -> None:
    async def scenario() -> None:
        harness = Harness()
        await harness.attach(2)
        for op, arg in sequence:
            await harness.run(op, arg)
        await harness.drain()

    trio.run(scenario)
