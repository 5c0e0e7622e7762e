"""Whole entries of one topic from a start position, read with mop's trio-native Pulsar driver
in a thread of their own and handed to the Spark task's thread through a queue.

A Spark task is plain threaded Python, so the driver runs its own trio loop in a worker thread.
The reader is a non-durable subscription, as pulsar-client's readers are: it works against any
Pulsar-protocol broker. It is paused (no more permits) while more than a few receiver queues'
worth of messages, or some tens of megabytes of entries, wait for the task.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Final

import trio

from mop.message import MessageId
from mop.protocols.pulsar.client import ClientAuth
from mop.protocols.pulsar.commands import InitialPosition, SubType
from mop.protocols.pulsar.driver import (
    ClientConsumer,
    ClientOptions,
    ConsumerConfig,
    PulsarClient,
    ReceivedEntry,
    subscribe_entries,
)
from mop.version import VERSION

__all__ = ["EntryFeed"]

# Permits of the reader, in messages: a producer batch is up to some thousands of them.
PERMITS: Final = 20_000
# Messages waiting for the task above which the reader is paused, and below which it goes on.
_HIGH: Final = 2 * PERMITS
_LOW: Final = PERMITS // 2
# The same in bytes of the entries waiting: a few large batches are already a lot of memory.
_HIGH_BYTES: Final = 64 * 1024 * 1024
_LOW_BYTES: Final = _HIGH_BYTES // 4
# How long closing the reader's connection may take.
_CLOSE_S: Final = 5.0


class _Failed:
    """What the worker thread puts last in the queue when reading failed."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class EntryFeed:
    """`with EntryFeed(...) as feed:` reads `topic` from just after position `start` (its
    entry included: a position may name a message inside a batch); `feed.get(seconds)` is
    the next entry, or None when none came in that time."""

    def __init__(
        self, service_url: str, auth: ClientAuth, topic: str, start: MessageId, timeout_ms: int
    ) -> None:
        self._url = service_url
        self._auth = auth
        self._topic = topic
        self._start = start
        self._timeout = max(1.0, timeout_ms / 1000)
        self._queue: queue.SimpleQueue[ReceivedEntry | _Failed] = queue.SimpleQueue()
        # Messages in the queue, and whether the reader is paused: both threads change them,
        # under the lock (`+=` is no atomic operation, even under the GIL).
        self._lock = threading.Lock()
        self._waiting = 0
        self._waiting_bytes = 0
        self._paused = False
        self._token: trio.lowlevel.TrioToken | None = None
        self._consumer: ClientConsumer | None = None
        self._stop: trio.Event | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"mop-fetch {topic}", daemon=True)

    def __enter__(self) -> EntryFeed:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._closing = True  # seen by the worker if it has not started its loop yet
        self._call(self._set_stop)
        self._thread.join(self._timeout + _CLOSE_S)

    def get(self, seconds: float) -> ReceivedEntry | None:
        """The next entry; None after `seconds` without one. Raises what reading failed with."""
        try:
            item = self._queue.get(timeout=seconds)
        except queue.Empty:
            return None
        if isinstance(item, _Failed):
            raise item.error
        with self._lock:
            self._waiting -= item.metadata.message_count
            self._waiting_bytes -= len(item.data)
            resume = self._paused and self._waiting <= _LOW and self._waiting_bytes <= _LOW_BYTES
            if resume:
                self._paused = False
        if resume:
            self._call(self._resume)
        return item

    # -- the worker thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            trio.run(self._read)
        except BaseException as exc:  # handed to the task's thread, which raises it
            self._queue.put(_Failed(exc))

    async def _read(self) -> None:
        self._stop = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        if self._closing:
            return
        options = ClientOptions(
            f"mop-spark {VERSION}", operation_timeout=self._timeout, auth=self._auth
        )
        client = PulsarClient(self._url, options)
        async with trio.open_nursery() as nursery:
            await nursery.start(client.serve)
            start = self._start
            config = ConsumerConfig(
                sub_type=SubType.Exclusive,
                durable=False,
                initial_position=InitialPosition.Earliest,
                # As pulsar-client readers do: the earliest is an id too (-1:-1).
                start_message_id=start.whole,
                receiver_queue=PERMITS,
                auto_ack=True,
            )
            self._consumer = await subscribe_entries(
                client, self._topic, f"reader-{uuid.uuid4().hex[:10]}", self._take, config
            )
            await self._stop.wait()
            with trio.move_on_after(_CLOSE_S):
                await client.aclose()
            nursery.cancel_scope.cancel()

    def _take(self, consumer: ClientConsumer, entry: ReceivedEntry) -> None:
        with self._lock:
            # Counted before the task can take it, so that the count never goes below zero.
            self._waiting += entry.metadata.message_count
            self._waiting_bytes += len(entry.data)
            pause = not self._paused and (
                self._waiting >= _HIGH or self._waiting_bytes >= _HIGH_BYTES
            )
            if pause:
                self._paused = True
        self._queue.put(entry)
        if pause:
            consumer.pause()

    def _resume(self) -> None:
        # On the worker, as `_take` is: a pause made since the task asked for this stays.
        with self._lock:
            paused = self._paused
        if self._consumer is not None and not paused:
            self._consumer.resume()

    def _set_stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def _call(self, function: Callable[[], None]) -> None:
        """Run `function` on the worker's trio loop, if it still runs."""
        token = self._token
        if token is None:
            return
        with contextlib.suppress(trio.RunFinishedError, RuntimeError):  # the worker is done
            trio.from_thread.run_sync(function, trio_token=token)
