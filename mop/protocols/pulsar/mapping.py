"""Pulsar messages <-> protocol-neutral `Message`s, Pulsar message ids <-> `MessageId`s, and
Pulsar subscriptions <-> the processor's.

A SEND becomes a Message whose neutral fields serve every protocol and whose `wire` keeps the
metadata block as sent, so Pulsar consumers get the very bytes the producer wrote (and its
checksum holds). A batch becomes one entry whose `batch` lists its messages. A compressed
payload is stored decompressed (its metadata saying so), so that other protocols read it
and batches split; one that cannot be (with metadata mop does not know, or larger
decompressed than the broker's message size limit) is kept as sent, whole and opaque to
other protocols. An end-to-end encrypted message is kept as sent, metadata block and payload
(its encryption keys, algorithm, parameters, compression and sizes are what a consumer
decrypts with), and marked `ENCRYPTED` for other protocols, which skip it.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from typing import Final, TypeVar

from mop.message import ENCRYPTED, Message, MessageId, PackedBatch, qos_of
from mop.protocols.pulsar.batching import read_members
from mop.protocols.pulsar.codec import decode_message, message_bytes
from mop.protocols.pulsar.compression import UndecodablePayload, decompress
from mop.protocols.pulsar.errors import PulsarError
from mop.protocols.pulsar.frames import DEFAULT_MAX_MESSAGE_SIZE
from mop.protocols.pulsar.metadata import (
    EARLIEST_ID,
    LATEST_ID,
    CompressionType,
    KeyValue,
    MessageIdData,
    MessageMetadata,
    Payload,
    SingleMessageMetadata,
)

WIRE_FORMAT: Final = "pulsar"
_U32: Final = struct.Struct(">I")
_MASK64: Final = (1 << 64) - 1
# The signed forms of the special start ids (the client keeps ids as int64).
EARLIEST: Final = MessageId(-1, -1)
LATEST: Final = MessageId(LATEST_ID, LATEST_ID)


# --- message ids ---------------------------------------------------------------------------------


def signed64(value: int) -> int:
    """A uint64 id field read as the int64 clients keep (2**64 - 1 is -1)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def from_id_data(data: MessageIdData) -> MessageId:
    """The MessageId a client named (EARLIEST / LATEST for the special start ids)."""
    if data.ledger_id == EARLIEST_ID and data.entry_id == EARLIEST_ID:
        return EARLIEST
    return MessageId(signed64(data.ledger_id), signed64(data.entry_id), max(-1, data.batch_index))


def to_id_data(message_id: MessageId | None, batch_index: int | None = None) -> MessageIdData:
    """MessageIdData for an id; None (no message) is sent as (-1, -1)."""
    if message_id is None:
        return MessageIdData(ledger_id=_MASK64, entry_id=_MASK64)
    index = message_id.batch_index if batch_index is None else batch_index
    return MessageIdData(
        ledger_id=message_id.ledger & _MASK64,
        entry_id=message_id.entry & _MASK64,
        batch_index=index,
    )


# --- SEND -> Message -----------------------------------------------------------------------------


def _pairs(properties: tuple[KeyValue, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((kv.key, kv.value) for kv in properties)


def _key(partition_key: str | None, ordering_key: bytes | None) -> str | None:
    # Key_Shared dispatch hashes the ordering key when there is one, else the partition key.
    if ordering_key is not None:
        return ordering_key.decode("utf-8", "surrogateescape")
    return partition_key


def message_from_payload(payload: Payload, *, limit: int = DEFAULT_MAX_MESSAGE_SIZE) -> Message:
    """The stored form of a SEND's metadata and payload; `limit` is the broker's largest
    message (a compressed one larger than that decompressed is stored compressed)."""
    meta = payload.metadata
    raw = payload.raw
    (meta_size,) = _U32.unpack_from(raw, 0)
    wire = raw[4 : 4 + meta_size]
    data = payload.data
    encrypted = meta.encrypted
    if meta.compression is not CompressionType.NONE and not encrypted:
        data, meta, wire = _decompressed(data, meta, wire, limit)
    producer = meta.producer_name
    publish_time = meta.publish_time
    batch: PackedBatch | tuple[()] = ()
    if (
        meta.num_messages_in_batch is not None
        and meta.compression is CompressionType.NONE
        and not encrypted
    ):
        members = split_batch(data, meta.num_messages_in_batch, producer, publish_time)
        if members:
            # Kept as sent too: Pulsar consumers get the entry without it being packed again.
            batch = PackedBatch.of(members, WIRE_FORMAT, data)
    properties = _pairs(meta.properties)
    if encrypted:
        properties = (*_without_marker(properties), ENCRYPTED)
    elif properties and ENCRYPTED in properties:
        properties = _without_marker(properties)
    # An entry is held until written if any message in it must be (see QOS_PROPERTY).
    qos = max(member.qos for member in batch) if batch else qos_of(properties)
    return Message(
        payload=b"" if batch or meta.null_value else data,
        properties=properties,
        qos=qos,
        key=_key(meta.partition_key, meta.ordering_key),
        producer=producer,
        publish_time=publish_time,
        event_time=meta.event_time or 0,
        deliver_at=max(0, meta.deliver_at_time or 0),
        batch=batch,
        wire_format=WIRE_FORMAT,
        wire=wire,
        # A batch kept packed (encrypted, or too large decompressed) still holds its messages:
        # Pulsar consumers are charged a permit for each and give each back.
        opaque_count=0 if batch else meta.num_messages_in_batch or 0,
    )


def _without_marker(properties: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    return tuple(pair for pair in properties if pair != ENCRYPTED)


def _decompressed(
    data: bytes, meta: MessageMetadata, wire: bytes, limit: int
) -> tuple[bytes, MessageMetadata, bytes]:
    """A compressed payload, its metadata and metadata block as they are stored: decompressed
    when the metadata block holds nothing but what mop reads (it encodes again to the same
    bytes: not encrypted, say) and the payload decompresses to at most `limit` bytes; as sent
    otherwise. Above the limit no consumer could take it in one frame (mop's and Java's drop
    the connection), and it would come again forever."""
    if meta.chunk_id is not None or message_bytes(meta) != wire:
        # A chunk is a part of the compressed message: it does not decompress alone (and its
        # `uncompressed_size` is the whole message's).
        return data, meta, wire
    try:
        plain = decompress(data, meta.compression, meta.uncompressed_size, limit)
    except UndecodablePayload:
        return data, meta, wire
    meta = dataclasses.replace(meta, compression=CompressionType.NONE, uncompressed_size=None)
    return plain, meta, message_bytes(meta)


def split_batch(data: bytes, count: int, producer: str, publish_time: int) -> tuple[Message, ...]:
    """The messages of an uncompressed batch payload, each keeping its metadata bytes; () when
    the payload does not parse as `count` entries (e.g. it is encrypted)."""
    try:
        members = read_members(data, count)
    except PulsarError:
        return ()
    return tuple(
        Message(
            payload=member.payload,
            properties=member.properties,
            key=member.partition_key,
            producer=producer,
            publish_time=publish_time,
            event_time=member.event_time,
            qos=qos_of(member.properties),
            wire_format=WIRE_FORMAT,
            wire=member.header,
        )
        for member in members
    )


# --- properties added on the way (a trace context) -----------------------------------------------

Properties = tuple[tuple[str, str], ...]
_M = TypeVar("_M", MessageMetadata, SingleMessageMetadata)


def with_properties(message: Message, extra: Properties) -> Message:
    """`message` with the properties `extra` added after its own, where Pulsar consumers see
    them too: in its metadata block, encoded again. Unchanged when that block holds what mop
    would not encode the same way again (an encrypted message, say) or is one chunk of a
    larger message."""
    if message.wire_format != WIRE_FORMAT or not message.wire:
        return dataclasses.replace(message, properties=message.properties + extra)
    meta = _metadata(message.wire, MessageMetadata)
    if meta is None or meta.chunk_id is not None or meta.encrypted:
        return message
    added = tuple(KeyValue(key=k, value=v) for k, v in extra)
    wire = message_bytes(dataclasses.replace(meta, properties=meta.properties + added))
    return dataclasses.replace(message, properties=message.properties + extra, wire=wire)


def with_member_properties(message: Message, extras: tuple[Properties, ...]) -> Message:
    """A batch entry whose member `i` has the properties `extras[i]` added (see
    `with_properties`); a member whose metadata would not encode the same way again is
    left as it is."""
    members = list(message.batch)
    for index, extra in enumerate(extras):
        member = members[index]
        if not extra or not member.wire:
            continue
        meta = _metadata(member.wire, SingleMessageMetadata)
        if meta is None:
            continue
        added = tuple(KeyValue(key=k, value=v) for k, v in extra)
        wire = message_bytes(dataclasses.replace(meta, properties=meta.properties + added))
        members[index] = dataclasses.replace(
            member, properties=member.properties + extra, wire=wire
        )
    return dataclasses.replace(message, batch=tuple(members))


def _metadata(wire: bytes, cls: type[_M]) -> _M | None:
    """The metadata `wire` encodes, when encoding it again gives the same bytes."""
    try:
        meta = decode_message(cls, wire)
    except PulsarError:
        return None
    return meta if message_bytes(meta) == wire else None


# --- Message -> MESSAGE --------------------------------------------------------------------------


def entry_bytes(message: Message, message_id: MessageId) -> bytes:
    """`metaSize | metadata | payload` for delivering `message` to a Pulsar consumer."""
    if message.wire_format == WIRE_FORMAT and message.wire:
        meta = message.wire
    else:
        meta = message_bytes(_metadata_for(message, message_id))
    batch = message.batch
    if not batch:
        data = message.payload
    elif isinstance(batch, PackedBatch) and (packed := batch.packed_as(WIRE_FORMAT)) is not None:
        data = packed
    else:
        data = _batch_payload(batch)
    return b"".join((_U32.pack(len(meta)), meta, data))


def _metadata_for(message: Message, message_id: MessageId) -> MessageMetadata:
    """Metadata for a message another protocol produced (e.g. an MQTT PUBLISH)."""
    return MessageMetadata(
        producer_name=message.producer or "mop",
        sequence_id=max(0, message_id.entry),
        publish_time=message.publish_time,
        properties=tuple(KeyValue(key=k, value=v) for k, v in message.properties),
        partition_key=message.key,
        num_messages_in_batch=len(message.batch) if message.batch else None,
        event_time=message.event_time or None,
        deliver_at_time=message.deliver_at or None,
    )


def _batch_payload(members: Sequence[Message]) -> bytes:
    parts: list[bytes] = []
    for member in members:
        if member.wire_format == WIRE_FORMAT and member.wire:
            meta = member.wire
        else:
            meta = message_bytes(
                SingleMessageMetadata(
                    properties=tuple(KeyValue(key=k, value=v) for k, v in member.properties),
                    partition_key=member.key,
                    payload_size=len(member.payload),
                    event_time=member.event_time or None,
                )
            )
        parts += (_U32.pack(len(meta)), meta, member.payload)
    return b"".join(parts)


__all__ = [
    "EARLIEST",
    "LATEST",
    "WIRE_FORMAT",
    "entry_bytes",
    "from_id_data",
    "message_from_payload",
    "signed64",
    "split_batch",
    "to_id_data",
    "with_member_properties",
    "with_properties",
]


# --- subscriptions -------------------------------------------------------------------------------


def subscription_name(topic: str, subscription: str) -> str:
    """The processor subscription behind Pulsar subscription `subscription` of `topic` (a
    Pulsar subscription belongs to one topic; the processor's are named across topics)."""
    return f"{topic}::{subscription}"


def pulsar_subscription(topic: str, name: str) -> str:
    """The name a Pulsar client knows processor subscription `name` by on `topic`: the
    subscription it made there, else the name as it is (an MQTT client id, say)."""
    return name.removeprefix(f"{topic}::")
