"""Advertised listeners, with pulsar-client's `listener_name` (sync and asyncio): a lookup that
names a listener is answered with that listener's URL, on a single node and in a mop broker
cluster of two, where a member asks the owner of the topic for its listener; a name no broker
has is refused at once."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from collections.abc import Iterator

import pulsar
import pytest
from pulsar.asyncio import Client as AsyncClient
from pulsar.asyncio import PulsarException

from mop.membership import Membership
from mop.protocols.pulsar.commands import Lookup, LookupResponse, LookupType
from mop.settings import PulsarSettings
from tests.e2e.nodeproc import NodeProcess, broker_process
from tests.e2e.pulsar.test_broker_cluster import ask, free_ports, raw_connected
from tests.e2e.pulsar_support import TIMEOUT_MS, pulsar_client, pulsar_node, pulsar_settings

pytestmark = pytest.mark.e2e


def client_of(url: str, listener: str, **options: object) -> pulsar.Client:
    return pulsar.Client(
        url,
        listener_name=listener,
        operation_timeout_seconds=10,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        **options,
    )


def test_a_single_node_answers_with_the_named_listener() -> None:
    [port] = free_ports(1)
    settings = dataclasses.replace(
        pulsar_settings(),
        pulsar=PulsarSettings(
            port=port,
            # "external" names the node by another address than the client's service URL.
            advertised_listeners={"external": f"pulsar://localhost:{port}"},
        ),
    )
    topic = "persistent://public/default/listened"
    with pulsar_node(settings) as node:
        raw = raw_connected(port)
        try:
            answer = ask(
                raw, Lookup(topic=topic, request_id=1, advertised_listener_name="external")
            )
        finally:
            raw.close()
        assert isinstance(answer, LookupResponse) and answer.response is LookupType.Connect
        assert answer.broker_service_url == f"pulsar://localhost:{port}"
        client = client_of(f"pulsar://127.0.0.1:{port}", "external")
        try:
            consumer = client.subscribe(topic, "s")
            client.create_producer(topic).send(b"through external")
            assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"through external"
        finally:
            client.close()
        # No listener name: the listener the client came in on, as before.
        with pulsar_client(node) as plain:
            plain.create_producer(topic).send(b"plain")


def test_an_unknown_listener_is_refused_at_once() -> None:
    with pulsar_node() as node, pulsar_client(node, listener_name="nowhere") as client:
        with pytest.raises(pulsar.NotAllowedError):
            client.create_producer("persistent://public/default/unlistened")

        async def scenario() -> None:
            port = node.node.address("pulsar", "tcp")[1]
            async_client = AsyncClient(f"pulsar://127.0.0.1:{port}", listener_name="nowhere")
            try:
                await async_client.create_producer("persistent://public/default/unlistened")
            finally:
                await async_client.close()

        with pytest.raises(PulsarException, match="NotAllowed"):
            asyncio.run(scenario())


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two brokers, each with an "internal" listener (its member URL) and an "external" one
    (the same port, named `localhost`); yields their member URLs."""
    root = tmp_path_factory.mktemp("listeners")
    ports = free_ports(2)
    urls = [f"pulsar://127.0.0.1:{port}" for port in ports]
    brokers: list[NodeProcess] = []
    try:
        for index, (port, url) in enumerate(zip(ports, urls, strict=True)):
            # A table in TOML, as environment variables take them.
            listeners = f'{{ internal = "{url}", external = "pulsar://localhost:{port}" }}'
            broker = broker_process(
                root / f"broker-{index}",
                MOP_PULSAR__PORT=str(port),
                MOP_CLUSTER__BROKERS=json.dumps(urls),
                MOP_CLUSTER__ADVERTISED_URL=url,
                MOP_PULSAR__ADVERTISED_LISTENERS=listeners,
            )
            broker.start()
            brokers.append(broker)
        yield urls
    finally:
        for broker in brokers:
            broker.close()


def owned_by(urls: list[str], index: int, prefix: str) -> str:
    """A topic name that broker `index` owns."""
    membership = Membership(urls, urls[0])
    return next(
        topic
        for n in range(1000)
        if membership.owner(topic := f"persistent://public/default/{prefix}-{n}") == urls[index]
    )


def test_a_member_answers_with_the_owners_listener(pair: list[str]) -> None:
    topic = owned_by(pair, 1, "elsewhere")
    external = pair[1].replace("127.0.0.1", "localhost")
    raw = raw_connected(int(pair[0].rsplit(":", 1)[1]))
    try:
        named = ask(raw, Lookup(topic=topic, request_id=1, advertised_listener_name="external"))
        assert isinstance(named, LookupResponse) and named.response is LookupType.Connect
        assert named.broker_service_url == external
        unnamed = ask(raw, Lookup(topic=topic, request_id=2))
        assert isinstance(unnamed, LookupResponse) and unnamed.response is LookupType.Redirect
        assert unnamed.broker_service_url == pair[1]
        unknown = ask(raw, Lookup(topic=topic, request_id=3, advertised_listener_name="nope"))
        assert isinstance(unknown, LookupResponse) and unknown.response is LookupType.Failed
        assert unknown.message == "the broker do not have nope listener"
    finally:
        raw.close()


def test_clients_of_each_listener_reach_topics_of_both_members(pair: list[str]) -> None:
    topics = [owned_by(pair, index, "both") for index in (0, 1)]
    for listener in ("internal", "external"):
        client = client_of(pair[0], listener)
        try:
            for topic in topics:
                consumer = client.subscribe(topic, f"via-{listener}")
                client.create_producer(topic).send(listener.encode())
                assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == listener.encode()
                consumer.close()
        finally:
            client.close()


def test_the_asyncio_client_follows_a_listener_in_the_cluster(pair: list[str]) -> None:
    topic = owned_by(pair, 1, "async")

    async def scenario() -> bytes:
        client = AsyncClient(pair[0], listener_name="external")
        try:
            consumer = await client.subscribe(topic, "async")
            producer = await client.create_producer(topic)
            await producer.send(b"async external")
            message = await consumer.receive()
            return message.data()
        finally:
            await client.close()

    assert asyncio.run(scenario()) == b"async external"


def test_a_lookup_waiting_for_a_silent_owner_holds_up_no_other_command(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The owner of a topic is asked for its listener in the background: a member that does
    not answer (here a socket that never speaks) delays only that lookup."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    (port,) = free_ports(1)
    urls = [f"pulsar://127.0.0.1:{port}", f"pulsar://127.0.0.1:{silent.getsockname()[1]}"]
    broker = broker_process(
        tmp_path_factory.mktemp("silent-owner"),
        MOP_PULSAR__PORT=str(port),
        MOP_CLUSTER__BROKERS=json.dumps(urls),
        MOP_CLUSTER__ADVERTISED_URL=urls[0],
        MOP_PULSAR__ADVERTISED_LISTENERS=f'{{ external = "{urls[0]}" }}',
    )
    try:
        broker.start()
        raw = raw_connected(port)
        try:
            waiting = owned_by(urls, 1, "silent")
            here = owned_by(urls, 0, "here")
            raw.send(Lookup(topic=waiting, request_id=1, advertised_listener_name="external"))
            raw.send(Lookup(topic=here, request_id=2, advertised_listener_name="external"))
            first, second = raw.recv(), raw.recv()
            assert isinstance(first, LookupResponse) and first.request_id == 2
            assert first.response is LookupType.Connect
            assert isinstance(second, LookupResponse) and second.request_id == 1
            assert second.response is LookupType.Failed
        finally:
            raw.close()
    finally:
        broker.close()
        silent.close()
