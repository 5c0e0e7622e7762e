"""Protocol-neutral messages and message ids, shared by adapters, the processor and backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar, dataclass_transform, overload

__all__ = [
    "CATCH_UP_KEY",
    "ENCRYPTED",
    "QOS_PROPERTY",
    "RETAINED",
    "TOMBSTONE_PROPERTY",
    "Delivery",
    "Message",
    "MessageId",
    "PackedBatch",
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


@value
class MessageId:
    """Position of a message in its topic, in the form the Pulsar protocol uses.

    (ledger, entry) names a stored entry; `batch_index` names one message of an entry that
    holds several (a batch), and is -1 for the entry as a whole. Ordered by those fields in
    that order.
    """

    ledger: int
    entry: int
    batch_index: int = -1

    # Ids are compared as each message is routed and acknowledged: field by field, which is
    # a third cheaper than the generated comparison of two tuples built for it.
    def __lt__(self, other: MessageId) -> bool:
        if other.__class__ is not MessageId:
            return NotImplemented
        if self.ledger != other.ledger:
            return self.ledger < other.ledger
        if self.entry != other.entry:
            return self.entry < other.entry
        return self.batch_index < other.batch_index

    def __gt__(self, other: MessageId) -> bool:
        if other.__class__ is not MessageId:
            return NotImplemented
        if self.ledger != other.ledger:
            return self.ledger > other.ledger
        if self.entry != other.entry:
            return self.entry > other.entry
        return self.batch_index > other.batch_index

    def __le__(self, other: MessageId) -> bool:
        if other.__class__ is not MessageId:
            return NotImplemented
        return not other.__lt__(self)

    def __ge__(self, other: MessageId) -> bool:
        if other.__class__ is not MessageId:
            return NotImplemented
        return not self.__lt__(other)

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
    It is a tuple, or a `PackedBatch` that also keeps the bytes the producing protocol packed
    them in (and may unpack them only when they are first asked for).
    `wire` is what the producing protocol (`wire_format`, e.g. "pulsar") encoded beyond these
    fields (for Pulsar, the metadata block), kept so that consumers of that protocol receive the
    message exactly as it was sent; other protocols ignore it.

    `opaque_count` is how many messages an entry holds when they are packed in a form mop cannot
    read (an end-to-end encrypted Pulsar batch): it is delivered whole, but permits and
    acknowledgements still count its messages one by one. 0 for every other entry.
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
    batch: Sequence[Message] = ()
    wire_format: str = ""
    wire: bytes = b""
    opaque_count: int = 0

    @property
    def count(self) -> int:
        """How many messages this entry holds: the batch size (readable or not), or 1."""
        return len(self.batch) or self.opaque_count or 1


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


class PackedBatch(Sequence["Message"]):
    """The messages of a batch entry together with `packed`, the bytes in which the protocol
    `packed_format` carried them (for Pulsar, the batch payload: each member's metadata and
    payload), so that consumers of that protocol get the entry as it was sent, with no work
    per message. `payload_bytes` is the size of the members' payloads.

    The members are `unpack()`ed the first time they are asked for (a stored batch read back
    for consumers of its own protocol never is); `len` needs only the count. Equal to any
    batch of the same members, tuples included.
    """

    __slots__ = ("_count", "_members", "_unpack", "packed", "packed_format", "payload_bytes")

    def __init__(
        self,
        count: int,
        packed_format: str,
        packed: bytes,
        payload_bytes: int,
        unpack: Callable[[], tuple[Message, ...]],
    ) -> None:
        self._count = count
        self.packed_format = packed_format
        self.packed = packed
        self.payload_bytes = payload_bytes
        self._unpack: Callable[[], tuple[Message, ...]] | None = unpack
        self._members: tuple[Message, ...] | None = None

    @classmethod
    def of(cls, members: tuple[Message, ...], packed_format: str, packed: bytes) -> PackedBatch:
        """A batch whose members are known already."""
        batch = cls(
            len(members), packed_format, packed, sum(len(m.payload) for m in members), tuple
        )
        batch._members = members
        batch._unpack = None
        return batch

    @property
    def members(self) -> tuple[Message, ...]:
        members = self._members
        if members is None:
            assert self._unpack is not None
            members = self._unpack()
            if len(members) != self._count:
                raise ValueError(f"a batch of {self._count} unpacked into {len(members)}")
            self._members, self._unpack = members, None
        return members

    def packed_as(self, packed_format: str) -> bytes | None:
        """`packed` when it is in `packed_format`."""
        return self.packed if packed_format == self.packed_format else None

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        return self.members[index]

    def __iter__(self) -> Iterator[Message]:
        return iter(self.members)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedBatch):
            return self.members == other.members
        if isinstance(other, tuple):
            return self.members == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.members)

    def __repr__(self) -> str:
        return f"PackedBatch({self._count} in {self.packed_format!r})"
