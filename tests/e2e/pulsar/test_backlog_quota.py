"""Backlog quotas end to end: a subscription that does not keep up makes its topic exceed a
small quota; then Pulsar producers (sync and asyncio pulsar-client) and MQTT publishers are
refused (`producer_exception`) or held (`producer_request_hold`), or the subscription's oldest
backlog is skipped (`consumer_backlog_eviction`). Quotas set through the admin API apply too."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pulsar
import pytest
from pulsar.asyncio import Client as AsyncClient
from pulsar.asyncio import PulsarException as AsyncPulsarException

from mop.settings import BacklogQuotaSettings, QuotaPolicyName
from mop.testing.node import RunningNode
from mop.topic_names import mqtt_to_pulsar
from tests.e2e.admin.api import Api
from tests.e2e.clients import Client
from tests.e2e.pulsar_support import (
    pulsar_client,
    pulsar_node,
    pulsar_settings,
    receive_all,
    service_url,
    topic_for,
)

pytestmark = pytest.mark.e2e

PAYLOAD = b"x" * 1000
LIMIT = 5000  # bytes: five messages' payloads and a bit more
CHECKED = 2.0  # quotas are checked on every trimming pass (about once a second)


@contextmanager
def node_with(policy: QuotaPolicyName, limit: int = LIMIT) -> Iterator[RunningNode]:
    quota = BacklogQuotaSettings(limit_bytes=limit, policy=policy)
    with pulsar_node(dataclasses.replace(pulsar_settings(), backlog_quota=quota)) as node:
        yield node


def over_quota(client: pulsar.Client, topic: str, count: int = 10) -> pulsar.Consumer:
    """A subscription that acknowledges nothing, and enough messages to exceed the quota."""
    slow = client.subscribe(topic, "slow")
    producer = client.create_producer(topic, batching_enabled=False)
    for _ in range(count):
        producer.send(PAYLOAD)
    producer.close()
    time.sleep(CHECKED)
    return slow


def test_producer_exception_refuses_pulsar_producers_and_mqtt_publishers(
    request: pytest.FixtureRequest,
) -> None:
    topic = mqtt_to_pulsar(f"quota/{request.node.name}")
    with node_with("producer_exception") as node, pulsar_client(node) as client:
        slow = over_quota(client, topic)
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
            client.create_producer(topic)

        async def asyncio_producer() -> None:
            async_client = AsyncClient(service_url(node))
            try:
                await async_client.create_producer(topic)
            finally:
                await async_client.close()

        with pytest.raises(AsyncPulsarException) as refused:
            asyncio.run(asyncio_producer())
        assert "ProducerBlockedQuotaExceededException" in str(refused.value)

        mqtt = Client(node.mqtt_port, "quota-pub")
        assert mqtt.publish(f"quota/{request.node.name}", PAYLOAD, 1) == 0x97
        # MQTT 3.1.1 acks carry no error: the publisher loses its connection instead.
        old = Client(node.mqtt_port, "quota-pub-311", version=4)
        old.client.publish(f"quota/{request.node.name}", PAYLOAD, 1)
        old.disconnects.get(timeout=10)
        # Once the subscription catches up, producers are welcome again.
        for message in receive_all(slow, 10):
            slow.acknowledge(message)
        time.sleep(CHECKED)
        client.create_producer(topic).send(b"welcome")
        assert mqtt.publish(f"quota/{request.node.name}", b"welcome", 1) == 0
        slow.close()


def test_producer_exception_fails_the_sends_of_a_connected_producer(
    request: pytest.FixtureRequest,
) -> None:
    topic = topic_for(request.node.name)
    with node_with("producer_exception") as node, pulsar_client(node) as client:
        slow = client.subscribe(topic, "slow")
        producer = client.create_producer(topic, batching_enabled=False)
        for _ in range(10):
            producer.send(PAYLOAD)
        time.sleep(CHECKED)
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
            producer.send(b"refused")
        slow.close()


def test_producer_request_hold_makes_sends_time_out(request: pytest.FixtureRequest) -> None:
    topic = topic_for(request.node.name)
    with node_with("producer_request_hold") as node, pulsar_client(node) as client:
        slow = client.subscribe(topic, "slow")
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=3000)
        for _ in range(10):
            producer.send(PAYLOAD)
        time.sleep(CHECKED)
        started = time.monotonic()
        with pytest.raises(pulsar.Timeout):
            producer.send(b"held")
        assert time.monotonic() - started >= 2.5  # held until the send timeout
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededError):
            client.create_producer(topic)
        slow.close()


def test_producer_request_hold_refuses_mqtt_publishes_to_that_topic_only(
    request: pytest.FixtureRequest,
) -> None:
    # A held MQTT publish is refused at once with Quota exceeded (as separated proxies
    # answer): waiting in the broker would stop the client's other packets (its PUBACKs and
    # PINGREQs) and every other topic of a batch.
    name = f"quota/{request.node.name}"
    with node_with("producer_request_hold") as node, pulsar_client(node) as client:
        slow = over_quota(client, mqtt_to_pulsar(name))
        mqtt = Client(node.mqtt_port, "quota-held")
        started = time.monotonic()
        assert mqtt.publish(name, PAYLOAD, 1) == 0x97
        assert time.monotonic() - started < 5
        # Other topics are not held (16: accepted, no matching subscribers).
        assert mqtt.publish(f"{name}/other", PAYLOAD, 1) in (0, 16)
        for message in receive_all(slow, 10):
            slow.acknowledge(message)
        time.sleep(CHECKED)
        assert mqtt.publish(name, b"welcome", 1) in (0, 16)
        slow.close()


def test_consumer_backlog_eviction_skips_the_oldest_backlog(
    request: pytest.FixtureRequest,
) -> None:
    topic = topic_for(request.node.name)
    with node_with("consumer_backlog_eviction") as node, pulsar_client(node) as client:
        slow = over_quota(client, topic, count=20)
        slow.close()
        # Producers are never refused; the subscription starts again at the newest backlog.
        client.create_producer(topic).send(b"last")
        slow = client.subscribe(topic, "slow")
        kept = []
        while True:
            try:
                kept.append(slow.receive(timeout_millis=1000).data())
            except pulsar.Timeout:
                break
        assert kept[-1] == b"last"
        assert 1 < len(kept) <= LIMIT // len(PAYLOAD) + 1
        slow.close()


def test_a_quota_set_through_the_admin_api(request: pytest.FixtureRequest) -> None:
    topic = topic_for(request.node.name)
    with pulsar_node() as node, pulsar_client(node) as client:
        api = Api(node)
        path = "/admin/v2/namespaces/public/default"
        assert api.get(f"{path}/backlogQuotaMap") == {}
        body = {"limitSize": LIMIT, "policy": "producer_exception"}
        answer = api.call("POST", f"{path}/backlogQuota", body)
        assert answer.status == 204, answer.body
        assert api.get(f"{path}/backlogQuotaMap") == {
            "destination_storage": {
                "limit": LIMIT,
                "limitSize": LIMIT,
                "limitTime": -1,
                "policy": "producer_exception",
            }
        }
        over_quota(client, topic).close()
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
            client.create_producer(topic)
        bad = api.call("POST", f"{path}/backlogQuota", {"limitSize": 1, "policy": "drop"})
        assert bad.status == 400
        query = {"backlogQuotaType": "message_age"}
        body = {"limitTime": 3600, "policy": "consumer_backlog_eviction"}
        answer = api.call("POST", f"{path}/backlogQuota?backlogQuotaType=message_age", body)
        assert answer.status == 204, answer.body
        assert set(api.get(f"{path}/backlogQuotaMap")) == {"destination_storage", "message_age"}
        assert api.call("DELETE", f"{path}/backlogQuota").status == 204
        assert api.call("DELETE", f"{path}/backlogQuota", query=query).status == 204
        assert api.get(f"{path}/backlogQuotaMap") == {}
        time.sleep(CHECKED)
        client.create_producer(topic).send(b"welcome")
