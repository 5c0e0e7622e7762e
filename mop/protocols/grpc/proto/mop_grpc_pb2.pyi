from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MessageId(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "batch_index", "partition")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    batch_index: int
    partition: int
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., batch_index: _Optional[int] = ..., partition: _Optional[int] = ...) -> None: ...

class Property(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class Send(_message.Message):
    __slots__ = ("payload", "key", "properties", "event_time", "deliver_at_time", "sequence_id")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_TIME_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    key: str
    properties: _containers.RepeatedCompositeFieldContainer[Property]
    event_time: int
    deliver_at_time: int
    sequence_id: int
    def __init__(self, payload: _Optional[bytes] = ..., key: _Optional[str] = ..., properties: _Optional[_Iterable[_Union[Property, _Mapping]]] = ..., event_time: _Optional[int] = ..., deliver_at_time: _Optional[int] = ..., sequence_id: _Optional[int] = ...) -> None: ...

class SendResult(_message.Message):
    __slots__ = ("sequence_id", "message_id", "error")
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    sequence_id: int
    message_id: MessageId
    error: Error
    def __init__(self, sequence_id: _Optional[int] = ..., message_id: _Optional[_Union[MessageId, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("message_id", "payload", "key", "properties", "publish_time", "event_time", "producer_name", "redelivery_count", "topic")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TIME_FIELD_NUMBER: _ClassVar[int]
    EVENT_TIME_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_NAME_FIELD_NUMBER: _ClassVar[int]
    REDELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    message_id: MessageId
    payload: bytes
    key: str
    properties: _containers.RepeatedCompositeFieldContainer[Property]
    publish_time: int
    event_time: int
    producer_name: str
    redelivery_count: int
    topic: str
    def __init__(self, message_id: _Optional[_Union[MessageId, _Mapping]] = ..., payload: _Optional[bytes] = ..., key: _Optional[str] = ..., properties: _Optional[_Iterable[_Union[Property, _Mapping]]] = ..., publish_time: _Optional[int] = ..., event_time: _Optional[int] = ..., producer_name: _Optional[str] = ..., redelivery_count: _Optional[int] = ..., topic: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("type", "message_ids", "negative_message_ids", "redelivery_delay_ms")
    class AckType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        INDIVIDUAL: _ClassVar[Ack.AckType]
        CUMULATIVE: _ClassVar[Ack.AckType]
    INDIVIDUAL: Ack.AckType
    CUMULATIVE: Ack.AckType
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    REDELIVERY_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    type: Ack.AckType
    message_ids: _containers.RepeatedCompositeFieldContainer[MessageId]
    negative_message_ids: _containers.RepeatedCompositeFieldContainer[MessageId]
    redelivery_delay_ms: int
    def __init__(self, type: _Optional[_Union[Ack.AckType, str]] = ..., message_ids: _Optional[_Iterable[_Union[MessageId, _Mapping]]] = ..., negative_message_ids: _Optional[_Iterable[_Union[MessageId, _Mapping]]] = ..., redelivery_delay_ms: _Optional[int] = ...) -> None: ...
