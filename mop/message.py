"""Protocol-neutral messages and message ids, shared by adapters, the processor and backends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeVar, dataclass_transform

__all__ = [
    "CATCH_UP_KEY",
    "ENCRYPTED",
    "QOS_PROPERTY",
    "RETAINED",
    "TOMBSTONE_PROPERTY",
    "Delivery",
    "Message",
    "MessageId",
    "ordered_value",
    "qos_of",
    "value",
]

_T = TypeVar("_T")

# A message with this property set to "1" deletes its key from a compacted topic (a table): the
# broker's compaction and the separated backend's tables read and write it alike.
TOMBSTONE_PROPERTY: Final = "mop.tombstone"
# The key of the markers a separated proxy writes to a table's topic to learn that it has read
# it through (`mop.backends.cluster.tables`): no key of the table (U+0000 is in no MQTT string,
# so in no client id or topic name). One key, so that compaction keeps one marker per table.
CATCH_UP_KEY: Final = "\x00catch-up"
# The QoS an MQTT message was published with, when not 1, on a Pulsar message: a separated
# proxy writes it, and a broker routes such a QoS 0 message at once, as it does its own MQTT
# clients' (at most once), instead of holding it until it is written.
QOS_PROPERTY: Final = "mop.qos"
# The property of a message kept for the subscribers to come (an MQTT retained message): one
# published where no subscription takes it is not counted as dropped (it has no subscribers,
# and is kept all the same).
RETAINED: Final = ("mqtt.retain", "1")
# The property of a message whose payload a Pulsar producer encrypted end to end: only a
# Pulsar consumer holding a key can read it, so other protocols' subscribers skip it (it is
# acknowledged for them and counted as dropped, reason "encrypted"). mop sets it where it
# reads a Pulsar message's metadata, and takes it off any message that claims it otherwise.
ENCRYPTED: Final = ("mop.encrypted", "1")


def qos_of(properties: tuple[tuple[str, str], ...]) -> int:
    """The QoS `properties` carry under QOS_PROPERTY (the last one wins); 1 without one."""
    qos = 1
    for name, value in properties:
        if name == QOS_PROPERTY and value in ("0", "1", "2"):
            qos = int(value)
    return qos


# Value classes made once or more per message (ids, messages, deliveries, PUBLISH packets) are
# immutable by contract, and the type checker holds every module to it (they read as frozen
# dataclasses). At run time they are plain slots dataclasses: a frozen one sets each field
# through `object.__setattr__`, which makes it four times as costly to build (2.6 us instead of
# 0.6 us for a `Message`), and one is built several times per message.
@dataclass_transform(frozen_default=True)
def value(cls: type[_T]) -> type[_T]:
    """An immutable value class: equal and hashable by its fields."""
    return dataclass(slots=True, unsafe_hash=True)(cls)


@dataclass_transform(frozen_default=True, order_default=True)
def ordered_value(cls: type[_T]) -> type[_T]:
    """An immutable value class that is also ordered by its fields, in declaration order."""
    return dataclass(slots=True, unsafe_hash=True, order=True)(cls)


@ordered_value
class MessageId:
    """Position of a message in its topic, in the form the Pulsar protocol uses.

    (ledger, entry) names a stored entry; `batch_index` names one message of an entry that
    holds several (a batch), and is -1 for the entry as a whole.
    """

    ledger: int
    entry: int
    batch_index: int = -1

    def __str__(self) -> str:
        if self.batch_index < 0:
            return f"{self.ledger}:{self.entry}"
        return f"{self.ledger}:{self.entry}:{self.batch_index}"

    @classmethod
    def parse(cls, text: str) -> MessageId:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"not a message id: {text!r}")
        return cls(*(int(part) for part in parts))

    @property
    def whole(self) -> MessageId:
        """The id of the entry this message is part of (itself for a whole entry)."""
        return self if self.batch_index < 0 else MessageId(self.ledger, self.entry)


@value
class Message:
    """A message as stored and delivered, independent of the protocol that produced it.

    `properties` is an ordered list of pairs (duplicates allowed), like Pulsar's repeated
    KeyValue field and MQTT 5 user properties. `qos` is the producer's delivery guarantee:
    0 may be dropped under pressure (oldest first), 1 and 2 are kept until acknowledged.
    `expires_at` (ms since the epoch, 0 = never) lets every backend drop expired messages;
    `deliver_at` (ms since the epoch, 0 = at once) holds it back from shared subscriptions.

    An entry may hold several messages (a Pulsar batch): `batch` lists them, each with its own
    payload and properties, and they share the entry's id, told apart by `MessageId.batch_index`.
    `wire` is what the producing protocol (`wire_format`, e.g. "pulsar") encoded beyond these
    fields (for Pulsar, the metadata block), kept so that consumers of that protocol receive the
    message exactly as it was sent; other protocols ignore it.
    """

    payload: bytes
    properties: tuple[tuple[str, str], ...] = ()
    key: str | None = None
    producer: str = ""
    publish_time: int = 0
    event_time: int = 0
    qos: int = 1
    expires_at: int = 0
    deliver_at: int = 0
    batch: tuple[Message, ...] = ()
    wire_format: str = ""
    wire: bytes = b""

    @property
    def count(self) -> int:
        """How many messages this entry holds: the batch size, or 1."""
        return len(self.batch) or 1


@value
class Delivery:
    """One message handed to a consumer; acknowledge it by passing it back to the consumer.

    A consumer that takes batches whole gets the entry with `acked`, the batch indexes it
    acknowledged already (on redelivery after a partial acknowledgement); other consumers get
    one delivery per unacknowledged batch message, with its `batch_index` in `message_id`.
    """

    topic: str
    message_id: MessageId
    message: Message
    redelivery_count: int = 0
    acked: frozenset[int] = frozenset()
