"""The produce and send methods: a Pulsar producer per call.

`produce` stores each Send as it arrives, behind those before it, and answers with one
SendResult per Send in their order once each is stored; up to `max_outstanding` Sends, and
`max_outstanding_bytes` of their payloads, are in flight at once, and past that the call stops
reading requests, so the server withholds the client's HTTP/2 window (back-pressure, bounded
memory). Without registered producers (see `producers`), the Sends waiting when the answering
task comes round are published together, with one wait for durability. A Send the node
refuses gets a SendResult with an error and the stream goes on; what refuses the producer
itself (its name or topic is taken, it was fenced) ends the call with a status. `send` stores
one Send.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Final

import trio
from google.protobuf.message import DecodeError

from mop.clock import now_ms
from mop.counters import Drop
from mop.message import Message
from mop.processor import BackendError, MessagingProcessor, PublishResult
from mop.processor.tracing import PublishTrace
from mop.protocols.grpc.errors import backend_status
from mop.protocols.grpc.mapping import (
    message_from_send,
    refused_result,
    sequence_id_of,
    stored_result,
)
from mop.protocols.grpc.metadata import producer_open
from mop.protocols.grpc.proto import mop_grpc_pb2 as pb
from mop.protocols.grpc.serving.calls import Call
from mop.protocols.grpc.serving.clients import CallClient, Namespaces, open_call_client
from mop.protocols.grpc.serving.producers import ProducerNames, TopicProducer, open_topic_producer
from mop.protocols.grpc.status import GrpcError, StatusCode
from mop.protocols.mqtt.mapping import with_properties
from mop.security.acl import Access

log = logging.getLogger("mop.grpc")

# Sends stored and not yet answered, per produce call, before the call stops reading.
DEFAULT_MAX_OUTSTANDING: Final = 1000
# The same bound in bytes (of the Sends as they came): 1000 Sends of the largest size a call
# may send would be gigabytes.
DEFAULT_MAX_OUTSTANDING_BYTES: Final = 16 * 1024 * 1024
# Results sent together at most (the Sends of a run are published with one wait).
_RUN: Final = 1000
_OVERLOADED: Final = GrpcError(
    StatusCode.RESOURCE_EXHAUSTED, "the node is over its memory high-water mark: try again later"
)
_FENCED: Final = "another producer took the topic over (exclusive_with_fencing)"


@dataclass(slots=True)
class _Pending:
    """A Send whose result goes out next: stored by a registered producer (`stored`, to wait
    for), to publish through the processor (`publish`), or refused (`error`)."""

    sequence_id: int
    # The size of the Send as it came, held against the call's bound until it is answered.
    size: int = 0
    # The partition it goes to (0 for a topic without partitions).
    partition: int = 0
    stored: Awaitable[PublishResult] | None = None
    publish: tuple[str, Message] | None = None
    # What publishing it gave (see `Producing._publish`).
    published: PublishResult | None = None
    error: GrpcError | None = None
    # The message's trace (see `MessageTracing`), ended with its result.
    trace: PublishTrace | None = None


def decode_send(data: bytes) -> pb.Send:
    send = pb.Send()
    try:
        send.ParseFromString(data)
    except DecodeError:
        raise GrpcError(StatusCode.INVALID_ARGUMENT, "the request is not a Send message") from None
    return send


class Producing:
    """What the produce and send calls of a node share."""

    def __init__(
        self,
        processor: MessagingProcessor,
        namespaces: Namespaces,
        *,
        max_outstanding: int = DEFAULT_MAX_OUTSTANDING,
        max_outstanding_bytes: int = DEFAULT_MAX_OUTSTANDING_BYTES,
    ) -> None:
        self.processor = processor
        self.namespaces = namespaces
        self.max_outstanding = max_outstanding
        self.max_outstanding_bytes = max_outstanding_bytes
        self.names = ProducerNames()

    # -- send ------------------------------------------------------------------------------

    async def send(self, call: Call) -> None:
        request = producer_open(call.metadata)
        data = await call.receive()
        if data is None:
            raise GrpcError(StatusCode.INVALID_ARGUMENT, "send takes one Send message")
        # A unary call is one message then the half-close (which gRPC clients send with the
        # message): a second message is refused, not stored without an answer.
        if await call.receive() is not None:
            raise GrpcError(StatusCode.INVALID_ARGUMENT, "send takes one Send message, not more")
        send = decode_send(data)
        async with open_call_client(self.processor, self.namespaces, call) as client:
            topic = client.topic(request.topic, Access.WRITE)
            async with open_topic_producer(
                self.processor, client.ctx, topic, request, self.names
            ) as producer:
                await producer.wait_ready()
                item = self._store(client, producer, send)
                await self._publish(client, [item])
                result = await self._result(item)
                if result.HasField("error"):
                    raise GrpcError(StatusCode(result.error.code), result.error.message)
                # Before the client and its producer are let go (a separated proxy's release
                # of the client id is a write on its brokers): the answer does not wait for it.
                await self._reply(call, result)

    # -- produce ---------------------------------------------------------------------------

    async def produce(self, call: Call) -> None:
        request = producer_open(call.metadata)
        async with open_call_client(self.processor, self.namespaces, call) as client:
            topic = client.topic(request.topic, Access.WRITE)
            async with open_topic_producer(
                self.processor, client.ctx, topic, request, self.names
            ) as producer:
                await producer.wait_ready()
                await self._produce(call, client, producer)

    async def _produce(self, call: Call, client: CallClient, producer: TopicProducer) -> None:
        """Read Sends and store them while the results go out in order; end once the client
        half-closed and every result is out, with ABORTED when the producer is fenced, or
        with INVALID_ARGUMENT after the results owed for a request that is no Send."""
        # A result owed holds one of these: the reader waits for one before it reads a Send.
        owed = _Owed(self.max_outstanding, self.max_outstanding_bytes)
        send, receive = trio.open_memory_channel[_Pending](math.inf)
        fenced = False
        refused: GrpcError | None = None
        async with trio.open_nursery() as calls:

            async def watch_fence() -> None:
                nonlocal fenced
                await producer.wait_fenced()
                log.info("%s: producer %r was fenced", call.peer, producer.name)
                fenced = True
                calls.cancel_scope.cancel()

            calls.start_soon(watch_fence)
            async with trio.open_nursery() as answers:
                answers.start_soon(self._answer, call, client, receive, owed)
                try:
                    await self._read(call, client, producer, send, owed)
                except GrpcError as exc:
                    refused = exc  # after the results owed for the Sends before it
            calls.cancel_scope.cancel()
        if fenced:
            raise GrpcError(StatusCode.ABORTED, _FENCED)
        if refused is not None:
            raise refused

    async def _read(
        self,
        call: Call,
        client: CallClient,
        producer: TopicProducer,
        pending: trio.MemorySendChannel[_Pending],
        owed: _Owed,
    ) -> None:
        overload = self.processor.overload
        budget_key = f"grpc {client.ctx.peer.rpartition(':')[0]} {client.ctx.principal.display}"
        rates = None if client.ctx.principal.is_proxy else overload.client_rates(budget_key)
        try:
            async with pending:
                while True:
                    await owed.acquire()
                    data = await call.receive()
                    if data is None:
                        return
                    item = self._store(client, producer, decode_send(data))
                    item.size = len(data)
                    owed.hold(item.size)
                    pending.send_nowait(item)
                    if rates is not None:
                        pause = rates.charge(1, len(data), trio.current_time())
                        if pause:
                            await overload.throttle(pause, call.peer)
        finally:
            overload.client_left(budget_key, rates)

    def _store(self, client: CallClient, producer: TopicProducer, send: pb.Send) -> _Pending:
        """Hand `send` to the producer (it takes its place at once) and say what to answer."""
        item = _Pending(send.sequence_id)
        overload = self.processor.overload
        if overload.memory_high:
            overload.refused_publishes(client.ctx.peer)
            item.error = _OVERLOADED
            return item
        try:
            sequence_id = sequence_id_of(send)
            message = message_from_send(send, producer=producer.name, now_ms=now_ms())
            tracing = self.processor.tracing
            if tracing is not None:
                item.trace = tracing.received(
                    client.ctx, producer.topic, message.qos, message.properties
                )
                if item.trace is not None:
                    message = with_properties(message, item.trace.carrier)
                    item.trace.storing()
            item.partition = producer.partition(message)
            if producer.registered:
                item.stored = producer.send(item.partition, message, sequence_id)
            else:
                item.publish = (producer.topic_of(item.partition), message)
        except GrpcError as exc:
            item.error = exc
        except BackendError as exc:
            item.error = backend_status(exc)
            _end(item.trace, exc)
        return item

    async def _answer(
        self,
        call: Call,
        client: CallClient,
        pending: trio.MemoryReceiveChannel[_Pending],
        owed: _Owed,
    ) -> None:
        """Send the results in order, a run at a time: the Sends waiting when one is taken,
        which share one wait for durability."""
        async with pending:
            async for first in pending:
                run = [first]
                while len(run) < _RUN:
                    try:
                        run.append(pending.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                await self._publish(client, run)
                # Every outcome first, then the replies: the first wait makes the whole run
                # durable at once, before the reader (held at the bound meanwhile) stores
                # more, which a wait per reply would wait for too (a write per message).
                results = [await self._result(item) for item in run]
                for item, result in zip(run, results, strict=True):
                    await self._reply(call, result)
                    owed.release(item.size)

    async def _publish(self, client: CallClient, run: list[_Pending]) -> None:
        """Publish the messages of `run` that no registered producer took, in order, and
        note the outcome of each."""
        items = [item for item in run if item.publish is not None]
        if not items:
            return
        outcomes = await self.processor.publish_batch(
            client.ctx, [item.publish for item in items if item.publish is not None]
        )
        for item, outcome in zip(items, outcomes, strict=True):
            if isinstance(outcome, BackendError):
                item.error = backend_status(outcome)
                _end(item.trace, outcome)
            else:
                item.published = outcome

    async def _result(self, item: _Pending) -> pb.SendResult:
        stored = item.published
        if item.stored is not None:
            try:
                stored = await item.stored
            except BackendError as exc:
                item.error = backend_status(exc)
                _end(item.trace, exc)
        if stored is not None:
            _end(item.trace)
            return stored_result(item.sequence_id, stored.message_id, item.partition)
        assert item.error is not None
        self.processor.record_dropped(
            Drop.OVERLOADED if item.error is _OVERLOADED else Drop.REFUSED
        )
        return refused_result(item.sequence_id, item.error)

    async def _reply(self, call: Call, result: pb.SendResult) -> None:
        await call.send(result.SerializeToString())


class _Owed:
    """The results a produce call owes, bounded in count and in the bytes of their Sends: the
    reader acquires before it reads a Send (waiting while either bound is reached), holds the
    Send's size once read, and each answer releases both. One Send is always let through, so
    that one larger than the byte bound is still stored."""

    def __init__(self, count: int, size: int) -> None:
        self._slots = trio.Semaphore(count)
        self._max_bytes = size
        self._bytes = 0
        self._freed = trio.Event()

    async def acquire(self) -> None:
        await self._slots.acquire()
        while self._bytes >= self._max_bytes:
            self._freed = trio.Event()
            await self._freed.wait()

    def hold(self, size: int) -> None:
        self._bytes += size

    def release(self, size: int) -> None:
        self._bytes -= size
        self._slots.release()
        self._freed.set()


def _end(trace: PublishTrace | None, error: BaseException | None = None) -> None:
    if trace is not None:
        trace.stored(error)
        trace.end(error)
