"""Will messages end to end: when they are published (abnormal close, DISCONNECT 0x04, keep-alive
timeout, takeover) and when not, their flags and properties, and MQTT 5 Will Delay."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from paho.mqtt.packettypes import PacketTypes

from mop.protocols.mqtt.packets import Disconnect, Pingreq, Pingresp, Will
from mop.testing.node import RunningNode
from tests.e2e.clients import Client, props
from tests.e2e.raw import RawClient

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

DISCONNECT_WITH_WILL = 0x04
KEEP_ALIVE_TIMEOUT = 0x8D


def watcher(node: RunningNode, topic: str, client_id: str = "watcher") -> Client:
    client = Client(node.mqtt_port, client_id)
    client.subscribe(topic, 2)
    return client


def will_client(
    node: RunningNode,
    client_id: str,
    *,
    version: int = 5,
    will: tuple[str, bytes, int, bool],
    delay: int | None = None,
    expiry: int | None = None,
    clean: bool = True,
    **will_props: object,
) -> Client:
    will_properties = None
    if delay is not None:
        will_props["WillDelayInterval"] = delay
    if will_props:
        will_properties = props(PacketTypes.WILLMESSAGE, **will_props)
    connect_properties = None
    if expiry is not None:
        connect_properties = props(PacketTypes.CONNECT, SessionExpiryInterval=expiry)
    return Client(
        node.mqtt_port,
        client_id,
        version=version,
        clean=clean,
        will=will,
        will_properties=will_properties,
        connect_properties=connect_properties,
    )


@pytest.fixture
def raw_clients() -> Iterator[list[RawClient]]:
    opened: list[RawClient] = []
    yield opened
    for client in opened:
        client.close()


# -- when the will is published --------------------------------------------------------------


@pytest.mark.parametrize("version", [3, 4, 5])
def test_will_is_published_on_an_abnormal_disconnect(node: RunningNode, version: int) -> None:
    watch = watcher(node, "will/+")
    client = will_client(node, f"w-{version}", version=version, will=("will/w", b"gone", 1, False))
    watch.expect_none(0.2)
    client.drop()
    [msg] = watch.expect(1)
    assert (msg.topic, msg.payload, msg.qos, msg.retain) == ("will/w", b"gone", 1, False)
    watch.expect_none()


@pytest.mark.parametrize("version", [3, 4, 5])
def test_no_will_on_a_normal_disconnect(node: RunningNode, version: int) -> None:
    watch = watcher(node, "will/+")
    client = will_client(node, f"n-{version}", version=version, will=("will/n", b"gone", 1, False))
    client.disconnect()
    watch.expect_none(0.7)


def test_will_is_published_on_disconnect_with_will_message(node: RunningNode) -> None:
    watch = watcher(node, "will/+")
    client = will_client(node, "dww", will=("will/dww", b"asked for", 0, False))
    client.disconnect(reason_code=DISCONNECT_WITH_WILL)
    [msg] = watch.expect(1)
    assert (msg.topic, msg.payload) == ("will/dww", b"asked for")


@pytest.mark.parametrize("level", [4, 5])
def test_keep_alive_timeout_closes_the_connection_and_publishes_the_will(
    node: RunningNode, raw_clients: list[RawClient], level: int
) -> None:
    watch = watcher(node, "will/+")
    client = RawClient(node.mqtt_port, level=level)
    raw_clients.append(client)
    client.connect(f"ka-{level}", keep_alive=1, will=Will("will/ka", b"silent", 1, False))
    started = time.monotonic()
    packets = client.recv_until_closed(timeout=5)  # the client sends nothing at all
    waited = time.monotonic() - started
    assert waited >= 1.0  # not before the keep-alive period has passed
    if level == 5:
        assert [type(p) for p in packets] == [Disconnect]
        assert isinstance(packets[0], Disconnect)
        assert packets[0].reason_code == KEEP_ALIVE_TIMEOUT
    else:
        assert packets == []
    [msg] = watch.expect(1)
    assert (msg.topic, msg.payload) == ("will/ka", b"silent")


def test_keep_alive_is_kept_by_pings(node: RunningNode, raw_clients: list[RawClient]) -> None:
    watch = watcher(node, "will/+")
    client = RawClient(node.mqtt_port)
    raw_clients.append(client)
    client.connect("ping", keep_alive=1, will=Will("will/ping", b"x", 0, False))
    for _ in range(4):  # 2 s in all, longer than the 1.5 s grace
        time.sleep(0.5)
        client.send(Pingreq())
        assert client.recv() == Pingresp()
    watch.expect_none(0.1)


@pytest.mark.parametrize("version", [4, 5])
def test_takeover_publishes_the_will_of_the_old_connection(node: RunningNode, version: int) -> None:
    watch = watcher(node, "will/+")
    will_client(node, f"tw-{version}", version=version, will=("will/tw", b"replaced", 0, False))
    Client(node.mqtt_port, f"tw-{version}", version=version)
    [msg] = watch.expect(1)
    assert msg.payload == b"replaced"


# -- flags and properties --------------------------------------------------------------------


@pytest.mark.parametrize("version", [4, 5])
def test_will_with_retain_becomes_the_retained_message(node: RunningNode, version: int) -> None:
    live = watcher(node, "will/+")
    client = will_client(
        node, f"wr-{version}", version=version, will=("will/status", b"offline", 1, True)
    )
    client.drop()
    [msg] = live.expect(1)
    assert (msg.payload, msg.retain) == (b"offline", False)  # a live delivery
    # The retained table is written right after the live delivery; a new subscription made at
    # that moment may just miss it, so subscribe again (bounded) until it is there.
    later = watcher(node, "will/+", "later")
    deadline = time.monotonic() + 5
    while True:
        try:
            [msg] = later.expect(1, timeout=0.2)
            break
        except AssertionError:
            assert time.monotonic() < deadline, "the will never became a retained message"
            later.subscribe("will/+", 2)  # retain handling 0: retained messages on every subscribe
    assert (msg.topic, msg.payload, msg.retain, msg.qos) == ("will/status", b"offline", True, 1)


def test_will_properties_are_delivered(node: RunningNode) -> None:
    watch = watcher(node, "will/+")
    client = will_client(
        node,
        "wp",
        will=("will/wp", b"{}", 1, False),
        UserProperty=[("device", "d1"), ("why", "lost")],
        ContentType="application/json",
        ResponseTopic="reply/wp",
        CorrelationData=b"\x01\x02",
        PayloadFormatIndicator=1,
    )
    client.drop()
    [msg] = watch.expect(1)
    p = msg.properties
    assert p.UserProperty == [("device", "d1"), ("why", "lost")]
    assert (p.ContentType, p.ResponseTopic, p.CorrelationData) == (
        "application/json",
        "reply/wp",
        b"\x01\x02",
    )
    assert p.PayloadFormatIndicator == 1


# -- will delay ------------------------------------------------------------------------------


def test_will_delay_postpones_the_will(node: RunningNode) -> None:
    watch = watcher(node, "will/+")
    client = will_client(node, "wd", will=("will/wd", b"late", 1, False), delay=1, expiry=10)
    client.drop()
    dropped = time.monotonic()
    watch.expect_none(0.6)
    [msg] = watch.expect(1, timeout=4)
    assert time.monotonic() - dropped >= 0.9
    assert msg.payload == b"late"
    assert not hasattr(msg.properties, "WillDelayInterval")


def test_reconnect_within_the_will_delay_cancels_the_will(node: RunningNode) -> None:
    watch = watcher(node, "will/+")
    client = will_client(node, "wc", will=("will/wc", b"never", 1, False), delay=1, expiry=10)
    client.drop()
    back = Client(
        node.mqtt_port,
        "wc",
        clean=False,
        connect_properties=props(PacketTypes.CONNECT, SessionExpiryInterval=10),
    )
    assert back.connack is not None and back.connack.session_present
    watch.expect_none(1.8)
    back.disconnect()
    watch.expect_none(0.3)


def test_will_delay_longer_than_the_session_is_sent_when_the_session_ends(
    node: RunningNode,
) -> None:
    watch = watcher(node, "will/+")
    client = will_client(node, "we", will=("will/we", b"at expiry", 1, False), delay=30, expiry=1)
    client.drop()
    dropped = time.monotonic()
    watch.expect_none(0.5)
    [msg] = watch.expect(1, timeout=4)
    assert 0.9 <= time.monotonic() - dropped < 5
    assert msg.payload == b"at expiry"


def test_takeover_that_resumes_the_session_cancels_a_delayed_will(node: RunningNode) -> None:
    watch = watcher(node, "will/+")
    will_client(node, "tr", will=("will/tr", b"never", 1, False), delay=1, expiry=10)
    second = Client(
        node.mqtt_port,
        "tr",
        clean=False,
        connect_properties=props(PacketTypes.CONNECT, SessionExpiryInterval=10),
    )
    assert second.connack is not None and second.connack.session_present
    watch.expect_none(1.8)


def test_a_resumed_session_forgets_the_previous_connections_will(node: RunningNode) -> None:
    """The will of a dropped connection, waiting for the end of its session, must not be
    published when the session is resumed and later ends after a normal DISCONNECT."""
    watch = watcher(node, "will/+")
    client = will_client(node, "ws", will=("will/ws", b"stale", 1, False), delay=30, expiry=1)
    client.drop()
    back = Client(
        node.mqtt_port,
        "ws",
        clean=False,
        connect_properties=props(PacketTypes.CONNECT, SessionExpiryInterval=1),
    )
    assert back.connack is not None and back.connack.session_present
    back.disconnect()  # normal: no will; the session ends 1 s later
    watch.expect_none(2.0)
