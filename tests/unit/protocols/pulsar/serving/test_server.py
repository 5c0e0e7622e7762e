"""Two Pulsar adapters of one broker cluster in one process: lookups redirect to the owner,
non-owners refuse producers and consumers, and namespace listings ask the peer over loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import cast

import trio

from mop.backends.local import open_local_backend
from mop.broker.storage.memory import MemoryStorage
from mop.membership import Membership
from mop.message import Message
from mop.processor import MessagingProcessor
from mop.protocols.pulsar.commands import (
    Connect,
    Error,
    GetTopicsOfNamespace,
    GetTopicsOfNamespaceResponse,
    Lookup,
    LookupResponse,
    LookupType,
    Producer,
    ProducerSuccess,
    Subscribe,
    SubType,
)
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.serving.peers import PEER_CLIENT_VERSION, PeerLinks
from mop.protocols.pulsar.serving.server import PulsarServer
from mop.settings import ClusterSettings, PulsarSettings, Settings
from mop.transport import ConnectionInfo
from tests.unit.protocols.pulsar.serving.test_handler import Peer, open_peer

TOPICS = [f"persistent://public/default/c-{n}" for n in range(20)]


@dataclass
class Member:
    url: str
    server: PulsarServer


@asynccontextmanager
async def two_members() -> AsyncIterator[tuple[Member, Member, trio.Nursery]]:
    """Members A and B; B also listens on a loopback port, where A's peer link reaches it."""
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        urls = ["pulsar://127.0.0.1:1", f"pulsar://127.0.0.1:{port}"]
        members = []
        views = [Membership(urls, url) for url in urls]
        async with (
            open_local_backend(MemoryStorage(), membership=views[0]) as a,
            open_local_backend(MemoryStorage(), membership=views[1]) as b,
        ):
            for url, backend, membership in zip(urls, (a, b), views, strict=True):
                settings = Settings(
                    protocols=("pulsar",),
                    pulsar=PulsarSettings(port=int(url.rsplit(":", 1)[1])),
                    cluster=ClusterSettings(brokers=tuple(urls), advertised_url=url),
                )
                server = PulsarServer(settings, MessagingProcessor(backend), membership=membership)
                await nursery.start(server.serve)
                members.append(Member(url, server))

            async def serve_b(stream: trio.SocketStream) -> None:
                info = ConnectionInfo("tcp", ("127.0.0.1", port), ("127.0.0.1", 0))
                await members[1].server.handle_connection(stream, info)

            await nursery.start(trio.serve_listeners, serve_b, listeners)
            yield members[0], members[1], nursery
            nursery.cancel_scope.cancel()


async def connected(member: Member, nursery: trio.Nursery, version: str = "memory") -> Peer:
    peer = open_peer(member.server, nursery)
    await peer.send(Connect(client_version=version, protocol_version=20))
    await peer.recv()
    return peer


def split(a: Member, b: Member) -> tuple[str, str]:
    """A topic A owns and one B owns."""
    ownership = Membership((a.url, b.url), a.url)
    mine = next(t for t in TOPICS if ownership.owns(t))
    theirs = next(t for t in TOPICS if not ownership.owns(t))
    return mine, theirs


async def test_lookups_redirect_to_the_owner_which_answers_connect() -> None:
    async with two_members() as (a, b, nursery):
        mine, theirs = split(a, b)
        peer = await connected(a, nursery)
        await peer.send(Lookup(topic=mine, request_id=1))
        answer = await peer.recv()
        assert isinstance(answer, LookupResponse) and answer.response is LookupType.Connect
        await peer.send(Lookup(topic=theirs, request_id=2))
        answer = await peer.recv()
        assert isinstance(answer, LookupResponse)
        assert (answer.response, answer.broker_service_url, answer.authoritative) == (
            LookupType.Redirect,
            b.url,
            True,
        )
        # The client repeats the lookup at the owner, authoritative: that one connects.
        at_owner = await connected(b, nursery)
        await at_owner.send(Lookup(topic=theirs, request_id=3, authoritative=True))
        answer = await at_owner.recv()
        assert isinstance(answer, LookupResponse) and answer.response is LookupType.Connect


async def test_a_non_owner_refuses_producers_and_consumers() -> None:
    async with two_members() as (a, b, nursery):
        mine, theirs = split(a, b)
        peer = await connected(a, nursery)
        await peer.send(Producer(topic=theirs, producer_id=1, request_id=1))
        refused = await peer.recv()
        assert isinstance(refused, Error) and refused.error is ServerError.ServiceNotReady
        await peer.send(
            Subscribe(
                topic=theirs,
                subscription="s",
                sub_type=SubType.Exclusive,
                consumer_id=1,
                request_id=2,
            )
        )
        refused = await peer.recv()
        assert isinstance(refused, Error) and refused.error is ServerError.ServiceNotReady
        await peer.send(Producer(topic=mine, producer_id=2, request_id=3))
        assert isinstance(await peer.recv(), ProducerSuccess)


async def list_topics(peer: Peer) -> set[str]:
    await peer.send(GetTopicsOfNamespace(request_id=9, namespace="public/default"))
    answer = await peer.recv()
    assert isinstance(answer, GetTopicsOfNamespaceResponse), answer
    return set(answer.topics)


async def test_listings_cover_the_peer_but_a_peer_gets_local_topics_only() -> None:
    async with two_members() as (a, b, nursery):
        mine, theirs = split(a, b)
        for member, topic in ((a, mine), (b, theirs)):
            await member.server.processor.backend.publish(topic, Message(b"x"))
        assert await list_topics(await connected(a, nursery)) == {mine, theirs}
        # A broker asking for a listing gets what the member holds itself.
        assert await list_topics(await connected(a, nursery, PEER_CLIENT_VERSION)) == {mine}


async def test_a_peer_that_is_down_is_left_out() -> None:
    async with two_members() as (a, b, nursery):
        mine, _ = split(a, b)
        await a.server.processor.backend.publish(mine, Message(b"x"))
        peer = await connected(a, nursery)
        # A's link to B points at a port where nobody listens any more.
        a.server.peers = PeerLinks(["pulsar://127.0.0.1:1"])
        assert await list_topics(peer) == {mine}


def urls_for(
    info: ConnectionInfo,
    *,
    host: str = "127.0.0.1",
    port: int = 6650,
    tls_port: int = 6651,
    advertised: str | None = None,
    membership: Membership | None = None,
) -> tuple[str, str | None]:
    """What lookups answer a client connected as `info` says: the plain and the TLS URL."""
    settings = Settings(
        protocols=("pulsar",),
        pulsar=PulsarSettings(host=host, port=port, tls_port=tls_port),
        cluster=ClusterSettings(advertised_url=advertised),
    )
    server = PulsarServer(settings, cast(MessagingProcessor, None), membership=membership)
    return server.service_url(info), server.service_url_tls(info)


def test_lookup_urls_of_plain_and_tls_connections() -> None:
    plain = ConnectionInfo("tcp", ("127.0.0.1", 6650), ("127.0.0.1", 5000))
    tls = ConnectionInfo("tls", ("127.0.0.1", 7001), ("127.0.0.1", 5000))
    assert urls_for(plain) == ("pulsar://127.0.0.1:6650", None)
    # The TLS listener bound 7001 (tls_port 0); the plain one is the one the node advertises.
    bound = Membership((), "pulsar://127.0.0.1:7000")
    assert urls_for(tls, port=0, tls_port=0, membership=bound) == (
        "pulsar://127.0.0.1:7000",
        "pulsar+ssl://127.0.0.1:7001",
    )
    assert urls_for(tls) == ("pulsar://127.0.0.1:6650", "pulsar+ssl://127.0.0.1:7001")


def test_lookup_urls_on_wildcard_addresses_name_the_address_the_client_reached() -> None:
    tls = ConnectionInfo("tls", ("10.1.2.3", 6651), ("10.9.9.9", 5000))
    assert urls_for(tls, host="0.0.0.0") == ("pulsar://10.1.2.3:6650", "pulsar+ssl://10.1.2.3:6651")
    tls6 = ConnectionInfo("tls", ("::1", 6651), ("::1", 5000))
    assert urls_for(tls6, host="::") == ("pulsar://[::1]:6650", "pulsar+ssl://[::1]:6651")


def test_lookup_urls_with_an_advertised_url() -> None:
    tls = ConnectionInfo("tls", ("127.0.0.1", 7001), ("127.0.0.1", 5000))
    advertised = "pulsar://broker.example:6650"
    assert urls_for(tls, advertised=advertised) == (advertised, "pulsar+ssl://broker.example:6651")
    assert urls_for(tls, advertised=advertised, tls_port=0)[1] == "pulsar+ssl://broker.example:7001"
    plain = ConnectionInfo("tcp", ("127.0.0.1", 6650), ("127.0.0.1", 5000))
    assert urls_for(plain, advertised=advertised) == (advertised, None)
