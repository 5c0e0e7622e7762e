"""The produce method: results in order, deduplication, refused messages, back-pressure."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from mop.message import MessageId
from mop.processor import (
    BackendError,
    ClientContext,
    MessagingProcessor,
    Producer,
    ProducerSpec,
    StartPosition,
    SubscriptionSpec,
)
from mop.protocols.grpc.proto import mop_grpc_pb2 as pb
from mop.protocols.grpc.serving.calls import MethodHandler
from mop.protocols.grpc.serving.pulsar_service import PRODUCE
from mop.protocols.grpc.status import StatusCode
from tests.unit.protocols.grpc.serving.conftest import FakeCall

TOPIC = "persistent://public/default/produced"
CTX = ClientContext(client_id="reader", protocol="test")


async def stored(processor: MessagingProcessor, topic: str = TOPIC) -> list[bytes]:
    reader = await processor.subscribe(
        CTX, SubscriptionSpec("r", frozenset([topic]), start=StartPosition.EARLIEST)
    )
    with trio.move_on_after(0.2):
        found: list[bytes] = []
        while True:
            found += [d.message.payload for d in await reader.receive(100)]
    await reader.close()
    return found


async def test_results_come_in_the_order_of_the_sends(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    call = FakeCall(PRODUCE, {"pulsar-topic": TOPIC, "pulsar-producer-name": "p"})
    for n in range(1, 51):
        call.request(pb.Send(payload=b"m%d" % n, sequence_id=n))
    call.half_close()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call.run, methods[PRODUCE])
        results = [await call.response(pb.SendResult) for _ in range(50)]
    assert call.status is StatusCode.OK
    assert [r.sequence_id for r in results] == list(range(1, 51))
    ids = [MessageId(r.message_id.ledger_id, r.message_id.entry_id) for r in results]
    assert ids == sorted(ids) and len(set(ids)) == 50
    assert await stored(processor) == [b"m%d" % n for n in range(1, 51)]


async def test_a_named_producer_is_deduplicated_by_sequence_id(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    for payloads in ([b"a", b"b"], [b"b-again", b"c"]):
        call = FakeCall(PRODUCE, {"pulsar-topic": TOPIC, "pulsar-producer-name": "dedup"})
        first = 1 if payloads[0] == b"a" else 2
        for offset, payload in enumerate(payloads):
            call.request(pb.Send(payload=payload, sequence_id=first + offset))
        call.half_close()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call.run, methods[PRODUCE])
            results = [await call.response(pb.SendResult) for _ in payloads]
        assert call.status is StatusCode.OK
        assert all(r.HasField("message_id") for r in results)
    # Sequence id 2 came twice: stored once, the second answered with Pulsar's (-1, -1).
    assert results[0].message_id.ledger_id == -1 and results[0].message_id.entry_id == -1
    assert await stored(processor) == [b"a", b"b", b"c"]


async def test_a_refused_message_gets_an_error_and_the_stream_goes_on(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    call = FakeCall(PRODUCE, {"pulsar-topic": TOPIC})
    call.request(pb.Send(payload=b"one", sequence_id=1))
    call.request(pb.Send(payload=b"bad", sequence_id=1 << 63))  # above int64
    call.request(pb.Send(payload=b"two", sequence_id=3))
    call.half_close()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call.run, methods[PRODUCE])
        results = [await call.response(pb.SendResult) for _ in range(3)]
    assert call.status is StatusCode.OK
    assert [r.WhichOneof("result") for r in results] == ["message_id", "error", "message_id"]
    assert results[1].error.code == StatusCode.INVALID_ARGUMENT
    assert results[1].sequence_id == 1 << 63
    assert await stored(processor) == [b"one", b"two"]


async def test_a_request_that_is_no_send_ends_the_call_after_the_results_owed(
    methods: dict[str, MethodHandler],
) -> None:
    call = FakeCall(PRODUCE, {"pulsar-topic": TOPIC})
    call.request(pb.Send(payload=b"one", sequence_id=1))
    call.raw_request(b"\xff\xff\xff")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call.run, methods[PRODUCE])
        result = await call.response(pb.SendResult)
    assert result.sequence_id == 1 and result.HasField("message_id")
    assert call.status is StatusCode.INVALID_ARGUMENT


async def test_a_producer_that_outruns_its_reader_stops_being_read(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    """Results wait for the client's window: at most `max_outstanding` Sends are taken
    beyond the results written, so the rest stay unread (the server withholds the
    client's HTTP/2 window)."""
    bound = 1000  # DEFAULT_MAX_OUTSTANDING
    call = FakeCall(PRODUCE, {"pulsar-topic": TOPIC}, window=0)
    for n in range(1, bound + 200):
        call.request(pb.Send(payload=b"x", sequence_id=n))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call.run, methods[PRODUCE])
        await trio.testing.wait_all_tasks_blocked(0.05)
        # `bound` results are owed (the first one waits to be written): no more is read.
        assert call.received == bound
        first = await call.response(pb.SendResult)
        assert first.sequence_id == 1
        await trio.testing.wait_all_tasks_blocked(0.05)
        assert call.received == bound + 1
        nursery.cancel_scope.cancel()


async def test_large_sends_are_held_back_by_their_bytes_too(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    """Far fewer than `max_outstanding` Sends are taken when they are large: the bytes owed
    are bounded too (16 MiB; a 1 MiB Send past the bound is read once one is answered)."""
    payload = b"x" * (1 << 20)
    call = FakeCall(PRODUCE, {"pulsar-topic": TOPIC}, window=0)
    for n in range(1, 41):
        call.request(pb.Send(payload=payload, sequence_id=n))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call.run, methods[PRODUCE])
        await trio.testing.wait_all_tasks_blocked(0.05)
        assert call.received == 16  # 16 MiB of Sends owed: the 17th is not read
        first = await call.response(pb.SendResult)
        assert first.sequence_id == 1
        await trio.testing.wait_all_tasks_blocked(0.05)
        assert call.received == 17
        nursery.cancel_scope.cancel()


async def test_an_exclusive_producer_refuses_a_second_one(
    methods: dict[str, MethodHandler],
) -> None:
    first = FakeCall(PRODUCE, {"pulsar-topic": TOPIC, "pulsar-producer-access-mode": "exclusive"})
    second = FakeCall(PRODUCE, {"pulsar-topic": TOPIC})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(first.run, methods[PRODUCE])
        await trio.testing.wait_all_tasks_blocked(0.05)
        await second.run(methods[PRODUCE])
        first.half_close()
    assert second.status is StatusCode.ALREADY_EXISTS
    assert first.status is StatusCode.OK


async def test_a_fenced_producer_ends_with_aborted(methods: dict[str, MethodHandler]) -> None:
    fencing = {"pulsar-topic": TOPIC, "pulsar-producer-access-mode": "exclusive_with_fencing"}
    first = FakeCall(PRODUCE, fencing)
    second = FakeCall(PRODUCE, fencing)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(first.run, methods[PRODUCE])
        await trio.testing.wait_all_tasks_blocked(0.05)
        nursery.start_soon(second.run, methods[PRODUCE])
        with trio.fail_after(5):
            await first.done.wait()
        second.half_close()
    assert first.status is StatusCode.ABORTED
    assert second.status is StatusCode.OK


async def test_a_partitioned_topic_gets_messages_on_every_partition_and_a_key_on_one(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    await processor.partitioned.create(TOPIC, 3)
    call = FakeCall(PRODUCE, {"pulsar-topic": TOPIC})
    for n in range(6):
        call.request(pb.Send(payload=b"rr%d" % n))
    for n in range(4):
        call.request(pb.Send(payload=b"k%d" % n, key="same-key"))
    call.half_close()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call.run, methods[PRODUCE])
        results = [await call.response(pb.SendResult) for _ in range(10)]
    assert [r.message_id.partition for r in results[:6]] == [0, 1, 2, 0, 1, 2]
    assert len({r.message_id.partition for r in results[6:]}) == 1
    partitions = [await stored(processor, f"{TOPIC}-partition-{i}") for i in range(3)]
    assert [sorted(p for p in found if p.startswith(b"rr")) for found in partitions] == [
        [b"rr0", b"rr3"],
        [b"rr1", b"rr4"],
        [b"rr2", b"rr5"],
    ]
    keyed = [[p for p in found if p.startswith(b"k")] for found in partitions]
    assert sorted(keyed, key=len)[-1] == [b"k0", b"k1", b"k2", b"k3"]


async def no_registered_producers(ctx: ClientContext, spec: ProducerSpec) -> Producer:
    raise BackendError("registered producers are not available here", reason="not_supported")


async def test_without_registered_producers_sends_are_published_in_order(
    processor: MessagingProcessor,
    methods: dict[str, MethodHandler],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As on a separated proxy: published through the processor, in runs, still in order."""
    monkeypatch.setattr(processor, "open_producer", no_registered_producers)
    call = FakeCall(PRODUCE, {"pulsar-topic": TOPIC, "pulsar-producer-name": "named"})
    for n in range(1, 31):
        call.request(pb.Send(payload=b"m%d" % n, sequence_id=n))
    call.request(pb.Send(payload=b"last", sequence_id=99))
    call.half_close()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call.run, methods[PRODUCE])
        results = [await call.response(pb.SendResult) for _ in range(31)]
    assert call.status is StatusCode.OK
    assert [r.sequence_id for r in results] == [*range(1, 31), 99]
    ids = [MessageId(r.message_id.ledger_id, r.message_id.entry_id) for r in results]
    assert ids == sorted(ids) and len(set(ids)) == 31
    found = await stored(processor)
    assert found[:30] == [b"m%d" % n for n in range(1, 31)]
    assert processor.stats.protocol("grpc").messages_received == 31


async def test_without_registered_producers_only_shared_access_is_had(
    processor: MessagingProcessor,
    methods: dict[str, MethodHandler],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(processor, "open_producer", no_registered_producers)
    call = FakeCall(PRODUCE, {"pulsar-topic": TOPIC, "pulsar-producer-access-mode": "exclusive"})
    await call.run(methods[PRODUCE])
    assert call.status is StatusCode.FAILED_PRECONDITION
    assert "'exclusive' needs a registered producer" in call.message


async def test_a_wait_for_exclusive_producer_sends_once_the_topic_is_free(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    exclusive = FakeCall(
        PRODUCE, {"pulsar-topic": TOPIC, "pulsar-producer-access-mode": "exclusive"}
    )
    waiting = FakeCall(
        PRODUCE, {"pulsar-topic": TOPIC, "pulsar-producer-access-mode": "wait_for_exclusive"}
    )
    waiting.request(pb.Send(payload=b"after"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(exclusive.run, methods[PRODUCE])
        await trio.testing.wait_all_tasks_blocked(0.05)
        nursery.start_soon(waiting.run, methods[PRODUCE])
        await trio.testing.wait_all_tasks_blocked(0.05)
        assert waiting.received == 0  # not reading until it has the topic
        exclusive.request(pb.Send(payload=b"first"))
        assert (await exclusive.response(pb.SendResult)).HasField("message_id")
        exclusive.half_close()
        assert (await waiting.response(pb.SendResult)).HasField("message_id")
        waiting.half_close()
    assert (exclusive.status, waiting.status) == (StatusCode.OK, StatusCode.OK)
    assert await stored(processor) == [b"first", b"after"]
