"""The consume method: acks, negative acks and redelivery, the end of a call, subscription
types, initial positions, and the bound on messages taken ahead of the client's reading."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from mop.clock import now_ms
from mop.message import Message, MessageId
from mop.processor import (
    BackendError,
    ClientContext,
    Consumer,
    MessagingProcessor,
    SubscriptionSpec,
)
from mop.protocols.grpc.proto import mop_grpc_pb2 as pb
from mop.protocols.grpc.serving.calls import MethodHandler
from mop.protocols.grpc.serving.clients import Namespaces
from mop.protocols.grpc.serving.consuming import Consuming
from mop.protocols.grpc.serving.pulsar_service import CONSUME, SEND
from mop.protocols.grpc.status import StatusCode
from tests.unit.protocols.grpc.serving.conftest import FakeCall

TOPIC = "persistent://public/default/consumed"
CTX = ClientContext(client_id="writer", protocol="test")


def consumer(subscription: str = "s", **extra: str) -> FakeCall:
    metadata = {"pulsar-topic": TOPIC, "pulsar-subscription": subscription, **extra}
    return FakeCall(CONSUME, metadata, window=0)


async def publish(processor: MessagingProcessor, *payloads: bytes, **fields: Any) -> None:
    for payload in payloads:
        await processor.publish(CTX, TOPIC, Message(payload, **fields))


async def started(nursery: trio.Nursery, call: FakeCall, handler: MethodHandler) -> None:
    nursery.start_soon(call.run, handler)
    await trio.testing.wait_all_tasks_blocked(0.05)


async def take(call: FakeCall, count: int) -> list[pb.Message]:
    return [await call.response(pb.Message) for _ in range(count)]


async def nothing_more(call: FakeCall) -> None:
    with trio.move_on_after(0.2):
        extra = await call.responses.receive()
        raise AssertionError(f"unexpected message {extra!r}")


def ack(*messages: pb.Message, cumulative: bool = False) -> pb.Ack:
    kind = pb.Ack.CUMULATIVE if cumulative else pb.Ack.INDIVIDUAL
    return pb.Ack(type=kind, message_ids=[m.message_id for m in messages])


async def test_messages_carry_what_was_published_and_acked_ones_do_not_come_back(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    first = consumer()
    async with trio.open_nursery() as nursery:
        await started(nursery, first, methods[CONSUME])
        await publish(processor, b"a", b"b", key="k", properties=(("p", "1"),), event_time=9)
        a, _ = await take(first, 2)
        assert (a.payload, a.key, a.event_time, a.topic) == (b"a", "k", 9, TOPIC)
        assert [(p.key, p.value) for p in a.properties] == [("p", "1")]
        assert a.redelivery_count == 0 and a.message_id.batch_index == -1
        first.request(ack(a))
        await trio.testing.wait_all_tasks_blocked(0.05)
        first.half_close()
    assert first.status is StatusCode.OK
    # b was not acknowledged: the subscription's next consumer gets it, a second time.
    second = consumer()
    async with trio.open_nursery() as nursery:
        await started(nursery, second, methods[CONSUME])
        (again,) = await take(second, 1)
        assert (again.payload, again.redelivery_count) == (b"b", 1)
        await nothing_more(second)
        second.half_close()
    stats = processor.stats.protocol("grpc")
    assert stats.messages_sent == 3 and stats.connections == 0 and stats.opened == 2


async def test_a_cumulative_ack_acknowledges_every_message_up_to_it(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    first = consumer()
    async with trio.open_nursery() as nursery:
        await started(nursery, first, methods[CONSUME])
        await publish(processor, b"1", b"2", b"3")
        _, two, _ = await take(first, 3)
        first.request(ack(two, cumulative=True))
        await trio.testing.wait_all_tasks_blocked(0.05)
        first.half_close()
    second = consumer()
    async with trio.open_nursery() as nursery:
        await started(nursery, second, methods[CONSUME])
        assert [m.payload for m in await take(second, 1)] == [b"3"]
        await nothing_more(second)
        second.half_close()


async def test_a_cumulative_ack_on_a_shared_subscription_is_refused(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    call = consumer(**{"pulsar-subscription-type": "shared"})
    async with trio.open_nursery() as nursery:
        await started(nursery, call, methods[CONSUME])
        await publish(processor, b"1")
        (one,) = await take(call, 1)
        call.request(ack(one, cumulative=True))
    assert call.status is StatusCode.FAILED_PRECONDITION
    assert "cumulative" in call.message


async def test_a_negative_ack_redelivers_with_a_count(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    call = consumer()
    async with trio.open_nursery() as nursery:
        await started(nursery, call, methods[CONSUME])
        await publish(processor, b"again")
        (first,) = await take(call, 1)
        call.request(pb.Ack(negative_message_ids=[first.message_id]))
        (second,) = await take(call, 1)
        assert second.payload == b"again" and second.redelivery_count == 1
        assert second.message_id == first.message_id
        call.request(pb.Ack(negative_message_ids=[second.message_id], redelivery_delay_ms=200))
        start = trio.current_time()
        (third,) = await take(call, 1)
        assert third.redelivery_count == 2 and trio.current_time() - start >= 0.15
        call.half_close()
    assert call.status is StatusCode.OK


async def test_a_shared_subscription_spreads_messages_over_its_consumers(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    shared = {"pulsar-subscription-type": "shared", "pulsar-receiver-queue-size": "1"}
    one, two = consumer(**shared), consumer(**shared)
    async with trio.open_nursery() as nursery:
        await started(nursery, one, methods[CONSUME])
        await started(nursery, two, methods[CONSUME])
        await publish(processor, b"1", b"2")
        got = [(await take(one, 1))[0].payload, (await take(two, 1))[0].payload]
        assert sorted(got) == [b"1", b"2"]
        one.half_close()
        two.half_close()


async def test_an_exclusive_subscription_refuses_a_second_consumer(
    methods: dict[str, MethodHandler],
) -> None:
    one, two = consumer(), consumer()
    async with trio.open_nursery() as nursery:
        await started(nursery, one, methods[CONSUME])
        await two.run(methods[CONSUME])
        one.half_close()
    assert two.status is StatusCode.FAILED_PRECONDITION


async def test_a_failover_subscription_sends_to_one_consumer_then_the_other(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    failover = {"pulsar-subscription-type": "failover"}
    one = consumer(**failover, **{"pulsar-consumer-name": "a"})
    two = consumer(**failover, **{"pulsar-consumer-name": "b"})
    async with trio.open_nursery() as nursery:
        await started(nursery, one, methods[CONSUME])
        await started(nursery, two, methods[CONSUME])
        await publish(processor, b"1")
        assert [m.payload for m in await take(one, 1)] == [b"1"]
        one.half_close()
        assert [m.payload for m in await take(two, 1)] == [b"1"]
        two.half_close()


async def test_a_key_shared_subscription_keeps_a_key_on_one_consumer(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    keyed = {"pulsar-subscription-type": "key_shared"}
    one, two = consumer(**keyed), consumer(**keyed)
    one_got: list[bytes] = []
    two_got: list[bytes] = []
    all_in = trio.Event()

    async def drain(call: FakeCall, into: list[bytes]) -> None:
        async for data in call.responses:
            message = pb.Message()
            message.ParseFromString(data)
            into.append(message.payload)
            if len(one_got) + len(two_got) == 20:
                all_in.set()

    async with trio.open_nursery() as nursery:
        await started(nursery, one, methods[CONSUME])
        await started(nursery, two, methods[CONSUME])
        nursery.start_soon(drain, one, one_got)
        nursery.start_soon(drain, two, two_got)
        for n in range(20):
            await publish(processor, b"%d" % n, key=f"key-{n % 2}")
        with trio.fail_after(5):
            await all_in.wait()
        one.half_close()
        two.half_close()
    for got in (one_got, two_got):
        assert len({int(p) % 2 for p in got}) <= 1


@pytest.mark.parametrize(("position", "expected"), [("earliest", b"old"), ("latest", b"new")])
async def test_a_new_subscription_starts_at_its_initial_position(
    processor: MessagingProcessor,
    methods: dict[str, MethodHandler],
    position: str,
    expected: bytes,
) -> None:
    await publish(processor, b"old")
    call = consumer(**{"pulsar-initial-position": position})
    async with trio.open_nursery() as nursery:
        await started(nursery, call, methods[CONSUME])
        await publish(processor, b"new")
        (first,) = await take(call, 1)
        assert first.payload == expected
        call.half_close()


async def test_at_most_the_receiver_queue_is_taken_ahead_of_the_reader(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    """A client that does not read holds its consumer at the queue size (one message waiting
    to be written, the others taken behind it); the rest stay in the subscription, and
    another consumer of the shared subscription gets them."""
    queue = {"pulsar-subscription-type": "shared", "pulsar-receiver-queue-size": "5"}
    slow = consumer(**queue)
    async with trio.open_nursery() as nursery:
        await started(nursery, slow, methods[CONSUME])
        await publish(processor, *(b"%d" % n for n in range(20)))
        await trio.testing.wait_all_tasks_blocked(0.05)
        other = consumer(**{**queue, "pulsar-receiver-queue-size": "100"})
        await started(nursery, other, methods[CONSUME])
        taken_by_other = len(await take(other, 15))
        await nothing_more(other)
        assert taken_by_other == 15
        assert len(await take(slow, 5)) == 5
        slow.half_close()
        other.half_close()


async def test_bad_metadata_ends_the_call_with_invalid_argument(
    methods: dict[str, MethodHandler],
) -> None:
    call = consumer(**{"pulsar-subscription-type": "round-robin"})
    await call.run(methods[CONSUME])
    assert call.status is StatusCode.INVALID_ARGUMENT
    assert "pulsar-subscription-type" in call.message and "'key_shared'" in call.message


async def test_a_partitioned_topic_is_consumed_from_every_partition(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    """One consumer per partition, in each partition's subscription; ids say their partition,
    and an ack reaches the partition it names (the partitions' ids overlap)."""
    await processor.partitioned.create(TOPIC, 3)
    for index in range(3):
        await processor.publish(CTX, f"{TOPIC}-partition-{index}", Message(b"p%d" % index))
    first = consumer(**{"pulsar-initial-position": "earliest"})
    async with trio.open_nursery() as nursery:
        await started(nursery, first, methods[CONSUME])
        got = {m.payload: m for m in await take(first, 3)}
        assert sorted(got) == [b"p0", b"p1", b"p2"]
        for index in range(3):
            message = got[b"p%d" % index]
            assert message.message_id.partition == index
            assert message.topic == f"{TOPIC}-partition-{index}"
        first.request(ack(got[b"p0"], got[b"p2"]))
        await trio.testing.wait_all_tasks_blocked(0.05)
        first.half_close()
    assert first.status is StatusCode.OK
    second = consumer()
    async with trio.open_nursery() as nursery:
        await started(nursery, second, methods[CONSUME])
        (again,) = await take(second, 1)
        assert (again.payload, again.redelivery_count, again.message_id.partition) == (b"p1", 1, 1)
        await nothing_more(second)
        second.request(pb.Ack(message_ids=[pb.MessageId(partition=7)]))
    assert second.status is StatusCode.INVALID_ARGUMENT and "partition 7" in second.message


async def test_a_deliver_at_time_holds_a_message_back_from_a_shared_subscription(
    methods: dict[str, MethodHandler],
) -> None:
    call = consumer(**{"pulsar-subscription-type": "shared"})
    send = FakeCall(SEND, {"pulsar-topic": TOPIC})
    send.request(pb.Send(payload=b"later", deliver_at_time=now_ms() + 300))
    send.half_close()
    async with trio.open_nursery() as nursery:
        await started(nursery, call, methods[CONSUME])
        await send.run(methods[SEND])
        start = trio.current_time()
        (later,) = await take(call, 1)
        assert later.payload == b"later" and trio.current_time() - start >= 0.2
        call.half_close()


def wrap_consumers(
    processor: MessagingProcessor,
    monkeypatch: pytest.MonkeyPatch,
    wrap: Callable[[Consumer], object],
) -> None:
    """Every consumer the processor opens from now on is `wrap(consumer)`."""
    subscribe = processor.subscribe

    async def wrapped(ctx: ClientContext, spec: SubscriptionSpec) -> Consumer:
        return wrap(await subscribe(ctx, spec))  # type: ignore[return-value]

    monkeypatch.setattr(processor, "subscribe", wrapped)


class RefusingAcks:
    """A consumer whose backend cannot do a cumulative ack (a separated proxy's, for a
    message it does not hold)."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def ack_through(self, topic: str, message_id: MessageId) -> None:
        raise BackendError("not here", reason="not_supported")


async def test_an_ack_the_backend_refuses_ends_the_call_with_its_status(
    processor: MessagingProcessor,
    methods: dict[str, MethodHandler],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wrap_consumers(processor, monkeypatch, RefusingAcks)
    call = consumer()
    async with trio.open_nursery() as nursery:
        await started(nursery, call, methods[CONSUME])
        await publish(processor, b"1")
        (one,) = await take(call, 1)
        call.request(ack(one, cumulative=True))
    assert call.status is StatusCode.FAILED_PRECONDITION and "not here" in call.message


class HoldingAcks:
    """A consumer whose backend, like a separated node's, refuses a cumulative ack for a
    message it no longer holds (acknowledged already), and records the ones it does."""

    def __init__(self, consumer: Consumer, acked: list[MessageId]) -> None:
        self._consumer = consumer
        self._acked = acked

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def ack_through(self, topic: str, message_id: MessageId) -> None:
        if self._acked and message_id <= self._acked[-1]:
            raise BackendError("no longer held", reason="not_supported")
        self._acked.append(message_id)
        self._consumer.ack_through(topic, message_id)


async def test_a_repeated_or_stale_cumulative_ack_is_a_no_op(
    processor: MessagingProcessor,
    methods: dict[str, MethodHandler],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    acked: list[MessageId] = []
    wrap_consumers(processor, monkeypatch, lambda consumer: HoldingAcks(consumer, acked))
    call = consumer()
    async with trio.open_nursery() as nursery:
        await started(nursery, call, methods[CONSUME])
        await publish(processor, b"1", b"2", b"3")
        one, two, three = await take(call, 3)
        call.request(ack(two, cumulative=True))
        call.request(ack(two, cumulative=True))
        call.request(ack(one, cumulative=True))
        # Past the last message given: through the last one given.
        beyond = pb.Message()
        beyond.CopyFrom(three)
        beyond.message_id.entry_id += 100
        call.request(ack(beyond, cumulative=True))
        await trio.testing.wait_all_tasks_blocked(0.05)
        call.half_close()
    assert call.status is StatusCode.OK, call.message
    assert [(m.ledger, m.entry) for m in acked] == [
        (two.message_id.ledger_id, two.message_id.entry_id),
        (three.message_id.ledger_id, three.message_id.entry_id),
    ]


class CountingReceives:
    """A consumer that counts the messages taken from it."""

    def __init__(self, consumer: Consumer, taken: list[int]) -> None:
        self._consumer = consumer
        self._taken = taken

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    async def receive(self, max_messages: int) -> list[Any]:
        deliveries = await self._consumer.receive(max_messages)
        self._taken.append(len(deliveries))
        return deliveries


async def test_no_more_is_taken_while_max_unwritten_bytes_wait_for_the_client(
    processor: MessagingProcessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: list[int] = []
    wrap_consumers(processor, monkeypatch, lambda consumer: CountingReceives(consumer, taken))
    consuming = Consuming(
        processor,
        Namespaces("public", "default"),
        processor.stats.protocol("grpc"),
        max_unwritten_bytes=1000,
    )
    call = consumer()
    async with trio.open_nursery() as nursery:
        await started(nursery, call, consuming.consume)
        # The client reads nothing: the first message waits to be written, the second takes
        # the call over its budget, and the others stay with the consumer.
        for n in range(4):
            await publish(processor, b"%d" % n * 600)
            await trio.testing.wait_all_tasks_blocked(0.05)
        assert sum(taken) == 2
        assert [m.payload[:1] for m in await take(call, 4)] == [b"0", b"1", b"2", b"3"]
        assert sum(taken) == 4
        call.half_close()
    assert call.status is StatusCode.OK


async def test_no_more_is_sent_while_max_unacked_messages_are_outstanding(
    processor: MessagingProcessor,
) -> None:
    consuming = Consuming(
        processor, Namespaces("public", "default"), processor.stats.protocol("grpc"), max_unacked=3
    )
    call = consumer()
    async with trio.open_nursery() as nursery:
        await started(nursery, call, consuming.consume)
        await publish(processor, *(b"%d" % n for n in range(6)))
        first = await take(call, 3)
        await nothing_more(call)
        call.request(ack(first[0]))
        assert [m.payload for m in await take(call, 1)] == [b"3"]
        await nothing_more(call)
        call.request(ack(*first[1:]))
        assert [m.payload for m in await take(call, 2)] == [b"4", b"5"]
        call.half_close()
    assert call.status is StatusCode.OK
