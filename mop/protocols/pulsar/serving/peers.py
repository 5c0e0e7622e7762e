"""Links from one broker of a mop cluster to the others, over the Pulsar protocol itself.

A pattern consumer asks one broker for the topics of a namespace; in a cluster that broker
must answer for all members, so it asks each peer for its own topics. A client asks any broker
for a partitioned topic's metadata, and a lookup may name a listener: the member that owns the
topic knows the answer, and is asked. The peer knows the
request comes from a broker by the client version of its CONNECT (`PEER_CLIENT_VERSION`) and
answers from what it holds itself, so a request never recurses. One connection per peer is
opened when first needed and kept; every request is bounded by short timeouts, and a peer that
is down is left out of the answer (and logged once per outage).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Final, TypeVar

import trio

from mop.membership import normalize_url
from mop.protocols.pulsar import client
from mop.protocols.pulsar.client import (
    NO_AUTH,
    ClientAuth,
    LinkFailed,
    PulsarLink,
    UnexpectedAnswer,
    service_addresses,
)
from mop.protocols.pulsar.commands import Command, TopicsMode
from mop.protocols.pulsar.frames import Frame

__all__ = ["PEER_CLIENT_VERSION", "PeerLinks", "is_peer"]

log = logging.getLogger("mop.pulsar.peers")

# What a broker puts in CONNECT.client_version when it asks a peer.
PEER_CLIENT_VERSION: Final = "mop-peer"
CONNECT_TIMEOUT: Final = 1.0
REQUEST_TIMEOUT: Final = 2.0
# After a failure a peer is left alone this long, so that a host that drops packets does not
# make every listing wait for the connect timeout.
RETRY_AFTER: Final = 1.0
_T = TypeVar("_T")


def is_peer(client_version: str) -> bool:
    """Whether a connection with this CONNECT client_version is another broker's."""
    return client_version.startswith(PEER_CLIENT_VERSION)


class _Peer:
    """One peer broker and the link to it (used by one request at a time)."""

    def __init__(
        self, url: str, *, connect_timeout: float, request_timeout: float, auth: ClientAuth
    ) -> None:
        self.url = url
        self.auth = auth
        [(self.host, self.port)], self.tls = service_addresses(url)
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.down = False
        self._retry_at = 0.0
        self._link: PulsarLink | None = None
        self._lock = trio.Lock()

    async def topics(self, namespace: str, mode: TopicsMode) -> list[str] | None:
        """The peer's own topics of `namespace`, or None when it cannot be reached now."""
        return await self._use(lambda link: client.list_topics(link, namespace, mode))

    async def ask(self, command_for: Callable[[int], Command]) -> Frame | None:
        """The peer's answer to the command `command_for(request_id)` makes, or None when it
        cannot be reached now."""
        return await self._use(lambda link: link.ask(command_for(link.request_id())))

    async def _use(self, request: Callable[[PulsarLink], Awaitable[_T]]) -> _T | None:
        """`request` made over the link (opened when needed), or None when the peer cannot
        be reached now (it is then left alone for RETRY_AFTER)."""
        if trio.current_time() < self._retry_at:
            return None
        async with self._lock:
            try:
                with trio.fail_after(self.request_timeout):
                    answer = await self._request(request)
            except (trio.TooSlowError, LinkFailed) as exc:
                await self.aclose()
                self._retry_at = trio.current_time() + RETRY_AFTER
                if not self.down:
                    self.down = True
                    log.warning(
                        "cluster peer %s is unreachable (%s); topic listings leave it"
                        " out and its topics' metadata cannot be asked until it is back",
                        self.url,
                        exc or type(exc).__name__,
                    )
                return None
            except UnexpectedAnswer as exc:
                # The peer is there but refused (or did not understand) this request.
                log.info("cluster peer %s: %s", self.url, exc)
                return None
        if self.down:
            self.down = False
            log.info("cluster peer %s is back", self.url)
        return answer

    async def _request(self, request: Callable[[PulsarLink], Awaitable[_T]]) -> _T:
        # A kept link may have been closed by the peer meanwhile: one fresh try then.
        for attempt in (1, 2):
            link = self._link
            fresh = link is None
            if link is None:
                with trio.fail_after(self.connect_timeout):
                    link = self._link = await PulsarLink.connect(
                        self.host, self.port, PEER_CLIENT_VERSION, tls=self.tls, auth=self.auth
                    )
            try:
                return await request(link)
            except UnexpectedAnswer:
                raise  # the link works; the peer answered something else
            except LinkFailed as exc:
                if exc.error is not None:
                    raise UnexpectedAnswer(str(exc)) from None  # an ERROR: the link works
                await self.aclose()
                if fresh or attempt == 2:
                    raise
                continue
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            await link.aclose()


class PeerLinks:
    """The other members of this broker's cluster, asked in parallel."""

    def __init__(
        self,
        urls: Iterable[str],
        *,
        connect_timeout: float = CONNECT_TIMEOUT,
        request_timeout: float = REQUEST_TIMEOUT,
        auth: ClientAuth = NO_AUTH,
    ) -> None:
        # `auth`: this broker's own credentials (cluster.auth), one of the peers' proxy roles.
        self._peers = [
            _Peer(url, connect_timeout=connect_timeout, request_timeout=request_timeout, auth=auth)
            for url in urls
        ]
        self._by_url = {normalize_url(peer.url): peer for peer in self._peers}

    def __bool__(self) -> bool:
        return bool(self._peers)

    async def ask(self, url: str, command_for: Callable[[int], Command]) -> Frame | None:
        """The answer of peer `url` (a member URL) to the command `command_for(request_id)`
        makes; None when it cannot be reached now, is not a peer, or answers with an ERROR
        (logged: the caller answers its own client as for a peer that cannot be asked)."""
        peer = self._by_url.get(normalize_url(url))
        if peer is None:
            return None
        return await peer.ask(command_for)

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
