"""Links from one broker of a mop cluster to the others, over the Pulsar protocol itself.

A pattern consumer asks one broker for the topics of a namespace; in a cluster that broker
must answer for all members, so it asks each peer for its own topics. The peer knows the
request comes from a broker by the client version of its CONNECT (`PEER_CLIENT_VERSION`) and
answers with its local topics only, so a listing never recurses. One connection per peer is
opened when first needed and kept; every request is bounded by short timeouts, and a peer that
is down is left out of the answer (and logged once per outage).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from typing import Final
from urllib.parse import urlsplit

import trio

from mop.protocols.pulsar.commands import (
    PROTOCOL_VERSION,
    Connect,
    Connected,
    Error,
    GetTopicsOfNamespace,
    GetTopicsOfNamespaceResponse,
    Ping,
    Pong,
    TopicsMode,
)
from mop.protocols.pulsar.errors import RemoteProtocolError
from mop.protocols.pulsar.frames import Frame, FrameDecoder, NeedData, encode_command

__all__ = ["PEER_CLIENT_VERSION", "PeerLinks", "is_peer"]

log = logging.getLogger("mop.pulsar.peers")

# What a broker puts in CONNECT.client_version when it asks a peer.
PEER_CLIENT_VERSION: Final = "mop-peer"
CONNECT_TIMEOUT: Final = 1.0
REQUEST_TIMEOUT: Final = 2.0
# After a failure a peer is left alone this long, so that a host that drops packets does not
# make every listing wait for the connect timeout.
RETRY_AFTER: Final = 1.0
DEFAULT_PORT: Final = 6650


def is_peer(client_version: str) -> bool:
    """Whether a connection with this CONNECT client_version is another broker's."""
    return client_version.startswith(PEER_CLIENT_VERSION)


class PeerFailed(Exception):
    """The peer did not answer as a broker should (closed, refused, timed out)."""


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"cluster member URL {url!r} has no host")
    return parts.hostname, parts.port or DEFAULT_PORT


class _Peer:
    """One peer broker and the connection to it (used by one request at a time)."""

    def __init__(self, url: str, *, connect_timeout: float, request_timeout: float) -> None:
        self.url = url
        self.host, self.port = _address(url)
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.down = False
        self._retry_at = 0.0
        self._stream: trio.abc.Stream | None = None
        self._decoder = FrameDecoder()
        self._lock = trio.Lock()
        self._ids = itertools.count()

    async def topics(self, namespace: str, mode: TopicsMode) -> list[str] | None:
        """The peer's own topics of `namespace`, or None when it cannot be reached now."""
        if trio.current_time() < self._retry_at:
            return None
        async with self._lock:
            try:
                with trio.fail_after(self.request_timeout):
                    topics = await self._ask(namespace, mode)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError,
                    RemoteProtocolError, PeerFailed) as exc:
                await self.aclose()
                self._retry_at = trio.current_time() + RETRY_AFTER
                if not self.down:
                    self.down = True
                    log.warning("cluster peer %s is unreachable (%s); topic listings leave it"
                                " out until it is back", self.url, exc or type(exc).__name__)
                return None
        if self.down:
            self.down = False
            log.info("cluster peer %s is back", self.url)
        return topics

    async def _ask(self, namespace: str, mode: TopicsMode) -> list[str]:
        # A kept connection may have been closed by the peer meanwhile: one fresh try then.
        for attempt in (1, 2):
            fresh = self._stream is None
            if fresh:
                await self._connect()
            try:
                return await self._request(namespace, mode)
            except (trio.BrokenResourceError, trio.ClosedResourceError, PeerFailed):
                await self.aclose()
                if fresh or attempt == 2:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _connect(self) -> None:
        with trio.fail_after(self.connect_timeout):
            self._stream = await trio.open_tcp_stream(self.host, self.port)
        self._decoder = FrameDecoder()
        await self._send(Connect(client_version=PEER_CLIENT_VERSION,
                                 protocol_version=PROTOCOL_VERSION))
        answer = await self._next(lambda frame: isinstance(frame, Connected | Error))
        if not isinstance(answer, Connected):
            raise PeerFailed(f"handshake refused: {answer}")

    async def _request(self, namespace: str, mode: TopicsMode) -> list[str]:
        rid = next(self._ids)
        await self._send(GetTopicsOfNamespace(request_id=rid, namespace=namespace, mode=mode))

        def answers(frame: Frame) -> bool:
            return isinstance(frame, GetTopicsOfNamespaceResponse | Error) and (
                frame.request_id == rid
            )

        answer = await self._next(answers)
        if isinstance(answer, Error):
            raise PeerFailed(f"{answer.error.name}: {answer.message}")
        assert isinstance(answer, GetTopicsOfNamespaceResponse)
        return list(answer.topics)

    async def _send(self, command: Connect | GetTopicsOfNamespace | Pong) -> None:
        assert self._stream is not None
        await self._stream.send_all(encode_command(command))

    async def _next(self, wanted: Callable[[Frame], bool]) -> Frame:
        """The next frame that `wanted` accepts, answering PINGs on the way."""
        assert self._stream is not None
        while True:
            frame = self._decoder.next_frame()
            if isinstance(frame, NeedData):
                data = await self._stream.receive_some(65536)
                if not data:
                    raise PeerFailed("connection closed by the peer")
                self._decoder.feed(data)
            elif isinstance(frame, Ping):
                await self._send(Pong())
            elif wanted(frame):
                return frame

    async def aclose(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with trio.CancelScope(shield=True):
                await stream.aclose()


class PeerLinks:
    """The other members of this broker's cluster, asked in parallel."""

    def __init__(
        self,
        urls: Iterable[str],
        *,
        connect_timeout: float = CONNECT_TIMEOUT,
        request_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        self._peers = [
            _Peer(url, connect_timeout=connect_timeout, request_timeout=request_timeout)
            for url in urls
        ]

    def __bool__(self) -> bool:
        return bool(self._peers)

    async def topics(self, namespace: str, mode: TopicsMode) -> set[str]:
        """The topics of `namespace` on every peer that answers in time."""
        found: set[str] = set()

        async def ask(peer: _Peer) -> None:
            topics = await peer.topics(namespace, mode)
            if topics is not None:
                found.update(topics)

        async with trio.open_nursery() as nursery:
            for peer in self._peers:
                nursery.start_soon(ask, peer)
        return found

    async def aclose(self) -> None:
        for peer in self._peers:
            await peer.aclose()
