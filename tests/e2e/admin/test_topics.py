"""Topics in the admin API of a merged node, driven by real clients: an MQTT publisher (paho), an
MQTT subscriber that does not acknowledge and a pulsar-client consumer make a topic and a backlog,
and the API's numbers follow them; a topic in use is not deleted until its consumers leave. The
node also serves the Pulsar protocol, so its admin listener answers Pulsar's admin REST API,
checked here with plain HTTP and Pulsar's field names."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pulsar
import pytest

from mop.testing.node import RunningNode
from tests.e2e.admin.topics_support import admin_url, eventually, stats, subscription, topic_url
from tests.e2e.clients import Client
from tests.e2e.pulsar_support import TIMEOUT_MS, pulsar_client, pulsar_node, receive_all

pytestmark = pytest.mark.e2e

TOPIC = "shop/orders"
PULSAR_TOPIC = "persistent://public/default/shop%2Forders"
PAYLOADS = [f"order-{n}".encode() for n in range(5)]


@pytest.fixture
def node() -> Iterator[RunningNode]:
    with pulsar_node() as running:
        yield running


@pytest.fixture
def http(node: RunningNode) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=admin_url(node), timeout=10) as client:
        yield client


def test_numbers_follow_real_clients_and_delete_waits_for_the_consumers(
    node: RunningNode, http: httpx.Client
) -> None:
    reader = Client(node.mqtt_port, "reader", version=4, clean=False, manual_ack=True)
    assert reader.subscribe(TOPIC, qos=1) == [1]
    with pulsar_client(node) as client:
        audit = client.subscribe(PULSAR_TOPIC, "audit", consumer_type=pulsar.ConsumerType.Shared)
        writer = Client(node.mqtt_port, "writer")
        for payload in PAYLOADS:
            assert writer.publish(TOPIC, payload, qos=1) == 0
        received = receive_all(audit, len(PAYLOADS))
        reader.expect(len(PAYLOADS))  # never acknowledged
        detail = eventually(
            lambda: stats(http, TOPIC), lambda d: subscription(d, "audit") is not None
        )
        assert detail["topic"] == TOPIC and detail["pulsar_topic"] == PULSAR_TOPIC
        assert detail["messages_in"] == len(PAYLOADS)
        assert detail["bytes_in"] == sum(map(len, PAYLOADS))
        assert detail["storage_size"] > 0
        assert detail["subscriptions"] == 2
        assert subscription(detail, "audit") == {
            "name": "audit",
            "type": "shared",
            "backlog": len(PAYLOADS),
            "consumers": 1,
        }
        assert subscription(detail, "reader")["backlog"] == len(PAYLOADS)
        for message in received[:2]:
            audit.acknowledge(message)
        acked = eventually(
            lambda: stats(http, TOPIC), lambda d: subscription(d, "audit")["backlog"] == 3
        )
        assert subscription(acked, "audit")["backlog"] == 3
        assert acked["backlog"] == 3 + len(PAYLOADS)

        listed = http.get("/api/v1/topics", params={"prefix": "shop/"}).json()
        assert [item["topic"] for item in listed["items"]] == [TOPIC]
        assert listed["items"][0]["backlog"] == acked["backlog"]

        refused = http.delete(topic_url(TOPIC))
        assert refused.status_code == 409, refused.text
        assert "consumer" in refused.json()["error"]
        audit.close()
    reader.disconnect()
    deleted = eventually(
        lambda: http.delete(topic_url(TOPIC)).status_code, lambda status: status == 204
    )
    assert deleted == 204
    assert http.get(topic_url(TOPIC)).status_code == 404
    assert http.get("/api/v1/topics", params={"prefix": "shop/"}).json()["total"] == 0


def test_pulsar_admin_api_on_the_broker(node: RunningNode, http: httpx.Client) -> None:
    topic = "persistent://public/default/pulsar-admin"
    with pulsar_client(node) as client:
        consumer = client.subscribe(
            topic, "watch", consumer_type=pulsar.ConsumerType.Failover, consumer_name="w-1"
        )
        producer = client.create_producer(topic, producer_name="p-1")
        for n in range(3):
            producer.send(f"m{n}".encode())
        consumer.receive(timeout_millis=TIMEOUT_MS)
        assert topic in http.get("/admin/v2/persistent/public/default").json()
        answer = http.get("/admin/v2/persistent/public/default/pulsar-admin/stats")
        assert answer.status_code == 200
        document = answer.json()
        for name in ("msgRateIn", "msgThroughputIn", "msgRateOut", "msgThroughputOut"):
            assert isinstance(document[name], float)
        assert document["msgInCounter"] == 3 and document["bytesInCounter"] == 6
        assert document["storageSize"] > 0
        assert document["publishers"] == [{"producerName": "p-1"}]
        watch = document["subscriptions"]["watch"]
        assert watch["type"] == "Failover" and watch["msgBacklog"] == 3
        assert [c["consumerName"] for c in watch["consumers"]] == ["w-1"]
        busy = http.delete("/admin/v2/persistent/public/default/pulsar-admin")
        assert busy.status_code == 412 and busy.json()["reason"]
        forced = http.delete("/admin/v2/persistent/public/default/pulsar-admin?force=true")
        assert forced.status_code == 204
        missing = http.get("/admin/v2/persistent/public/default/pulsar-admin/stats")
        assert missing.status_code == 404 and missing.json() == {"reason": "Topic not found"}
        producer.close()
        consumer.close()
