"""A producer of `PulsarClient`: batches, receipts by order, reconnection.

Messages given to `send` join the open batch; the batch is closed into one SEND frame when the
connection is about to write (see `BrokerConnection.want_flush`), or earlier when it reaches
its size limits. The broker answers each batch with one SEND_RECEIPT, in order; the batch's
messages get ids `(ledger, entry, index)`. A message with a delivery time, or any message of a
producer made without batching, travels alone.

When the connection ends or the broker closes the producer (its topic moved), the producer
looks the topic up again, registers anew and sends again, in order, every batch still without a
receipt. A producer that cannot come back (fenced, another exclusive producer, topic terminated)
fails what it holds and every later send. Sends wait while `max_pending` messages are without a
receipt; a batch without a receipt after `send_timeout` fails with Unavailable.

No SEND carries more than the broker's `max_message_size` (from its CONNECTED) of message
data: a batch is closed before a message would take it over, and a message that is over on
its own is not sent (its ticket fails with MessageTooLarge), as the broker would drop the
connection, and every producer and consumer on it, over the frame.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Final

import trio

from mop.clock import now_ms
from mop.log_limit import LimitedLog
from mop.message import MessageId
from mop.protocols.pulsar.batching import send_frame, single_header
from mop.protocols.pulsar.commands import (
    CloseProducer,
    Producer,
    ProducerAccessMode,
    ProducerSuccess,
    Send,
    SendError,
    SendReceipt,
)
from mop.protocols.pulsar.driver.client import PulsarClient, retryable
from mop.protocols.pulsar.driver.connection import BrokerConnection
from mop.protocols.pulsar.driver.errors import (
    ClientClosed,
    DriverError,
    MessageTooLarge,
    ServerRefused,
    Unavailable,
)
from mop.protocols.pulsar.frames import DEFAULT_MAX_MESSAGE_SIZE, encode_command, make_payload
from mop.protocols.pulsar.mapping import from_id_data
from mop.protocols.pulsar.metadata import KeyValue, MessageMetadata, Payload

__all__ = ["ClientProducer", "ProducerConfig", "Ticket", "create_producer"]

log = logging.getLogger("mop.pulsar.driver")
_limited = LimitedLog(log)

_BACKOFF_MAX: Final = 2.0


class ProducerConfig:
    __slots__ = (
        "access_mode",
        "batch_max_bytes",
        "batch_max_messages",
        "batching",
        "max_pending",
        "name",
        "send_timeout",
    )

    def __init__(
        self,
        *,
        name: str | None = None,
        access_mode: ProducerAccessMode = ProducerAccessMode.Shared,
        batching: bool = True,
        batch_max_messages: int = 1000,
        batch_max_bytes: int = 128 * 1024,
        max_pending: int = 1000,
        send_timeout: float = 30.0,
    ) -> None:
        self.name = name
        self.access_mode = access_mode
        self.batching = batching
        self.batch_max_messages = batch_max_messages
        self.batch_max_bytes = batch_max_bytes
        self.max_pending = max_pending
        self.send_timeout = send_timeout


class _Batch:
    """Messages that travel in one SEND (or one message alone, `single`)."""

    __slots__ = (
        "count",
        "deadline",
        "done",
        "error",
        "first_seq",
        "message_id",
        "parts",
        "publish_time",
        "sent_at",
        "single",
        "size",
    )

    def __init__(self, single: Payload | None = None) -> None:
        self.parts: list[bytes] = []
        self.count = 0
        self.size = 0
        self.single = single
        self.first_seq = -1
        self.publish_time = 0
        self.sent_at = 0.0
        self.deadline = 0.0
        self.done = trio.Event()
        self.error: DriverError | None = None
        self.message_id: MessageId | None = None


class Ticket:
    """The receipt of one message, to await when its outcome matters."""

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: _Batch, index: int) -> None:
        self._batch = batch
        self._index = index

    @property
    def done(self) -> bool:
        """Whether the outcome is known (then `result` gives it without waiting)."""
        return self._batch.done.is_set()

    async def settled(self) -> None:
        """Return once the outcome is known."""
        await self._batch.done.wait()

    def result(self) -> MessageId:
        """The message's id once stored; the DriverError that failed its batch otherwise.
        Only once `done`. MessageId(-1, -1) (batch index kept): stored, id unknown (it was
        sent again after a lost receipt, and the broker had it already)."""
        batch = self._batch
        if batch.error is not None:
            raise batch.error
        assert batch.message_id is not None, "the ticket is not done"
        if batch.single is not None:
            return batch.message_id
        return MessageId(batch.message_id.ledger, batch.message_id.entry, self._index)

    async def wait(self) -> MessageId:
        """The message's id once stored; the DriverError that failed its batch otherwise."""
        await self.settled()
        return self.result()


# Refusals a producer cannot come back from by registering again.
_FATAL: Final = frozenset(
    {
        "ProducerFenced",
        "ProducerBusy",
        "TopicTerminatedError",
        "NotAllowedError",
        "AuthorizationError",
        "AuthenticationError",
        "InvalidTopicName",
        "IncompatibleSchema",
    }
)


class ClientProducer:
    """See the module docstring; made by `create_producer`."""

    def __init__(self, client: PulsarClient, topic: str, config: ProducerConfig) -> None:
        self.client = client
        self.topic = topic
        self.config = config
        self.name = config.name or ""
        self._connection: BrokerConnection | None = None
        self._producer_id = 0
        self._epoch = 0
        self._seq = 0
        self._open: _Batch | None = None
        self._inflight: deque[_Batch] = deque()
        self._queued = 0  # messages given and still without a receipt
        # The broker's limit on a SEND's message data (the last connection's; its default
        # until the first).
        self._max_size = DEFAULT_MAX_MESSAGE_SIZE
        self._room = trio.Event()
        self._lost = trio.Event()
        self._progress = trio.Event()  # set when a batch is done or the connection goes
        self._closed = False
        self.error: DriverError | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending(self) -> int:
        """Messages given to `send` and still without a receipt."""
        return self._queued

    # -- sending ---------------------------------------------------------------------------

    async def send(
        self,
        payload: bytes,
        properties: tuple[tuple[str, str], ...] = (),
        *,
        key: str | None = None,
        event_time: int = 0,
        deliver_at: int = 0,
        ticket: bool = True,
    ) -> Ticket | None:
        """Queue one message; returns its Ticket (None when `ticket` is false). Waits while
        `max_pending` messages are without a receipt; raises the producer's error once it
        failed for good."""
        await self.wait_for_room()
        return self.send_nowait(
            payload,
            properties,
            key=key,
            event_time=event_time,
            deliver_at=deliver_at,
            ticket=ticket,
        )

    @property
    def has_room(self) -> bool:
        """Whether `send_nowait` takes a message now: fewer than `max_pending` without a
        receipt, or the producer is closed (it then raises its error)."""
        return self._queued < self.config.max_pending or self._closed

    async def wait_for_room(self) -> None:
        """Return once fewer than `max_pending` messages are without a receipt (or the
        producer is closed); at once, without a checkpoint, when they are."""
        while not self.has_room:
            await self._room.wait()

    def send_nowait(
        self,
        payload: bytes,
        properties: tuple[tuple[str, str], ...] = (),
        *,
        key: str | None = None,
        event_time: int = 0,
        deliver_at: int = 0,
        ticket: bool = True,
    ) -> Ticket | None:
        """`send` without waiting (a publisher's hot path: no coroutine per message):
        trio.WouldBlock while `max_pending` messages are without a receipt."""
        if not self.has_room:
            raise trio.WouldBlock
        if self._closed:
            raise self.error or ClientClosed(f"the producer of {self.topic} is closed")
        if deliver_at or not self.config.batching:
            meta = MessageMetadata(
                producer_name=self.name,
                sequence_id=0,  # set when sent
                publish_time=0,
                properties=tuple(KeyValue(key=k, value=v) for k, v in properties),
                partition_key=key,
                event_time=event_time or None,
                deliver_at_time=deliver_at or None,
            )
            single = make_payload(meta, payload)
            if len(single.data) > self._max_size:
                return self._too_large(len(single.data), ticket)
            self._close_open()
            self._queued += 1
            batch = _Batch(single)
            batch.count = 1
            self._enqueue(batch)
            return Ticket(batch, -1) if ticket else None
        header = single_header(properties, key, len(payload), event_time)
        size = len(header) + len(payload)
        if size > self._max_size:
            return self._too_large(size, ticket)
        open_batch = self._open
        if open_batch is not None and open_batch.size + size > self._max_size:
            self._close_open()  # it would not fit: it goes as it is
            open_batch = None
        if open_batch is None:
            open_batch = self._open = _Batch()
            if self._connection is not None:
                self._connection.want_flush(self._producer_id, self)
        self._queued += 1
        open_batch.parts += (header, payload)
        index = open_batch.count
        open_batch.count = index + 1
        open_batch.size += size
        config = self.config
        if (
            open_batch.count >= config.batch_max_messages
            or open_batch.size >= config.batch_max_bytes
        ):
            self._close_open()
        return Ticket(open_batch, index) if ticket else None

    def _too_large(self, size: int, ticket: bool) -> Ticket | None:
        """The outcome of a message that is not sent: over the broker's limit."""
        error = MessageTooLarge(
            f"a message of {size} bytes for {self.topic}: the broker takes {self._max_size} at most"
        )
        if not ticket:
            _limited.warning("too-large", "%s; dropped", error)
            return None
        batch = _Batch()
        batch.error = error
        batch.done.set()
        return Ticket(batch, -1)

    def flush(self) -> None:
        """Close the open batch (the connection calls this before it writes)."""
        self._close_open()

    def _close_open(self) -> None:
        batch, self._open = self._open, None
        if batch is not None and batch.count:
            self._enqueue(batch)

    def _enqueue(self, batch: _Batch) -> None:
        batch.first_seq = self._seq
        self._seq += batch.count
        batch.publish_time = now_ms()
        batch.sent_at = trio.current_time()
        batch.deadline = batch.sent_at + self.config.send_timeout
        self._inflight.append(batch)
        if self._connection is not None:
            self._connection.send(self._frame(batch))

    def _frame(self, batch: _Batch) -> bytes:
        single = batch.single
        if single is None:
            return send_frame(
                self._producer_id,
                batch.first_seq,
                self.name,
                batch.publish_time,
                batch.parts,
                batch.count,
            )
        meta = single.metadata
        payload = make_payload(
            MessageMetadata(
                producer_name=self.name,
                sequence_id=batch.first_seq,
                publish_time=batch.publish_time,
                properties=meta.properties,
                partition_key=meta.partition_key,
                event_time=meta.event_time,
                deliver_at_time=meta.deliver_at_time,
            ),
            single.data,
        )
        return encode_command(
            Send(producer_id=self._producer_id, sequence_id=batch.first_seq, payload=payload)
        )

    # -- receipts (ProducerHandler) --------------------------------------------------------

    def on_receipt(self, receipt: SendReceipt) -> None:
        inflight = self._inflight
        if not inflight or receipt.sequence_id < inflight[0].first_seq:
            return  # a receipt for a batch sent again after a reconnect: done already
        batch = inflight[0]
        if receipt.sequence_id > batch.first_seq:
            # A later batch answered first: the receipt of this one was lost, so what the
            # broker holds is unknown. The batches go again on a new connection, where the
            # broker drops those it stored already (by sequence id) and still answers them.
            log.warning(
                "producer of %s: a receipt for %d while %d has none; reconnecting",
                self.topic,
                receipt.sequence_id,
                batch.first_seq,
            )
            connection = self._connection
            if connection is not None:
                connection.close()
            return
        inflight.popleft()
        connection = self._connection
        if connection is not None:
            latency = connection.link.send_latency
            if latency.due(batch.count):
                latency.record(trio.current_time() - batch.sent_at)
        data = receipt.message_id
        if data is None:
            self._finish(batch, Unavailable(f"{self.topic}: a receipt without an id"))
        else:
            batch.message_id = from_id_data(data)
            self._finish(batch, None)

    def on_send_error(self, error: SendError) -> None:
        for batch in list(self._inflight):
            if batch.first_seq == error.sequence_id:
                self._inflight.remove(batch)
                self._finish(batch, ServerRefused(error.error, error.message))
                return

    def _finish(self, batch: _Batch, error: DriverError | None) -> None:
        batch.error = error
        batch.done.set()
        self._queued -= batch.count
        self._room.set()
        self._room = trio.Event()
        self._progress.set()
        self._progress = trio.Event()

    def on_closed_by_broker(self) -> None:
        self._detach()

    def connection_lost(self, connection: BrokerConnection) -> None:
        if connection is self._connection:
            self._detach()

    def _detach(self) -> None:
        self._connection = None
        self._lost.set()
        self._progress.set()
        self._progress = trio.Event()

    # -- life ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register with the topic's broker (errors before that go to the caller of `start`),
        then keep registered, and expire old batches, until closed."""
        await self.client.retrying(f"creating a producer for {self.topic}", self._attach)
        task_status.started()
        try:
            await self._keep_registered()
        finally:
            # Nothing sends what is left once this ends (the client stops, say): it fails.
            if not self._closed:
                self._fail(ClientClosed(f"the producer of {self.topic} stopped"))

    async def _keep_registered(self) -> None:
        pause = 0.05
        while not self._closed:
            if self._connection is None:
                try:
                    await self._attach()
                except DriverError as exc:
                    if self._closed or self.client.closed:
                        return
                    # Once registered, a busy topic is this producer's old self still going.
                    busy = isinstance(exc, ServerRefused) and exc.error.name == "ProducerBusy"
                    if not retryable(exc) and _fatal(exc) and not busy:
                        self._fail(exc)
                        return
                    log.debug("producer of %s: %s; trying again", self.topic, exc)
                    self._expire()
                    await trio.sleep(pause)
                    pause = min(_BACKOFF_MAX, pause * 2)
                    continue
                pause = 0.05
            with trio.move_on_after(1.0):
                await self._lost.wait()
            self._expire()

    async def _attach(self) -> None:
        connection = await self.client.lookup(self.topic)
        producer_id = connection.next_id()
        self._lost = trio.Event()
        connection.add_producer(producer_id, self)
        config = self.config
        try:
            answer = await connection.request(
                Producer(
                    topic=self.topic,
                    producer_id=producer_id,
                    request_id=connection.next_id(),
                    producer_name=self.name or None,
                    user_provided_producer_name=config.name is not None,
                    epoch=self._epoch,
                    producer_access_mode=config.access_mode,
                ),
                self.client.options.operation_timeout,
            )
        except BaseException:
            # The broker may register it all the same (an answer cut off by a timeout or a
            # cancellation): closed right after, in order, so it holds no exclusive access.
            connection.drop_producer(producer_id)
            raise
        if not isinstance(answer, ProducerSuccess):
            connection.remove_producer(producer_id)
            raise Unavailable(f"creating a producer for {self.topic}: {answer!r:.200}")
        if self._closed:
            connection.drop_producer(producer_id)
            return
        self._epoch += 1
        self.name = answer.producer_name
        log.debug("producer %r of %s on %s", self.name, self.topic, connection.address)
        self._producer_id = producer_id
        self._connection = connection
        self._max_size = connection.max_message_size
        # Everything still without a receipt goes again, in order, then the open batch.
        for batch in self._inflight:
            connection.send(self._frame(batch))
        if self._open is not None:
            connection.want_flush(producer_id, self)

    def _expire(self) -> None:
        now = trio.current_time()
        while self._inflight and self._inflight[0].deadline <= now:
            batch = self._inflight.popleft()
            self._finish(batch, Unavailable(f"{self.topic}: no receipt within the send timeout"))

    def _fail(self, error: DriverError) -> None:
        self._closed = True
        self.error = error
        self._close_open()
        while self._inflight:
            self._finish(self._inflight.popleft(), error)
        self._room.set()

    async def close(self, seconds: float = 10.0) -> None:
        """Send what is open, wait up to `seconds` for the receipts, and unregister."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._close_open()
        with trio.move_on_after(seconds):
            # Receipts come only over a connection: none, and nothing more is waited for.
            while self._inflight and self._connection is not None:
                await self._progress.wait()
        self._closed = True
        self._fail(ClientClosed(f"the producer of {self.topic} is closed"))
        connection, self._connection = self._connection, None
        self._lost.set()
        if connection is not None and not connection.closed:
            connection.remove_producer(self._producer_id)
            with trio.move_on_after(seconds):
                try:
                    await connection.request(
                        CloseProducer(
                            producer_id=self._producer_id, request_id=connection.next_id()
                        ),
                        seconds,
                    )
                except DriverError as exc:
                    log.debug("closing the producer of %s: %s", self.topic, exc)

    def abort(self) -> None:
        """Close at once, failing what is pending (no wait, no word to the broker)."""
        if not self._closed:
            self._fail(ClientClosed(f"the producer of {self.topic} is closed"))
        connection, self._connection = self._connection, None
        self._lost.set()
        if connection is not None and not connection.closed:
            connection.drop_producer(self._producer_id)


def _fatal(exc: DriverError) -> bool:
    return isinstance(exc, ServerRefused) and exc.error.name in _FATAL


async def create_producer(
    client: PulsarClient, topic: str, config: ProducerConfig | None = None
) -> ClientProducer:
    """A producer registered with `topic`'s broker; ServerRefused / Unavailable if it cannot be."""
    producer = ClientProducer(client, topic, config or ProducerConfig())
    await client.start(producer.run)
    return producer
