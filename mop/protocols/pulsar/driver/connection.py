"""One connection to one broker, shared by every producer and consumer a `PulsarClient` has
there (MIP-7's socket reuse).

Frames to send are queued (`send`) and written by one task, all that queued up since its last
write in one `send_all`: a burst of sends, acks and permits from many tasks costs one system call.
Before each write the connection asks the producers that have messages waiting to close their
batches (`flush`), so a batch holds what its producer was given since the last write: no timer
is needed to batch, and a message waits for nothing but the write before it.

Frames that arrive are read by one task and dispatched at once, on the trio thread: answers to
requests by request id, receipts to producers and messages to consumers by their ids. When the
connection ends, every pending request fails with `ConnectionLost` and every producer and
consumer registered on it is told (`connection_lost`), to reconnect on its own.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

import trio

from mop.protocols.pulsar.client import NO_AUTH, ClientAuth
from mop.protocols.pulsar.commands import (
    PROTOCOL_VERSION,
    ActiveConsumerChange,
    AuthChallenge,
    AuthData,
    AuthResponse,
    CloseConsumer,
    CloseProducer,
    Command,
    Connect,
    Connected,
    Error,
    FeatureFlags,
    Message,
    Ping,
    Pong,
    ProducerSuccess,
    SendError,
    SendReceipt,
)
from mop.protocols.pulsar.driver.errors import ConnectionLost, ServerRefused, Unavailable
from mop.protocols.pulsar.driver.stats import BrokerLink
from mop.protocols.pulsar.errors import RemoteProtocolError
from mop.protocols.pulsar.frames import (
    FRAME_SIZE_PADDING,
    ChecksumMismatch,
    Frame,
    FrameDecoder,
    NeedData,
    encode_command,
)

__all__ = ["BrokerConnection", "ConsumerHandler", "Flushable", "ProducerHandler"]

log = logging.getLogger("mop.pulsar.driver")

# A connection that heard nothing for this long is pinged; twice this long, it is dropped.
KEEPALIVE: Final = 30.0
_READ_SIZE: Final = 256 * 1024


class ProducerHandler(Protocol):
    def on_receipt(self, receipt: SendReceipt) -> None: ...
    def on_send_error(self, error: SendError) -> None: ...
    def on_closed_by_broker(self) -> None: ...
    def connection_lost(self, connection: BrokerConnection) -> None: ...
    def flush(self) -> None: ...


class Flushable(Protocol):
    def flush(self) -> None: ...


class ConsumerHandler(Protocol):
    def on_message(self, message: Message) -> None: ...
    def on_corrupt(self, message: Message) -> None: ...
    def on_active_change(self, active: bool) -> None: ...
    def on_closed_by_broker(self) -> None: ...
    def connection_lost(self, connection: BrokerConnection) -> None: ...


class _Pending:
    __slots__ = ("answer", "done", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.answer: Frame | None = None
        self.error: Exception | None = None


class BrokerConnection:
    """See the module docstring. Start with `await nursery.start(connection.serve)`."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        address: str,
        *,
        keepalive: float = KEEPALIVE,
        link: BrokerLink | None = None,
    ) -> None:
        self.address = address
        self.keepalive = keepalive
        # The counts of the broker this connection reaches (shared with its other ones).
        self.link = link if link is not None else BrokerLink(address)
        self._stream = stream
        self._auth = NO_AUTH
        self._client_version = ""
        self._decoder = FrameDecoder()
        self._ids = itertools.count(1)
        self._out: list[bytes] = []
        self._wake = trio.Event()
        self._dirty: dict[int, Flushable] = {}
        self._pending: dict[int, _Pending] = {}
        self._producers: dict[int, ProducerHandler] = {}
        self._consumers: dict[int, ConsumerHandler] = {}
        self._closed = False
        self._heard = trio.current_time()
        self.max_message_size = 5 * 1024 * 1024
        self.server_version = ""
        self._scope = trio.CancelScope()

    @property
    def closed(self) -> bool:
        return self._closed

    def next_id(self) -> int:
        """A request, producer or consumer id unique on this connection."""
        return next(self._ids)

    # -- handshake and life ----------------------------------------------------------------

    async def handshake(
        self,
        client_version: str,
        *,
        auth: ClientAuth = NO_AUTH,
        proxy_to_broker_url: str | None = None,
    ) -> None:
        """CONNECT and its answer, before `serve`; ServerRefused or ConnectionLost. With
        credentials, the connection answers the broker's AUTH_CHALLENGE with fresh ones."""
        self._auth = auth
        self._client_version = client_version
        await self._write(
            encode_command(
                Connect(
                    client_version=client_version,
                    protocol_version=PROTOCOL_VERSION,
                    auth_method_name=auth.method,
                    auth_data=auth.current_data(),
                    proxy_to_broker_url=proxy_to_broker_url,
                    feature_flags=(
                        FeatureFlags(supports_auth_refresh=True) if auth.method else None
                    ),
                )
            )
        )
        while True:
            frame = self._decoder.next_frame()
            if isinstance(frame, NeedData):
                await self._receive()
                continue
            if isinstance(frame, Connected):
                if frame.max_message_size:
                    self.max_message_size = frame.max_message_size
                    # Frames as large as the broker allows (and their slack) are read.
                    self._decoder.max_frame_size = max(
                        self._decoder.max_frame_size, frame.max_message_size + FRAME_SIZE_PADDING
                    )
                self.server_version = frame.server_version
                return
            if isinstance(frame, Error):
                raise ServerRefused(frame.error, f"{self.address}: {frame.message}")
            if isinstance(frame, Ping):
                await self._write(encode_command(Pong()))

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read, write and keep alive until the connection ends (then everything registered on
        it is told) or `close` is called."""
        self.link.connections += 1
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._until_lost, self._write_loop, nursery)
                    nursery.start_soon(self._until_lost, self._keepalive, nursery)
                    task_status.started()
                    await self._until_lost(self._read_loop, nursery)
        finally:
            self.link.connections -= 1
            self._end()
            with (
                trio.CancelScope(shield=True),
                contextlib.suppress(OSError, trio.BrokenResourceError),
            ):
                await self._stream.aclose()

    async def _until_lost(self, loop: Callable[[], Awaitable[None]], nursery: trio.Nursery) -> None:
        """Run one of the connection's loops; when one ends, the connection does."""
        try:
            await loop()
        except (ConnectionLost, RemoteProtocolError) as exc:
            log.debug("connection to %s ended: %s", self.address, exc)
        finally:
            nursery.cancel_scope.cancel()

    def close(self) -> None:
        """End the connection (what is registered on it reconnects elsewhere, or stops)."""
        self._scope.cancel()
        self._end()

    def _end(self) -> None:
        if self._closed:
            return
        self._closed = True
        lost = ConnectionLost(f"the connection to {self.address} was lost")
        for pending in self._pending.values():
            pending.error = lost
            pending.done.set()
        self._pending.clear()
        producers, self._producers = list(self._producers.values()), {}
        consumers, self._consumers = list(self._consumers.values()), {}
        self._dirty.clear()
        for handler in producers:
            handler.connection_lost(self)
        for consumer in consumers:
            consumer.connection_lost(self)

    # -- sending ---------------------------------------------------------------------------

    def send(self, frame: bytes) -> None:
        """Queue `frame` (from `encode_command`, say); written with whatever else is queued."""
        if self._closed:
            return
        self._out.append(frame)
        self.link.commands += 1
        self._wake.set()

    def send_command(self, command: Command) -> None:
        self.send(encode_command(command))

    def want_flush(self, owner_id: int, owner: Flushable) -> None:
        """`owner` (a producer with a batch open, a consumer with acks to send) is asked to
        `flush` before the next write."""
        if self._closed:
            return
        self._dirty[owner_id] = owner
        self._wake.set()

    async def request(self, command: Command, seconds: float) -> Frame:
        """Send `command` (it has a `request_id`) and return the answer with that id.

        ServerRefused for an ERROR answer, ConnectionLost if the connection ends first,
        Unavailable after `seconds`."""
        request_id: int = getattr(command, "request_id")  # noqa: B009 - every request has one
        if self._closed:
            raise ConnectionLost(f"the connection to {self.address} is closed")
        pending = self._pending[request_id] = _Pending()
        self.send_command(command)
        try:
            with trio.fail_after(seconds):
                await pending.done.wait()
        except trio.TooSlowError:
            raise Unavailable(
                f"{self.address}: no answer to {type(command).__name__} within {seconds:g} s"
            ) from None
        finally:
            self._pending.pop(request_id, None)
        if pending.error is not None:
            raise pending.error
        answer = pending.answer
        if isinstance(answer, Error):
            raise ServerRefused(answer.error, answer.message)
        assert answer is not None
        return answer

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            if self._dirty:
                dirty = list(self._dirty.values())
                self._dirty.clear()
                for producer in dirty:
                    producer.flush()
            if not self._out:
                continue
            data = b"".join(self._out)
            self._out.clear()
            await self._write(data)

    async def _write(self, data: bytes) -> None:
        self.link.bytes_sent += len(data)
        try:
            await self._stream.send_all(data)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ConnectionLost(
                f"{self.address}: cannot send: {exc or type(exc).__name__}"
            ) from None

    async def _keepalive(self) -> None:
        interval = self.keepalive
        while True:
            await trio.sleep(interval / 2)
            silent = trio.current_time() - self._heard
            if silent >= 2 * interval:
                raise ConnectionLost(f"{self.address}: no answer for {silent:.1f} s")
            if silent >= interval:
                self.send_command(Ping())

    # -- registrations ---------------------------------------------------------------------

    def add_producer(self, producer_id: int, handler: ProducerHandler) -> None:
        self._producers[producer_id] = handler

    def remove_producer(self, producer_id: int) -> None:
        self._producers.pop(producer_id, None)
        self._dirty.pop(producer_id, None)

    def add_consumer(self, consumer_id: int, handler: ConsumerHandler) -> None:
        self._consumers[consumer_id] = handler

    def remove_consumer(self, consumer_id: int) -> None:
        self._consumers.pop(consumer_id, None)

    def drop_producer(self, producer_id: int) -> None:
        """Unregister a producer and tell the broker (CLOSE_PRODUCER), without waiting: it
        may be registered there (an answer cut off), and must not keep exclusive access."""
        self.remove_producer(producer_id)
        self.send_command(CloseProducer(producer_id=producer_id, request_id=self.next_id()))

    def drop_consumer(self, consumer_id: int) -> None:
        """Unregister a consumer and tell the broker (CLOSE_CONSUMER), without waiting."""
        self.remove_consumer(consumer_id)
        self.send_command(CloseConsumer(consumer_id=consumer_id, request_id=self.next_id()))

    # -- receiving -------------------------------------------------------------------------

    async def _receive(self) -> None:
        try:
            data = await self._stream.receive_some(_READ_SIZE)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ConnectionLost(
                f"{self.address}: cannot receive: {exc or type(exc).__name__}"
            ) from None
        if not data:
            raise ConnectionLost(f"{self.address} closed the connection")
        self._heard = trio.current_time()
        self.link.bytes_received += len(data)
        self._decoder.feed(data)

    async def _read_loop(self) -> None:
        next_frame = self._decoder.next_frame
        while True:
            frame = next_frame()
            if isinstance(frame, NeedData):
                await self._receive()
                continue
            try:
                self._dispatch(frame)
            except Exception:  # a handler's bug must not end a connection others share
                log.exception("%s: handling %s failed", self.address, type(frame).__name__)

    def _dispatch(self, frame: Frame) -> None:
        kind = type(frame)
        if kind is Message:
            assert isinstance(frame, Message)
            consumer = self._consumers.get(frame.consumer_id)
            if consumer is not None:
                consumer.on_message(frame)
        elif kind is SendReceipt:
            assert isinstance(frame, SendReceipt)
            producer = self._producers.get(frame.producer_id)
            if producer is not None:
                producer.on_receipt(frame)
        elif kind is SendError:
            assert isinstance(frame, SendError)
            producer = self._producers.get(frame.producer_id)
            if producer is not None:
                producer.on_send_error(frame)
        elif kind is Ping:
            self.send_command(Pong())
        elif kind is AuthChallenge:
            # A token is about to expire: show the current one (read anew from its file).
            self.send_command(
                AuthResponse(
                    client_version=self._client_version,
                    response=AuthData(
                        auth_method_name=self._auth.method, auth_data=self._auth.current_data()
                    ),
                    protocol_version=PROTOCOL_VERSION,
                )
            )
        elif kind is Pong:
            pass
        elif kind is CloseProducer:
            assert isinstance(frame, CloseProducer)
            handler = self._producers.pop(frame.producer_id, None)
            if handler is not None:
                handler.on_closed_by_broker()
        elif kind is CloseConsumer:
            assert isinstance(frame, CloseConsumer)
            consumer = self._consumers.pop(frame.consumer_id, None)
            if consumer is not None:
                consumer.on_closed_by_broker()
        elif kind is ActiveConsumerChange:
            assert isinstance(frame, ActiveConsumerChange)
            consumer = self._consumers.get(frame.consumer_id)
            if consumer is not None:
                consumer.on_active_change(frame.is_active)
        elif kind is ChecksumMismatch:
            assert isinstance(frame, ChecksumMismatch)
            corrupt = frame.command
            if isinstance(corrupt, Message):
                consumer = self._consumers.get(corrupt.consumer_id)
                if consumer is not None:
                    consumer.on_corrupt(corrupt)
        else:
            request_id = getattr(frame, "request_id", None)
            if request_id is None:
                return  # REACHED_END_OF_TOPIC and the like: nothing waits for them
            pending = self._pending.get(request_id)
            if pending is None:
                return
            if isinstance(frame, ProducerSuccess) and not frame.producer_ready:
                return  # queued for exclusive access: the second answer is the one awaited
            pending.answer = frame
            pending.done.set()
