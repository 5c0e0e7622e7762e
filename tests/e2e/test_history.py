"""Reading history with the default retention policy, in both modes: messages published to a
topic nobody subscribes to stay (well past the 5 s grace that used to be all a topic kept), and
a pulsar-client reader from the earliest message, `seek` and a new subscription at `Earliest`
all read them, without any subscription holding them."""

from __future__ import annotations

import dataclasses
import time

import pulsar
import pytest

from mop.settings import PulsarSettings
from mop.testing.node import node_settings
from mop.topic_names import mqtt_to_pulsar
from tests.e2e.clients import Client
from tests.e2e.conftest import Topology
from tests.e2e.pulsar_support import TIMEOUT_MS, receive_all, service_url

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

# Longer than the old `unsubscribed_grace` (5 s) plus a trimming pass.
PAST_THE_GRACE = 6.5


def read_all(reader: pulsar.Reader) -> list[bytes]:
    out = []
    while reader.has_message_available():
        out.append(reader.read_next(timeout_millis=TIMEOUT_MS).data())
    return out


def test_history_is_read_without_a_holding_subscription(topology: Topology) -> None:
    settings = node_settings()
    if topology.mode == "merged":
        settings = dataclasses.replace(
            settings, protocols=("mqtt", "pulsar"), pulsar=PulsarSettings(port=0)
        )
    with topology.running_node(settings) as node:
        url = topology.service_url if topology.mode == "separated" else service_url(node)
        namespace = topology.namespace or "default"
        publisher = Client(node.mqtt_port, "history-pub")
        for n in range(3):
            # Stored either way; a merged node says that nobody subscribes (0x10).
            assert publisher.publish("history/reading", f"r{n}".encode(), 1) in (0, 0x10)
        publisher.disconnect()
        time.sleep(PAST_THE_GRACE)
        topic = mqtt_to_pulsar("history/reading", namespace=namespace)
        expected = [b"r0", b"r1", b"r2"]
        client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            reader = client.create_reader(topic, pulsar.MessageId.earliest)
            assert read_all(reader) == expected
            reader.close()
            consumer = client.subscribe(
                topic, "late", initial_position=pulsar.InitialPosition.Earliest
            )
            received = receive_all(consumer, 3)
            assert [m.data() for m in received] == expected
            for message in received:
                consumer.acknowledge(message)
            # Acknowledged, and still there for a seek back.
            consumer.seek(pulsar.MessageId.earliest)
            assert [m.data() for m in receive_all(consumer, 3)] == expected
            consumer.close()
        finally:
            client.close()
