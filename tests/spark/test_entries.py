"""Rows of whole entries: a batch decoded straight into columns gives the rows pulsar-client's
reader gives, within the range, without messages acknowledged already; what it cannot read is
refused for pulsar-client to read."""

from __future__ import annotations

import pytest

from mop.message import MessageId
from mop.protocols.pulsar.driver import ReceivedEntry
from mop.protocols.pulsar.frames import ack_set_of, encode_batch
from mop.protocols.pulsar.metadata import (
    BatchEntry,
    EncryptionKeys,
    KeyValue,
    MessageMetadata,
    SingleMessageMetadata,
)
from mop.spark.entries import Unreadable, add_entry
from mop.spark.positions import EARLIEST, WHOLE_ENTRY, order_key
from mop.spark.rows import RowBatch
from mop.spark.topics import topic_names

pytestmark = pytest.mark.spark

START = order_key(EARLIEST)
END = (1 << 40, 0, WHOLE_ENTRY)


def _rows() -> RowBatch:
    return RowBatch(topic_names("persistent://public/default/t"))


def _batch(entry: int, count: int, ack_set: tuple[int, ...] = ()) -> ReceivedEntry:
    members = [
        BatchEntry(
            SingleMessageMetadata(
                payload_size=2,
                properties=(KeyValue(key="i", value=str(i)),) if i % 2 else (),
                partition_key=f"k{i}" if i == 1 else None,
                event_time=7 if i == 2 else None,
                sequence_id=i,
            ),
            b"m%d" % i,
        )
        for i in range(count)
    ]
    meta = MessageMetadata(
        producer_name="p", sequence_id=0, publish_time=1000, num_messages_in_batch=count
    )
    return ReceivedEntry(MessageId(3, entry), meta, encode_batch(members), ack_set)


def _columns(rows: RowBatch) -> dict[str, list[object]]:
    return rows.take().to_pydict()


def test_a_batch_becomes_one_row_per_message() -> None:
    rows = _rows()
    assert add_entry(rows, _batch(5, 3), START, END) == (3, 5, 2)
    columns = _columns(rows)
    assert columns["payload"] == [b"m0", b"m1", b"m2"]
    assert columns["key"] == [None, "k1", None]
    assert columns["properties"] == [[], [("i", "1")], []]
    assert columns["message_id"] == ["3:5:0", "3:5:1", "3:5:2"]
    assert [t.timestamp() if t else None for t in columns["event_time"]] == [None, None, 0.007]
    assert {t.timestamp() for t in columns["publish_time"]} == {1.0}


def test_only_the_messages_of_the_range_are_added() -> None:
    rows = _rows()
    # The range starts after 3:5:0 and ends with 3:5:1.
    assert add_entry(rows, _batch(5, 3), (3, 5, 0), (3, 5, 1)) == (3, 5, 1)
    assert _columns(rows)["message_id"] == ["3:5:1"]
    assert add_entry(rows, _batch(6, 3), START, (3, 5, WHOLE_ENTRY)) is None
    assert add_entry(rows, _batch(4, 3), (3, 4, WHOLE_ENTRY), END) is None
    assert len(rows) == 0


def test_acknowledged_messages_of_a_batch_are_left_out() -> None:
    rows = _rows()
    owed = ack_set_of([0, 2])  # message 1 was acknowledged
    assert add_entry(rows, _batch(5, 3, owed), START, END) == (3, 5, 2)
    assert _columns(rows)["message_id"] == ["3:5:0", "3:5:2"]


def test_a_single_message_entry() -> None:
    meta = MessageMetadata(
        producer_name="p",
        sequence_id=0,
        publish_time=2000,
        partition_key="k",
        properties=(KeyValue(key="a", value="b"),),
        event_time=3,
    )
    rows = _rows()
    entry = ReceivedEntry(MessageId(3, 9), meta, b"data", ())
    assert add_entry(rows, entry, START, END) == (3, 9, WHOLE_ENTRY)
    columns = _columns(rows)
    assert (columns["payload"], columns["key"], columns["message_id"]) == (
        [b"data"],
        ["k"],
        ["3:9"],
    )
    assert columns["properties"] == [[("a", "b")]]


def test_what_only_a_full_client_can_read_is_refused() -> None:
    chunk = MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, chunk_id=0)
    with pytest.raises(Unreadable):
        add_entry(_rows(), ReceivedEntry(MessageId(3, 1), chunk, b"x", ()), START, END)
    garbled = _batch(5, 3)
    garbled.data = garbled.data[:-1]
    with pytest.raises(Unreadable):
        add_entry(_rows(), garbled, START, END)


def test_an_encrypted_entry_is_left_to_a_full_client() -> None:
    meta = MessageMetadata(
        producer_name="p",
        sequence_id=0,
        publish_time=1,
        encryption_keys=(EncryptionKeys(key="k", value=b"v"),),
    )
    with pytest.raises(Unreadable):
        add_entry(_rows(), ReceivedEntry(MessageId(3, 1), meta, b"sealed", ()), START, END)


def test_an_entry_the_driver_could_not_decompress_is_left_to_a_full_client() -> None:
    entry = _batch(5, 3)
    entry.undecodable = "ZLIB payload of 6000000 bytes, above 5242880"
    with pytest.raises(Unreadable, match="above"):
        add_entry(_rows(), entry, START, END)
