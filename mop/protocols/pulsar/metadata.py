"""Message-level protobuf types of the Pulsar schema: ids, key/values and message metadata.

Field numbers follow PulsarApi.proto (reference §7 and §9). Only the fields a broker reads are
declared; the rest are skipped when decoding, so forward `Payload.raw`, never a re-encoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from mop.protocols.pulsar.codec import (
    BOOL,
    BYTES,
    INT32,
    INT64,
    STRING,
    UINT32,
    UINT64,
    message,
    pb,
)

# MessageIdData.ledger_id / entry_id of the special start positions (reference §9).
EARLIEST_ID: Final = (1 << 64) - 1  # MessageId.earliest: ledger = entry = 2^64 - 1 (-1 as int64)
LATEST_ID: Final = (1 << 63) - 1  # MessageId.latest: ledger = entry = 2^63 - 1


class CompressionType(IntEnum):
    NONE = 0
    LZ4 = 1
    ZLIB = 2
    ZSTD = 3
    SNAPPY = 4


@message
class KeyValue:
    key: str = pb(1, STRING)
    value: str = pb(2, STRING)


@message
class KeyLongValue:
    key: str = pb(1, STRING)
    value: int = pb(2, UINT64)


@message
class EncryptionKeys:
    """A data key of an end-to-end encrypted message, encrypted with the consumer's key
    `key` names (read to know a message is encrypted; passed on as sent)."""

    key: str = pb(1, STRING)
    value: bytes = pb(2, BYTES)
    metadata: tuple[KeyValue, ...] = pb(3, KeyValue, repeated=True, default=())


@message
class MessageIdData:
    """A message position: (ledger, entry) names the stored entry, batch_index a message in it."""

    ledger_id: int = pb(1, UINT64)
    entry_id: int = pb(2, UINT64)
    partition: int = pb(3, INT32, default=-1)
    batch_index: int = pb(4, INT32, default=-1)
    # Batch-index acks: bit i set means message i of the batch is still unacknowledged.
    ack_set: tuple[int, ...] = pb(5, INT64, repeated=True, default=())
    batch_size: int | None = pb(6, INT32, default=None)


@message
class MessageMetadata:
    """The metadata block of a SEND / MESSAGE frame, as far as a broker needs to read it."""

    producer_name: str = pb(1, STRING)
    sequence_id: int = pb(2, UINT64)
    publish_time: int = pb(3, UINT64)  # milliseconds since the epoch
    properties: tuple[KeyValue, ...] = pb(4, KeyValue, repeated=True, default=())
    partition_key: str | None = pb(6, STRING, default=None)
    compression: CompressionType = pb(8, CompressionType, default=CompressionType.NONE)
    uncompressed_size: int | None = pb(9, UINT32, default=None)
    # Present (even as 1) means the payload is a batch of SingleMessageMetadata entries.
    num_messages_in_batch: int | None = pb(11, INT32, default=None)
    event_time: int | None = pb(12, UINT64, default=None)
    # End-to-end encryption: the payload (compressed first, then encrypted) is for consumers
    # that hold a key; a broker neither decompresses, splits nor re-encodes it.
    encryption_keys: tuple[EncryptionKeys, ...] = pb(13, EncryptionKeys, repeated=True, default=())
    encryption_algo: str | None = pb(14, STRING, default=None)
    encryption_param: bytes | None = pb(15, BYTES, default=None)
    schema_version: bytes | None = pb(16, BYTES, default=None)
    ordering_key: bytes | None = pb(18, BYTES, default=None)
    deliver_at_time: int | None = pb(19, INT64, default=None)
    marker_type: int | None = pb(20, INT32, default=None)
    highest_sequence_id: int | None = pb(24, UINT64, default=None)
    null_value: bool = pb(25, BOOL, default=False)
    uuid: str | None = pb(26, STRING, default=None)
    num_chunks_from_msg: int | None = pb(27, INT32, default=None)
    total_chunk_msg_size: int | None = pb(28, INT32, default=None)
    chunk_id: int | None = pb(29, INT32, default=None)

    @property
    def batched(self) -> bool:
        return self.num_messages_in_batch is not None

    @property
    def encrypted(self) -> bool:
        return bool(self.encryption_keys)

    @property
    def message_count(self) -> int:
        """Flow-control permits this entry uses: the batch size, or 1."""
        count = self.num_messages_in_batch
        return 1 if count is None else count


@message
class SingleMessageMetadata:
    """The header of one message inside a batch payload."""

    properties: tuple[KeyValue, ...] = pb(1, KeyValue, repeated=True, default=())
    partition_key: str | None = pb(2, STRING, default=None)
    payload_size: int = pb(3, INT32)
    compacted_out: bool = pb(4, BOOL, default=False)
    event_time: int | None = pb(5, UINT64, default=None)
    partition_key_b64_encoded: bool = pb(6, BOOL, default=False)
    ordering_key: bytes | None = pb(7, BYTES, default=None)
    sequence_id: int | None = pb(8, UINT64, default=None)
    null_value: bool = pb(9, BOOL, default=False)
    null_partition_key: bool = pb(10, BOOL, default=False)


@dataclass(frozen=True, slots=True)
class Payload:
    """What follows the command in a SEND or MESSAGE frame.

    `raw` is `metaSize | metadata | payload` exactly as received: what the checksum covers, what
    the broker stores, and what it forwards in MESSAGE frames. `data` is the (possibly compressed,
    possibly batched) message payload and `checksum` the CRC32C of `raw`.
    """

    metadata: MessageMetadata
    data: bytes
    raw: bytes
    checksum: int


@dataclass(frozen=True, slots=True)
class BatchEntry:
    """One message of a batch payload."""

    metadata: SingleMessageMetadata
    payload: bytes


__all__ = [
    "EARLIEST_ID",
    "LATEST_ID",
    "BatchEntry",
    "CompressionType",
    "EncryptionKeys",
    "KeyLongValue",
    "KeyValue",
    "MessageIdData",
    "MessageMetadata",
    "Payload",
    "SingleMessageMetadata",
]
