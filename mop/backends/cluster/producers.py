"""Publishing in separated mode: one producer of the proxy's Pulsar client per topic, made on
first use and closed when idle.

A send waits for the broker's receipt when the message has qos >= 1; a qos-0 send returns once
the producer has taken the message (its outcome is not reported). The producer batches what it
is given between two writes of its connection (`mop.protocols.pulsar.driver.producer`), so a
burst of publishes shares one SEND and one broker write, and bounds the messages without a
receipt: a fast publisher waits for room rather than being refused.
"""

from __future__ import annotations

import logging

import trio

from mop.backends.cluster.errors import error_for
from mop.backends.cluster.messages import outgoing
from mop.backends.cluster.options import ProducerOptions
from mop.message import Message, MessageId
from mop.processor.backend import BackendError, PublishResult
from mop.protocols.pulsar.driver import (
    ClientProducer,
    DriverError,
    ProducerConfig,
    PulsarClient,
    Ticket,
    create_producer,
)

__all__ = ["NO_ID", "ProducerCache", "Receipt"]

log = logging.getLogger("mop.cluster")

# The id a qos-0 publish returns: it does not wait to learn the real one.
NO_ID = MessageId(-1, -1)


class _Entry:
    """One topic's producer, or the creation of it in progress."""

    __slots__ = ("created", "error", "last_used", "producer")

    def __init__(self) -> None:
        self.producer: ClientProducer | None = None
        self.error: BackendError | None = None
        self.created = trio.Event()
        self.last_used = trio.current_time()


class Receipt:
    """The broker's answer to one send, once it comes."""

    __slots__ = ("_cache", "_entry", "_ticket", "_topic")

    def __init__(self, cache: ProducerCache, topic: str, entry: _Entry, ticket: Ticket) -> None:
        self._cache = cache
        self._topic = topic
        self._entry = entry
        self._ticket = ticket

    @property
    def done(self) -> bool:
        """Whether the answer has come (then `result` gives it without waiting)."""
        return self._ticket.done

    async def settled(self) -> None:
        await self._ticket.settled()

    def result(self) -> PublishResult:
        """The message's id; BackendError when it could not be stored. Only once `done`."""
        try:
            return PublishResult(self._ticket.result(), None)
        except DriverError as exc:
            producer = self._entry.producer
            if producer is not None and producer.closed:
                self._cache._forget(self._topic, self._entry)
            raise error_for(exc, f"publishing to {self._topic}") from None

    async def wait(self) -> PublishResult:
        """The message's id once it is stored; BackendError when it cannot be."""
        await self.settled()
        return self.result()


class ProducerCache:
    def __init__(self, client: PulsarClient, options: ProducerOptions) -> None:
        self._client = client
        self._options = options
        self._entries: dict[str, _Entry] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._entries)

    def _config(self, batching: bool) -> ProducerConfig:
        options = self._options
        return ProducerConfig(
            batching=batching and options.batching_delay > 0,
            batch_max_messages=options.batching_max_messages,
            max_pending=options.max_pending,
            send_timeout=options.send_timeout,
        )

    async def _producer(self, topic: str, batching: bool) -> _Entry:
        if self._closed:
            raise BackendError("backend is closed", reason="closed")
        entry = self._entries.get(topic)
        if entry is not None and entry.producer is not None and entry.producer.closed:
            # Fenced, refused or closed under us: the next send makes a new one.
            self._forget(topic, entry)
            entry = None
        if entry is None:
            entry = self._entries[topic] = _Entry()
            try:
                entry.producer = await create_producer(self._client, topic, self._config(batching))
            except BaseException as exc:
                if self._entries.get(topic) is entry:
                    del self._entries[topic]
                if isinstance(exc, DriverError):
                    entry.error = error_for(exc, f"creating a producer for {topic}")
                    raise entry.error from None
                entry.error = BackendError(f"creating a producer for {topic} was cancelled")
                raise
            finally:
                entry.created.set()
        elif not entry.created.is_set():
            await entry.created.wait()
            if entry.error is not None:
                raise entry.error
        return entry

    async def send(
        self,
        topic: str,
        message: Message,
        *,
        batching: bool = True,
        extra: dict[str, str] | None = None,
    ) -> PublishResult:
        """Publish `message` (plus `extra` properties, unchanged) to `topic`; waits for the
        receipt when `message.qos` >= 1. `batching` applies to a producer made for this send."""
        receipt = await self.submit(topic, message, batching=batching, extra=extra)
        if receipt is None:
            await trio.lowlevel.checkpoint()
            return PublishResult(NO_ID, None)
        return await receipt.wait()

    async def submit(
        self,
        topic: str,
        message: Message,
        *,
        batching: bool = True,
        extra: dict[str, str] | None = None,
    ) -> Receipt | None:
        """Hand `message` to the topic's producer (waiting for room) and return its receipt,
        to await when the outcome matters; None for a qos-0 message, whose outcome is not
        reported."""
        try:
            return self.submit_nowait(topic, message, extra=extra)
        except trio.WouldBlock:
            pass
        entry = await self._producer(topic, batching)
        producer = entry.producer
        assert producer is not None
        await producer.wait_for_room()  # returns with room, without a checkpoint after it
        return self._hand_over(topic, entry, producer, message, extra)

    def submit_nowait(
        self, topic: str, message: Message, *, extra: dict[str, str] | None = None
    ) -> Receipt | None:
        """`submit` to a producer that is ready and has room, without waiting (no coroutine
        per message on a publisher's hot path); trio.WouldBlock otherwise."""
        entry = self._entries.get(topic)
        producer = None if entry is None else entry.producer
        if (
            entry is None
            or producer is None
            or producer.closed  # `submit` makes a new one
            or not producer.has_room
            or self._closed
        ):
            raise trio.WouldBlock  # before any work on the message: `submit` does it then
        return self._hand_over(topic, entry, producer, message, extra)

    def _hand_over(
        self,
        topic: str,
        entry: _Entry,
        producer: ClientProducer,
        message: Message,
        extra: dict[str, str] | None,
    ) -> Receipt | None:
        out = outgoing(message)
        properties = out.properties
        if extra:
            properties = tuple({**dict(properties), **extra}.items())
        entry.last_used = trio.current_time()
        try:
            ticket = producer.send_nowait(
                out.payload,
                properties,
                key=out.partition_key,
                event_time=out.event_time,
                deliver_at=out.deliver_at,
                ticket=bool(message.qos),
            )
        except DriverError as exc:
            self._forget(topic, entry)
            raise error_for(exc, f"publishing to {topic}") from None
        return None if ticket is None else Receipt(self, topic, entry, ticket)

    def _forget(self, topic: str, entry: _Entry) -> None:
        if self._entries.get(topic) is entry:
            del self._entries[topic]  # let the next publish make a new producer

    async def release(self, topic: str) -> None:
        """Close this proxy's producer of `topic` unless a send is pending (the topic is to be
        deleted, and a producer kept for MQTT publishers must not hold it in use); the next
        publish to it makes a new one."""
        entry = self._entries.get(topic)
        producer = None if entry is None else entry.producer
        if entry is None or producer is None or producer.pending:
            await trio.lowlevel.checkpoint()
            return
        self._forget(topic, entry)
        await producer.close(self._options.send_timeout)

    async def serve_idle_closer(self) -> None:
        """Close producers that sent nothing for `idle_timeout` seconds, until cancelled."""
        idle = self._options.idle_timeout
        while True:
            await trio.sleep(max(0.5, idle / 4))
            now = trio.current_time()
            for topic, entry in list(self._entries.items()):
                producer = entry.producer
                if producer is not None and not producer.pending and now - entry.last_used >= idle:
                    del self._entries[topic]
                    producer.abort()

    async def aclose(self) -> None:
        """Flush and close every producer (qos-0 sends still queued get their chance)."""
        self._closed = True
        entries, self._entries = list(self._entries.values()), {}
        async with trio.open_nursery() as nursery:
            for entry in entries:
                if entry.producer is not None:
                    nursery.start_soon(entry.producer.close, self._options.send_timeout)
