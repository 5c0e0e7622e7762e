"""MQTT codec properties: round trips at every level, framing under any chunking, and fuzzing."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mop.protocols.mqtt.codec import NEED_DATA, PROTOCOL_NAMES, NeedData, PacketDecoder, encode
from mop.protocols.mqtt.errors import RemoteProtocolError
from mop.protocols.mqtt.packets import (
    NO_PROPERTIES,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
)
from mop.protocols.mqtt.properties import (
    BINARY,
    PROPERTY_SPECS,
    STRING_PAIR,
    UTF8,
    WILL,
    PropertyId,
    PropertySpec,
)
from mop.protocols.mqtt.reason_codes import REASON_CODES_BY_PACKET, V3_SUBACK_CODES

# --- strategies ----------------------------------------------------------------------------------

texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
# Topic filters are never empty [MQTT-4.7.3-1]; topic names (Response Topic) have no wildcards.
filters = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12)
names = st.text(st.characters(codec="utf-8", exclude_characters="\x00+#"), max_size=12)
blobs = st.binary(max_size=40)
packet_ids = st.integers(1, 0xFFFF)
levels = st.sampled_from([3, 4, 5])


def _value(spec: PropertySpec) -> st.SearchStrategy[Any]:
    if spec.id == PropertyId.RESPONSE_TOPIC:
        return names
    if spec.kind is UTF8:
        return texts
    if spec.kind is BINARY:
        return blobs
    if spec.kind is STRING_PAIR:
        return st.tuples(texts, texts)
    assert spec.maximum is not None
    return st.integers(spec.minimum, spec.maximum)


def properties(context: int) -> st.SearchStrategy[Properties]:
    """Any MQTT 5 properties valid in `context`, built from the property table."""
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for spec in PROPERTY_SPECS.values():
        if context not in spec.contexts:
            continue
        if not spec.repeated:
            optional[spec.field] = _value(spec)
        else:
            most = 3 if context in spec.repeatable_in else 1
            optional[spec.field] = st.lists(_value(spec), min_size=1, max_size=most).map(tuple)
    return st.fixed_dictionaries({}, optional=optional).map(lambda kw: Properties(**kw))


def props_for(level: int, context: int) -> st.SearchStrategy[Properties]:
    return properties(context) if level == 5 else st.just(NO_PROPERTIES)


def reasons(level: int, packet_type: PacketType) -> st.SearchStrategy[int]:
    if level < 5:
        return st.just(0)
    return st.sampled_from(sorted(REASON_CODES_BY_PACKET[packet_type]))


@st.composite
def connects(draw: st.DrawFn, level: int) -> Connect:
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(texts),
            draw(blobs),
            draw(st.integers(0, 2)),
            draw(st.booleans()),
            draw(props_for(level, WILL)),
        )
    username = draw(st.none() | texts)
    password = draw(st.none() | blobs) if username is not None or level == 5 else None
    return Connect(
        draw(texts),
        PROTOCOL_NAMES[level],
        level,
        draw(st.booleans()),
        draw(st.integers(0, 0xFFFF)),
        username,
        password,
        will,
        draw(st.booleans()),
        draw(props_for(level, PacketType.CONNECT)),
    )


@st.composite
def publishes(draw: st.DrawFn, level: int) -> Publish:
    qos = draw(st.integers(0, 2))
    return Publish(
        draw(texts),
        draw(blobs),
        qos,
        draw(st.booleans()),
        qos > 0 and draw(st.booleans()),
        draw(packet_ids) if qos else None,
        draw(props_for(level, PacketType.PUBLISH)),
    )


def subscription_requests(level: int) -> st.SearchStrategy[SubscriptionRequest]:
    if level < 5:
        return st.builds(SubscriptionRequest, filters, st.integers(0, 2))
    return st.builds(
        SubscriptionRequest,
        filters,
        st.integers(0, 2),
        st.booleans(),
        st.booleans(),
        st.integers(0, 2),
    )


def packets(level: int) -> st.SearchStrategy[Packet]:
    """Every packet type, with only what `level` can express."""
    t = PacketType
    acks: list[st.SearchStrategy[Packet]] = [
        st.builds(cls, packet_ids, reasons(level, ptype), props_for(level, ptype))
        for cls, ptype in (
            (Puback, t.PUBACK),
            (Pubrec, t.PUBREC),
            (Pubrel, t.PUBREL),
            (Pubcomp, t.PUBCOMP),
        )
    ]
    suback_codes = (
        st.sampled_from(sorted(V3_SUBACK_CODES)) if level < 5 else reasons(level, t.SUBACK)
    )
    choices: list[st.SearchStrategy[Packet]] = [
        connects(level),
        st.builds(
            Connack,
            st.booleans() if level >= 4 else st.just(False),  # 3.1 has no session present
            reasons(level, t.CONNACK) if level == 5 else st.integers(0, 5),
            props_for(level, t.CONNACK),
        ),
        publishes(level),
        *acks,
        st.builds(
            Subscribe,
            packet_ids,
            st.lists(subscription_requests(level), min_size=1, max_size=4).map(tuple),
            props_for(level, t.SUBSCRIBE),
        ),
        st.builds(
            Suback,
            packet_ids,
            st.lists(suback_codes, min_size=1, max_size=4).map(tuple),
            props_for(level, t.SUBACK),
        ),
        st.builds(
            Unsubscribe,
            packet_ids,
            st.lists(filters, min_size=1, max_size=4).map(tuple),
            props_for(level, t.UNSUBSCRIBE),
        ),
        st.builds(Pingreq),
        st.builds(Pingresp),
        st.builds(Disconnect, reasons(level, t.DISCONNECT), props_for(level, t.DISCONNECT)),
    ]
    if level == 5:
        choices.append(
            st.builds(
                Unsuback,
                packet_ids,
                st.lists(reasons(level, t.UNSUBACK), min_size=1, max_size=4).map(tuple),
                properties(t.UNSUBACK),
            )
        )
        choices.append(st.builds(Auth, reasons(level, t.AUTH), properties(t.AUTH)))
    else:
        choices.append(st.builds(Unsuback, packet_ids))
    return st.one_of(choices)


PACKETS = {level: packets(level) for level in (3, 4, 5)}
levelled_packets = st.one_of(
    [st.tuples(st.just(level), strategy) for level, strategy in PACKETS.items()]
)
levelled_streams = st.one_of(
    [
        st.tuples(st.just(level), st.lists(strategy, max_size=12))
        for level, strategy in PACKETS.items()
    ]
)


# --- helpers -------------------------------------------------------------------------------------


def drain(decoder: PacketDecoder) -> list[Packet]:
    out = []
    while not isinstance(packet := decoder.next_packet(), NeedData):
        out.append(packet)
    return out


def drain_or_reject(decoder: PacketDecoder) -> None:
    """Decode until NEED_DATA or a RemoteProtocolError; anything else fails the test."""
    try:
        drain(decoder)
    except RemoteProtocolError as exc:
        # The decoder's last-resort conversion of an unexpected exception must never fire.
        assert not exc.message.startswith("undecodable"), exc.message


# --- properties ----------------------------------------------------------------------------------


@given(levelled_packets)
@settings(max_examples=400)
def test_round_trip(case: tuple[int, Packet]) -> None:
    level, packet = case
    data = encode(packet, level)
    decoder = PacketDecoder(protocol_level=level)
    decoder.feed(data)
    assert decoder.next_packet() == packet
    assert decoder.next_packet() is NEED_DATA
    assert decoder.buffered == 0


@given(levelled_packets)
def test_every_strict_prefix_needs_data(case: tuple[int, Packet]) -> None:
    level, packet = case
    data = encode(packet, level)
    for end in range(len(data)):
        decoder = PacketDecoder(protocol_level=level)
        decoder.feed(data[:end])
        assert decoder.next_packet() is NEED_DATA


@given(levelled_packets)
def test_byte_at_a_time(case: tuple[int, Packet]) -> None:
    level, packet = case
    data = encode(packet, level)
    decoder = PacketDecoder(protocol_level=level)
    for i in range(len(data) - 1):
        decoder.feed(data[i : i + 1])
        assert decoder.next_packet() is NEED_DATA
    decoder.feed(data[-1:])
    assert decoder.next_packet() == packet


@given(levelled_streams, st.data())
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_stream_in_random_chunks(case: tuple[int, list[Packet]], data: st.DataObject) -> None:
    level, sent = case
    stream = b"".join(encode(packet, level) for packet in sent)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    decoder = PacketDecoder(protocol_level=level)
    received: list[Packet] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        decoder.feed(stream[start:cut])
        start = cut
        received.extend(drain(decoder))
    assert received == sent
    assert decoder.buffered == 0


@given(st.binary(max_size=300), st.sampled_from([3, 4, 5]))
@settings(max_examples=1000)
def test_random_first_packet(junk: bytes, level: int) -> None:
    decoder = PacketDecoder(protocol_level=level)
    decoder.feed(junk)
    drain_or_reject(decoder)


@given(st.one_of([connects(level) for level in (3, 4, 5)]), st.binary(max_size=300))
@settings(max_examples=500)
def test_random_bytes_after_connect(connect: Connect, junk: bytes) -> None:
    decoder = PacketDecoder()
    decoder.feed(encode(connect, connect.protocol_level) + junk)
    assert decoder.next_packet() == connect
    decoder.protocol_level = connect.protocol_level
    drain_or_reject(decoder)


@given(
    st.sampled_from([0x10, 0x20, 0x30, 0x32, 0x40, 0x62, 0x82, 0x90, 0xA2, 0xB0, 0xE0, 0xF0]),
    st.binary(max_size=200),
    st.sampled_from([3, 4, 5]),
)
@settings(max_examples=1000)
def test_random_bodies_behind_valid_headers(first: int, body: bytes, level: int) -> None:
    # Random first bytes rarely pass the fixed header check; this reaches every body decoder.
    decoder = PacketDecoder(protocol_level=level)
    decoder.feed(bytes((first,)) + encode_length(len(body)) + body)
    drain_or_reject(decoder)


@given(levelled_packets, st.data())
@settings(max_examples=500)
def test_mutated_packets(case: tuple[int, Packet], data: st.DataObject) -> None:
    level, packet = case
    encoded = bytearray(encode(packet, level))
    for _ in range(data.draw(st.integers(1, 3))):
        index = data.draw(st.integers(0, len(encoded) - 1))
        encoded[index] = data.draw(st.integers(0, 255))
    decoder = PacketDecoder(protocol_level=level)
    decoder.feed(bytes(encoded))
    drain_or_reject(decoder)


def encode_length(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)
