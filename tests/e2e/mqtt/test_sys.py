"""`$SYS/broker/...` end to end: the node describes itself in retained messages that follow its
state (mosquitto's topics, load averages included), clients cannot publish into `$SYS`, and with
`mqtt.sys_events` the node tells who connects and disconnects (EMQX's topics)."""

from __future__ import annotations

import dataclasses
import json
import queue
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mop.protocols.mqtt.sys_tree import COUNTER_TOPICS, LOAD_TOPICS, LOAD_WINDOWS
from mop.security.passwords import update_password_file
from mop.settings import AuthSettings
from mop.testing.node import RunningNode, node_settings, running_node
from tests.e2e.clients import Client, Received

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

INTERVAL = 0.2
NOT_AUTHORIZED = 0x87


@pytest.fixture
def sys_node() -> Iterator[RunningNode]:
    with running_node(node_settings(sys_interval=INTERVAL)) as running:
        yield running


def await_value(
    client: Client, topic: str, predicate: Callable[[str], bool], timeout: float = 5.0
) -> Received:
    """The first message on `topic` whose payload satisfies `predicate` (other topics and
    earlier values are skipped)."""
    deadline = time.monotonic() + timeout
    seen: list[bytes] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no wanted value on {topic} in {timeout}s; saw {seen}")
        try:
            msg = client.messages.get(timeout=remaining)
        except queue.Empty:
            continue
        if msg.topic != topic:
            continue
        seen.append(msg.payload)
        if predicate(msg.payload.decode()):
            return msg


def latest(
    client: Client,
    topic: str,
    current: str | None = None,
    *,
    settle: float = 3 * INTERVAL,
    timeout: float = 5.0,
) -> str:
    """The last value on `topic` (`current` when none comes) once nothing new has arrived for
    `settle` seconds; fails when the value keeps changing for `timeout` seconds."""
    deadline = time.monotonic() + timeout
    values = [] if current is None else [current]
    while True:
        try:
            msg = client.messages.get(timeout=settle)
        except queue.Empty:
            assert values, f"nothing on {topic}"
            return values[-1]
        if msg.topic == topic:
            values.append(msg.payload.decode())
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic} never settled in {timeout}s: {values}")


def test_broker_topics_are_retained_values(sys_node: RunningNode) -> None:
    client = Client(sys_node.mqtt_port, "sys-reader")
    topics = [
        "$SYS/broker/version",
        "$SYS/broker/clients/connected",
        "$SYS/broker/messages/received",
        "$SYS/broker/uptime",
    ]
    for topic in topics:
        assert client.subscribe(topic, 0) == [0]
    got: dict[str, Received] = {}
    deadline = time.monotonic() + 5
    while len(got) < len(topics):
        [msg] = client.expect(1, timeout=max(0.01, deadline - time.monotonic()))
        if msg.retain:
            got.setdefault(msg.topic, msg)
    assert sorted(got) == sorted(topics)
    assert got["$SYS/broker/version"].payload.decode().startswith("mop ")
    assert re.fullmatch(rb"\d+ seconds", got["$SYS/broker/uptime"].payload)
    assert int(got["$SYS/broker/clients/connected"].payload) >= 0
    assert int(got["$SYS/broker/messages/received"].payload) >= 0


def test_sys_topics_are_matched_by_sys_wildcards(sys_node: RunningNode) -> None:
    client = Client(sys_node.mqtt_port, "sys-all")
    client.subscribe("$SYS/broker/#", 0)
    topics = {m.topic for m in client.expect(4)}
    assert all(t.startswith("$SYS/broker/") for t in topics)


def test_clients_connected_follows_connections(sys_node: RunningNode) -> None:
    watch = Client(sys_node.mqtt_port, "sys-watch")
    watch.subscribe("$SYS/broker/clients/connected", 0)
    topic = "$SYS/broker/clients/connected"
    await_value(watch, topic, lambda v: v == "1")
    others = [Client(sys_node.mqtt_port, f"sys-other-{i}") for i in range(3)]
    await_value(watch, topic, lambda v: v == "4")
    for other in others:
        other.disconnect()
    await_value(watch, topic, lambda v: v == "1")


def test_uptime_advances(sys_node: RunningNode) -> None:
    watch = Client(sys_node.mqtt_port, "sys-up")
    watch.subscribe("$SYS/broker/uptime", 0)
    first = int(watch.expect(1)[0].payload.split()[0])
    later = await_value(watch, "$SYS/broker/uptime", lambda v: int(v.split()[0]) > first)
    assert later.retain is False  # a live update to an existing subscription


def test_messages_received_counts_client_publishes(sys_node: RunningNode) -> None:
    topic = "$SYS/broker/messages/received"
    watch = Client(sys_node.mqtt_port, "sys-count")
    watch.subscribe(topic, 0)
    before = int(latest(watch, topic))
    pub = Client(sys_node.mqtt_port, "sys-count-pub")
    for i in range(3):
        pub.publish("count/t", f"{i}".encode(), 1)
    seen = await_value(watch, topic, lambda v: int(v) >= before + 3)
    # Only the three client messages count, not the node's own $SYS updates.
    assert int(latest(watch, topic, seen.payload.decode(), settle=6 * INTERVAL)) == before + 3


def test_idle_node_does_not_republish_unchanged_values(sys_node: RunningNode) -> None:
    watch = Client(sys_node.mqtt_port, "sys-idle")
    watch.subscribe("$SYS/broker/messages/received", 0)
    watch.subscribe("$SYS/broker/clients/connected", 0)
    retained = {m.topic: m.payload.decode() for m in watch.expect(2)}
    topic = "$SYS/broker/messages/received"
    latest(watch, topic, retained[topic])  # let the first updates settle ...
    watch.expect_none(6 * INTERVAL)  # ... then nothing changes while no client does anything


def test_v5_client_cannot_publish_to_sys(sys_node: RunningNode) -> None:
    watch = Client(sys_node.mqtt_port, "sys-guard")
    watch.subscribe("$SYS/broker/fake", 1)
    intruder = Client(sys_node.mqtt_port, "sys-intruder")
    assert intruder.publish("$SYS/broker/fake", b"x", 1) == NOT_AUTHORIZED
    assert intruder.publish("$SYS/broker/version", b"forged", 1, retain=True) == NOT_AUTHORIZED
    intruder.publish("$SYS/broker/fake", b"y", 0)
    intruder.publish("barrier", b"", 1)  # the connection is still served
    watch.expect_none(0.5)
    reader = Client(sys_node.mqtt_port, "sys-reader2")
    reader.subscribe("$SYS/broker/version", 0)
    [msg] = reader.expect(1)
    assert msg.payload.startswith(b"mop ")


def test_v311_client_cannot_publish_to_sys(sys_node: RunningNode) -> None:
    watch = Client(sys_node.mqtt_port, "sys-guard311", version=4)
    watch.subscribe("$SYS/broker/fake", 1)
    intruder = Client(sys_node.mqtt_port, "sys-intruder311", version=4)
    intruder.publish("$SYS/broker/fake", b"ignored", 0)
    intruder.publish("ok/t", b"", 1)  # QoS 0 is dropped silently; the connection stays
    watch.expect_none(0.5)
    intruder.client.publish("$SYS/broker/fake", b"refused", 1)  # 3.1.1 has no refusing ack
    intruder.disconnects.get(timeout=5)  # ... so the server closes the connection
    watch.expect_none(0.3)


def sys_tree(client: Client, *, settle: float = 3 * INTERVAL) -> dict[str, str]:
    """The latest value of every `$SYS` topic `client` subscribed to, once nothing new has come
    for `settle` seconds. (Not for load averages, which change while they decay, nor for the
    counts of messages sent, which `client` itself moves by receiving them.)"""
    values: dict[str, str] = {}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            msg = client.messages.get(timeout=settle)
        except queue.Empty:
            return values
        values[msg.topic] = msg.payload.decode()
    raise AssertionError("the $SYS values never settled")


def seen_within(client: Client, seconds: float) -> dict[str, str]:
    """The latest value of every topic `client` receives within `seconds`."""
    values: dict[str, str] = {}
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            msg = client.messages.get(timeout=remaining)
        except queue.Empty:
            break
        values[msg.topic] = msg.payload.decode()
    return values


def test_the_tree_has_mosquittos_topics(sys_node: RunningNode) -> None:
    client = Client(sys_node.mqtt_port, "sys-tree")
    client.subscribe("$SYS/#", 0)
    values = seen_within(client, 5 * INTERVAL)
    expected = {f"$SYS/broker/{topic}" for topic, _ in COUNTER_TOPICS}
    expected |= {
        f"$SYS/broker/load/{prefix}/{window}"
        for prefix, _ in LOAD_TOPICS
        for window, _ in LOAD_WINDOWS
    }
    expected |= {"$SYS/broker/version", "$SYS/broker/uptime"}
    assert expected <= set(values), expected - set(values)
    assert int(values["$SYS/broker/heap/current"]) > 1 << 20  # the process's RSS
    assert int(values["$SYS/broker/heap/maximum"]) >= int(values["$SYS/broker/heap/current"])
    assert re.fullmatch(r"\d+\.\d\d", values["$SYS/broker/load/connections/15min"])


def test_client_and_subscription_counts_follow_what_clients_do(sys_node: RunningNode) -> None:
    watch = Client(sys_node.mqtt_port, "sys-counts")
    watch.subscribe("$SYS/broker/clients/#", 0)
    watch.subscribe("$SYS/broker/subscriptions/count", 0)
    others = [Client(sys_node.mqtt_port, f"sys-counts-{i}") for i in range(3)]
    for other in others:
        other.subscribe("counts/a", 1)
        other.subscribe("counts/b/#", 0)
    values = sys_tree(watch)
    assert values["$SYS/broker/clients/connected"] == "4"
    assert values["$SYS/broker/clients/maximum"] == "4"
    assert values["$SYS/broker/subscriptions/count"] == str(2 + 3 * 2)
    for other in others:
        other.disconnect()
    values |= sys_tree(watch)
    assert values["$SYS/broker/clients/connected"] == "1"
    assert values["$SYS/broker/clients/maximum"] == "4"  # the most at once, since the start
    assert values["$SYS/broker/clients/total"] == "1"
    assert values["$SYS/broker/subscriptions/count"] == "2"


def test_persistent_sessions_count_while_their_clients_are_away(sys_node: RunningNode) -> None:
    watch = Client(sys_node.mqtt_port, "sys-away-watch")
    watch.subscribe("$SYS/broker/clients/#", 0)
    away = Client(sys_node.mqtt_port, "sys-away", version=4, clean=False)
    away.subscribe("away/t", 1)
    away.disconnect()
    values = sys_tree(watch)
    assert values["$SYS/broker/clients/connected"] == "1"
    assert values["$SYS/broker/clients/disconnected"] == "1"
    assert values["$SYS/broker/clients/total"] == "2"


def test_publish_counters_and_load_follow_messages(sys_node: RunningNode) -> None:
    watch = Client(sys_node.mqtt_port, "sys-load")
    watch.subscribe("$SYS/broker/publish/+/received", 0)
    watch.subscribe("$SYS/broker/retained messages/count", 0)
    before = sys_tree(watch)
    received = int(before["$SYS/broker/publish/messages/received"])
    payload = int(before["$SYS/broker/publish/bytes/received"])
    retained = int(before["$SYS/broker/retained messages/count"])
    pub = Client(sys_node.mqtt_port, "sys-load-pub")
    for _ in range(20):
        pub.publish("load/t", b"x" * 100, 1)
    pub.publish("load/kept", b"kept", 1, retain=True)
    after = before | sys_tree(watch)
    assert int(after["$SYS/broker/publish/messages/received"]) == received + 21
    assert int(after["$SYS/broker/publish/bytes/received"]) == payload + 20 * 100 + 4
    assert int(after["$SYS/broker/retained messages/count"]) == retained + 1
    watch.subscribe("$SYS/broker/load/publish/received/1min", 0)
    await_value(watch, "$SYS/broker/load/publish/received/1min", lambda v: float(v) > 0)


@pytest.mark.skipif(shutil.which("mosquitto_sub") is None, reason="mosquitto_sub not installed")
def test_mosquitto_sub_reads_the_load_averages(sys_node: RunningNode) -> None:
    count = 3 * len(LOAD_TOPICS)
    done = subprocess.run(
        [
            "mosquitto_sub",
            *("-h", "127.0.0.1", "-p", str(sys_node.mqtt_port)),
            *("-t", "$SYS/broker/load/#", "-v", "-C", str(count), "-W", "10"),
        ],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == count
    topics = {line.rpartition(" ")[0] for line in lines}
    assert "$SYS/broker/load/messages/received/1min" in topics
    assert all(re.fullmatch(r"\S.* \d+\.\d\d", line) for line in lines), lines


# -- client events ---------------------------------------------------------------------------

EVENTS = "$SYS/brokers/+/clients/+/+"


def events_of(client: Client, about: str, count: int) -> list[tuple[str, dict[str, object]]]:
    """The next `count` events `client` receives about the client id `about` (others are
    skipped: a watcher's own connection may be told after it subscribed)."""
    got = []
    while len(got) < count:
        [msg] = client.expect(1)
        assert not msg.retain
        event = json.loads(msg.payload)
        if event["clientid"] == about:
            got.append((msg.topic, event))
    return got


def test_events_tell_who_connected_and_why_they_left() -> None:
    settings = node_settings(sys_interval=0, sys_events=True, sys_node_name="edge-1")
    with running_node(settings) as node:
        watch = Client(node.mqtt_port, "ev-watch")
        assert watch.subscribe(EVENTS, 0) == [0]
        dev = Client(node.mqtt_port, "ev/dev", version=4, keepalive=25, username="dana")
        [(topic, event)] = events_of(watch, "ev/dev", 1)
        assert topic == "$SYS/brokers/edge-1/clients/ev%2Fdev/connected"
        assert event["clientid"] == "ev/dev"
        assert event["username"] == "dana"
        assert (event["proto_ver"], event["keepalive"], event["clean_start"]) == (4, 25, True)
        assert event["ipaddress"] == "127.0.0.1"
        assert event["sockport"] == node.mqtt_port
        dev.disconnect()
        [(topic, event)] = events_of(watch, "ev/dev", 1)
        assert topic == "$SYS/brokers/edge-1/clients/ev%2Fdev/disconnected"
        assert event["reason"] == "normal"
        assert event["disconnected_at"] >= event["ts"] > 0  # type: ignore[operator]
        watch.expect_none(0.3)  # nothing more, and nothing twice


def test_no_events_unless_turned_on(sys_node: RunningNode) -> None:
    watch = Client(sys_node.mqtt_port, "ev-off")
    watch.subscribe(EVENTS, 0)
    Client(sys_node.mqtt_port, "ev-off-other").disconnect()
    watch.expect_none(6 * INTERVAL)


def test_events_reach_only_clients_the_acl_lets_read_them(tmp_path: Path) -> None:
    passwords = ""
    for user in ("ops", "stats", "dev"):
        passwords = update_password_file(passwords, user, b"pw")
    (tmp_path / "passwords").write_text(passwords)
    (tmp_path / "acl").write_text(
        "user ops\ntopic read $SYS/#\n\nuser stats\ntopic read $SYS/broker/#\n"
    )
    settings = dataclasses.replace(
        node_settings(sys_interval=0, sys_events=True),
        auth=AuthSettings(
            allow_anonymous=False,
            password_file=str(tmp_path / "passwords"),
            acl_file=str(tmp_path / "acl"),
        ),
    )
    with running_node(settings) as node:
        ops = Client(node.mqtt_port, "ev-ops", username="ops", password="pw")
        stats = Client(node.mqtt_port, "ev-stats", username="stats", password="pw")
        assert ops.subscribe(EVENTS, 0) == [0]
        stats.subscribe(EVENTS, 0)  # refused, or granted and filtered: nothing arrives
        Client(node.mqtt_port, "ev-dev", username="dev", password="pw").disconnect()
        assert [topic.rpartition("/")[2] for topic, _ in events_of(ops, "ev-dev", 2)] == [
            "connected",
            "disconnected",
        ]
        stats.expect_none(0.5)


def test_a_client_id_too_long_for_an_event_topic_harms_no_watcher() -> None:
    """A client id may be up to 65535 bytes, and its "/"s take three each in the event topic:
    an event whose topic no MQTT packet can carry is not published (the watchers' connections
    would fail on it, and a persistent one again after each reconnect)."""
    settings = node_settings(sys_interval=0, sys_events=True, sys_node_name="edge-1")
    with running_node(settings) as node:
        watchers = [Client(node.mqtt_port, f"ev-long-{qos}") for qos in (0, 1)]
        for qos, watcher in enumerate(watchers):
            assert watcher.subscribe(EVENTS, qos) == [qos]
        long = Client(node.mqtt_port, "/" * 25_000, version=4)
        assert long.connack is not None and long.connack.reason_code == 0
        long.disconnect()
        Client(node.mqtt_port, "ev-after", version=4).disconnect()
        for watcher in watchers:
            assert [topic.rpartition("/")[2] for topic, _ in events_of(watcher, "ev-after", 2)] == [
                "connected",
                "disconnected",
            ]
            watcher.disconnect()


def topic_count(node: RunningNode, prefix: str = "") -> int:
    """How many topics the deployment's namespace has (its brokers', for a proxy), by the admin
    API."""
    host, port = node.node.address("admin")
    query = urllib.parse.urlencode({"limit": 1, "prefix": prefix})
    with urllib.request.urlopen(f"http://{host}:{port}/api/v1/topics?{query}", timeout=10) as got:
        total: int = json.loads(got.read())["total"]
    return total


def test_events_leave_no_topic_behind_per_client_id() -> None:
    """Events are notifications: clients that connect and leave make no topic, and store
    nothing, per client id (two each, for every client that ever connected, before), while a
    watcher still hears of each."""
    count = 20
    settings = node_settings(sys_interval=0, sys_events=True, sys_node_name="edge-1")
    with running_node(settings) as node:
        watch = Client(node.mqtt_port, "ev-many-watch", clean=False)
        assert watch.subscribe(EVENTS, 1) == [1]
        before = topic_count(node)
        for index in range(count):
            Client(node.mqtt_port, f"ev-many-{index}").disconnect()
        heard: list[tuple[str, str]] = []
        while len(heard) < 2 * count:
            [msg] = watch.expect(1)
            event = json.loads(msg.payload)
            if (
                str(event["clientid"]).startswith("ev-many-")
                and event["clientid"] != "ev-many-watch"
            ):
                heard.append((str(event["clientid"]), msg.topic.rpartition("/")[2]))
        assert sorted(heard) == sorted(
            (f"ev-many-{index}", kind)
            for index in range(count)
            for kind in ("connected", "disconnected")
        )
        assert topic_count(node) == before
        assert topic_count(node, "$SYS") == 0
        watch.disconnect()
