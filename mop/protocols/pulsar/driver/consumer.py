"""A consumer of `PulsarClient`: permits, batches split into messages, acknowledgements,
reconnection.

Messages are handed to the consumer's `sink` as they arrive, a MESSAGE frame's batch at a
time, on the trio thread and without a queue of the client's own: the sink keeps what it needs.
Permits are given back (FLOW) once half the receiver queue has been handed over, unless the
consumer is paused: a paused consumer gets at most what the broker was already allowed to send.

Acknowledgements are gathered and sent once per write of the connection. A message of a batch
is acknowledged to the broker when every message of its batch has been (the broker tracks
entries). A reader (`auto_ack` on a non-durable subscription) acknowledges each entry it
was handed, cumulatively, so the broker can let go of it.

When the connection ends or the broker closes the consumer (its topic moved, or a seek), the
consumer subscribes again where the topic lives now. A durable subscription resumes from the
broker's cursor (what was not acknowledged comes again); a non-durable one resumes after the
last message handed over, which is not handed over twice. A non-durable one subscribes again
that way too when an entry comes corrupt (see `on_corrupt`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

import trio

from mop.clock import now_ms
from mop.log_limit import LimitedLog
from mop.message import MessageId
from mop.protocols.pulsar.batching import read_members
from mop.protocols.pulsar.commands import (
    Ack,
    AckType,
    CloseConsumer,
    Flow,
    InitialPosition,
    Message,
    RedeliverUnacknowledgedMessages,
    Seek,
    Subscribe,
    SubType,
    Unsubscribe,
)
from mop.protocols.pulsar.compression import decompress
from mop.protocols.pulsar.driver.client import PulsarClient, retryable
from mop.protocols.pulsar.driver.connection import BrokerConnection
from mop.protocols.pulsar.driver.errors import ClientClosed, DriverError, ServerRefused
from mop.protocols.pulsar.errors import PulsarError
from mop.protocols.pulsar.frames import DEFAULT_MAX_MESSAGE_SIZE, unacked_indexes
from mop.protocols.pulsar.mapping import signed64, to_id_data
from mop.protocols.pulsar.metadata import MessageIdData, MessageMetadata, Payload

__all__ = [
    "ClientConsumer",
    "ConsumerConfig",
    "EntrySink",
    "Received",
    "ReceivedEntry",
    "subscribe",
    "subscribe_entries",
]

log = logging.getLogger("mop.pulsar.driver")
_limited = LimitedLog(log)

_BACKOFF_MAX: Final = 2.0
_M64: Final = (1 << 64) - 1
# Deliveries of one entry that failed their checksum before it is given up (acknowledged with
# ValidationError.ChecksumMismatch, 2, as the Java client does at the first): corruption on
# the way is cured by a redelivery, corruption at rest would come back forever.
_CORRUPT_TRIES: Final = 3
_CHECKSUM_MISMATCH: Final = 2


class Received:
    """One message as the broker delivered it. An end-to-end `encrypted` entry comes whole
    (a batch too: its members cannot be told apart), its payload as the producer sent it."""

    __slots__ = (
        "encrypted",
        "event_time",
        "key",
        "message_id",
        "payload",
        "producer_name",
        "properties",
        "publish_time",
        "redelivery_count",
    )

    def __init__(
        self,
        message_id: MessageId,
        payload: bytes,
        properties: tuple[tuple[str, str], ...],
        key: str | None,
        publish_time: int,
        event_time: int,
        producer_name: str,
        redelivery_count: int,
        encrypted: bool = False,
    ) -> None:
        self.encrypted = encrypted
        self.message_id = message_id
        self.payload = payload
        self.properties = properties
        self.key = key
        self.publish_time = publish_time
        self.event_time = event_time
        self.producer_name = producer_name
        self.redelivery_count = redelivery_count


class ReceivedEntry:
    """One entry as the broker delivered it, whole (see `subscribe_entries`):
    its metadata and its payload, decompressed (an encrypted one as sent); a batch still holds
    all its members. `undecodable` says why the payload could not be decompressed (a codec
    not installed, a batch over the size limit once decompressed): it is then as sent, and
    whoever takes it reads it some other way or fails, but never skips it unknowingly."""

    __slots__ = ("ack_set", "data", "message_id", "metadata", "undecodable")

    def __init__(
        self,
        message_id: MessageId,
        metadata: MessageMetadata,
        data: bytes,
        ack_set: tuple[int, ...],
        undecodable: str | None = None,
    ) -> None:
        self.message_id = message_id  # of the entry (batch index -1)
        self.metadata = metadata
        self.data = data
        self.ack_set = ack_set  # batch-index acks: set bits are members still owed
        self.undecodable = undecodable


Sink = Callable[["ClientConsumer", list[Received]], None]
EntrySink = Callable[["ClientConsumer", ReceivedEntry], None]


class ConsumerConfig:
    __slots__ = (
        "auto_ack",
        "durable",
        "initial_position",
        "name",
        "priority",
        "read_compacted",
        "receiver_queue",
        "start_message_id",
        "sub_type",
    )

    def __init__(
        self,
        *,
        sub_type: SubType = SubType.Exclusive,
        durable: bool = True,
        initial_position: InitialPosition = InitialPosition.Latest,
        start_message_id: MessageId | None = None,
        receiver_queue: int = 1000,
        name: str | None = None,
        priority: int | None = None,
        auto_ack: bool = False,
        read_compacted: bool = False,
    ) -> None:
        self.sub_type = sub_type
        self.durable = durable
        self.initial_position = initial_position
        self.start_message_id = start_message_id
        self.receiver_queue = max(1, receiver_queue)
        self.name = name
        self.priority = priority
        self.auto_ack = auto_ack
        self.read_compacted = read_compacted


# Refusals a consumer cannot come back from by subscribing again.
_FATAL: Final = frozenset(
    {
        "ConsumerBusy",
        "SubscriptionNotFound",
        "NotAllowedError",
        "AuthorizationError",
        "AuthenticationError",
        "InvalidTopicName",
        "TopicTerminatedError",
        "IncompatibleSchema",
    }
)


class ClientConsumer:
    """See the module docstring; made by `subscribe`."""

    def __init__(
        self,
        client: PulsarClient,
        topic: str,
        subscription: str,
        config: ConsumerConfig,
        sink: Sink,
        *,
        on_active: Callable[[bool], None] | None = None,
        on_lost: Callable[[DriverError], None] | None = None,
        entry_sink: EntrySink | None = None,
    ) -> None:
        self.client = client
        self.topic = topic
        self.subscription = subscription
        self.config = config
        self._sink = sink
        self._entry_sink = entry_sink
        self._on_active = on_active
        self._on_lost = on_lost
        self._connection: BrokerConnection | None = None
        self._consumer_id = 0
        self._lost = trio.Event()
        self._ready = trio.Event()  # set while subscribed (and once closed)
        self._closed = False
        self._paused = False
        self._owed = 0  # permits earned since the last FLOW
        self._seeking = False
        self._last: MessageId | None = None  # last handed over (resuming a non-durable one)
        self._start = config.start_message_id
        # Entries handed over in parts (batches), by (ledger, entry): the indexes of members
        # handed over and not yet acknowledged. Kept across reconnects (ids do not change), so
        # an entry is acknowledged only once every member handed over is.
        self._open_batches: dict[tuple[int, int], set[int]] = {}
        # Entries that arrived corrupt on this subscription, by (ledger, entry): how many times.
        self._corrupt: dict[tuple[int, int], int] = {}
        self._acks: list[MessageIdData] = []
        self._cumulative: MessageIdData | None = None
        self.error: DriverError | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def connected(self) -> bool:
        return self._connection is not None

    def set_sink(self, sink: Sink) -> None:
        """Hand what arrives from now on to `sink` instead."""
        self._sink = sink

    # -- messages (ConsumerHandler) --------------------------------------------------------

    def on_message(self, frame: Message) -> None:
        if self._seeking or self._closed:
            return
        payload = frame.payload
        assert payload is not None
        meta = payload.metadata
        data = frame.message_id
        ledger, entry = signed64(data.ledger_id), signed64(data.entry_id)
        if self._corrupt:
            self._corrupt.pop((data.ledger_id, data.entry_id), None)
        count = meta.message_count
        self._owed += count
        received: list[Received] = []
        redeliveries = frame.redelivery_count
        last = self._last if not self.config.durable else None
        # What a payload may decompress to: the largest message the broker takes (a client
        # allocating what any producer announces could be made to run out of memory).
        connection = self._connection
        limit = DEFAULT_MAX_MESSAGE_SIZE if connection is None else connection.max_message_size
        if connection is not None and connection.link.receive_latency.due(count):
            connection.link.receive_latency.record_age(now_ms(), meta.publish_time)
        if self._entry_sink is not None:
            self._hand_entry(frame, MessageId(ledger, entry), limit)
            return
        try:
            if meta.encrypted:
                # Whole, as a single message is: its members cannot be told apart, so it comes
                # unless every one of them was acknowledged (batch-index acks) or handed over.
                fresh = last is None or (ledger, entry) > (last.ledger, last.entry)
                owed = not frame.ack_set or bool(unacked_indexes(frame.ack_set, count))
                if fresh and owed:
                    received.append(_encrypted(payload, MessageId(ledger, entry), redeliveries))
            elif not meta.batched:
                message_id = MessageId(ledger, entry)
                if last is None or (ledger, entry) > (last.ledger, last.entry):
                    received.append(
                        Received(
                            message_id,
                            b"" if meta.null_value else _plain(payload, limit),
                            tuple((kv.key, kv.value) for kv in meta.properties),
                            _key(meta),
                            meta.publish_time,
                            meta.event_time or 0,
                            meta.producer_name,
                            redeliveries,
                        )
                    )
            else:
                members = read_members(_plain(payload, limit), count)
                # Batch-index acks: only the members still to be delivered.
                unacked = set(unacked_indexes(frame.ack_set, count)) if frame.ack_set else None
                for index, member in enumerate(members):
                    if unacked is not None and index not in unacked:
                        continue  # acknowledged already (batch-index acks)
                    if last is not None and (ledger, entry, index) <= (
                        last.ledger,
                        last.entry,
                        last.batch_index,
                    ):
                        continue
                    received.append(
                        Received(
                            MessageId(ledger, entry, index),
                            member.payload,
                            member.properties,
                            member.partition_key,
                            meta.publish_time,
                            member.event_time,
                            meta.producer_name,
                            redeliveries,
                        )
                    )
                if len(received) > 1 and not self.config.auto_ack:
                    held = self._open_batches.setdefault((ledger, entry), set())
                    held.update(item.message_id.batch_index for item in received)
        except (PulsarError, ValueError) as exc:
            # Not acknowledged: it stays in the subscription's backlog for a client that can
            # read it (a Pulsar consumer with that codec), nothing is lost here.
            _limited.warning(
                "undecodable",
                "%s: a message that cannot be decoded was left unacknowledged (%s)",
                self.topic,
                exc,
            )
            self._grant()
            return
        if received:
            self._last = received[-1].message_id
            if self.config.auto_ack:
                self._cumulative = MessageIdData(ledger_id=data.ledger_id, entry_id=data.entry_id)
                self._want_flush()
            self._sink(self, received)
        self._grant()

    def _hand_entry(self, frame: Message, message_id: MessageId, limit: int) -> None:
        """`on_message` for a consumer that takes entries whole (see `subscribe_entries`)."""
        assert self._entry_sink is not None and frame.payload is not None
        last = self._last if not self.config.durable else None
        if last is not None and (message_id.ledger, message_id.entry) <= (last.ledger, last.entry):
            self._grant()
            return  # handed over before a reconnection
        payload = frame.payload
        meta = payload.metadata
        undecodable: str | None = None
        try:
            # An encrypted entry comes as it was sent: it cannot be decompressed here.
            data = payload.data if meta.encrypted else _plain(payload, limit)
        except (PulsarError, ValueError) as exc:
            # Handed on as sent, flagged: skipping it would leave a hole in what is read.
            data, undecodable = payload.data, str(exc)
        self._last = message_id
        if self.config.auto_ack:
            data_id = frame.message_id
            self._cumulative = MessageIdData(ledger_id=data_id.ledger_id, entry_id=data_id.entry_id)
            self._want_flush()
        self._entry_sink(self, ReceivedEntry(message_id, meta, data, frame.ack_set, undecodable))
        self._grant()

    def on_corrupt(self, frame: Message) -> None:
        """A MESSAGE that failed its checksum: its permit is given back and the entry asked
        for again; after `_CORRUPT_TRIES` corrupt deliveries it is given up (logged).

        A durable subscription asks for the entry by its id. Apache Pulsar honours the id on
        Shared and Key_Shared subscriptions only: on Exclusive and Failover ones it sends
        every unacknowledged message again, so the messages handed over after the corrupt one
        come again too, after it (at least once, as after a reconnect). A non-durable one (a
        reader) has nothing unacknowledged to ask for, and would filter the entry out as older
        than those handed over after it: it hands over nothing more and subscribes again
        from the last entry handed over before it, as after a lost connection."""
        connection = self._connection
        if self._seeking or self._closed or connection is None:
            return
        data = frame.message_id
        key = (data.ledger_id, data.entry_id)
        tries = self._corrupt[key] = self._corrupt.get(key, 0) + 1
        entry = MessageIdData(ledger_id=data.ledger_id, entry_id=data.entry_id)
        if tries < _CORRUPT_TRIES:
            _limited.warning(
                "corrupt", "%s: a message failed its checksum; asked for again", self.topic
            )
            if not self.config.durable:
                if self._last is None:
                    self._start = MessageId(signed64(data.ledger_id), signed64(data.entry_id))
                connection.drop_consumer(self._consumer_id)
                self._detach()
                # Kept across this subscription only: what gives up corruption at rest.
                self._corrupt[key] = tries
                return  # the new subscription gets permits of its own
            connection.send_command(
                RedeliverUnacknowledgedMessages(consumer_id=self._consumer_id, message_ids=(entry,))
            )
        else:
            del self._corrupt[key]
            log.error(
                "%s: message %d:%d failed its checksum %d times; given up",
                self.topic,
                signed64(data.ledger_id),
                signed64(data.entry_id),
                tries,
            )
            connection.send_command(
                Ack(
                    consumer_id=self._consumer_id,
                    ack_type=AckType.Individual,
                    message_id=(entry,),
                    validation_error=_CHECKSUM_MISMATCH,
                )
            )
        # Its metadata is not to be trusted: one permit, as for a single message.
        self._owed += 1
        self._grant()

    def on_active_change(self, active: bool) -> None:
        if self._on_active is not None:
            self._on_active(active)

    def on_closed_by_broker(self) -> None:
        self._detach()

    def connection_lost(self, connection: BrokerConnection) -> None:
        if connection is self._connection:
            self._detach()

    def _detach(self) -> None:
        self._connection = None
        if self._ready.is_set():
            self._ready = trio.Event()
        self._acks.clear()
        self._cumulative = None
        # Entries corrupt on this subscription may never come again on the next one (acked by
        # another consumer, say): their counts would stay forever.
        self._corrupt.clear()
        self._lost.set()

    # -- permits ---------------------------------------------------------------------------

    def _grant(self) -> None:
        if self._paused or self._owed < max(1, self.config.receiver_queue // 2):
            return
        connection = self._connection
        if connection is not None:
            connection.send_command(Flow(consumer_id=self._consumer_id, message_permits=self._owed))
        self._owed = 0

    def pause(self) -> None:
        """Give no more permits: the broker stops once it used those it has."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        if self._owed:
            connection = self._connection
            if connection is not None:
                connection.send_command(
                    Flow(consumer_id=self._consumer_id, message_permits=self._owed)
                )
            self._owed = 0

    # -- acknowledgements ------------------------------------------------------------------

    def ack(self, message_id: MessageId) -> None:
        """Acknowledge one message (a batch's entry goes once all its members are)."""
        if message_id.batch_index >= 0:
            key = (message_id.ledger, message_id.entry)
            held = self._open_batches.get(key)
            if held is not None:
                held.discard(message_id.batch_index)
                if held:
                    return
                del self._open_batches[key]
        self._queue_ack(
            MessageIdData(ledger_id=message_id.ledger & _M64, entry_id=message_id.entry & _M64)
        )

    def ack_cumulative(self, message_id: MessageId) -> None:
        """Acknowledge every message up to `message_id` (up to the entry before it when it is
        a batch member whose batch is not fully acknowledged)."""
        ledger, entry = message_id.ledger, message_id.entry
        key = (ledger, entry)
        held = self._open_batches.get(key)
        if message_id.batch_index >= 0 and held and held != {message_id.batch_index}:
            if entry == 0:
                return
            entry -= 1
        for done in [k for k in self._open_batches if k <= key]:
            del self._open_batches[done]
        self._cumulative = MessageIdData(ledger_id=ledger & _M64, entry_id=entry & _M64)
        self._want_flush()

    def _queue_ack(self, data: MessageIdData) -> None:
        self._acks.append(data)
        self._want_flush()

    def _want_flush(self) -> None:
        connection = self._connection
        if connection is not None:
            connection.want_flush(self._consumer_id, self)

    def flush(self) -> None:
        """Send the gathered acknowledgements (the connection calls this before it writes)."""
        connection = self._connection
        if connection is None:
            return
        if self._acks:
            acks, self._acks = self._acks, []
            connection.send_command(
                Ack(
                    consumer_id=self._consumer_id,
                    ack_type=AckType.Individual,
                    message_id=tuple(acks),
                )
            )
        if self._cumulative is not None:
            cumulative, self._cumulative = self._cumulative, None
            connection.send_command(
                Ack(
                    consumer_id=self._consumer_id,
                    ack_type=AckType.Cumulative,
                    message_id=(cumulative,),
                )
            )

    def redeliver(self, message_ids: list[MessageId] | None = None) -> None:
        """Ask for these messages again (their entries), or for every unacknowledged one."""
        connection = self._connection
        if connection is None:
            return  # a reconnect redelivers what was not acknowledged anyway
        # The entries come again whole: their members handed over again join what is held.
        entries = {} if message_ids is None else {(m.ledger, m.entry): m for m in message_ids}
        connection.send_command(
            RedeliverUnacknowledgedMessages(
                consumer_id=self._consumer_id,
                message_ids=tuple(to_id_data(MessageId(*key)) for key in entries),
            )
        )

    # -- requests --------------------------------------------------------------------------

    async def _request_connected(self, make: Callable[[BrokerConnection, int], object]) -> None:
        async def attempt() -> None:
            connection = self._connection
            while connection is None:
                if self._closed:
                    raise ClientClosed(f"the consumer of {self.topic} is closed")
                await self._attached()
                connection = self._connection
            await connection.request(
                make(connection, connection.next_id()),  # type: ignore[arg-type]
                self.client.options.operation_timeout,
            )

        await self.client.retrying(f"{self.subscription!r} on {self.topic}", attempt)

    async def _attached(self) -> None:
        await self._ready.wait()

    async def seek(
        self, message_id: MessageId | None = None, *, publish_time: int | None = None
    ) -> None:
        """Reset the subscription to `message_id` (MessageId(-1, -1): the earliest) or to
        `publish_time` (ms); the consumer subscribes again from there."""
        self._seeking = True
        try:
            await self._request_connected(
                lambda connection, rid: Seek(
                    consumer_id=self._consumer_id,
                    request_id=rid,
                    message_id=None if message_id is None else to_id_data(message_id),
                    message_publish_time=publish_time,
                )
            )
        except BaseException:
            self._seeking = False
            raise
        self._last = None
        self._start = message_id
        self._open_batches.clear()  # the subscription starts over from the seek's position
        if self._connection is not None:
            # Brokers that do not close the consumer after a seek: subscribe again all the same.
            connection = self._connection
            connection.drop_consumer(self._consumer_id)
            self._detach()

    async def unsubscribe(self) -> None:
        """Delete the subscription (ServerRefused when other consumers are attached to it)."""
        await self._request_connected(
            lambda connection, rid: Unsubscribe(consumer_id=self._consumer_id, request_id=rid)
        )
        self._stop()

    async def close(self, seconds: float = 10.0) -> None:
        """Flush the acknowledgements and detach from the subscription."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        connection = self._connection
        consumer_id = self._consumer_id
        self.flush()
        self._stop()
        if connection is not None and not connection.closed:
            with trio.move_on_after(seconds):
                try:
                    await connection.request(
                        CloseConsumer(consumer_id=consumer_id, request_id=connection.next_id()),
                        seconds,
                    )
                except DriverError as exc:
                    log.debug("closing %r on %s: %s", self.subscription, self.topic, exc)

    def abort(self) -> None:
        """Close at once (the broker is told, without waiting for its answer)."""
        if self._closed:
            return
        connection = self._connection
        consumer_id = self._consumer_id
        self.flush()
        self._stop()
        if connection is not None and not connection.closed:
            connection.drop_consumer(consumer_id)

    def _stop(self) -> None:
        self._closed = True
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.remove_consumer(self._consumer_id)
        self._lost.set()
        self._ready.set()

    # -- life ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Subscribe (errors before that go to the caller of `start`), then stay subscribed
        until closed, subscribing again wherever the topic moves."""
        await self.client.retrying(
            f"subscribing {self.subscription!r} to {self.topic}", self._attach
        )
        task_status.started()
        try:
            await self._keep_subscribed()
        finally:
            # Nothing subscribes it again once this ends (the client stops, say).
            if not self._closed:
                self._stop()
                if self._on_lost is not None:
                    self._on_lost(ClientClosed(f"the client of {self.topic} stopped"))

    async def _keep_subscribed(self) -> None:
        pause = 0.05
        while not self._closed:
            await self._lost.wait()
            if self._closed:
                return
            try:
                await self._attach()
            except DriverError as exc:
                if self._closed or self.client.closed:
                    return
                if (
                    not retryable(exc)
                    and isinstance(exc, ServerRefused)
                    and exc.error.name in _FATAL
                    # Once subscribed, a busy subscription is the old consumer still going.
                    and exc.error.name != "ConsumerBusy"
                ):
                    log.warning("%r on %s: %s", self.subscription, self.topic, exc)
                    self.error = exc
                    self._stop()
                    if self._on_lost is not None:
                        self._on_lost(exc)
                    return
                log.debug("%r on %s: %s; trying again", self.subscription, self.topic, exc)
                self._lost.set()
                await trio.sleep(pause)
                pause = min(_BACKOFF_MAX, pause * 2)
                continue
            pause = 0.05

    async def _attach(self) -> None:
        connection = await self.client.lookup(self.topic)
        consumer_id = connection.next_id()
        self._lost = trio.Event()
        config = self.config
        start = self._start
        if not config.durable and self._last is not None:
            start = self._last.whole
        connection.add_consumer(consumer_id, self)
        try:
            await connection.request(
                Subscribe(
                    topic=self.topic,
                    subscription=self.subscription,
                    sub_type=config.sub_type,
                    consumer_id=consumer_id,
                    request_id=connection.next_id(),
                    consumer_name=config.name,
                    priority_level=config.priority,
                    durable=config.durable,
                    start_message_id=None if start is None else to_id_data(start),
                    initial_position=config.initial_position,
                    read_compacted=config.read_compacted,
                ),
                self.client.options.operation_timeout,
            )
        except BaseException:
            # The broker may subscribe it all the same (an answer cut off by a timeout or a
            # cancellation): closed right after, in order, so it holds no subscription.
            connection.drop_consumer(consumer_id)
            raise
        if self._closed:
            connection.drop_consumer(consumer_id)
            return
        self._consumer_id = consumer_id
        self._connection = connection
        log.debug("%r subscribed to %s on %s", self.subscription, self.topic, connection.address)
        self._seeking = False
        self._ready.set()
        self._owed = 0
        if self._paused:
            self._owed = config.receiver_queue
        else:
            connection.send_command(
                Flow(consumer_id=consumer_id, message_permits=config.receiver_queue)
            )


def _key(meta: MessageMetadata) -> str | None:
    """The key a message is dispatched by: its ordering key when it has one."""
    if meta.ordering_key is not None:
        return meta.ordering_key.decode("utf-8", "surrogateescape")
    return meta.partition_key


def _encrypted(payload: Payload, message_id: MessageId, redeliveries: int) -> Received:
    """An encrypted entry as it came: neither decompressed nor split (it cannot be)."""
    meta = payload.metadata
    return Received(
        message_id,
        b"" if meta.null_value else payload.data,
        tuple((kv.key, kv.value) for kv in meta.properties),
        _key(meta),
        meta.publish_time,
        meta.event_time or 0,
        meta.producer_name,
        redeliveries,
        encrypted=True,
    )


def _plain(payload: Payload, limit: int) -> bytes:
    meta = payload.metadata
    return decompress(payload.data, meta.compression, meta.uncompressed_size, limit)


async def subscribe(
    client: PulsarClient,
    topic: str,
    subscription: str,
    sink: Sink,
    config: ConsumerConfig | None = None,
    *,
    on_active: Callable[[bool], None] | None = None,
    on_lost: Callable[[DriverError], None] | None = None,
) -> ClientConsumer:
    """A consumer subscribed to `topic`; ServerRefused / Unavailable if it cannot be."""
    consumer = ClientConsumer(
        client,
        topic,
        subscription,
        config or ConsumerConfig(),
        sink,
        on_active=on_active,
        on_lost=on_lost,
    )
    await client.start(consumer.run)
    return consumer


def _no_messages(consumer: ClientConsumer, received: list[Received]) -> None:
    raise AssertionError("a consumer of whole entries hands over no messages")


async def subscribe_entries(
    client: PulsarClient,
    topic: str,
    subscription: str,
    entry_sink: EntrySink,
    config: ConsumerConfig | None = None,
) -> ClientConsumer:
    """A consumer subscribed to `topic` that hands each entry to `entry_sink` whole, as a
    `ReceivedEntry` (a batch is not split into messages: whoever takes it reads it as it
    needs, e.g. straight into columns). Acknowledge by entry (`ack` with the entry's id), or
    read with `auto_ack` on a non-durable subscription."""
    consumer = ClientConsumer(
        client,
        topic,
        subscription,
        config or ConsumerConfig(),
        _no_messages,
        entry_sink=entry_sink,
    )
    await client.start(consumer.run)
    return consumer
