"""A persistent-session QoS 1 subscriber that stops reading its socket, next to a healthy
publisher and subscriber: the healthy pair keeps flowing, the stalled session's queue drops
(counted where `$SYS/broker/messages/dropped` reads them), and the log grows with the messages,
not with the stalled cursor's acknowledged ids."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mop.protocols.mqtt.codec import encode
from mop.protocols.mqtt.packets import (
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Publish,
    Suback,
    Subscribe,
    SubscriptionRequest,
)
from mop.testing.node import node_settings, running_node
from tests.e2e.clients import Client
from tests.e2e.raw import RawClient

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

MESSAGES = 20_000
WINDOW = 500
QUEUED = 100  # mqtt.max_queued_messages
TIME_LIMIT = 60.0
# Healthy pair, messages/s: about 4000 here with the fix, 660 without (the stalled cursor was
# rewritten whole on every save).
# What the log may hold per message: a small message record (about 100 bytes here) and its
# share of cursor records; rewriting the stalled cursor's acknowledged ids takes kilobytes.
LOG_BYTES_PER_MESSAGE = 400


def _payload(index: int) -> bytes:
    return b"%08d" % index + b"x" * 56


def _data_bytes(directory: str) -> int:
    return sum(path.stat().st_size for path in Path(directory).rglob("*") if path.is_file())


def _publish_window(publisher: RawClient, first: int, next_id: int, deadline: float) -> int:
    """Send one window of QoS 1 messages and wait for every PUBACK; the next packet id."""
    batch = []
    for index in range(first, min(first + WINDOW, MESSAGES)):
        batch.append(Publish("stall/data", _payload(index), 1, packet_id=next_id))
        next_id = next_id % 65535 + 1
    publisher.send_bytes(b"".join(encode(p, 5) for p in batch) + encode(Pingreq(), 5))
    acks = 0
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"the publisher was held up after {first + acks} messages"
        packet = publisher.recv(remaining)
        if isinstance(packet, Pingresp):
            break
        assert isinstance(packet, Puback) and packet.reason_code == 0, packet
        acks += 1
    assert acks == len(batch)
    return next_id


@pytest.mark.merged_only(
    reason="the session queue and the log that holds its cursor are the merged broker's"
)
def test_a_stalled_persistent_subscriber_does_not_slow_the_others(
    raws: Callable[..., RawClient],
) -> None:
    settings = node_settings(max_queued_messages=QUEUED)
    with running_node(settings) as node:
        stalled = raws(node.mqtt_port)
        stalled.connect(
            "stalled", clean_start=False, properties=Properties(session_expiry_interval=300)
        )
        stalled.send(Subscribe(1, (SubscriptionRequest("stall/#", 1),)))
        assert isinstance(stalled.recv(), Suback)
        # From here on it reads nothing.
        healthy = Client(node.mqtt_port, "healthy")
        assert healthy.subscribe("stall/#", 1) == [1]
        publisher = raws(node.mqtt_port)
        publisher.connect("publisher")
        before = _data_bytes(settings.data_dir)

        start = time.monotonic()
        deadline = start + TIME_LIMIT
        received = 0
        next_id = 1
        for first in range(0, MESSAGES, WINDOW):
            next_id = _publish_window(publisher, first, next_id, deadline)
            while received < min(first + WINDOW, MESSAGES):
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"the healthy subscriber got only {received} messages"
                received += len(healthy.expect(1, timeout=remaining))
        elapsed = time.monotonic() - start
        assert received == MESSAGES
        assert MESSAGES / elapsed > 1500, f"{MESSAGES / elapsed:.0f} messages/s"

        # Everything beyond what the stalled session holds (in flight, the consumer's receive
        # queue, QUEUED in its backlog) was dropped, and counted where $SYS reads its value.
        dropped = node.call(lambda: node.node.processor.stats.messages_dropped)
        assert dropped >= MESSAGES - 2000, dropped
        grown = _data_bytes(settings.data_dir) - before
        print(f"{MESSAGES / elapsed:.0f} messages/s, {grown / MESSAGES:.0f} B/message")
        assert grown < MESSAGES * LOG_BYTES_PER_MESSAGE, f"{grown / MESSAGES:.0f} B/message"
        healthy.disconnect()
