"""The bench's trio floor relay (bench/floor_server.py): its pure parts (framing, the CONNECT
and SUBSCRIBE readers, topic matching, the per-topic route cache) and one QoS 2 exchange over
loopback; the bench smoke run (tests/unit/test_bench_smoke.py) carries its flows."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trio

PATH = Path(__file__).resolve().parents[2] / "bench" / "floor_server.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("floor_server", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while they are built
    spec.loader.exec_module(module)
    return module


floor: Any = _load()


def test_frame_at_finds_a_packet_only_once_it_has_all_arrived() -> None:
    publish = floor.packet(0x30, b"\x00\x01t" + b"x" * 200)  # remaining length takes 2 bytes
    assert publish[1:3] == b"\xcb\x01"
    data = b"\xd0\x00" + publish
    assert floor.frame_at(data, 0) == (2, 2)
    assert floor.frame_at(data, 2) == (5, len(data))
    assert floor.frame_at(data[:-1], 2) is None
    assert floor.frame_at(data[:3], 2) is None  # the length itself is cut


def test_frame_at_refuses_a_remaining_length_of_five_bytes() -> None:
    with pytest.raises(floor.Malformed):
        floor.frame_at(b"\x30\xff\xff\xff\xff\x01", 0)


@pytest.mark.parametrize("value", [0, 127, 128, 16_383, 16_384, 268_435_455])
def test_varints_read_back_what_was_encoded(value: int) -> None:
    raw = floor.encode_varint(value)
    assert floor.read_varint(raw + b"rest", 0, len(raw) + 4) == (value, len(raw))


def _connect(level: int, client_id: bytes, properties: bytes = b"") -> bytes:
    body = b"\x00\x04MQTT" + bytes((level, 2, 0, 60)) + properties
    return floor.packet(0x10, body + len(client_id).to_bytes(2, "big") + client_id)


def test_parse_connect_reads_the_level_and_whether_the_client_id_is_empty() -> None:
    for data, expected in [
        (_connect(4, b"c1"), (4, False)),
        (_connect(5, b"", b"\x05\x11\x00\x00\x00\x0a"), (5, True)),  # session expiry property
    ]:
        body, end = floor.frame_at(data, 0)
        assert floor.parse_connect(data, body, end) == expected
    data = _connect(5, b"c1", b"\x09\x11")  # properties longer than the packet
    body, end = floor.frame_at(data, 0)
    with pytest.raises(floor.Malformed):
        floor.parse_connect(data, body, end)


def test_connack_of_5_0_says_what_it_leaves_out_and_assigns_a_client_id() -> None:
    assert floor.connack(4, None) == b"\x20\x02\x00\x00"
    data = floor.connack(5, b"floor-1")
    body, end = floor.frame_at(data, 0)
    assert data[body : body + 2] == b"\x00\x00"  # session not present, success
    properties = data[body + 3 : end]
    assert properties == floor.CONNACK_5_PROPERTIES + b"\x12\x00\x07floor-1"
    assert data[body + 2] == len(properties)


def test_parse_subscribe_reads_every_filter_and_its_options() -> None:
    entries = b"\x00\x03a/+\x01\x00\x01#\x06"
    v311 = floor.packet(0x82, b"\x00\x07" + entries)
    v5 = floor.packet(0x82, b"\x00\x07\x02\x0b\x01" + entries)  # a subscription identifier
    for data, version in [(v311, 4), (v5, 5)]:
        body, end = floor.frame_at(data, 0)
        assert floor.parse_subscribe(data, body, end, version) == [("a/+", 1), ("#", 6)]
    empty = floor.packet(0x82, b"\x00\x07")
    with pytest.raises(floor.Malformed):
        floor.parse_subscribe(empty, 2, len(empty), 4)


@pytest.mark.parametrize(
    ("topic_filter", "topic", "matches"),
    [
        ("a/b", "a/b", True),
        ("a/b", "a/c", False),
        ("a/+", "a/b", True),
        ("a/+", "a/b/c", False),
        ("a/+", "a", False),
        ("+/+", "/b", True),
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("#", "a/b", True),
        ("#", "$SYS/x", False),
        ("+/x", "$SYS/x", False),
        ("$SYS/#", "$SYS/x", True),
        ("a/b/c", "a/b", False),
    ],
)
def test_topic_matches(topic_filter: str, topic: str, matches: bool) -> None:
    assert floor.topic_matches(topic_filter, topic) is matches


@pytest.mark.parametrize(
    ("topic_filter", "valid"),
    [
        ("a/+/c", True),
        ("#", True),
        ("a/#", True),
        ("a/#/c", False),
        ("a/b#", False),
        ("a+/b", False),
        ("", False),
        ("$share/g/a", False),
    ],
)
def test_valid_filter(topic_filter: str, valid: bool) -> None:
    assert floor.valid_filter(topic_filter) is valid


def test_routes_take_the_highest_qos_honour_no_local_and_follow_subscription_changes() -> None:
    relay = floor.Relay()
    one, two = floor.Client(None), floor.Client(None)
    relay.subscribe(one, "s/+", 1)
    relay.subscribe(one, "s/#", 2 | 4)  # QoS 2, No Local
    relay.subscribe(two, "s/x", 0)
    routes = {client: (qos, own) for client, qos, own in relay.route(b"s/x")}
    assert routes == {one: (2, 1), two: (0, 0)}
    assert relay.route(b"s/x") is relay.route(b"s/x")  # cached
    assert relay.unsubscribe(two, "s/x") and not relay.unsubscribe(two, "s/x")
    assert [client for client, _, _ in relay.route(b"s/x")] == [one]
    relay.unsubscribe(one, "s/+")
    assert relay.route(b"s/x") == [(one, 2, -1)]  # only a No Local subscription is left
    assert relay.route(b"t") == []


async def _read_packet(stream: trio.SocketStream, buffer: bytearray) -> bytes:
    """The next whole packet from `stream`."""
    while (frame := floor.frame_at(bytes(buffer), 0)) is None:
        chunk = await stream.receive_some(4096)
        assert chunk, "the relay closed the connection"
        buffer += chunk
    packet = bytes(buffer[: frame[1]])
    del buffer[: frame[1]]
    return packet


def test_the_relay_forwards_qos_2_once_with_the_subscribers_packet_id_over_loopback() -> None:
    """A 3.1.1 subscriber (QoS 2, #) and a 5.0 publisher that subscribes with No Local: a QoS 2
    PUBLISH sent twice before its PUBREL reaches the subscriber once, with the subscriber's own
    packet id, and not the publisher; both handshakes complete."""

    async def scenario() -> None:
        async with trio.open_nursery() as nursery:
            handler = floor.partial(floor.serve_client, floor.Relay(), iter(range(1, 100)))
            [listener] = await nursery.start(
                floor.partial(trio.serve_tcp, handler, 0, host="127.0.0.1")
            )
            port = listener.socket.getsockname()[1]
            sub = await trio.open_tcp_stream("127.0.0.1", port)
            pub = await trio.open_tcp_stream("127.0.0.1", port)
            async with sub, pub:
                await _exchange(sub, pub)
            nursery.cancel_scope.cancel()

    trio.run(scenario)


async def _exchange(sub: trio.SocketStream, pub: trio.SocketStream) -> None:
    """The packets of the loopback test: each reply is read before the next packet goes."""
    sub_in, pub_in = bytearray(), bytearray()
    await sub.send_all(_connect(4, b"s") + floor.packet(0x82, b"\x00\x01\x00\x01#\x02"))
    assert await _read_packet(sub, sub_in) == b"\x20\x02\x00\x00"
    assert await _read_packet(sub, sub_in) == b"\x90\x03\x00\x01\x02"
    await pub.send_all(
        _connect(5, b"p", b"\x00") + floor.packet(0x82, b"\x00\x09\x00\x00\x03t/+\x06")
    )
    assert (await _read_packet(pub, pub_in))[:4] == b"\x20\x09\x00\x00"
    assert await _read_packet(pub, pub_in) == b"\x90\x04\x00\x09\x00\x02"

    publish = floor.packet(0x34, b"\x00\x03t/1\x00\x07\x00hello")  # QoS 2, id 7
    await pub.send_all(publish + floor.packet(0x3C, publish[2:]))  # and its resend
    assert await _read_packet(pub, pub_in) == b"\x50\x02\x00\x07"
    assert await _read_packet(pub, pub_in) == b"\x50\x02\x00\x07"
    await pub.send_all(b"\x62\x02\x00\x07")
    assert await _read_packet(pub, pub_in) == b"\x70\x02\x00\x07"

    delivered = await _read_packet(sub, sub_in)
    assert delivered == floor.packet(0x34, b"\x00\x03t/1\x00\x01hello")  # no properties
    await sub.send_all(b"\x50\x02\x00\x01")
    assert await _read_packet(sub, sub_in) == b"\x62\x02\x00\x01"
    await sub.send_all(b"\x70\x02\x00\x01\xc0\x00")  # PUBCOMP, PINGREQ
    assert await _read_packet(sub, sub_in) == floor.PINGRESP  # nothing else came first
    await pub.send_all(b"\xc0\x00")
    assert await _read_packet(pub, pub_in) == floor.PINGRESP  # nor to the publisher
