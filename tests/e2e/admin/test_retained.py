"""The admin API's retained messages and publishing, with real MQTT clients: a retained
message is listed, read and cleared (a new subscriber then gets none), and a message published
through the API reaches subscribers, retained when asked, under the MQTT topic rules."""

from __future__ import annotations

import base64

import pytest

from mop.testing.node import RunningNode, node_settings, running_node
from tests.e2e.admin.api import Api, encoded, eventually
from tests.e2e.clients import Client

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]


def topics(api: Api, **query: object) -> list[str]:
    return [item["topic"] for item in api.get("/api/v1/retained", **query)["items"]]


def test_retained_messages_are_listed_read_and_cleared(node: RunningNode) -> None:
    api = Api(node)
    publisher = Client(node.mqtt_port, "ret-pub")
    for topic, payload in (("ret/a", b"hello"), ("ret/b", b"\xff\x00"), ("other/c", b"x")):
        assert publisher.publish(topic, payload, qos=1, retain=True) < 0x80

    assert topics(api, filter="ret/#") == ["ret/a", "ret/b"]
    assert topics(api) == ["other/c", "ret/a", "ret/b"]  # the filter is "#" by default
    assert topics(api, filter="ret/+", offset=1, limit=1) == ["ret/b"]
    text = api.get(f"/api/v1/retained/{encoded('ret/a')}")
    assert text["topic"] == "ret/a"
    assert (text["payload"], text["payload_encoding"]) == ("hello", "utf-8")
    assert (text["qos"], text["size"]) == (1, 5)
    assert text["published_at"] > 0
    binary = api.get(f"/api/v1/retained/{encoded('ret/b')}")
    assert binary["payload_encoding"] == "base64"
    assert base64.b64decode(binary["payload"]) == b"\xff\x00"
    api.get(f"/api/v1/retained/{encoded('ret/none')}", 404)
    assert "'#'" in api.get("/api/v1/retained", 400, filter="ret/#/x")["error"]

    api.delete(f"/api/v1/retained/{encoded('ret/a')}")
    api.get(f"/api/v1/retained/{encoded('ret/a')}", 404)
    api.delete(f"/api/v1/retained/{encoded('ret/a')}", 404)
    assert topics(api, filter="ret/#") == ["ret/b"]
    subscriber = Client(node.mqtt_port, "ret-sub")
    subscriber.subscribe("ret/#", qos=1)
    assert [message.topic for message in subscriber.expect(1)] == ["ret/b"]
    subscriber.expect_none()
    assert api.get("/api/v1/stats")["retained"] == 2


def test_published_messages_reach_subscribers(node: RunningNode) -> None:
    api = Api(node)
    subscriber = Client(node.mqtt_port, "pub-sub", version=5)
    subscriber.subscribe("pub/#", qos=1)

    answer = api.post(
        "/api/v1/publish",
        {"topic": "pub/a", "payload": "hi", "qos": 1, "properties": {"unit": "celsius"}},
    )
    assert answer["topic"] == "pub/a" and answer["message_id"]
    [message] = subscriber.expect(1)
    assert (message.topic, message.payload, message.qos, message.retain) == (
        "pub/a",
        b"hi",
        1,
        False,
    )
    assert message.properties.UserProperty == [("unit", "celsius")]

    raw = base64.b64encode(b"\x00\x01").decode()
    api.post("/api/v1/publish", {"topic": "pub/b", "payload": raw, "payload_encoding": "base64"})
    assert subscriber.expect(1)[0].payload == b"\x00\x01"

    api.post("/api/v1/publish", {"topic": "pub/kept", "payload": "last", "retain": True})
    subscriber.expect(1)
    assert api.get(f"/api/v1/retained/{encoded('pub/kept')}")["payload"] == "last"
    late = Client(node.mqtt_port, "pub-late")
    late.subscribe("pub/kept", qos=1)
    [kept] = late.expect(1)
    assert (kept.payload, kept.retain) == (b"last", True)

    # The topics the API published to are the topics API's (its answers checked against the
    # document too; a proxy without cluster.admin_url has no numbers for them).
    listed = api.get("/api/v1/topics", prefix="pub/")["items"]
    assert [item["topic"] for item in listed] == ["pub/a", "pub/b", "pub/kept"]
    assert api.call("GET", f"/api/v1/topics/{encoded('pub/a')}").status in (200, 501)


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ({"topic": "pub/+"}, 400, "wildcard"),
        ({"topic": "pub/#"}, 400, "wildcard"),
        ({"topic": ""}, 400, "empty"),
        ({"topic": "$SYS/broker/version", "payload": "9"}, 403, "not allowed"),
        ({"topic": "pub/a", "qos": 2}, 400, "qos"),
        ({"topic": "pub/a", "payload": "!", "payload_encoding": "base64"}, 400, "base64"),
        ({"topic": "pub/a", "properties": {"k": 1}}, 400, "properties"),
        ({"topic": "pub/a", "colour": "red"}, 400, "unknown fields: colour"),
        ({"payload": "no topic"}, 400, "topic"),
    ],
)
def test_publishing_follows_the_mqtt_topic_rules(
    node: RunningNode, body: dict[str, object], status: int, error: str
) -> None:
    assert error in Api(node).post("/api/v1/publish", body, status)["error"]


def test_a_message_larger_than_mqtts_packet_limit_is_refused() -> None:
    """What an MQTT client could not publish to the node (mqtt.max_packet_size), the API does
    not publish either: the limit counts the whole PUBLISH packet, as for a client."""
    with running_node(node_settings(max_packet_size=200)) as node:
        api = Api(node)
        subscriber = Client(node.mqtt_port, "big-sub")
        subscriber.subscribe("big/#", qos=1)
        answer = api.post("/api/v1/publish", {"topic": "big/a", "payload": "x" * 300}, 413)
        assert "mqtt.max_packet_size" in answer["error"] and "200" in answer["error"]
        subscriber.expect_none()
        # The topic and the properties count too.
        body = {"topic": "big/a", "payload": "x" * 150, "properties": {"k": "v" * 60}}
        assert "max_packet_size" in api.post("/api/v1/publish", body, 413)["error"]
        api.post("/api/v1/publish", {"topic": "big/a", "payload": "x" * 150, "qos": 1})
        assert subscriber.expect(1)[0].payload == b"x" * 150


def test_sys_values_are_the_nodes_own() -> None:
    with running_node(node_settings(sys_interval=0.2)) as node:
        api = Api(node)
        eventually(lambda: "$SYS/broker/version" in topics(api, filter="$SYS/#"))
        assert "$SYS/broker/version" not in topics(api)
        answer = api.delete(f"/api/v1/retained/{encoded('$SYS/broker/version')}", 403)
        assert "$SYS" in answer.json()["error"]
