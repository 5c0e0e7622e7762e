"""The producers of one Pulsar connection: PRODUCER, SEND and CLOSE_PRODUCER.

A SEND is stored at once, in order (the processor producer's `send`), and its receipt goes out
once the message is durable, from one task per producer so receipts keep the order of sends.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import trio

from mop.message import Message
from mop.processor import BackendError, Producer, ProducerAccess, ProducerSpec, PublishResult
from mop.processor.tracing import MessageTracing, PublishTrace
from mop.protocols.pulsar.commands import (
    CloseProducer,
    Error,
    ProducerAccessMode,
    ProducerSuccess,
    Send,
    SendError,
    Success,
)
from mop.protocols.pulsar.commands import Producer as ProducerCommand
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.mapping import (
    message_from_payload,
    with_member_properties,
    with_properties,
)
from mop.protocols.pulsar.serving.server import TopicRefused, server_error
from mop.security.acl import Access

if TYPE_CHECKING:
    from mop.protocols.pulsar.serving.handler import PulsarConnection

log = logging.getLogger("mop.pulsar")

_ACCESS: Final = {
    ProducerAccessMode.Shared: ProducerAccess.SHARED,
    ProducerAccessMode.Exclusive: ProducerAccess.EXCLUSIVE,
    ProducerAccessMode.WaitForExclusive: ProducerAccess.WAIT_FOR_EXCLUSIVE,
    ProducerAccessMode.ExclusiveWithFencing: ProducerAccess.EXCLUSIVE_WITH_FENCING,
}
# SENDs stored and not yet answered, per producer, before the connection stops reading.
_MAX_PENDING: Final = 10_000
_MASK64: Final = (1 << 64) - 1
# SENDs answered together at most (their receipts leave in one write).
_RUN: Final = 1000
# Why a SEND is refused while the node is over its memory high-water mark.
_OVERLOADED: Final = (
    ServerError.TooManyRequests,
    "the broker is over its memory high-water mark: try again later",
)


@dataclass(slots=True)
class _Pending:
    """What the receipt task answers next: a stored SEND, a refused one, or CLOSE_PRODUCER."""

    sequence_id: int = 0
    highest_sequence_id: int = 0
    stored: Awaitable[PublishResult] | None = None
    error: tuple[ServerError, str] | None = None
    close_request: int | None = None
    # The traces of the messages of the SEND, ended with its answer (see `MessageTracing`).
    traces: tuple[PublishTrace, ...] = ()


@dataclass(slots=True)
class _ProducerState:
    producer_id: int
    producer: Producer
    send: trio.MemorySendChannel[_Pending]
    receive: trio.MemoryReceiveChannel[_Pending]
    # The version of the producer's schema (None: it brought none), told in PRODUCER_SUCCESS.
    schema_version: bytes | None = None
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    ready: bool = False
    # A SEND was refused for memory: the client sends it and every later one again on a new
    # connection, so none of the later ones is stored here (deduplication would then drop
    # the refused one when it comes again).
    refusing: bool = False


class ConnectionProducers:
    def __init__(self, link: PulsarConnection) -> None:
        self._link = link
        self._states: dict[int, _ProducerState] = {}
        self._tracing = link.server.processor.tracing

    # -- PRODUCER --------------------------------------------------------------------------

    async def on_producer(self, cmd: ProducerCommand) -> None:
        link = self._link
        rid = cmd.request_id
        existing = self._states.get(cmd.producer_id)
        if existing is not None:
            # A repeated request (the client timed out and retried): answer like the first.
            if existing.ready:
                link.write(self._success(rid, existing, ready=True))
            else:
                link.send(
                    Error(
                        request_id=rid,
                        error=ServerError.ServiceNotReady,
                        message="the producer is still being created",
                    )
                )
            return
        try:
            topic = link.authorized_topic(cmd.topic, Access.WRITE)
        except TopicRefused as exc:
            link.send(Error(request_id=rid, error=exc.error, message=exc.message))
            return
        if (owner := await link.server.owner(topic)) is not None:
            # The client looks the topic up again and goes to the owner.
            link.send(
                Error(
                    request_id=rid,
                    error=ServerError.ServiceNotReady,
                    message=f"topic {topic} is served by {owner}",
                )
            )
            return
        try:
            schema_version = await link.schemas.version_for(topic, cmd.schema)
        except BackendError as exc:
            log.info("%s: producer schema for %s refused: %s", link.ctx.peer, topic, exc)
            link.send(Error(request_id=rid, error=server_error(exc), message=str(exc)))
            return
        named = bool(cmd.producer_name) and cmd.user_provided_producer_name
        spec = ProducerSpec(
            topic=topic,
            name=cmd.producer_name or link.server.producer_name(),
            access=_ACCESS[cmd.producer_access_mode],
            durable_name=named,
            epoch=cmd.epoch,
            topic_epoch=cmd.topic_epoch,
        )
        try:
            producer = await link.server.processor.open_producer(link.ctx, spec)
        except BackendError as exc:
            link.send(Error(request_id=rid, error=server_error(exc), message=str(exc)))
            return
        send, receive = trio.open_memory_channel[_Pending](_MAX_PENDING)
        state = _ProducerState(cmd.producer_id, producer, send, receive, schema_version)
        self._states[cmd.producer_id] = state
        if producer.ready:
            state.ready = True
            link.write(self._success(rid, state, ready=True))
        else:
            link.write(self._success(rid, state, ready=False))
        link.nursery.start_soon(self._serve, state, rid)

    def _success(self, rid: int, state: _ProducerState, *, ready: bool) -> bytes:
        producer = state.producer
        exclusive = producer.spec.access is not ProducerAccess.SHARED
        return self._link.conn.send(
            ProducerSuccess(
                request_id=rid,
                producer_name=producer.spec.name,
                last_sequence_id=producer.last_sequence_id,
                topic_epoch=producer.topic_epoch if exclusive and ready else None,
                producer_ready=ready,
                schema_version=state.schema_version,
            )
        )

    async def _serve(self, state: _ProducerState, rid: int) -> None:
        with state.scope:
            if not state.ready:
                try:
                    await state.producer.wait_ready()
                except BackendError as exc:
                    self._link.send(
                        Error(request_id=rid, error=server_error(exc), message=str(exc))
                    )
                    await self._forget(state)
                    return
                state.ready = True
                self._link.write(self._success(rid, state, ready=True))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_fence, state)
                await self._answer_sends(state)
                nursery.cancel_scope.cancel()

    async def _watch_fence(self, state: _ProducerState) -> None:
        await state.producer.wait_fenced()
        log.info("%s: producer %r was fenced", self._link.ctx.peer, state.producer.spec.name)
        # The client reconnects the producer and learns from the answer that it was fenced.
        self._link.send(CloseProducer(producer_id=state.producer_id, request_id=0))
        await self._forget(state)

    async def _answer_sends(self, state: _ProducerState) -> None:
        """Answer SENDs in order, a run at a time: the run's answers leave in one write."""
        async for first in state.receive:
            run = [first]
            while len(run) < _RUN:
                try:
                    run.append(state.receive.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            frames: list[bytes] = []
            try:
                for item in run:
                    if item.close_request is not None:
                        await self._forget(state)
                        frames.append(self._link.conn.send(Success(request_id=item.close_request)))
                        return
                    frames.append(await self._answer(state.producer_id, item))
            finally:
                self._link.write(b"".join(frames))

    async def _answer(self, pid: int, item: _Pending) -> bytes:
        conn = self._link.conn
        if item.error is not None:
            error, message = item.error
            return conn.send(
                SendError(
                    producer_id=pid, sequence_id=item.sequence_id, error=error, message=message
                )
            )
        assert item.stored is not None
        try:
            result = await item.stored
        except BackendError as exc:
            if item.traces:
                _end(item.traces, exc)
            return conn.send(
                SendError(
                    producer_id=pid,
                    sequence_id=item.sequence_id,
                    error=server_error(exc, ServerError.PersistenceError),
                    message=str(exc),
                )
            )
        if item.traces:
            _end(item.traces)
        mid = result.message_id
        return conn.send_receipt(
            pid,
            item.sequence_id,
            mid.ledger & _MASK64,
            mid.entry & _MASK64,
            item.highest_sequence_id,
        )

    async def _forget(self, state: _ProducerState) -> None:
        if self._states.get(state.producer_id) is state:
            del self._states[state.producer_id]
        state.send.close()
        with trio.CancelScope(shield=True):
            await state.producer.close()

    # -- SEND ------------------------------------------------------------------------------

    async def on_send(self, cmd: Send) -> None:
        state = self._states.get(cmd.producer_id)
        if state is None or not state.ready or cmd.payload is None:
            # The client has no receipt to wait for from a producer it does not have here.
            self._link.send(
                SendError(
                    producer_id=cmd.producer_id,
                    sequence_id=cmd.sequence_id,
                    error=ServerError.NotAllowedError,
                    message="no such producer on this connection",
                )
            )
            return
        overload = self._link.server.processor.overload
        if state.refusing or overload.memory_high:
            state.refusing = True
            # Not stored: pulsar-client connects again and sends it again, by which time the
            # node may be below its low-water mark.
            overload.refused_publishes(self._link.ctx.peer, max(cmd.num_messages, 1))
            refused = _Pending(cmd.sequence_id, cmd.highest_sequence_id, error=_OVERLOADED)
            await self._queue(state, refused)
            return
        message = message_from_payload(cmd.payload, limit=self._link.server.limits.max_message_size)
        self._link.messages_in += message.count
        first = cmd.sequence_id
        highest = cmd.highest_sequence_id or first + max(0, cmd.num_messages - 1)
        meta = cmd.payload.metadata
        if cmd.is_chunk and (meta.chunk_id or 0) + 1 < (meta.num_chunks_from_msg or 1):
            first = -1  # every chunk shares the sequence id: the last one counts
        item = _Pending(cmd.sequence_id, cmd.highest_sequence_id)
        if self._tracing is not None:
            message, item.traces = self._traced(self._tracing, state.producer.spec.topic, message)
        try:
            item.stored = state.producer.send(
                message, sequence_id=first, highest_sequence_id=highest
            )
        except BackendError as exc:
            item.error = (server_error(exc), str(exc))
            if item.traces:
                _end(item.traces, exc)
        await self._queue(state, item)

    def _traced(
        self, tracing: MessageTracing, topic: str, message: Message
    ) -> tuple[Message, tuple[PublishTrace, ...]]:
        """The message to store and the traces of its messages (of each message of a batch),
        which are now storing. A message that starts a trace carries it on (`with_properties`);
        the node's own tables are not traced."""
        link = self._link
        if link.server.is_system(topic):
            return message, ()
        ctx = link.ctx
        traces: list[PublishTrace] = []
        if not message.batch:
            trace = tracing.received(ctx, topic, message.qos, message.properties)
            if trace is None:
                return message, ()
            if trace.carrier:
                message = with_properties(message, trace.carrier)
            traces.append(trace)
        else:
            extras: list[tuple[tuple[str, str], ...]] = []
            for member in message.batch:
                trace = tracing.received(ctx, topic, member.qos, member.properties)
                extras.append(() if trace is None else trace.carrier)
                if trace is not None:
                    traces.append(trace)
            if any(extras):
                message = with_member_properties(message, tuple(extras))
        for trace in traces:
            trace.storing()
        return message, tuple(traces)

    @staticmethod
    async def _queue(state: _ProducerState, item: _Pending) -> bool:
        try:
            # No pause while there is room: the reader then stores every SEND of what it read
            # before the receipt task runs, which answers them as a run (fewer storage writes,
            # one socket write) instead of waking for each (measured: unbatched SENDs/s +60%).
            state.send.send_nowait(item)
        except trio.WouldBlock:
            pass
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        else:
            return True
        try:
            await state.send.send(item)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return False  # the producer went (fenced, or closed) while this waited for room
        return True

    async def on_checksum_error(self, cmd: Send) -> None:
        state = self._states.get(cmd.producer_id)
        item = _Pending(cmd.sequence_id, error=(ServerError.ChecksumError, "checksum mismatch"))
        if state is None or not state.ready:
            self._link.send(
                SendError(
                    producer_id=cmd.producer_id,
                    sequence_id=cmd.sequence_id,
                    error=ServerError.ChecksumError,
                    message="checksum mismatch",
                )
            )
            return
        await self._queue(state, item)

    # -- CLOSE_PRODUCER --------------------------------------------------------------------

    async def on_close(self, cmd: CloseProducer) -> None:
        state = self._states.get(cmd.producer_id)
        if state is None:
            self._link.send(Success(request_id=cmd.request_id))
            return
        if state.ready:
            # Behind the receipts still owed, so they go out first.
            if not await self._queue(state, _Pending(close_request=cmd.request_id)):
                self._link.send(Success(request_id=cmd.request_id))
            return
        state.scope.cancel()
        await self._forget(state)
        self._link.send(Success(request_id=cmd.request_id))

    async def close_all(self) -> None:
        """The connection ends: its producers go (unanswered sends stay stored)."""
        for state in list(self._states.values()):
            state.scope.cancel()
            await self._forget(state)


def _end(traces: tuple[PublishTrace, ...], error: BaseException | None = None) -> None:
    for trace in traces:
        trace.stored(error)
        trace.end(error)
