"""A consumer that takes entries whole (`subscribe_entries`) hands on every entry it is sent:
one it cannot decompress comes as sent and flagged, never dropped, so that whoever reads it
knows a full client must read it."""

from __future__ import annotations

import zlib
from typing import Any, cast

from mop.message import MessageId
from mop.protocols.pulsar.commands import Message
from mop.protocols.pulsar.driver import ConsumerConfig, ReceivedEntry
from mop.protocols.pulsar.driver.client import PulsarClient
from mop.protocols.pulsar.driver.consumer import ClientConsumer
from mop.protocols.pulsar.frames import DEFAULT_MAX_MESSAGE_SIZE
from mop.protocols.pulsar.metadata import (
    CompressionType,
    MessageIdData,
    MessageMetadata,
    Payload,
)


def _consumer(got: list[ReceivedEntry]) -> ClientConsumer:
    def no_messages(*_: Any) -> None:
        raise AssertionError("entries only")

    return ClientConsumer(
        cast(PulsarClient, None),  # nothing here talks to a broker
        "persistent://public/default/t",
        "s",
        ConsumerConfig(),
        no_messages,
        entry_sink=lambda _, entry: got.append(entry),
    )


def _frame(entry: int, meta: MessageMetadata, data: bytes) -> Message:
    return Message(
        consumer_id=0,
        message_id=MessageIdData(ledger_id=3, entry_id=entry),
        payload=Payload(meta, data, b"", 0),
    )


def test_an_entry_that_does_not_decompress_is_handed_on_flagged() -> None:
    got: list[ReceivedEntry] = []
    consumer = _consumer(got)
    plain = b"x" * 100
    readable = MessageMetadata(
        producer_name="p",
        sequence_id=0,
        publish_time=1,
        compression=CompressionType.ZLIB,
        uncompressed_size=len(plain),
    )
    consumer.on_message(_frame(1, readable, zlib.compress(plain)))
    # Larger than any message the broker takes once decompressed.
    big = b"y" * (DEFAULT_MAX_MESSAGE_SIZE + 1)
    too_big = MessageMetadata(
        producer_name="p",
        sequence_id=1,
        publish_time=1,
        compression=CompressionType.ZLIB,
        uncompressed_size=len(big),
    )
    consumer.on_message(_frame(2, too_big, zlib.compress(big)))
    assert [entry.message_id for entry in got] == [MessageId(3, 1), MessageId(3, 2)]
    assert got[0].data == plain and got[0].undecodable is None
    assert got[1].undecodable is not None and "above" in got[1].undecodable
