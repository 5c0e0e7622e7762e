"""The MQTT protocol at the edges: hostile and malformed input, the CONNECT rules, keep alive, and
what MQTT 5 clients and the server negotiate (topic aliases, packet sizes, Receive Maximum,
problem and response information).

Hostile clients speak through `RawClient` or plain sockets while a well-behaved paho client on
the same node keeps publishing and receiving; it must not notice anything.
"""

from __future__ import annotations

import dataclasses
import queue
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from paho.mqtt.packettypes import PacketTypes

from mop.protocols.mqtt.codec import encode
from mop.protocols.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
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
    Will,
)
from mop.protocols.mqtt.properties import encode_varint
from mop.testing.node import RunningNode, node_settings, running_node
from tests.e2e.clients import Client, props
from tests.e2e.raw import RawClient, closed_with

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

MAX_PACKET = 1024


# -- helpers --------------------------------------------------------------------------------------


def frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_varint(len(body)) + body


def mqtt_string(data: bytes) -> bytes:
    return len(data).to_bytes(2, "big") + data


def connect_bytes(
    name: bytes = b"MQTT",
    level: int = 4,
    client_id: bytes = b"raw",
    flags: int = 0x02,
    keep_alive: int = 60,
) -> bytes:
    """A CONNECT built by hand, for protocol names and levels the codec refuses to encode."""
    body = mqtt_string(name) + bytes((level, flags)) + keep_alive.to_bytes(2, "big")
    if level & 0x7F == 5:
        body += b"\x00"  # no properties
    return frame(0x10, body + mqtt_string(client_id))


def publish_bytes(
    topic: bytes, payload: bytes = b"x", *, level: int = 5, props: bytes = b""
) -> bytes:
    """A QoS 0 PUBLISH built by hand (raw topic bytes, raw property block)."""
    body = mqtt_string(topic)
    if level == 5:
        body += encode_varint(len(props)) + props
    return frame(0x30, body + payload)


def read_all(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Every byte the server sends until it closes the connection (which must happen in time)."""
    deadline = time.monotonic() + timeout
    data = b""
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"connection still open after {timeout}s (got {data!r})"
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


@pytest.fixture
def socks() -> Iterator[Callable[[int], socket.socket]]:
    opened: list[socket.socket] = []

    def open_socket(port: int) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        opened.append(sock)
        return sock

    yield open_socket
    for sock in opened:
        sock.close()


@pytest.fixture
def small_node() -> Iterator[RunningNode]:
    with running_node(node_settings(max_packet_size=MAX_PACKET)) as running:
        yield running


def expect_only_bystander(client: Client, wait: float = 0.2) -> None:
    """Nothing but the bystander's own traffic reached a client subscribed to everything."""
    deadline = time.monotonic() + wait
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            msg = client.messages.get(timeout=remaining)
        except queue.Empty:
            return
        assert msg.topic.startswith("bystander/"), msg


@contextmanager
def bystander(port: int, name: str = "bystander") -> Iterator[None]:
    """A paho publisher and subscriber that keep exchanging QoS 1 messages for the duration;
    afterwards every message must have arrived, in order, and one more must get through."""
    sub = Client(port, f"{name}-sub")
    assert sub.subscribe(f"{name}/#", 1) == [1]
    pub = Client(port, f"{name}-pub")
    stop = threading.Event()
    sent: list[bytes] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            count = 0
            while not stop.is_set():
                payload = str(count).encode()
                assert pub.publish(f"{name}/t", payload, 1) == 0
                sent.append(payload)
                count += 1
                stop.wait(0.01)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name=f"{name}-publisher", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while len(sent) < 2 and not errors and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield
    finally:
        stop.set()
        thread.join(15)
    assert not thread.is_alive(), "the bystander publisher hangs"
    assert not errors, errors
    assert len(sent) >= 2
    assert [m.payload for m in sub.expect(len(sent))] == sent
    assert pub.publish(f"{name}/t", b"after", 1) == 0
    [last] = sub.expect(1)
    assert last.payload == b"after"
    sub.expect_none(0.1)
    pub.disconnect()
    sub.disconnect()


# -- hostile and malformed clients ---------------------------------------------------------------

GARBAGE = [
    pytest.param(b"\x00\x00\x00\x00", id="reserved-type-0"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="http-request"),
    pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32), id="tls-hello"),
    pytest.param(b"\x10\xff\xff\xff\xff\xff", id="connect-5-byte-length"),
]


@pytest.mark.parametrize("garbage", GARBAGE)
def test_garbage_first_is_closed_without_connack(
    node: RunningNode, socks: Callable[[int], socket.socket], garbage: bytes
) -> None:
    with bystander(node.mqtt_port):
        sock = socks(node.mqtt_port)
        start = time.monotonic()
        sock.sendall(garbage)
        assert read_all(sock) == b""
        # Refused at once, not left to the 10 s CONNECT timeout.
        assert time.monotonic() - start < 2


def test_publish_before_connect_is_closed_without_connack(
    node: RunningNode, socks: Callable[[int], socket.socket]
) -> None:
    with bystander(node.mqtt_port):
        sock = socks(node.mqtt_port)
        sock.sendall(publish_bytes(b"a/b", level=4) + connect_bytes())
        assert read_all(sock) == b""


@pytest.mark.parametrize("level", [4, 5])
def test_oversize_remaining_length_is_refused(
    small_node: RunningNode, raws: Callable[..., RawClient], level: int
) -> None:
    with bystander(small_node.mqtt_port):
        raw = raws(small_node.mqtt_port, level)
        connack = raw.connect("big")
        if level == 5:
            assert connack.properties.maximum_packet_size == MAX_PACKET
        # Only the fixed header: the server must refuse before waiting for 100 kB of body.
        raw.send_bytes(b"\x30" + encode_varint(100_000))
        closed_with(raw, 0x95 if level == 5 else None)


def test_oversize_connect_is_refused(
    small_node: RunningNode, socks: Callable[[int], socket.socket]
) -> None:
    with bystander(small_node.mqtt_port):
        sock = socks(small_node.mqtt_port)
        sock.sendall(b"\x10" + encode_varint(50_000))
        assert read_all(sock) == b""


@pytest.mark.parametrize("level", [4, 5])
def test_second_connect_is_a_protocol_error(
    node: RunningNode, raws: Callable[..., RawClient], level: int
) -> None:
    with bystander(node.mqtt_port):
        raw = raws(node.mqtt_port, level)
        assert raw.connect("twice").reason_code == 0
        raw.send(Connect("twice", protocol_level=level))
        closed_with(raw, 0x82 if level == 5 else None)


@pytest.mark.parametrize("level", [4, 5])
def test_invalid_utf8_topic_is_malformed(
    node: RunningNode, raws: Callable[..., RawClient], level: int
) -> None:
    with bystander(node.mqtt_port):
        sub = Client(node.mqtt_port, "utf8-sub")
        sub.subscribe("#", 0)
        raw = raws(node.mqtt_port, level)
        raw.connect("utf8")
        raw.send_bytes(publish_bytes(b"bad/\xff\xfe", level=level))
        closed_with(raw, 0x81 if level == 5 else None)
        expect_only_bystander(sub)
        sub.disconnect()


@pytest.mark.parametrize("topic", ["a/+", "a/#", "+", "#", "a/b+"])
def test_wildcard_in_publish_topic_is_refused(
    node: RunningNode, raws: Callable[..., RawClient], topic: str
) -> None:
    with bystander(node.mqtt_port):
        sub = Client(node.mqtt_port, "wild-sub")
        sub.subscribe("#", 0)
        raw = raws(node.mqtt_port)
        raw.connect("wild")
        raw.send(Publish(topic, b"x"))
        closed_with(raw, 0x90)
        expect_only_bystander(sub)
        sub.disconnect()


def test_remaining_length_of_five_bytes_is_malformed(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    with bystander(node.mqtt_port):
        raw = raws(node.mqtt_port)
        raw.connect("varint")
        raw.send_bytes(b"\x30\xff\xff\xff\xff\x01")
        closed_with(raw, 0x81)


def test_qos_3_publish_is_malformed(node: RunningNode, raws: Callable[..., RawClient]) -> None:
    with bystander(node.mqtt_port):
        raw = raws(node.mqtt_port)
        raw.connect("qos3")
        raw.send_bytes(frame(0x36, mqtt_string(b"a") + b"\x00\x01\x00x"))
        closed_with(raw, 0x81)


@pytest.mark.parametrize("level", [4, 5])
def test_qos_0_publish_with_dup_is_malformed(
    node: RunningNode, raws: Callable[..., RawClient], level: int
) -> None:
    # [MQTT-3.3.1-2] in 3.1.1 and 5.0.
    with bystander(node.mqtt_port):
        raw = raws(node.mqtt_port, level)
        raw.connect("dup0")
        props = b"\x00" if level == 5 else b""
        raw.send_bytes(frame(0x38, mqtt_string(b"a") + props + b"x"))
        closed_with(raw, 0x81 if level == 5 else None)


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("first", [0x82, 0xA2], ids=["subscribe", "unsubscribe"])
def test_empty_topic_filter_closes_the_connection(
    node: RunningNode, raws: Callable[..., RawClient], level: int, first: int
) -> None:
    # [MQTT-4.7.3-1]: a protocol error, not a failure of one item.
    with bystander(node.mqtt_port):
        raw = raws(node.mqtt_port, level)
        raw.connect("empty-filter")
        body = b"\x00\x01" + (b"\x00" if level == 5 else b"")
        body += mqtt_string(b"ok") + (b"\x00" if first == 0x82 else b"")
        body += mqtt_string(b"") + (b"\x00" if first == 0x82 else b"")
        raw.send_bytes(frame(first, body))
        closed_with(raw, 0x82 if level == 5 else None)


@pytest.mark.parametrize("response_topic", [b"r/+", b"r/#"])
def test_wildcard_in_response_topic_is_malformed(
    node: RunningNode, raws: Callable[..., RawClient], response_topic: bytes
) -> None:
    # [MQTT-3.3.2-14]
    with bystander(node.mqtt_port):
        sub = Client(node.mqtt_port, "resp-sub")
        sub.subscribe("#", 0)
        raw = raws(node.mqtt_port)
        raw.connect("resp")
        raw.send_bytes(publish_bytes(b"req", props=b"\x08" + mqtt_string(response_topic)))
        closed_with(raw, 0x81)
        expect_only_bystander(sub)
        sub.disconnect()


def test_subscription_identifier_in_a_client_publish_is_malformed(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    # [MQTT-3.3.4-6]
    with bystander(node.mqtt_port):
        sub = Client(node.mqtt_port, "subid-sub")
        sub.subscribe("#", 0)
        raw = raws(node.mqtt_port)
        raw.connect("subid")
        raw.send_bytes(publish_bytes(b"t", props=b"\x0b\x01"))
        closed_with(raw, 0x81)
        expect_only_bystander(sub)
        sub.disconnect()


def test_many_hostile_connections_at_once() -> None:
    """Dozens of broken connections side by side cost the healthy clients nothing; whatever
    they send, they are closed (at the latest by the CONNECT timeout) and never get a CONNACK
    unless what they sent starts with a valid CONNECT."""
    rng = random.Random(11)
    with running_node(node_settings(connect_timeout=1)) as node, bystander(node.mqtt_port):
        sockets = [
            socket.create_connection(("127.0.0.1", node.mqtt_port), timeout=10) for _ in range(40)
        ]
        try:
            for index, sock in enumerate(sockets):
                if index % 2:
                    size = rng.randrange(1, 300)
                    sock.sendall(bytes(rng.randrange(256) for _ in range(size)))
                else:  # a valid CONNECT, then AUTH, which a 3.1.1 client cannot send
                    sock.sendall(connect_bytes(client_id=f"h{index}".encode()) + b"\xf0\x00")
            for index, sock in enumerate(sockets):
                data = read_all(sock)
                assert data == (b"" if index % 2 else b"\x20\x02\x00\x00"), (index, data)
        finally:
            for sock in sockets:
                sock.close()


# -- CONNECT --------------------------------------------------------------------------------------


def test_v5_empty_client_id_gets_an_assigned_identifier(node: RunningNode) -> None:
    first = Client(node.mqtt_port, "")
    second = Client(node.mqtt_port, "")
    assert first.connack is not None and second.connack is not None
    assert first.connack.reason_code == 0
    one = first.connack.properties.AssignedClientIdentifier
    two = second.connack.properties.AssignedClientIdentifier
    assert one and two and one != two
    # Both connections stay up side by side and work.
    first.subscribe("assigned", 1)
    second.publish("assigned", b"hi", 1)
    [msg] = first.expect(1)
    assert msg.payload == b"hi"
    named = Client(node.mqtt_port, "named")
    assert named.connack is not None
    assert not hasattr(named.connack.properties, "AssignedClientIdentifier")


def test_v311_empty_client_id_with_clean_session(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    raw = raws(node.mqtt_port, 4)
    connack = raw.connect("", clean_start=True)
    assert (connack.reason_code, connack.session_present) == (0, False)
    raw.send(Pingreq())
    assert raw.recv() == Pingresp()


def test_v311_empty_client_id_without_clean_session_is_rejected(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    raw = raws(node.mqtt_port, 4)
    assert raw.connect("", clean_start=False).reason_code == 2  # identifier rejected
    assert raw.recv_until_closed() == []


@pytest.mark.parametrize("clean", [True, False])
def test_v31_empty_client_id_is_rejected(
    node: RunningNode, raws: Callable[..., RawClient], clean: bool
) -> None:
    # MQTT 3.1 client ids are 1 to 23 characters.
    raw = raws(node.mqtt_port, 3)
    assert raw.connect("", clean_start=clean).reason_code == 2  # identifier rejected
    assert raw.recv_until_closed() == []


def test_v31_connack_has_no_session_present_flag(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    first = raws(node.mqtt_port, 3)
    assert first.connect("v31-session", clean_start=False).reason_code == 0
    first.send(Disconnect())
    assert first.recv_until_closed() == []
    # The session is there for the client, but the 3.1 CONNACK's first byte is reserved.
    again = raws(node.mqtt_port, 3)
    assert again.connect("v31-session", clean_start=False) == Connack(session_present=False)
    v311 = raws(node.mqtt_port, 4)
    assert v311.connect("v31-session", clean_start=False).session_present


@pytest.mark.parametrize(
    ("name", "level"),
    [
        (b"MQTT", 6),
        (b"MQTT", 2),
        (b"MQTT", 0),
        (b"MQIsdp", 4),  # 3.1's name with 3.1.1's level
        (b"MQTT", 3),  # 3.1.1's name with 3.1's level
    ],
)
def test_unsupported_protocol_gets_return_code_1(
    node: RunningNode, socks: Callable[[int], socket.socket], name: bytes, level: int
) -> None:
    sock = socks(node.mqtt_port)
    sock.sendall(connect_bytes(name, level))
    assert read_all(sock) == b"\x20\x02\x00\x01"


def test_3_1_protocol_name_at_level_5_gets_reason_0x84(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    raw = raws(node.mqtt_port, 5)
    raw.send_bytes(connect_bytes(b"MQIsdp", 5))
    packets = raw.recv_until_closed()
    assert len(packets) == 1 and isinstance(packets[0], Connack), packets
    assert packets[0].reason_code == 0x84


@pytest.mark.parametrize("name", [b"MQTX", b"mqtt", b"HTTP"])
@pytest.mark.parametrize("level", [3, 4, 5])
def test_a_wrong_protocol_name_is_closed_without_connack(
    node: RunningNode, socks: Callable[[int], socket.socket], name: bytes, level: int
) -> None:
    """[MQTT-3.1.2-1]: no MQTT at all; 5.0 lets the server disconnect as well."""
    sock = socks(node.mqtt_port)
    sock.sendall(connect_bytes(name, level))
    assert read_all(sock) == b""


@pytest.mark.parametrize("topic", ["", "will/+", "will/#"])
@pytest.mark.parametrize("level", [3, 4])
def test_a_will_without_a_topic_name_is_closed_without_connack(
    node: RunningNode, raws: Callable[..., RawClient], topic: str, level: int
) -> None:
    """[MQTT-3.1.4-1]: a CONNECT that does not conform gets no CONNACK in 3.1 and 3.1.1."""
    raw = raws(node.mqtt_port, level)
    raw.send(Connect(f"no-will-{level}", protocol_level=level, will=Will(topic, b"bye")))
    assert raw.recv_until_closed() == []


def test_a_v5_will_without_a_topic_name_gets_reason_0x90(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    raw = raws(node.mqtt_port, 5)
    raw.send(Connect("no-will-5", protocol_level=5, will=Will("", b"bye")))
    packets = raw.recv_until_closed()
    assert len(packets) == 1 and isinstance(packets[0], Connack), packets
    assert packets[0].reason_code == 0x90


def test_supported_versions_are_accepted(
    node: RunningNode, socks: Callable[[int], socket.socket]
) -> None:
    for name, level in ((b"MQIsdp", 3), (b"MQTT", 4)):
        sock = socks(node.mqtt_port)
        sock.sendall(connect_bytes(name, level, client_id=f"v{level}".encode()))
        sock.settimeout(5)
        assert sock.recv(4) == b"\x20\x02\x00\x00"


def test_connect_timeout(socks: Callable[[int], socket.socket]) -> None:
    with running_node(node_settings(connect_timeout=0.5)) as node:
        silent = socks(node.mqtt_port)
        partial = socks(node.mqtt_port)
        partial.sendall(connect_bytes()[:6])  # half a CONNECT, then nothing
        start = time.monotonic()
        assert read_all(silent) == b""
        assert read_all(partial) == b""
        elapsed = time.monotonic() - start
        assert 0.4 <= elapsed <= 2.5, elapsed
        # A prompt client is not affected.
        client = Client(node.mqtt_port, "prompt")
        time.sleep(0.8)
        client.subscribe("t", 0)
        client.disconnect()


def test_bridge_flag_is_accepted(node: RunningNode, raws: Callable[..., RawClient]) -> None:
    raw = raws(node.mqtt_port, 4)
    raw.send_bytes(connect_bytes(b"MQTT", 0x84, b"bridge"))  # 3.1.1 with the bridge bit
    assert raw.recv() == Connack(session_present=False, reason_code=0)
    raw.send(Subscribe(1, (SubscriptionRequest("bridged/#", 1),)))
    assert raw.recv() == Suback(1, (1,))
    Client(node.mqtt_port, "p").publish("bridged/x", b"over the bridge", 1)
    delivery = raw.recv()
    assert isinstance(delivery, Publish)
    assert (delivery.topic, delivery.payload) == ("bridged/x", b"over the bridge")


def test_bridge_flag_via_codec(node: RunningNode, raws: Callable[..., RawClient]) -> None:
    raw = raws(node.mqtt_port, 5)
    assert raw.connect("bridge5", bridge=True).reason_code == 0


@pytest.mark.parametrize("problem_information", [None, 0])
def test_authentication_method_is_refused(
    node: RunningNode, raws: Callable[..., RawClient], problem_information: int | None
) -> None:
    raw = raws(node.mqtt_port)
    connack = raw.connect(
        "auth",
        properties=Properties(
            authentication_method="SCRAM-SHA-256",
            authentication_data=b"client-first",
            request_problem_information=problem_information,
        ),
    )
    assert connack.reason_code == 0x8C
    if problem_information == 0:
        assert connack.properties.reason_string is None
    else:
        assert connack.properties.reason_string  # tells the client why
    assert raw.recv_until_closed() == []


def test_authentication_method_is_refused_paho(node: RunningNode) -> None:
    client = Client(
        node.mqtt_port,
        "auth-paho",
        connect_properties=props(PacketTypes.CONNECT, AuthenticationMethod="SCRAM-SHA-1"),
    )
    assert client.connack is not None and client.connack.reason_code == 0x8C
    client.drop()


def test_request_response_information(node: RunningNode) -> None:
    asked = Client(
        node.mqtt_port,
        "rr-yes",
        connect_properties=props(PacketTypes.CONNECT, RequestResponseInformation=1),
    )
    assert asked.connack is not None
    info = asked.connack.properties.ResponseInformation
    assert isinstance(info, str) and info
    # The response information is usable as a topic prefix for request/response.
    asked.subscribe(f"{info}/#", 1)
    Client(node.mqtt_port, "responder").publish(f"{info}/1", b"answer", 1)
    [msg] = asked.expect(1)
    assert msg.payload == b"answer"
    for name, value in (("rr-default", None), ("rr-no", 0)):
        connect_props = (
            props(PacketTypes.CONNECT, RequestResponseInformation=value)
            if value is not None
            else None
        )
        other = Client(node.mqtt_port, name, connect_properties=connect_props)
        assert other.connack is not None
        assert not hasattr(other.connack.properties, "ResponseInformation")


@pytest.mark.merged_only(reason="a proxy cannot know that no subscription matches (0x10 is a MAY)")
def test_request_problem_information_0(node: RunningNode, raws: Callable[..., RawClient]) -> None:
    quiet = Properties(request_problem_information=0)
    raw = raws(node.mqtt_port)
    raw.connect("rpi", properties=quiet)
    raw.send(Publish("nobody/listens/here", b"x", 1, packet_id=1))
    ack = raw.recv()
    assert isinstance(ack, Puback)
    assert (ack.packet_id, ack.reason_code) == (1, 0x10)
    assert ack.properties.reason_string is None
    assert ack.properties.user_properties == ()
    # A refusal explains itself with a reason string, unless the client asked for none.
    auth = Properties(authentication_method="SCRAM-SHA-256")
    told = raws(node.mqtt_port).connect("rpi-1", properties=auth)
    assert told.reason_code == 0x8C and told.properties.reason_string
    untold = raws(node.mqtt_port).connect(
        "rpi-0", properties=dataclasses.replace(auth, request_problem_information=0)
    )
    assert untold.reason_code == 0x8C
    assert untold.properties.reason_string is None


@pytest.mark.parametrize(
    ("asked", "granted"), [(100, 10), (11, 10), (0, 10), (10, None), (5, None)]
)
def test_server_keep_alive(asked: int, granted: int | None) -> None:
    with running_node(node_settings(max_keep_alive=10)) as node:
        client = Client(node.mqtt_port, "ka", keepalive=asked)
        assert client.connack is not None
        if granted is None:
            assert not hasattr(client.connack.properties, "ServerKeepAlive")
        else:
            assert client.connack.properties.ServerKeepAlive == granted
        client.disconnect()


@pytest.mark.parametrize("level", [4, 5])
def test_server_keep_alive_is_enforced(raws: Callable[..., RawClient], level: int) -> None:
    """A client that asks for a long keep alive is held to the server's maximum."""
    with running_node(node_settings(max_keep_alive=1)) as node:
        raw = raws(node.mqtt_port, level)
        connack = raw.connect("long", keep_alive=600)
        if level == 5:
            assert connack.properties.server_keep_alive == 1
        start = time.monotonic()
        closed_with(raw, 0x8D if level == 5 else None)
        assert 1.2 <= time.monotonic() - start <= 2.6


@pytest.mark.parametrize("level", [4, 5])
def test_keep_alive_timeout(node: RunningNode, raws: Callable[..., RawClient], level: int) -> None:
    silent = raws(node.mqtt_port, level)
    pinger = raws(node.mqtt_port, level)
    assert silent.connect("silent", keep_alive=1).reason_code == 0
    start = time.monotonic()
    assert pinger.connect("pinger", keep_alive=1).reason_code == 0
    paho = Client(node.mqtt_port, "paho-ka", version=level, keepalive=1)
    paho.subscribe("ka/t", 1)
    outcome: dict[str, object] = {}

    def watch() -> None:
        try:
            closed_with(silent, 0x8D if level == 5 else None)
            outcome["closed_after"] = time.monotonic() - start
        except BaseException as exc:
            outcome["error"] = exc

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    while time.monotonic() - start < 3.5:
        pinger.send(Pingreq())
        assert pinger.recv(2) == Pingresp()
        time.sleep(0.5)
    watcher.join(5)
    assert "error" not in outcome, outcome
    assert 1.2 <= outcome["closed_after"] <= 2.6, outcome  # type: ignore[operator]
    # The client that pings, and paho (which pings by itself), are still connected.
    pinger.send(Pingreq())
    assert pinger.recv(2) == Pingresp()
    assert paho.disconnects.empty()
    Client(node.mqtt_port, "ka-pub").publish("ka/t", b"still here", 1)
    [msg] = paho.expect(1)
    assert msg.payload == b"still here"
    paho.disconnect()


# -- MQTT 5: topic aliases ------------------------------------------------------------------------


def test_topic_alias_client_to_server(node: RunningNode) -> None:
    sub = Client(node.mqtt_port, "alias-sub")
    sub.subscribe("alias/#", 1)
    pub = Client(node.mqtt_port, "alias-pub")
    assert pub.connack is not None
    assert pub.connack.properties.TopicAliasMaximum == 10
    pub.publish("alias/one", b"a", 1, properties=props(TopicAlias=1))
    pub.publish("", b"b", 1, properties=props(TopicAlias=1))
    pub.publish("alias/two", b"c", 1, properties=props(TopicAlias=1))  # remapped
    pub.publish("", b"d", 0, properties=props(TopicAlias=1))
    pub.publish("alias/three", b"e", 1, properties=props(TopicAlias=10))
    pub.publish("", b"f", 1, properties=props(TopicAlias=10))
    got = sub.expect(6)
    # In order per topic (MQTT orders nothing across topics).
    by_topic: dict[str, list[bytes]] = {}
    for m in got:
        by_topic.setdefault(m.topic, []).append(m.payload)
    assert by_topic == {
        "alias/one": [b"a", b"b"],
        "alias/two": [b"c", b"d"],
        "alias/three": [b"e", b"f"],
    }
    # The subscriber did not allow aliases: it never sees one.
    assert not any(hasattr(m.properties, "TopicAlias") for m in got)


def test_topic_alias_server_to_client(node: RunningNode, raws: Callable[..., RawClient]) -> None:
    raw = raws(node.mqtt_port)
    raw.connect("alias-raw", properties=Properties(topic_alias_maximum=2))
    raw.send(Subscribe(1, (SubscriptionRequest("sa/#", 0),)))
    assert raw.recv() == Suback(1, (0,))
    pub = Client(node.mqtt_port, "alias-src")
    got = []
    for topic in ("sa/1", "sa/1", "sa/2", "sa/3", "sa/3", "sa/2", "sa/1"):
        # One at a time: the aliases follow the order the server sends topics in.
        pub.publish(topic, topic.encode(), 0)
        got.append(raw.recv())
    assert all(isinstance(p, Publish) for p in got), got
    seen = [(p.topic, p.properties.topic_alias, p.payload) for p in got]  # type: ignore[union-attr]
    assert seen == [
        ("sa/1", 1, b"sa/1"),
        ("", 1, b"sa/1"),
        ("sa/2", 2, b"sa/2"),
        ("sa/3", None, b"sa/3"),  # only two aliases allowed
        ("sa/3", None, b"sa/3"),
        ("", 2, b"sa/2"),
        ("", 1, b"sa/1"),
    ]


def test_no_server_aliases_without_client_maximum(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    raw = raws(node.mqtt_port)
    raw.connect("no-alias")
    raw.send(Subscribe(1, (SubscriptionRequest("na", 0),)))
    raw.recv()
    pub = Client(node.mqtt_port, "na-src")
    pub.publish("na", b"1")
    pub.publish("na", b"2")
    for _ in range(2):
        packet = raw.recv()
        assert isinstance(packet, Publish)
        assert (packet.topic, packet.properties.topic_alias) == ("na", None)


@pytest.mark.parametrize(
    "alias_property",
    [
        pytest.param(b"\x23\x00\x00", id="alias-0"),
        pytest.param(b"\x23\x00\x0b", id="above-maximum"),
        pytest.param(b"\x23\xff\xff", id="65535"),
    ],
)
def test_invalid_topic_alias(
    node: RunningNode, raws: Callable[..., RawClient], alias_property: bytes
) -> None:
    with bystander(node.mqtt_port):
        raw = raws(node.mqtt_port)
        assert raw.connect("bad-alias").properties.topic_alias_maximum == 10
        raw.send_bytes(publish_bytes(b"t", props=alias_property))
        closed_with(raw, 0x94)


def test_unknown_topic_alias_is_a_protocol_error(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    raw = raws(node.mqtt_port)
    raw.connect("unknown-alias")
    raw.send(Publish("", b"x", properties=Properties(topic_alias=3)))
    closed_with(raw, 0x82)


def test_topic_aliases_do_not_outlive_the_connection(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    session = Properties(session_expiry_interval=60)
    first = raws(node.mqtt_port)
    first.connect("alias-life", clean_start=False, properties=session)
    first.send(Publish("life", b"x", properties=Properties(topic_alias=1)))
    first.send(Pingreq())
    assert first.recv() == Pingresp()
    first.close()
    second = raws(node.mqtt_port)
    second.connect("alias-life", clean_start=False, properties=session)
    second.send(Publish("", b"x", properties=Properties(topic_alias=1)))
    closed_with(second, 0x82)


# -- MQTT 5: packet sizes and Receive Maximum ----------------------------------------------------


def test_maximum_packet_size_server_to_client(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    raw = raws(node.mqtt_port)
    raw.connect("small", properties=Properties(maximum_packet_size=200))
    raw.send(Subscribe(1, (SubscriptionRequest("mps/#", 1),)))
    assert raw.recv() == Suback(1, (1,))
    pub = Client(node.mqtt_port, "mps-pub")
    pub.publish("mps/big", b"x" * 1024, 1)
    pub.publish("mps/big", b"y" * 150, 0)  # just under 200 with the header
    pub.publish("mps/small", b"small", 1)
    pub.publish("mps/big", b"z" * 1024, 0)
    # Order holds per topic; across two topics a proxy may deliver in either order.
    got = {}
    for _ in range(2):
        packet = raw.recv()
        assert isinstance(packet, Publish)
        got[packet.topic] = packet
    assert got["mps/big"].payload == b"y" * 150
    small = got["mps/small"]
    assert (small.payload, small.qos) == (b"small", 1)
    assert small.packet_id is not None
    raw.send(Puback(small.packet_id))
    raw.send(Pingreq())
    assert raw.recv() == Pingresp()  # still connected, nothing else was sent


def test_a_connack_refusal_loses_its_reason_string_to_fit_the_client(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    raw = raws(node.mqtt_port)
    raw.send(
        Connect(
            "small-refused",
            protocol_level=5,
            properties=Properties(maximum_packet_size=12, authentication_method="unknown"),
        )
    )
    packets = raw.recv_until_closed()
    assert packets == [Connack(reason_code=0x8C)], packets  # no reason string


def test_no_connack_when_the_client_allows_none_that_fits(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    """[MQTT-3.1.2-24]: the CONNACK's properties (Receive Maximum, Maximum Packet Size, Topic
    Alias Maximum) cannot be left out: the connection closes without one."""
    raw = raws(node.mqtt_port)
    raw.send(Connect("tiny", protocol_level=5, properties=Properties(maximum_packet_size=12)))
    assert raw.recv_until_closed() == []


def test_a_suback_larger_than_the_client_allows_closes_the_connection(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    raw = raws(node.mqtt_port)
    assert (
        raw.connect("many-filters", properties=Properties(maximum_packet_size=24)).reason_code == 0
    )
    filters = tuple(SubscriptionRequest(f"mf/{i}", 0) for i in range(30))
    raw.send(Subscribe(1, filters))  # a SUBACK of 35 bytes
    closed_with(raw, 0x95)


def test_a_subscribe_whose_suback_cannot_fit_subscribes_to_nothing(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    """Closed before the subscriptions are made: the session the client resumes has none."""
    kept = Properties(session_expiry_interval=60)
    raw = raws(node.mqtt_port)
    tiny = Properties(session_expiry_interval=60, maximum_packet_size=24)
    assert raw.connect("no-fit", properties=tiny).reason_code == 0
    raw.send(Subscribe(1, tuple(SubscriptionRequest(f"nf/{i}", 1) for i in range(30))))
    closed_with(raw, 0x95)
    again = raws(node.mqtt_port)
    connack = again.connect("no-fit", clean_start=False, properties=kept)
    assert connack.reason_code == 0 and connack.session_present
    Client(node.mqtt_port, "nf-pub").publish("nf/0", b"not for it", 1)
    with pytest.raises(AssertionError):
        again.recv(timeout=0.5)  # nothing comes


def test_maximum_packet_size_client_to_server(
    small_node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    with bystander(small_node.mqtt_port):
        sub = Client(small_node.mqtt_port, "mps-sub")
        sub.subscribe("mps/#", 0)
        raw = raws(small_node.mqtt_port)
        connack = raw.connect("too-big")
        assert connack.properties.maximum_packet_size == MAX_PACKET
        raw.send(Publish("mps/ok", b"x" * (MAX_PACKET - 20), 1, packet_id=1))
        ack = raw.recv()
        assert isinstance(ack, Puback) and ack.reason_code == 0
        raw.send(Publish("mps/big", b"x" * (MAX_PACKET + 1), 1, packet_id=2))
        closed_with(raw, 0x95)
        [msg] = sub.expect(1)
        assert msg.topic == "mps/ok"
        sub.expect_none(0.2)
        sub.disconnect()


def test_receive_maximum_exceeded_with_qos_2() -> None:
    with running_node(node_settings(max_inflight=2)) as node:
        raw = RawClient(node.mqtt_port)
        try:
            assert raw.connect("flood").properties.receive_maximum == 2
            raw.send_bytes(
                b"".join(encode(Publish("flood", b"x", 2, packet_id=pid), 5) for pid in (1, 2, 3))
            )
            packets = raw.recv_until_closed()
            assert [type(p) for p in packets] == [Pubrec, Pubrec, Disconnect], packets
            assert packets[-1].reason_code == 0x93  # type: ignore[union-attr]
        finally:
            raw.close()


def test_the_disconnect_reason_reaches_a_client_still_sending() -> None:
    """A client that goes on writing after the packet that ends its connection must still
    read the DISCONNECT and its reason: the server ends its side (FIN) and reads what still
    comes for a moment before it closes, instead of closing at once, which answers the
    client's next write with a reset (a "broken pipe" for the client, which then never reads
    the DISCONNECT waiting for it)."""
    with running_node(node_settings(max_inflight=2)) as node:
        raw = RawClient(node.mqtt_port)
        try:
            assert raw.connect("flood").properties.receive_maximum == 2
            raw.send_bytes(
                b"".join(encode(Publish("flood", b"x", 2, packet_id=pid), 5) for pid in (1, 2, 3))
            )
            for _ in range(10):  # a client busy writing, unaware of the DISCONNECT
                time.sleep(0.05)
                raw.send(Pingreq())
            packets = raw.recv_until_closed()
            assert [type(p) for p in packets] == [Pubrec, Pubrec, Disconnect], packets
            assert packets[-1].reason_code == 0x93  # type: ignore[union-attr]
        finally:
            raw.close()


def is_pubrec(packet: object, packet_id: int) -> bool:
    """A successful PUBREC (0x00, or 0x10 as nobody subscribes) for `packet_id`."""
    return (
        isinstance(packet, Pubrec) and packet.packet_id == packet_id and packet.reason_code < 0x80
    )


def test_receive_maximum_window_reopens() -> None:
    with running_node(node_settings(max_inflight=2)) as node:
        raw = RawClient(node.mqtt_port)
        try:
            raw.connect("window")
            for pid in (1, 2):
                raw.send(Publish("window", b"x", 2, packet_id=pid))
                assert is_pubrec(raw.recv(), pid)
            raw.send(Pubrel(1))
            assert raw.recv() == Pubcomp(1)
            raw.send(Publish("window", b"x", 2, packet_id=3))
            assert is_pubrec(raw.recv(), 3)
            raw.send(Publish("window", b"x", 2, packet_id=2, dup=True))  # a resend, not a new one
            assert is_pubrec(raw.recv(), 2)
            raw.send(Pingreq())
            assert raw.recv() == Pingresp()
        finally:
            raw.close()


def test_pipelined_qos_1_is_acknowledged_in_order(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    """QoS 1 publishes sent back to back (within Receive Maximum) are all acknowledged, in the
    order they were sent (MQTT-4.6.0-2)."""
    raw = raws(node.mqtt_port)
    assert raw.connect("pipeline").properties.receive_maximum == 32
    raw.send_bytes(
        b"".join(encode(Publish("pipe", b"x", 1, packet_id=pid), 5) for pid in range(1, 31))
    )
    acks = [raw.recv() for _ in range(30)]
    assert all(isinstance(a, Puback) for a in acks), acks
    assert [a.packet_id for a in acks] == list(range(1, 31))  # type: ignore[union-attr]


@pytest.mark.parametrize("level", [4, 5])
def test_pipelined_qos_2_is_received_once_and_answered_in_order(
    node: RunningNode, raws: Callable[..., RawClient], level: int
) -> None:
    """QoS 2 publishes sent back to back, one of them sent twice in the same burst and
    mixed with QoS 1 and 0: every one is answered in the order sent, and each message reaches
    the subscriber once (MQTT-4.3.3-2, exactly once)."""
    sub = Client(node.mqtt_port, f"pipe2-sub-{level}")
    assert sub.subscribe(f"pipe2/{level}/#", 2) == [2]
    raw = raws(node.mqtt_port, level)
    raw.connect(f"pipe2-{level}")
    burst = [
        Publish(f"pipe2/{level}/a", b"a", 2, packet_id=1),
        Publish(f"pipe2/{level}/b", b"b", 1, packet_id=2),
        Publish(f"pipe2/{level}/c", b"c", 2, packet_id=3),
        Publish(f"pipe2/{level}/a", b"a", 2, packet_id=1, dup=True),  # sent again: not new
        Publish(f"pipe2/{level}/d", b"d", 0),
        Publish(f"pipe2/{level}/e", b"e", 2, packet_id=4),
    ]
    raw.send_bytes(b"".join(encode(p, level) for p in burst))
    answers = [raw.recv() for _ in range(5)]
    assert [(type(a), a.packet_id) for a in answers] == [  # type: ignore[union-attr]
        (Pubrec, 1),
        (Puback, 2),
        (Pubrec, 3),
        (Pubrec, 1),
        (Pubrec, 4),
    ], answers
    assert all(a.reason_code < 0x80 for a in answers)  # type: ignore[union-attr]
    for pid in (1, 3, 4):
        raw.send(Pubrel(pid))
        assert raw.recv() == Pubcomp(pid)
    got = sorted(m.payload for m in sub.expect(5))
    assert got == [b"a", b"b", b"c", b"d", b"e"]
    sub.expect_none(0.3)
    # A packet id released by PUBREL is free again: a new message with it is published.
    raw.send(Publish(f"pipe2/{level}/f", b"f", 2, packet_id=1))
    assert is_pubrec(raw.recv(), 1)
    assert [m.payload for m in sub.expect(1)] == [b"f"]
    sub.disconnect()


# -- MQTT 5: properties that pass through ---------------------------------------------------------


def test_payload_format_and_content_type_pass_through(node: RunningNode) -> None:
    sub5 = Client(node.mqtt_port, "pf-5")
    sub5.subscribe("pf/#", 1)
    sub4 = Client(node.mqtt_port, "pf-4", version=4)
    sub4.subscribe("pf/#", 1)
    pub = Client(node.mqtt_port, "pf-pub")
    pub.publish(
        "pf/text",
        "grüße".encode(),
        1,
        properties=props(PayloadFormatIndicator=1, ContentType="text/plain; charset=utf-8"),
    )
    pub.publish(
        "pf/bin",
        b"\xff\x00",
        1,
        properties=props(PayloadFormatIndicator=0, ContentType="application/octet-stream"),
    )
    pub.publish("pf/none", b"plain", 1)
    received = {m.topic: m for m in sub5.expect(3)}
    text, binary, plain = received["pf/text"], received["pf/bin"], received["pf/none"]
    assert text.payload == "grüße".encode()
    assert text.properties.PayloadFormatIndicator == 1
    assert text.properties.ContentType == "text/plain; charset=utf-8"
    assert binary.properties.ContentType == "application/octet-stream"
    assert getattr(binary.properties, "PayloadFormatIndicator", 0) == 0
    assert not hasattr(plain.properties, "PayloadFormatIndicator")
    assert not hasattr(plain.properties, "ContentType")
    assert sorted(m.payload for m in sub4.expect(3)) == sorted(
        ["grüße".encode(), b"\xff\x00", b"plain"]
    )


def test_raw_properties_reach_subscriber(node: RunningNode, raws: Callable[..., RawClient]) -> None:
    raw_sub = raws(node.mqtt_port)
    raw_sub.connect("props-sub")
    raw_sub.send(Subscribe(1, (SubscriptionRequest("rp", 1),)))
    raw_sub.recv()
    raw_pub = raws(node.mqtt_port)
    raw_pub.connect("props-pub")
    sent = Properties(
        payload_format_indicator=1,
        content_type="text/plain",
        response_topic="rp/reply",
        correlation_data=b"\x01\x02",
        user_properties=(("k", "v"), ("k", "w")),
    )
    raw_pub.send(Publish("rp", b"body", 1, packet_id=5, properties=sent))
    assert raw_pub.recv() == Puback(5)
    got = raw_sub.recv()
    assert isinstance(got, Publish)
    assert got.properties.payload_format_indicator == 1
    assert got.properties.content_type == "text/plain"
    assert got.properties.response_topic == "rp/reply"
    assert got.properties.correlation_data == b"\x01\x02"
    assert got.properties.user_properties == (("k", "v"), ("k", "w"))
