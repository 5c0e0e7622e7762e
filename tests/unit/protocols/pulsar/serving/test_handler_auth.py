"""Authentication of a Pulsar connection over in-memory streams on a virtual clock: expired
tokens challenged and refreshed (or the connection closed), answers nobody asked for, and the
rights that change with a refreshed token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import jwt
import trio
import trio.testing

from mop.backends.local import open_local_backend
from mop.broker.storage.memory import MemoryStorage
from mop.processor import MessagingProcessor
from mop.protocols.pulsar.commands import (
    AuthChallenge,
    AuthData,
    AuthResponse,
    Connect,
    Connected,
    Error,
    FeatureFlags,
    Ping,
    Pong,
    Producer,
    ProducerSuccess,
)
from mop.protocols.pulsar.connection import NO_REQUEST_ID, REFRESH_AUTH_DATA
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.frames import encode_command
from mop.protocols.pulsar.serving.server import PulsarServer, Timers
from mop.security.gatekeeper import Gatekeeper
from mop.security.policy import load_policy
from mop.settings import AuthSettings, JwtSettings, PulsarSettings, Settings
from tests.unit.protocols.pulsar.serving.test_handler import Peer, open_peer

SECRET = "a shared secret of thirty-two bytes!"
# The processor's clock: epoch seconds that follow trio's virtual clock.
EPOCH = 1_800_000_000.0
INTERVAL = 5.0


def now() -> float:
    return EPOCH + trio.current_time()


def token(sub: str, lifetime: float, **claims: Any) -> bytes:
    claims = {"sub": sub, "exp": int(now() + lifetime), **claims}
    return jwt.encode(claims, SECRET, algorithm="HS256").encode()


@asynccontextmanager
async def secured_server(
    interval: float = INTERVAL,
) -> AsyncIterator[tuple[PulsarServer, trio.Nursery]]:
    auth = AuthSettings(
        allow_anonymous=False,
        jwt=JwtSettings(secret=SECRET),
        max_failures=0,
        proxy_roles=("proxy",),
    )
    settings = Settings(
        protocols=("pulsar",), pulsar=PulsarSettings(auth_refresh_interval=interval), auth=auth
    )
    gatekeeper = Gatekeeper(load_policy(auth), auth)
    async with open_local_backend(MemoryStorage()) as backend, trio.open_nursery() as nursery:
        processor = MessagingProcessor(backend, gatekeeper=gatekeeper, clock=now)
        # No keepalive PINGs in between: the tests wait minutes of virtual time.
        server = PulsarServer(settings, processor, Timers(keepalive_interval=1e6))
        await nursery.start(server.serve)
        yield server, nursery
        nursery.cancel_scope.cancel()


async def connect(
    peer: Peer, credential: bytes, *, refreshable: bool = True, original: str | None = None
) -> None:
    flags = FeatureFlags(supports_auth_refresh=True) if refreshable else None
    await peer.send(
        Connect(
            client_version="memory",
            protocol_version=20,
            auth_method_name="token",
            auth_data=credential,
            feature_flags=flags,
            original_principal=original,
        )
    )
    assert isinstance(await peer.recv(), Connected)


def answer(credential: bytes) -> AuthResponse:
    return AuthResponse(
        client_version="memory",
        response=AuthData(auth_method_name="token", auth_data=credential),
        protocol_version=20,
    )


async def expect_challenge(peer: Peer, within: float) -> float:
    """When the challenge came."""
    challenge = await peer.recv(within=within)
    assert isinstance(challenge, AuthChallenge), challenge
    assert challenge.challenge == AuthData(auth_method_name="token", auth_data=REFRESH_AUTH_DATA)
    assert challenge.protocol_version == 20
    return trio.current_time()


async def still_served(peer: Peer) -> None:
    await peer.send(Ping())
    assert isinstance(await peer.recv(), Pong)


async def test_a_refreshed_token_keeps_the_connection(autojump_clock: trio.abc.Clock) -> None:
    async with secured_server() as (server, nursery):
        peer = open_peer(server, nursery)
        await connect(peer, token("alice", lifetime=12))
        # Checked every 5 s: valid at 5 and 10, expired at 15.
        assert 14 < await expect_challenge(peer, within=20) < 16
        await peer.send(answer(token("alice", lifetime=12)))
        await still_served(peer)
        # The new token expires at 27: the check at 30 finds it so.
        assert 29 < await expect_challenge(peer, within=20) < 31
        await peer.send(answer(token("alice", lifetime=100)))
        with trio.move_on_after(60):
            await peer.recv(within=100)
            raise AssertionError("challenged or closed with a valid token")
        await still_served(peer)


async def test_a_client_that_cannot_refresh_is_closed(autojump_clock: trio.abc.Clock) -> None:
    async with secured_server() as (server, nursery):
        peer = open_peer(server, nursery)
        await connect(peer, token("alice", lifetime=7), refreshable=False)
        start = trio.current_time()
        assert await peer.recv(within=20) is None  # closed, as Pulsar brokers do: no answer
        assert 9 < trio.current_time() - start < 11


async def test_no_answer_in_time_closes(autojump_clock: trio.abc.Clock) -> None:
    async with secured_server() as (server, nursery):
        peer = open_peer(server, nursery)
        await connect(peer, token("alice", lifetime=3))
        challenged = await expect_challenge(peer, within=10)
        await still_served(peer)  # everything else goes on meanwhile
        assert await peer.recv(within=10) is None
        assert 4.9 < trio.current_time() - challenged < 5.1  # one interval


async def test_the_wait_for_an_answer_is_bounded(autojump_clock: trio.abc.Clock) -> None:
    async with secured_server(interval=600) as (server, nursery):
        peer = open_peer(server, nursery)
        await connect(peer, token("alice", lifetime=3))
        challenged = await expect_challenge(peer, within=700)
        assert await peer.recv(within=100) is None
        assert 59.9 < trio.current_time() - challenged < 60.1


async def test_refused_credentials_are_answered_then_closed(autojump_clock: trio.abc.Clock) -> None:
    async with secured_server() as (server, nursery):
        peer = open_peer(server, nursery)
        await connect(peer, token("alice", lifetime=3))
        await expect_challenge(peer, within=10)
        # The same, expired token; and a PING in the same bytes, which is not served.
        expired = answer(token("alice", lifetime=-1))
        await peer.stream.send_all(encode_command(expired) + encode_command(Ping()))
        assert await peer.recv() == Error(
            request_id=NO_REQUEST_ID,
            error=ServerError.AuthenticationError,
            message="Unable to authenticate",
        )
        assert await peer.recv() is None


async def test_another_principal_is_closed_on(autojump_clock: trio.abc.Clock) -> None:
    async with secured_server() as (server, nursery):
        peer = open_peer(server, nursery)
        await connect(peer, token("alice", lifetime=3))
        await expect_challenge(peer, within=10)
        await peer.send(answer(token("bob", lifetime=100)))
        assert await peer.recv() is None


async def test_an_answer_nobody_asked_for_is_a_protocol_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with secured_server() as (server, nursery):
        peer = open_peer(server, nursery)
        await connect(peer, token("alice", lifetime=100))
        await peer.send(answer(token("alice", lifetime=200)))
        refusal = await peer.recv()
        assert isinstance(refusal, Error) and refusal.error is ServerError.NotAllowedError
        assert await peer.recv() is None


async def test_the_rights_of_a_refreshed_token_apply(autojump_clock: trio.abc.Clock) -> None:
    async with secured_server() as (server, nursery):
        peer = open_peer(server, nursery)
        await connect(peer, token("alice", lifetime=3, acl={"pub": ["a/#"]}))
        a_topic, b_topic = "persistent://public/default/a%2Fx", "persistent://public/default/b%2Fx"
        await peer.send(Producer(topic=a_topic, producer_id=1, request_id=1))
        assert isinstance(await peer.recv(), ProducerSuccess)
        await peer.send(Producer(topic=b_topic, producer_id=2, request_id=2))
        denied = await peer.recv()
        assert isinstance(denied, Error) and denied.error is ServerError.AuthorizationError
        await expect_challenge(peer, within=10)
        await peer.send(answer(token("alice", lifetime=100, acl={"pub": ["b/#"]})))
        await peer.send(Producer(topic=b_topic, producer_id=3, request_id=3))
        assert isinstance(await peer.recv(), ProducerSuccess)
        await peer.send(Producer(topic=a_topic, producer_id=4, request_id=4))
        denied = await peer.recv()
        assert isinstance(denied, Error) and denied.error is ServerError.AuthorizationError


async def test_a_proxy_refreshes_its_own_token(autojump_clock: trio.abc.Clock) -> None:
    async with secured_server() as (server, nursery):
        peer = open_peer(server, nursery)
        # The connection acts as alice, with the proxy's credential and its expiry.
        await connect(peer, token("proxy", lifetime=3), original="alice")
        await expect_challenge(peer, within=10)
        await peer.send(answer(token("proxy", lifetime=100)))
        await still_served(peer)
        with trio.move_on_after(60):
            await peer.recv(within=100)
            raise AssertionError("challenged or closed with a valid token")
        await still_served(peer)
        # Alice's own token is another principal than the proxy's.
        peer = open_peer(server, nursery)
        await connect(peer, token("proxy", lifetime=3), original="alice")
        await expect_challenge(peer, within=10)
        await peer.send(answer(token("alice", lifetime=100)))
        assert await peer.recv() is None
