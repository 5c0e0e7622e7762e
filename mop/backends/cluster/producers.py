"""Publishing in separated mode: one pulsar-client producer per topic, made on first use and
closed when idle, with batching for throughput.

A send waits for the broker's receipt when the message has qos >= 1; a qos-0 send returns once
the client has taken the message (its receipt, or failure, only frees its slot). Each producer
has a bounded number of sends in flight; more wait their turn, so a fast publisher is slowed
down rather than refused.

Most qos-0 sends go without a completion callback: every callback runs Python on the client's
I/O thread, which must take the GIL from the trio thread first, once per message, and meanwhile
reads nothing from the broker (receipts, and the messages the proxy's readers wait for). A
producer completes its sends in the order they were made, so the receipt of the next send that
has a callback also frees the slots of the silent ones before it (see `_Entry.silent`): one
qos-0 send in `_MAX_SILENT + 1` has a callback, and so has every qos >= 1 send.
"""

from __future__ import annotations

import logging
from typing import Any

import _pulsar
import trio

from mop.backends.cluster.bridge import Bridge, error_for
from mop.backends.cluster.messages import outgoing
from mop.backends.cluster.options import ProducerOptions
from mop.message import Message, MessageId
from mop.processor.backend import BackendError, PublishResult

__all__ = [
    "NO_ID",
    "ProducerCache",
    "Receipt",
    "message_id_of",
    "pulsar_message",
]

log = logging.getLogger("mop.cluster")

# The id a qos-0 publish returns: it does not wait to learn the real one.
NO_ID = MessageId(-1, -1)

# At most this many silent qos-0 sends in a row on one producer (fewer when `max_pending` is
# small, see `ProducerCache`). Their slots stay taken until a later send's receipt comes, so a
# producer holds at most this many for a topic that went quiet.
_MAX_SILENT = 64


def message_id_of(pulsar_id: Any) -> MessageId:
    return MessageId(pulsar_id.ledger_id(), pulsar_id.entry_id(), pulsar_id.batch_index())


def pulsar_message(message: Message, *, extra: dict[str, str] | None = None) -> Any:
    """The pulsar-client message for `message` (see `mop.backends.cluster.messages`)."""
    out = outgoing(message)
    builder = _pulsar.MessageBuilder()
    builder.content(out.payload)
    for name, value in out.properties.items():
        builder.property(name, value)
    for name, value in (extra or {}).items():
        builder.property(name, value)
    if out.partition_key is not None:
        builder.partition_key(out.partition_key)
    if out.event_time:
        builder.event_timestamp(out.event_time)
    if out.deliver_at:
        builder.deliver_at(out.deliver_at)
    return builder.build()


class _Entry:
    """One topic's producer, or the creation of it in progress."""

    __slots__ = ("created", "error", "last_used", "pending", "producer", "silent", "slots")

    def __init__(self, max_pending: int) -> None:
        self.producer: Any = None
        self.error: BackendError | None = None
        self.created = trio.Event()
        self.slots = trio.Semaphore(max_pending)
        self.pending = 0
        # Sends made without a callback since the last one with a callback: their slots are
        # freed by the receipt of the next send that has one (or stay taken until the producer
        # is closed, when none comes).
        self.silent = 0
        self.last_used = trio.current_time()


class Receipt:
    """The broker's answer to one send, once it comes."""

    __slots__ = ("_cache", "_covers", "_done", "_entry", "_qos", "_result", "_topic")

    def __init__(
        self, cache: ProducerCache, topic: str, entry: _Entry, qos: int, covers: int = 0
    ) -> None:
        self._cache = cache
        self._topic = topic
        self._entry = entry
        self._qos = qos
        # How many silent (callback-less) sends made just before this one it completes too.
        self._covers = covers
        self._done = trio.Event()
        self._result: tuple[Any, Any] | None = None

    def complete(self, result: Any, pulsar_id: Any) -> None:
        entry = self._entry
        freed = 1 + self._covers
        entry.pending -= freed
        for _ in range(freed):
            entry.slots.release()
        self._result = (result, pulsar_id)
        self._done.set()
        if result != _pulsar.Result.Ok and not self._qos:
            log.debug("qos-0 publish to %s failed: %s", self._topic, result)

    async def wait(self) -> PublishResult:
        """The message's id once it is stored; BackendError when it cannot be."""
        await self._done.wait()
        assert self._result is not None
        result, pulsar_id = self._result
        if result != _pulsar.Result.Ok:
            if result == _pulsar.Result.AlreadyClosed:
                self._cache._forget(self._topic, self._entry)
            raise error_for(result, f"publishing to {self._topic}")
        return PublishResult(message_id_of(pulsar_id), None)


class ProducerCache:
    def __init__(self, bridge: Bridge, client: Any, options: ProducerOptions) -> None:
        self._bridge = bridge
        self._client = client
        self._options = options
        self._entries: dict[str, _Entry] = {}
        self._closed = False
        # Fewer than half the slots, so that when all slots are taken most belong to sends
        # whose receipt is coming, and a send waiting for a slot cannot wait for good.
        self._max_silent = min(_MAX_SILENT, (options.max_pending - 1) // 2)

    def __len__(self) -> int:
        return len(self._entries)

    def _config(self, batching: bool) -> Any:
        options = self._options
        conf = _pulsar.ProducerConfiguration()
        conf.send_timeout_millis(max(1, int(options.send_timeout * 1000)))
        conf.max_pending_messages(options.max_pending)
        conf.block_if_queue_full(False)
        if batching and options.batching_delay > 0:
            conf.batching_enabled(True)
            conf.batching_max_publish_delay_ms(max(1, int(options.batching_delay * 1000)))
            conf.batching_max_messages(options.batching_max_messages)
        else:
            conf.batching_enabled(False)
        return conf

    async def _producer(self, topic: str, batching: bool) -> _Entry:
        if self._closed:
            raise BackendError("backend is closed", reason="closed")
        entry = self._entries.get(topic)
        if entry is None:
            entry = self._entries[topic] = _Entry(self._options.max_pending)
            try:
                entry.producer = await self._bridge.call(
                    lambda done: self._client.create_producer_async(
                        topic, self._config(batching), done
                    ),
                    f"creating a producer for {topic}",
                    cleanup=_close_quietly,
                )
            except BaseException as exc:
                if self._entries.get(topic) is entry:
                    del self._entries[topic]
                entry.error = (
                    exc
                    if isinstance(exc, BackendError)
                    else BackendError(f"creating a producer for {topic} was cancelled")
                )
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
        if not message.qos or receipt is None:
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
        """Hand `message` to the topic's producer (waiting for a free slot) and return its
        receipt, to await when the outcome matters; None for a qos-0 message sent without a
        callback, whose outcome is not reported. (A failed qos-0 send is only ever a debug log;
        a broker that stops taking a topic's messages also fails its next send that has a
        callback, which logs it.)"""
        entry = await self._producer(topic, batching)
        built = pulsar_message(message, extra=extra)
        try:
            entry.slots.acquire_nowait()  # the usual case: no wait, no trip to the scheduler
        except trio.WouldBlock:
            await entry.slots.acquire()
        entry.pending += 1
        entry.last_used = trio.current_time()
        if not message.qos and entry.silent < self._max_silent:
            try:
                entry.producer.send_async(built, None)  # an empty callback: C++ calls nothing
            except _pulsar.PulsarException as exc:
                entry.pending -= 1
                entry.slots.release()
                raise BackendError(f"publishing to {topic}: {exc}") from exc
            entry.silent += 1
            return None
        receipt = Receipt(self, topic, entry, message.qos, entry.silent)
        try:
            entry.producer.send_async(
                built,
                lambda result, pulsar_id: self._bridge.soon(receipt.complete, result, pulsar_id),
            )
        except _pulsar.PulsarException as exc:
            entry.pending -= 1
            entry.slots.release()
            raise BackendError(f"publishing to {topic}: {exc}") from exc
        entry.silent = 0
        return receipt

    def _forget(self, topic: str, entry: _Entry) -> None:
        if self._entries.get(topic) is entry:
            del self._entries[topic]  # let the next publish make a new producer

    async def serve_idle_closer(self) -> None:
        """Close producers that sent nothing for `idle_timeout` seconds, until cancelled."""
        idle = self._options.idle_timeout
        while True:
            await trio.sleep(max(0.5, idle / 4))
            now = trio.current_time()
            for topic, entry in list(self._entries.items()):
                if (
                    entry.created.is_set()
                    and entry.producer is not None
                    # Silent sends whose slots no receipt freed are done by now (or fail as
                    # the producer closes, as a qos-0 send may).
                    and entry.pending == entry.silent
                    and now - entry.last_used >= idle
                ):
                    del self._entries[topic]
                    _close_quietly(entry.producer)

    async def aclose(self) -> None:
        """Flush and close every producer (qos-0 sends still in the client get their chance)."""
        self._closed = True
        # The client's threads and descriptors go when the last reference to it does.
        self._client = None
        entries, self._entries = list(self._entries.values()), {}
        for entry in entries:
            if entry.producer is None:
                continue
            with trio.move_on_after(self._options.send_timeout):
                try:
                    await self._bridge.call(entry.producer.close_async, "closing a producer")
                except BackendError as exc:
                    log.debug("%s", exc)


def _close_quietly(handle: Any) -> None:
    handle.close_async(lambda *_: None)
