"""What survives a node restart on the same data directory: retained messages, persistent sessions
(subscriptions, queued and in-flight messages, QoS 2 state, expiry deadlines, delayed wills),
shared subscription backlogs; what a full disk does to publishers; and that the log's disk usage
stays bounded while data flows through the node.

The node runs in a thread (`mop.testing.node`) and is stopped cleanly, like Ctrl-C, then started
again on the same data directory. Crashes (SIGKILL) are in test_crash.py.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes

from mop.broker.storage import durable as durable_module
from mop.broker.storage import segments as segments_module
from mop.protocols.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
)
from mop.protocols.mqtt.serving.server import MqttServer
from mop.settings import RetentionSettings, StorageSettings
from mop.testing.node import RunningNode, node_settings, running_node
from tests.e2e.clients import Client, Received, props, session_present
from tests.e2e.nodeproc import disk_usage
from tests.e2e.raw import RawClient, assert_quiet, recv_publish

pytestmark = pytest.mark.e2e

QUOTA_EXCEEDED = 0x97
SERVER_SHUTTING_DOWN = 0x8B


# -- helpers ---------------------------------------------------------------------------------


class Restartable:
    """A thread node that can be stopped and started again on one data directory."""

    def __init__(
        self,
        data_dir: Path,
        storage: StorageSettings | None = None,
        retention: RetentionSettings | None = None,
        **mqtt: Any,
    ):
        self.data_dir = data_dir
        self.storage = storage or StorageSettings(fsync="always")
        self.retention = retention or RetentionSettings()
        self.mqtt = mqtt

    @contextmanager
    def run(self) -> Iterator[RunningNode]:
        settings = node_settings(data_dir=str(self.data_dir), storage=self.storage, **self.mqtt)
        settings = dataclasses.replace(settings, retention=self.retention)
        with running_node(settings) as node:
            yield node


@pytest.fixture
def restartable(tmp_path: Path) -> Restartable:
    return Restartable(tmp_path / "data")


def mqtt_server(node: RunningNode) -> MqttServer:
    return node.node.protocols["mqtt"].server  # type: ignore[attr-defined, no-any-return]


def offline_sessions(node: RunningNode) -> int:
    return node.call(lambda: len(mqtt_server(node).sessions))


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what or predicate}"
        time.sleep(0.02)


def persistent(port: int, client_id: str, *, version: int = 5, expiry: int = 300) -> Client:
    """A client resuming (or starting) a session that outlives its connection."""
    if version == 5:
        return Client(
            port,
            client_id,
            clean=False,
            connect_properties=props(PacketTypes.CONNECT, SessionExpiryInterval=expiry),
        )
    return Client(port, client_id, version=version, clean=False)


def drain(client: Client, quiet: float = 0.4) -> list[Received]:
    """Whatever arrives until nothing has for `quiet` seconds (bounded)."""
    got: list[Received] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            got.append(client.messages.get(timeout=quiet))
        except queue.Empty:
            return got
    raise AssertionError(f"messages kept arriving for 10 s: {len(got)}")


def by_topic(messages: list[Received]) -> dict[str, list[tuple[bytes, int]]]:
    topics: dict[str, list[tuple[bytes, int]]] = {}
    for m in messages:
        topics.setdefault(m.topic, []).append((m.payload, m.qos))
    return topics


def raw_session(port: int, client_id: str, *, expiry: int = 300) -> tuple[RawClient, Connack]:
    client = RawClient(port, level=5)
    connack = client.connect(
        client_id, clean_start=False, properties=Properties(session_expiry_interval=expiry)
    )
    assert connack.reason_code == 0, connack
    return client, connack


def raw_connect(port: int, client_id: str, *, timeout: float) -> tuple[Connack | None, RawClient]:
    """CONNECT resuming a session; the CONNACK, or None when the server closed the connection
    without one (AssertionError when nothing happens within `timeout`)."""
    client = RawClient(port, level=5)
    client.send(
        Connect(
            client_id,
            protocol_level=5,
            clean_start=False,
            properties=Properties(session_expiry_interval=300),
        )
    )
    packet = client.recv(timeout=timeout)
    assert packet is None or isinstance(packet, Connack), packet
    return packet, client


def raw_subscribe(client: RawClient, topic_filter: str, qos: int, packet_id: int = 1) -> None:
    client.send(Subscribe(packet_id, (SubscriptionRequest(topic_filter, qos),)))
    suback = client.recv()
    assert isinstance(suback, Suback) and suback.reason_codes == (qos,), suback


# -- retained messages -----------------------------------------------------------------------


def retained_now(port: int, client_id: str, expected: int) -> dict[str, Received]:
    """Subscribe to everything retained under r/ and return it by topic (and check no more)."""
    client = Client(port, client_id)
    client.subscribe("r/#", 1)
    got = {m.topic: m for m in client.expect(expected)}
    client.expect_none(0.4)
    client.disconnect()
    assert all(m.retain for m in got.values()), got
    return got


def test_retained_messages_survive_restarts(restartable: Restartable) -> None:
    with restartable.run() as node:
        pub = Client(node.mqtt_port, "r-pub")
        properties = props(ContentType="text/plain", UserProperty=[("k", "v")])
        pub.publish("r/a", b"a1", 1, retain=True, properties=properties)
        pub.publish("r/b", b"b1", 1, retain=True)
        pub.publish("r/b", b"b2", 1, retain=True)  # replaced
        pub.publish("r/c", b"c1", 1, retain=True)
        pub.publish("r/c", b"", 1, retain=True)  # cleared
        pub.publish("r/d", b"d0", 0, retain=True)  # QoS 0 is retained too
        pub.publish("r/barrier", b"", 1)  # everything above is processed once this is acked
        pub.disconnect()

    with restartable.run() as node:
        got = retained_now(node.mqtt_port, "r-check-1", 3)
        assert {t: m.payload for t, m in got.items()} == {"r/a": b"a1", "r/b": b"b2", "r/d": b"d0"}
        assert got["r/a"].qos == 1 and got["r/d"].qos == 0
        assert got["r/a"].properties.ContentType == "text/plain"
        assert ("k", "v") in got["r/a"].properties.UserProperty
        pub = Client(node.mqtt_port, "r-pub")
        pub.publish("r/a", b"", 1, retain=True)  # cleared after a restart
        pub.publish("r/b", b"b3", 1, retain=True)  # replaced after a restart
        pub.disconnect()

    with restartable.run() as node:
        got = retained_now(node.mqtt_port, "r-check-2", 2)
        assert {t: m.payload for t, m in got.items()} == {"r/b": b"b3", "r/d": b"d0"}


# -- persistent sessions ---------------------------------------------------------------------


@pytest.mark.parametrize("version", [4, 5])
def test_session_subscriptions_and_queue_survive_a_restart(
    restartable: Restartable, version: int
) -> None:
    with restartable.run() as node:
        sub = persistent(node.mqtt_port, "ps-sub", version=version)
        assert not session_present(sub)
        assert sub.subscribe("ps/+/x", 1) == [1]
        assert sub.subscribe("ps/exact", 2) == [2]
        sub.disconnect()
        pub = Client(node.mqtt_port, "ps-pub", version=version)
        for i in range(3):
            pub.publish("ps/a/x", f"before-{i}".encode(), 1)
        pub.publish("ps/exact", b"before-q2", 2)
        pub.publish("ps/other", b"not subscribed", 1)
        pub.disconnect()

    with restartable.run() as node:
        # Queued across the restart, and more while the client is still away.
        pub = Client(node.mqtt_port, "ps-pub", version=version)
        for i in range(3):
            pub.publish("ps/b/x", f"after-{i}".encode(), 1)
        pub.publish("ps/exact", b"after-q2", 2)
        sub = persistent(node.mqtt_port, "ps-sub", version=version)
        assert session_present(sub)
        got = sub.expect(8)
        # In order per topic (topics take turns, so only per topic).
        assert by_topic(got) == {
            "ps/a/x": [(b"before-0", 1), (b"before-1", 1), (b"before-2", 1)],
            "ps/b/x": [(b"after-0", 1), (b"after-1", 1), (b"after-2", 1)],
            "ps/exact": [(b"before-q2", 2), (b"after-q2", 2)],
        }
        sub.expect_none(0.3)
        # The resumed subscriptions are live: new messages arrive with the granted QoS.
        pub.publish("ps/c/x", b"live", 2)
        pub.publish("ps/exact", b"live-q2", 2)
        got = sub.expect(2)
        assert [(m.topic, m.payload, m.qos) for m in got] == [
            ("ps/c/x", b"live", 1),
            ("ps/exact", b"live-q2", 2),
        ]
        sub.expect_none(0.3)


def test_a_session_connected_at_shutdown_resumes_after_restart(restartable: Restartable) -> None:
    with restartable.run() as node:
        sub = persistent(node.mqtt_port, "conn-sub")
        sub.subscribe("conn/t", 1)
        Client(node.mqtt_port, "conn-pub").publish("conn/t", b"delivered before", 1)
        assert sub.expect(1)[0].payload == b"delivered before"
        # Its PUBACK reached the node before it stops (the client sends it after the
        # message is handed over): only then is the message acknowledged.
        wait_until(
            lambda: node.call(lambda: mqtt_server(node).counts().inflight) == 0,
            what="the PUBACK to be taken",
        )
    sub.disconnects.get(timeout=5)
    sub.close()

    with restartable.run() as node:
        Client(node.mqtt_port, "conn-pub").publish("conn/t", b"while away", 1)
        sub = persistent(node.mqtt_port, "conn-sub")
        assert session_present(sub)
        assert [m.payload for m in sub.expect(1)] == [b"while away"]
        Client(node.mqtt_port, "conn-pub2").publish("conn/t", b"live", 1)
        assert [m.payload for m in sub.expect(1)] == [b"live"]
        sub.expect_none(0.3)  # nothing acknowledged before the restart comes back


def test_clients_are_told_when_the_node_shuts_down(restartable: Restartable) -> None:
    with restartable.run() as node:
        raw = RawClient(node.mqtt_port, level=5)
        assert raw.connect("bye").reason_code == 0
        raw_subscribe(raw, "bye/t", 1)
    assert raw.recv_until_closed(timeout=5) == [Disconnect(reason_code=SERVER_SHUTTING_DOWN)]


def test_unacknowledged_qos1_messages_are_resent_after_restart(restartable: Restartable) -> None:
    with restartable.run() as node:
        sub, _ = raw_session(node.mqtt_port, "if-sub")
        raw_subscribe(sub, "if/t", 1)
        pub = Client(node.mqtt_port, "if-pub")
        for i in range(4):
            pub.publish("if/t", f"m{i}".encode(), 1)
        first = [recv_publish(sub) for _ in range(4)]
        assert [p.payload for p in first] == [b"m0", b"m1", b"m2", b"m3"]
        assert first[0].packet_id is not None
        sub.send(Puback(first[0].packet_id))  # only the first is acknowledged
        pub.publish("if/t", b"m4", 1)  # processed after the PUBACK above
        first.append(recv_publish(sub))
        assert first[-1].payload == b"m4"
        sub.close()
        wait_until(lambda: offline_sessions(node) == 1, what="the session to go offline")

    with restartable.run() as node:
        sub, connack = raw_session(node.mqtt_port, "if-sub")
        assert connack.session_present
        again = [recv_publish(sub) for _ in range(4)]
        # Resent in order, flagged as duplicates, with their original packet identifiers.
        assert [p.payload for p in again] == [b"m1", b"m2", b"m3", b"m4"]
        assert all(p.dup and p.qos == 1 for p in again), again
        assert [p.packet_id for p in again] == [p.packet_id for p in first[1:]]
        for packet in again:
            assert packet.packet_id is not None
            sub.send(Puback(packet.packet_id))
        assert_quiet(sub)
        sub.close()
        wait_until(lambda: offline_sessions(node) == 1, what="the session to go offline")

    with restartable.run() as node:
        sub, connack = raw_session(node.mqtt_port, "if-sub")
        assert connack.session_present
        assert_quiet(sub)  # acknowledged after the restart: not sent a third time


def test_qos2_state_survives_a_restart(restartable: Restartable) -> None:
    with restartable.run() as node:
        watcher = persistent(node.mqtt_port, "q2-watcher")
        watcher.subscribe("q2/in", 2)
        # Outbound: PUBREC received, PUBREL sent, PUBCOMP missing when the node stops.
        sub, _ = raw_session(node.mqtt_port, "q2-sub")
        raw_subscribe(sub, "q2/out", 2)
        Client(node.mqtt_port, "q2-pub").publish("q2/out", b"released", 2)
        delivered = recv_publish(sub)
        assert delivered.qos == 2 and delivered.packet_id is not None
        sub.send(Pubrec(delivered.packet_id))
        assert sub.recv() == Pubrel(delivered.packet_id)
        # Inbound: PUBLISH answered with PUBREC, PUBREL not sent yet.
        pub, _ = raw_session(node.mqtt_port, "q2-raw-pub")
        pub.send(Publish("q2/in", b"once", 2, packet_id=7))
        assert pub.recv() == Pubrec(7)
        assert [m.payload for m in watcher.expect(1)] == [b"once"]
        sub.close()
        pub.close()
        wait_until(lambda: offline_sessions(node) == 2, what="both sessions to go offline")

    with restartable.run() as node:
        sub, connack = raw_session(node.mqtt_port, "q2-sub")
        assert connack.session_present
        # The PUBREL is resent with its packet identifier; the PUBLISH is not.
        assert sub.recv() == Pubrel(delivered.packet_id)
        sub.send(Pubcomp(delivered.packet_id))
        assert_quiet(sub)

        pub, connack = raw_session(node.mqtt_port, "q2-raw-pub")
        assert connack.session_present
        # As if our PUBREC had been lost: the resent PUBLISH is recognised, not published again.
        pub.send(Publish("q2/in", b"once", 2, dup=True, packet_id=7))
        assert pub.recv() == Pubrec(7)
        pub.send(Pubrel(7))
        assert pub.recv() == Pubcomp(7)  # reason 0: the packet id was known
        watcher = persistent(node.mqtt_port, "q2-watcher")
        assert session_present(watcher)
        watcher.expect_none(0.5)


# -- session expiry and delayed wills across a restart ---------------------------------------


def test_session_expiry_counts_across_a_restart(restartable: Restartable) -> None:
    with restartable.run() as node:
        for client_id, expiry in [("exp-2", 2), ("exp-4", 4), ("exp-60", 60)]:
            client = persistent(node.mqtt_port, client_id, expiry=expiry)
            client.subscribe("exp/t", 1)
            client.disconnect()
        disconnected = time.monotonic()
        Client(node.mqtt_port, "exp-pub").publish("exp/t", b"queued", 1)
    # Down until exp-2's deadline has passed, and back before exp-4's.
    time.sleep(max(0.0, disconnected + 2.6 - time.monotonic()))

    with restartable.run() as node:
        # Back before exp-4's deadline, or this test could not tell a re-armed expiry timer
        # from a session that expired while the node was down.
        assert time.monotonic() < disconnected + 3.9, "restart too slow for this test"
        wait_until(lambda: offline_sessions(node) == 2, what="exp-2 to be gone")
        gone = persistent(node.mqtt_port, "exp-2", expiry=60)
        assert not session_present(gone)
        gone.expect_none(0.3)
        # exp-4 is still alive now; its expiry was re-armed at the restart.
        time.sleep(max(0.0, disconnected + 4.5 - time.monotonic()))
        wait_until(lambda: offline_sessions(node) == 1, what="exp-4 to expire")
        later = persistent(node.mqtt_port, "exp-4", expiry=60)
        assert not session_present(later)
        alive = persistent(node.mqtt_port, "exp-60")
        assert session_present(alive)
        assert [m.payload for m in alive.expect(1)] == [b"queued"]
        Client(node.mqtt_port, "exp-pub").publish("exp/t", b"new", 1)
        assert [m.payload for m in alive.expect(1)] == [b"new"]
        for client in (gone, later):  # their subscriptions went with their sessions
            client.expect_none(0.3)


def test_delayed_wills_are_published_after_a_restart(restartable: Restartable) -> None:
    with restartable.run() as node:
        watcher = persistent(node.mqtt_port, "will-watcher")
        watcher.subscribe("will/#", 1)
        watcher.disconnect()
        clients = {}
        for name, delay in [("short", 1), ("long", 4)]:
            clients[name] = Client(
                node.mqtt_port,
                f"will-{name}",
                clean=False,
                will=(f"will/{name}", f"{name} is gone".encode(), 1, False),
                will_properties=props(PacketTypes.WILLMESSAGE, WillDelayInterval=delay),
                connect_properties=props(PacketTypes.CONNECT, SessionExpiryInterval=60),
            )
        for client in clients.values():
            client.drop()
        dropped = time.monotonic()
        wait_until(lambda: offline_sessions(node) == 3, what="the will clients to go offline")
    # Down past the short delay.
    time.sleep(max(0.0, dropped + 1.5 - time.monotonic()))

    with restartable.run() as node:
        watcher = persistent(node.mqtt_port, "will-watcher")
        assert session_present(watcher)
        [short] = watcher.expect(1, timeout=5)
        assert (short.topic, short.payload) == ("will/short", b"short is gone")
        assert time.monotonic() < dropped + 3.8, "the short will came late"
        [long] = watcher.expect(1, timeout=dropped + 10 - time.monotonic())
        arrived = time.monotonic()
        assert (long.topic, long.payload) == ("will/long", b"long is gone")
        assert arrived >= dropped + 4 - 0.25, f"the long will came early: {arrived - dropped:.2f}s"
        watcher.expect_none(0.5)


# -- shared subscriptions --------------------------------------------------------------------


def test_shared_subscription_backlog_survives_a_restart(restartable: Restartable) -> None:
    with restartable.run() as node:
        for member in ("sh-1", "sh-2"):
            client = persistent(node.mqtt_port, member)
            client.subscribe("$share/g/sh/t", 1)
            client.disconnect()
        pub = Client(node.mqtt_port, "sh-pub")
        for i in range(10):
            pub.publish("sh/t", f"{i}".encode(), 1)

    with restartable.run() as node:
        pub = Client(node.mqtt_port, "sh-pub")
        for i in range(10, 15):
            pub.publish("sh/t", f"{i}".encode(), 1)
        member = persistent(node.mqtt_port, "sh-1")
        assert session_present(member)
        got = member.expect(15)
        assert [m.payload for m in got] == [f"{i}".encode() for i in range(15)]
        other = persistent(node.mqtt_port, "sh-2")
        assert session_present(other)
        other.expect_none(0.3)
        pub.publish("sh/t", b"live", 1)
        everyone = drain(member) + drain(other)
        assert [m.payload for m in everyone] == [b"live"]


# -- a full disk -----------------------------------------------------------------------------


@pytest.fixture
def full(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """While the event is set, every write to the log fails with ENOSPC (as the storage unit
    tests simulate a full disk); the storage's back-off after ENOSPC is shortened to 0.2 s."""
    monkeypatch.setattr(durable_module, "_FULL_BACKOFF", 0.2)
    event = threading.Event()
    real_pwrite = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if event.is_set():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(segments_module.os, "pwrite", pwrite)
    return event


def test_a_full_disk_refuses_publishes_and_the_node_keeps_serving(
    restartable: Restartable, full: threading.Event
) -> None:
    with restartable.run() as node:
        port = node.mqtt_port
        keeper = persistent(port, "df-keeper")
        keeper.subscribe("df/#", 1)
        keeper.disconnect()
        sub = Client(port, "df-sub")
        sub.subscribe("df/#", 1)
        pub = Client(port, "df-pub")
        assert pub.publish("df/t", b"before", 1) == 0
        assert sub.expect(1)[0].payload == b"before"

        full.set()
        assert pub.publish("df/t", b"refused-1", 1) == QUOTA_EXCEEDED
        assert pub.publish("df/t", b"refused-2", 1) == QUOTA_EXCEEDED
        raw = RawClient(port, level=5)
        assert raw.connect("df-raw").reason_code == 0
        raw.send(Publish("df/t", b"refused-q2", 2, packet_id=3))
        pubrec = raw.recv()
        assert isinstance(pubrec, Pubrec) and pubrec.reason_code == QUOTA_EXCEEDED, pubrec
        # Still serving: a newcomer connects, subscribes and gets the same clear answer.
        other = Client(port, "df-other")
        assert other.subscribe("df-other/#", 1) == [1]
        assert other.publish("df/t", b"refused-3", 1) == QUOTA_EXCEEDED
        assert pub.disconnects.empty() and sub.disconnects.empty()

        full.clear()
        deadline = time.monotonic() + 5
        while (code := pub.publish("df/t", b"after", 1)) != 0:
            assert code == QUOTA_EXCEEDED, hex(code)
            assert time.monotonic() < deadline, "publishing did not recover"
            time.sleep(0.1)
        assert other.publish("df-other/x", b"fine", 1) == 0
        assert [m.payload for m in other.expect(1)] == [b"fine"]
        # Acknowledged messages arrive. Refused ones may too: the storage keeps a failed batch
        # queued and writes it once it can (a QoS 1 publisher retrying makes a duplicate).
        got = [m.payload for m in drain(sub)]
        refused = {b"refused-1", b"refused-2", b"refused-3", b"refused-q2"}
        assert got[-1] == b"after" and set(got) <= refused | {b"after"}, got
        for client in (pub, sub, other):
            client.disconnect()
        raw.close()

    with restartable.run() as node:
        storage = node.node.processor.backend.storage  # type: ignore[attr-defined]
        assert storage.recovery.truncated == 0
        keeper = persistent(node.mqtt_port, "df-keeper")
        assert session_present(keeper)
        got = [m.payload for m in drain(keeper)]
        assert got[0] == b"before" and got[-1] == b"after", got
        assert got.count(b"before") == 1, got  # the retried batch did not write it again


def test_a_session_resumed_while_the_disk_is_full_is_kept(
    restartable: Restartable, full: threading.Event
) -> None:
    with restartable.run() as node:
        keeper = persistent(node.mqtt_port, "full-keeper")
        keeper.subscribe("full/t", 1)
        keeper.disconnect()
        assert Client(node.mqtt_port, "full-pub").publish("full/t", b"queued", 1) == 0

        full.set()
        refused, _ = raw_connect(node.mqtt_port, "full-keeper", timeout=3)
        # Refused (ideally CONNACK 0x97) or cut off: either way the session must be kept.
        assert refused is None or refused.reason_code >= 0x80, refused
        full.clear()
        time.sleep(0.3)  # past the storage's back-off after ENOSPC

        connack, raw = raw_connect(node.mqtt_port, "full-keeper", timeout=3)
        assert connack is not None and connack.reason_code == 0, connack
        assert connack.session_present
        assert recv_publish(raw).payload == b"queued"


# -- disk usage while data flows -------------------------------------------------------------

SEGMENT = 1 << 20
PAYLOAD = 32 * 1024
TOTAL = 30 * 1000 * 1000
# Acknowledged data is trimmed about once a second and whole segments are reclaimed about once
# a second after that, so the log holds roughly two seconds of traffic plus a couple of
# segments. The publisher is paced so that this stays well under the bound; without reclaim the
# data directory would grow to the full 30 MB.
RATE = 2.5e6  # bytes per second
BOUND = 8 << 20


class Sampler:
    """The data directory's size, sampled every 20 ms in a thread (bounded by `stop`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.samples.append(disk_usage(self.path))


def test_disk_usage_stays_bounded_while_data_flows(tmp_path: Path) -> None:
    data = tmp_path / "data"
    # No grace (a new topic keeps its first seconds on purpose, tests/unit/broker/test_grace.py)
    # and no retention (tests/e2e/test_retention.py bounds the disk by a policy): this test is
    # about reclaiming acknowledged data as it flows.
    settings = StorageSettings(fsync="always", segment_bytes=SEGMENT, unsubscribed_grace=0)
    node_dir = Restartable(data, settings, RetentionSettings(time_seconds=0, size_bytes=0))
    count = TOTAL // PAYLOAD
    batch = 16
    with node_dir.run() as node, Sampler(data) as sampler:
        sub = persistent(node.mqtt_port, "ret-sub")
        sub.subscribe("ret/#", 1)
        pub = Client(node.mqtt_port, "ret-pub")
        received = 0
        started = time.monotonic()
        for first in range(0, count, batch):
            last = min(count, first + batch)
            for i in range(first, last):
                payload = i.to_bytes(4, "big") * (PAYLOAD // 4)
                assert pub.publish("ret/t", payload, 1) == 0
            # The subscriber keeps up: everything published so far is consumed, in order.
            for message in sub.expect(last - received, timeout=15):
                assert message.payload[:4] == received.to_bytes(4, "big"), "out of order"
                received += 1
            time.sleep(max(0.0, started + last * PAYLOAD / RATE - time.monotonic()))
        elapsed = time.monotonic() - started
        # Acknowledged data is reclaimed without new traffic, too.
        wait_until(lambda: disk_usage(data) < 3 * SEGMENT, timeout=10, what="reclaim at rest")
        rest = disk_usage(data)
    peak = max(sampler.samples)
    print(
        f"published {count} x {PAYLOAD} B = {count * PAYLOAD / 1e6:.1f} MB in {elapsed:.1f} s;"
        f" data dir peak {peak / 2**20:.2f} MiB over {len(sampler.samples)} samples,"
        f" at rest {rest / 2**20:.2f} MiB"
    )
    assert received == count
    assert peak < BOUND, f"data dir grew to {peak / 2**20:.1f} MiB"


def test_delivering_qos2_backlog_does_not_amplify_writes(restartable: Restartable) -> None:
    count = 1000
    with restartable.run() as node:
        storage = node.node.processor.backend.storage  # type: ignore[attr-defined]
        sub = persistent(node.mqtt_port, "amp-sub")
        sub.subscribe("amp/t", 2)
        sub.disconnect()
        pub = Client(node.mqtt_port, "amp-pub")
        for _ in range(count):
            pub.client.publish("amp/t", b"x" * 100, 2)  # not waiting for each PUBCOMP
        pub.publish("amp/barrier", b"", 2)  # processed after all of them
        before = node.call(storage.disk_bytes)
        sub = persistent(node.mqtt_port, "amp-sub")
        assert len(sub.expect(count, timeout=30)) == count
        grown = node.call(storage.disk_bytes) - before
    print(f"delivering {count} QoS 2 messages of 100 B wrote {grown / 1e6:.2f} MB to the log")
    # The messages themselves are already in the log; delivering them writes state (cursor
    # acknowledgements, packet ids in flight) that should stay within a small multiple.
    assert grown < 2_000_000, f"{grown / 1e6:.1f} MB written to deliver {count * 100 / 1e6} MB"
