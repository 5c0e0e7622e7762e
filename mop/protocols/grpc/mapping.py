"""PulsarGrpcService messages <-> protocol-neutral `Message`s, message ids, and topic names.

A gRPC message is a Pulsar message without the Pulsar driver: its properties are the message
properties Pulsar clients see (and MQTT 5 clients see as user properties and, under the
documented `mqtt.*` names of `mop.protocols.mqtt.mapping`, as their other properties), its key
is the Pulsar message key, and its QoS comes from the properties as a Pulsar message's does
(`mop.message.qos_of`). Topics are named as Pulsar clients name them.
"""

from __future__ import annotations

from typing import Final

from mop.message import ENCRYPTED, Delivery, Message, MessageId, qos_of
from mop.protocols.grpc.proto import mop_grpc_pb2 as pb
from mop.protocols.grpc.status import GrpcError, StatusCode
from mop.topic_names import PulsarTopicName
from mop.topics import TopicError

# The largest sequence id a producer keeps (Pulsar's are int64 in storage and clients).
MAX_SEQUENCE_ID: Final = (1 << 63) - 1


# --- topic names ---------------------------------------------------------------------------------


def canonical_topic(name: str, *, tenant: str, namespace: str) -> str:
    """The full name of topic `name` as Pulsar clients give it: a full name, "tenant/ns/name",
    or a local name of the node's default namespace. INVALID_ARGUMENT for a name Pulsar would
    refuse or one with a "#" (MQTT subscribers could not name it), NOT_FOUND for a namespace of
    another tenant than the node's (it serves every namespace of its own; they need no
    creation)."""
    try:
        if "/" in name or "://" in name:
            parsed = PulsarTopicName.parse(name)
        else:
            parsed = PulsarTopicName("persistent", tenant, namespace, name)
    except TopicError as exc:
        raise GrpcError(StatusCode.INVALID_ARGUMENT, str(exc)) from None
    if parsed.tenant != tenant:
        raise GrpcError(
            StatusCode.NOT_FOUND,
            f"namespace '{parsed.tenant}/{parsed.namespace}' does not exist"
            f" (this node serves {tenant}/*)",
        )
    if "#" in parsed.local_name:
        raise GrpcError(StatusCode.INVALID_ARGUMENT, f"topic name {name!r} contains '#'")
    return str(parsed)


# --- message ids ---------------------------------------------------------------------------------


def to_proto_id(message_id: MessageId, partition: int = 0) -> pb.MessageId:
    """The id of a message of partition `partition` (0 for a topic without partitions)."""
    return pb.MessageId(
        ledger_id=message_id.ledger,
        entry_id=message_id.entry,
        batch_index=message_id.batch_index,
        partition=partition,
    )


def from_proto_id(message_id: pb.MessageId) -> MessageId:
    """The MessageId a client passed back (a batch index below -1 is read as none)."""
    return MessageId(message_id.ledger_id, message_id.entry_id, max(-1, message_id.batch_index))


# --- Send -> Message -----------------------------------------------------------------------------


def message_from_send(send: pb.Send, *, producer: str, now_ms: int) -> Message:
    """The stored form of a Send from producer `producer`, published at `now_ms`."""
    properties = tuple((prop.key, prop.value) for prop in send.properties)
    if ENCRYPTED in properties:  # mop's own mark (`mop.message.ENCRYPTED`): no client may claim it
        properties = tuple(pair for pair in properties if pair != ENCRYPTED)
    return Message(
        payload=send.payload,
        properties=properties,
        key=send.key if send.HasField("key") else None,
        producer=producer,
        publish_time=now_ms,
        event_time=max(0, send.event_time),
        qos=qos_of(properties),
        deliver_at=max(0, send.deliver_at_time),
    )


def sequence_id_of(send: pb.Send) -> int:
    """The sequence id a producer keeps for `send`: -1 for an unnumbered one (0)."""
    if send.sequence_id > MAX_SEQUENCE_ID:
        raise GrpcError(
            StatusCode.INVALID_ARGUMENT,
            f"sequence_id {send.sequence_id} is above the largest one ({MAX_SEQUENCE_ID})",
        )
    return send.sequence_id or -1


def stored_result(sequence_id: int, message_id: MessageId, partition: int = 0) -> pb.SendResult:
    return pb.SendResult(sequence_id=sequence_id, message_id=to_proto_id(message_id, partition))


def refused_result(sequence_id: int, error: GrpcError) -> pb.SendResult:
    return pb.SendResult(
        sequence_id=sequence_id, error=pb.Error(code=int(error.code), message=error.message)
    )


# --- Delivery -> Message -------------------------------------------------------------------------


def readable(message: Message) -> bool:
    """Whether a gRPC client can read `message`: not end-to-end encrypted by a Pulsar producer
    (only a Pulsar consumer with the key can), and not a batch kept packed."""
    return not message.opaque_count and not (message.properties and ENCRYPTED in message.properties)


def proto_message(delivery: Delivery, partition: int = 0) -> pb.Message:
    """The gRPC form of one delivered message (one message of a batch: deliveries to gRPC
    consumers are never whole batches), of partition `partition` of a partitioned topic."""
    message = delivery.message
    proto = pb.Message(
        message_id=to_proto_id(delivery.message_id, partition),
        payload=message.payload,
        properties=[pb.Property(key=key, value=value) for key, value in message.properties],
        publish_time=message.publish_time,
        event_time=message.event_time,
        producer_name=message.producer,
        redelivery_count=delivery.redelivery_count,
        topic=delivery.topic,
    )
    if message.key is not None:
        proto.key = message.key
    return proto


__all__ = [
    "MAX_SEQUENCE_ID",
    "canonical_topic",
    "from_proto_id",
    "message_from_send",
    "proto_message",
    "readable",
    "refused_result",
    "sequence_id_of",
    "stored_result",
    "to_proto_id",
]
