"""mop's own Pulsar client against scripted brokers: what it raises when a broker stays silent
or refuses, so that callers get a `DriverError` and never a bare timeout."""

from __future__ import annotations

import pytest
import trio

from mop.protocols.pulsar.commands import (
    Command,
    Error,
    Lookup,
    LookupResponse,
    LookupType,
    Producer,
    Subscribe,
)
from mop.protocols.pulsar.driver import (
    ClientOptions,
    PulsarClient,
    ServerRefused,
    Unavailable,
    create_producer,
    subscribe,
)
from mop.protocols.pulsar.errors import ServerError
from tests.unit.protocols.pulsar.test_client import Script, scripted_broker


def owner_of_everything(urls: list[str], *, refuse: bool) -> Script:
    """A broker that owns every topic (its URL: `urls[0]`, known once it listens) and then
    refuses producers and consumers (`refuse`) or never answers them."""

    def script(command: Command) -> list[Command]:
        if isinstance(command, Lookup):
            return [
                LookupResponse(
                    request_id=command.request_id,
                    broker_service_url=urls[0],
                    response=LookupType.Connect,
                )
            ]
        if refuse and isinstance(command, Producer | Subscribe):
            return [
                Error(
                    request_id=command.request_id,
                    error=ServerError.AuthorizationError,
                    message="not for you",
                )
            ]
        return []  # silence

    return script


async def test_a_silent_broker_is_unavailable_within_the_operation_timeout() -> None:
    urls: list[str] = []
    async with scripted_broker(owner_of_everything(urls, refuse=False)) as (url, _received):
        urls.append(url)
        client = PulsarClient(url, ClientOptions("test", operation_timeout=0.5))
        async with trio.open_nursery() as nursery:
            await nursery.start(client.serve)
            with trio.fail_after(5):
                with pytest.raises(Unavailable):
                    await subscribe(client, "persistent://public/default/t", "s", lambda *_: None)
                with pytest.raises(Unavailable):
                    await create_producer(client, "persistent://public/default/t")
            await client.aclose()


async def test_a_refusal_carries_its_server_error() -> None:
    urls: list[str] = []
    async with scripted_broker(owner_of_everything(urls, refuse=True)) as (url, _received):
        urls.append(url)
        client = PulsarClient(url, ClientOptions("test", operation_timeout=2))
        async with trio.open_nursery() as nursery:
            await nursery.start(client.serve)
            with trio.fail_after(5):
                with pytest.raises(ServerRefused) as refused:
                    await subscribe(client, "persistent://public/default/t", "s", lambda *_: None)
            assert refused.value.error is ServerError.AuthorizationError
            await client.aclose()
