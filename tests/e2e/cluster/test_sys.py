"""`$SYS` through two separated proxies in front of one broker, with paho clients: a client
sees the statistics of the proxy it is connected to, retained and live, never the other
proxy's, and no `$SYS` topic reaches the broker."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator

import pytest
import trio

from mop.backends.cluster import get_topics
from mop.protocols.mqtt.sys_tree import COUNTER_TOPICS, LOAD_TOPICS
from mop.testing.cluster import proxy_settings
from mop.testing.node import RunningNode, running_node
from tests.e2e.clients import Client, Received
from tests.e2e.nodeproc import NodeProcess

pytestmark = pytest.mark.e2e

INTERVAL = 0.2
SETTLE = 5 * INTERVAL  # long enough for every proxy to have published its latest values
CONNECTED = "$SYS/broker/clients/connected"


@pytest.fixture
def proxies(broker: NodeProcess) -> Iterator[tuple[RunningNode, RunningNode]]:
    settings = proxy_settings(broker.service_url, sys_interval=INTERVAL)
    with running_node(settings) as first, running_node(settings) as second:
        yield first, second


def values_on(client: Client, topic: str, seconds: float) -> list[Received]:
    """Every message on `topic` that arrives within `seconds`."""
    deadline = time.monotonic() + seconds
    got = []
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            msg = client.messages.get(timeout=remaining)
        except queue.Empty:
            break
        if msg.topic == topic:
            got.append(msg)
    return got


def retained_value(client: Client, topic: str) -> str:
    [msg] = client.expect(1)
    assert msg.topic == topic and msg.retain, msg
    return msg.payload.decode()


def test_each_client_sees_its_own_proxys_statistics(
    proxies: tuple[RunningNode, RunningNode],
) -> None:
    first, second = proxies
    idle = [Client(first.mqtt_port, f"sys-idle-{i}") for i in range(3)]
    watch_first = Client(first.mqtt_port, "sys-watch-1")
    watch_second = Client(second.mqtt_port, "sys-watch-2")
    time.sleep(SETTLE)
    watch_first.subscribe(CONNECTED, 0)
    watch_second.subscribe(CONNECTED, 0)
    assert retained_value(watch_first, CONNECTED) == "4"  # three idle clients and itself
    assert retained_value(watch_second, CONNECTED) == "1"
    # A change on the second proxy is that proxy's news only.
    extra = Client(second.mqtt_port, "sys-extra")
    assert [m.payload for m in values_on(watch_second, CONNECTED, SETTLE)] == [b"2"]
    assert values_on(watch_first, CONNECTED, SETTLE) == []
    extra.disconnect()
    for client in idle:
        client.disconnect()
    assert values_on(watch_first, CONNECTED, SETTLE)[-1].payload == b"1"
    assert [m.payload for m in values_on(watch_second, CONNECTED, SETTLE)] == [b"1"]


def test_sys_wildcards_see_one_proxy_and_the_broker_sees_no_sys_topic(
    proxies: tuple[RunningNode, RunningNode], broker: NodeProcess
) -> None:
    first, second = proxies
    watchers = [Client(first.mqtt_port, "sys-all-1"), Client(second.mqtt_port, "sys-all-2")]
    time.sleep(SETTLE)
    for watcher in watchers:
        watcher.subscribe("$SYS/#", 0)
    count = 2 + len(COUNTER_TOPICS) + 3 * len(LOAD_TOPICS)  # with the version and the uptime
    for watcher in watchers:
        topics = [m.topic for m in watcher.expect(count)]
        # One value per statistic: the retained values of this proxy alone.
        assert len(set(topics)) == count, topics
        assert all(t.startswith("$SYS/broker/") for t in topics)
    # A fresh connection on each proxy: each watcher sees its own proxy's count only.
    Client(first.mqtt_port, "sys-new-1")
    assert [m.payload for m in values_on(watchers[0], CONNECTED, SETTLE)] == [b"2"]
    assert [m.payload for m in values_on(watchers[1], CONNECTED, SETTLE)] == []
    topics = trio.run(get_topics, broker.service_url, "public/default")
    assert not [t for t in topics if "%24SYS" in t], topics
