"""The admin API's sessions and subscriptions with real MQTT clients: an offline persistent
session is listed with its subscriptions until it is ended through the API, and ending the
session of a connected client disconnects it."""

from __future__ import annotations

import time

import pytest
from paho.mqtt.packettypes import PacketTypes

from mop.testing.node import RunningNode
from tests.e2e.admin.api import Api, encoded, eventually
from tests.e2e.clients import Client, props, session_present
from tests.e2e.conftest import Topology

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

ADMINISTRATIVE_ACTION = 0x98
HOUR = 3600


def persistent(node: RunningNode, client_id: str) -> Client:
    return Client(
        node.mqtt_port,
        client_id,
        version=5,
        clean=False,
        connect_properties=props(PacketTypes.CONNECT, SessionExpiryInterval=HOUR),
    )


def session_ids(api: Api, **query: object) -> list[str]:
    return [item["client_id"] for item in api.get("/api/v1/sessions", **query)["items"]]


def test_an_offline_session_is_listed_until_it_is_ended(node: RunningNode) -> None:
    api = Api(node)
    offline = persistent(node, "sess-off")
    offline.subscribe("sess/#", qos=1)
    offline.subscribe("$share/crew/sess/jobs", qos=0)
    offline.disconnect()
    Client(node.mqtt_port, "sess-on", version=4, clean=False)
    before = time.time()

    eventually(lambda: session_ids(api, connected="false") == ["sess-off"])
    assert session_ids(api) == ["sess-off", "sess-on"]
    assert session_ids(api, connected="true") == ["sess-on"]
    assert session_ids(api, q="OFF") == ["sess-off"]
    assert "connected" in api.get("/api/v1/sessions", 400, connected="maybe")["error"]
    # Given empty, it is neither true nor false (not an absent one).
    assert "connected" in api.get("/api/v1/sessions", 400, connected="")["error"]

    session = api.get(f"/api/v1/sessions/{encoded('sess-off')}")
    assert session["connected"] is False
    assert session["expiry_interval"] == HOUR
    assert before - 10 < session["disconnected_at"] <= time.time()
    assert session["expires_at"] == pytest.approx(session["disconnected_at"] + HOUR)
    assert session["subscriptions"] == 2
    assert sorted(session["subscriptions_detail"], key=lambda s: s["filter"]) == [
        {"filter": "sess/#", "qos": 1, "group": None},
        {"filter": "sess/jobs", "qos": 0, "group": "crew"},
    ]
    online = api.get("/api/v1/sessions/sess-on")
    assert online["connected"] is True
    assert online["disconnected_at"] is None and online["expires_at"] is None

    subscriptions = api.get("/api/v1/subscriptions", client_id="sess-off")
    assert subscriptions["total"] == 2
    assert api.get("/api/v1/subscriptions", filter="sess/jobs")["items"] == [
        {"client_id": "sess-off", "filter": "sess/jobs", "qos": 0, "group": "crew"}
    ]

    api.delete("/api/v1/sessions/sess-off")
    api.get("/api/v1/sessions/sess-off", 404)
    assert session_ids(api) == ["sess-on"]
    assert api.get("/api/v1/subscriptions", client_id="sess-off")["total"] == 0
    again = persistent(node, "sess-off")
    assert not session_present(again)
    api.delete("/api/v1/sessions/nobody", 404)


def test_ending_the_session_of_a_connected_client_disconnects_it(node: RunningNode) -> None:
    api = Api(node)
    client = persistent(node, "sess-end")
    client.subscribe("end/#", qos=1)
    api.delete("/api/v1/sessions/sess-end")
    assert client.disconnects.get(timeout=10) == ADMINISTRATIVE_ACTION
    api.get("/api/v1/sessions/sess-end", 404)
    client.close()
    again = persistent(node, "sess-end")
    assert not session_present(again)


def test_stats_count_offline_sessions(node: RunningNode) -> None:
    api = Api(node)
    client = persistent(node, "sess-count")
    client.subscribe("count/#", qos=1)
    client.disconnect()
    stats = eventually(lambda: (found := api.get("/api/v1/stats"))["connections"] == 0 and found)
    assert (stats["sessions"], stats["subscriptions"]) == (1, 1)


def test_another_proxy_shows_the_session_but_not_the_client(
    node: RunningNode, topology: Topology, mode: str
) -> None:
    if mode == "merged":
        pytest.skip("one node: no client is connected through another")
    here = Api(node)
    with topology.running_node() as other_node:
        other = Api(other_node)
        client = persistent(node, "sess-far")
        client.subscribe("far/#", qos=1)
        assert other.get("/api/v1/clients")["total"] == 0
        assert eventually(lambda: other.get("/api/v1/sessions", q="sess-far")["items"])
        assert other.get("/api/v1/sessions/sess-far")["connected"] is True
        assert "another node" in other.delete("/api/v1/sessions/sess-far", 409).json()["error"]
        other.delete("/api/v1/clients/sess-far", 404)

        here.delete("/api/v1/clients/sess-far")
        client.disconnects.get(timeout=10)
        eventually(lambda: other.get("/api/v1/sessions/sess-far")["connected"] is False)
        other.delete("/api/v1/sessions/sess-far")
        eventually(lambda: here.call("GET", "/api/v1/sessions/sess-far").status == 404)
        client.close()
        assert not session_present(persistent(node, "sess-far"))
