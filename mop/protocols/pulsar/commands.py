"""The Pulsar commands (BaseCommand sub-messages) as frozen dataclasses with their field tables.

Each class is named after its BaseCommand type in CamelCase and carries that type as `TYPE`;
field numbers follow PulsarApi.proto as listed in the protocol reference (§2-§10).
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar, Final

from mop.protocols.pulsar.codec import (
    BOOL,
    BYTES,
    DOUBLE,
    INT32,
    INT64,
    STRING,
    UINT32,
    UINT64,
    message,
    pb,
)
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.metadata import KeyLongValue, KeyValue, MessageIdData, Payload


class CommandType(IntEnum):
    """BaseCommand.Type: the number of the command, and of the BaseCommand field that holds it."""

    CONNECT = 2
    CONNECTED = 3
    SUBSCRIBE = 4
    PRODUCER = 5
    SEND = 6
    SEND_RECEIPT = 7
    SEND_ERROR = 8
    MESSAGE = 9
    ACK = 10
    FLOW = 11
    UNSUBSCRIBE = 12
    SUCCESS = 13
    ERROR = 14
    CLOSE_PRODUCER = 15
    CLOSE_CONSUMER = 16
    PRODUCER_SUCCESS = 17
    PING = 18
    PONG = 19
    REDELIVER_UNACKNOWLEDGED_MESSAGES = 20
    PARTITIONED_METADATA = 21
    PARTITIONED_METADATA_RESPONSE = 22
    LOOKUP = 23
    LOOKUP_RESPONSE = 24
    CONSUMER_STATS = 25
    CONSUMER_STATS_RESPONSE = 26
    REACHED_END_OF_TOPIC = 27
    SEEK = 28
    GET_LAST_MESSAGE_ID = 29
    GET_LAST_MESSAGE_ID_RESPONSE = 30
    ACTIVE_CONSUMER_CHANGE = 31
    GET_TOPICS_OF_NAMESPACE = 32
    GET_TOPICS_OF_NAMESPACE_RESPONSE = 33
    GET_SCHEMA = 34
    GET_SCHEMA_RESPONSE = 35
    AUTH_CHALLENGE = 36
    AUTH_RESPONSE = 37
    ACK_RESPONSE = 38
    GET_OR_CREATE_SCHEMA = 39
    GET_OR_CREATE_SCHEMA_RESPONSE = 40


# The newest protocol version mop speaks (ProtocolVersion v20); CONNECTED answers min(client, this).
PROTOCOL_VERSION: Final = 20


class SchemaType(IntEnum):
    NONE = 0
    STRING = 1
    JSON = 2
    PROTOBUF = 3
    AVRO = 4
    BOOL = 5
    INT8 = 6
    INT16 = 7
    INT32 = 8
    INT64 = 9
    FLOAT = 10
    DOUBLE = 11
    DATE = 12
    TIME = 13
    TIMESTAMP = 14
    KEY_VALUE = 15
    INSTANT = 16
    LOCAL_DATE = 17
    LOCAL_TIME = 18
    LOCAL_DATE_TIME = 19
    PROTOBUF_NATIVE = 20
    AUTO_CONSUME = 21
    EXTERNAL = 22


class SubType(IntEnum):
    Exclusive = 0
    Shared = 1
    Failover = 2
    Key_Shared = 3


class InitialPosition(IntEnum):
    Latest = 0
    Earliest = 1


class KeySharedMode(IntEnum):
    AUTO_SPLIT = 0
    STICKY = 1


class ProducerAccessMode(IntEnum):
    Shared = 0
    Exclusive = 1
    WaitForExclusive = 2
    ExclusiveWithFencing = 3


class AckType(IntEnum):
    Individual = 0
    Cumulative = 1


class LookupType(IntEnum):
    Redirect = 0
    Connect = 1
    Failed = 2


class MetadataResult(IntEnum):
    """CommandPartitionedTopicMetadataResponse.LookupType."""

    Success = 0
    Failed = 1


class TopicsMode(IntEnum):
    """CommandGetTopicsOfNamespace.Mode."""

    PERSISTENT = 0
    NON_PERSISTENT = 1
    ALL = 2


# --- shared sub-messages -------------------------------------------------------------------------


@message
class FeatureFlags:
    supports_auth_refresh: bool = pb(1, BOOL, default=False)
    supports_broker_entry_metadata: bool = pb(2, BOOL, default=False)
    supports_partial_producer: bool = pb(3, BOOL, default=False)
    supports_topic_watchers: bool = pb(4, BOOL, default=False)


@message
class Schema:
    name: str = pb(1, STRING)
    schema_data: bytes = pb(3, BYTES)
    type: SchemaType = pb(4, SchemaType)
    properties: tuple[KeyValue, ...] = pb(5, KeyValue, repeated=True, default=())


@message
class IntRange:
    start: int = pb(1, INT32)
    end: int = pb(2, INT32)


@message
class KeySharedMeta:
    key_shared_mode: KeySharedMode = pb(1, KeySharedMode)
    hash_ranges: tuple[IntRange, ...] = pb(3, IntRange, repeated=True, default=())
    allow_out_of_order_delivery: bool = pb(4, BOOL, default=False)


# --- connection ----------------------------------------------------------------------------------


@message
class Connect:
    TYPE: ClassVar = CommandType.CONNECT
    client_version: str = pb(1, STRING)
    auth_data: bytes | None = pb(3, BYTES, default=None)
    protocol_version: int = pb(4, INT32, default=0)
    auth_method_name: str | None = pb(5, STRING, default=None)
    proxy_to_broker_url: str | None = pb(6, STRING, default=None)
    original_principal: str | None = pb(7, STRING, default=None)
    original_auth_data: str | None = pb(8, STRING, default=None)
    original_auth_method: str | None = pb(9, STRING, default=None)
    feature_flags: FeatureFlags | None = pb(10, FeatureFlags, default=None)


@message
class Connected:
    TYPE: ClassVar = CommandType.CONNECTED
    server_version: str = pb(1, STRING)
    protocol_version: int = pb(2, INT32, default=0)
    max_message_size: int | None = pb(3, INT32, default=None)
    feature_flags: FeatureFlags | None = pb(4, FeatureFlags, default=None)


@message
class AuthData:
    """Credentials in an authentication exchange: what a method name says the bytes are."""

    auth_method_name: str | None = pb(1, STRING, default=None)
    auth_data: bytes | None = pb(2, BYTES, default=None)


@message
class AuthChallenge:
    """The broker asks for fresh credentials (a token about to expire, or a SASL round)."""

    TYPE: ClassVar = CommandType.AUTH_CHALLENGE
    server_version: str | None = pb(1, STRING, default=None)
    challenge: AuthData | None = pb(2, AuthData, default=None)
    protocol_version: int = pb(3, INT32, default=0)


@message
class AuthResponse:
    """The client's answer to AUTH_CHALLENGE: its credentials, fetched anew."""

    TYPE: ClassVar = CommandType.AUTH_RESPONSE
    client_version: str | None = pb(1, STRING, default=None)
    response: AuthData | None = pb(2, AuthData, default=None)
    protocol_version: int = pb(3, INT32, default=0)


@message
class Ping:
    TYPE: ClassVar = CommandType.PING


@message
class Pong:
    TYPE: ClassVar = CommandType.PONG


@message
class Success:
    TYPE: ClassVar = CommandType.SUCCESS
    request_id: int = pb(1, UINT64)
    schema: Schema | None = pb(2, Schema, default=None)


@message
class Error:
    TYPE: ClassVar = CommandType.ERROR
    request_id: int = pb(1, UINT64)
    error: ServerError = pb(2, ServerError)
    message: str = pb(3, STRING)


# --- discovery -----------------------------------------------------------------------------------


@message
class PartitionedMetadata:
    TYPE: ClassVar = CommandType.PARTITIONED_METADATA
    topic: str = pb(1, STRING)
    request_id: int = pb(2, UINT64)
    original_principal: str | None = pb(3, STRING, default=None)
    original_auth_data: str | None = pb(4, STRING, default=None)
    original_auth_method: str | None = pb(5, STRING, default=None)
    metadata_auto_creation_enabled: bool | None = pb(6, BOOL, default=None)


@message
class PartitionedMetadataResponse:
    TYPE: ClassVar = CommandType.PARTITIONED_METADATA_RESPONSE
    partitions: int | None = pb(1, UINT32, default=None)
    request_id: int = pb(2, UINT64)
    response: MetadataResult | None = pb(3, MetadataResult, default=None)
    error: ServerError | None = pb(4, ServerError, default=None)
    message: str | None = pb(5, STRING, default=None)


@message
class Lookup:
    TYPE: ClassVar = CommandType.LOOKUP
    topic: str = pb(1, STRING)
    request_id: int = pb(2, UINT64)
    authoritative: bool = pb(3, BOOL, default=False)
    original_principal: str | None = pb(4, STRING, default=None)
    original_auth_data: str | None = pb(5, STRING, default=None)
    original_auth_method: str | None = pb(6, STRING, default=None)
    advertised_listener_name: str | None = pb(7, STRING, default=None)


@message
class LookupResponse:
    TYPE: ClassVar = CommandType.LOOKUP_RESPONSE
    broker_service_url: str | None = pb(1, STRING, default=None)
    broker_service_url_tls: str | None = pb(2, STRING, default=None)
    response: LookupType | None = pb(3, LookupType, default=None)
    request_id: int = pb(4, UINT64)
    authoritative: bool = pb(5, BOOL, default=False)
    error: ServerError | None = pb(6, ServerError, default=None)
    message: str | None = pb(7, STRING, default=None)
    proxy_through_service_url: bool = pb(8, BOOL, default=False)


@message
class GetTopicsOfNamespace:
    TYPE: ClassVar = CommandType.GET_TOPICS_OF_NAMESPACE
    request_id: int = pb(1, UINT64)
    namespace: str = pb(2, STRING)
    mode: TopicsMode = pb(3, TopicsMode, default=TopicsMode.PERSISTENT)
    topics_pattern: str | None = pb(4, STRING, default=None)
    topics_hash: str | None = pb(5, STRING, default=None)


@message
class GetTopicsOfNamespaceResponse:
    TYPE: ClassVar = CommandType.GET_TOPICS_OF_NAMESPACE_RESPONSE
    request_id: int = pb(1, UINT64)
    topics: tuple[str, ...] = pb(2, STRING, repeated=True, default=())
    filtered: bool = pb(3, BOOL, default=False)
    topics_hash: str | None = pb(4, STRING, default=None)
    changed: bool = pb(5, BOOL, default=True)


# --- producers -----------------------------------------------------------------------------------


@message
class Producer:
    TYPE: ClassVar = CommandType.PRODUCER
    topic: str = pb(1, STRING)
    producer_id: int = pb(2, UINT64)
    request_id: int = pb(3, UINT64)
    producer_name: str | None = pb(4, STRING, default=None)
    encrypted: bool = pb(5, BOOL, default=False)
    metadata: tuple[KeyValue, ...] = pb(6, KeyValue, repeated=True, default=())
    schema: Schema | None = pb(7, Schema, default=None)
    epoch: int = pb(8, UINT64, default=0)
    user_provided_producer_name: bool = pb(9, BOOL, default=True)
    producer_access_mode: ProducerAccessMode = pb(
        10, ProducerAccessMode, default=ProducerAccessMode.Shared
    )
    topic_epoch: int | None = pb(11, UINT64, default=None)
    txn_enabled: bool = pb(12, BOOL, default=False)
    initial_subscription_name: str | None = pb(13, STRING, default=None)


@message
class ProducerSuccess:
    TYPE: ClassVar = CommandType.PRODUCER_SUCCESS
    request_id: int = pb(1, UINT64)
    producer_name: str = pb(2, STRING)
    last_sequence_id: int = pb(3, INT64, default=-1)
    schema_version: bytes | None = pb(4, BYTES, default=None)
    topic_epoch: int | None = pb(5, UINT64, default=None)
    # False means "queued" (WaitForExclusive); a second PRODUCER_SUCCESS follows.
    producer_ready: bool = pb(6, BOOL, default=True)


@message
class Send:
    """SEND, with the metadata and payload that follow the command in the frame."""

    TYPE: ClassVar = CommandType.SEND
    producer_id: int = pb(1, UINT64)
    sequence_id: int = pb(2, UINT64)
    num_messages: int = pb(3, INT32, default=1)
    txnid_least_bits: int | None = pb(4, UINT64, default=None)
    txnid_most_bits: int | None = pb(5, UINT64, default=None)
    highest_sequence_id: int = pb(6, UINT64, default=0)
    is_chunk: bool = pb(7, BOOL, default=False)
    marker: bool = pb(8, BOOL, default=False)
    message_id: MessageIdData | None = pb(9, MessageIdData, default=None)
    payload: Payload | None = None  # not a protobuf field: the rest of the frame


@message
class SendReceipt:
    TYPE: ClassVar = CommandType.SEND_RECEIPT
    producer_id: int = pb(1, UINT64)
    sequence_id: int = pb(2, UINT64)
    message_id: MessageIdData | None = pb(3, MessageIdData, default=None)
    highest_sequence_id: int = pb(4, UINT64, default=0)


@message
class SendError:
    TYPE: ClassVar = CommandType.SEND_ERROR
    producer_id: int = pb(1, UINT64)
    sequence_id: int = pb(2, UINT64)
    error: ServerError = pb(3, ServerError)
    message: str = pb(4, STRING)


@message
class CloseProducer:
    TYPE: ClassVar = CommandType.CLOSE_PRODUCER
    producer_id: int = pb(1, UINT64)
    request_id: int = pb(2, UINT64)
    assigned_broker_service_url: str | None = pb(3, STRING, default=None)
    assigned_broker_service_url_tls: str | None = pb(4, STRING, default=None)


# --- consumers -----------------------------------------------------------------------------------


@message
class Subscribe:
    TYPE: ClassVar = CommandType.SUBSCRIBE
    topic: str = pb(1, STRING)
    subscription: str = pb(2, STRING)
    sub_type: SubType = pb(3, SubType)
    consumer_id: int = pb(4, UINT64)
    request_id: int = pb(5, UINT64)
    consumer_name: str | None = pb(6, STRING, default=None)
    priority_level: int | None = pb(7, INT32, default=None)
    durable: bool = pb(8, BOOL, default=True)
    start_message_id: MessageIdData | None = pb(9, MessageIdData, default=None)
    metadata: tuple[KeyValue, ...] = pb(10, KeyValue, repeated=True, default=())
    read_compacted: bool = pb(11, BOOL, default=False)
    schema: Schema | None = pb(12, Schema, default=None)
    initial_position: InitialPosition = pb(13, InitialPosition, default=InitialPosition.Latest)
    replicate_subscription_state: bool = pb(14, BOOL, default=False)
    force_topic_creation: bool = pb(15, BOOL, default=True)
    start_message_rollback_duration_sec: int = pb(16, UINT64, default=0)
    key_shared_meta: KeySharedMeta | None = pb(17, KeySharedMeta, default=None)
    subscription_properties: tuple[KeyValue, ...] = pb(18, KeyValue, repeated=True, default=())
    consumer_epoch: int | None = pb(19, UINT64, default=None)


@message
class Flow:
    TYPE: ClassVar = CommandType.FLOW
    consumer_id: int = pb(1, UINT64)
    message_permits: int = pb(2, UINT32)


@message
class Message:
    """MESSAGE, with the metadata and payload that follow the command in the frame."""

    TYPE: ClassVar = CommandType.MESSAGE
    consumer_id: int = pb(1, UINT64)
    message_id: MessageIdData = pb(2, MessageIdData)
    redelivery_count: int = pb(3, UINT32, default=0)
    # Batch-index acks: bit i set means message i of the batch is still to be delivered.
    ack_set: tuple[int, ...] = pb(4, INT64, repeated=True, default=())
    consumer_epoch: int | None = pb(5, UINT64, default=None)
    payload: Payload | None = None  # not a protobuf field: the rest of the frame


@message
class Ack:
    TYPE: ClassVar = CommandType.ACK
    consumer_id: int = pb(1, UINT64)
    ack_type: AckType = pb(2, AckType)
    message_id: tuple[MessageIdData, ...] = pb(3, MessageIdData, repeated=True, default=())
    validation_error: int | None = pb(4, INT32, default=None)
    properties: tuple[KeyLongValue, ...] = pb(5, KeyLongValue, repeated=True, default=())
    txnid_least_bits: int | None = pb(6, UINT64, default=None)
    txnid_most_bits: int | None = pb(7, UINT64, default=None)
    request_id: int | None = pb(8, UINT64, default=None)


@message
class AckResponse:
    TYPE: ClassVar = CommandType.ACK_RESPONSE
    consumer_id: int = pb(1, UINT64)
    txnid_least_bits: int | None = pb(2, UINT64, default=None)
    txnid_most_bits: int | None = pb(3, UINT64, default=None)
    error: ServerError | None = pb(4, ServerError, default=None)
    message: str | None = pb(5, STRING, default=None)
    request_id: int | None = pb(6, UINT64, default=None)


@message
class RedeliverUnacknowledgedMessages:
    """Nack: redeliver these ids, or every unacked message of the consumer when empty."""

    TYPE: ClassVar = CommandType.REDELIVER_UNACKNOWLEDGED_MESSAGES
    consumer_id: int = pb(1, UINT64)
    message_ids: tuple[MessageIdData, ...] = pb(2, MessageIdData, repeated=True, default=())
    consumer_epoch: int | None = pb(3, UINT64, default=None)


@message
class Unsubscribe:
    TYPE: ClassVar = CommandType.UNSUBSCRIBE
    consumer_id: int = pb(1, UINT64)
    request_id: int = pb(2, UINT64)


@message
class Seek:
    TYPE: ClassVar = CommandType.SEEK
    consumer_id: int = pb(1, UINT64)
    request_id: int = pb(2, UINT64)
    message_id: MessageIdData | None = pb(3, MessageIdData, default=None)
    message_publish_time: int | None = pb(4, UINT64, default=None)


@message
class CloseConsumer:
    TYPE: ClassVar = CommandType.CLOSE_CONSUMER
    consumer_id: int = pb(1, UINT64)
    request_id: int = pb(2, UINT64)
    assigned_broker_service_url: str | None = pb(3, STRING, default=None)
    assigned_broker_service_url_tls: str | None = pb(4, STRING, default=None)


@message
class ReachedEndOfTopic:
    TYPE: ClassVar = CommandType.REACHED_END_OF_TOPIC
    consumer_id: int = pb(1, UINT64)


@message
class ConsumerStats:
    TYPE: ClassVar = CommandType.CONSUMER_STATS
    request_id: int = pb(1, UINT64)
    consumer_id: int = pb(4, UINT64)


@message
class ConsumerStatsResponse:
    """One consumer as its broker sees it; an unknown consumer is told with `error_code`.
    Rates are per second, throughput in bytes per second."""

    TYPE: ClassVar = CommandType.CONSUMER_STATS_RESPONSE
    request_id: int = pb(1, UINT64)
    error_code: ServerError | None = pb(2, ServerError, default=None)
    error_message: str | None = pb(3, STRING, default=None)
    msg_rate_out: float | None = pb(4, DOUBLE, default=None)
    msg_throughput_out: float | None = pb(5, DOUBLE, default=None)
    msg_rate_redeliver: float | None = pb(6, DOUBLE, default=None)
    consumer_name: str | None = pb(7, STRING, default=None)
    available_permits: int | None = pb(8, UINT64, default=None)
    unacked_messages: int | None = pb(9, UINT64, default=None)
    blocked_consumer_on_unacked_msgs: bool | None = pb(10, BOOL, default=None)
    address: str | None = pb(11, STRING, default=None)
    connected_since: str | None = pb(12, STRING, default=None)
    type: str | None = pb(13, STRING, default=None)
    msg_rate_expired: float | None = pb(14, DOUBLE, default=None)
    msg_backlog: int | None = pb(15, UINT64, default=None)
    message_ack_rate: float | None = pb(16, DOUBLE, default=None)


@message
class GetLastMessageId:
    TYPE: ClassVar = CommandType.GET_LAST_MESSAGE_ID
    consumer_id: int = pb(1, UINT64)
    request_id: int = pb(2, UINT64)


@message
class GetLastMessageIdResponse:
    TYPE: ClassVar = CommandType.GET_LAST_MESSAGE_ID_RESPONSE
    last_message_id: MessageIdData = pb(1, MessageIdData)
    request_id: int = pb(2, UINT64)
    consumer_mark_delete_position: MessageIdData | None = pb(3, MessageIdData, default=None)


@message
class ActiveConsumerChange:
    TYPE: ClassVar = CommandType.ACTIVE_CONSUMER_CHANGE
    consumer_id: int = pb(1, UINT64)
    is_active: bool = pb(2, BOOL, default=False)


# --- schemas -------------------------------------------------------------------------------------


@message
class GetSchema:
    """The schema of a topic: version `schema_version` (8 bytes, big-endian), else the latest."""

    TYPE: ClassVar = CommandType.GET_SCHEMA
    request_id: int = pb(1, UINT64)
    topic: str = pb(2, STRING)
    schema_version: bytes | None = pb(3, BYTES, default=None)


@message
class GetSchemaResponse:
    TYPE: ClassVar = CommandType.GET_SCHEMA_RESPONSE
    request_id: int = pb(1, UINT64)
    error_code: ServerError | None = pb(2, ServerError, default=None)
    error_message: str | None = pb(3, STRING, default=None)
    schema: Schema | None = pb(4, Schema, default=None)
    schema_version: bytes | None = pb(5, BYTES, default=None)


@message
class GetOrCreateSchema:
    """The version of `schema` for a topic, registered when it is new (and compatible)."""

    TYPE: ClassVar = CommandType.GET_OR_CREATE_SCHEMA
    request_id: int = pb(1, UINT64)
    topic: str = pb(2, STRING)
    schema: Schema = pb(3, Schema)


@message
class GetOrCreateSchemaResponse:
    TYPE: ClassVar = CommandType.GET_OR_CREATE_SCHEMA_RESPONSE
    request_id: int = pb(1, UINT64)
    error_code: ServerError | None = pb(2, ServerError, default=None)
    error_message: str | None = pb(3, STRING, default=None)
    schema_version: bytes | None = pb(4, BYTES, default=None)


Command = (
    Connect
    | Connected
    | AuthChallenge
    | AuthResponse
    | Ping
    | Pong
    | Success
    | Error
    | PartitionedMetadata
    | PartitionedMetadataResponse
    | Lookup
    | LookupResponse
    | GetTopicsOfNamespace
    | GetTopicsOfNamespaceResponse
    | Producer
    | ProducerSuccess
    | Send
    | SendReceipt
    | SendError
    | CloseProducer
    | Subscribe
    | Flow
    | Message
    | Ack
    | AckResponse
    | RedeliverUnacknowledgedMessages
    | Unsubscribe
    | Seek
    | CloseConsumer
    | ReachedEndOfTopic
    | GetLastMessageId
    | GetLastMessageIdResponse
    | ActiveConsumerChange
    | GetSchema
    | GetSchemaResponse
    | GetOrCreateSchema
    | GetOrCreateSchemaResponse
    | ConsumerStats
    | ConsumerStatsResponse
)

# CommandType -> class, for every type this module knows.
COMMAND_CLASSES: Final[dict[int, type[Command]]] = {
    cls.TYPE: cls
    for cls in (
        Connect,
        Connected,
        AuthChallenge,
        AuthResponse,
        Ping,
        Pong,
        Success,
        Error,
        PartitionedMetadata,
        PartitionedMetadataResponse,
        Lookup,
        LookupResponse,
        GetTopicsOfNamespace,
        GetTopicsOfNamespaceResponse,
        Producer,
        ProducerSuccess,
        Send,
        SendReceipt,
        SendError,
        CloseProducer,
        Subscribe,
        Flow,
        Message,
        Ack,
        AckResponse,
        RedeliverUnacknowledgedMessages,
        Unsubscribe,
        Seek,
        CloseConsumer,
        ReachedEndOfTopic,
        GetLastMessageId,
        GetLastMessageIdResponse,
        ActiveConsumerChange,
        GetSchema,
        GetSchemaResponse,
        GetOrCreateSchema,
        GetOrCreateSchemaResponse,
        ConsumerStats,
        ConsumerStatsResponse,
    )
}

__all__ = [
    "COMMAND_CLASSES",
    "PROTOCOL_VERSION",
    "Ack",
    "AckResponse",
    "AckType",
    "ActiveConsumerChange",
    "AuthChallenge",
    "AuthData",
    "AuthResponse",
    "CloseConsumer",
    "CloseProducer",
    "Command",
    "CommandType",
    "Connect",
    "Connected",
    "ConsumerStats",
    "ConsumerStatsResponse",
    "Error",
    "FeatureFlags",
    "Flow",
    "GetLastMessageId",
    "GetLastMessageIdResponse",
    "GetOrCreateSchema",
    "GetOrCreateSchemaResponse",
    "GetSchema",
    "GetSchemaResponse",
    "GetTopicsOfNamespace",
    "GetTopicsOfNamespaceResponse",
    "InitialPosition",
    "IntRange",
    "KeySharedMeta",
    "KeySharedMode",
    "Lookup",
    "LookupResponse",
    "LookupType",
    "Message",
    "MetadataResult",
    "PartitionedMetadata",
    "PartitionedMetadataResponse",
    "Ping",
    "Pong",
    "Producer",
    "ProducerAccessMode",
    "ProducerSuccess",
    "ReachedEndOfTopic",
    "RedeliverUnacknowledgedMessages",
    "Schema",
    "SchemaType",
    "Seek",
    "Send",
    "SendError",
    "SendReceipt",
    "Subscribe",
    "Success",
    "TopicsMode",
    "Unsubscribe",
]
