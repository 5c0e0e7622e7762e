"""Overload protection end to end with real MQTT clients: connections over a listener's rate are
turned away with a CONNACK, a client over its message or byte rate is slowed down without losing
a QoS 1 message, and over the memory high-water mark publishes get 0x97, new clients 0x89 and
/readyz 503 (while /healthz stays 200), until memory is below the low-water mark again."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes

from mop.settings import LimitsSettings
from mop.testing.node import RunningNode, node_settings, running_node
from tests.e2e.clients import TIMEOUT, Client, props
from tests.e2e.overload_support import set_memory, stats
from tests.e2e.raw import RawClient

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

# Memory marks no test machine reaches, so that only the samples a test gives the guard count;
# and samples so rare that the node's own do not get in the way.
HIGH = 1e15
LOW = 1e14
MEMORY = LimitsSettings(
    memory_high_watermark=HIGH, memory_low_watermark=LOW, memory_check_interval=3600.0
)


def http_get(node: RunningNode, path: str) -> tuple[int, Any]:
    host, port = node.node.address("admin")
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def wait_until(condition: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


# -- connection rate ------------------------------------------------------------------------------


@pytest.mark.parametrize(("level", "refused"), [(5, 0x9F), (4, 3), (3, 3)])
def test_connections_over_the_rate_get_a_connack(
    raws: Callable[..., RawClient], level: int, refused: int
) -> None:
    # Two at once, then one every 1000 s: the third is over the rate.
    limits = LimitsSettings(connection_rate=0.001, connection_burst=2)
    with running_node(node_settings(limits=limits)) as node:
        first = raws(node.mqtt_port, level)
        assert first.connect("first").reason_code == 0
        second = raws(node.mqtt_port, level)
        assert second.connect("second").reason_code == 0
        third = raws(node.mqtt_port, level)
        assert third.connect("third").reason_code == refused
        assert third.recv_until_closed() == []
        # A client that says nothing is closed without a word.
        silent = raws(node.mqtt_port, level)
        assert silent.recv_until_closed() == []
        assert stats(node).connections_refused_rate == 2
        refused_here = node.node.processor.stats.protocol("mqtt").refused
        assert refused_here == {"rate_limited": 2}  # mop_connections_rejected_total too
        # Those admitted are served as usual.
        first.send_bytes(b"\xc0\x00")  # PINGREQ
        assert first.recv() is not None


def test_paho_sees_connection_rate_exceeded() -> None:
    limits = LimitsSettings(connection_rate=0.001, connection_burst=1)
    with running_node(node_settings(limits=limits)) as node:
        first = Client(node.mqtt_port, "first")
        assert first.connack is not None and first.connack.reason_code == 0
        second = Client(node.mqtt_port, "second")
        assert second.connack is not None and second.connack.reason_code == 0x9F
        second.drop()
        first.disconnect()


def test_a_large_connect_over_the_rate_still_gets_its_connack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CONNECT larger than what the node reads of a refused connection (here 500 kB of user
    properties, within the maximum packet size), from a client whose data is still on its way
    when the answer comes (a small send buffer, as over a slow network): the rest is read and
    dropped, so paho gets the CONNACK and not a reset, which made it fail with no answer."""
    limits = LimitsSettings(connection_rate=0.001, connection_burst=1)
    with running_node(node_settings(limits=limits)) as node:
        first = Client(node.mqtt_port, "first")
        plain = socket.create_connection

        def small_send_buffer(*args: Any, **kwargs: Any) -> socket.socket:
            sock = plain(*args, **kwargs)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
            return sock

        monkeypatch.setattr(socket, "create_connection", small_send_buffer)
        large = props(
            PacketTypes.CONNECT,
            UserProperty=[(f"k{i}", "v" * 1000) for i in range(500)],
        )
        codes = []
        for attempt in range(5):
            refused = Client(
                node.mqtt_port, f"large-{attempt}", connect_properties=large, connect=False
            )
            try:
                codes.append(refused.connect().reason_code)
            except AssertionError:  # no CONNACK
                codes.append(None)
            refused.close()
        assert codes == [0x9F] * 5
        first.disconnect()


# -- per-client rates -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "count", "size", "fastest"),
    [
        # 300 messages at 100 a second, the first 100 at once: 2 s at least.
        (LimitsSettings(client_message_rate=100.0), 300, 10, 2.0),
        # 60 messages of 1 KiB at 20 KiB a second, the first 20 KiB at once: 2 s at least.
        (LimitsSettings(client_byte_rate=20_480.0), 60, 1024, 2.0),
    ],
    ids=["messages", "bytes"],
)
def test_a_fast_publisher_is_slowed_to_its_rate_and_loses_nothing(
    limits: LimitsSettings, count: int, size: int, fastest: float
) -> None:
    with running_node(node_settings(limits=limits)) as node:
        subscriber = Client(node.mqtt_port, "slowed-sub")
        assert subscriber.subscribe("slowed/#", 1) == [1]
        publisher = Client(node.mqtt_port, "slowed-pub")
        started = time.monotonic()
        # As fast as paho goes: its window of unacknowledged messages is what the node slows.
        infos = [
            publisher.client.publish(f"slowed/{i % 3}", i.to_bytes(4, "big") * (size // 4), 1)
            for i in range(count)
        ]
        for info in infos:
            info.wait_for_publish(60)
            assert info.rc == 0 and info.is_published()
        elapsed = time.monotonic() - started
        got = subscriber.expect(count, timeout=60)
        numbers = sorted(int.from_bytes(m.payload[:4], "big") for m in got)
        assert numbers == list(range(count))
        subscriber.expect_none()
        # Slower than the rate allows is fine (the machine may be busy); faster is not. The
        # bound leaves a quarter for the rounding of paho's and the node's timing.
        assert elapsed > fastest * 0.75, f"{count} messages in {elapsed:.2f}s"
        throttled = stats(node)
        assert throttled.throttled_reads > 0 and throttled.throttled_seconds > 0
        publisher.disconnect()
        subscriber.disconnect()


def test_connecting_again_does_not_refill_a_publishers_budget() -> None:
    """A publisher that used its budget and more, then connects again with its client id,
    carries on with what it left: its next messages wait for the rate, as they would have on
    the old connection, instead of going out at once in a fresh burst."""
    with running_node(node_settings(limits=LimitsSettings(client_message_rate=10.0))) as node:
        publisher = Client(node.mqtt_port, "budget-pub")
        # 30 at 10 a second, 10 of them in the burst: the budget is spent when they are in.
        infos = [publisher.client.publish("budget/t", bytes([i]), 1) for i in range(30)]
        for info in infos:
            info.wait_for_publish(TIMEOUT)
            assert info.is_published()
        publisher.disconnect()
        again = Client(node.mqtt_port, "budget-pub")
        started = time.monotonic()
        infos = [again.client.publish("budget/t", bytes([i]), 1) for i in range(10)]
        for info in infos:
            info.wait_for_publish(TIMEOUT)
            assert info.is_published()
        elapsed = time.monotonic() - started
        # 10 at 10 a second from an empty budget: 1 s at least (a fresh one: at once).
        assert elapsed > 1.0 * 0.75, f"10 messages in {elapsed:.2f}s after connecting again"
        # Another client has its own budget.
        other = Client(node.mqtt_port, "budget-other")
        started = time.monotonic()
        infos = [other.client.publish("budget/t", bytes([i]), 1) for i in range(5)]
        for info in infos:
            info.wait_for_publish(TIMEOUT)
        assert time.monotonic() - started < 0.75
        for client in (again, other):
            client.disconnect()


# -- memory high-water mark -----------------------------------------------------------------------


def test_over_the_memory_mark_publishes_get_0x97_and_recover() -> None:
    with running_node(node_settings(limits=MEMORY)) as node:
        subscriber = Client(node.mqtt_port, "memory-sub")
        assert subscriber.subscribe("memory/#", 1) == [1]
        publisher = Client(node.mqtt_port, "memory-pub")
        assert publisher.publish("memory/t", b"before", 1) == 0
        assert http_get(node, "/readyz") == (200, {"status": "ready"})

        set_memory(node, 2 * HIGH)
        # A QoS 1 publish is refused with Quota exceeded; the subscriber does not get it.
        assert publisher.publish("memory/t", b"refused", 1) == 0x97
        # The node is alive but not ready, and says why.
        assert http_get(node, "/healthz") == (200, {"status": "ok"})
        status, body = http_get(node, "/readyz")
        assert status == 503 and body["status"] == "not ready"
        assert any("high-water mark" in problem for problem in body["problems"])
        # New clients are told the server is busy (3.1.1: server unavailable).
        busy = Client(node.mqtt_port, "memory-new")
        assert busy.connack is not None and busy.connack.reason_code == 0x89
        busy.drop()
        old = Client(node.mqtt_port, "memory-old", version=4)
        assert old.connack is not None and old.connack.reason_code == 0x88  # paho's name for 3
        old.drop()
        # The publisher is not read from meanwhile: its next message waits in the socket.
        waiting = publisher.client.publish("memory/t", b"waited", 1)
        time.sleep(0.5)
        assert not waiting.is_published()

        set_memory(node, LOW / 2)
        waiting.wait_for_publish(TIMEOUT)
        assert waiting.is_published()
        assert publisher.publish("memory/t", b"after", 1) == 0
        assert [m.payload for m in subscriber.expect(3)] == [b"before", b"waited", b"after"]
        subscriber.expect_none()
        assert http_get(node, "/readyz") == (200, {"status": "ready"})
        counted = stats(node)
        assert counted.publishes_refused == 1
        assert counted.connections_refused_busy == 2
        assert counted.memory_pauses >= 1 and counted.memory_high_events == 1
        # The same refusals in the node's counters: a drop, and connections turned away busy.
        processor = node.node.processor.stats
        dropped, refused = node.call(
            lambda: (dict(processor.dropped), dict(processor.protocol("mqtt").refused))
        )
        assert dropped.get("overloaded") == 1
        assert refused.get("limit_reached") == 2
        late = Client(node.mqtt_port, "memory-late")
        assert late.connack is not None and late.connack.reason_code == 0
        late.disconnect()
        publisher.disconnect()
        subscriber.disconnect()


@pytest.mark.parametrize("version", [5, 4])
def test_over_the_memory_mark_unanswerable_publishes_pause_their_sender(version: int) -> None:
    """QoS 0 (any version) and MQTT 3.1.1 QoS 1 cannot be refused: what was read is taken,
    then the sender is not read from until memory is below the low mark; nothing is lost."""
    with running_node(node_settings(limits=MEMORY)) as node:
        subscriber = Client(node.mqtt_port, f"pause-sub-{version}")
        assert subscriber.subscribe("pause/#", 1) == [1]
        qos0 = Client(node.mqtt_port, f"pause-qos0-{version}", version=version)
        qos1 = Client(node.mqtt_port, f"pause-qos1-{version}", version=version)
        set_memory(node, 2 * HIGH)
        # One message each to be taken, then a second that waits for the first's pause.
        qos0.publish("pause/0", b"first", 0)
        sent = [qos0.client.publish("pause/0", b"second", 0)]
        if version == 4:
            assert qos1.publish("pause/1", b"first", 1) == 0
            sent.append(qos1.client.publish("pause/1", b"second", 1))
        wait_until(lambda: stats(node).memory_pauses >= (2 if version == 4 else 1))
        set_memory(node, LOW / 2)
        for info in sent:
            info.wait_for_publish(TIMEOUT)
        expected = 4 if version == 4 else 2
        got = subscriber.expect(expected)
        assert sorted((m.topic, m.payload) for m in got) == sorted(
            [("pause/0", b"first"), ("pause/0", b"second")]
            + ([("pause/1", b"first"), ("pause/1", b"second")] if version == 4 else [])
        )
        subscriber.expect_none()
        assert stats(node).publishes_refused == 0
        for client in (qos0, qos1, subscriber):
            client.disconnect()
