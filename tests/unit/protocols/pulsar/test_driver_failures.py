"""mop's own Pulsar client against scripted brokers: what it raises when a broker stays silent
or refuses, so that callers get a `DriverError` and never a bare timeout."""

from __future__ import annotations

import itertools

import pytest
import trio

from mop.protocols.pulsar.commands import (
    CloseProducer,
    Command,
    Connect,
    Connected,
    Error,
    Lookup,
    LookupResponse,
    LookupType,
    Producer,
    ProducerSuccess,
    Send,
    SendReceipt,
    Subscribe,
    Success,
)
from mop.protocols.pulsar.driver import (
    ClientOptions,
    MessageTooLarge,
    PulsarClient,
    ServerRefused,
    Unavailable,
    create_producer,
    subscribe,
)
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.metadata import MessageIdData
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


def storing_broker(urls: list[str]) -> Script:
    """A broker that owns every topic, registers every producer and stores every SEND."""
    entries = itertools.count()

    def script(command: Command) -> list[Command]:
        if isinstance(command, Lookup):
            return owner_of_everything(urls, refuse=False)(command)
        if isinstance(command, Producer):
            return [ProducerSuccess(request_id=command.request_id, producer_name="p")]
        if isinstance(command, Send):
            stored = MessageIdData(ledger_id=1, entry_id=next(entries))
            return [
                SendReceipt(
                    producer_id=command.producer_id,
                    sequence_id=command.sequence_id,
                    message_id=stored,
                )
            ]
        if isinstance(command, CloseProducer):
            return [Success(request_id=command.request_id)]
        return []

    return script


async def test_no_send_carries_more_than_the_brokers_max_message_size() -> None:
    """Batches are closed before they would go over the limit of CONNECTED; a message over
    it on its own fails its ticket, is not sent, and the connection goes on."""
    urls: list[str] = []
    limit = 4096
    connected = Connected(server_version="small", protocol_version=20, max_message_size=limit)
    async with scripted_broker(storing_broker(urls), connected=connected) as (url, received):
        urls.append(url)
        client = PulsarClient(url, ClientOptions("test", operation_timeout=2))
        async with trio.open_nursery() as nursery:
            await nursery.start(client.serve)
            with trio.fail_after(5):
                producer = await create_producer(client, "persistent://public/default/t")
                tickets = [await producer.send(bytes([i]) * 1000) for i in range(10)]
                too_large = await producer.send(b"x" * (limit + 1))
                single = await producer.send(b"y" * (limit + 1), deliver_at=1)
                after = await producer.send(b"z" * 1000)
                ids = [await t.wait() for t in (*tickets, after) if t is not None]
                assert len(set(ids)) == 11
                for refused in (too_large, single):
                    assert refused is not None and refused.done
                    with pytest.raises(MessageTooLarge, match="4096"):
                        refused.result()
                await producer.close()
            await client.aclose()
    sends = [c for c in received if isinstance(c, Send)]
    assert sends and all(s.payload is not None and len(s.payload.data) <= limit for s in sends)
    assert sum(s.num_messages for s in sends) == 11  # the refused ones never went
    assert sum(isinstance(c, Connect) for c in received) == 1  # one connection throughout
