"""A topic exists from its first producer on, as in Pulsar: it is listed by
GetTopicsOfNamespace, so pattern consumers of pulsar-client (sync and asyncio, every
RegexSubscriptionMode, with or without the domain) find it at subscribe time, and MQTT wildcard
subscriptions find it too. Run merged, and separated (Pulsar clients on the broker node, MQTT
through a proxy in front of it)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path

import httpx
import pulsar
import pytest
from pulsar.asyncio import Client as AsyncClient

from tests.e2e.admin.topics_support import admin_url, eventually, stats
from tests.e2e.clients import Client
from tests.e2e.pulsar_support import (
    TIMEOUT_MS,
    Deployment,
    pulsar_client,
    pulsar_node,
    pulsar_settings,
    receive_all,
    service_url,
)

pytestmark = pytest.mark.e2e

Mode = pulsar.RegexSubscriptionMode


def prefix_for(request: pytest.FixtureRequest) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in request.node.name).lower()


# (domain of the topics, regex subscription mode, whether the pattern names the domain)
CASES = [
    ("persistent", Mode.PersistentOnly, True),
    ("persistent", Mode.PersistentOnly, False),
    ("persistent", Mode.AllTopics, False),
    ("non-persistent", Mode.NonPersistentOnly, True),
    ("non-persistent", Mode.AllTopics, True),
]


def names(domain: str, prefix: str) -> tuple[str, str, str]:
    base = f"public/default/{prefix}-"
    pattern = base + ".*"
    return f"{domain}://{base}a", f"{domain}://{base}b", pattern


@pytest.mark.parametrize(("domain", "mode", "with_domain"), CASES)
def test_a_pattern_consumer_finds_topics_that_only_have_producers(
    deployment: Deployment,
    request: pytest.FixtureRequest,
    domain: str,
    mode: pulsar.RegexSubscriptionMode,
    with_domain: bool,
) -> None:
    first, second, pattern = names(domain, prefix_for(request))
    if with_domain:
        pattern = f"{domain}://{pattern}"
    with pulsar_client(deployment.pulsar) as client:
        producers = [client.create_producer(first), client.create_producer(second)]
        consumer = client.subscribe(re.compile(pattern), "s", regex_subscription_mode=mode)
        for producer, payload in zip(producers, (b"to a", b"to b"), strict=True):
            producer.send(payload)
        received = receive_all(consumer, 2)
        assert sorted(m.data() for m in received) == [b"to a", b"to b"]
        assert {m.topic_name() for m in received} == {first, second}


@pytest.mark.parametrize(("domain", "mode", "with_domain"), CASES[:1] + CASES[3:4])
def test_the_asyncio_pattern_consumer_too(
    deployment: Deployment,
    request: pytest.FixtureRequest,
    domain: str,
    mode: pulsar.RegexSubscriptionMode,
    with_domain: bool,
) -> None:
    first, second, pattern = names(domain, prefix_for(request))
    pattern = f"{domain}://{pattern}"

    async def scenario() -> list[bytes]:
        client = AsyncClient(service_url(deployment.pulsar))
        try:
            producers = [
                await client.create_producer(first, batching_enabled=False),
                await client.create_producer(second, batching_enabled=False),
            ]
            consumer = await client.subscribe(
                pattern, "s", is_pattern_topic=True, regex_subscription_mode=mode
            )
            await producers[0].send(b"to a")
            await producers[1].send(b"to b")
            got = []
            for _ in range(2):
                message = await asyncio.wait_for(consumer.receive(), TIMEOUT_MS / 1000)
                await consumer.acknowledge(message)
                got.append(message.data())
            return sorted(got)
        finally:
            await client.close()

    assert asyncio.run(scenario()) == [b"to a", b"to b"]


def test_a_proxys_wildcard_subscription_takes_a_producers_topic_before_its_first_message(
    deployment: Deployment, request: pytest.FixtureRequest
) -> None:
    """A separated proxy finds the topic in the broker's listing and subscribes to it before
    anything is sent to it. (A merged node's wildcard subscriptions join a topic at its first
    message whether it was listed or not: nothing to tell apart there.)"""
    if not deployment.separated:
        pytest.skip("merged: wildcards join a topic at its first message, listed or not")
    prefix = prefix_for(request)
    subscriber = Client(deployment.mqtt.mqtt_port, f"{prefix}-sub")
    subscriber.subscribe(f"{prefix}/+", qos=1)
    with pulsar_client(deployment.pulsar) as client:
        producer = client.create_producer(f"persistent://public/default/{prefix}%2Fa")
        with httpx.Client(base_url=admin_url(deployment.pulsar), timeout=10) as http:
            # The proxy polls the listing every pattern_discovery (1 s) and subscribes.
            detail = eventually(
                lambda: stats(http, f"{prefix}/a"), lambda d: d.get("subscriptions") == 1
            )
        assert detail.get("subscriptions") == 1, detail
        producer.send(b"first")
        [received] = subscriber.expect(1)
    assert (received.topic, received.payload) == (f"{prefix}/a", b"first")


def test_a_producers_topic_is_still_listed_after_a_restart(tmp_path: Path) -> None:
    settings = pulsar_settings(data_dir=str(tmp_path))
    topic = "persistent://public/default/restart-kept"
    with pulsar_node(settings) as node, pulsar_client(node) as client:
        client.create_producer(topic).close()
    with pulsar_node(settings) as node, pulsar_client(node) as client:
        consumer = client.subscribe(re.compile("persistent://public/default/restart-.*"), "s")
        producer = client.create_producer(topic)
        producer.send(b"after the restart")
        assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"after the restart"
        with contextlib.suppress(pulsar.PulsarException):
            consumer.close()
