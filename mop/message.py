"""Protocol-neutral messages and message ids, shared by adapters, the processor and backends."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class MessageId:
    """Position of a message in its topic, in the form the Pulsar protocol uses."""

    ledger: int
    entry: int

    def __str__(self) -> str:
        return f"{self.ledger}:{self.entry}"

    @classmethod
    def parse(cls, text: str) -> MessageId:
        ledger, _, entry = text.partition(":")
        return cls(int(ledger), int(entry))


@dataclass(frozen=True, slots=True)
class Message:
    """A message as stored and delivered, independent of the protocol that produced it.

    `properties` is an ordered list of pairs (duplicates allowed), like Pulsar's repeated
    KeyValue field and MQTT 5 user properties. `qos` is the producer's delivery guarantee:
    0 may be dropped under pressure (oldest first), 1 and 2 are kept until acknowledged.
    `expires_at` (ms since the epoch, 0 = never) lets every backend drop expired messages.
    """

    payload: bytes
    properties: tuple[tuple[str, str], ...] = ()
    key: str | None = None
    producer: str = ""
    publish_time: int = 0
    event_time: int = 0
    qos: int = 1
    expires_at: int = 0


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message handed to a consumer; acknowledge it by passing it back to the consumer."""

    topic: str
    message_id: MessageId
    message: Message
    redelivery_count: int = 0
