"""Pulsar clients in the admin API: a pulsar-client connection is listed (as
"pulsar:{address}:{port}") with its consumers and counters, and can be disconnected (the
client library then connects again, as it does after any lost connection)."""

from __future__ import annotations

from collections.abc import Iterator

import pulsar
import pytest

from mop.testing.node import RunningNode
from tests.e2e.admin.api import Api, encoded, eventually
from tests.e2e.pulsar_support import pulsar_client, pulsar_node

pytestmark = [pytest.mark.e2e]

TOPIC = "persistent://public/default/admin-pulsar"


@pytest.fixture
def node() -> Iterator[RunningNode]:
    with pulsar_node() as running:
        yield running


def pulsar_ids(api: Api) -> list[str]:
    page = api.get("/api/v1/clients", protocol="pulsar")
    return [item["client_id"] for item in page["items"]]


def test_a_pulsar_client_is_listed_and_can_be_disconnected(node: RunningNode) -> None:
    api = Api(node)
    with pulsar_client(node) as client:
        consumer = client.subscribe(TOPIC, "watch", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(TOPIC)
        for payload in (b"one", b"two"):
            producer.send(payload)
        for _ in range(2):
            consumer.acknowledge(consumer.receive(timeout_millis=5000))

        [client_id] = pulsar_ids(api)
        assert client_id.startswith("pulsar:127.0.0.1:")
        detail = api.get(f"/api/v1/clients/{encoded(client_id)}")
        assert detail["protocol"] == "pulsar"
        assert detail["protocol_version"] == "pulsar"
        assert detail["peer"] == client_id.removeprefix("pulsar:")
        assert (detail["messages_in"], detail["messages_out"]) == (2, 2)
        assert detail["subscriptions"] == 1
        assert detail["subscriptions_detail"] == [
            {"filter": "admin-pulsar", "qos": 1, "group": "watch"}
        ]
        subscriptions = api.get("/api/v1/subscriptions", client_id=client_id)["items"]
        assert subscriptions == [
            {"client_id": client_id, "filter": "admin-pulsar", "qos": 1, "group": "watch"}
        ]
        # A node with the Pulsar protocol answers Pulsar's admin API too.
        assert TOPIC in api.get("/admin/v2/persistent/public/default")
        assert api.get("/admin/v2/persistent/public/default/admin-pulsar/stats")
        stats = api.get("/api/v1/stats")
        assert stats["connections_by_protocol"] == {"mqtt": 0, "pulsar": 1}
        assert stats["subscriptions"] == 1

        api.delete(f"/api/v1/clients/{encoded(client_id)}")
        eventually(lambda: client_id not in pulsar_ids(api))
        # pulsar-client connects again by itself, and the producer carries on (messages whose
        # acknowledgement had not left the client come again: at least once).
        producer.send(b"three")
        received = []
        while b"three" not in received:
            received.append(consumer.receive(timeout_millis=10000).data())
        assert len(pulsar_ids(api)) == 1
