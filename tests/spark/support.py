"""Helpers for the Spark data source tests: publishing known messages and reading them back
with pulsar-client, to compare with what Spark reads and writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulsar

from mop.topic_names import mqtt_to_pulsar

TIMEOUT_MS = 10_000


@dataclass(frozen=True)
class Sent:
    """A message as the broker stored it (seen through a subscription), as a row shows it."""

    message_id: str
    key: str | None
    payload: bytes
    properties: dict[str, str]
    publish_ms: int
    event_ms: int | None


def message_id_text(message_id: Any) -> str:
    ledger, entry, index = message_id.ledger_id(), message_id.entry_id(), message_id.batch_index()
    return f"{ledger}:{entry}" if index < 0 else f"{ledger}:{entry}:{index}"


def as_sent(message: Any) -> Sent:
    return Sent(
        message_id=message_id_text(message.message_id()),
        key=message.partition_key() or None,
        payload=message.data(),
        properties=message.properties(),
        publish_ms=message.publish_timestamp(),
        event_ms=message.event_timestamp() or None,
    )


def hold(client: pulsar.Client, topic: str, name: str = "keeper") -> Any:
    """A durable subscription on the MQTT topic `topic` that keeps its messages for readers."""
    return client.subscribe(
        mqtt_to_pulsar(topic), name, initial_position=pulsar.InitialPosition.Earliest
    )


def produce(client: pulsar.Client, topic: str, payloads: list[bytes], **options: Any) -> None:
    producer = client.create_producer(mqtt_to_pulsar(topic))
    for payload in payloads:
        producer.send(payload, **options)
    producer.close()


def receive(consumer: Any, count: int) -> list[Sent]:
    return [as_sent(consumer.receive(TIMEOUT_MS)) for _ in range(count)]


def read_all(client: pulsar.Client, topic: str) -> list[Sent]:
    """Everything a reader from the earliest message finds on the MQTT topic `topic`."""
    reader = client.create_reader(mqtt_to_pulsar(topic), pulsar.MessageId.earliest)
    try:
        found = []
        while reader.has_message_available():
            found.append(as_sent(reader.read_next(TIMEOUT_MS)))
        return found
    finally:
        reader.close()
