"""A TCP relay in front of a Pulsar-protocol broker that counts the commands clients send.

Tests and benchmarks put it between clients and a broker to see what reaches the broker (how
many topic listings a proxy makes, say) without the broker knowing:

    async with open_counting_relay("127.0.0.1", broker_port) as relay:
        ... connect clients to relay.service_url ...
        relay.counts[CommandType.GET_TOPICS_OF_NAMESPACE]

Only what goes to the relay's address is counted: a broker's lookup answers name its own
address, so the producers and consumers of pulsar-client go to the broker directly, while its
lookups and topic listings (sent to the service URL) pass here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from mop.protocols.pulsar.commands import Subscribe
from mop.protocols.pulsar.errors import RemoteProtocolError
from mop.protocols.pulsar.frames import FrameDecoder, NeedData, UnknownCommand

__all__ = ["CountingRelay", "open_counting_relay"]

_CHUNK = 65536


class CountingRelay:
    """Counts of the commands clients sent through the relay, by command type number."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.counts: Counter[int] = Counter()
        # SUBSCRIBE commands by (topic, subscription name): who follows what at the broker.
        self.subscriptions: Counter[tuple[str, str]] = Counter()
        self.listen_port = 0

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.listen_port}"

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.listen_port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._relay, listeners)

    async def _relay(self, client: trio.SocketStream) -> None:
        async with client:
            try:
                broker = await trio.open_tcp_stream(self.host, self.port)
            except OSError:
                return
            async with broker, trio.open_nursery() as nursery:
                nursery.start_soon(self._pipe, client, broker, True, nursery.cancel_scope)
                nursery.start_soon(self._pipe, broker, client, False, nursery.cancel_scope)

    async def _pipe(
        self,
        source: trio.SocketStream,
        sink: trio.SocketStream,
        count: bool,
        scope: trio.CancelScope,
    ) -> None:
        decoder = FrameDecoder() if count else None
        try:
            while data := await source.receive_some(_CHUNK):
                if decoder is not None:
                    decoder = self._count(decoder, data)
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            scope.cancel()  # one side gone: the connection is over

    def _count(self, decoder: FrameDecoder, data: bytes) -> FrameDecoder | None:
        decoder.feed(data)
        try:
            while not isinstance(frame := decoder.next_frame(), NeedData):
                kind = (
                    frame.type if isinstance(frame, UnknownCommand) else getattr(frame, "TYPE", -1)
                )
                self.counts[int(kind)] += 1
                if isinstance(frame, Subscribe):
                    self.subscriptions[(frame.topic, frame.subscription)] += 1
        except RemoteProtocolError:
            return None  # not a stream the codec reads: relay it uncounted
        return decoder


@asynccontextmanager
async def open_counting_relay(host: str, port: int) -> AsyncIterator[CountingRelay]:
    """A relay to the broker at (`host`, `port`) for the duration of the block."""
    relay = CountingRelay(host, port)
    async with trio.open_nursery() as nursery:
        await nursery.start(relay.serve)
        try:
            yield relay
        finally:
            nursery.cancel_scope.cancel()
