"""Many publishers as fast as they can -> one wildcard subscriber, at QoS 0: a subscriber that
keeps up loses nothing (the publishers' reads pause while it catches up), and a subscriber that
stalls next to it has its messages dropped, counted, without holding the others back."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import pytest

from mop.protocols.mqtt.codec import encode
from mop.protocols.mqtt.packets import Publish, Suback, Subscribe, SubscriptionRequest
from mop.settings import LimitsSettings
from mop.testing.node import RunningNode, node_settings, running_node
from tests.e2e.raw import RawClient

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.both_modes,
    pytest.mark.merged_only(reason="publishers wait for the merged broker's subscriptions"),
]

PUBLISHERS = 20
# Far more than the subscription's queue (`QUEUED` a topic) and its receive queue hold.
QUEUED = 100
TIME_LIMIT = 60.0


def _packet(index: int, payload_size: int) -> bytes:
    """One QoS 0 PUBLISH of publisher `index`: the same bytes as the subscriber gets them."""
    return encode(Publish(f"fanin/{index:02d}", b"x" * payload_size, 0), 4)


def _subscriber(node: RunningNode, raws: Callable[..., RawClient], name: str) -> RawClient:
    client = raws(node.mqtt_port, 4)
    client.connect(name)
    client.send(Subscribe(1, (SubscriptionRequest("fanin/+", 0),)))
    assert isinstance(client.recv(), Suback)
    return client


def _publish_all(
    node: RunningNode, raws: Callable[..., RawClient], messages: int, size: int
) -> None:
    """Every publisher sends its `messages` in one burst from a thread of its own (a paused
    read blocks the sender, as TCP pushes back)."""
    publishers = []
    for index in range(PUBLISHERS):
        publisher = raws(node.mqtt_port, 4)
        publisher.connect(f"publisher-{index}")
        publishers.append(publisher)
    threads = [
        threading.Thread(
            target=publisher.send_bytes, args=(_packet(index, size) * messages,), daemon=True
        )
        for index, publisher in enumerate(publishers)
    ]
    for thread in threads:
        thread.start()


def _read_bytes(client: RawClient, expected: int, deadline: float) -> int:
    """Read the subscriber's socket until `expected` bytes came (or the deadline): how many."""
    got = 0
    sock: socket.socket = client.sock
    while got < expected:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        sock.settimeout(remaining)
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            break
        if not data:
            break
        got += len(data)
    return got


def _dropped(node: RunningNode) -> int:
    return node.call(lambda: node.node.processor.stats.messages_dropped)


def test_a_fan_in_to_a_subscriber_that_keeps_up_drops_nothing(
    raws: Callable[..., RawClient],
) -> None:
    messages, size = 2000, 64
    with running_node(node_settings(max_queued_messages=QUEUED)) as node:
        subscriber = _subscriber(node, raws, "keeps-up")
        _publish_all(node, raws, messages, size)
        expected = PUBLISHERS * messages * len(_packet(0, size))
        got = _read_bytes(subscriber, expected, time.monotonic() + TIME_LIMIT)
        assert got == expected, f"{got / len(_packet(0, size)):.0f} messages arrived"
        assert _dropped(node) == 0


def test_without_waiting_for_subscribers_the_same_fan_in_drops(
    raws: Callable[..., RawClient],
) -> None:
    """The check above can fail: with `subscriber_backlog_bytes = 0` nobody waits, and the
    subscription's queue overflows."""
    messages, size = 2000, 64
    settings = node_settings(
        max_queued_messages=QUEUED, limits=LimitsSettings(subscriber_backlog_bytes=0)
    )
    with running_node(settings) as node:
        subscriber = _subscriber(node, raws, "keeps-up")
        _publish_all(node, raws, messages, size)
        expected = PUBLISHERS * messages * len(_packet(0, size))
        # Whatever was not dropped arrives within the time limit; then nothing is left.
        _read_bytes(subscriber, expected, time.monotonic() + 10)
        assert _dropped(node) > 0


def test_a_stalled_subscriber_gets_drops_and_does_not_hold_the_others(
    raws: Callable[..., RawClient],
) -> None:
    # Large enough that the stalled subscriber's socket buffers cannot hold it all.
    messages, size = 1000, 1000
    settings = node_settings(
        max_queued_messages=QUEUED, limits=LimitsSettings(subscriber_stall_timeout=0.5)
    )
    with running_node(settings) as node:
        _subscriber(node, raws, "stalled")  # reads nothing from here on
        healthy = _subscriber(node, raws, "healthy")
        start = time.monotonic()
        _publish_all(node, raws, messages, size)
        expected = PUBLISHERS * messages * len(_packet(0, size))
        got = _read_bytes(healthy, expected, start + TIME_LIMIT)
        elapsed = time.monotonic() - start
        assert got == expected, f"{got / len(_packet(0, size)):.0f} messages arrived"
        # Held back once, for the stall timeout, not for as long as the stalled one stays.
        assert elapsed < 20, f"{elapsed:.1f} s"
        assert _dropped(node) > 0
