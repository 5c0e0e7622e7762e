"""The admin API's clients and stats with real MQTT clients: list, filter and page them, look
at one, disconnect one (MQTT 5 clients hear why), and the node's totals."""

from __future__ import annotations

import pytest

from mop.testing.node import RunningNode
from tests.e2e.admin.api import Api, encoded, eventually
from tests.e2e.clients import Client

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

ADMINISTRATIVE_ACTION = 0x98


def clients(api: Api, **query: object) -> dict[str, object]:
    page: dict[str, object] = api.get("/api/v1/clients", **query)
    return page


def ids(page: dict[str, object]) -> list[str]:
    items = page["items"]
    assert isinstance(items, list)
    return [item["client_id"] for item in items]


def test_clients_are_listed_filtered_and_paged(node: RunningNode) -> None:
    api = Api(node)
    five = Client(node.mqtt_port, "api-five", version=5, username="alice")
    four = Client(node.mqtt_port, "api-Four", version=4, clean=False, keepalive=30)
    three = Client(node.mqtt_port, "api-three", version=3)

    page = clients(api)
    assert page["total"] == 3
    assert ids(page) == ["api-Four", "api-five", "api-three"]
    by_id = {item["client_id"]: item for item in page["items"]}  # type: ignore[attr-defined]
    assert by_id["api-five"]["protocol_version"] == "5.0"
    assert by_id["api-five"]["username"] == "alice"
    assert by_id["api-Four"]["protocol_version"] == "3.1.1"
    assert by_id["api-Four"]["clean_start"] is False
    assert by_id["api-Four"]["keep_alive"] == 30
    assert by_id["api-three"]["protocol_version"] == "3.1"
    assert by_id["api-three"]["username"] is None
    for item in by_id.values():
        assert item["protocol"] == "mqtt"
        assert item["peer"].startswith("127.0.0.1:")
        assert item["connected_at"] > 0

    assert ids(clients(api, q="four")) == ["api-Four"]  # any case
    assert ids(clients(api, q="127.0.0.1")) == ["api-Four", "api-five", "api-three"]
    assert ids(clients(api, username="alice")) == ["api-five"]
    assert ids(clients(api, q="ALI")) == ["api-five"]  # the user name matches too
    assert clients(api, protocol="pulsar")["total"] == 0
    assert "protocol must be one of" in api.get("/api/v1/clients", 400, protocol="AAA")["error"]
    second = clients(api, offset=1, limit=1)
    assert (second["total"], second["offset"], second["limit"]) == (3, 1, 1)
    assert ids(second) == ["api-five"]
    assert ids(clients(api, offset=5)) == []
    assert "limit" in api.get("/api/v1/clients", 400, limit=1001)["error"]

    five.subscribe("api/+/x", qos=1)
    five.subscribe("$share/workers/api/jobs", qos=0)
    assert four.publish("api/a/x", b"one", qos=1) == 0
    five.expect(1)
    detail = api.get(f"/api/v1/clients/{encoded('api-five')}")
    assert detail["subscriptions"] == 2
    assert sorted(detail["subscriptions_detail"], key=lambda s: s["filter"]) == [
        {"filter": "api/+/x", "qos": 1, "group": None},
        {"filter": "api/jobs", "qos": 0, "group": "workers"},
    ]
    assert detail["messages_out"] == 1
    assert api.get(f"/api/v1/clients/{encoded('api-Four')}")["messages_in"] == 1
    three.close()


def test_kicking_a_client_disconnects_it(node: RunningNode) -> None:
    api = Api(node)
    five = Client(node.mqtt_port, "kick-five", version=5)
    four = Client(node.mqtt_port, "kick-four", version=4)

    api.delete(f"/api/v1/clients/{encoded('kick-five')}")
    assert five.disconnects.get(timeout=10) == ADMINISTRATIVE_ACTION
    api.delete(f"/api/v1/clients/{encoded('kick-four')}")
    # MQTT 3.1.1 has no DISCONNECT from the server: the connection is closed.
    assert four.disconnects.get(timeout=10) != 0
    eventually(lambda: clients(api)["total"] == 0)
    assert "not connected" in api.delete("/api/v1/clients/kick-five", 404).json()["error"]
    api.get("/api/v1/clients/kick-five", 404)


def test_a_persistent_session_outlives_the_kick(node: RunningNode) -> None:
    api = Api(node)
    client = Client(node.mqtt_port, "kick-keep", version=4, clean=False)
    client.subscribe("keep/#", qos=1)
    api.delete("/api/v1/clients/kick-keep")
    client.disconnects.get(timeout=10)
    client.close()
    again = Client(node.mqtt_port, "kick-keep", version=4, clean=False)
    assert again.connack is not None and again.connack.session_present


def test_stats_count_clients_and_messages(node: RunningNode) -> None:
    api = Api(node)
    before = api.get("/api/v1/stats")
    subscriber = Client(node.mqtt_port, "stats-sub", version=5)
    publisher = Client(node.mqtt_port, "stats-pub", version=5)
    subscriber.subscribe("stats/#", qos=1)
    subscriber.subscribe("$share/g/stats/#", qos=1)
    publisher.publish("stats/a", b"x", qos=1, retain=True)
    subscriber.expect(2)

    stats = api.get("/api/v1/stats")
    assert stats["connections"] == 2
    assert stats["connections_by_protocol"] == {"mqtt": 2, "pulsar": 0}
    assert stats["messages_received"] >= before["messages_received"] + 1
    assert stats["messages_sent"] >= before["messages_sent"] + 2
    assert stats["bytes_received"] > before["bytes_received"]
    assert stats["bytes_sent"] > before["bytes_sent"]
    assert stats["sessions"] == 2
    assert stats["subscriptions"] == 2
    assert stats["shared_subscriptions"] == 1
    assert stats["retained"] == 1
    assert stats["uptime"] > 0
    assert stats["memory_rss"] > 1 << 20
