"""`/metrics` on the admin port, end to end: real MQTT (paho) and Pulsar (pulsar-client) clients
against a node, then the Prometheus page, parsed with prometheus_client, says what they did;
and a separated proxy's page tells of its links to the broker."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mop.settings import AuthSettings, Settings, TelemetrySettings
from mop.testing.metrics import MetricsPage, scrape_metrics
from mop.testing.node import RunningNode, as_proxy, node_settings, running_node
from tests.e2e.clients import Client
from tests.e2e.mqtt.test_security import write_passwords
from tests.e2e.nodeproc import NodeProcess
from tests.e2e.pulsar_support import pulsar_client, pulsar_settings, receive_all, topic_for

pytestmark = pytest.mark.e2e

# Every publish and delivery timed, so that a handful of messages fill the histograms.
EVERY_ONE = TelemetrySettings(latency_sampling=1)


def scrape(node: RunningNode) -> MetricsPage:
    return scrape_metrics(*node.node.address("admin"))


def eventually(
    node: RunningNode, check: Callable[[MetricsPage], bool], timeout: float = 10.0
) -> MetricsPage:
    """Scrape until `check` holds (the node counts a closed connection once it has closed)."""
    deadline = time.monotonic() + timeout
    while True:
        page = scrape(node)
        if check(page) or time.monotonic() > deadline:
            return page
        time.sleep(0.05)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[RunningNode]:
    """A merged node with MQTT and Pulsar, a password file (alice) next to anonymous access."""
    passwords = write_passwords(tmp_path / "passwords", {"alice": "a1"})
    settings = dataclasses.replace(
        pulsar_settings(),
        auth=AuthSettings(password_file=str(passwords), max_failures=0),
        telemetry=EVERY_ONE,
    )
    with running_node(settings) as running:
        yield running


def closed_twice(page: MetricsPage) -> bool:
    """Whether the page counts both closed MQTT connections of the test below."""
    return (
        page.value("mop_connections_closed_total", protocol="mqtt", reason="takeover")
        + page.value("mop_connections_closed_total", protocol="mqtt", reason="normal")
        == 2
    )


def test_the_page_counts_what_mqtt_and_pulsar_clients_did(node: RunningNode) -> None:
    port = node.mqtt_port
    # A persistent session that goes offline: its subscription keeps a backlog.
    away = Client(port, "away", version=4, clean=False)
    away.subscribe("m/a", qos=1)
    away.disconnect()
    subscriber = Client(port, "sub")
    subscriber.subscribe("m/a", qos=1)
    subscriber.subscribe("$share/g/m/b", qos=1)
    publisher = Client(port, "pub")
    for n in range(5):
        assert publisher.publish("m/a", f"m{n}", qos=1) == 0
    assert publisher.publish("m/r", b"kept", qos=1, retain=True) == 0x10  # nobody subscribes
    assert publisher.publish("m/nobody", b"gone", qos=1) == 0x10
    assert len(subscriber.expect(5)) == 5
    wrong = Client(port, "wrong", username="alice", password="nope", connect=False)
    assert wrong.connect().reason_code == 0x86
    Client(port, "pub")  # takes the client id over

    topic = topic_for(f"metrics-{uuid.uuid4().hex[:8]}")
    with pulsar_client(node) as client:
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic, batching_enabled=False)
        for n in range(3):
            producer.send(f"p{n}".encode())
        assert len(receive_all(consumer, 3)) == 3
        page = eventually(node, closed_twice)

    # Connections: by protocol, refused and closed by reason.
    assert page.value("mop_connections_active", protocol="mqtt") == 2
    assert page.value("mop_connections_active", protocol="pulsar") >= 1
    assert page.value("mop_connections_opened_total", protocol="mqtt") == 4
    assert (
        page.value("mop_connections_rejected_total", protocol="mqtt", reason="bad_credentials") == 1
    )
    assert page.value("mop_connections_closed_total", protocol="mqtt", reason="normal") == 1
    # Messages and bytes by protocol and direction.
    assert page.value("mop_messages_total", protocol="mqtt", direction="in") == 7
    assert page.value("mop_messages_total", protocol="mqtt", direction="out") == 5
    assert page.value("mop_messages_total", protocol="pulsar", direction="in") == 3
    assert page.value("mop_messages_total", protocol="pulsar", direction="out") == 3
    for protocol in ("mqtt", "pulsar"):
        for direction in ("in", "out"):
            assert page.value("mop_bytes_total", protocol=protocol, direction=direction) > 0
        assert page.value("mop_requests_total", protocol=protocol) >= 3
    # The retained message is kept: dropped is the one nobody subscribes to nor keeps.
    assert page.value("mop_messages_dropped_total", reason="no_subscribers") == 1
    # What the MQTT adapter and the broker hold.
    assert page.value("mop_retained_messages", protocol="mqtt") == 1
    assert page.value("mop_sessions", protocol="mqtt", state="connected") == 2
    assert page.value("mop_sessions", protocol="mqtt", state="offline") == 1
    assert page.value("mop_subscriptions", protocol="mqtt", kind="normal") == 2
    assert page.value("mop_subscriptions", protocol="mqtt", kind="shared") == 1
    backlogs = page.matching("mop_subscription_backlog", subscription="away")
    assert [value for _, value in backlogs] == [5]
    assert page.value("mop_broker_topics") >= 3
    # Latency histograms have samples.
    assert page.value("mop_publish_duration_seconds_count") >= 10
    for protocol in ("mqtt", "pulsar"):
        assert page.value("mop_delivery_latency_seconds_count", protocol=protocol) > 0
    assert page.value("mop_storage_sync_duration_seconds_count") > 0
    buckets = page.matching("mop_publish_duration_seconds_bucket")
    assert max(value for _, value in buckets) == page.value("mop_publish_duration_seconds_count")


def test_a_separated_proxy_tells_of_its_links_to_the_brokers(broker: NodeProcess) -> None:
    settings: Settings = dataclasses.replace(
        as_proxy(node_settings(), broker.service_url, namespace=f"m-{uuid.uuid4().hex[:12]}"),
        telemetry=EVERY_ONE,
    )
    with running_node(settings) as proxy:
        subscriber = Client(proxy.mqtt_port, "sub")
        subscriber.subscribe("s/a", qos=1)
        publisher = Client(proxy.mqtt_port, "pub")
        for n in range(3):
            assert publisher.publish("s/a", f"m{n}", qos=1) in (0, 0x10)
        assert len(subscriber.expect(3)) == 3
        page = scrape(proxy)
    brokers = page.matching("mop_broker_link_connections")
    assert brokers and all(value >= 1 for _, value in brokers)
    assert {labels["broker"] for labels, _ in brokers} == {broker.service_url}
    assert page.value("mop_broker_link_lookups_total") >= 1
    address = broker.service_url
    assert page.value("mop_broker_link_bytes_total", broker=address, direction="out") > 0
    assert page.value("mop_broker_link_bytes_total", broker=address, direction="in") > 0
    assert page.value("mop_broker_link_commands_total", broker=address) > 0
    assert page.value("mop_broker_link_send_duration_seconds_count", broker=address) >= 1
    assert page.value("mop_broker_link_receive_delay_seconds_count", broker=address) >= 1
    assert page.value("mop_connections_active", protocol="mqtt") == 2
    assert page.value("mop_messages_total", protocol="mqtt", direction="in") == 3


def test_each_proxy_names_itself_in_target_info(broker: NodeProcess) -> None:
    settings = as_proxy(node_settings(), broker.service_url, namespace=f"m-{uuid.uuid4().hex[:12]}")
    with running_node(settings) as first, running_node(settings) as second:
        names = [
            scrape(node).matching("target_info")[0][0]["service_instance_id"]
            for node in (first, second)
        ]
    assert names[0] != names[1]
    assert broker.service_url not in names
