"""The client side of the Pulsar protocol (`mop.protocols.pulsar.client`) against scripted
brokers on loopback: topic listings, lookups that follow redirects, and how failures are told
apart."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio

from mop.protocols.pulsar import client
from mop.protocols.pulsar.client import (
    LinkFailed,
    LookupFailed,
    UnexpectedAnswer,
    Unreachable,
)
from mop.protocols.pulsar.commands import (
    PROTOCOL_VERSION,
    Command,
    Connect,
    Connected,
    Error,
    GetTopicsOfNamespace,
    GetTopicsOfNamespaceResponse,
    Lookup,
    LookupResponse,
    LookupType,
    Ping,
    Pong,
    Success,
    TopicsMode,
)
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.frames import FrameDecoder, NeedData, encode_command

# A scripted broker answers each request with the commands this returns (or frames as bytes).
Script = Callable[[Command], Sequence[Command | bytes]]


@asynccontextmanager
async def scripted_broker(
    script: Script, *, connected: Connected | None = None
) -> AsyncIterator[tuple[str, list[Command]]]:
    """A broker on loopback that completes the handshake (answering `connected`, by default
    a plain CONNECTED) and answers requests by `script`; yields its service URL and the
    requests it received (CONNECT included)."""
    received: list[Command] = []
    hello = connected or Connected(server_version="scripted", protocol_version=PROTOCOL_VERSION)

    async def serve(stream: trio.SocketStream) -> None:
        decoder = FrameDecoder()
        async with stream:
            while data := await stream.receive_some(65536):
                decoder.feed(data)
                while not isinstance(frame := decoder.next_frame(), NeedData):
                    assert isinstance(frame, Command)
                    received.append(frame)
                    if isinstance(frame, Connect):
                        answers: Sequence[Command | bytes] = [hello]
                    elif isinstance(frame, Pong):
                        answers = []
                    else:
                        answers = script(frame)
                    for answer in answers:
                        if not isinstance(answer, bytes):
                            answer = encode_command(answer)
                        await stream.send_all(answer)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        yield f"pulsar://127.0.0.1:{port}", received
        nursery.cancel_scope.cancel()


def topics_of(topics: dict[str, list[str]]) -> Script:
    def script(command: Command) -> list[Command]:
        assert isinstance(command, GetTopicsOfNamespace)
        # A PING on the way is answered by the client, not taken for the answer.
        return [
            Ping(),
            GetTopicsOfNamespaceResponse(
                request_id=command.request_id, topics=tuple(topics[command.namespace])
            ),
        ]

    return script


async def test_list_topics_asks_the_namespace_with_its_mode() -> None:
    listed = ["persistent://t/n/b", "persistent://t/n/a"]
    async with scripted_broker(topics_of({"t/n": listed})) as (url, received):
        link = await client.connect_first(url, "test-client")
        try:
            assert await client.list_topics(link, "t/n") == listed
            assert await client.list_topics(link, "t/n", TopicsMode.PERSISTENT) == listed
        finally:
            await link.aclose()
    connect, *requests = received
    assert isinstance(connect, Connect) and connect.client_version == "test-client"
    asks = [r for r in requests if isinstance(r, GetTopicsOfNamespace)]
    assert [(a.namespace, a.mode) for a in asks] == [
        ("t/n", TopicsMode.ALL),
        ("t/n", TopicsMode.PERSISTENT),
    ]
    assert len({a.request_id for a in asks}) == 2
    assert sum(isinstance(r, Pong) for r in requests) == 2


async def test_list_topics_tells_a_refusal_from_an_unexpected_answer() -> None:
    def script(command: Command) -> list[Command]:
        assert isinstance(command, GetTopicsOfNamespace)
        if command.namespace == "t/refused":
            return [
                Error(
                    request_id=command.request_id,
                    error=ServerError.AuthorizationError,
                    message="no",
                )
            ]
        return [Success(request_id=command.request_id)]

    async with scripted_broker(script) as (url, _):
        link = await client.connect_first(url, "test-client")
        try:
            with pytest.raises(LinkFailed) as refused:
                await client.list_topics(link, "t/refused")
            assert refused.value.error is not None
            assert refused.value.error.error is ServerError.AuthorizationError
            with pytest.raises(UnexpectedAnswer, match="unexpected answer Success"):
                await client.list_topics(link, "t/other")
        finally:
            await link.aclose()


async def test_connect_first_skips_brokers_that_do_not_answer() -> None:
    async with scripted_broker(topics_of({})) as (url, _):
        port = url.rsplit(":", 1)[1]
        # Port 1 on loopback refuses the connection; the second host answers.
        link = await client.connect_first(f"pulsar://127.0.0.1:1,127.0.0.1:{port}", "test-client")
        await link.aclose()


async def test_connect_first_says_when_no_broker_answers() -> None:
    with pytest.raises(Unreachable, match=r"no broker of pulsar://127\.0\.0\.1:1 answers"):
        await client.connect_first("pulsar://127.0.0.1:1", "test-client")
    with pytest.raises(ValueError, match="not a pulsar://"):
        await client.connect_first("http://127.0.0.1:1", "test-client")


async def test_lookup_follows_redirects_to_the_owner() -> None:
    owner = "pulsar://owner.example:6650"

    def owning(command: Command) -> list[Command]:
        assert isinstance(command, Lookup) and command.authoritative
        return [
            LookupResponse(
                request_id=command.request_id,
                response=LookupType.Connect,
                broker_service_url=owner,
            )
        ]

    async with scripted_broker(owning) as (owner_url, owner_received):

        def redirecting(command: Command) -> list[Command]:
            assert isinstance(command, Lookup) and not command.authoritative
            return [
                LookupResponse(
                    request_id=command.request_id,
                    response=LookupType.Redirect,
                    broker_service_url=owner_url,
                    authoritative=True,
                )
            ]

        async with scripted_broker(redirecting) as (first_url, first_received):
            assert await client.lookup(first_url, "persistent://t/n/x", "test-client") == owner
    for received in (first_received, owner_received):
        [lookup] = [r for r in received if isinstance(r, Lookup)]
        assert lookup.topic == "persistent://t/n/x"


async def test_lookup_failures() -> None:
    def failing(command: Command) -> list[Command]:
        assert isinstance(command, Lookup)
        if command.topic == "failed":
            return [LookupResponse(request_id=command.request_id, response=LookupType.Failed)]
        if command.topic == "nowhere":
            return [LookupResponse(request_id=command.request_id, response=LookupType.Connect)]
        return [Error(request_id=command.request_id, error=ServerError.TopicNotFound, message="no")]

    async with scripted_broker(failing) as (url, _):
        with pytest.raises(LookupFailed, match="lookup of failed failed: LookupResponse"):
            await client.lookup(url, "failed", "test-client")
        with pytest.raises(LookupFailed, match="lookup of nowhere: no broker URL in"):
            await client.lookup(url, "nowhere", "test-client")
        with pytest.raises(LinkFailed, match="TopicNotFound: no") as refused:
            await client.lookup(url, "refused", "test-client")
        assert not isinstance(refused.value, LookupFailed) and refused.value.error is not None

    def redirect_to_itself(command: Command) -> list[Command]:
        assert isinstance(command, Lookup)
        return [
            LookupResponse(
                request_id=command.request_id,
                response=LookupType.Redirect,
                broker_service_url=looping_url,
            )
        ]

    async with scripted_broker(redirect_to_itself) as (looping_url, received):
        with pytest.raises(LookupFailed, match="more than 3 redirects"):
            await client.lookup(looping_url, "t", "test-client", max_redirects=3)
    assert sum(isinstance(r, Lookup) for r in received) == 3
