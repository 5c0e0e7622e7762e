"""The Pulsar adapter over in-memory streams (no sockets) on a virtual clock: keepalive, the
connect timeout, answers that keep the connection, and the producer/consumer plumbing."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import cast

import pytest
import trio
import trio.testing

from mop.backends.local import open_local_backend
from mop.broker.storage.memory import MemoryStorage
from mop.overload.guard import OverloadGuard
from mop.processor import (
    BackendError,
    ClientContext,
    MessagingProcessor,
    ProducerSpec,
    PublishResult,
)
from mop.processor import Producer as ProcessorProducer
from mop.protocols.pulsar.commands import (
    Ack,
    AckResponse,
    AckType,
    ActiveConsumerChange,
    CloseConsumer,
    CloseProducer,
    Command,
    Connect,
    Connected,
    Error,
    Flow,
    GetLastMessageId,
    GetLastMessageIdResponse,
    Message,
    Ping,
    Pong,
    Producer,
    ProducerAccessMode,
    ProducerSuccess,
    Seek,
    Send,
    SendError,
    SendReceipt,
    Subscribe,
    SubType,
    Success,
    Unsubscribe,
)
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.frames import (
    Frame,
    FrameDecoder,
    NeedData,
    encode_batch,
    encode_command,
    make_payload,
)
from mop.protocols.pulsar.metadata import (
    BatchEntry,
    KeyValue,
    MessageIdData,
    MessageMetadata,
    SingleMessageMetadata,
)
from mop.protocols.pulsar.serving.server import PulsarServer, Timers
from mop.settings import LimitsSettings, Settings
from mop.transport import ConnectionInfo

INFO = ConnectionInfo(transport="tcp", local=("127.0.0.1", 6650), peer=("127.0.0.1", 5000))
TOPIC = "persistent://public/default/memory"


class Peer:
    """The client end of an in-memory connection, speaking through mop's codec."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder(max_frame_size=64 << 20)

    async def send(self, command: Command) -> None:
        await self.stream.send_all(encode_command(command))

    async def recv(self, within: float = 5) -> Frame | None:
        with trio.fail_after(within):
            while True:
                frame = self.decoder.next_frame()
                if not isinstance(frame, NeedData):
                    return frame
                data = await self.stream.receive_some(65536)
                if not data:
                    return None
                self.decoder.feed(data)

    async def connect(self) -> Connected:
        await self.send(Connect(client_version="memory", protocol_version=20))
        answer = await self.recv()
        assert isinstance(answer, Connected), answer
        return answer


@asynccontextmanager
async def pulsar_server(
    timers: Timers | None = None, *, limits: LimitsSettings | None = None
) -> AsyncIterator[tuple[PulsarServer, trio.Nursery]]:
    settings = Settings(protocols=("pulsar",))
    async with open_local_backend(MemoryStorage()) as backend, trio.open_nursery() as nursery:
        overload = OverloadGuard(limits) if limits is not None else None
        server = PulsarServer(settings, MessagingProcessor(backend, overload=overload), timers)
        await nursery.start(server.serve)
        yield server, nursery
        nursery.cancel_scope.cancel()


def open_peer(server: PulsarServer, nursery: trio.Nursery) -> Peer:
    client, served = trio.testing.memory_stream_pair()

    async def serve() -> None:
        # What the transport does: the stream closes when the handler returns.
        async with served:
            await server.handle_connection(served, INFO)

    nursery.start_soon(serve)
    return Peer(client)


async def test_a_silent_client_is_pinged_then_dropped(autojump_clock: trio.abc.Clock) -> None:
    async with pulsar_server(Timers(keepalive_interval=30)) as (server, nursery):
        peer = open_peer(server, nursery)
        await peer.connect()
        start = trio.current_time()
        assert isinstance(await peer.recv(within=40), Ping)
        assert 29 < trio.current_time() - start < 31
        assert await peer.recv(within=40) is None  # silent for a second interval
        assert 59 < trio.current_time() - start < 61


async def test_a_client_that_answers_pings_stays(autojump_clock: trio.abc.Clock) -> None:
    async with pulsar_server(Timers(keepalive_interval=30)) as (server, nursery):
        peer = open_peer(server, nursery)
        await peer.connect()
        for _ in range(5):
            # Silent for an interval: PING; the PONG counts as life, so the next comes later.
            assert isinstance(await peer.recv(within=70), Ping)
            await peer.send(Pong())
        await peer.send(Ping())
        assert isinstance(await peer.recv(), Pong)


async def test_a_client_held_back_over_its_rate_is_not_dropped(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Held back for 300 s (ten keepalive intervals) by a batch of 301 messages at 1 a second,
    a client is not dropped as silent; it is sent a PONG every half interval, which keeps its
    own keepalive content while its PINGs wait unread, and it is served again after."""
    limits = LimitsSettings(client_message_rate=1.0)
    async with pulsar_server(Timers(keepalive_interval=30), limits=limits) as (server, nursery):
        peer = open_peer(server, nursery)
        await peer.connect()
        await peer.send(Producer(topic=TOPIC, producer_id=1, request_id=100))
        assert isinstance(await peer.recv(), ProducerSuccess)
        entries = [BatchEntry(SingleMessageMetadata(payload_size=1), b"x") for _ in range(301)]
        meta = MessageMetadata(
            producer_name="p", sequence_id=0, publish_time=5, num_messages_in_batch=301
        )
        payload = make_payload(meta, encode_batch(entries))
        await peer.send(Send(producer_id=1, sequence_id=0, num_messages=301, payload=payload))
        started = trio.current_time()
        assert isinstance(await peer.recv(), SendReceipt)
        await peer.send(Ping())  # unanswered until the hold is over
        frames: list[tuple[float, Frame | None]] = []
        with trio.move_on_after(305):
            while True:
                frame = await peer.recv(within=400)
                frames.append((trio.current_time() - started, frame))
                if frame is None:
                    break
        assert frames, "nothing sent during the hold"
        assert all(isinstance(frame, Pong) for _, frame in frames), frames
        # Every half interval during the hold, then the answer to the PING sent before it.
        times = [at for at, _ in frames]
        assert len(times) >= 20 and times[-1] > 299
        assert all(later - earlier <= 15.5 for earlier, later in itertools.pairwise(times))
        await peer.send(Ping())
        assert isinstance(await peer.recv(), Pong)


async def test_no_connect_in_time_closes(autojump_clock: trio.abc.Clock) -> None:
    async with pulsar_server(Timers(connect_timeout=10)) as (server, nursery):
        peer = open_peer(server, nursery)
        start = trio.current_time()
        assert await peer.recv(within=20) is None
        assert 9 < trio.current_time() - start < 11


async def test_errors_are_answers_and_the_connection_goes_on() -> None:
    async with pulsar_server() as (server, nursery):
        peer = open_peer(server, nursery)
        await peer.connect()
        await peer.send(Seek(consumer_id=9, request_id=1))
        error = await peer.recv()
        assert isinstance(error, Error)
        assert (error.request_id, error.error) == (1, ServerError.ConsumerNotFound)
        await peer.send(Unsubscribe(consumer_id=9, request_id=2))
        assert isinstance(await peer.recv(), Error)
        await peer.send(CloseConsumer(consumer_id=9, request_id=3))
        assert await peer.recv() == Success(request_id=3)
        await peer.send(CloseProducer(producer_id=9, request_id=4))
        assert await peer.recv() == Success(request_id=4)
        await peer.send(Producer(topic="persistent://nobody/ns/t", producer_id=1, request_id=5))
        refused = await peer.recv()
        assert isinstance(refused, Error) and refused.error is ServerError.TopicNotFound
        await peer.send(Ping())
        assert isinstance(await peer.recv(), Pong)


async def _produce(peer: Peer, *payloads: bytes) -> list[SendReceipt]:
    await peer.send(Producer(topic=TOPIC, producer_id=1, request_id=100))
    assert isinstance(await peer.recv(), ProducerSuccess)
    receipts = []
    for seq, payload in enumerate(payloads):
        meta = MessageMetadata(producer_name="p", sequence_id=seq, publish_time=seq + 1)
        await peer.send(Send(producer_id=1, sequence_id=seq, payload=make_payload(meta, payload)))
        receipt = await peer.recv()
        assert isinstance(receipt, SendReceipt), receipt
        receipts.append(receipt)
    return receipts


async def _subscribe(peer: Peer, consumer_id: int, sub_type: SubType = SubType.Exclusive) -> None:
    await peer.send(
        Subscribe(
            topic=TOPIC,
            subscription="s",
            sub_type=sub_type,
            consumer_id=consumer_id,
            request_id=200 + consumer_id,
        )
    )
    assert await peer.recv() == Success(request_id=200 + consumer_id)


async def test_messages_wait_for_permits_and_use_one_per_message() -> None:
    async with pulsar_server() as (server, nursery):
        peer = open_peer(server, nursery)
        await peer.connect()
        await _subscribe(peer, 1)
        await _produce(peer, b"a", b"b", b"c")
        with trio.move_on_after(0.2):
            unexpected = await peer.recv()
            raise AssertionError(f"sent before any FLOW: {unexpected}")
        await peer.send(Flow(consumer_id=1, message_permits=2))
        first, second = await peer.recv(), await peer.recv()
        assert isinstance(first, Message) and isinstance(second, Message)
        assert first.payload is not None and first.payload.data == b"a"
        with trio.move_on_after(0.2):
            unexpected = await peer.recv()
            raise AssertionError(f"sent beyond the permits: {unexpected}")
        await peer.send(Flow(consumer_id=1, message_permits=1))
        third = await peer.recv()
        assert isinstance(third, Message) and third.payload is not None
        assert third.payload.data == b"c"


async def test_a_batch_entry_is_forwarded_byte_for_byte() -> None:
    async with pulsar_server() as (server, nursery):
        peer = open_peer(server, nursery)
        await peer.connect()
        await _subscribe(peer, 1)
        entries = [
            BatchEntry(
                SingleMessageMetadata(
                    payload_size=1, properties=(KeyValue(key="i", value=str(i)),)
                ),
                str(i).encode(),
            )
            for i in range(3)
        ]
        meta = MessageMetadata(
            producer_name="p", sequence_id=0, publish_time=5, num_messages_in_batch=3
        )
        payload = make_payload(meta, encode_batch(entries))
        await peer.send(Producer(topic=TOPIC, producer_id=1, request_id=100))
        assert isinstance(await peer.recv(), ProducerSuccess)
        await peer.send(Send(producer_id=1, sequence_id=0, num_messages=3, payload=payload))
        assert isinstance(await peer.recv(), SendReceipt)
        await peer.send(Flow(consumer_id=1, message_permits=1))
        delivered = await peer.recv()
        assert isinstance(delivered, Message) and delivered.payload is not None
        assert delivered.payload.raw == payload.raw
        assert delivered.payload.checksum == payload.checksum


async def test_ack_receipts_and_last_message_id() -> None:
    async with pulsar_server() as (server, nursery):
        peer = open_peer(server, nursery)
        await peer.connect()
        await _subscribe(peer, 1)
        receipts = await _produce(peer, b"a", b"b")
        await peer.send(Flow(consumer_id=1, message_permits=10))
        delivered = [await peer.recv(), await peer.recv()]
        assert all(isinstance(m, Message) for m in delivered)
        last = receipts[-1].message_id
        assert last is not None
        await peer.send(
            Ack(consumer_id=1, ack_type=AckType.Cumulative, message_id=(last,), request_id=7)
        )
        assert await peer.recv() == AckResponse(consumer_id=1, request_id=7)
        await peer.send(GetLastMessageId(consumer_id=1, request_id=8))
        answer = await peer.recv()
        assert isinstance(answer, GetLastMessageIdResponse)
        assert (answer.last_message_id.ledger_id, answer.last_message_id.entry_id) == (
            last.ledger_id,
            last.entry_id,
        )
        mark = answer.consumer_mark_delete_position
        assert mark is not None and (mark.ledger_id, mark.entry_id) == (
            last.ledger_id,
            last.entry_id,
        )


async def test_seek_closes_the_consumer_before_answering() -> None:
    async with pulsar_server() as (server, nursery):
        peer = open_peer(server, nursery)
        await peer.connect()
        await _subscribe(peer, 1)
        await _produce(peer, b"a")
        earliest = MessageIdData(ledger_id=(1 << 64) - 1, entry_id=(1 << 64) - 1)
        await peer.send(Seek(consumer_id=1, request_id=9, message_id=earliest))
        closed = await peer.recv()
        assert isinstance(closed, CloseConsumer) and closed.consumer_id == 1
        assert await peer.recv() == Success(request_id=9)


async def test_wait_for_exclusive_is_queued_then_ready() -> None:
    async with pulsar_server() as (server, nursery):
        holder = open_peer(server, nursery)
        await holder.connect()
        await holder.send(
            Producer(
                topic=TOPIC,
                producer_id=1,
                request_id=1,
                producer_access_mode=ProducerAccessMode.Exclusive,
            )
        )
        held = await holder.recv()
        assert isinstance(held, ProducerSuccess) and held.topic_epoch is not None
        waiter = open_peer(server, nursery)
        await waiter.connect()
        await waiter.send(
            Producer(
                topic=TOPIC,
                producer_id=1,
                request_id=2,
                producer_access_mode=ProducerAccessMode.WaitForExclusive,
            )
        )
        queued = await waiter.recv()
        assert isinstance(queued, ProducerSuccess) and not queued.producer_ready
        await holder.send(CloseProducer(producer_id=1, request_id=3))
        assert await holder.recv() == Success(request_id=3)
        ready = await waiter.recv()
        assert isinstance(ready, ProducerSuccess) and ready.producer_ready
        assert ready.topic_epoch is not None and ready.topic_epoch > held.topic_epoch


async def test_failover_consumers_hear_which_one_is_active() -> None:
    async with pulsar_server() as (server, nursery):
        peer = open_peer(server, nursery)
        await peer.connect()
        for consumer_id, name in ((1, "b"), (2, "a")):
            await peer.send(
                Subscribe(
                    topic=TOPIC,
                    subscription="f",
                    sub_type=SubType.Failover,
                    consumer_id=consumer_id,
                    request_id=consumer_id,
                    consumer_name=name,
                )
            )
        frames = [await peer.recv() for _ in range(5)]
        assert frames[0] == Success(request_id=1)
        assert ActiveConsumerChange(consumer_id=1, is_active=True) in frames
        assert ActiveConsumerChange(consumer_id=2, is_active=True) in frames
        assert ActiveConsumerChange(consumer_id=1, is_active=False) in frames
        await peer.send(CloseConsumer(consumer_id=2, request_id=9))
        rest = [await peer.recv(), await peer.recv()]
        assert Success(request_id=9) in rest
        assert ActiveConsumerChange(consumer_id=1, is_active=True) in rest


class _TooLarge:
    """A producer whose sends fail as a separated proxy's do for a message larger than its
    brokers take (reason "too_large"), at once or once stored."""

    def __init__(self, inner: ProcessorProducer) -> None:
        self._inner = inner
        self.spec = inner.spec

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def send(self, message: object, **ids: int) -> Awaitable[PublishResult]:
        if ids["sequence_id"] == 0:
            raise BackendError("too large for the brokers", reason="too_large")

        async def refused() -> PublishResult:
            raise BackendError("too large for the brokers", reason="too_large")

        return refused()


async def test_a_message_too_large_for_the_backend_is_not_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NotAllowedError makes a Java client fail the send; the errors it sends again after
    (UnknownError, PersistenceError) would bring it back forever."""
    async with pulsar_server() as (server, nursery):
        processor = server.processor
        opened = processor.open_producer

        async def open_producer(ctx: ClientContext, spec: ProducerSpec) -> ProcessorProducer:
            return cast(ProcessorProducer, _TooLarge(await opened(ctx, spec)))

        monkeypatch.setattr(processor, "open_producer", open_producer)
        peer = open_peer(server, nursery)
        await peer.connect()
        await peer.send(Producer(topic=TOPIC, producer_id=1, request_id=100))
        assert isinstance(await peer.recv(), ProducerSuccess)
        for seq in (0, 1):
            meta = MessageMetadata(producer_name="p", sequence_id=seq, publish_time=1)
            payload = make_payload(meta, b"large")
            await peer.send(Send(producer_id=1, sequence_id=seq, payload=payload))
            refused = await peer.recv()
            assert isinstance(refused, SendError) and refused.sequence_id == seq
            assert refused.error is ServerError.NotAllowedError
