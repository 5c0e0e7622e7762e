"""The fast batch path (`mop.protocols.pulsar.batching`) against the table-driven codec, the
reference: the same bytes out, the same values back, whatever the cache holds."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from mop.protocols.pulsar import batching
from mop.protocols.pulsar.batching import read_columns, read_members, send_frame, single_header
from mop.protocols.pulsar.codec import message_bytes
from mop.protocols.pulsar.commands import Send
from mop.protocols.pulsar.frames import FrameDecoder, decode_batch, encode_batch
from mop.protocols.pulsar.metadata import BatchEntry, KeyValue, SingleMessageMetadata

TEXT = st.text(max_size=6)
PROPERTIES = st.lists(st.tuples(TEXT, TEXT), max_size=4).map(tuple)
MEMBER = st.tuples(PROPERTIES, st.none() | TEXT, st.binary(max_size=30), st.integers(0, 2**45))
# properties, partition key, payload, event time
Fields = tuple[tuple[tuple[str, str], ...], str | None, bytes, int]


def reference_entry(
    properties: tuple[tuple[str, str], ...], key: str | None, payload: bytes, event_time: int
) -> BatchEntry:
    metadata = SingleMessageMetadata(
        properties=tuple(KeyValue(key=k, value=v) for k, v in properties),
        partition_key=key,
        payload_size=len(payload),
        event_time=event_time or None,
    )
    return BatchEntry(metadata, payload)


@given(st.lists(MEMBER, min_size=1, max_size=5))
def test_headers_are_the_codecs_bytes(members: list[Fields]) -> None:
    ours = b"".join(single_header(p, k, len(d), t) + d for p, k, d, t in members)
    assert ours == encode_batch(reference_entry(*m) for m in members)


@given(st.lists(MEMBER, min_size=1, max_size=5), st.booleans())
def test_members_read_back_as_the_codec_reads_them(members: list[Fields], warm: bool) -> None:
    if not warm:
        batching._decoded.clear()
        batching._headers.clear()
    data = encode_batch(reference_entry(*m) for m in members)
    for _ in range(2):  # the second time from the cache
        got = read_members(data, len(members))
        reference = decode_batch(data, len(members))
        assert [m.payload for m in got] == [e.payload for e in reference]
        assert [m.properties for m in got] == [
            tuple((kv.key, kv.value) for kv in e.metadata.properties) for e in reference
        ]
        assert [m.partition_key for m in got] == [e.metadata.partition_key for e in reference]
        assert [m.event_time for m in got] == [e.metadata.event_time or 0 for e in reference]
        assert [m.header for m in got] == [message_bytes(e.metadata) for e in reference]


def test_a_send_frame_decodes_as_a_batch() -> None:
    parts = []
    for i in range(3):
        payload = f"m{i}".encode()
        parts += [single_header((("a", str(i)),), None, len(payload), 0), payload]
    decoder = FrameDecoder()
    decoder.feed(send_frame(7, 40, "proxy-1", 1234, parts, 3))
    frame = decoder.next_frame()
    assert isinstance(frame, Send) and frame.payload is not None
    assert (frame.producer_id, frame.sequence_id, frame.num_messages) == (7, 40, 3)
    assert frame.highest_sequence_id == 42
    meta = frame.payload.metadata
    assert (meta.producer_name, meta.sequence_id, meta.publish_time) == ("proxy-1", 40, 1234)
    assert meta.num_messages_in_batch == 3
    members = read_members(frame.payload.data, 3)
    assert [m.properties for m in members] == [(("a", "0"),), (("a", "1"),), (("a", "2"),)]


def test_only_short_properties_are_cached() -> None:
    """Each cache holds up to 4096 entries: of properties as large as a message's (up to 5 MB),
    that would be gigabytes. Long ones are encoded and decoded each time instead."""
    batching._encoded.clear()
    batching._decoded.clear()
    batching._headers.clear()
    short = (("k", "v"),)
    long = (("k", "v" * 1000),)
    data = b"".join(single_header(p, None, 1, 0) + b"x" for p in (short, long))
    assert [m.properties for m in read_members(data, 2)] == [short, long]
    assert list(batching._encoded) == [short]
    assert [len(run) for run in batching._decoded] == [len(batching._encoded[short])]
    assert all(len(header) <= 256 for header in batching._headers)


# What clients write after the fields above: a sequence id (field 8, one per message) and
# sometimes a null value (field 9) after it.
SEQUENCED = st.tuples(MEMBER, st.none() | st.integers(0, 2**40), st.booleans())


@given(st.lists(SEQUENCED, min_size=1, max_size=6), st.booleans())
def test_members_that_differ_by_their_sequence_id_read_as_the_codec_reads_them(
    members: list[tuple[Fields, int | None, bool]], warm: bool
) -> None:
    if not warm:
        batching._headers.clear()
    entries = []
    for (properties, key, payload, event_time), sequence_id, null_value in members:
        entry = reference_entry(properties, key, payload, event_time)
        metadata = dataclasses.replace(
            entry.metadata, sequence_id=sequence_id, null_value=null_value
        )
        entries.append(BatchEntry(metadata, payload))
    data = encode_batch(entries)
    reference = decode_batch(data, len(entries))
    for _ in range(2):  # the second time from the cache
        got = read_members(data, len(entries))
        columns = read_columns(data, len(entries))
        payloads = [b"" if e.metadata.null_value else e.payload for e in reference]
        assert [m.payload for m in got] == columns.payloads == payloads
        properties = [tuple((kv.key, kv.value) for kv in e.metadata.properties) for e in reference]
        assert [m.properties for m in got] == columns.properties == properties
        keys = [e.metadata.partition_key for e in reference]
        assert [m.partition_key for m in got] == columns.keys == keys
        assert [m.event_time for m in got] == columns.event_times
        assert [m.null_value for m in got] == [e.metadata.null_value for e in reference]
        assert [m.header for m in got] == [message_bytes(e.metadata) for e in reference]
