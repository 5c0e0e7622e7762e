"""Crash tests: a real `mop run` process killed with SIGKILL, then started again on its data
directory. Whatever the node acknowledged before it died must still be there: QoS 1 messages at
least once and QoS 2 messages exactly once to a persistent subscriber, in order per topic;
retained messages; sessions with their subscriptions, queues and deadlines. A torn tail is cut
off at recovery and the node serves again.

The kill moments are random; the seed is printed, and CRASH_SEED=<seed> repeats a run.
"""

from __future__ import annotations

import os
import queue
import random
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes

from mop.broker.storage.records import FRAME
from tests.e2e.clients import Client, Received, props, session_present
from tests.e2e.nodeproc import NodeProcess, segment_files

pytestmark = pytest.mark.e2e

ROUNDS = 3
PUBLISHERS = 3
LIMIT = 2000  # messages per publisher and round (it is usually killed long before)
PUBLISH_DEADLINE = 20.0
WINDOW = 32  # messages in flight per publisher
DRAIN_TIMEOUT = 30.0
STALL = 5.0  # seconds without a message that end the wait for missing ones
PADDING = b"." * 64
PAYLOAD = re.compile(rb"^(?P<tag>[^:]+):(?P<n>\d+):")
PUBREC_LOG = re.compile(r"Received PUBREC \(Mid: (\d+)\)")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    # Offline queues far above what a round publishes: nothing may be dropped by the bound.
    process = NodeProcess(tmp_path / "data", MOP_MQTT__MAX_QUEUED_MESSAGES="100000")
    yield process
    process.close()


@pytest.fixture
def rng() -> random.Random:
    seed = int(os.environ.get("CRASH_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)
    print(f"CRASH_SEED={seed}")
    return random.Random(seed)


def persistent(port: int, client_id: str, *, expiry: int = 300, **kwargs: Any) -> Client:
    return Client(
        port,
        client_id,
        clean=False,
        connect_properties=props(PacketTypes.CONNECT, SessionExpiryInterval=expiry),
        **kwargs,
    )


# -- a publisher that keeps a window of messages in flight -----------------------------------


class Publisher:
    """A paho MQTT 5 client publishing numbered messages to one topic, up to WINDOW in flight.

    It records which packet ids were acknowledged: PUBACK (QoS 1), or PUBREC and PUBCOMP
    (QoS 2; paho reports PUBREC only in its log). Packet ids are mapped back to message numbers
    once publishing has stopped, so the callbacks never wait for the publishing thread.
    """

    def __init__(self, port: int, client_id: str, topic: str, qos: int, tag: str) -> None:
        self.topic, self.qos, self.tag = topic, qos, tag
        self.numbers: dict[int, int] = {}  # packet id -> message number
        self.completed: list[tuple[int, int]] = []  # (packet id, reason code)
        self.pubrecs: list[int] = []
        self.connected = threading.Event()
        self.gone = threading.Event()
        client = self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=MQTTProtocolVersion.MQTTv5,
            reconnect_on_failure=False,
        )
        client.max_inflight_messages_set(WINDOW)
        client.on_connect = lambda *args: self.connected.set()
        client.on_disconnect = lambda *args: self.gone.set()
        client.on_publish = self._on_publish
        client.on_log = self._on_log
        client.connect("127.0.0.1", port, clean_start=True)
        client.loop_start()
        assert self.connected.wait(10), f"{client_id}: no CONNACK"
        self.thread = threading.Thread(target=self._publish, daemon=True)

    def _on_publish(self, client: Any, userdata: Any, mid: int, rc: Any, properties: Any) -> None:
        self.completed.append((mid, int(rc.value)))

    def _on_log(self, client: Any, userdata: Any, level: int, text: str) -> None:
        if match := PUBREC_LOG.match(text):
            self.pubrecs.append(int(match[1]))

    def _publish(self) -> None:
        deadline = time.monotonic() + PUBLISH_DEADLINE
        for n in range(LIMIT):
            while len(self.numbers) - len(self.completed) >= WINDOW:
                if self.gone.is_set() or time.monotonic() > deadline:
                    return
                time.sleep(0.0005)
            if self.gone.is_set() or time.monotonic() > deadline:
                return
            payload = b"%s:%d:%s" % (self.tag.encode(), n, PADDING)
            info = self.client.publish(self.topic, payload, self.qos)
            self.numbers[info.mid] = n
            if info.rc != paho.MQTT_ERR_SUCCESS:
                return

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        """After the node died: stop the network loop (bounded) and release the socket."""
        assert self.gone.wait(10), "the publisher never noticed the node had gone"
        self.thread.join(10)
        assert not self.thread.is_alive()
        self.client.loop_stop()
        self.client._reset_sockets()

    def acknowledged(self) -> set[int]:
        """Numbers of the messages the node acknowledged (after `finish`)."""
        failed = {mid for mid, code in self.completed if code >= 0x80}
        acked = {mid for mid, code in self.completed if code < 0x80}
        if self.qos == 2:
            pubrecs = set(self.pubrecs)
            assert acked <= pubrecs, "PUBREC not seen in paho's log: did its format change?"
            acked |= pubrecs - failed
        return {self.numbers[mid] for mid in acked}

    def attempted(self) -> int:
        return len(self.numbers)


@dataclass
class Round:
    tag: str
    delay: float
    acked: dict[str, set[int]] = field(default_factory=dict)
    attempted: dict[str, int] = field(default_factory=dict)


def summary(pairs: set[tuple[str, int]]) -> str:
    """`pairs` of (topic, number) in a few words: a count and the first numbers per topic."""
    topics: dict[str, list[int]] = {}
    for topic, n in pairs:
        topics.setdefault(topic, []).append(n)
    parts = [f"{t}: {sorted(ns)[:8]}{'...' if len(ns) > 8 else ''}" for t, ns in topics.items()]
    return f"{len(pairs)} ({'; '.join(sorted(parts))})"


def collect(
    sub: Client, expected: dict[str, set[int]], tag: str, quiet: float = 0.7
) -> list[Received]:
    """Messages for `sub` until every expected (topic, number) of round `tag` arrived and then
    nothing more for `quiet` seconds. Fails when nothing arrives for STALL seconds while some
    are missing, or after DRAIN_TIMEOUT."""
    got: list[Received] = []
    missing = {(topic, n) for topic, numbers in expected.items() for n in numbers}
    deadline = time.monotonic() + DRAIN_TIMEOUT
    last = time.monotonic()
    while True:
        now = time.monotonic()
        if now > deadline or now - last > STALL:
            raise AssertionError(
                f"acknowledged messages never arrived: {summary(missing)};"
                f" {len(got)} messages arrived"
            )
        try:
            message = sub.messages.get(timeout=quiet)
        except queue.Empty:
            if not missing:
                return got
            continue
        last = time.monotonic()
        got.append(message)
        match = PAYLOAD.match(message.payload)
        assert match is not None, message
        if match["tag"].decode() == tag:
            missing.discard((message.topic, int(match["n"])))


def check_round(
    qos: int, round_: Round, got: list[Received], seen: set[tuple[str, str, int]]
) -> dict[str, int]:
    """Every acknowledged message arrived, in order per topic, with no gap; QoS 2 exactly once.
    Returns the number of duplicates per topic (QoS 1 may have some)."""
    per_topic: dict[str, list[int]] = {topic: [] for topic in round_.acked}
    duplicates = dict.fromkeys(round_.acked, 0)
    for message in got:
        match = PAYLOAD.match(message.payload)
        assert match is not None
        key = (message.topic, match["tag"].decode(), int(match["n"]))
        assert message.qos == qos, message
        if key in seen:
            assert qos == 1, f"QoS 2 message delivered twice: {key}"
            duplicates[message.topic] = duplicates.get(message.topic, 0) + 1
            continue
        seen.add(key)
        assert key[1] == round_.tag, f"a message of another round arrived for the first time: {key}"
        per_topic[message.topic].append(key[2])
    for topic, numbers in per_topic.items():
        acked = round_.acked[topic]
        # Stored messages of a topic are a prefix of what its publisher sent: in order, no gap.
        if numbers != list(range(len(numbers))):
            wrong = next(i for i, n in enumerate(numbers) if n != i)
            raise AssertionError(f"{topic}: out of order or gap at {wrong}: {numbers[wrong:][:10]}")
        assert len(numbers) <= round_.attempted[topic], f"{topic}: more than was published"
        lost = {(topic, n) for n in acked - set(numbers)}
        assert not lost, f"acknowledged but lost: {summary(lost)}"
    return duplicates


@pytest.mark.parametrize("qos", [1, 2])
def test_acknowledged_messages_survive_sigkill(
    node: NodeProcess, rng: random.Random, qos: int
) -> None:
    port = node.start()
    sub = persistent(port, "crash-sub")
    assert sub.subscribe("crash/+", qos) == [qos]
    sub.disconnect()
    seen: set[tuple[str, str, int]] = set()
    for number in range(ROUNDS):
        round_ = Round(tag=f"r{number}", delay=rng.uniform(0.2, 1.5))
        publishers = [
            Publisher(port, f"crash-pub-{i}", f"crash/{i}", qos, round_.tag)
            for i in range(PUBLISHERS)
        ]
        for publisher in publishers:
            publisher.start()
        time.sleep(round_.delay)
        node.kill()
        for publisher in publishers:
            publisher.finish()
            round_.acked[publisher.topic] = publisher.acknowledged()
            round_.attempted[publisher.topic] = publisher.attempted()
        assert any(round_.acked.values()), "nothing was acknowledged before the kill"

        port = node.start()
        recovered = node.recovery()
        sub = persistent(port, "crash-sub")
        assert session_present(sub)
        got = collect(sub, round_.acked, round_.tag)
        duplicates = check_round(qos, round_, got, seen)
        sub.disconnect()
        print(
            f"qos {qos} round {number}: killed after {round_.delay:.2f} s;"
            f" attempted {sum(round_.attempted.values())},"
            f" acknowledged {sum(map(len, round_.acked.values()))},"
            f" delivered {len(got)} ({sum(duplicates.values())} duplicates);"
            f" recovery: {recovered[0]}"
        )
    node.stop()


# -- retained messages, sessions and deadlines ------------------------------------------------


def test_retained_messages_and_sessions_survive_sigkill(node: NodeProcess) -> None:
    port = node.start()
    pub = Client(port, "ks-pub")
    pub.publish("ks/r/a", b"a1", 1, retain=True)
    pub.publish("ks/r/b", b"b1", 1, retain=True)
    pub.publish("ks/r/b", b"b2", 1, retain=True)
    pub.publish("ks/r/c", b"c1", 1, retain=True)
    pub.publish("ks/r/c", b"", 1, retain=True)
    for client_id, expiry in [("ks-sub", 300), ("ks-short", 2)]:
        client = persistent(port, client_id, expiry=expiry)
        client.subscribe("ks/t/#", 1)
        client.subscribe("$share/g/ks/s", 1)
        client.disconnect()
    disconnected = time.monotonic()
    for i in range(5):
        pub.publish(f"ks/t/{i % 2}", f"{i}".encode(), 1)
        pub.publish("ks/s", f"s{i}".encode(), 1)
    node.kill()
    pub.close()
    # ks-short's session ends while the node is down.
    time.sleep(max(0.0, disconnected + 2.5 - time.monotonic()))

    port = node.start()
    retained = Client(port, "ks-check")
    retained.subscribe("ks/r/#", 1)
    got = {m.topic: m.payload for m in retained.expect(2)}
    assert got == {"ks/r/a": b"a1", "ks/r/b": b"b2"}
    retained.expect_none(0.3)

    short = persistent(port, "ks-short")
    assert not session_present(short)
    sub = persistent(port, "ks-sub")
    assert session_present(sub)
    received = sub.expect(10)
    per_topic: dict[str, list[bytes]] = {}
    for message in received:
        per_topic.setdefault(message.topic, []).append(message.payload)
    assert per_topic == {
        "ks/t/0": [b"0", b"2", b"4"],
        "ks/t/1": [b"1", b"3"],
        "ks/s": [b"s0", b"s1", b"s2", b"s3", b"s4"],  # the shared group's backlog is all its own
    }
    sub.expect_none(0.3)
    Client(port, "ks-pub2").publish("ks/t/live", b"live", 1)
    assert [m.payload for m in sub.expect(1)] == [b"live"]
    short.expect_none(0.3)
    node.stop()


def test_a_session_connected_at_the_crash_counts_from_the_restart(node: NodeProcess) -> None:
    port = node.start()
    watcher = persistent(port, "cw-watcher")
    watcher.subscribe("cw/will", 1)
    watcher.disconnect()
    # Both connected when the node dies: their expiry and will delay count from the restart.
    alive = persistent(port, "cw-alive", expiry=3)
    alive.subscribe("cw/t", 1)
    persistent(
        port,
        "cw-will",
        expiry=2,
        will=("cw/will", b"cw-will is gone", 1, False),
        will_properties=props(PacketTypes.WILLMESSAGE, WillDelayInterval=1),
    )
    node.kill()
    time.sleep(1.6)  # longer than the will delay, shorter than the expiries

    port = node.start()
    restarted = time.monotonic()
    watcher = persistent(port, "cw-watcher")
    assert session_present(watcher)
    [will] = watcher.expect(1, timeout=5)
    arrived = time.monotonic() - restarted
    assert will.payload == b"cw-will is gone"
    # Counted from the crash, it would have been due before the restart, and sent at once.
    assert arrived >= 0.5, f"the will came {arrived:.2f} s after the restart, not after 1 s"
    # Counted from the crash, cw-alive would have expired 1.4 s after the restart.
    time.sleep(max(0.0, restarted + 2.0 - time.monotonic()))
    alive = persistent(port, "cw-alive")
    assert session_present(alive), "cw-alive expired early"
    Client(port, "cw-pub").publish("cw/t", b"still subscribed", 1)
    assert [m.payload for m in alive.expect(1)] == [b"still subscribed"]
    time.sleep(max(0.0, restarted + 2.6 - time.monotonic()))
    gone = persistent(port, "cw-will")
    assert not session_present(gone), "cw-will did not expire 2 s after the restart"
    watcher.expect_none(0.3)  # the will went out once
    node.stop()


def test_the_will_of_a_client_without_a_session_goes_out_after_a_crash(
    node: NodeProcess,
) -> None:
    port = node.start()
    watcher = persistent(port, "cc-watcher")
    watcher.subscribe("cc/will", 1)
    watcher.disconnect()
    # Connected when the node dies, with no session beyond the connection (MQTT 3.1.1 clean).
    Client(port, "cc-clean", version=4, will=("cc/will", b"cc-clean is gone", 1, False))
    node.kill()

    port = node.start()
    watcher = persistent(port, "cc-watcher")
    [will] = watcher.expect(1, timeout=5)
    assert will.payload == b"cc-clean is gone"
    watcher.disconnect()
    # It went out once: the record of the connection went with it.
    node.stop()
    port = node.start()
    watcher = persistent(port, "cc-watcher")
    assert session_present(watcher)
    watcher.expect_none(1.0)
    node.stop()


# -- a torn tail -------------------------------------------------------------------------------


def garbage(kind: str) -> bytes:
    if kind == "random":
        return random.Random(7).randbytes(1000)
    if kind == "half-record":  # a frame announcing more bytes than were written
        return FRAME.pack(400, 0x12345678) + b"m" * 150
    assert kind == "zero-length"
    return FRAME.pack(0, 0) + b"\x00" * 24


@pytest.mark.parametrize("kind", ["random", "half-record", "zero-length"])
def test_a_torn_tail_is_cut_off_and_the_node_serves(node: NodeProcess, kind: str) -> None:
    port = node.start()
    pub = Client(port, "tt-pub")
    pub.publish("tt/r", b"retained", 1, retain=True)
    sub = persistent(port, "tt-sub")
    sub.subscribe("tt/t", 1)
    sub.disconnect()
    for i in range(3):
        pub.publish("tt/t", f"{i}".encode(), 1)
    node.kill()
    pub.close()
    torn = garbage(kind)
    last = segment_files(node.data_dir)[-1]
    with last.open("ab") as file:
        file.write(torn)

    port = node.start()
    recovered = node.recovery()
    assert int(recovered["truncated"]) == len(torn), recovered[0]
    assert node.find(re.compile(rf"cutting {len(torn)} bytes")), node.log()
    sub = persistent(port, "tt-sub")
    assert session_present(sub)
    assert [m.payload for m in sub.expect(3)] == [b"0", b"1", b"2"]
    check = Client(port, "tt-check")
    check.subscribe("tt/r", 1)
    assert [m.payload for m in check.expect(1)] == [b"retained"]
    sub.disconnect()
    Client(port, "tt-pub").publish("tt/t", b"after the cut", 1)
    assert node.stop() == 0

    # What was written after the cut is intact too.
    port = node.start()
    recovered = node.recovery()
    assert int(recovered["truncated"]) == 0, recovered[0]
    sub = persistent(port, "tt-sub")
    assert [m.payload for m in sub.expect(1)] == [b"after the cut"]
    sub.expect_none(0.3)
    assert node.stop() == 0
