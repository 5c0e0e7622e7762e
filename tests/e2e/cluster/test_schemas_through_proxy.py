"""Schemas in separated mode: the brokers keep them (Pulsar clients talk to the brokers), and a
proxy's admin API shows and sets them by asking the brokers: GET_SCHEMA for a topic's schema,
the brokers' admin API (`cluster.admin_url`) for a namespace's rule. MQTT publishers through
the proxy are not checked against a topic's schema."""

from __future__ import annotations

import uuid
from urllib.parse import quote

import pulsar
import pytest
from pulsar.schema import AvroSchema, Integer, JsonSchema, Record, String

from mop.topic_names import mqtt_to_pulsar
from tests.e2e.clients import Client
from tests.e2e.cluster.test_admin_topics import broker_admin, proxy
from tests.e2e.nodeproc import NodeProcess
from tests.e2e.pulsar_support import TIMEOUT_MS

pytestmark = pytest.mark.e2e


class Reading(Record):
    sensor = String()
    value = Integer()


@pytest.fixture
def namespace() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def test_the_proxy_shows_and_sets_what_the_brokers_keep(
    broker: NodeProcess, namespace: str
) -> None:
    topic = mqtt_to_pulsar("plant/readings", namespace=namespace)
    local = quote(topic.rsplit("/", 1)[1], safe="")  # plant%252Freadings in the path
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=10)
    try:
        with proxy(broker.service_url, broker_admin(broker), namespace) as (node, http):
            consumer = client.subscribe(topic, "s", schema=JsonSchema(Reading))
            schema_url = f"/admin/v2/schemas/public/{namespace}/{local}/schema"
            shown = http.get(schema_url)
            assert shown.status_code == 200, shown.text
            assert (shown.json()["version"], shown.json()["type"]) == (0, "JSON")
            assert http.get(f"{schema_url}/1").status_code == 404
            # Past Pulsar's 64-bit versions: none such, not a failure to encode it.
            assert http.get(f"{schema_url}/{2**63}").status_code == 404
            assert http.get(f"{schema_url}/99999999999999999999").status_code == 404

            strategy = f"/admin/v2/namespaces/public/{namespace}/schemaCompatibilityStrategy"
            assert http.get(strategy).json() == "FULL"
            assert http.put(strategy, json="ALWAYS_INCOMPATIBLE").status_code == 204
            assert http.get(strategy).json() == "ALWAYS_INCOMPATIBLE"
            with pytest.raises(pulsar.IncompatibleSchema):
                client.create_producer(topic, schema=AvroSchema(Reading))
            assert http.put(strategy, json="UNDEFINED").status_code == 204
            assert http.get(strategy).json() == "FULL"

            # Deleted through the proxy, at the broker that keeps it.
            deleted = http.delete(schema_url)
            assert deleted.status_code == 200 and deleted.json() == {"version": 0}
            assert http.get(schema_url).status_code == 404
            assert http.delete(schema_url).status_code == 404

            # MQTT publishers through the proxy are stored as they come.
            mqtt = Client(node.mqtt_port, f"{namespace}-mqtt")
            assert mqtt.publish("plant/readings", b'{"sensor": "p", "value": 7}', qos=1) == 0
            message = consumer.receive(timeout_millis=TIMEOUT_MS)
            assert (message.value().sensor, message.value().value) == ("p", 7)
    finally:
        client.close()


def test_without_admin_url_the_rule_names_the_setting(broker: NodeProcess, namespace: str) -> None:
    with proxy(broker.service_url, None, namespace) as (_, http):
        answer = http.get(f"/admin/v2/namespaces/public/{namespace}/schemaCompatibilityStrategy")
        assert answer.status_code == 501 and "cluster.admin_url" in answer.json()["reason"]
        missing = http.get(f"/admin/v2/schemas/public/{namespace}/nothing/schema")
        assert missing.status_code == 404
